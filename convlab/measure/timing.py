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


# nvidia-smi's clock-event reasons (bits of clocks_event_reasons.active) that slow the clock
CLOCK_REASONS = {0x4: "software power cap", 0x8: "hardware slowdown",
                 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
                 0x80: "hardware power brake"}
SMI_FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"


def clock_reasons(mask: int) -> list:
    """Names of the slowing reasons set in an nvidia-smi reason bitmask."""
    return [name for bit, name in CLOCK_REASONS.items() if mask & bit]


def parse_smi_samples(text: str, t0: float, t1: float) -> list:
    """(sm_mhz, power_w, temp_c, reason mask) of each nvidia-smi CSV line (SMI_FIELDS, no
    header or units) stamped between t0 and t1 (seconds since the epoch, local time)."""
    rows = []
    for line in text.strip().splitlines():
        f = [p.strip() for p in line.split(",")]
        try:
            stamp, _, frac = f[0].partition(".")
            ts = time.mktime(time.strptime(stamp, "%Y/%m/%d %H:%M:%S"))
            ts += float("0." + (frac or "0"))
            row = (float(f[1]), float(f[2]), float(f[3]), int(f[4], 16))
        except (ValueError, IndexError):   # a header, "[N/A]", a cut last line
            continue
        if t0 <= ts <= t1:
            rows.append(row)
    return rows


def _smi_fields() -> str | None:
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return None
    for fields in (SMI_FIELDS, SMI_FIELDS.replace("clocks_event", "clocks_throttle")):
        if subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv"],
                          capture_output=True).returncode == 0:   # older drivers: throttle
            return fields
    return None


def sustained(fn, *args, seconds: float = 1.5, sample_ms: int = 20, **kwargs) -> dict:
    """fn called back to back for about `seconds`: ms per call by CUDA events, and the SM
    clock (MHz, median), board power (W, median) and slowing reasons nvidia-smi reported
    over the run's last 80% (after the power controller has reacted). A GEMM that keeps
    the card at its power limit runs at a lower clock than in a short burst; the ratio of
    two kernels can differ between the two. Clock fields are None without nvidia-smi."""
    import subprocess

    from ..bench import time_gpu

    require_gpu("sustained")
    c = cuda()
    once = time_gpu(fn, *args, warmup=1, repeat=3, **kwargs).median_ms
    calls = max(10, int(seconds * 1e3 / once))
    fields = _smi_fields()
    smi = fields and subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits",
         f"-lms={sample_ms}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    time.sleep(0.3 if smi else 0)
    start, end = c.event(), c.event()
    c.synchronize()
    t0 = time.time()
    start.record()
    for _ in range(calls):
        fn(*args, **kwargs)
    end.record()
    end.synchronize()
    t1 = time.time()
    ms = c.event_elapsed_time(start, end) / calls
    out = dict(ms=ms, calls=calls, seconds=t1 - t0, sm_mhz=None, power_w=None, max_temp_c=None,
               reasons=[], samples=0, method=f"cuda events, {calls} calls back to back")
    if smi:
        time.sleep(2 * sample_ms / 1e3)
        smi.terminate()
        s = parse_smi_samples(smi.communicate()[0], t0 + 0.2 * (t1 - t0), t1)
        if s:
            mask = 0
            for row in s:
                mask |= row[3]
            out.update(sm_mhz=float(np.median([r[0] for r in s])),
                       power_w=float(np.median([r[1] for r in s])),
                       max_temp_c=max(r[2] for r in s), reasons=clock_reasons(mask),
                       samples=len(s))
    return out


def burst_rounds(pairs, time_ms, rounds: int) -> dict:
    """Each (name, run) of `pairs` timed by `time_ms(run)` (one short burst, ms) in turn,
    `rounds` times, the order reversed every other round: kernels seconds apart are timed
    on the card as it is then. Per name: `ms`, the median over rounds; `pct_library`, the
    median over rounds of the first pair's ms over this one's in the same round (%), with
    `pct_low` / `pct_high`, the lowest and highest; `ms_rounds`, every round's ms."""
    runs = {name: [] for name, _ in pairs}
    for k in range(rounds):
        for name, run in pairs if k % 2 == 0 else pairs[::-1]:
            runs[name].append(time_ms(run))
    lib = runs[pairs[0][0]]
    out = {}
    for name, ms in runs.items():
        pct = [100 * a / b for a, b in zip(lib, ms, strict=True)]
        out[name] = dict(ms=float(np.median(ms)), pct_library=float(np.median(pct)),
                         pct_low=min(pct), pct_high=max(pct), ms_rounds=[float(v) for v in ms])
    return out
