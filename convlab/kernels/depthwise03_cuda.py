"""Depthwise convolution in CUDA C, shaped like a copy: contiguous pieces, 16-byte moves.

`depthwise02_smem` already copies a block's input into shared memory before computing,
but from Numba, 4 bytes per load, and it writes its outputs straight from the compute
loop, a few scattered row pieces per warp. This kernel (``csrc/depthwise.cu``, NVRTC
through CuPy) makes both ends of a block a plain copy of one contiguous piece:

- G whole planes per block for small planes (a 14 x 14 plane is 196 floats, 784 bytes:
  G planes of NCHW are one run of G * 784 bytes, 16-byte aligned), or a band of TP output
  rows of one plane for large ones (112 x 112: the band's input rows are contiguous too);
- phase 1 copies that run into shared memory as it lies, float4 by float4, every load of
  a thread issued before its first store; phase 2 computes V outputs down a column per
  thread from shared memory into a shared output tile; phase 3 copies the tile to y,
  float4 by float4, contiguous.

With ``per_sm`` set the grid holds that many blocks per multiprocessor, and each block
loops over pieces, issuing the loads of its next piece before it computes the current one
(one block per piece: the first wave of blocks loads, then computes, in step).

Where a plane (or a row) is not a multiple of 4 floats, or a buffer is not 16-byte
aligned, the same kernel moves one float at a time. Every shape is a template argument:
one compiled kernel per layer shape and tiling, cached.

Launcher signature (device arrays, float32; w is (C, 1, R, S), groups = C)::

    depthwise_cuda(x, w, y, stride=1, padding=1, groups=C) -> y
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from ._launch import (
    Unsupported,
    ceil_div,
    check_array,
    device_pointer,
    launcher,
    planned_conv,
    sm_count,
)
from .depthwise01_direct import depthwise_params

SOURCE_PATH = Path(__file__).parent / "csrc" / "depthwise.cu"
NAME = "depthwise_cuda"
SMEM_LIMIT = 48 * 1024  # static shared memory of one block
MAX_SIZE = 7  # largest R and S
MAX_THREADS = 1024
PER_SM = None  # the launcher's default: one block per piece (None) or persistent blocks


def kernel_name(H, W, P, Q, R, S, stride, ph, pw, g, tp, v, threads, vec,
                persist=False) -> str:
    args = (H, W, P, Q, R, S, stride, ph, pw, g, tp, v, threads, vec)
    return ("depthwise<" + ", ".join(str(int(a)) for a in args)
            + (", true>" if persist else ", false>"))


def smem_bytes(H, W, P, Q, R, S, stride, g, tp) -> int:
    """Shared memory of a block: input rows, output tile, taps."""
    tr = H if tp == P else (tp - 1) * stride + R
    return 4 * (g * tr * W + g * tp * Q + g * R * S)


def strip_rows(tp: int, most: int = 8) -> int:
    """Outputs per thread down a column: tp rows in ceil(tp / most) strips, evenly."""
    return ceil_div(tp, ceil_div(tp, most))


def default_tiling(N, C, H, W, P, Q, R=3, S=3, stride=1) -> dict:
    """g planes per block (small planes, tp = P) or a band of tp rows (g = 1); v outputs
    per thread down a column; threads: one per (plane, strip, column), a multiple of 32.

    Small planes (P*Q <= 1024): whole planes, g = 8 (fewer while the block's shared memory
    passes 24 KB). Larger planes: bands of 16 rows (fewer while over 24 KB). v: the rows of
    a plane or band split into as few strips of at most 8 as possible, evenly (14 -> 7 + 7,
    13 -> 7 + 6).
    """
    if P * Q <= 1024 and smem_bytes(H, W, P, Q, R, S, stride, 1, P) <= 24 * 1024:
        g = max(1, min(8, N * C))
        while g > 1 and smem_bytes(H, W, P, Q, R, S, stride, g, P) > 24 * 1024:
            g -= 1
        tp = P
    else:
        g, tp = 1, min(P, 16)
        while tp > 1 and smem_bytes(H, W, P, Q, R, S, stride, 1, tp) > 24 * 1024:
            tp -= 1
    v = strip_rows(tp)
    items = g * ceil_div(tp, v) * Q
    return dict(g=g, tp=tp, v=v, threads=min(MAX_THREADS, 32 * ceil_div(items, 32)))


@functools.cache
def _kernel(name: str):
    import cupy as cp

    mod = cp.RawModule(code=SOURCE_PATH.read_text(), options=("-std=c++17",),
                       name_expressions=(name,))
    return mod.get_function(name)


def vectorised(x, y, H, W, P, Q, whole: bool) -> bool:
    """Whether every block's pieces start and end on 16 bytes (the float4 path)."""
    pieces = (H * W % 4 == 0 and P * Q % 4 == 0) if whole else (W % 4 == 0 and Q % 4 == 0)
    return pieces and device_pointer(x) % 16 == 0 and device_pointer(y) % 16 == 0


