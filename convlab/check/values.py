"""Checkers of answers that are numbers, splits of work or filter factors.

Roofline arithmetic, GEMM intensity and the CPU/GPU crossover batch (lesson 00); splitting
work over threads (lesson 03); pipeline timing and weighted splits over devices (lesson
10); separable filter factors (lesson 11). Each compares with its own reference on fixed
edge cases plus random ones, and names the likely mistake.
"""

from __future__ import annotations

import operator

import numpy as np

from ..errors import CheckError
from .core import _as_float, _close, _pass, _value_call, random_array


def check_roofline(fn, *, seed=None, quiet=False) -> str:
    """fn(intensity FLOP/byte, peak GFLOP/s, bandwidth GB/s) -> attainable GFLOP/s.

    Cases on both sides of the ridge point, on the ridge, and at zero intensity.
    """
    rng = np.random.default_rng(seed)
    task, cases = "roofline", []
    for _ in range(3):
        peak, bw = float(rng.uniform(50, 60000)), float(rng.uniform(10, 5000))
        ridge = peak / bw
        cases += [(ridge * rng.uniform(0.02, 0.9), peak, bw), (ridge * rng.uniform(1.1, 50), peak,
                  bw), (ridge, peak, bw)]
    cases.append((0.0, 100.0, 10.0))
    for ai, peak, bw in cases:
        label = f"intensity {ai:.4g} FLOP/B, peak {peak:.4g} GFLOP/s, bandwidth {bw:.4g} GB/s"
        got = _as_float(task, _value_call(task, fn, (ai, peak, bw), {}, label), label)
        want = min(peak, ai * bw)
        if not _close(got, want):
            hint = ""
            if _close(got, ai * bw):
                hint = " (that is intensity × bandwidth: no ceiling can exceed the peak)"
            elif _close(got, peak):
                hint = " (that is the peak: below the ridge, memory bandwidth limits)"
            raise CheckError(f"{task} FAILED on {label}: got {got:.6g}, expected {want:.6g}"
                             f"{hint}")
    return _pass(task, len(cases), quiet)


def check_gemm_intensity(fn, *, seed=None, quiet=False) -> str:
    """fn(M, N, K, itemsize=4) -> FLOP per byte of C = A @ B (A M×K, B K×N).

    FLOPs 2·M·N·K over the compulsory bytes: read A and B once, write C once.
    """
    rng = np.random.default_rng(seed)
    task = "gemm intensity"
    shapes = [(int(a), int(b), int(c)) for a, b, c in rng.integers(1, 3000, size=(4, 3))]
    shapes += [(1, 4096, 4096), (4096, 1, 1), (7, 7, 7)]
    n = 0
    for M, N, K in shapes:
        for itemsize in (4, 2):
            label = f"M={M}, N={N}, K={K}, itemsize={itemsize}"
            kw = {} if itemsize == 4 else {"itemsize": itemsize}
            got = _as_float(task, _value_call(task, fn, (M, N, K), kw, label), label)
            want = 2 * M * N * K / ((M * K + K * N + M * N) * itemsize)
            if not _close(got, want):
                raise CheckError(f"{task} FAILED on {label}: got {got:.6g}, expected {want:.6g} "
                                 "(2·M·N·K FLOPs over (M·K + K·N + M·N)·itemsize bytes)")
            n += 1
    return _pass(task, n, quiet)


