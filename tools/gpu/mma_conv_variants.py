"""The mma.sync conv's tiles and loaders on the GPU: each variant checked, then timed beside
cuDNN fp16 NHWC in the same run, on the three ResNet layers (batch 32); a table last, JSON
in $OUT/mma_conv_variants.json.

    . tools/device_env.sh && OUT=/tmp/out python3 tools/gpu/mma_conv_variants.py

Variants: tiles (mma02's candidates and a few more) x {the chunk-by-chunk gather, TAPS
(one tap per slab), TAPS + FRAG_PIPE}, fp32 output, and the fastest of them with fp16
output (what cuDNN writes). TILESET=2: TAPS + FRAG_PIPE on more tiles, fp32 output, fp16
output stored directly and staged in shared memory (EPI_SMEM). Each output is checked
against float64 of the rounded inputs at the fp32 (fp16) tolerance, twice (same bits),
before it is timed by CUDA events (`measure.tensor_cores`' checks and timings).
ROUNDS=n times the list n times (medians). Variants not started within BUDGET_S seconds
(default 240) are rows marked skipped.
"""

import json
import os
import statistics
import sys
import time
from dataclasses import replace

import convlab

convlab.setup("gpu")
from convlab import problems  # noqa: E402
from convlab.kernels import mma02_gemm_conv_cuda as MM  # noqa: E402
from convlab.kernels._launch import sm_count  # noqa: E402
from convlab.measure import tensor_cores as TC  # noqa: E402
from convlab.measure.clock import GpuClock  # noqa: E402
from convlab.measure.harness import Context  # noqa: E402
from convlab.measure.lessons12_13 import rtol_for  # noqa: E402

S3 = MM.STEP3
TILES = {"64x128x64 w32x64 s3": replace(S3, BM=64, WM=32, BK=64, STAGES=3),
         "64x64x64 w32x32 s4": replace(S3, BM=64, BN=64, WM=32, WN=32, BK=64, STAGES=4),
         "128x64x64 w64x32 s3": replace(S3, BN=64, WN=32, BK=64, STAGES=3),
         "128x64x64 w64x32 s4": replace(S3, BN=64, WN=32, BK=64, STAGES=4),
         "128x128x64 w64x64 s3": replace(S3, BK=64, STAGES=3),
         "128x128x64 w64x32 s3": replace(S3, WN=32, BK=64, STAGES=3),
         "128x128x32 w64x64 s4": S3,
         "128x256x64 w64x64 s3": replace(S3, BN=256, BK=64, STAGES=3)}
# loader x output: (config switches, fp16 output)
VARIANTS = {"gather": ({}, False), "taps": (dict(TAPS=1), False),
            "taps+frag": (dict(TAPS=1, FRAG_PIPE=1), False)}
if os.environ.get("TILESET") == "2":   # TAPS + FRAG_PIPE everywhere; more tiles; outputs
    TILES = {k: TILES[k] for k in ("64x128x64 w32x64 s3", "64x64x64 w32x32 s4",
                                   "128x64x64 w64x32 s3", "128x128x64 w64x32 s3",
                                   "128x128x32 w64x64 s4")}
    TILES.update({"64x64x64 w32x32 s3": replace(S3, BM=64, BN=64, WM=32, WN=32, BK=64, STAGES=3),
                  "64x128x32 w32x64 s4": replace(S3, BM=64, WM=32, STAGES=4),
                  "128x64x32 w64x32 s4": replace(S3, BN=64, WN=32, STAGES=4),
                  "128x64x32 w64x32 s6": replace(S3, BN=64, WN=32, STAGES=6),
                  "256x64x32 w64x64 s4": replace(S3, BM=256, BN=64, STAGES=4),
                  "256x64x64 w64x64 s3": replace(S3, BM=256, BN=64, BK=64, STAGES=3),
                  "256x128x32 w64x64 s4": replace(S3, BM=256, STAGES=4)})
    VARIANTS = {"taps+frag": (dict(TAPS=1, FRAG_PIPE=1), False),
                "taps+frag f16": (dict(TAPS=1, FRAG_PIPE=1), True),
                "taps+frag+epi f16": (dict(TAPS=1, FRAG_PIPE=1, EPI_SMEM=1), True)}
