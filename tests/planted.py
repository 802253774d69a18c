"""Planted-bug conv kernels: each must be rejected by the checkers with its own message.

All share the launcher signature of convlab.kernels; each differs from the coalesced
kernel by one classic mistake.
"""

import math

from numba import cuda, float32

from convlab.kernels import ceil_div
from convlab.kernels._launch import conv_launch_params, launcher

BUGS = ("unwritten", "border", "nan", "square", "stride", "wrap")


@cuda.jit
def planted_kernel(x, w, y, sh, sw, ph, pw, bug):
    q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    p = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    nk = cuda.blockIdx.z
    N, K, P, Q = y.shape
    C, R, S = w.shape[1], w.shape[2], w.shape[3]
    H, W = x.shape[2], x.shape[3]
    if p >= P or q >= Q:
        return
    if bug == 0 and q == Q - 1:  # forgets the last column of outputs
        return
    n, k = nk // K, nk % K
    acc = float32(0.0)
    for c in range(C):
        for r in range(R):
            h = p * sh - ph + r if bug != 4 else p - ph + r  # bug 4: stride ignored
            lo = 1 if bug == 1 else 0  # bug 1: off by one, drops input row/col 0
            if bug == 5:  # bug 5: no lower bounds test: index -1 wraps to the last row/col
                lo = -ph
            if lo <= h < H:
                for s in range(S):
                    col = q * sw - pw + s if bug != 4 else q - pw + s
                    wmax = H if bug == 3 else W  # bug 3: W taken from H (square only)
                    if (lo <= col or bug == 5 and col >= -pw) and col < wmax and col < W:
                        acc += x[n, c, h, col] * w[k, c, r, s]
    if bug == 2 and p == P // 2:  # writes NaN on one row
        acc = math.nan
    y[n, k, p, q] = acc


def make(bug: str):
    code = BUGS.index(bug)

    @launcher
    def conv2d_planted(x, w, out, stride=1, padding=0):
        p = conv_launch_params("planted", x, w, out, stride, padding, 1, 1)
        grid = (ceil_div(p.Q, 32), ceil_div(p.P, 8), p.N * p.K)
        planted_kernel[grid, (32, 8)](x, w, out, *p.stride, *p.padding, code)

    conv2d_planted.__name__ = f"conv2d_{bug}"
    return conv2d_planted
