"""Timing that can be trusted: device events, warm-up, medians, correctness first.

- `time_gpu` times device work with CUDA events (never the wall clock), after warm-up
  calls that absorb JIT compilation, in groups long enough to hide launch gaps, and
  reports the median and spread. Under the simulator it refuses: simulated "timings"
  measure Python threads, not a GPU.
- `time_cpu` does the same with ``perf_counter`` for CPU code.
- `Impl` + `bench_conv` check every implementation against a float64 reference on the
  same random inputs, then time each one the same way, libraries included, in one run.
- `measure_ceilings` measures this device's copy bandwidth and FMA peak for the roofline,
  beside `theoretical_peak` (SMs x FP32 lanes x 2 x clock).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import check, results
from . import reference as ref
from .runtime import cuda, import_optional, is_simulator


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


class QueueNotFull(RuntimeError):
    """`time_gpu_queued` could not queue the calls: each one waits for the GPU."""


_K: dict = {}


def _timing_kernels():
    """The spin kernel of `time_gpu_queued` and an empty kernel (launch overhead)."""
    if _K:
        return _K
    c = cuda()
    from numba import float32

    @c.jit
    def spin(out, n):
        # one thread, one dependent chain of multiply-adds: n * ~4 cycles of GPU time
        x = out[0]
        for _ in range(n):
            x = x * float32(0.9999999) + float32(1e-7)
        out[0] = x

    @c.jit
    def empty(a):
        pass

    _K.update(spin=spin, empty=empty)
    return _K


def _spin_ns_per_iter() -> float:
    if "ns_per_iter" not in _K:
        c = cuda()
        k = _timing_kernels()["spin"]
        buf = c.to_device(np.ones(1, np.float32))
        k[1, 1](buf, 10)
        c.synchronize()
        n = 200_000
        start, end = c.event(), c.event()
        start.record()
        k[1, 1](buf, n)
        end.record()
        end.synchronize()
        _K["ns_per_iter"] = c.event_elapsed_time(start, end) * 1e6 / n
        _K["buf"] = buf
    return _K["ns_per_iter"]


def launch_cost_us(fn, *args, calls: int = 200, **kwargs) -> float:
    """CPU time of one asynchronous call of fn from Python (µs): the launch overhead."""
    require_gpu("launch_cost_us")
    c = cuda()
    fn(*args, **kwargs)
    c.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn(*args, **kwargs)
    us = (time.perf_counter() - t) / calls * 1e6
    c.synchronize()
    return us


def launch_overhead() -> dict:
    """Launch cost from Python (CPU µs per call) and an empty kernel's GPU time."""
    require_gpu("launch_overhead")
    c = cuda()
    k = _timing_kernels()["empty"]
    d = c.device_array(1024, dtype=np.float32)
    h = np.zeros(1024, np.float32)
    with warnings.catch_warnings():  # Numba warns about the tiny grid and the NumPy argument
        warnings.simplefilter("ignore")
        return dict(
            empty_device_arg_cpu_us=launch_cost_us(lambda: k[1, 32](d)),
            empty_numpy_arg_cpu_us=launch_cost_us(lambda: k[1, 32](h), calls=20),
            empty_events_back_to_back_us=time_gpu(lambda: k[1, 32](d)).median_ms * 1e3,
            empty_gpu_queued_us=time_gpu_queued(lambda: k[1, 32](d), calls=50).median_ms * 1e3)


def time_gpu_queued(fn, *args, calls: int = 20, repeat: int = 9, warmup: int = 3,
                    **kwargs) -> Timing:
    """GPU time of fn (ms), with `calls` launches queued behind a spin kernel.

    The spin kernel runs until all `calls` launches are in the queue (checked: its end
    event must still be pending when the last launch returns; if not, the spin doubles
    and the sample is taken again), so the kernels run back to back and the events
    measure the GPU, not Python.
    """
    require_gpu("time_gpu_queued")
    c = cuda()
    k = _timing_kernels()["spin"]
    ns = _spin_ns_per_iter()
    for _ in range(warmup):
        fn(*args, **kwargs)
    c.synchronize()
    cpu_ms = launch_cost_us(fn, *args, calls=calls, **kwargs) * calls / 1e3
    spin_ms = 2 * cpu_ms + 0.2
    start, end, spun = c.event(), c.event(), c.event()
    samples = []
    tries = 0
    while len(samples) < repeat:
        k[1, 1](_K["buf"], int(spin_ms * 1e6 / ns))
        spun.record()
        start.record()
        for _ in range(calls):
            fn(*args, **kwargs)
        end.record()
        covered = not spun.query()  # the spin is still running: the queue was full
        end.synchronize()
        if covered:
            samples.append(c.event_elapsed_time(start, end) / calls)
        else:
            spin_ms *= 2
            tries += 1
            if tries > 6:
                raise QueueNotFull("time_gpu_queued: could not keep the GPU queue full (does "
                                   "the call wait for the GPU, e.g. a synchronous copy?)")
    return Timing(samples, f"cuda events, {calls} calls queued behind a spin kernel, "
                           f"median of {repeat}")


