"""Ladder step 7: the double-buffered implicit GEMM of step 6, warp-tiled.

In step 6 the threads of a warp are one row of the block's thread grid: 16 threads
along the pixels (TX) and two rows of filters, so a warp's 32 threads read 16 x TN/2
pixel values and only 2 x TM/2 filter values per k, and the pixel reads of one warp
span the whole B slab. Here a warp is an 8 x 4 patch of threads (8 along the pixels, 4
along the filters): per k its reads cover 8 x TN/2 pixel values and 4 x TM/2 filter
values, a more even split between the two slabs, and each warp's B reads stay inside
half of the slab. Same tiles, same loads, same FMAs: only which thread computes which
block changes (three lines).

``make_kernel(BM, BN, BK, TM, TN, min_blocks)`` builds the kernel for any power-of-two
tile with at least 8 x 4 threads; the launcher takes the tile step 5's `pick_tile`
picks; `conv08_implicit_gemm_tuned` measures the CANDIDATES per layer instead.
"""

from numba import cuda, float32, int64, uint64

from ._blocking import (
    IGEMM_SIGNATURE,
    SMEM_ALIGN,
    igemm_launcher,
    jit_options,
    tile_launcher,
    unroll,
    unrolled,
)
from ._blocking import log2 as _log2
from ._launch import picked_launcher
from .conv05_implicit_gemm import Config, picked


