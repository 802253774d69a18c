"""What clock each tensor-core GEMM runs at: the SM clock, power and slowing reasons
(`measure.timing.sustained`: nvidia-smi every 20 ms) while one kernel runs back to back for
SECONDS_EACH (1.5), beside its short-burst time (bench.time_gpu, as `measure tensor_cores`
times it); the register-only mma.sync peak kernel first.

    python3 tools/gpu/mma_clocks.py [4096,8192]

Every kernel is checked against float64 first. Prints one row per kernel and size: the
burst and sustained times, TFLOP/s, the median SM clock and power while it ran, and the
sustained FLOPs per SM and cycle (the clock taken out), the last line a table.
"""

import os
import sys
import time
from dataclasses import replace

import convlab

convlab.setup("gpu")
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from convlab import bench  # noqa: E402
from convlab.kernels import mma02_gemm_conv_cuda as MM  # noqa: E402
from convlab.kernels import wgmma03_gemm_conv_tma as WG  # noqa: E402
from convlab.measure import tensor_cores as TC  # noqa: E402
from convlab.measure import timing  # noqa: E402
from convlab.measure.lessons12_13 import gpu_compare, rtol_for  # noqa: E402

SECONDS = float(os.environ.get("SECONDS_EACH", "1.5"))


def report(name, run, flops, sms, table):
    tb = bench.time_gpu(run, repeat=10)
    r = timing.sustained(run, seconds=SECONDS)
    ms, clk, pw, temp, reasons = (r["ms"], r["sm_mhz"] or float("nan"),
                                  r["power_w"] or float("nan"),
                                  r["max_temp_c"] or float("nan"), r["reasons"])
    tf_b, tf_s = flops / tb.median_ms / 1e9, flops / ms / 1e9
    per_clk = flops / (ms * 1e-3) / (clk * 1e6) / sms
    row = dict(name=name, burst_ms=tb.median_ms, burst_tflops=tf_b, sustained_ms=ms,
               sustained_tflops=tf_s, sm_mhz=clk, power_w=pw, max_temp_c=temp,
               reasons=reasons, samples=r["samples"], flops_per_sm_clk=per_clk)
    table.append(row)
    print(f"{name:52} burst {tf_b:6.1f} sust {tf_s:6.1f} TFLOP/s  {clk:6.0f} MHz {pw:5.0f} W "
          f"{temp:3.0f} C  {per_clk:6.0f} flop/SM/clk  n={r['samples']} {reasons}",
          flush=True)


def gemm(n, sms, table):
    a, bt = TC._inputs(n, torch, torch.float16)
    exp, absref = TC._reference(a, bt)
    o32 = torch.empty(n, n, device="cuda", dtype=torch.float32)
    o16 = torch.empty(n, n, device="cuda", dtype=torch.float16)
    flops = 2 * n**3
    runs = [
        ("cuBLAS fp16", lambda: torch.matmul(a, bt.T, out=o16), o16, "fp16"),
        (f"mma.sync {MM.GEMM_TOP}", lambda: MM.gemm_mma_raw(a, bt, o32, MM.GEMM_TOP), o32,
         "fp32"),
        (f"mma.sync {MM.GEMM_TOP} epi fp16",
         lambda: MM.gemm_mma_raw(a, bt, o16, replace(MM.GEMM_TOP, EPI_SMEM=1)), o16, "fp16"),
        (f"mma.sync {MM.STEP3}", lambda: MM.gemm_mma_raw(a, bt, o32, MM.STEP3), o32, "fp32"),
        (f"wgmma fp16 {WG.GEMM_DEFAULT}", lambda: WG.gemm_wgmma_raw(a, bt, o32), o32, "fp32"),
    ]
    checked = []
    for name, run, out, prec in runs:
        out.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        v = gpu_compare(cp.asarray(out.float()), exp, absref, rtol_for(prec, n))
        if v["ok"]:
            checked.append((name, run))
        else:
            print(f"{name}: WRONG {v}, not timed")
    for rep in range(2):   # twice, to see the drift
        for name, run in checked:
            report(f"{n}^3 {name}" + (" (again)" if rep else ""), run, flops, sms, table)
            time.sleep(1.0)


def main() -> int:
    sizes = [int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "4096,8192").split(",")]
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    table = []
    out = cp.zeros(1, cp.float32)
    for chains, warps in ((8, 8), (8, 16)):
        fn = MM.mma_peak_kernel(chains)
        iters = 4096
        flops = sms * warps * chains * iters * 4096
        report(f"mma_peak {chains} chains {warps} warps/SM",
               lambda fn=fn, warps=warps, iters=iters: fn((sms,), (32 * warps,),
                                                          (out, np.int32(iters))),
               flops, sms, table)
    for n in sizes:
        gemm(n, sms, table)
    if os.environ.get("OUT"):
        import json
        with open(os.path.join(os.environ["OUT"], "mma_clocks.json"), "w") as f:
            json.dump(table, f, indent=1)
    print(f"\n{'kernel':60} {'burst':>7} {'sust':>7} {'MHz':>6} {'W':>5} {'flop/SM/clk':>11}")
    for r in table:
        print(f"{r['name'][:60]:60} {r['burst_tflops']:7.1f} {r['sustained_tflops']:7.1f} "
              f"{r['sm_mhz']:6.0f} {r['power_w']:5.0f} {r['flops_per_sm_clk']:11.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