def time_call(fn: Callable, *args, calls: int | None = None, repeat: int = 5,
              warmup: int = 3, loop_ms: float = 10.0, **kwargs) -> Timing:
    """Wall time per call of fn in a Python loop, synchronized at the end, in ms.

    What a learner's loop pays per call: the larger of the call's Python and launch work
    and its GPU time (`time_gpu_queued` measures only the GPU). calls: calls per sample
    (default: enough to last about loop_ms, 3 to 500); a sample is (loop + synchronize)
    / calls.
    """
    require_gpu("time_call")
    c = cuda()
    for _ in range(warmup):
        fn(*args, **kwargs)
    c.synchronize()
    if calls is None:
        t = time.perf_counter()
        fn(*args, **kwargs)
        c.synchronize()
        once = max(time.perf_counter() - t, 1e-6) * 1e3
        calls = max(3, min(500, int(loop_ms / once)))
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(calls):
            fn(*args, **kwargs)
        c.synchronize()
        samples.append((time.perf_counter() - t) / calls * 1e3)
    return Timing(samples, f"wall clock, {calls} calls then synchronize, median of {repeat}")


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
    kind: str = "course"  # a 'course' rung, a 'library' baseline, or 'beside' (Triton)


def launcher_impl(name: str, launcher: Callable, problem, kind: str = "course") -> Impl:
    """Wrap a course launcher (device arrays, fills ``out``) as an Impl."""
    kw = problem.kwargs

    def prepare(x, w):
        c = cuda()
        return dict(x=c.to_device(x), w=c.to_device(w),
                    out=c.to_device(check.poisoned(problem.out_shape)))

    def run(s):
        launcher(s["x"], s["w"], s["out"], **kw)

    return Impl(name, prepare, run, lambda s: s["out"].copy_to_host(), kind)


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
    call_ms: float | None = None  # wall time per call from a Python loop (`time_call`)


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
        lines = [head, f"{'version':<24}{'ms':>9}{'call ms':>9}{'TFLOP/s':>9}{'GB/s':>8}"
                 f"{'% base':>8}{'rel err':>9}"]
        for r in self.rows:
            pct = f"{r.pct_of_baseline:7.1f}%" if r.pct_of_baseline is not None else "      -"
            call = f"{r.call_ms:9.4f}" if r.call_ms is not None else "        -"
            lines.append(f"{r.name:<24}{r.ms:9.4f}{call}{r.tflops:9.2f}{r.gbps:8.0f} {pct}"
                         f"{r.max_rel_err:9.1e}")
        if self.rows:
            lines.append("ms: GPU time (queued launches); call ms: per call of a Python loop")
        lines += [f"{d['name']:<24} not timed ({d['stage']}): {d['error'][:120]}"
                  for d in self.not_timed]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return dict(problem=self.problem, flops=self.flops, bytes=self.bytes,
                    baseline=self.baseline, rows=[asdict(r) for r in self.rows],
                    not_timed=[dict(d) for d in self.not_timed])