def make_kernel(BM=64, BN=128, BK=8, TM=8, TN=8, min_blocks=None):
    """Warp-tiled, double-buffered implicit-GEMM kernel: BM filters x BN output pixels per
    block."""
    TX, TY = BN // TN, BM // TM
    NT = TX * TY
    HM, HN = TM // 2, TN // 2
    if NT < BM or NT < BN:
        raise ValueError(f"{BM}x{BN} tile with {TM}x{TN} per thread has {NT} threads: fewer "
                         "than its rows or columns (each thread loads one A and one B column)")
    if TX < 8 or TY < 4:
        raise ValueError("warp tiling needs at least 8x4 threads")
    WX = TX // 8
    LWX, LBM, LBN = _log2(WX, "warps along N"), _log2(BM), _log2(BN)
    for v, what in ((BM, "BM"), (BN, "BN"), (TM, "TM"), (TN, "TN")):
        _log2(v, what)  # masks replace % and //: powers of two only
    _log2(BK, "BK")
    A_LOADS, B_LOADS = BM * BK // NT, BK * BN // NT
    A_STEP, B_STEP = NT // BM, NT // BN  # slab rows between a thread's loads
    HALF_M, HALF_N = BM // 2, BN // 2

    def conv2d_warp_tiled_kernel(x, wt, y, prm):
        N, C, H, W, K = prm[0], prm[1], prm[2], prm[3], prm[4]
        R, S, P, Q = prm[5], prm[6], prm[7], prm[8]
        sh, sw, ph, pw, dh, dw = prm[9], prm[10], prm[11], prm[12], prm[13], prm[14]
        As = cuda.shared.array((2, BK, BM), float32, alignment=SMEM_ALIGN)
        Bs = cuda.shared.array((2, BK, BN), float32, alignment=SMEM_ALIGN)
        tid = cuda.threadIdx.x & (NT - 1)
        lane, warp = tid & 31, tid >> 5
        tx = ((warp & (WX - 1)) << 3) | (lane & 7)
        ty = ((warp >> LWX) << 2) | (lane >> 3)
        k0 = (cuda.blockIdx.y & 0xFFFF) * BM
        j0 = (cuda.blockIdx.x & 0x7FFFFFFF) * BN
        PQ, HW = P * Q, H * W
        am, bn = ty * HM, tx * HN

        # This thread's loads: filter column a_m of the A slab, pixel column b_n of B.
        a_m, a_kk = tid & (BM - 1), tid >> LBM
        b_n, b_kk = tid & (BN - 1), tid >> LBN
        a_col = min(k0 + a_m, K - 1)
        j = min(j0 + b_n, N * PQ - 1)
        img = j // PQ
        pq = j - img * PQ
        p = pq // Q
        q = pq - p * Q
        h_base, w_base, x_img = p * sh - ph, q * sw - pw, img * C * HW
        a_off = cuda.local.array(A_LOADS, int64)
        b_off = cuda.local.array(B_LOADS, int64)
        for ld in range(A_LOADS):  # wt rows are (tap, channel) with C padded to Cp
            a_off[ld] = (a_kk + ld * A_STEP) * K + a_col
        for ld in range(B_LOADS):
            b_off[ld] = (b_kk + ld * B_STEP) * HW

        acc = cuda.local.array((TM, TN), float32)
        af = cuda.local.array(TM, float32)
        bf = cuda.local.array(TN, float32)
        ra = cuda.local.array(A_LOADS, float32)
        rb = cuda.local.array(B_LOADS, float32)
        for i in range(TM):
            for jj in range(TN):
                acc[i, jj] = float32(0.0)

        n_slabs = R * S * ((C + BK - 1) // BK)  # wt rows: R*S taps x Cp channels
        r, s, c0 = 0, 0, 0  # the tap and first channel of the next slab to load
        x_off = 0
        inside = False
        for t in range(n_slabs + 1):
            if t < n_slabs:  # global -> registers: slab t
                if c0 == 0:  # a new tap: where is this pixel's input, is it padding?
                    h = h_base + r * dh
                    w = w_base + s * dw
                    inside = 0 <= h < H and 0 <= w < W
                    x_off = x_img + h * W + w
                a_base = t * (BK * K)  # slab t = rows t*BK.. of wt: no test (zero padded)
                for ld in range(A_LOADS):
                    ra[ld] = wt[uint64(a_base + a_off[ld])]
                x_c = x_off + c0 * HW
                c_left = C - c0 - b_kk  # channels left for this thread's first row
                for ld in range(B_LOADS):
                    v = float32(0.0)
                    if inside and ld * B_STEP < c_left:
                        v = x[uint64(x_c + b_off[ld])]
                    rb[ld] = v
                c0 += BK
                if c0 >= C:
                    c0 = 0
                    s += 1
                    if s == S:
                        s = 0
                        r += 1
            if t > 0:  # multiply slab t-1, k unrolled
                buf = (t - 1) & 1
                for kk in unroll(BK):
                    for i in range(HM):
                        af[i] = As[buf, kk, am + i]
                        af[HM + i] = As[buf, kk, HALF_M + am + i]
                    for jj in range(HN):
                        bf[jj] = Bs[buf, kk, bn + jj]
                        bf[HN + jj] = Bs[buf, kk, HALF_N + bn + jj]
                    for i in range(TM):
                        for jj in range(TN):
                            acc[i, jj] += af[i] * bf[jj]
            if t < n_slabs:  # registers -> the other buffer
                buf = t & 1
                for ld in range(A_LOADS):
                    As[buf, a_kk + ld * A_STEP, a_m] = ra[ld]
                for ld in range(B_LOADS):
                    Bs[buf, b_kk + ld * B_STEP, b_n] = rb[ld]
            cuda.syncthreads()

        # y[img, k, p, q]: two runs of 4 neighbouring pixels per thread
        for half in unroll(2):
            jo = j0 + half * HALF_N + bn
            img = jo // PQ
            pq = jo - img * PQ
            for jj in unroll(HN):
                if jo + jj < N * PQ:
                    base = img * K * PQ + pq
                    for i in range(TM):
                        k = k0 + (i // HM) * HALF_M + am + i % HM
                        if k < K:
                            y[base + k * PQ] = acc[i, half * HN + jj]
                pq += 1
                if pq == PQ:
                    pq = 0
                    img += 1

    kernel = cuda.jit(**jit_options(NT, min_blocks))(unrolled(conv2d_warp_tiled_kernel))
    kernel.tile = dict(BM=BM, BN=BN, BK=BK, TM=TM, TN=TN, threads=NT, min_blocks=min_blocks)
    return kernel


# Candidate shapes for the autotuner (convlab.autotune): step 5's tiles and larger ones.
CANDIDATES = [Config(64, 128, 8), Config(64, 128, 16), Config(128, 64, 8), Config(128, 64, 16),
              Config(64, 64, 8), Config(64, 64, 16), Config(128, 128, 8), Config(128, 128, 16),
              Config(128, 128, 8, min_blocks=2), Config(64, 128, 8, min_blocks=3),
              Config(64, 64, 8, 4, 4), Config(64, 64, 16, 4, 4), Config(32, 64, 8, 4, 4)]

_LAUNCHERS: dict = {}


def launcher_for(cfg: Config):
    """The launcher of one tile shape (compiled on first use, then cached)."""
    return tile_launcher(_LAUNCHERS, make_kernel, "conv2d_implicit_gemm_warp_tiled", cfg)


conv2d_implicit_gemm_warp_tiled = picked_launcher(
    "conv2d_implicit_gemm_warp_tiled", launcher_for, picked,
    "Warp-tiled, double-buffered implicit GEMM on the tile `pick_tile` picks.")
KERNEL = make_kernel()
SIGNATURE = IGEMM_SIGNATURE
conv2d_implicit_gemm_warp_tiled.kernel = KERNEL
_LAUNCHERS[Config()] = igemm_launcher(KERNEL, "conv2d_implicit_gemm_warp_tiled")