def plan(x, w, out, stride=1, padding=1, dilation=1, groups=None, g=None, tp=None, v=None,
         threads=None, per_sm=None) -> tuple:
    """Check a launch and choose its tiling (`default_tiling`, each part can be set):
    (kernel, grid, block, int32 NC, int32 C, tiling).

    per_sm: None, one block per piece; else persistent blocks, per_sm per multiprocessor
    (each loops over pieces, loading the next while it computes the current).
    """
    p = depthwise_params(NAME, x, w, out, stride, padding, dilation, groups)
    for label, a in (("x", x), ("w", w), ("out", out)):
        check_array(NAME, label, a, a.shape, ("float32",))
    if max(p.R, p.S) > MAX_SIZE:
        raise Unsupported(f"{NAME}: filters up to {MAX_SIZE}x{MAX_SIZE}, got {p.R}x{p.S}")
    s = p.stride[0]
    tl = default_tiling(p.N, p.C, p.H, p.W, p.P, p.Q, p.R, p.S, s)
    tp = min(p.P, int(tp)) if tp is not None else tl["tp"]
    g = int(g) if g is not None else (tl["g"] if tp == p.P else 1)
    v = int(v) if v is not None else strip_rows(tp)
    if threads is None:
        threads = min(MAX_THREADS, 32 * ceil_div(g * ceil_div(tp, v) * p.Q, 32))
    threads = int(threads)
    if (g < 1 or (tp < p.P and g != 1) or not 1 <= v <= tp or threads % 32
            or not 32 <= threads <= MAX_THREADS):
        raise Unsupported(f"{NAME}: bad tiling g={g} tp={tp} v={v} threads={threads} (g = 1 "
                          f"for bands, v <= tp <= P={p.P}, threads a multiple of 32 up to "
                          f"{MAX_THREADS})")
    smem = smem_bytes(p.H, p.W, p.P, p.Q, p.R, p.S, s, g, tp)
    if smem > SMEM_LIMIT:
        raise Unsupported(f"{NAME}: the tiling needs {smem} bytes of shared memory "
                          f"(at most {SMEM_LIMIT})")
    NC = p.N * p.C
    vec = 4 if vectorised(x, out, p.H, p.W, p.P, p.Q, tp == p.P) else 1
    pieces = ceil_div(p.P, tp) * ceil_div(NC, g)
    if pieces >= 2**31:
        raise Unsupported(f"{NAME}: {pieces} blocks is too many")
    if per_sm is not None and int(per_sm) < 1:
        raise Unsupported(f"{NAME}: per_sm must be at least 1, got {per_sm}")
    name = kernel_name(p.H, p.W, p.P, p.Q, p.R, p.S, s, *p.padding, g, tp, v, threads, vec,
                       per_sm is not None)
    k = _kernel(name)
    tiling = dict(g=g, tp=tp, v=v, threads=threads, vec=vec)
    blocks = pieces
    if per_sm is not None:
        # more blocks than fit at once would start late and finish their pieces last
        tiling["per_sm"] = per_sm = min(int(per_sm), resident_blocks(k, threads) or int(per_sm))
        blocks = min(pieces, per_sm * sm_count())
    return k, (blocks,), (threads,), np.int32(NC), np.int32(p.C), tiling


def resident_blocks(kernel, threads: int) -> int | None:
    """Blocks of `kernel` one multiprocessor holds at once (an sm_90 multiprocessor: 2048
    threads, 64 K registers allocated per warp in 256s, 228 KB of shared memory with 1 KB
    reserved per block), from its register and shared-memory use; None if not known."""
    try:
        regs = int(kernel.num_regs)
        smem = int(kernel.shared_size_bytes)
    except (AttributeError, TypeError, ValueError):
        return None
    warps = ceil_div(threads, 32)
    per_warp = ceil_div(max(regs, 1) * 32, 256) * 256
    return max(1, min(2048 // threads, 65536 // (warps * per_warp),
                      (228 * 1024) // (smem + 1024), 32))


_PLANS: dict = {}


def launch(x, w, out, stride=1, padding=1, dilation=1, groups=None, g=None, tp=None, v=None,
           threads=None, per_sm=None):
    """Run the kernel with an explicit tiling (the GPU sweep uses it); the plan is kept per
    shapes, arguments, alignment and tiling."""
    run = planned_conv(_PLANS, plan, x, w, out, (stride, padding, dilation, groups),
                       dict(g=g, tp=tp, v=v, threads=threads, per_sm=per_sm))
    import cupy as cp

    k, grid, block, NC, C, _ = run
    k(grid, block, (cp.asarray(x), cp.asarray(w), cp.asarray(out), NC, C))
    return out


@launcher
def depthwise_cuda(x, w, out, stride=1, padding=1, dilation=1, groups=None):
    """Depthwise conv (groups = C, w (C, 1, R, S)), stride 1 or 2, any padding, up to 7x7."""
    return launch(x, w, out, stride, padding, dilation, groups, per_sm=PER_SM)