def check_crossover(fn, *, seed=None, quiet=False) -> str:
    """fn(batches, cpu_ms, gpu_ms) -> the smallest batch from which the GPU is faster
    at that batch and at every larger batch measured; None when it is not faster at the
    largest. batches ascend; cpu_ms / gpu_ms are times per call (lists of floats).
    """
    rng = np.random.default_rng(seed)
    task = "crossover"
    b = [1, 2, 4, 8, 16, 32, 64, 128]
    cases = []
    for cross in (3, 0, None):  # crosses at b[3]; GPU always faster; never faster
        cpu = [float(x) * rng.uniform(0.9, 1.1) for x in b]
        gpu = []
        for i in range(len(b)):
            faster = cross is not None and i >= cross
            gpu.append(cpu[i] * (rng.uniform(0.2, 0.8) if faster else rng.uniform(1.2, 5)))
        cases.append((b, cpu, gpu, None if cross is None else b[cross]))
    # a noisy dip: faster once at batch 2, slower again, then faster from 32 on
    cpu = [float(x) for x in b]
    gpu = [c * f for c, f in zip(cpu, [2, 0.9, 1.5, 1.3, 1.1, 0.7, 0.5, 0.3], strict=True)]
    cases.append((b, cpu, gpu, 32))
    # odd batch sizes, numpy arrays
    b2 = np.array([3, 5, 9, 17, 33])
    cases.append((b2, np.array([3.0, 5, 9, 17, 33]), np.array([20.0, 20, 20, 20, 20]), 33))
    for batches, cpu_ms, gpu_ms, want in cases:
        label = f"batches {list(map(int, batches))}, cpu {np.round(cpu_ms, 2).tolist()}, gpu " \
                f"{np.round(gpu_ms, 2).tolist()}"
        got = _value_call(task, fn, (batches, cpu_ms, gpu_ms), {}, label)
        if want is None:
            if got is not None:
                raise CheckError(f"{task} FAILED on {label}: got {got!r}, expected None (the "
                                 "GPU is not faster at the largest batch)")
            continue
        if got is None or _as_float(task, got, label) != want:
            raise CheckError(f"{task} FAILED on {label}: got {got!r}, expected {want} (the "
                             "first batch from which the GPU stays faster)")
    return _pass(task, len(cases), quiet)


def _ranges(parts) -> list:
    out = []
    for p in parts:
        if isinstance(p, slice):
            if p.step not in (None, 1):
                raise ValueError(f"slice {p} has a step; parts must be contiguous")
            out.append((p.start or 0, p.stop))
        elif isinstance(p, range):
            if p.step != 1:
                raise ValueError(f"range {p} has a step; parts must be contiguous")
            out.append((p.start, p.stop))
        else:
            a, b = p  # indices, as a slice takes them: 2.5 is refused, not truncated
            out.append((operator.index(a), operator.index(b)))
    return out


def _spans(task: str, label: str, parts) -> list:
    """The learner's parts as (start, stop) pairs, or a CheckError saying what they are."""
    if parts is None:
        raise CheckError(f"{task} returned None on {label}: not implemented yet?")
    try:
        return _ranges(list(parts))
    except (TypeError, ValueError) as e:
        raise CheckError(f"{task} on {label}: parts must be (start, stop) pairs, slices or "
                         f"ranges, got {parts!r} ({e})") from e


def check_partition(fn, *, seed=None, quiet=False) -> str:
    """fn(n_items, n_workers) -> parts: (start, stop) pairs, slices or ranges.

    Every item in exactly one part, in order, no part empty, min(n_items, n_workers)
    parts whose sizes differ by at most one (no worker idles while another has 2 more).
    """
    rng = np.random.default_rng(seed)
    task = "partition"
    cases = [(8, 4), (10, 4), (3, 4), (1, 1), (97, 8), (64, 3)]
    cases += [(int(rng.integers(1, 500)), int(rng.integers(1, 17))) for _ in range(4)]
    for n, workers in cases:
        label = f"{n} items over {workers} workers"
        parts = _value_call(task, fn, (n, workers), {}, label)
        spans = _spans(task, label, parts)
        seen = np.zeros(n, int)
        for a, b in spans:
            if not (0 <= a <= b <= n):
                raise CheckError(f"{task} FAILED on {label}: part ({a}, {b}) is outside "
                                 f"0..{n}")
            seen[a:b] += 1
        if (seen > 1).any():
            raise CheckError(f"{task} FAILED on {label}: item {int(np.argmax(seen > 1))} is in "
                             f"{int(seen.max())} parts: that work would be done more than once")
        if (seen == 0).any():
            raise CheckError(f"{task} FAILED on {label}: item {int(np.argmax(seen == 0))} is in "
                             "no part: that work would never be done")
        sizes = [b - a for a, b in spans]
        if len(spans) != min(n, workers) or min(sizes) == 0:
            raise CheckError(f"{task} FAILED on {label}: {len(spans)} parts of sizes {sizes}, "
                             f"expected {min(n, workers)} non-empty parts")
        if [a for a, _ in spans] != sorted(a for a, _ in spans):
            raise CheckError(f"{task} FAILED on {label}: parts are not in order: {spans}")
        if max(sizes) - min(sizes) > 1:
            raise CheckError(f"{task} FAILED on {label}: sizes {sizes} differ by more than one: "
                             "the biggest part decides when all workers are done")
    return _pass(task, len(cases), quiet)


