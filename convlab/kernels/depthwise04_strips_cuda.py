"""Depthwise convolution, step 4: the image filter's strips, one filter per plane.

A stride-1 depthwise layer with "same" padding is an image filter run on every plane of
x, with the plane's channel's taps. So the course's CUDA C filter (`filter03_cuda`,
``csrc/filter.cu``: float4 rows held in registers, halo columns by shuffle, short strips
of rows) runs it, one grid plane (blockIdx.z) per plane of NCHW x; the taps, which the
filter folds in as constants, are read from w into each thread's registers. Nothing goes
through shared memory. Large planes (112 x 112: 28 float4 per row, 28 of a warp's 32
lanes) suit it. Small planes (14 x 14: rows of 14 floats, not a multiple of 4) take the
scalar path with 14 busy lanes; there the kernels that copy whole planes through shared
memory (`depthwise02_smem`, `depthwise03_cuda`) are faster.

Launcher signature (device arrays, float32; w is (C, 1, R, S), groups = C)::

    depthwise_strips_cuda(x, w, y, stride=1, padding=(R // 2, S // 2), groups=C) -> y
"""

from __future__ import annotations

import functools

import numpy as np

from . import filter03_cuda as F
from ._launch import Unsupported, ceil_div, device_pointer, launcher, planned_conv
from .depthwise01_direct import same_padding_params

NAME = "depthwise_strips_cuda"
MAX_SIZE = F.MAX_SIZE
MAX_PLANES = 65535  # N * C: the grid's z extent
DEFAULT = dict(v=4, warps=4, pf=6, alt=1)  # tools/gpu/memory_bound.py, 32ch 112x112


def kernel_name(vec: int, v: int, warps: int, pf: int, alt: int = 1) -> str:
    return f"depthwise_strips<{vec}, {v}, {warps}, {pf}, {'true' if alt else 'false'}>"


def source(R: int, S: int) -> str:
    return f"#define FR {R}\n#define FS {S}\n#define PLANE_TAPS 1\n" + F.SOURCE_PATH.read_text()


@functools.cache
def _kernel(R: int, S: int, name: str):
    import cupy as cp

    mod = cp.RawModule(code=source(R, S), options=("-std=c++17",), name_expressions=(name,))
    return mod.get_function(name)


def plan(x, w, out, stride=1, padding=1, dilation=1, groups=None, v=DEFAULT["v"],
         warps=DEFAULT["warps"], pf=DEFAULT["pf"], alt=DEFAULT["alt"]) -> tuple:
    """Check a launch: (kernel, grid, block, int32 H, W, C)."""
    p = same_padding_params(NAME, x, w, out, stride, padding, dilation, groups, MAX_SIZE)
    if p.N * p.C > MAX_PLANES:
        raise Unsupported(f"{NAME}: {p.N * p.C} planes exceed the grid's {MAX_PLANES}")
    if not (1 <= v <= 64 and 1 <= warps <= 32 and 1 <= pf <= 8):
        raise Unsupported(f"{NAME}: bad tiling v={v} warps={warps} pf={pf}")
    vec = 4 if (p.W % 4 == 0 and device_pointer(x) % 16 == 0
                and device_pointer(out) % 16 == 0) else 1
    grid = (ceil_div(p.W, 32 * vec), ceil_div(p.H, v * warps), p.N * p.C)
    k = _kernel(p.R, p.S, kernel_name(vec, v, warps, pf, alt))
    return k, grid, (32 * warps,), np.int32(p.H), np.int32(p.W), np.int32(p.C)


_PLANS: dict = {}


def launch(x, w, out, stride=1, padding=1, dilation=1, groups=None, **tiling):
    """Run the kernel with an explicit tiling (v, warps, pf, alt as filter03_cuda's)."""
    run = planned_conv(_PLANS, plan, x, w, out, (stride, padding, dilation, groups),
                       {**DEFAULT, **tiling})
    import cupy as cp

    k, grid, block, H, W, C = run
    k(grid, block, (cp.asarray(x), cp.asarray(w), cp.asarray(out), H, W, C))
    return out


@launcher
def depthwise_strips_cuda(x, w, out, stride=1, padding=1, dilation=1, groups=None):
    """Depthwise conv (groups = C, w (C, 1, R, S)), stride 1, 'same' padding, up to 9x9."""
    return launch(x, w, out, stride, padding, dilation, groups)
