"""Direct convolution on every CPU core with Numba (lesson 03).

Five versions of the same direct convolution, each one change away from the last:

- `conv2d_loops`: the definition compiled by ``@njit``: one output at a time, the
  innermost loops walk the C·R·S window (serial).
- `conv2d_prange`: the same loops with the (image, filter) pairs spread over the cores
  by ``prange``.
- `conv2d_reordered`: loop order changed to ``c, r, s, p, q``: for one filter tap the
  innermost loop sweeps a whole output row, unit stride in x and y, so LLVM turns it
  into SIMD instructions.
- `conv2d_blocked`: cache and register blocking: a task computes 4 filters × a tile of
  output rows; the 3 loads of a q feed 12 multiply-adds (4 filters x 3 taps of a filter
  row), and the task's accumulators stay in L1.
- `conv2d_blocked_flat`: the same, with each tile computed as one long row: the SIMD
  loop's step (vector width x unroll) divides a short row badly, so every row ends in a
  narrower epilogue with its own loop setup; one long row pays that once per tile.

All take and return NumPy arrays like `convlab.reference.conv2d`:
``fn(x, w, stride=1, padding=0, dilation=1, groups=1) -> y`` (float32, NCHW), and refuse
what they do not support with `Unsupported`. Plus the helpers lesson 03 measures with:
`thread_sweep` (time a function at 1…n threads), `threads` (numba's count),
`split_batch` / `repeat_whole` (the right and the wrong way to give work to threads).

Importing this module imports numba, so it runs `convlab.setup()` first.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import runtime as _runtime

_runtime.setup()

import numba  # noqa: E402
from numba import njit, prange  # noqa: E402

from . import reference as ref  # noqa: E402
from .errors import Unsupported  # noqa: E402

KBLOCK = 4  # filters per task in conv2d_blocked (the unrolled register block)


# ----------------------------------------------------------------------------------------
# Kernels: xp is the zero-padded input (N, C, Hp, Wp), y the output (N, K, P, Q)


@njit(cache=True, nogil=True)  # serial; releases the GIL so Python threads can share it
def _loops_kernel(xp, w, y, sh, sw, dh, dw):
    N, C = xp.shape[0], xp.shape[1]
    K, R, S = w.shape[0], w.shape[2], w.shape[3]
    P, Q = y.shape[2], y.shape[3]
    for n in range(N):
        for k in range(K):
            for p in range(P):
                for q in range(Q):
                    acc = np.float32(0.0)
                    for c in range(C):
                        for r in range(R):
                            for s in range(S):
                                acc += w[k, c, r, s] * xp[n, c, p * sh + r * dh, q * sw + s * dw]
                    y[n, k, p, q] = acc


@njit(parallel=True, cache=True)
def _prange_kernel(xp, w, y, sh, sw, dh, dw):
    N, C = xp.shape[0], xp.shape[1]
    K, R, S = w.shape[0], w.shape[2], w.shape[3]
    P, Q = y.shape[2], y.shape[3]
    for nk in prange(N * K):  # one (image, filter) pair per task
        n, k = nk // K, nk % K
        for p in range(P):
            for q in range(Q):
                acc = np.float32(0.0)
                for c in range(C):
                    for r in range(R):
                        for s in range(S):
                            acc += w[k, c, r, s] * xp[n, c, p * sh + r * dh, q * sw + s * dw]
                y[n, k, p, q] = acc


@njit(parallel=True, cache=True)
def _reordered_kernel(xp, w, y, sh, sw, dh, dw):
    N, C = xp.shape[0], xp.shape[1]
    K, R, S = w.shape[0], w.shape[2], w.shape[3]
    P, Q = y.shape[2], y.shape[3]
    for nk in prange(N * K):
        n, k = nk // K, nk % K
        out = y[n, k]
        out[:, :] = 0.0
        for c in range(C):
            for r in range(R):
                for s in range(S):
                    wv = w[k, c, r, s]
                    if sw == 1:
                        for p in range(P):
                            xrow = xp[n, c, p * sh + r * dh, s * dw:s * dw + Q]
                            orow = out[p]
                            for q in range(Q):  # unit stride: SIMD
                                orow[q] += wv * xrow[q]
                    else:
                        for p in range(P):
                            xrow = xp[n, c, p * sh + r * dh]
                            orow = out[p]
                            for q in range(Q):
                                orow[q] += wv * xrow[q * sw + s * dw]


@njit(parallel=True, cache=True)
def _blocked_kernel(xp, w4, y, rows):
    """Stride 1, dilation 1, 3-wide filters; w4 has K padded to a multiple of 4."""
    N, C = xp.shape[0], xp.shape[1]
    K4, R = w4.shape[0], w4.shape[2]
    K, P, Q = y.shape[1], y.shape[2], y.shape[3]
    nkb = K4 // 4
    npb = (P + rows - 1) // rows
    for job in prange(N * nkb * npb):
        n = job // (nkb * npb)
        kb = (job // npb) % nkb
        pb = job % npb
        k0, p0 = kb * 4, pb * rows
        p1 = min(P, p0 + rows)
        acc = np.zeros((4, rows, Q), np.float32)  # the task's tile: fits in L1
        for c in range(C):
            for r in range(R):
                # 4 filters x 3 taps of this filter row, held in registers
                a0, a1, a2 = w4[k0, c, r, 0], w4[k0, c, r, 1], w4[k0, c, r, 2]
                b0, b1, b2 = w4[k0 + 1, c, r, 0], w4[k0 + 1, c, r, 1], w4[k0 + 1, c, r, 2]
                c0, c1, c2 = w4[k0 + 2, c, r, 0], w4[k0 + 2, c, r, 1], w4[k0 + 2, c, r, 2]
                d0, d1, d2 = w4[k0 + 3, c, r, 0], w4[k0 + 3, c, r, 1], w4[k0 + 3, c, r, 2]
                for p in range(p0, p1):
                    xrow = xp[n, c, p + r]
                    o0, o1 = acc[0, p - p0], acc[1, p - p0]
                    o2, o3 = acc[2, p - p0], acc[3, p - p0]
                    for q in range(Q):
                        u, v, t = xrow[q], xrow[q + 1], xrow[q + 2]  # 3 loads, 12 FMAs
                        o0[q] += a0 * u + a1 * v + a2 * t
                        o1[q] += b0 * u + b1 * v + b2 * t
                        o2[q] += c0 * u + c1 * v + c2 * t
                        o3[q] += d0 * u + d1 * v + d2 * t
        for kk in range(min(4, K - k0)):
            for p in range(p0, p1):
                for q in range(Q):
                    y[n, k0 + kk, p, q] = acc[kk, p - p0, q]


@njit(parallel=True, cache=True)
def _blocked_flat_kernel(xpf, Wp, w4, y, rows):
    """`_blocked_kernel` with each tile treated as ONE long row (one epilogue per tile).

    xpf is the padded input with every plane flattened: (N, C, Hp·Wp). The accumulators of
    a tile use the input's row stride Wp, so output (p, q) of the tile sits at
    (p − p0)·Wp + q and its taps at the same offset + r·Wp + s: one unit-stride loop of
    about rows·Wp iterations instead of `rows` loops of Q (Q = 56 is 3.5 vectors of 16:
    the half vector at the end of every row ran in scalar code). The S − 1 extra columns
    per row are computed and dropped.
    """
    N, C = xpf.shape[0], xpf.shape[1]
    K4, R = w4.shape[0], w4.shape[2]
    K, P, Q = y.shape[1], y.shape[2], y.shape[3]
    nkb = K4 // 4
    npb = (P + rows - 1) // rows
    for job in prange(N * nkb * npb):
        n = job // (nkb * npb)
        kb = (job // npb) % nkb
        pb = job % npb
        k0, p0 = kb * 4, pb * rows
        p1 = min(P, p0 + rows)
        L = (p1 - p0 - 1) * Wp + Q  # the tile as one row: last row without its extra columns
        acc = np.zeros((4, rows * Wp), np.float32)
        o0, o1, o2, o3 = acc[0], acc[1], acc[2], acc[3]
        for c in range(C):
            plane = xpf[n, c]
            for r in range(R):
                a0, a1, a2 = w4[k0, c, r, 0], w4[k0, c, r, 1], w4[k0, c, r, 2]
                b0, b1, b2 = w4[k0 + 1, c, r, 0], w4[k0 + 1, c, r, 1], w4[k0 + 1, c, r, 2]
                c0, c1, c2 = w4[k0 + 2, c, r, 0], w4[k0 + 2, c, r, 1], w4[k0 + 2, c, r, 2]
                d0, d1, d2 = w4[k0 + 3, c, r, 0], w4[k0 + 3, c, r, 1], w4[k0 + 3, c, r, 2]
                seg = plane[(p0 + r) * Wp:(p0 + r) * Wp + L + 2]
                for i in range(L):  # one long unit-stride loop: SIMD all the way
                    u, v, t = seg[i], seg[i + 1], seg[i + 2]
                    o0[i] += a0 * u + a1 * v + a2 * t
                    o1[i] += b0 * u + b1 * v + b2 * t
                    o2[i] += c0 * u + c1 * v + c2 * t
                    o3[i] += d0 * u + d1 * v + d2 * t
        for kk in range(min(4, K - k0)):
            for p in range(p0, p1):
                for q in range(Q):
                    y[n, k0 + kk, p, q] = acc[kk, (p - p0) * Wp + q]


# ----------------------------------------------------------------------------------------
# Launchers: NumPy in, NumPy out, same signature as convlab.reference.conv2d


def _prepare(name, x, w, stride, padding, dilation, groups):
    for label, a in (("x", x), ("w", w)):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{name}: {label} must be a NumPy array, got {type(a).__name__}")
    if groups != 1:
        raise Unsupported(f"{name} does not support groups={groups} (only 1)")
    p = ref.conv_params(x.shape, w.shape, stride, padding, dilation, groups)
    xp = np.ascontiguousarray(ref.pad_nchw(np.asarray(x, np.float32), p.padding))
    return p, xp, np.ascontiguousarray(w, dtype=np.float32)


def _run(kernel, name, x, w, stride, padding, dilation, groups):
    p, xp, w32 = _prepare(name, x, w, stride, padding, dilation, groups)
    y = np.empty(p.out_shape, np.float32)
    (sh, sw), (dh, dw) = p.stride, p.dilation
    kernel(xp, w32, y, sh, sw, dh, dw)
    return y


def conv2d_loops(x, w, stride=1, padding=0, dilation=1, groups=1):
    """The definition, compiled: loops n, k, p, q, then c, r, s into one sum (1 core)."""
    return _run(_loops_kernel, "conv2d_loops", x, w, stride, padding, dilation, groups)


def conv2d_prange(x, w, stride=1, padding=0, dilation=1, groups=1):
    """`conv2d_loops` with the (image, filter) pairs spread over all cores by prange."""
    return _run(_prange_kernel, "conv2d_prange", x, w, stride, padding, dilation, groups)


def conv2d_reordered(x, w, stride=1, padding=0, dilation=1, groups=1):
    """prange over (image, filter); loops c, r, s outside, output row innermost (SIMD)."""
    return _run(_reordered_kernel, "conv2d_reordered", x, w, stride, padding, dilation, groups)


def _prepare_blocked(name, x, w, stride, padding, dilation, groups, rows):
    p, xp, w32 = _prepare(name, x, w, stride, padding, dilation, groups)
    if p.stride != (1, 1) or p.dilation != (1, 1) or p.S != 3:
        raise Unsupported(f"{name} supports stride 1, dilation 1 and 3-wide filters "
                          f"only, got stride {p.stride}, dilation {p.dilation}, filter "
                          f"{p.R}x{p.S} (use conv2d_reordered)")
    if int(rows) < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    K4 = -(-p.K // KBLOCK) * KBLOCK  # filters padded with zeros to a multiple of 4
    w4 = w32 if K4 == p.K else np.concatenate(
        [w32, np.zeros((K4 - p.K, *w32.shape[1:]), np.float32)])
    return p, xp, w4, np.empty(p.out_shape, np.float32)


def conv2d_blocked(x, w, stride=1, padding=0, dilation=1, groups=1, rows: int = 8):
    """Cache + register blocking: a task = 4 filters × `rows` output rows.

    Specialized like the libraries' fast paths: stride 1, dilation 1, filters 3 wide
    (any height, any padding); anything else raises `Unsupported`.
    """
    p, xp, w4, y = _prepare_blocked("conv2d_blocked", x, w, stride, padding, dilation,
                                    groups, rows)
    _blocked_kernel(xp, w4, y, int(rows))
    return y


def conv2d_blocked_flat(x, w, stride=1, padding=0, dilation=1, groups=1, rows: int = 16):
    """`conv2d_blocked` with every tile computed as one long row (one vector epilogue).

    Same specialization: stride 1, dilation 1, filters 3 wide.
    """
    p, xp, w4, y = _prepare_blocked("conv2d_blocked_flat", x, w, stride, padding, dilation,
                                    groups, rows)
    N, C, Hp, Wp = xp.shape
    _blocked_flat_kernel(xp.reshape(N, C, Hp * Wp), Wp, w4, y, int(rows))
    return y


# lesson order: name -> function
VARIANTS = {
    "numba loops (1 core)": conv2d_loops,
    "prange": conv2d_prange,
    "prange + loop order": conv2d_reordered,
    "prange + blocking": conv2d_blocked,
    "blocking, flat tiles": conv2d_blocked_flat,
}


# ----------------------------------------------------------------------------------------
# Threads


def cores() -> int:
    """CPU cores this process may run on (affinity-aware where the OS says)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def threads() -> int:
    """Threads numba's parallel loops use now."""
    return numba.get_num_threads()


