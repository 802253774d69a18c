"""Ladder step 1: direct convolution, one thread per output element.

The thread's x index walks output *rows*, so the 32 threads of a warp take 32 outputs
of one column and read addresses W floats apart: every load touches its own 32-byte
sector (uncoalesced). Lesson 05 swaps x and y (`conv02_coalesced`, same block shape)
and measures the difference.
"""

from numba import cuda, float32

from ._launch import CONV_SIGNATURE, ceil_div, conv_launch_params, launcher

BLOCK = (32, 8)  # (threads along output rows p, threads along output columns q)


@cuda.jit
def conv2d_naive_kernel(x, w, y, sh, sw, ph, pw, dh, dw):
    p = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x  # output row
    q = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y  # output column
    nk = cuda.blockIdx.z
    N, K, P, Q = y.shape
    C, R, S = w.shape[1], w.shape[2], w.shape[3]
    H, W = x.shape[2], x.shape[3]
    if p >= P or q >= Q:
        return
    n, k = nk // K, nk % K
    acc = float32(0.0)
    for c in range(C):
        for r in range(R):
            h = p * sh - ph + r * dh
            if 0 <= h < H:
                for s in range(S):
                    col = q * sw - pw + s * dw
                    if 0 <= col < W:
                        acc += x[n, c, h, col] * w[k, c, r, s]
    y[n, k, p, q] = acc


@launcher
def conv2d_naive(x, w, out, stride=1, padding=0, dilation=1, groups=1):
    """One thread per output; neighbouring threads take neighbouring output rows."""
    p = conv_launch_params("conv2d_naive", x, w, out, stride, padding, dilation, groups)
    grid = (ceil_div(p.P, BLOCK[0]), ceil_div(p.Q, BLOCK[1]), p.N * p.K)
    conv2d_naive_kernel[grid, BLOCK](x, w, out, *p.stride, *p.padding, *p.dilation)
    return out


KERNEL, SIGNATURE = conv2d_naive_kernel, CONV_SIGNATURE
