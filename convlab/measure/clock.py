"""Where a measurement's times come from: the GPU's events, or a fake clock for dry runs.

Every measurement takes its times from a clock object instead of calling the timing
functions directly, so one code path serves both uses:

- `GpuClock`: CUDA events on this GPU (`bench.time_gpu`, `time_gpu_queued`, the
  copy and FMA ceilings). Under the simulator its timings refuse (SimulatorTimingError).
- `FakeClock`: every timing runs the function once (the kernel still runs, under the
  simulator, and is still checked) and reports a fixed time. A dry run with it finds
  mistakes in a measurement's code on a laptop; its numbers mean nothing.

`bench.bench_conv(..., clock=)` and `autotune.tune(..., clock=)` take the same objects.
"""

from __future__ import annotations

import time
import weakref

from .. import bench
from . import timing


class GpuClock:
    """CUDA events on the current GPU (median of groups, warm-up first)."""

    fake = False
    method = "cuda events"

    def time_gpu(self, fn, *args, **kwargs) -> bench.Timing:
        """GPU time of fn, launch after launch from Python (`bench.time_gpu`)."""
        return bench.time_gpu(fn, *args, **kwargs)

    def queued(self, fn, *args, **kwargs) -> bench.Timing:
        """GPU time of fn with launches queued behind a spin kernel (`time_gpu_queued`)."""
        return timing.time_gpu_queued(fn, *args, **kwargs)

    def time_cpu(self, fn, *args, **kwargs) -> bench.Timing:
        return bench.time_cpu(fn, *args, **kwargs)

    def time_call(self, fn, *args, **kwargs) -> bench.Timing:
        """Wall time per call of fn from a Python loop, synchronized (`bench.time_call`)."""
        return bench.time_call(fn, *args, **kwargs)

    def launch_cost_us(self, fn, *args, calls: int = 200, **kwargs) -> float:
        return timing.launch_cost_us(fn, *args, calls=calls, **kwargs)

    def seconds(self, fn, *args, **kwargs) -> float:
        """Wall seconds of one synchronous call (end-to-end work that mixes CPU and GPU)."""
        t = time.perf_counter()
        fn(*args, **kwargs)
        return time.perf_counter() - t

    def copy_bandwidth(self, **kwargs) -> float:
        return bench.copy_bandwidth(**kwargs)

    def ceilings(self) -> dict:
        return bench.measure_ceilings()

    def transfer_table(self, sizes, **kwargs) -> list:
        return timing.transfer_table(sizes, **kwargs)

    def wall_vs_events(self, fn, *args, **kwargs) -> dict:
        return timing.wall_vs_events(fn, *args, **kwargs)

    def launch_overhead(self) -> dict:
        return timing.launch_overhead()

    def sustained(self, fn, *args, **kwargs) -> dict:
        """fn back to back for seconds, with the SM clock and power (`timing.sustained`)."""
        return timing.sustained(fn, *args, **kwargs)


class FakeClock(GpuClock):
    """Runs each timed function once and reports `ms` milliseconds; counts the calls.

    A function timed a second time (per-call time, then queued time of the same closure)
    is not run again: under the simulator a run costs seconds and proves nothing new.
    Bandwidths are `gbps`, the FMA peak `tflops`. For dry runs under the simulator.
    """

    fake = True
    method = "fake clock (dry run)"

    def __init__(self, ms: float = 1.0, gbps: float = 1000.0, tflops: float = 10.0):
        self.ms, self.gbps, self.tflops = ms, gbps, tflops
        self.calls = 0
        self._ran = weakref.WeakSet()  # argument-free functions already run

    def __getstate__(self):  # to worker processes (autotune): without the functions run here
        return {k: v for k, v in self.__dict__.items() if k != "_ran"}

    def __setstate__(self, state):
        self.__dict__.update(state, _ran=weakref.WeakSet())

    def _once(self, fn, *args, warmup=None, repeat=None, group_ms=None, calls=None,
              **kwargs) -> bench.Timing:
        if args or kwargs or fn not in self._ran:
            fn(*args, **kwargs)
            try:
                if not (args or kwargs):
                    self._ran.add(fn)
            except TypeError:  # not weak-referenceable (a builtin): it runs every time
                pass
        self.calls += 1
        return bench.Timing([self.ms] * 3, self.method)

    time_gpu = queued = time_cpu = time_call = _once

    def launch_cost_us(self, fn, *args, calls: int = 200, **kwargs) -> float:
        self._once(fn, *args, **kwargs)
        return 1e3 * self.ms

    def seconds(self, fn, *args, **kwargs) -> float:
        self._once(fn, *args, **kwargs)
        return self.ms / 1e3

    def copy_bandwidth(self, **kwargs) -> float:
        return self.gbps

    def ceilings(self) -> dict:
        return dict(device="simulator (fake clock)", copy_gbps=self.gbps,
                    fma_tflops=self.tflops)

    def transfer_table(self, sizes, **kwargs) -> list:
        row = dict(ms=self.ms, gbps=1.0)
        return [dict(bytes=n, **{k: dict(row) for k in (
            "h2d_pageable", "h2d_pinned", "d2h_pageable", "d2h_pinned")}) for n in sizes]

    def wall_vs_events(self, fn, *args, repeat: int = 5, **kwargs) -> dict:
        self._once(fn, *args, **kwargs)
        return dict(first_call_wall_ms=self.ms, wall_no_sync_ms=self.ms,
                    wall_sync_ms=self.ms, events_ms=self.ms, events_spread=0.0)

    def sustained(self, fn, *args, seconds: float = 1.5, sample_ms: int = 20,
                  **kwargs) -> dict:
        self._once(fn, *args, **kwargs)
        return dict(ms=self.ms, calls=1, seconds=self.ms / 1e3, sm_mhz=None, power_w=None,
                    max_temp_c=None, reasons=[], samples=0, method=self.method)

    def launch_overhead(self) -> dict:
        us = 1e3 * self.ms
        return dict(empty_device_arg_cpu_us=us, empty_numpy_arg_cpu_us=us,
                    empty_events_back_to_back_us=us, empty_gpu_queued_us=us)
