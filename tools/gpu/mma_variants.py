"""The mma.sync GEMM's scheduling switches on the GPU: each variant checked, then timed
beside cuBLAS fp16 in the same run; a table last, JSON in $OUT/mma_variants.json.

    . tools/device_env.sh && OUT=/tmp/out python3 tools/gpu/mma_variants.py [4096,8192]

Variants: tiles 128x128x32 s4, 128x128x64 s3, 128x256x32 s3 (warps 64x64, cp.async,
swizzle) x {baseline, FRAG_PIPE, GPTR, both, both + SERPENTINE} (mma_sync.cu's switches).
fp16 inputs, fp32 output, a (n, n) @ bt (n, n)^T; each output checked against float64 of
the rounded inputs at the fp32 tolerance, twice (same bits), before it is timed by CUDA
events (warm-up, median of groups) -- the checks and timings of `measure.tensor_cores`.
TILESET=wide: BK 64 and 4 stages on the 8-warp tiles and other rasterization groups.
Variants not started within BUDGET_S seconds (default 80) are rows marked skipped.
"""

import json
import os
import sys
import time
from dataclasses import replace

import convlab

convlab.setup("gpu")
from convlab.kernels import mma02_gemm_conv_cuda as MM  # noqa: E402
from convlab.measure import tensor_cores as TC  # noqa: E402
from convlab.measure.clock import GpuClock  # noqa: E402
from convlab.measure.harness import Context  # noqa: E402
from convlab.measure.lessons12_13 import rtol_for  # noqa: E402

TILES = {"128x128x32 s4": replace(MM.STEP3, BK=32, STAGES=4),
         "128x128x64 s3": replace(MM.STEP3, BK=64, STAGES=3),
         "128x256x32 s3": replace(MM.STEP3, BN=256, BK=32, STAGES=3),
         "128x256x32 s4": replace(MM.STEP3, BN=256, BK=32, STAGES=4),
         "256x128x32 s3": replace(MM.STEP3, BM=256, BK=32, STAGES=3)}
if os.environ.get("TILESET") == "wide":   # BK 64 and 4 stages on the 8-warp tiles, rasterization
    TILES = {"128x128x32 s4": replace(MM.STEP3, BK=32, STAGES=4),
             "128x128x32 s4 g16": replace(MM.STEP3, BK=32, STAGES=4, GROUP_M=16),
             "256x128x32 s4": replace(MM.STEP3, BM=256, BK=32, STAGES=4),
             "256x128x64 s3": replace(MM.STEP3, BM=256, BK=64, STAGES=3),
             "128x256x64 s3": replace(MM.STEP3, BN=256, BK=64, STAGES=3),
             "256x128x32 s4 g4": replace(MM.STEP3, BM=256, BK=32, STAGES=4, GROUP_M=4)}
SWITCHES = {"baseline": {}, "FRAG_PIPE": dict(FRAG_PIPE=1), "GPTR": dict(GPTR=1),
            "both": dict(FRAG_PIPE=1, GPTR=1),
            "both+serp": dict(FRAG_PIPE=1, GPTR=1, SERPENTINE=1),
            "FRAG_PIPE f16 out": dict(FRAG_PIPE=1, OUT16=True)}  # C in fp16, as cuBLAS writes
if os.environ.get("TILESET") == "wide":
    SWITCHES = {k: SWITCHES[k] for k in ("baseline", "FRAG_PIPE", "both", "FRAG_PIPE f16 out")}
BUDGET_S = float(os.environ.get("BUDGET_S", 80))   # variants not started after this: skipped


def run_size(ctx, n):
    import torch

    a, bt = TC._inputs(n, torch, torch.float16)
    exp, absref = TC._reference(a, bt)
    tol, flops = rtol_for("fp32", n), 2 * n**3
    out = torch.empty(n, n, device="cuda", dtype=torch.float32)
    o16 = torch.empty(n, n, device="cuda", dtype=torch.float16)
    rows = []
    TC._try(rows, "cuBLAS fp16 first", lambda: TC._library_row(
        ctx, "cuBLAS fp16 first", lambda: a @ bt.T, flops, "fp16"))   # clock drift check

    def variant(tile, sw, cfg, half):
        name = f"{tile} {sw}"
        c, t = (o16, rtol_for("fp16", n)) if half else (out, tol)
        run = lambda: MM.gemm_mma_raw(a, bt, c, cfg)  # noqa: E731
        return dict(tile=tile, switches=sw, config=str(cfg), **TC._check_then_time(
            ctx, name, run, c, exp, absref, t, flops))

    for tile, base in TILES.items():
        for sw, kw in SWITCHES.items():
            if ctx.elapsed() > BUDGET_S:
                rows.append(dict(name=f"{tile} {sw}", error="skipped (time budget)"))
                continue
            kw = dict(kw)
            half = kw.pop("OUT16", False)
            TC._try(rows, f"{tile} {sw}", lambda tile=tile, sw=sw, cfg=replace(base, **kw),
                    half=half: variant(tile, sw, cfg, half))
    TC._try(rows, "cuBLAS fp16", lambda: TC._library_row(ctx, "cuBLAS fp16", lambda: a @ bt.T,
                                                         flops, "fp16"))
    TC._pct(rows, "cuBLAS fp16")
    return dict(n=n, tol=tol, rows=rows, note="cuBLAS writes fp16, the mma.sync kernels fp32")


def table(results) -> str:
    lines = []
    for res in results:
        lines.append(f"n = {res['n']}  (TFLOP/s, % of cuBLAS fp16; x = failed check)")
        lines.append(f"{'tile':16}" + "".join(f"{s:>16}" for s in SWITCHES))
        cublas = next((r for r in res["rows"] if r["name"] == "cuBLAS fp16"), {})
        for tile in TILES:
            cells = []
            for sw in SWITCHES:
                r = next((r for r in res["rows"] if r["name"] == f"{tile} {sw}"), {})
                if r.get("tflops"):
                    cells.append(f"{r['tflops']:7.1f} {r.get('pct_cuBLAS_fp16', 0):5.1f}%")
                else:
                    cells.append("x " + (r.get("error") or "check failed")[:12])
            lines.append(f"{tile:16}" + "".join(f"{c:>16}" for c in cells))
        lines.append(f"{'cuBLAS fp16':16}{cublas.get('tflops', 0):9.1f}"
                     f"  ({cublas.get('algorithm', '?')})")
    return "\n".join(lines)


def main() -> int:
    sizes = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "4096,8192").split(",")]
    MM.require_sm80()
    ctx = Context(clock=GpuClock())
    t0 = time.time()
    results = []
    for n in sizes:
        results.append(run_size(ctx, n))
        import torch

        torch.cuda.empty_cache()
    data = dict(sizes=sizes, seconds=round(time.time() - t0, 1), results=results)
    out_dir = os.environ.get("OUT", ".")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "mma_variants.json"), "w") as f:
        json.dump(data, f, indent=1, default=str)
    print(f"\n{data['seconds']} s\n" + table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
