"""Transfers and launch overhead (lessons 04-06); `time_gpu_queued` and `launch_cost_us`
live in `convlab.bench` (the ladder times with them too) and are re-exported here.

Why `time_gpu_queued` exists: launching a Numba kernel from Python costs the CPU about
20-40 µs. `bench.time_gpu` launches a kernel many times in a row and divides the event
time by the number of launches; when the kernel is shorter than its launch, the GPU
waits for the CPU between kernels and the result is the *launch rate*, not the kernel.
`time_gpu_queued` first launches a "spin" kernel that keeps the GPU busy until all the
timed launches are queued behind it, so the events see the kernels back to back.
"""

from __future__ import annotations

import time

import numpy as np

from ..bench import _timing_kernels as _kernels
from ..bench import launch_cost_us, require_gpu, time_gpu_queued  # noqa: F401  (re-exported)
from ..runtime import cuda


def transfer_table(sizes=(2**12, 2**16, 2**20, 2**24, 2**28), repeat: int = 7) -> list:
    """Host <-> device copy time and GB/s for pageable and pinned host memory."""
    require_gpu("transfer_table")
    c = cuda()
    from ..bench import time_gpu

    rows = []
    for nbytes in sizes:
        n = nbytes // 4
        h = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        hp = c.pinned_array(n, dtype=np.float32)
        hp[:] = h
        d = c.device_array(n, dtype=np.float32)
        row = dict(bytes=nbytes)
        for label, fn in (("h2d_pageable", lambda d=d, h=h: d.copy_to_device(h)),
                          ("h2d_pinned", lambda d=d, hp=hp: d.copy_to_device(hp)),
                          ("d2h_pageable", lambda d=d, h=h: d.copy_to_host(h)),
                          ("d2h_pinned", lambda d=d, hp=hp: d.copy_to_host(hp))):
            ms = time_gpu(fn, warmup=2, repeat=repeat, group_ms=0.0).median_ms
            row[label] = dict(ms=ms, gbps=nbytes / (ms * 1e-3) / 1e9)
        rows.append(row)
    return rows


def wall_vs_events(fn, *args, repeat: int = 5, **kwargs) -> dict:
    """The same kernel timed four ways: first call, wall clock without and with
    synchronize, CUDA events. Only the last two measure the kernel."""
    require_gpu("wall_vs_events")
    c = cuda()
    from ..bench import time_gpu

    t = time.perf_counter()
    fn(*args, **kwargs)
    c.synchronize()
    first = (time.perf_counter() - t) * 1e3  # includes compiling the kernel, if new
    nosync, withsync = [], []
    for _ in range(repeat):
        c.synchronize()
        t = time.perf_counter()
        fn(*args, **kwargs)  # returns as soon as the launch is queued
        nosync.append((time.perf_counter() - t) * 1e3)
        c.synchronize()
        t = time.perf_counter()
        fn(*args, **kwargs)
        c.synchronize()  # waits for the kernel to finish
        withsync.append((time.perf_counter() - t) * 1e3)
    ev = time_gpu(fn, *args, **kwargs)
    return dict(first_call_wall_ms=first, wall_no_sync_ms=float(np.median(nosync)),
                wall_sync_ms=float(np.median(withsync)), events_ms=ev.median_ms,
                events_spread=ev.spread)


def launch_overhead() -> dict:
    """Launch cost from Python (CPU µs per call) and an empty kernel's GPU time."""
    require_gpu("launch_overhead")
    c = cuda()
    k = _kernels()["empty"]
    d = c.device_array(1024, dtype=np.float32)
    h = np.zeros(1024, np.float32)
    import warnings

    from ..bench import time_gpu

    with warnings.catch_warnings():  # Numba warns about the tiny grid and the NumPy argument
        warnings.simplefilter("ignore")
        return dict(
            empty_device_arg_cpu_us=launch_cost_us(lambda: k[1, 32](d)),
            empty_numpy_arg_cpu_us=launch_cost_us(lambda: k[1, 32](h), calls=20),
            empty_events_back_to_back_us=time_gpu(lambda: k[1, 32](d)).median_ms * 1e3,
            empty_gpu_queued_us=time_gpu_queued(lambda: k[1, 32](d), calls=50).median_ms * 1e3)
