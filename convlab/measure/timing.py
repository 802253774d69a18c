"""Transfers and timing methods (lessons 04-06); `time_gpu_queued`, `launch_cost_us` and
`launch_overhead` live in `convlab.bench` (beside the spin kernel they share) and are
re-exported here.

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

from ..bench import (  # noqa: F401  (re-exported)
    launch_cost_us,
    launch_overhead,
    require_gpu,
    time_gpu_queued,
)
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
