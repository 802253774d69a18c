"""Ladder step 2: the naive kernel with the thread x index on output *columns*.

The 32 threads of a warp now take 32 neighbouring outputs of one row and (stride 1)
read 32 neighbouring floats of x: 4 sectors of 32 bytes per request instead of 32.
Nothing else changed.
"""

from numba import cuda, float32

from ._launch import CONV_SIGNATURE, ceil_div, conv_launch_params, launcher

BLOCK = (32, 8)  # (threads along output columns q, threads along output rows p)


@cuda.jit
def conv2d_coalesced_kernel(x, w, y, sh, sw, ph, pw, dh, dw):
    q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x  # output column (fastest)
    p = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y  # output row
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
def conv2d_coalesced(x, w, out, stride=1, padding=0, dilation=1, groups=1):
    """One thread per output; a warp covers 32 neighbouring outputs of one row."""
    p = conv_launch_params("conv2d_coalesced", x, w, out, stride, padding, dilation, groups)
    grid = (ceil_div(p.Q, BLOCK[0]), ceil_div(p.P, BLOCK[1]), p.N * p.K)
    conv2d_coalesced_kernel[grid, BLOCK](x, w, out, *p.stride, *p.padding, *p.dilation)
    return out


KERNEL, SIGNATURE = conv2d_coalesced_kernel, CONV_SIGNATURE
