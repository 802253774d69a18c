"""Data layouts on the GPU: NCHW <-> NHWC, and what a layout does to a kernel's mapping.

- `nchw_to_nhwc`: a layout change is a batched transpose ((C, H*W) -> (H*W, C) for
  every image). Reading rows and writing columns of a matrix cannot both be coalesced
  straight from global memory, so each block stages a 32 x 32 tile in shared memory:
  it reads 32 neighbouring pixels of a channel (coalesced), and writes 32 neighbouring
  channels of a pixel (coalesced), reading the tile by columns. With a tile row of 32
  floats a column lies in one bank (32-way bank conflict); one float of padding per row
  (``pad=1``) spreads it over all 32 banks. Lesson 06 traces and times both.
- `conv2d_nhwc_pixels`: lesson 05's counter-example. The coalesced NCHW kernel's thread
  mapping (thread x -> output column q) applied to NHWC tensors: neighbouring threads
  now read addresses C floats apart, so every load of a warp touches 32 sectors.
  The mapping has to follow the layout (the exercise of lesson 05 does it right).

NHWC convolution layouts used by the course: x (N, H, W, C), w (R, S, C, K) ("HWIO",
TensorFlow's filter layout: neighbouring output channels are neighbours in memory),
y (N, P, Q, K).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32, uint32

from ..reference import conv_params
from ._launch import Unsupported, ceil_div, launcher

TILE = 32
ROWS = 8  # threads per block: TILE x ROWS, each moves TILE // ROWS elements

_CACHE: dict = {}


def make_transpose(pad: int = 1):
    """Compile (once) the batched tiled transpose with `pad` floats of padding per row."""
    if pad in _CACHE:
        return _CACHE[pad]
    WP = TILE + pad
    NSH = TILE * WP

    @cuda.jit
    def transpose_kernel(x, y, B, R, C):
        # x: B matrices R x C, flattened; y: B matrices C x R, flattened; sizes int32
        tile = cuda.shared.array(NSH, float32)
        b = int32(cuda.blockIdx.z)
        c0 = int32(cuda.blockIdx.x * TILE)
        r0 = int32(cuda.blockIdx.y * TILE)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        for j in range(0, TILE, ROWS):  # read rows r0+ty+j, coalesced along c
            r = int32(r0 + ty + j)
            c = int32(c0 + tx)
            if r < R and c < C:
                tile[uint32((ty + j) * WP + tx)] = x[uint32((b * R + r) * C + c)]
        cuda.syncthreads()
        for j in range(0, TILE, ROWS):  # write rows c0+ty+j of y, coalesced along r
            c = int32(c0 + ty + j)
            r = int32(r0 + tx)
            if c < C and r < R:
                # a warp reads a column of the tile: bank (tx * WP + ty + j) % 32
                y[uint32((b * C + c) * R + r)] = tile[uint32(tx * WP + ty + j)]

    _CACHE[pad] = transpose_kernel
    return transpose_kernel


def _check_layout(name, x, out, want):
    for label, a in (("x", x), ("out", out)):
        if not hasattr(a, "shape") or np.dtype(a.dtype) != np.float32 or len(a.shape) != 4:
            raise TypeError(f"{name}: {label} must be a 4-D float32 device array")
    if tuple(out.shape) != want:
        raise ValueError(f"{name}: out has shape {tuple(out.shape)}, expected {want}")
    if x.size >= 2**31:
        raise Unsupported(f"{name}: tensors of 2**31 elements or more need 64-bit indices")


def transpose_batched(x, out, B, R, C, pad=1):
    """out[b] = x[b].T for B matrices R x C (any flat device arrays of B*R*C floats)."""
    k = make_transpose(pad)
    grid = (ceil_div(C, TILE), ceil_div(R, TILE), B)
    k[grid, (TILE, ROWS)](x.reshape(B * R * C), out.reshape(B * R * C), np.int32(B),
                          np.int32(R), np.int32(C))
    return out


@launcher
def nchw_to_nhwc(x, out, pad=1):
    """x (N, C, H, W) -> out (N, H, W, C) through padded 32 x 32 shared-memory tiles."""
    N, C, H, W = x.shape
    _check_layout("nchw_to_nhwc", x, out, (N, H, W, C))
    return transpose_batched(x, out, N, C, H * W, pad)


@launcher
def nhwc_to_nchw(x, out, pad=1):
    """x (N, H, W, C) -> out (N, C, H, W)."""
    N, H, W, C = x.shape
    _check_layout("nhwc_to_nchw", x, out, (N, C, H, W))
    return transpose_batched(x, out, N, H * W, C, pad)


@cuda.jit
def conv2d_nhwc_pixels_kernel(x, w, y, sh, sw, ph, pw, dh, dw):
    # x (N, H, W, C), w (R, S, C, K), y (N, P, Q, K); thread x -> output column q
    q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    p = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    nk = cuda.blockIdx.z
    N, P, Q, K = y.shape
    R, S, C = w.shape[0], w.shape[1], w.shape[2]
    H, W = x.shape[1], x.shape[2]
    if p >= P or q >= Q:
        return
    n, k = nk // K, nk % K
    acc = float32(0.0)
    for r in range(R):
        h = p * sh - ph + r * dh
        if 0 <= h < H:
            for s in range(S):
                col = q * sw - pw + s * dw
                if 0 <= col < W:
                    for c in range(C):
                        acc += x[n, h, col, c] * w[r, s, c, k]
    y[n, p, q, k] = acc


NHWC_BLOCK = (32, 8)


@launcher
def conv2d_nhwc_pixels(x, w, out, stride=1, padding=0, dilation=1, groups=1):
    """NHWC conv with the NCHW kernel's mapping (thread x -> q): uncoalesced on purpose."""
    if groups != 1:
        raise Unsupported(f"conv2d_nhwc_pixels does not support groups={groups} (only 1)")
    N, H, W, C = x.shape
    R, S, C2, K = w.shape
    p = conv_params((N, C, H, W), (K, C2, R, S), stride, padding, dilation)
    want = (p.N, p.P, p.Q, p.K)
    if tuple(out.shape) != want:
        raise ValueError(f"conv2d_nhwc_pixels: out has shape {tuple(out.shape)}, expected {want}")
    grid = (ceil_div(p.Q, NHWC_BLOCK[0]), ceil_div(p.P, NHWC_BLOCK[1]), p.N * p.K)
    conv2d_nhwc_pixels_kernel[grid, NHWC_BLOCK](x, w, out, *p.stride, *p.padding, *p.dilation)
    return out


def nhwc_inputs(x: np.ndarray, w: np.ndarray):
    """Host NCHW x and KCRS w -> contiguous NHWC x and RSCK w."""
    return (np.ascontiguousarray(x.transpose(0, 2, 3, 1)),
            np.ascontiguousarray(w.transpose(2, 3, 1, 0)))


KERNEL = make_transpose(1)
SIGNATURE = "(float32[::1], float32[::1], int32, int32, int32)"
