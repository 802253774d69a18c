"""Depthwise convolution, step 5: a copy kernel that computes, no shared memory at all.

`depthwise03_cuda` makes both ends of a block a contiguous copy, but between them a block
waits at two barriers, and on 14 x 14 planes it stays near half the copy's speed. This
kernel (``csrc/depthwise_window.cu``) has the shape of the copy itself: thread t writes the
V outputs at t V .. t V + V - 1 of the flattened y (one 16-byte store for V = 4) and reads,
per filter row, the few 16-byte vectors of flattened x that cover those outputs' taps. The
output at flat index f reads x at f + (r - PH) W + (s - PW), whatever its row; only which
taps lie outside the plane differs, a test per tap. So every register index is known at
compile time (7 vectors per thread for 14-float rows, 9 for 112-float rows), and
neighbours' windows overlap, for L1/L2 to serve, so that DRAM moves each byte about once.

Stride 1, "same" padding, odd filters up to 5 x 5; V outputs of one plane per thread
(H W % V == 0); 16-byte vectors where V, the planes and the buffers allow, else 8 or 4;
u runs of V outputs per thread, a grid apart, their loads written before any FMA (more
bytes in flight per thread, as the fastest copies of these bytes in
``tools/gpu/copy_ceiling.py``; ptxas still schedules some of them among the FMAs);
plain or streaming stores (``cs_stores=1``: ``st.global.cs``).

Launcher signature (device arrays, float32; w is (C, 1, R, S), groups = C)::

    depthwise_window_cuda(x, w, y, stride=1, padding=(R // 2, S // 2), groups=C) -> y
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from ._launch import Unsupported, ceil_div, device_pointer, launcher, planned_conv
from .depthwise01_direct import same_padding_params

SOURCE_PATH = Path(__file__).parent / "csrc" / "depthwise_window.cu"
NAME = "depthwise_window_cuda"
MAX_SIZE = 5  # largest R and S: the window's registers grow with both
MAX_V = 8
MAX_U = 4
DEFAULT = dict(v=4, u=1, threads=256, cs_stores=0)


def kernel_name(H, W, R, S, v, lw, threads, cs_stores=0, u=1) -> str:
    return (f"depthwise_window<{H}, {W}, {R}, {S}, {v}, {u}, {lw}, {threads}, "
            f"{'true' if cs_stores else 'false'}>")


def outputs_per_thread(H: int, W: int, v: int) -> int:
    """The largest of v, v / 2, ..., 1 that divides a plane (a thread's outputs stay in one
    plane, so they share their channel's taps)."""
    while v > 1 and (H * W) % v:
        v //= 2
    return v


def window_runs(W: int, R: int, S: int, v: int, lw: int) -> list:
    """Per filter row r, (first float, vectors) of the run of flattened x that a thread's
    v outputs read, the first float relative to the thread's first output and on lw floats
    (the kernel's ``Run``): the thread loads sum(vectors) lw-float vectors."""
    ph, pw = R // 2, S // 2
    runs = []
    for r in range(R):
        lo = ((r - ph) * W - pw) // lw * lw
        hi = ((r - ph) * W + v - 1 + S - 1 - pw) // lw * lw
        runs.append((lo, (hi - lo) // lw + 1))
    return runs


def vector_width(v: int, x, out) -> int:
    """Floats per load and store: 4 or 2 where v and both buffers allow, else 1 (H W % v
    == 0 puts every thread's first output, and every plane start, on v floats)."""
    for lw in (4, 2):
        if v % lw == 0 and all(device_pointer(a) % (4 * lw) == 0 for a in (x, out)):
            return lw
    return 1


@functools.cache
def _kernel(name: str):
    import cupy as cp

    mod = cp.RawModule(code=SOURCE_PATH.read_text(), options=("-std=c++17",),
                       name_expressions=(name,))
    return mod.get_function(name)


def plan(x, w, out, stride=1, padding=1, dilation=1, groups=None, v=DEFAULT["v"],
         u=DEFAULT["u"], threads=DEFAULT["threads"], cs_stores=DEFAULT["cs_stores"]) -> tuple:
    """Check a launch: (kernel, grid, block, int32 total, int32 C, tiling).

    v: outputs per run (fewer where they would leave the plane); u: runs per thread, a
    grid apart; cs_stores: streaming stores (``st.global.cs``)."""
    p = same_padding_params(NAME, x, w, out, stride, padding, dilation, groups, MAX_SIZE)
    if not (1 <= int(v) <= MAX_V and 1 <= int(u) <= MAX_U and threads % 32 == 0
            and 32 <= threads <= 1024):
        raise Unsupported(f"{NAME}: bad tiling v={v} u={u} threads={threads} (v 1..{MAX_V}, "
                          f"u 1..{MAX_U}, threads a multiple of 32 up to 1024)")
    total = p.N * p.C * p.H * p.W  # under 2**31 (depthwise_params): 32-bit indices
    v = outputs_per_thread(p.H, p.W, int(v))
    lw = vector_width(v, x, out)
    blocks = ceil_div(ceil_div(total, v), int(u) * threads)
    if blocks * threads * int(u) * v >= 2**31:
        raise Unsupported(f"{NAME}: {total} elements; the grid's runs pass 32-bit indices")
    k = _kernel(kernel_name(p.H, p.W, p.R, p.S, v, lw, threads, cs_stores, int(u)))
    return k, (blocks,), (threads,), np.int32(total), np.int32(p.C), dict(
        v=v, u=int(u), lw=lw, threads=threads, cs_stores=int(bool(cs_stores)))


_PLANS: dict = {}


def launch(x, w, out, stride=1, padding=1, dilation=1, groups=None, **tiling):
    """Run the kernel with an explicit tiling (v, u, threads, cs_stores); the plan is kept per
    shapes, arguments, alignment and tiling."""
    run = planned_conv(_PLANS, plan, x, w, out, (stride, padding, dilation, groups),
                       {**DEFAULT, **tiling})
    import cupy as cp

    k, grid, block, total, C, _ = run
    k(grid, block, (cp.asarray(x), cp.asarray(w), cp.asarray(out), total, C))
    return out


@launcher
def depthwise_window_cuda(x, w, out, stride=1, padding=1, dilation=1, groups=None):
    """Depthwise conv (groups = C, w (C, 1, R, S)), stride 1, 'same' padding, up to 5x5."""
    return launch(x, w, out, stride, padding, dilation, groups)