def check_pipeline_time(fn, *, seed=None, quiet=False) -> str:
    """fn(times, slots=None) -> when the last batch leaves the last stage.

    times: (batches, stages) durations; each stage is one worker taking the batches in
    order; a batch enters stage s when it has left stage s - 1 and stage s is free. slots:
    at most that many batches in flight (a batch enters the first stage only when the
    batch `slots` places earlier has left the last stage); None: no limit.
    """
    def reference(times, slots=None) -> float:
        """Finish time of a pipeline: stage s of batch b starts when stage s - 1 of batch b and
        stage s of batch b - 1 have finished, and (with `slots`) batch b's first stage when
        batch b - slots has left the last stage."""
        t = np.asarray(times, dtype=np.float64)
        B, S = t.shape
        end = np.zeros((B, S))
        for b in range(B):
            for s in range(S):
                start = max(end[b, s - 1] if s else 0.0, end[b - 1, s] if b else 0.0)
                if s == 0 and slots is not None and b >= slots:
                    start = max(start, end[b - slots, S - 1])
                end[b, s] = start + t[b, s]
        return float(end[-1, -1])

    rng = np.random.default_rng(seed)
    task = "pipeline time"
    cases = [(np.array([[3.0]]), None), (np.array([[2.0, 5.0, 1.0]]), None),
             (np.array([[4.0, 4.0]] * 5), None), (np.array([[1.0, 6.0, 2.0]] * 4), None)]
    for _ in range(3):
        B, S = int(rng.integers(3, 9)), int(rng.integers(2, 5))
        cases.append((rng.uniform(0.5, 5.0, (B, S)).round(3), None))
    cases.append((np.array([[2.0, 2.0, 2.0]] * 4), 1))  # slots: small cases first
    cases.append((np.array([[1.0, 9.0, 1.0]] * 4), 2))
    for slots in (1, 2, 3):
        B, S = int(rng.integers(4, 9)), int(rng.integers(2, 5))
        cases.append((rng.uniform(0.5, 5.0, (B, S)).round(3), slots))
    for times, slots in cases:
        label = f"times {times.tolist()}" + (f", slots={slots}" if slots is not None else "")
        kw = {} if slots is None else {"slots": slots}
        got = _as_float(task, _value_call(task, fn, (times.copy(),), kw, label), label)
        want = reference(times, slots)
        if not _close(got, want, 1e-9):
            hint = ""
            if _close(got, float(times.sum()), 1e-9) and slots != 1:
                hint = " (that is the serial time: every stage of every batch one after another)"
            elif _close(got, float(times.sum(axis=0).max()), 1e-9):
                hint = (" (that is the busiest stage's total: the pipeline also has to fill and "
                        "drain)")
            elif slots is not None and _close(got, reference(times), 1e-9):
                hint = f" (that ignores slots={slots}: a batch needs a free slot to start)"
            elif slots is not None and _close(got, reference(times, slots + 1), 1e-9):
                hint = (f" (that is slots={slots + 1}: batch b waits for batch b - {slots} to "
                        f"leave, so batch {slots} already waits for batch 0)")
            raise CheckError(f"{task} FAILED on {label}: got {got:.6g}, expected {want:.6g}"
                             f"{hint}")
    return _pass(task, len(cases), quiet)


def check_weighted_split(fn, *, seed=None, quiet=False) -> str:
    """fn(n_items, speeds) -> parts: one (start, stop) pair (or slice / range) per device,
    in device order, contiguous, covering 0..n; device i with speed s_i finishes its part
    at size_i / s_i, and the slowest finish must be as early as any split allows."""
    rng = np.random.default_rng(seed)
    task = "weighted split"
    cases = [(10, [1.0, 1.0]), (10, [1.0, 3.0]), (7, [2.0, 1.0, 1.0]), (1, [1.0, 5.0]),
             (100, [1.0, 1.0, 1.0, 1.0]), (64, [0.7, 1.9]), (5, [1.0, 100.0])]
    for _ in range(4):
        k = int(rng.integers(2, 6))
        cases.append((int(rng.integers(1, 400)), rng.uniform(0.2, 4.0, k).round(3).tolist()))
    for n, speeds in cases:
        label = f"{n} items over devices with speeds {speeds}"
        parts = _value_call(task, fn, (n, list(speeds)), {}, label)
        spans = _spans(task, label, parts)
        if len(spans) != len(speeds):
            raise CheckError(f"{task} FAILED on {label}: {len(spans)} parts for {len(speeds)} "
                             "devices (one part per device, empty ones included)")
        pos = 0
        for a, b in spans:
            if a != pos or b < a:
                raise CheckError(f"{task} FAILED on {label}: parts {spans} are not contiguous "
                                 f"from 0 in device order")
            pos = b
        if pos != n:
            raise CheckError(f"{task} FAILED on {label}: parts {spans} end at {pos}, not {n}")
        sizes = [b - a for a, b in spans]
        got = max(sz / s for sz, s in zip(sizes, speeds, strict=True))
        best_sizes = [0] * len(speeds)  # greedy: each item to the device done first with it
        for _ in range(n):
            i = min(range(len(speeds)), key=lambda j: (best_sizes[j] + 1) / speeds[j])
            best_sizes[i] += 1
        best = max(sz / s for sz, s in zip(best_sizes, speeds, strict=True))
        if got > best * (1 + 1e-9):
            raise CheckError(f"{task} FAILED on {label}: sizes {sizes} finish at {got:.4g} "
                             f"(time units of one item on a speed-1 device); sizes {best_sizes} "
                             f"finish at {best:.4g}")
    return _pass(task, len(cases), quiet)


