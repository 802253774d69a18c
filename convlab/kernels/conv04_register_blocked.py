"""Ladder step 4: direct convolution with register blocking.

Each thread computes a block of outputs, 4 output pixels x 8 filters = 32 sums held in
registers, so that every value it loads is used several times:

- one input value x[n, c, h, w] feeds 8 filters (8 FMAs per load instead of 1): "load
  the image once and let every filter convolve it";
- one filter value w[k, c, r, s] feeds 4 pixels.

A block of 128 threads covers 128 output pixels (flattened over n, p, q, so small
images waste nothing) x 32 filters: 32 threads along the pixels (a warp reads 32
neighbouring pixels: coalesced) times 4 groups of 8 filters. Per input channel the
block stages the 32 filters' R*S taps in shared memory; the input is read straight from
global memory (neighbouring taps and the 4 filter groups hit the L1 cache).

Per (c, r, s) a thread does 4 global loads, two 128-bit shared loads and 32 FMAs:
better than one load per FMA, but still load-bound. Lesson 08's implicit GEMM stages
the input in shared memory too and goes to 8x8 per thread.
"""

from numba import cuda, float32, int64

from ._blocking import SMEM_ALIGN
from ._launch import CONV_SIGNATURE, Unsupported, ceil_div, conv_launch_params, launcher

PIX, FILT = 4, 8  # outputs per thread: pixels x filters
TPX, TFG = 32, 4  # threads along pixels x filter groups
THREADS = TPX * TFG  # 128
BP, BF = TPX * PIX, TFG * FILT  # block tile: 128 pixels x 32 filters
MAX_TAPS = 49  # R*S up to 7x7 (the shared filter slab is static)


@cuda.jit
def conv2d_register_blocked_kernel(x, w, y, sh, sw, ph, pw, dh, dw):
    Ws = cuda.shared.array((MAX_TAPS, BF), float32, alignment=SMEM_ALIGN)
    N, K, P, Q = y.shape
    C, R, S = w.shape[1], w.shape[2], w.shape[3]
    H, W = x.shape[2], x.shape[3]
    tid = cuda.threadIdx.x & (THREADS - 1)
    lane = tid & (TPX - 1)
    fg = tid >> 5  # filter group: filters fg*8 .. fg*8+7 of the block's 32
    k0 = cuda.blockIdx.y * BF
    PQ = P * Q

    # the thread's 4 pixels: lane, lane+32, lane+64, lane+96 of the block's 128
    acc = cuda.local.array((PIX, FILT), float32)
    hb = cuda.local.array(PIX, int64)
    wb = cuda.local.array(PIX, int64)
    nb = cuda.local.array(PIX, int64)
    for i in range(PIX):
        j = cuda.blockIdx.x * BP + lane + TPX * i
        ok = j < N * PQ
        j = min(j, N * PQ - 1)
        n = j // PQ
        pq = j - n * PQ
        p = pq // Q
        q = pq - p * Q
        nb[i] = n
        hb[i] = p * sh - ph if ok else -(1 << 40)  # a pixel past the end reads nothing
        wb[i] = q * sw - pw
        for f in range(FILT):
            acc[i, f] = float32(0.0)
    xv = cuda.local.array(PIX, float32)
    wv = cuda.local.array(FILT, float32)

    for c in range(C):
        # stage w[k0:k0+32, c, :, :] as Ws[tap, filter]
        for e in range(tid, R * S * BF, THREADS):
            tap, f = e // BF, e % BF
            v = float32(0.0)
            if k0 + f < K:
                v = w[k0 + f, c, tap // S, tap % S]
            Ws[tap, f] = v
        cuda.syncthreads()
        for r in range(R):
            for s in range(S):
                for i in range(PIX):  # one input value per pixel ...
                    h = hb[i] + r * dh
                    col = wb[i] + s * dw
                    v = float32(0.0)
                    if 0 <= h < H and 0 <= col < W:
                        v = x[nb[i], c, h, col]
                    xv[i] = v
                for f in range(FILT):  # ... and 8 filter values (two 128-bit reads)
                    wv[f] = Ws[r * S + s, fg * FILT + f]
                for i in range(PIX):  # 32 FMAs
                    for f in range(FILT):
                        acc[i, f] += xv[i] * wv[f]
        cuda.syncthreads()

    for i in range(PIX):
        if hb[i] > -(1 << 39):
            j = cuda.blockIdx.x * BP + lane + TPX * i
            n = nb[i]
            pq = j - n * PQ
            p = pq // Q
            q = pq - p * Q
            for f in range(FILT):
                k = k0 + fg * FILT + f
                if k < K:
                    y[n, k, p, q] = acc[i, f]


@launcher
def conv2d_register_blocked(x, w, out, stride=1, padding=0, dilation=1, groups=1):
    """Direct conv, 4 pixels x 8 filters per thread, the filters staged in shared memory."""
    p = conv_launch_params("conv2d_register_blocked", x, w, out, stride, padding, dilation,
                           groups)
    if p.R * p.S > MAX_TAPS:
        raise Unsupported(f"conv2d_register_blocked supports filters up to {MAX_TAPS} taps "
                          f"(7x7), got {p.R}x{p.S}")
    grid = (ceil_div(p.N * p.P * p.Q, BP), ceil_div(p.K, BF))
    conv2d_register_blocked_kernel[grid, THREADS](x, w, out, *p.stride, *p.padding,
                                                  *p.dilation)
    return out


KERNEL, SIGNATURE = conv2d_register_blocked_kernel, CONV_SIGNATURE
conv2d_register_blocked.kernel = KERNEL