def bench_conv(impls: list, problem, *, baseline: str | None = None, seed: int = 0,
               repeat: int = 15, precision: dict | None = None, verbose: bool = True,
               clock=None, rounds: int = 3) -> Ladder:
    """Check every Impl on the same random inputs, then time them all; one Ladder table.

    An Impl that fails the check (or raises) is not timed: it comes back in
    ``Ladder.not_timed`` with the stage it failed at and why. The checked Impls are timed
    in `rounds` interleaved rounds (A B C A B C ...), ``repeat`` samples each in all, so
    that a drift of the GPU's clock during the run touches every row alike. Times are GPU
    times: launches queued behind a spin kernel (`time_gpu_queued`), so a launcher's
    Python work cannot show as kernel time. precision maps an Impl name to 'tf32' / 'fp16'
    for library rows that are not fp32. clock: an object whose ``time_gpu(fn, *args,
    repeat=)`` returns a `Timing` (`convlab.measure.FakeClock` for dry runs). Each row also
    gets ``call_ms``, the wall time per call from a Python loop (`time_call`, or the
    clock's ``time_call``; None if the clock has none or it fails).
    """
    if clock is None:
        require_gpu("bench_conv")
    timer = clock.time_gpu if clock is not None else time_gpu_queued
    caller = getattr(clock, "time_call", None) if clock is not None else time_call
    precision = precision or {}
    rng = np.random.default_rng(seed)
    case = check.reference_case(check.random_array(problem.x_shape, rng),
                                check.random_array(problem.w_shape, rng), op=ref.conv2d_im2col,
                                **problem.kwargs)
    x, w = case["inputs"]
    lad = Ladder(str(problem), problem.flops, problem.bytes, baseline)
    checked = []  # (impl, state, comparison), in the order given
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
            checked.append((impl, state, comp))
        except Exception as e:  # noqa: BLE001  (one broken version must not stop the ladder)
            lad.not_timed.append(dict(name=impl.name, stage=stage,
                                      error=f"{type(e).__name__}: {str(e)[:300]}"))
    samples, method = {impl.name: [] for impl, _, _ in checked}, {}
    per_round = max(1, -(-repeat // max(1, rounds)))
    for _ in range(max(1, rounds)):
        for impl, state, _ in checked:
            if impl.name not in samples:
                continue  # failed to time in an earlier round
            try:
                try:
                    t = timer(impl.run, state, repeat=per_round)
                except QueueNotFull:  # the call synchronizes: time it back to back instead
                    t = time_gpu(impl.run, state, repeat=per_round)
                    t.method = "cuda events, back to back (the call waits for the GPU)"
                samples[impl.name] += list(t.samples_ms)
                method[impl.name] = t.method
            except Exception as e:  # noqa: BLE001
                del samples[impl.name]
                lad.not_timed.append(dict(name=impl.name, stage="timing",
                                          error=f"{type(e).__name__}: {str(e)[:300]}"))
    for impl, state, comp in checked:
        if impl.name in samples:
            t = Timing(samples[impl.name], f"{method[impl.name]}, {rounds} interleaved rounds")
            call = None
            if caller is not None:
                try:
                    call = caller(impl.run, state, repeat=3).median_ms
                except Exception:  # noqa: BLE001  (the GPU time stands without it)
                    call = None
            lad.rows.append(Row(impl.name, impl.kind, t.median_ms, t.spread,
                                t.tflops(problem.flops), t.gbps(problem.bytes), comp.max_rel,
                                call_ms=call))
    del checked
    base = next((r for r in lad.rows if r.name == baseline), None)
    for r in lad.rows:
        r.pct_of_baseline = 100 * base.ms / r.ms if base else None
    if verbose:
        print(lad.table())
    return lad


# ----------------------------------------------------------------------------------------
# Ceilings and the roofline


# FP32 lanes (CUDA cores) per SM by compute capability.
FP32_LANES = {(6, 0): 64, (6, 1): 128, (6, 2): 128, (7, 0): 64, (7, 2): 64, (7, 5): 64,
              (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128, (9, 0): 128, (10, 0): 128,
              (10, 3): 128, (12, 0): 128, (12, 1): 128}
CSRC = Path(__file__).parent / "kernels" / "csrc"


def theoretical_peak(device=None) -> dict:
    """fp32 TFLOP/s = SMs x FP32 lanes per SM x 2 (an FMA is two FLOPs) x clock, read off
    the device (`FP32_LANES` by compute capability; the boost clock the driver reports)."""
    dev = device or cuda().get_current_device()
    cc = tuple(dev.compute_capability)
    lanes = FP32_LANES.get(cc)
    if lanes is None:
        raise KeyError(f"FP32 lanes per SM of compute capability {cc} unknown: add it to "
                       "convlab.bench.FP32_LANES")
    sms, ghz = dev.MULTIPROCESSOR_COUNT, dev.CLOCK_RATE / 1e6  # CLOCK_RATE is in kHz
    return dict(tflops=sms * lanes * 2 * ghz / 1e3, sms=sms, lanes_per_sm=lanes,
                clock_ghz=ghz, compute_capability=list(cc))


def _fma_peak(repeat: int) -> tuple[float, str]:
    """(TFLOP/s, kernel) of 8 independent FMA chains per thread: CUDA C through CuPy (a Numba
    loop spends a third of its issue slots on 64-bit loop arithmetic and reaches ~2/3 of
    the peak, so it is only the fallback, and says so)."""
    c = cuda()
    blocks, threads, n_iter = c.get_current_device().MULTIPROCESSOR_COUNT * 16, 256, 4096
    flops = blocks * threads * n_iter * 16 * 8 * 2
    cp = import_optional("cupy")
    if cp is not None:
        k = cp.RawKernel((CSRC / "fma_chains.cu").read_text(), "fma_chains",
                         options=("-std=c++17",))
        out = cp.empty(blocks * threads, dtype=cp.float32)
        t = time_gpu(lambda: k((blocks,), (threads,), (out, np.int32(n_iter))), repeat=repeat)
        return t.tflops(flops), "cuda c (8 fmaf chains, unrolled)"
    k = _ceiling_kernels()["fma"]
    out = c.device_array(blocks * threads, dtype=np.float32)
    t = time_gpu(lambda: k[blocks, threads](out, np.int32(n_iter)), repeat=repeat)
    return t.tflops(flops), "numba (CuPy missing: ~2/3 of the peak)"


def fma_peak(repeat: int = 7) -> float:
    """Measured fp32 FMA throughput in TFLOP/s, within a few % of `theoretical_peak`."""
    require_gpu("fma_peak")
    return _fma_peak(repeat)[0]


def _copies(nbytes: int, repeat: int) -> dict:
    """GB/s (bytes read + written) of every device-to-device copy of nbytes tried here."""
    c = cuda()
    n = nbytes // 4
    copies = {}
    a, b = c.device_array(n, dtype=np.float32), c.device_array(n, dtype=np.float32)
    copies["numba memcpy"] = time_gpu(lambda: b.copy_to_device(a), repeat=repeat)
    k = _ceiling_kernels()["copy"]
    blocks = c.get_current_device().MULTIPROCESSOR_COUNT * 8
    copies["numba grid-stride kernel"] = time_gpu(lambda: k[blocks, 512](a, b), repeat=repeat)
    a = b = None  # free before the next pair
    cp = import_optional("cupy")
    if cp is not None:
        ca, cb = cp.empty(n, cp.float32), cp.empty(n, cp.float32)
        copies["cupy memcpy"] = time_gpu(lambda: cb.__setitem__(Ellipsis, ca), repeat=repeat)
        ca = cb = None
    torch = import_optional("torch")
    if torch is not None and torch.cuda.is_available():
        ta = torch.empty(n, dtype=torch.float32, device="cuda")
        tb = torch.empty_like(ta)
        copies["torch copy_"] = time_gpu(lambda: tb.copy_(ta), repeat=repeat)
        ta = tb = None
    return {name: t.gbps(2 * nbytes) for name, t in copies.items()}


def copy_bandwidth(nbytes: int = 1 << 31, repeat: int = 10) -> float:
    """Best device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written,
    of a buffer far larger than L2: the driver's memcpy (Numba, CuPy, PyTorch) and a
    grid-stride kernel, the best of them."""
    require_gpu("copy_bandwidth")
    return max(_copies(nbytes, repeat).values())


_KERNELS: dict = {}


def _ceiling_kernels():
    """A grid-stride copy and the Numba fallback of the FMA kernel, compiled once."""
    if _KERNELS:
        return _KERNELS
    c = cuda()
    from numba import float32, int32

    @c.jit
    def copy_kernel(src, dst):
        i = c.grid(1)
        step = c.gridsize(1)
        while i < src.size:
            dst[i] = src[i]
            i += step

    @c.jit
    def fma_chains(out, n_iter):
        i = c.grid(1)
        a0 = float32(i) * float32(1e-9)
        a1, a2, a3 = a0 + float32(1), a0 + float32(2), a0 + float32(3)
        a4, a5, a6, a7 = a0 + float32(4), a0 + float32(5), a0 + float32(6), a0 + float32(7)
        m, k = float32(0.9999), float32(1e-6)
        for _ in range(int32(n_iter)):
            for _u in range(16):
                a0, a1, a2, a3 = a0 * m + k, a1 * m + k, a2 * m + k, a3 * m + k
                a4, a5, a6, a7 = a4 * m + k, a5 * m + k, a6 * m + k, a7 * m + k
        out[i] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7

    _KERNELS.update(copy=copy_kernel, fma=fma_chains)
    return _KERNELS


def measure_ceilings() -> dict:
    """This device's roofline ceilings, measured now, beside the theoretical fp32 peak:
    copy GB/s (and every copy tried) and fp32 FMA TFLOP/s (and the kernel that got it)."""
    require_gpu("measure_ceilings")
    dev = cuda().get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
    theory = theoretical_peak(dev)
    fma, kernel = _fma_peak(7)
    copies = _copies(1 << 31, 10)
    best = max(copies, key=copies.get)
    return dict(device=name, fma_tflops=fma, fma_kernel=kernel,
                theoretical_tflops=theory["tflops"], theoretical=theory,
                copy_gbps=copies[best], copy_best=best, copy_tried=copies,
                fma_pct_of_theoretical=100 * fma / theory["tflops"])


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
