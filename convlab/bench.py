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

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import check
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

    def table(self) -> str:
        head = f"{self.problem}  ({self.flops / 1e9:.2f} GFLOP, {self.bytes / 1e6:.1f} MB)"
        lines = [head, f"{'version':<24}{'ms':>9}{'TFLOP/s':>9}{'GB/s':>8}{'% base':>8}"
                 f"{'rel err':>9}"]
        for r in self.rows:
            pct = f"{r.pct_of_baseline:7.1f}%" if r.pct_of_baseline is not None else "      -"
            lines.append(f"{r.name:<24}{r.ms:9.4f}{r.tflops:9.2f}{r.gbps:8.0f} {pct}"
                         f"{r.max_rel_err:9.1e}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return dict(problem=self.problem, flops=self.flops, bytes=self.bytes,
                    baseline=self.baseline, rows=[asdict(r) for r in self.rows])


def bench_conv(impls: list, problem, *, baseline: str | None = None, seed: int = 0,
               repeat: int = 15, precision: dict | None = None, verbose: bool = True) -> Ladder:
    """Check every Impl on the same random inputs, then time each; one Ladder table.

    An Impl that fails the check is reported and not timed. precision maps an Impl name
    to 'tf32' / 'fp16' for library rows that are not fp32.
    """
    require_gpu("bench_conv")
    precision = precision or {}
    rng = np.random.default_rng(seed)
    x = check.random_array(problem.x_shape, rng)
    w = check.random_array(problem.w_shape, rng)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    expected = ref.conv2d_im2col(x64, w64, **problem.kwargs)
    absref = ref.conv2d_im2col(np.abs(x64), np.abs(w64), **problem.kwargs)
    red = ref.conv_params(x.shape, w.shape, **problem.kwargs).reduction
    lad = Ladder(str(problem), problem.flops, problem.bytes, baseline)
    for impl in impls:
        try:
            state = impl.prepare(x, w)
            impl.run(state)
            cuda().synchronize()
            out = impl.fetch(state)
            comp = check.compare(out, expected, absref, red, precision.get(impl.name, "fp32"))
            if not comp.ok:
                raise check.CheckError(comp.summary())
            t = time_gpu(impl.run, state, repeat=repeat)
        except Exception as e:  # noqa: BLE001  (one broken version must not stop the ladder)
            if verbose:
                print(f"  {impl.name}: NOT TIMED: {type(e).__name__}: {str(e)[:300]}")
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


_KERNELS: dict = {}


def _ceiling_kernels():
    """A grid-stride copy and an FMA-throughput kernel, compiled once."""
    if _KERNELS:
        return _KERNELS
    c = cuda()
    from numba import float32

    @c.jit
    def copy_kernel(src, dst):
        i = c.grid(1)
        step = c.gridsize(1)
        while i < src.size:
            dst[i] = src[i]
            i += step

    @c.jit
    def fma_chains(out, n_iter):
        # 16 independent FMA chains per thread keep every FP32 lane busy
        i = c.grid(1)
        a = c.local.array(16, float32)
        for j in range(16):
            a[j] = float32(i) * float32(1e-9) + float32(j)
        m, k = float32(0.9999), float32(1e-6)
        for _ in range(n_iter):
            for j in range(16):
                a[j] = a[j] * m + k
        s = float32(0.0)
        for j in range(16):
            s += a[j]
        out[i] = s

    _KERNELS.update(copy=copy_kernel, fma=fma_chains)
    return _KERNELS


def copy_bandwidth(nbytes: int = 1 << 31, repeat: int = 10) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written.

    The best of the driver's memcpy and a grid-stride copy kernel.
    """
    require_gpu("copy_bandwidth")
    c = cuda()
    n = nbytes // 4
    a = c.device_array(n, dtype=np.float32)
    b = c.device_array(n, dtype=np.float32)
    memcpy = time_gpu(lambda: b.copy_to_device(a), repeat=repeat)
    k = _ceiling_kernels()["copy"]
    blocks = c.get_current_device().MULTIPROCESSOR_COUNT * 8
    kernel = time_gpu(lambda: k[blocks, 512](a, b), repeat=repeat)
    return max(memcpy.gbps(2 * nbytes), kernel.gbps(2 * nbytes))


def fma_peak(repeat: int = 5) -> float:
    """Plain fp32 FMA throughput in TFLOP/s from a kernel of independent FMA chains."""
    require_gpu("fma_peak")
    c = cuda()
    k = _ceiling_kernels()["fma"]
    sms = c.get_current_device().MULTIPROCESSOR_COUNT
    blocks, threads, n_iter = sms * 8, 256, 2048
    out = c.device_array(blocks * threads, dtype=np.float32)
    t = time_gpu(lambda: k[blocks, threads](out, n_iter), repeat=repeat)
    return t.tflops(blocks * threads * n_iter * 16 * 2)


def measure_ceilings() -> dict:
    """This device's roofline ceilings: copy GB/s and fp32 FMA TFLOP/s, measured now."""
    c = cuda()
    dev = c.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
    return dict(device=name, copy_gbps=copy_bandwidth(), fma_tflops=fma_peak())


def roofline(points: list, bandwidth_gbps: float, peak_tflops: float, ax=None,
             title: str = "roofline"):
    """Draw the roofline and points [(label, FLOP/byte, TFLOP/s), ...]; returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4.2))
    ridge = peak_tflops * 1e12 / (bandwidth_gbps * 1e9)
    xs = [p[1] for p in points] + [ridge]
    lo, hi = min(xs + [0.5]) / 4, max(xs + [ridge]) * 8
    grid = np.logspace(math.log10(lo), math.log10(hi), 200)
    roof = np.minimum(peak_tflops, grid * bandwidth_gbps / 1e3)
    ax.loglog(grid, roof, "k-", lw=2)
    ax.annotate(f"memory: {bandwidth_gbps / 1e3:.2f} TB/s", (lo * 1.3, lo * 1.3 * bandwidth_gbps
                                                            / 1e3 * 1.25), fontsize=8,
                rotation=28)
    ax.axhline(peak_tflops, color="k", lw=0.5, ls=":")
    ax.annotate(f"fp32 FMA peak: {peak_tflops:.1f} TFLOP/s", (ridge * 1.2, peak_tflops * 1.08),
                fontsize=8)
    for label, ai, tf in points:
        ax.plot(ai, tf, "o")
        ax.annotate(label, (ai, tf), textcoords="offset points", xytext=(5, -10), fontsize=8)
    ax.set_xlabel("arithmetic intensity (FLOP / byte of compulsory traffic)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title)
    return ax


# ----------------------------------------------------------------------------------------
# Stored results from a real GPU, for learners without one

RESULTS_DIR = Path(__file__).parent / "results"


def stored_results(name: str = "h200") -> dict:
    """The committed measurements from a real GPU (see convlab/results/)."""
    path = RESULTS_DIR / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"no stored results {path.name}; known: "
                                f"{sorted(p.stem for p in RESULTS_DIR.glob('*.json'))}")
    return json.loads(path.read_text())
