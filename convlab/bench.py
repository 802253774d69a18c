"""Timing that can be trusted: device events, warm-up, medians, correctness first.

- `time_gpu` times device work with CUDA events (never the wall clock), after warm-up
  calls that absorb JIT compilation, in groups long enough to hide launch gaps, and
  reports the median and spread. Under the simulator it refuses: simulated "timings"
  measure Python threads, not a GPU.
- `time_cpu` does the same with ``perf_counter`` for CPU code.
- `Impl` + `bench_conv` check every implementation against a float64 reference on the
  same random inputs, then time each one the same way, libraries included, in one run.
- `measure_ceilings` measures this device's copy bandwidth and FMA peak for the roofline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from . import check, results
from . import reference as ref
from .runtime import cuda, is_simulator


class SimulatorTimingError(RuntimeError):
    """Raised instead of a fake timing when the runtime is the simulator."""


def require_gpu(what: str = "timing"):
    if is_simulator():
        raise SimulatorTimingError(
            f"{what} needs a real GPU: this is the Numba CUDA simulator, which runs each CUDA "
            "thread as a Python thread, so its times say nothing about GPUs. Look at the stored "
            "H200 numbers instead (convlab.bench.stored_results()).")


@dataclass
class Timing:
    """Times of one operation in milliseconds (one sample per timed group)."""

    samples_ms: list
    method: str = "cuda events"

    @property
    def median_ms(self) -> float:
        return float(np.median(self.samples_ms))

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: how much the samples scatter, as a fraction."""
        lo, hi = np.percentile(self.samples_ms, [10, 90])
        return float((hi - lo) / self.median_ms) if self.median_ms > 0 else 0.0

    def tflops(self, flops: int) -> float:
        return flops / (self.median_ms * 1e-3) / 1e12

    def gbps(self, nbytes: int) -> float:
        return nbytes / (self.median_ms * 1e-3) / 1e9

    def __str__(self) -> str:
        return f"{self.median_ms:.4g} ms ± {100 * self.spread:.0f}% ({self.method})"


def time_gpu(fn: Callable, *args, warmup: int = 3, repeat: int = 15, group_ms: float = 2.0,
             **kwargs) -> Timing:
    """Median time of ``fn(*args, **kwargs)`` on the GPU, in ms, by CUDA events.

    warmup calls run first (compilation, caches). Calls are timed in groups of enough
    calls to last about group_ms, so the Python launch gap of the first call is amortized;
    each group gives one sample (time / calls).
    """
    require_gpu()
    c = cuda()
    for _ in range(warmup):
        fn(*args, **kwargs)
    c.synchronize()
    start, end = c.event(), c.event()
    start.record()
    fn(*args, **kwargs)
    end.record()
    end.synchronize()
    once = max(c.event_elapsed_time(start, end), 1e-3)
    inner = max(1, min(1000, int(group_ms / once)))
    samples = []
    for _ in range(repeat):
        start.record()
        for _ in range(inner):
            fn(*args, **kwargs)
        end.record()
        end.synchronize()
        samples.append(c.event_elapsed_time(start, end) / inner)
    return Timing(samples, f"cuda events, median of {repeat}×{inner} calls")


def time_cpu(fn: Callable, *args, warmup: int = 1, repeat: int = 5, **kwargs) -> Timing:
    """Median wall time of a CPU function, in ms (perf_counter)."""
    for _ in range(warmup):
        fn(*args, **kwargs)
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        samples.append((time.perf_counter() - t0) * 1e3)
    return Timing(samples, f"perf_counter, median of {repeat}")


# ----------------------------------------------------------------------------------------
# Implementations under test, checked then timed the same way


@dataclass
class Impl:
    """Something that computes a conv: prepare device inputs once, run, fetch the result.

    prepare(x, w) -> state (host arrays in); run(state) launches; fetch(state) -> host out.
    """

    name: str
    prepare: Callable
    run: Callable
    fetch: Callable
    kind: str = "course"  # 'course' kernel or a 'library' baseline


def launcher_impl(name: str, launcher: Callable, problem) -> Impl:
    """Wrap a course launcher (device arrays, fills ``out``) as an Impl."""
    kw = problem.kwargs

    def prepare(x, w):
        c = cuda()
        return dict(x=c.to_device(x), w=c.to_device(w),
                    out=c.to_device(check.poisoned(problem.out_shape)))

    def run(s):
        launcher(s["x"], s["w"], s["out"], **kw)

    return Impl(name, prepare, run, lambda s: s["out"].copy_to_host())


@dataclass
class Row:
    name: str
    kind: str
    ms: float
    spread: float
    tflops: float
    gbps: float
    max_rel_err: float
    pct_of_baseline: float | None = None


