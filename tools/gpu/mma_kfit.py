"""The fixed cost of a tile: an mma.sync GEMM (and cuBLAS) at M = N = SIZE and depths K,
checked against float64, timed in bursts, and fitted as t = fixed + per_k * K (least
squares). `fixed` is what the depth does not pay for: launch, each block's prologue (the
first slabs' loads) and epilogue (the stores), and the last wave's idle SMs.

    python3 tools/gpu/mma_kfit.py [4096] [1024,2048,4096,8192]
"""

import sys
from dataclasses import replace

import convlab

convlab.setup("gpu")
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from convlab import bench, check  # noqa: E402
from convlab.kernels import mma02_gemm_conv_cuda as MM  # noqa: E402
from convlab.measure.lessons12_13 import gpu_compare, rtol_for  # noqa: E402


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    ks = [int(k) for k in (sys.argv[2] if len(sys.argv) > 2 else "1024,2048,4096,8192")
          .split(",")]
    cfg = replace(MM.GEMM_TOP, EPI_SMEM=1)
    rng = np.random.default_rng(0)
    times = {"cuBLAS fp16": [], f"mma.sync {cfg} (fp16 out)": []}
    for k in ks:
        a = torch.from_numpy(check.random_array((n, k), rng)).cuda().half()
        bt = torch.from_numpy(check.random_array((n, k), rng)).cuda().half()
        o16 = torch.empty(n, n, device="cuda", dtype=torch.float16)
        a64, b64 = cp.asarray(a.double()), cp.asarray(bt.double())
        exp, absref = a64 @ b64.T, cp.abs(a64) @ cp.abs(b64).T
        runs = {"cuBLAS fp16": lambda a=a, bt=bt, o=o16: torch.matmul(a, bt.T, out=o),
                f"mma.sync {cfg} (fp16 out)": lambda a=a, bt=bt, o=o16: MM.gemm_mma_raw(
                    a, bt, o, cfg)}
        for name, run in runs.items():
            o16.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            v = gpu_compare(cp.asarray(o16.float()), exp, absref, rtol_for("fp16", k))
            if not v["ok"]:
                print(f"{name} K={k}: WRONG {v}")
                return 1
            t = bench.time_gpu(run, repeat=15).median_ms
            times[name].append(t)
            print(f"{name:70} K={k:5}  {t * 1e3:8.1f} us  {2 * n * n * k / t / 1e9:6.1f} "
                  "TFLOP/s", flush=True)
    print(f"\n{'kernel':70} {'fixed us':>9} {'us per 1024 of K':>17} "
          f"{'fixed share at K=' + str(n):>22}")
    for name, ts in times.items():
        per_k, fixed = np.polyfit(ks, ts, 1)
        at_n = fixed + per_k * n
        print(f"{name:70} {fixed * 1e3:9.1f} {per_k * 1024e3:17.1f} {100 * fixed / at_n:21.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
