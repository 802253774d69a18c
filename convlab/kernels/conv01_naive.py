"""Ladder step 1: direct convolution, one thread per output element.

A block of threads walks the P*Q output pixels of one (image, filter) plane. Thread j
takes pixel (p, q) = (j % P, j // P): neighbouring threads take neighbouring output
*rows*, so the 32 threads of a warp read addresses W floats apart and every load
touches its own 32-byte sector (uncoalesced). Lesson 05 swaps the two
(`conv02_coalesced`) and measures the difference.

Two Numba rules from lesson 04 make this kernel about three times faster than the
textbook version with 4-D indexing (``x[n, c, h, w]``):

- index arithmetic in 32 bits: Numba computes in signed 64 bits and checks every index
  for a negative value (Python's wrap-around); the arrays are passed flat and every
  index is cast to ``uint32``, which needs no such check;
- the filter size R x S is a compile-time constant (`make_kernel` compiles one kernel
  per size), so the tap loops unroll and their bounds tests disappear.
"""

from numba import cuda, float32, int32, uint32

from ._blocking import flat
from ._launch import ceil_div, direct_launch_args, launcher

THREADS = 128  # threads per block, along the P*Q output pixels of one plane
_CACHE: dict = {}


def make_kernel(R: int, S: int):
    """Compile (once) the naive kernel for an R x S filter."""
    if (R, S) in _CACHE:
        return _CACHE[(R, S)]

    @cuda.jit
    def conv2d_naive_kernel(x, w, y, C, H, W, K, P, Q, sh, sw, ph, pw, dh, dw):
        # x, w, y flat (NCHW, KCRS, NKPQ); every size an int32
        j = int32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        k = int32(cuda.blockIdx.y)
        n = int32(cuda.blockIdx.z)
        if j >= P * Q:
            return
        q = int32(uint32(j) // uint32(P))  # neighbouring threads: neighbouring rows
        p = j - q * P
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

    _CACHE[(R, S)] = conv2d_naive_kernel
    return conv2d_naive_kernel


def launch_grid(N: int, K: int, P: int, Q: int) -> tuple:
    """Blocks of THREADS along the P*Q pixels of a plane (x), one filter (y), one image (z)."""
    return (ceil_div(P * Q, THREADS), K, N)


@launcher
def conv2d_naive(x, w, out, stride=1, padding=0, dilation=1, groups=1):
    """One thread per output; neighbouring threads take neighbouring output rows."""
    p, args = direct_launch_args("conv2d_naive", x, w, out, stride, padding, dilation, groups)
    grid = launch_grid(p.N, p.K, p.P, p.Q)
    make_kernel(p.R, p.S)[grid, THREADS](flat(x), flat(w), flat(out), *args)
    return out


# For PTX reports and the lessons: the 3x3 kernel.
KERNEL = conv2d_naive_kernel = make_kernel(3, 3)
SIGNATURE = ("(float32[::1], float32[::1], float32[::1], int32, int32, int32, int32, int32, "
             "int32, int32, int32, int32, int32, int32, int32)")