@dataclass
class Ladder:
    problem: str
    flops: int
    bytes: int
    baseline: str | None
    rows: list = field(default_factory=list)
    # the implementations that could not be timed, as data: {"name", "stage", "error"}
    # (stage: "prepare", "check" (ran but wrong, or raised) or "timing")
    not_timed: list = field(default_factory=list)

    def table(self) -> str:
        head = f"{self.problem}  ({self.flops / 1e9:.2f} GFLOP, {self.bytes / 1e6:.1f} MB)"
        lines = [head, f"{'version':<24}{'ms':>9}{'TFLOP/s':>9}{'GB/s':>8}{'% base':>8}"
                 f"{'rel err':>9}"]
        for r in self.rows:
            pct = f"{r.pct_of_baseline:7.1f}%" if r.pct_of_baseline is not None else "      -"
            lines.append(f"{r.name:<24}{r.ms:9.4f}{r.tflops:9.2f}{r.gbps:8.0f} {pct}"
                         f"{r.max_rel_err:9.1e}")
        lines += [f"{d['name']:<24} not timed ({d['stage']}): {d['error'][:120]}"
                  for d in self.not_timed]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return dict(problem=self.problem, flops=self.flops, bytes=self.bytes,
                    baseline=self.baseline, rows=[asdict(r) for r in self.rows],
                    not_timed=[dict(d) for d in self.not_timed])


def bench_conv(impls: list, problem, *, baseline: str | None = None, seed: int = 0,
               repeat: int = 15, precision: dict | None = None, verbose: bool = True,
               clock=None) -> Ladder:
    """Check every Impl on the same random inputs, then time each; one Ladder table.

    An Impl that fails the check (or raises) is not timed: it comes back in
    ``Ladder.not_timed`` with the stage it failed at and why. precision maps an Impl name
    to 'tf32' / 'fp16' for library rows that are not fp32. clock: an object whose
    ``time_gpu(fn, *args, repeat=)`` returns a `Timing` (default: `time_gpu`, CUDA events;
    `convlab.measure.FakeClock` for dry runs under the simulator).
    """
    if clock is None:
        require_gpu("bench_conv")
    timer = clock.time_gpu if clock is not None else time_gpu
    precision = precision or {}
    rng = np.random.default_rng(seed)
    case = check.reference_case(check.random_array(problem.x_shape, rng),
                                check.random_array(problem.w_shape, rng), op=ref.conv2d_im2col,
                                **problem.kwargs)
    x, w = case["inputs"]
    lad = Ladder(str(problem), problem.flops, problem.bytes, baseline)
    for impl in impls:
        stage = "prepare"
        try:
            state = impl.prepare(x, w)
            stage = "check"
            impl.run(state)
            cuda().synchronize()
            out = impl.fetch(state)
            comp = check.compare(out, case["expected"], case["absref"], case["reduction"],
                                 precision.get(impl.name, "fp32"))
            if not comp.ok:
                raise check.CheckError(comp.summary())
            stage = "timing"
            t = timer(impl.run, state, repeat=repeat)
        except Exception as e:  # noqa: BLE001  (one broken version must not stop the ladder)
            lad.not_timed.append(dict(name=impl.name, stage=stage,
                                      error=f"{type(e).__name__}: {str(e)[:300]}"))
            continue
        lad.rows.append(Row(impl.name, impl.kind, t.median_ms, t.spread,
                            t.tflops(problem.flops), t.gbps(problem.bytes), comp.max_rel))
        del state
    base = next((r for r in lad.rows if r.name == baseline), None)
    for r in lad.rows:
        r.pct_of_baseline = 100 * base.ms / r.ms if base else None
    if verbose:
        print(lad.table())
    return lad


# ----------------------------------------------------------------------------------------
# Ceilings and the roofline


def copy_bandwidth(nbytes: int = 1 << 31, repeat: int = 10) -> float:
    """Best device-to-device copy bandwidth in GB/s (bytes read + written); see
    `convlab.ceilings.copy_bandwidth` for every copy it tries."""
    require_gpu("copy_bandwidth")
    from . import ceilings

    return ceilings.copy_bandwidth(nbytes, repeat)["gbps"]


def fma_peak(repeat: int = 7) -> float:
    """Measured fp32 FMA TFLOP/s (`convlab.ceilings.fma_peak`: a CUDA C kernel of independent
    FMA chains, within a few % of `convlab.ceilings.theoretical_peak`)."""
    require_gpu("fma_peak")
    from . import ceilings

    return ceilings.fma_peak(repeat)["tflops"]


def measure_ceilings() -> dict:
    """This device's measured and theoretical ceilings (`convlab.ceilings.measure_ceilings`)."""
    from . import ceilings

    return ceilings.measure_ceilings()


def roofline(points: list, bandwidth_gbps: float, peak_tflops: float, ax=None,
             title: str = "roofline"):
    """The roofline in TFLOP/s under the fp32 FMA peak, points [(label, FLOP/byte,
    TFLOP/s), ...] (`convlab.viz.roofline`); returns the axes."""
    from . import viz

    return viz.roofline(points, bandwidth_gbps, peak_tflops, "fp32 FMA peak", title, ax,
                        unit="TFLOP/s")


# ----------------------------------------------------------------------------------------
# Stored results from a real GPU, for learners without one

def stored_results(name: str = "h200") -> dict:
    """The committed measurements from a real GPU (`convlab.results.load`)."""
    return results.load(name)