if os.environ.get("TILESET") == "3":   # block heights of 96 and 48: whole waves of blocks
    TILES = {"128x64x32 w64x32 s4": replace(S3, BN=64, WN=32, STAGES=4),
             "64x128x64 w32x64 s3": replace(S3, BM=64, WM=32, BK=64, STAGES=3),
             "128x128x64 w64x32 s3": replace(S3, WN=32, BK=64, STAGES=3),
             "96x128x64 w48x64 s3": replace(S3, BM=96, WM=48, BK=64, STAGES=3),
             "96x128x64 w48x32 s3": replace(S3, BM=96, WM=48, WN=32, BK=64, STAGES=3),
             "96x128x32 w48x64 s4": replace(S3, BM=96, WM=48, STAGES=4),
             "96x64x64 w48x32 s3": replace(S3, BM=96, BN=64, WM=48, WN=32, BK=64, STAGES=3),
             "96x64x32 w48x32 s4": replace(S3, BM=96, BN=64, WM=48, WN=32, STAGES=4),
             "48x256x64 w48x64 s3": replace(S3, BM=48, BN=256, WM=48, BK=64, STAGES=3),
             "64x64x64 w64x32 s4": replace(S3, BM=64, BN=64, WM=64, WN=32, BK=64, STAGES=4),
             "64x64x64 w32x64 s4": replace(S3, BM=64, BN=64, WM=32, WN=64, BK=64, STAGES=4)}
    VARIANTS = {"taps+frag f16": (dict(TAPS=1, FRAG_PIPE=1), True),
                "taps+frag+epi f16": (dict(TAPS=1, FRAG_PIPE=1, EPI_SMEM=1), True)}
if os.environ.get("TILESET") == "4":   # stages and warp shapes around the best tiles of set 3
    TILES = {"128x64x32 w64x32 s3": replace(S3, BN=64, WN=32, STAGES=3),
             "128x64x32 w64x32 s4": replace(S3, BN=64, WN=32, STAGES=4),
             "128x64x32 w64x32 s5": replace(S3, BN=64, WN=32, STAGES=5),
             "128x64x32 w32x64 s4": replace(S3, BN=64, WM=32, STAGES=4),
             "128x64x64 w64x32 s4": replace(S3, BN=64, WN=32, BK=64, STAGES=4),
             "256x64x32 w64x64 s4": replace(S3, BM=256, BN=64, STAGES=4),
             "96x128x32 w48x64 s3": replace(S3, BM=96, WM=48, STAGES=3),
             "96x128x32 w48x64 s4": replace(S3, BM=96, WM=48, STAGES=4),
             "96x128x32 w48x64 s6": replace(S3, BM=96, WM=48, STAGES=6),
             "96x128x64 w48x32 s3": replace(S3, BM=96, WM=48, WN=32, BK=64, STAGES=3),
             "96x128x64 w48x32 s4": replace(S3, BM=96, WM=48, WN=32, BK=64, STAGES=4),
             "96x128x64 w48x64 s4": replace(S3, BM=96, WM=48, BK=64, STAGES=4),
             "96x128x32 w96x32 s4": replace(S3, BM=96, WM=96, WN=32, STAGES=4)}
    VARIANTS = {"taps+frag+epi f16": (dict(TAPS=1, FRAG_PIPE=1, EPI_SMEM=1), True)}
if os.environ.get("TILESET") == "6":   # 8 warps where a block is alone on its SM (resnet256)
    T = dict(TAPS=1, FRAG_PIPE=1, EPI_SMEM=1)
    TILES = {"96x128x32 w48x64 s4": replace(S3, BM=96, WM=48, STAGES=4, **T),
             "96x128x64 w48x32 s4": replace(S3, BM=96, WM=48, WN=32, BK=64, STAGES=4, **T),
             "96x128x64 w48x32 s3": replace(S3, BM=96, WM=48, WN=32, BK=64, STAGES=3, **T),
             "96x128x64 w48x32 s5": replace(S3, BM=96, WM=48, WN=32, BK=64, STAGES=5, **T),
             "96x128x64 w96x32 s4": replace(S3, BM=96, WM=96, WN=32, BK=64, STAGES=4, **T),
             "96x128x64 w48x64 s4": replace(S3, BM=96, WM=48, BK=64, STAGES=4, **T),
             "128x64x32 w64x32 s4": replace(S3, BN=64, WN=32, STAGES=4, **T),
             "128x64x32 w32x64 s4": replace(S3, BN=64, WM=32, STAGES=4, **T),
             "128x64x32 w32x32 s4": replace(S3, BN=64, WM=32, WN=32, STAGES=4, **T),
             "128x64x64 w32x32 s3": replace(S3, BN=64, WM=32, WN=32, BK=64, STAGES=3, **T)}
    VARIANTS = {"f16": ({}, True)}
BUDGET_S = float(os.environ.get("BUDGET_S", 240))
ROUNDS = int(os.environ.get("ROUNDS", 2))


