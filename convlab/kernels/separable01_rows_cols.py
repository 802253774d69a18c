"""Separable 2-D filter as two 1-D passes: rows, then columns.

A filter is separable when it is an outer product, k[r, s] = col[r] * row[s] (a Gaussian,
a box, Sobel's smoothing-times-derivative). Then

    out = image ⋆ k = (image ⋆ row) ⋆ col

so instead of R*S multiply-adds per pixel the image takes S in a horizontal pass (into a
temporary image) and R in a vertical pass: 2(R + S) FLOPs per pixel instead of 2RS (a
15x15 Gaussian: 60 instead of 450). The price is memory traffic: the temporary image is
written and read once more, so for a small filter, where the 2-D filter is memory-bound
anyway, two passes can be slower than one.

Both passes are the naive filter of lesson 05 in one dimension: one thread per pixel,
thread x along image columns (coalesced), taps read from a small device array (every
thread of a warp reads the same tap: a broadcast), 'same' zero padding.

Launcher signature (device arrays, float32)::

    filter2d_separable(image (H, W), col_taps (R,), row_taps (S,), out (H, W), tmp=None,
                       stream=0) -> out
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32

from ._launch import Unsupported, ceil_div, launcher

BLOCK = (32, 8)


@cuda.jit
def rows_kernel(img, taps, tmp):
    # horizontal pass: tmp[h, w] = sum_s img[h, w + s - S//2] * row[s]
    col = int32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
    row = int32(cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y)
    H, W = int32(img.shape[0]), int32(img.shape[1])
    S = int32(taps.shape[0])
    if row >= H or col >= W:
        return
    acc = float32(0.0)
    for s in range(S):
        c = col + s - S // 2
        if 0 <= c < W:
            acc += img[row, c] * taps[s]
    tmp[row, col] = acc


@cuda.jit
def cols_kernel(tmp, taps, out):
    # vertical pass: out[h, w] = sum_r tmp[h + r - R//2, w] * col[r]
    col = int32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
    row = int32(cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y)
    H, W = int32(tmp.shape[0]), int32(tmp.shape[1])
    R = int32(taps.shape[0])
    if row >= H or col >= W:
        return
    acc = float32(0.0)
    for r in range(R):
        h = row + r - R // 2
        if 0 <= h < H:
            acc += tmp[h, col] * taps[r]
    out[row, col] = acc


def _check(image, col_taps, row_taps, out, tmp):
    for label, a in (("image", image), ("col_taps", col_taps), ("row_taps", row_taps),
                     ("out", out)) + ((("tmp", tmp),) if tmp is not None else ()):
        if a is None or not hasattr(a, "shape"):
            raise TypeError(f"filter2d_separable: {label} must be a device array, got "
                            f"{type(a).__name__}")
        if np.dtype(a.dtype) != np.float32:
            raise TypeError(f"filter2d_separable: {label} must be float32, got {a.dtype}")
    if len(image.shape) != 2 or tuple(out.shape) != tuple(image.shape):
        raise ValueError(f"filter2d_separable: image and out must be 2-D of one shape, got "
                         f"{tuple(image.shape)} and {tuple(out.shape)}")
    if len(col_taps.shape) != 1 or len(row_taps.shape) != 1:
        raise ValueError("filter2d_separable: col_taps and row_taps must be 1-D")
    R, S = col_taps.shape[0], row_taps.shape[0]
    if R % 2 == 0 or S % 2 == 0:
        raise Unsupported(f"filter2d_separable: 'same' padding needs odd filter sizes, got "
                          f"{R}x{S}")
    if tmp is not None and tuple(tmp.shape) != tuple(image.shape):
        raise ValueError(f"filter2d_separable: tmp must have the image's shape "
                         f"{tuple(image.shape)}")


@launcher
def filter2d_separable(image, col_taps, row_taps, out, tmp=None, stream=0):
    """out = image ⋆ (col ⊗ row) ('same' zero padding) as a row pass and a column pass."""
    _check(image, col_taps, row_taps, out, tmp)
    H, W = image.shape
    if tmp is None:
        tmp = cuda.device_array((H, W), np.float32, stream=stream)
    grid = (ceil_div(W, BLOCK[0]), ceil_div(H, BLOCK[1]))
    rows_kernel[grid, BLOCK, stream](image, row_taps, tmp)
    cols_kernel[grid, BLOCK, stream](tmp, col_taps, out)
    return out


def flops_per_pixel(R: int, S: int, separable: bool) -> int:
    """Multiply-adds x 2 per output pixel: 2(R + S) in two passes, 2RS in one."""
    return 2 * (R + S) if separable else 2 * R * S


def bytes_per_pixel(separable: bool, itemsize: int = 4) -> int:
    """Compulsory traffic per pixel: read + write, twice for two passes (the tmp image)."""
    return (4 if separable else 2) * itemsize


KERNEL = cols_kernel
SIGNATURE = "(float32[:, ::1], float32[::1], float32[:, ::1])"
