"""mma.sync fed by TMA (wgmma03's producer warpgroup and mbarrier ring, consumers on
ldmatrix + mma.sync) beside the cp.async mma.sync tile and cuBLAS fp16, fp16 in and out.

    ROUNDS=7 python3 tools/gpu/mma_tma_race.py 4096,8192 [SPEC ...]

SPEC: WgmmaConfig fields over MMA_SYNC_TOP (GROUP_M=16,STAGES=4) and SRC=path for another
copy of wgmma_tma.cu (same kernel signature), to time a change against the tree in one
process; default: MMA_SYNC_TOP as it is.

Each kernel is checked against the fp32 product of the fp16 inputs, then timed as
mma_profile.py does (ROUNDS rounds of one short burst each, the order reversed every other
round; per kernel the median over rounds of cuBLAS's time over its own), then each held
back to back for about 1.5 s (`timing.sustained`: clock and power from nvidia-smi).
"""

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import convlab

convlab.setup("gpu")
import torch  # noqa: E402

from convlab import bench  # noqa: E402
from convlab.kernels import mma02_gemm_conv_cuda as MM  # noqa: E402
from convlab.kernels import wgmma03_gemm_conv_tma as W  # noqa: E402
from convlab.measure import tensor_cores as TC  # noqa: E402
from convlab.measure import timing  # noqa: E402


def parse(spec: str):
    kw = dict(p.split("=") for p in spec.split(",") if p)
    src = kw.pop("SRC", None)
    return replace(W.MMA_SYNC_TOP, **{k: int(v) for k, v in kw.items()}), src


def runner(cfg, src):
    """gemm_wgmma_raw(a, bt, out) with the kernel compiled from `src` (None: the tree's)."""
    if src is None:
        return lambda a, bt, o: W.gemm_wgmma_raw(a, bt, o, cfg)
    import cupy as cp

    from convlab.kernels._nvrtc import nvrtc_ptx

    fns = {}

    def run(a, bt, o):
        half = o.dtype == torch.float16
        if half not in fns:
            path = Path(f"/tmp/race_{abs(hash((src, cfg, half)))}.ptx")
            path.write_text(nvrtc_ptx(Path(src).read_text(), "wgmma_tma.cu", (), W.ARCH,
                                      options=cfg.validate().defines(CONV=0, F16=1,
                                                                     OUT_HALF=int(half))))
            fn = cp.RawModule(path=str(path)).get_function("wgmma_tma_kernel")
            fn.max_dynamic_shared_size_bytes = cfg.smem_bytes(half)
            fns[half] = fn
        tree, W._kernel = W._kernel, lambda *args: fns[half]
        try:
            W.gemm_wgmma_raw(a, bt, o, cfg)
        finally:
            W._kernel = tree
    return run


def race(n, specs, rounds):
    a, bt = TC._inputs(n, torch, torch.float16)
    ref = a.float() @ bt.float().T
    flop = 2 * n**3
    kernels = [("cuBLAS fp16", lambda: a @ bt.T, None)]
    top = replace(MM.GEMM_TOP, EPI_SMEM=1)
    o1 = torch.empty(n, n, device="cuda", dtype=torch.float16)
    kernels.append((f"cp.async mma.sync {top}", lambda o=o1: MM.gemm_mma_raw(a, bt, o, top), o1))
    for spec in specs:
        fn = runner(*parse(spec))
        o = torch.empty(n, n, device="cuda", dtype=torch.float16)
        kernels.append((f"TMA mma.sync {spec or 'MMA_SYNC_TOP'}",
                        lambda o=o, fn=fn: fn(a, bt, o), o))
    ow = torch.empty(n, n, device="cuda", dtype=torch.float16)
    kernels.append((f"TMA {W.GEMM_DEFAULT} wgmma",
                    lambda o=ow: W.gemm_wgmma_raw(a, bt, o, W.GEMM_DEFAULT), ow))
    ok = []
    for name, fn, o in kernels:
        if o is not None:
            o.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            err = float(((o.float() - ref).abs().max() / ref.abs().max()).item())
            good = err < 2e-3
            print(f"{n} {name:64} max rel err {err:.1e} {'ok' if good else 'WRONG'}")
            if not good:
                continue
        ok.append((name, fn))
    race = timing.burst_rounds(ok, lambda fn: bench.time_gpu(fn, repeat=5).median_ms, rounds)
    rows = [dict(name=name, tflops=flop / r["ms"] / 1e9, pct_rounds=r["pct_library"],
                 pct_low=r["pct_low"], pct_high=r["pct_high"]) for name, r in race.items()]
    sus = {name: timing.sustained(fn) for name, fn in ok}
    for row in rows:
        s = sus[row["name"]]
        row.update(sustained_tflops=flop / s["ms"] / 1e9, sm_mhz=s["sm_mhz"],
                   power_w=s["power_w"],
                   pct_sustained=100 * sus["cuBLAS fp16"]["ms"] / s["ms"])
    print(f"== {n}^3  (rounds: median % of cuBLAS over {rounds} rounds; sustained ~1.5 s)")
    for row in rows:
        print(f"  {row['name']:64} {row['tflops']:6.1f} TFLOP/s {row['pct_rounds']:5.1f}% "
              f"({row['pct_low']:.1f}-{row['pct_high']:.1f})  sustained "
              f"{row['sustained_tflops']:6.1f} {row['pct_sustained']:5.1f}% "
              f"{row['sm_mhz']} MHz {row['power_w']} W")
    return rows


def main() -> int:
    sizes = [int(v) for v in sys.argv[1].split(",")]
    specs = sys.argv[2:] or [""]
    rounds = int(os.environ.get("ROUNDS", "7"))
    out_json = {n: race(n, specs, rounds) for n in sizes}
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "mma_tma_race.json"), "w") as f:
            json.dump(out_json, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
