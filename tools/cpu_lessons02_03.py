"""Lessons 02-03 on this CPU: the realistic layer (batch 8, 64->64, 56x56, 3x3, pad 1), every
version of the two lessons plus PyTorch's conv2d, checked, then timed round-robin.

    .venv/bin/python tools/cpu_lessons02_03.py                      # all cores
    OPENBLAS_NUM_THREADS=1 NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 \\
        .venv/bin/python tools/cpu_lessons02_03.py                  # one thread each

ROUNDS=n sets the interleaved rounds (default 5). The naive loops run on 1 image x 1 filter
and are scaled by N*K. Needs PyTorch (CPU) for the comparison column.
"""

import os
import platform
import time

import numpy as np
import torch

import convlab

convlab.setup("sim")  # CPU only: no GPU needed, and numba is imported after the choice

from convlab import cpu, problems  # noqa: E402
from convlab import reference as ref  # noqa: E402


def loadavg():
    try:
        return open("/proc/loadavg").read().split()[:3]
    except OSError:
        return ["?"] * 3


def main():
    layer = problems.conv_layer("cpu", real=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(layer.x_shape, dtype=np.float32)
    w = rng.standard_normal(layer.w_shape, dtype=np.float32)
    pad = layer.padding
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    load0 = loadavg()
    naive_ms, t_slice, factor = cpu.time_scaled(ref.conv2d_naive, x, w, images=1, filters=1,
                                                repeat=1, padding=pad)
    versions = {
        "vectorized (einsum->BLAS)": lambda: ref.conv2d(x, w, padding=pad,
                                                        accumulate=np.float32),
        "im2col + BLAS": lambda: ref.conv2d_im2col(x, w, padding=pad),
        "numba loops (1 core)": lambda: cpu.conv2d_loops(x, w, padding=pad),
        "prange": lambda: cpu.conv2d_prange(x, w, padding=pad),
        "prange + loop order": lambda: cpu.conv2d_reordered(x, w, padding=pad),
        "prange + blocking": lambda: cpu.conv2d_blocked(x, w, padding=pad),
        "blocking, flat tiles": lambda: cpu.conv2d_blocked_flat(x, w, padding=pad),
        "PyTorch conv2d": lambda: torch.nn.functional.conv2d(xt, wt, padding=pad),
    }
    expect = ref.conv2d_im2col(x.astype(np.float64), w.astype(np.float64), padding=pad)
    for name, fn in versions.items():
        err = np.abs(np.asarray(fn()) - expect).max() / np.abs(expect).max()
        assert err < 1e-4, (name, err)
    t = cpu.time_interleaved(versions, rounds=int(os.environ.get("ROUNDS", "5")))
    blas = os.environ.get("OPENBLAS_NUM_THREADS", "(default)")
    print(f"{layer}: {layer.flops / 1e9:.3f} GFLOP; {cpu.cores()} cores; numba threads "
          f"{cpu.threads()}, torch threads {torch.get_num_threads()}; "
          f"OPENBLAS_NUM_THREADS={blas}")
    print(f"CPU: {platform.processor() or platform.machine()}; numpy {np.__version__}, torch "
          f"{torch.__version__}; loadavg before {load0}, after {loadavg()}; "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    print(f"naive: {t_slice.median_ms:.0f} ms on 1 image x 1 filter, x{factor:.0f} (N*K) -> "
          f"{naive_ms / 1e3:.1f} s estimated")
    print(f"{'version':<28}{'median ms':>10}{'min ms':>9}{'GFLOP/s':>9}{'vs naive':>10}"
          f"{'vs torch':>9}")
    tt = t["PyTorch conv2d"].median_ms
    print(f"{'naive loops (slice x N*K)':<28}{naive_ms:10.1f}{'':>9}"
          f"{layer.flops / naive_ms / 1e6:9.3f}{1:9.0f}x{naive_ms / tt:8.0f}x")
    for name, v in t.items():
        print(f"{name:<28}{v.median_ms:10.2f}{min(v.samples_ms):9.2f}"
              f"{layer.flops / v.median_ms / 1e6:9.1f}{naive_ms / v.median_ms:9.0f}x"
              f"{v.median_ms / tt:8.2f}x")
    ours = {k: v.median_ms for k, v in t.items() if k != "PyTorch conv2d"}
    best = min(ours, key=ours.get)
    print(f"im2col+BLAS vs naive: {naive_ms / ours['im2col + BLAS']:.0f}x; best course version: "
          f"{best}, {ours[best] / tt:.2f}x PyTorch's time (median); by the fastest round: "
          f"{min(t[best].samples_ms) / min(t['PyTorch conv2d'].samples_ms):.2f}x")


if __name__ == "__main__":
    main()
