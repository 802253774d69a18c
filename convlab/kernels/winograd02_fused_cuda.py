"""Winograd F(2x2, 3x3) fused: one kernel from the input to the output, V and M on chip.

`winograd01_cuda` runs the Winograd convolution as three steps around a batched GEMM, and
its V (16 x C x T) and M (16 x K x T) arrays go through memory: for F(2x2) about 4x the
input's bytes written and read back, and 4x the output's (more on odd planes). Here one kernel
(``csrc/winograd.cu``, ``wino_fused``) does all of it per block of 32 filters x 32 output
tiles: it transforms each slab of 8 channels' input patches into shared memory, runs the
16 small GEMMs on it with 64 sums per thread in registers, and after the last channel
turns the sums into 2 x 2 output tiles. Only the filter transform U (16 x K x C, the
size of the weights x 16/9) is a separate launch, as in winograd01, and is part of the time.

Launcher signature (device arrays, float32; stride 1, dilation 1, equal padding)::

    conv2d_winograd_fused_cuda(x (N, C, H, W), w (K, C, 3, 3), out (N, K, P, Q)) -> out
"""

from __future__ import annotations

import functools

import numpy as np

from ._launch import Unsupported, ceil_div, conv_launch_params, device_pointer, launcher, workspace
from .winograd01_cuda import module

NAME = "conv2d_winograd_fused_cuda"
FB_K, FB_T, FB_THREADS = 32, 32, 256  # filters and output tiles per block; threads (csrc)


@functools.cache
def _kernels():
    """The filter transform and the fused kernel (winograd01's F(2x2) module)."""
    mod = module(2)
    return mod.get_function("wino_filter"), mod.get_function("wino_fused")


def grid(K: int, T: int) -> tuple:
    """Blocks along the output tiles (x) and the filters (y)."""
    return ceil_div(T, FB_T), ceil_div(K, FB_K)


@launcher
def conv2d_winograd_fused_cuda(x, w, out, stride=1, padding=0, dilation=1, groups=1):
    """F(2x2, 3x3) in one fused kernel (after the filter transform): x (N, C, H, W),
    w (K, C, 3, 3), out (N, K, P, Q) fp32 device arrays; stride 1, equal padding."""
    p = conv_launch_params(NAME, x, w, out, stride, padding, dilation, groups,
                           supports=("padding",))
    if (p.R, p.S) != (3, 3) or p.padding[0] != p.padding[1]:
        raise Unsupported(f"{NAME}: needs a 3x3 filter and equal padding, got {p.R}x{p.S} "
                          f"padding {p.padding}")
    TY, TX = ceil_div(p.P, 2), ceil_div(p.Q, 2)
    T = p.N * TY * TX
    gx, gy = grid(p.K, T)
    if gy > 65535 or 16 * p.K * p.C >= 2**31:
        raise Unsupported(f"{NAME}: K={p.K} filters or U of 16 x {p.K} x {p.C} too large")
    import cupy as cp

    xa, wa, ya = cp.asarray(x), cp.asarray(w), cp.asarray(out)
    U = workspace("winograd U", (16, p.K, p.C))
    kf, kfused = _kernels()
    i32 = np.int32
    kf((ceil_div(p.K * p.C, 256),), (256,), (wa, U, i32(p.K), i32(p.C)))
    u_vec = i32(p.C % 4 == 0 and device_pointer(U) % 16 == 0)
    kfused((gx, gy), (FB_THREADS,), (
        xa, U, ya, i32(p.C), i32(p.H), i32(p.W), i32(p.K), i32(p.P), i32(p.Q), i32(TY),
        i32(TX), i32(T), i32(p.padding[0]), u_vec))
    return out