def run_layer(ctx, lname):
    import torch

    prob = problems.conv_layer(lname)
    kw = prob.kwargs
    N, K, P, Q = prob.out_shape
    x, w, x_nhwc, w_krsc, exp, absref = TC._conv_inputs(prob, torch, torch.float16)
    crs = prob.C * prob.R * prob.S
    outs = {False: torch.empty(N, P, Q, K, device="cuda", dtype=torch.float32),
            True: torch.empty(N, P, Q, K, device="cuda", dtype=torch.float16)}
    tols = {False: rtol_for("fp32", crs), True: rtol_for("fp16", crs)}
    specs = [(f"{t} {v}", replace(base, **vkw), half)
             for t, base in TILES.items() for v, (vkw, half) in VARIANTS.items()]
    rows, times = [], {}
    import torch.nn.functional as F

    x_cl = x.contiguous(memory_format=torch.channels_last)
    w_cl = w.contiguous(memory_format=torch.channels_last)
    torch.backends.cudnn.benchmark = True
    cudnn = lambda: F.conv2d(x_cl, w_cl, **kw)  # noqa: E731

    def one(name, cfg, half):
        out = outs[half]
        run = lambda: MM.conv2d_mma_nhwc(x_nhwc, w_krsc, out, cfg=cfg, **kw)  # noqa: E731
        fn = MM._kernel(cfg.validate(), True, half, False)
        return dict(config=str(cfg), fp16_out=half, regs=fn.num_regs,
                    local_bytes=fn.local_size_bytes, **TC._check_then_time(
            ctx, name, run, out, exp, absref, tols[half], prob.flops, queued=True))

    for rnd in range(ROUNDS):
        TC._try(rows, "cuDNN fp16 NHWC", lambda: TC._library_row(
            ctx, "cuDNN fp16 NHWC", cudnn, prob.flops, "fp16", queued=True))
        times.setdefault("cuDNN fp16 NHWC", []).append(rows[-1].get("ms"))
        todo = list(specs)
        if rnd == ROUNDS - 1 and not any(h for *_, h in specs):   # the fastest, fp16 out
            best = min((n for n in times if n != "cuDNN fp16 NHWC" and all(times[n])),
                       key=lambda n: statistics.median(times[n]), default=None)
            if best:
                cfg = next(c for n, c, _ in specs if n == best)
                todo.append((best + " f16out", cfg, True))
        for name, cfg, half in todo:
            if ctx.elapsed() > BUDGET_S:
                rows.append(dict(name=name, error="skipped (time budget)"))
                times.setdefault(name, []).append(None)
                continue
            TC._try(rows, name, lambda name=name, cfg=cfg, half=half: one(name, cfg, half))
            times.setdefault(name, []).append(rows[-1].get("ms"))
    med = {n: statistics.median(t) for n, t in times.items() if t and all(t)}
    base = med.get("cuDNN fp16 NHWC")
    summary = {n: dict(ms=m, tflops=prob.flops / m / 1e9,
                       pct_cuDNN_fp16_NHWC=100 * base / m if base else None)
               for n, m in med.items()}
    algo = next((r.get("algorithm") for r in rows if r["name"] == "cuDNN fp16 NHWC"), "?")
    regs = {r["name"]: (r.get("regs"), r.get("local_bytes")) for r in rows if "regs" in r}
    for n in summary:
        summary[n]["regs"], summary[n]["local_bytes"] = regs.get(n, (None, None))
    return dict(layer=lname, problem=str(prob), rows=rows, medians=summary, cudnn_algorithm=algo,
                chosen=str(MM.choose_conv(K, N * P * Q, sm_count())))


def table(results) -> str:
    names = list(dict.fromkeys(n for r in results for n in r["medians"]))
    lines = [f"{'variant (median of rounds: % of cuDNN fp16 NHWC)':44}"
             + "".join(f"{r['layer']:>14}" for r in results) + f"{'geomean':>10}"]
    for n in names:
        pcts = [r["medians"].get(n, {}).get("pct_cuDNN_fp16_NHWC") for r in results]
        cells = [f"{p:13.1f}%" if p else f"{'x':>14}" for p in pcts]
        gm = (statistics.geometric_mean(pcts) if all(pcts) else None)
        rl = next((r["medians"][n] for r in results if r["medians"].get(n, {}).get("regs")), {})
        lines.append(f"{n:44}" + "".join(cells) + (f"{gm:9.1f}%" if gm else f"{'':>10}")
                     + (f"  {rl['regs']} regs, {rl['local_bytes']} B local" if rl else ""))
    lib = [(r["layer"], r["medians"].get("cuDNN fp16 NHWC", {}).get("tflops", 0),
            r["cudnn_algorithm"]) for r in results]
    lines.append("cuDNN: " + ", ".join(f"{n} {t:.0f} TFLOP/s ({a})" for n, t, a in lib))
    lines.append("chosen: " + ", ".join(f"{r['layer']} {r['chosen']}" for r in results))
    return "\n".join(lines)


def main() -> int:
    MM.require_sm80()
    ctx = Context(clock=GpuClock())
    t0 = time.time()
    results = [run_layer(ctx, lname) for lname in problems.RESNET]
    data = dict(seconds=round(time.time() - t0, 1), rounds=ROUNDS, results=results)
    out_dir = os.environ.get("OUT", ".")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "mma_conv_variants.json"), "w") as f:
        json.dump(data, f, indent=1, default=str)
    print(f"\n{data['seconds']} s\n" + table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