def max_threads() -> int:
    """The most threads numba can use (NUMBA_NUM_THREADS, by default the core count)."""
    return numba.config.NUMBA_NUM_THREADS


def sweep_counts(limit: int | None = None) -> list:
    """1, 2, 4, … up to the limit (default: numba's maximum), the limit included."""
    limit = limit or max_threads()
    out, t = [], 1
    while t < limit:
        out.append(t)
        t *= 2
    return out + [limit]


def thread_sweep(fn, *args, counts=None, setter=None, getter=None, repeat: int = 3,
                 **kwargs) -> list:
    """Time ``fn(*args, **kwargs)`` at each thread count; [(threads, ms), ...].

    setter/getter: how to change the count (default: numba's; pass
    ``torch.set_num_threads`` / ``torch.get_num_threads`` for PyTorch). The original
    count is restored afterwards.
    """
    from .bench import time_cpu

    setter = setter or numba.set_num_threads
    getter = getter or (numba.get_num_threads if setter is numba.set_num_threads else None)
    before = getter() if getter else None
    out = []
    try:
        for t in counts or sweep_counts():
            setter(int(t))
            out.append((int(t), time_cpu(fn, *args, repeat=repeat, **kwargs).median_ms))
    finally:
        if before is not None:
            setter(before)
    return out


