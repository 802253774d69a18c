"""im2col + GEMM on the GPU: lesson 02's algorithm with the course's batched SGEMM.

For each image, the columns (C*R*S x P*Q, built by ``csrc/im2col.cu``) times the filters
(K x C*R*S) give the output (K x P*Q) already in NCHW order: one `gemm06_batched_cuda`
launch does every image (the filters shared, stride 0). The reduction runs over exactly
C*R*S (rounded up to 4), so a layer with few input channels — ResNet's stem, C = 3 —
wastes nothing, where the implicit-GEMM kernels pad the channels of each (r, s) to a slab.
A 1x1, stride-1, unpadded conv needs no im2col at all: x itself is the column matrix.
The columns cost C*R*S*P*Q floats of memory per image (written, then read once);
`conv2d_im2col_fused_cuda` gathers them inside the GEMM's loads instead (an implicit GEMM
whose reduction is the flat (c, r, s) index: nothing stored, more index arithmetic).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from ._launch import Unsupported, ceil_div, conv_launch_params, launcher, workspace
from .gemm06_batched_cuda import conv_gather_gemm, sgemm_batched

SOURCE_PATH = Path(__file__).parent / "csrc" / "im2col.cu"
@functools.cache
def _im2col_kernel():
    import cupy as cp

    return cp.RawKernel(SOURCE_PATH.read_text(), "im2col", options=("-std=c++17",))


def _params(name, x, w, out, stride, padding, dilation, groups):
    p = conv_launch_params(name, x, w, out, stride, padding, dilation, groups)
    L = p.C * p.R * p.S
    Lp = ceil_div(L, 4) * 4
    PQ = p.P * p.Q
    if max(p.N * Lp * PQ, p.K * Lp, p.N * p.K * PQ) >= 2**31:
        raise Unsupported(f"{name}: the column matrix needs 64-bit sizes")
    if p.N > 65535 or Lp > 65535:
        raise Unsupported(f"{name}: the grid allows 65535 images and C*R*S <= 65532")
    return p, L, Lp, PQ


def _filters(w, p, L, Lp):
    """w as a (K, Lp) matrix, zero columns past L (a workspace, refilled per call)."""
    import cupy as cp

    wp = workspace("im2col filters", (p.K, Lp))
    wp[:, :L] = cp.asarray(w).reshape(p.K, L)
    if Lp > L:
        wp[:, L:] = 0
    return wp


@launcher
def conv2d_im2col_cuda(x, w, out, stride=1, padding=0, dilation=1, groups=1):
    """x (N, C, H, W), w (K, C, R, S), out (N, K, P, Q) fp32 device arrays; any stride,
    padding, dilation; groups 1."""
    p, L, Lp, PQ = _params("conv2d_im2col_cuda", x, w, out, stride, padding, dilation, groups)
    import cupy as cp

    xa, ya = cp.asarray(x), cp.asarray(out)
    wp = _filters(w, p, L, Lp)
    direct = (p.R, p.S) == (1, 1) and p.stride == (1, 1) and p.padding == (0, 0) and Lp == L
    if direct:  # x (N, C, H*W) is its own column matrix
        cols = xa.reshape(p.N, L, PQ)
    else:
        cols = workspace("im2col columns", (p.N, Lp, PQ))
        i32 = np.int32
        _im2col_kernel()((ceil_div(PQ, 256), Lp, p.N), (256,),
                         (xa, cols, *(i32(v) for v in (p.C, p.H, p.W, p.R, p.S, p.P, p.Q,
                                                        *p.stride, *p.padding, *p.dilation,
                                                        L, Lp))))
    sgemm_batched(wp, cols, ya.reshape(p.N, p.K, PQ))
    return out


@launcher
def conv2d_im2col_fused_cuda(x, w, out, stride=1, padding=0, dilation=1, groups=1):
    """Like `conv2d_im2col_cuda`, the columns gathered inside the GEMM instead of stored."""
    p, L, Lp, PQ = _params("conv2d_im2col_fused_cuda", x, w, out, stride, padding, dilation,
                           groups)
    import cupy as cp

    conv_gather_gemm(_filters(w, p, L, Lp), cp.asarray(x), cp.asarray(out), p, L)
    return out
