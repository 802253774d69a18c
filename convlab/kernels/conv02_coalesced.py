"""Ladder step 2: the naive kernel with neighbouring threads on neighbouring *columns*.

Thread j of a plane now takes pixel (p, q) = (j // Q, j % Q): the 32 threads of a warp
take 32 neighbouring outputs of one row and (stride 1) read 32 neighbouring floats of
x, 4 sectors of 32 bytes per request instead of 32. Nothing else changed.
"""

from numba import cuda, float32, int32, uint32

from ._blocking import flat
from ._launch import direct_launch_args, launcher
from .conv01_naive import THREADS, launch_grid

_CACHE: dict = {}


def make_kernel(R: int, S: int):
    """Compile (once) the coalesced kernel for an R x S filter."""
    if (R, S) in _CACHE:
        return _CACHE[(R, S)]

    @cuda.jit
    def conv2d_coalesced_kernel(x, w, y, C, H, W, K, P, Q, sh, sw, ph, pw, dh, dw):
        # x, w, y flat (NCHW, KCRS, NKPQ); every size an int32
        j = int32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        k = int32(cuda.blockIdx.y)
        n = int32(cuda.blockIdx.z)
        if j >= P * Q:
            return
        p = int32(uint32(j) // uint32(Q))  # neighbouring threads: neighbouring columns
        q = j - p * Q
        h0 = p * sh - ph
        w0 = q * sw - pw
        acc = float32(0.0)
        for c in range(C):
            xc = (n * C + c) * H
            wc = (k * C + c) * (R * S)
            for r in range(R):
                h = h0 + r * dh
                if 0 <= h < H:
                    for s in range(S):
                        col = w0 + s * dw
                        if 0 <= col < W:
                            acc += x[uint32((xc + h) * W + col)] * w[uint32(wc + r * S + s)]
        y[uint32(((n * K + k) * P + p) * Q + q)] = acc

    _CACHE[(R, S)] = conv2d_coalesced_kernel
    return conv2d_coalesced_kernel


@launcher
def conv2d_coalesced(x, w, out, stride=1, padding=0, dilation=1, groups=1):
    """One thread per output; a warp covers 32 neighbouring outputs of one row."""
    p, args = direct_launch_args("conv2d_coalesced", x, w, out, stride, padding, dilation, groups)
    grid = launch_grid(p.N, p.K, p.P, p.Q)
    make_kernel(p.R, p.S)[grid, THREADS](flat(x), flat(w), flat(out), *args)
    return out


# For PTX reports: the 3x3 kernel.
KERNEL = conv2d_coalesced_kernel = make_kernel(3, 3)
SIGNATURE = ("(float32[::1], float32[::1], float32[::1], int32, int32, int32, int32, int32, "
             "int32, int32, int32, int32, int32, int32, int32)")