def check_separable_factors(fn, *, seed=None, quiet=False) -> str:
    """fn(kernel (R, S)) -> (col (R,), row (S,)) with outer(col, row) == kernel, or None
    when the kernel is not separable (rank > 1 beyond rounding)."""
    rng = np.random.default_rng(seed)
    task = "separable factors"
    sob = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], np.float64)
    g = np.exp(-np.arange(-3, 4) ** 2 / 4.0)
    cases = [(sob, True), (np.outer(g, g) / np.outer(g, g).sum(), True),
             (np.ones((5, 3)) / 15, True), (np.array([[0, 1, 0], [1, -4, 1], [0, 1, 0]], float),
                                            False)]
    def vec(n):
        return random_array((n,), rng).astype(np.float64)

    for R, S in ((3, 5), (7, 1), (1, 9), (5, 5)):
        cases.append((np.outer(vec(R), vec(S)), True))  # float64: rank 1 to rounding
    for R, S in ((3, 3), (5, 4)):
        cases.append((np.outer(vec(R), vec(S)) + 0.5 * np.outer(vec(R), vec(S)), False))
    cases.append((random_array((4, 6), rng).astype(np.float64), False))
    for k, separable in cases:
        label = f"kernel {k.shape[0]}x{k.shape[1]} {np.round(k, 3).tolist()}"
        got = _value_call(task, fn, (k.copy(),), {}, label)
        if not separable:
            if got is not None:
                raise CheckError(f"{task} FAILED on {label}: this kernel has rank > 1 (not an "
                                 f"outer product), expected None, got {got!r}")
            continue
        if got is None:
            raise CheckError(f"{task} FAILED on {label}: it is separable (rank 1), got None")
        try:
            col, row = (np.asarray(v, np.float64).reshape(-1) for v in got)
        except (TypeError, ValueError) as e:
            raise CheckError(f"{task} on {label}: expected (col, row), got {got!r}") from e
        if col.shape != (k.shape[0],) or row.shape != (k.shape[1],):
            raise CheckError(f"{task} FAILED on {label}: col must have {k.shape[0]} values and "
                             f"row {k.shape[1]}, got {col.shape} and {row.shape}")
        prod = np.outer(col, row)
        err = np.abs(prod - k).max()
        if not err <= 1e-6 * max(np.abs(k).max(), 1e-30):
            hint = ""
            scale = float(np.vdot(prod, k) / max(np.vdot(k, k), 1e-300))  # prod ~ scale * k
            if np.abs(prod - scale * k).max() <= 1e-6 * max(np.abs(prod).max(), 1e-30):
                sigma = np.linalg.svd(k, compute_uv=False)[0]
                hint = (f"\n  hint: outer(col, row) is {scale:.4g} x the kernel"
                        + (" (a sign: the singular vectors' signs go together)" if np.isclose(
                            scale, -1) else f" (the largest singular value is {sigma:.4g}: "
                            "col = sqrt(s) u, row = sqrt(s) v, or s on one side only)"))
            elif np.abs(prod - np.abs(k)).max() <= 1e-6 * max(np.abs(k).max(), 1e-30):
                hint = "\n  hint: outer(col, row) is |kernel|: the factors' signs were dropped"
            raise CheckError(f"{task} FAILED on {label}: outer(col, row) differs from the "
                             f"kernel by up to {err:.3g}{hint}")
    return _pass(task, len(cases), quiet)