def split_batch(fn, x, w, workers: int = 4, **kwargs):
    """Right: each of `workers` threads convolves its own share of the batch.

    Returns the full output (N, K, P, Q); every image is computed exactly once.
    """
    shares = [s for s in np.array_split(np.arange(x.shape[0]), workers) if s.size]
    with ThreadPoolExecutor(max_workers=len(shares)) as pool:
        parts = list(pool.map(lambda s: fn(x[s[0]:s[-1] + 1], w, **kwargs), shares))
    return np.concatenate(parts, axis=0)


def repeat_whole(fn, x, w, workers: int = 4, **kwargs):
    """Wrong (source 003's pattern): each of `workers` threads computes the WHOLE output.

    The result is `workers` identical copies stacked along the batch axis
    (workers·N, K, P, Q): workers× the work for the same answer, and the wrong shape.
    """
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(fn, x, w, **kwargs) for _ in range(workers)]
        outputs = [f.result() for f in futures]
    return np.concatenate(outputs, axis=0)


# ----------------------------------------------------------------------------------------
# Timing several CPU versions fairly on a shared machine


def time_interleaved(fns: dict, *args, rounds: int = 5, warmup: int = 1, settle: int = 1,
                     **kwargs) -> dict:
    """Time each ``fn(*args, **kwargs)`` in turn, round after round; name -> Timing.

    Interleaving spreads any background load over every version alike, so ratios
    between them stay fair even when absolute times wobble. Before each timed call the
    same function runs `settle` times untimed: thread pools of different libraries
    (OpenBLAS, OpenMP, numba) keep spinning for a moment after their own calls, and the
    next library should not pay for that.
    """
    import time

    from .bench import Timing

    for fn in fns.values():
        for _ in range(warmup):
            fn(*args, **kwargs)
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(settle):  # untimed: lets the previous library's threads go idle
                fn(*args, **kwargs)
            t0 = time.perf_counter()
            fn(*args, **kwargs)
            samples[name].append((time.perf_counter() - t0) * 1e3)
    return {name: Timing(s, f"perf_counter, median of {rounds} interleaved rounds")
            for name, s in samples.items()}


def time_scaled(fn, x, w, images: int = 1, filters: int = 1, repeat: int = 1, **kwargs):
    """Time fn on a slice (`images` images × `filters` filters) and scale to the whole layer.

    For versions too slow to run in full (the Python loops): the work is proportional to
    N·K, so full ≈ slice × (N·K)/(images·filters). Returns (estimated full ms, slice Timing,
    factor).
    """
    from .bench import time_cpu

    images, filters = min(images, x.shape[0]), min(filters, w.shape[0])
    t = time_cpu(fn, x[:images], w[:filters], warmup=0, repeat=repeat, **kwargs)
    factor = (x.shape[0] * w.shape[0]) / (images * filters)
    return t.median_ms * factor, t, factor
