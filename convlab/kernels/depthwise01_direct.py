"""Depthwise 3x3 convolution (groups = channels), NCHW: a memory-bound kernel.

Each output channel sees one input channel through its own R x S filter, so an output
costs R*S = 9 multiply-adds (18 FLOPs) for the 8 bytes the layer must move per output (read
x once, write y once): about 2 FLOP/byte, far left of the roofline's ridge (10-20
FLOP/byte on an H200). Its speed limit is the memory bandwidth, so the kernel is judged in
GB/s against a plain copy, not in FLOP/s.

Mapping: one thread computes V outputs stacked in one column of one channel (a "strip"),
and neighbouring threads take neighbouring columns, so a warp reads and writes rows of
the image (coalesced). Thread t -> (plane n*C + c, strip, column q), column fastest. The
thread keeps V accumulators in registers and walks down the (V-1)*stride + R input rows
its strip needs, reading S values of each row once: (V-1)*stride + R rows x S loads for
V*R*S multiply-adds, so a larger V reads fewer values per output (9 for V=1, 4.5 for V=4
at stride 1); the repeats between neighbouring threads are served by the L1 cache.

Every load is issued unconditionally from a clamped address and zeroed afterwards when
it fell into the padding: no branch around a load, so all of a thread's loads are
issued (into registers) before the first multiply-add needs one (many bytes in flight
per thread is what a memory-bound kernel needs). V and the stride are compile-time
constants (`make_kernel` caches one kernel per pair), so the loops unroll and the loaded
values and accumulators stay in registers.

Launcher signature (device arrays, float32; w is (C, 1, R, S), groups = C)::

    conv2d_depthwise(x, w, out, stride=1, padding=0, dilation=1, groups=C, stream=0) -> out
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, uint32

from ..reference import conv_params
from ._blocking import flat
from ._launch import Unsupported, ceil_div, check_array, configured, launcher, remember

# Outputs per thread (down a column) and threads per block, from the H200 sweep of
# `python -m convlab measure 11` (convlab/results/h200_lessons10_11.json). Stride 1: the
# largest V <= 8 that divides the output height was fastest (V=7 on 14x14: 23.4 us; V=8
# on 112x112: 78.1 us; V=4: 27.2 and 86.6 us; V=1: 47 and 178 us), 128 threads a hair
# ahead of 256. Stride 2 (V in 1, 2, 4 and 256 threads measured): V=4.
TILE = dict(v=4, threads=256)


def default_tile(P: int, stride: int) -> dict:
    """V and threads per block for an output of height P (see TILE's comment)."""
    if stride == 1:
        return dict(v=max(d for d in range(1, 9) if P % d == 0), threads=128)
    return dict(v=4, threads=256)
MAX_TAPS = 49  # R*S up to 7x7

_CACHE: dict = {}


def make_kernel(v: int, stride: int, R: int = 3, S: int = 3):
    """Compile (once) the depthwise kernel for V outputs per thread, a stride and R x S."""
    key = (v, stride, R, S)
    if key in _CACHE:
        return _CACHE[key]
    if R * S > MAX_TAPS:
        raise Unsupported(f"conv2d_depthwise: filters up to {MAX_TAPS} taps, got {R}x{S}")
    ROWS = (v - 1) * stride + R  # input rows a strip reads
    RS = R * S
    NV = ROWS * S  # input values a strip reads

    @cuda.jit
    def depthwise_kernel(x, w, y, C, H, W, P, Q, ph, pw, strips, total):
        # x (N*C*H*W,), w (C*R*S,), y (N*C*P*Q,) flattened; sizes as uint32 so the
        # divisions and indices below are unsigned (no negative-index checks), though
        # Numba widens a product of two uint32 to 64 bits
        t = uint32(cuda.blockIdx.x) * uint32(cuda.blockDim.x) + uint32(cuda.threadIdx.x)
        if t >= total:
            return
        q = t % Q
        rest = t // Q
        strip = rest % strips
        nc = rest // strips
        c = nc % C
        taps = cuda.local.array(RS, float32)
        for i in range(RS):
            taps[i] = w[c * uint32(RS) + uint32(i)]  # a broadcast: the warp's channel
        acc = cuda.local.array(v, float32)
        for o in range(v):
            acc[o] = float32(0.0)
        p0 = strip * uint32(v)
        h0 = np.int32(p0 * uint32(stride)) - np.int32(ph)  # first input row (may be < 0)
        c0 = np.int32(q * uint32(stride)) - np.int32(pw)  # first input column
        plane = nc * H * W
        # 1. every input value the strip needs, loaded once, all loads issued together
        vals = cuda.local.array(NV, float32)
        for j in range(ROWS):
            h = h0 + np.int32(j)
            hok = (h >= 0) and (h < np.int32(H))
            hc = uint32(min(max(h, np.int32(0)), np.int32(H) - np.int32(1)))
            for s in range(S):
                col = c0 + np.int32(s)
                ok = hok and (col >= 0) and (col < np.int32(W))
                cc = uint32(min(max(col, np.int32(0)), np.int32(W) - np.int32(1)))
                a = x[plane + hc * W + cc]  # always a valid address ...
                if not ok:
                    a = float32(0.0)  # ... zeroed in the padding (a select, no branch)
                vals[j * S + s] = a
        # 2. V outputs from registers: output o reads input rows o*stride .. o*stride+R-1
        for o in range(v):
            for r in range(R):
                for s in range(S):
                    acc[o] += vals[(o * stride + r) * S + s] * taps[r * S + s]
        out = nc * P * Q + q
        for o in range(v):
            p = p0 + uint32(o)
            if p < P:
                y[out + p * Q] = acc[o]

    _CACHE[key] = depthwise_kernel
    return depthwise_kernel


def depthwise_params(name, x, w, out, stride, padding, dilation, groups):
    """Validate a depthwise launch; return its ConvParams (groups must equal C)."""
    for label, a in (("x", x), ("w", w), ("out", out)):
        if a is None or not hasattr(a, "shape"):
            raise TypeError(f"{name}: {label} must be a device array, got {type(a).__name__}")
        if np.dtype(a.dtype) != np.float32:
            raise TypeError(f"{name}: {label} must be float32, got {a.dtype}")
    C = x.shape[1]
    if groups is None:
        groups = C
    if groups != C or w.shape[0] != C or w.shape[1] != 1:
        raise Unsupported(f"{name} computes depthwise convolutions only (groups = channels = "
                          f"{C}, w of shape ({C}, 1, R, S)); got groups={groups}, w "
                          f"{tuple(w.shape)}")
    p = conv_params(x.shape, w.shape, stride, padding, dilation, groups)
    if p.stride[0] != p.stride[1] or p.stride[0] not in (1, 2):
        raise Unsupported(f"{name} supports stride 1 or 2 (the same on both axes), got "
                          f"{p.stride}")
    if p.dilation != (1, 1):
        raise Unsupported(f"{name} does not support dilation {p.dilation} (only 1)")
    if tuple(out.shape) != p.out_shape:
        raise ValueError(f"{name}: out has shape {tuple(out.shape)}, expected {p.out_shape}")
    if max(x.size, out.size) >= 2**31:
        raise Unsupported(f"{name}: tensors of 2**31 elements or more need 64-bit indices")
    return p


def same_padding_params(name, x, w, out, stride, padding, dilation, groups, max_size):
    """`depthwise_params` of a kernel that runs stride 1 with "same" padding only (odd R
    and S, padding R // 2 and S // 2), filters up to max_size on a side, on contiguous
    float32 arrays."""
    p = depthwise_params(name, x, w, out, stride, padding, dilation, groups)
    for label, a in (("x", x), ("w", w), ("out", out)):
        check_array(name, label, a, a.shape, ("float32",))
    if p.stride != (1, 1) or p.padding != (p.R // 2, p.S // 2) or p.R % 2 == 0 or p.S % 2 == 0:
        raise Unsupported(f"{name}: stride 1 and 'same' padding (odd R, S; padding R//2, "
                          f"S//2) only, got stride {p.stride}, padding {p.padding}, "
                          f"{p.R}x{p.S}")
    if max(p.R, p.S) > max_size:
        raise Unsupported(f"{name}: filters up to {max_size}x{max_size}, got {p.R}x{p.S}")
    return p


_PLANS: dict = {}


def plan(x, w, out, stride=1, padding=0, dilation=1, groups=None, v=None, threads=None,
         stream=0) -> tuple:
    """Check a launch and choose V and the block size (`default_tile` unless given):
    (the configured kernel, its uint32 scalars)."""
    p = depthwise_params("conv2d_depthwise", x, w, out, stride, padding, dilation, groups)
    tile = default_tile(p.P, p.stride[0])
    v = tile["v"] if v is None else int(v)
    threads = tile["threads"] if threads is None else int(threads)
    v = max(1, min(v, p.P))
    k = make_kernel(v, p.stride[0], p.R, p.S)
    strips = ceil_div(p.P, v)
    total = p.N * p.C * strips * p.Q
    u = np.uint32
    scalars = (u(p.C), u(p.H), u(p.W), u(p.P), u(p.Q), u(p.padding[0]), u(p.padding[1]),
               u(strips), u(total))
    return configured(k, ceil_div(total, threads), threads, stream), scalars


def launch(x, w, out, stride=1, padding=0, dilation=1, groups=None, v=None, threads=None,
           stream=0):
    """Run the depthwise kernel; V (outputs per thread) and the block size default to
    `default_tile`. The `plan` is made once per shapes, dtypes, arguments and stream."""
    try:
        key = (x.shape, w.shape, out.shape, x.dtype, w.dtype, out.dtype, stride, padding,
               dilation, groups, v, threads, stream)
        run = _PLANS.get(key)
    except (AttributeError, TypeError):  # not arrays, or unhashable arguments: no cache
        key = run = None
    if run is None:
        run = remember(_PLANS, key, plan(x, w, out, stride, padding, dilation, groups, v,
                                         threads, stream))
    kernel, scalars = run
    kernel(flat(x), flat(w), flat(out), *scalars)
    return out


@launcher
def conv2d_depthwise(x, w, out, stride=1, padding=0, dilation=1, groups=None, stream=0):
    """Depthwise conv (groups = C, w (C, 1, R, S)), stride 1 or 2, any padding."""
    return launch(x, w, out, stride, padding, dilation, groups, stream=stream)


def thread_count(shape, v: int, stride: int = 1, padding: int = 1, R: int = 3) -> int:
    """Threads the kernel launches for input `shape` (N, C, H, W) and V outputs per thread."""
    N, C, H, W = shape
    P = (H + 2 * padding - R) // stride + 1
    Q = (W + 2 * padding - R) // stride + 1
    return N * C * ceil_div(P, min(v, P)) * Q


def loads_per_output(v: int, stride: int = 1, R: int = 3, S: int = 3) -> float:
    """Global loads a thread issues per output it computes: ((V-1)*stride + R) * S / V."""
    return ((v - 1) * stride + R) * S / v


KERNEL = make_kernel(TILE["v"], 1)
SIGNATURE = ("(float32[::1], float32[::1], float32[::1], uint32, uint32, uint32, uint32, "
             "uint32, uint32, uint32, uint32, uint32)")


# ----------------------------------------------------------------------------------------
# A variant with a 3-D launch (columns, strips, planes), not yet measured on a GPU.
#
# On the H200 the kernel above ran at 29-35% of copy bandwidth with 75-235 PTX
# instructions per output: three run-time divisions per thread to find its plane, strip
# and column, and a clamp and a select around every load. Here the grid's three axes give
# the column, the strip and the plane directly (no division but c = plane % C), the
# channel's taps and the plane's base address are computed once, and a strip whose window
# lies inside the image (every strip but the borders) loads without clamps or selects.
# Small planes (14 x 14) put several planes in one block (block z), so blocks stay large.

_CACHE2: dict = {}


def make_kernel_3d(v: int, stride: int, R: int = 3, S: int = 3):
    """Compile (once) the 3-D-launch variant for V outputs per thread."""
    key = (v, stride, R, S)
    if key in _CACHE2:
        return _CACHE2[key]
    if R * S > MAX_TAPS:
        raise Unsupported(f"conv2d_depthwise: filters up to {MAX_TAPS} taps, got {R}x{S}")
    ROWS = (v - 1) * stride + R
    RS = R * S
    NV = ROWS * S

    @cuda.jit
    def depthwise3d_kernel(x, w, y, C, H, W, P, Q, ph, pw, NC):
        q = uint32(cuda.blockIdx.x) * uint32(cuda.blockDim.x) + uint32(cuda.threadIdx.x)
        strip = uint32(cuda.blockIdx.y) * uint32(cuda.blockDim.y) + uint32(cuda.threadIdx.y)
        plane = uint32(cuda.blockIdx.z) * uint32(cuda.blockDim.z) + uint32(cuda.threadIdx.z)
        p0 = strip * uint32(v)
        if q >= Q or p0 >= P or plane >= NC:
            return
        c = plane % C
        taps = cuda.local.array(RS, float32)
        for i in range(RS):
            taps[i] = w[c * uint32(RS) + uint32(i)]
        base = plane * H * W
        h0 = np.int32(p0 * uint32(stride)) - np.int32(ph)
        c0 = np.int32(q * uint32(stride)) - np.int32(pw)
        vals = cuda.local.array(NV, float32)
        inside = (h0 >= 0 and h0 + np.int32(ROWS) <= np.int32(H) and c0 >= 0
                  and c0 + np.int32(S) <= np.int32(W))
        if inside:  # the common case: plain loads, one base address
            start = base + uint32(h0) * W + uint32(c0)
            for j in range(ROWS):
                for s in range(S):
                    vals[j * S + s] = x[start + uint32(j) * W + uint32(s)]
        else:  # the border: clamped addresses, zero padding
            for j in range(ROWS):
                h = h0 + np.int32(j)
                hok = (h >= 0) and (h < np.int32(H))
                hc = uint32(min(max(h, np.int32(0)), np.int32(H) - np.int32(1)))
                for s in range(S):
                    col = c0 + np.int32(s)
                    ok = hok and (col >= 0) and (col < np.int32(W))
                    cc = uint32(min(max(col, np.int32(0)), np.int32(W) - np.int32(1)))
                    a = x[base + hc * W + cc]
                    if not ok:
                        a = float32(0.0)
                    vals[j * S + s] = a
        acc = cuda.local.array(v, float32)
        for o in range(v):
            acc[o] = float32(0.0)
            for r in range(R):
                for s in range(S):
                    acc[o] += vals[(o * stride + r) * S + s] * taps[r * S + s]
        out = plane * P * Q + q
        for o in range(v):
            p = p0 + uint32(o)
            if p < P:
                y[out + p * Q] = acc[o]

    _CACHE2[key] = depthwise3d_kernel
    return depthwise3d_kernel


def block_3d(P: int, Q: int, v: int, threads: int = 128) -> tuple:
    """A block shape (x on columns, y on strips, z on planes) of about `threads` threads:
    x covers the row (up to 32), y the strips, z fills the rest with planes."""
    tx = min(32, 1 << max(0, (Q - 1).bit_length()))
    strips = ceil_div(P, v)
    ty = max(1, min(strips, threads // tx))
    tz = max(1, threads // (tx * ty))
    return tx, ty, tz


def launch_3d(x, w, out, stride=1, padding=0, dilation=1, groups=None, v=None, threads=128,
              block=None, stream=0):
    """Run the 3-D-launch variant (V outputs per thread, a block of about `threads`)."""
    p = depthwise_params("conv2d_depthwise", x, w, out, stride, padding, dilation, groups)
    v = default_tile(p.P, p.stride[0])["v"] if v is None else max(1, min(int(v), p.P))
    k = make_kernel_3d(v, p.stride[0], p.R, p.S)
    tx, ty, tz = block or block_3d(p.P, p.Q, v, threads)
    NC = p.N * p.C
    grid = (ceil_div(p.Q, tx), ceil_div(ceil_div(p.P, v), ty), ceil_div(NC, tz))
    u = np.uint32
    k[grid, (tx, ty, tz), stream](
        flat(x), flat(w), flat(out), u(p.C), u(p.H), u(p.W),
        u(p.P), u(p.Q), u(p.padding[0]), u(p.padding[1]), u(NC))
    return out


SIGNATURE_3D = ("(float32[::1], float32[::1], float32[::1], uint32, uint32, uint32, uint32, "
                "uint32, uint32, uint32, uint32)")
