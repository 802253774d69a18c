"""Ladder step 5: implicit GEMM, im2col done on the fly into shared memory.

The convolution is the GEMM  Y[k, j] = sum_l  A[k, l] * B[l, j]  with
M = K (filters), N = N*P*Q (output pixels, j), and a reduction of length C*R*S (l).
Explicit im2col writes B to device memory (R*S times the input); here each block
builds only the slab of B it needs, in shared memory, straight from x.

- The reduction is ordered (r, s, c) instead of (c, r, s): one slab of BK rows has
  a single filter tap (r, s) and BK consecutive channels, so a thread finds its input
  pixel once per tap (bounds test included) and then steps by H*W per channel; no
  division in the main loop. The filters are rearranged once per call to match,
  ``wt[(r*S + s)*Cp + c, k]`` (`_blocking.rsck_weights_kernel`, a tiny kernel; Cp is
  C rounded up to BK, the extra channels hold zeros).
- Block tile: BM filters x BN output pixels, TM x TN outputs per thread: the register
  blocking of step 4, now with both operands from shared memory. Each thread loads
  one filter column of the A slab and one pixel column of the B slab; neighbouring
  threads take neighbouring pixels: coalesced.
- What steps 3 and 4 already did stays: the k-loop over a slab is unrolled (every
  shared address is base + constant), a thread's TM x TN block is split into 2 x 2
  sub-blocks half a tile apart so that its values for one k are runs of neighbouring
  floats (128-bit shared reads, conflict-free), addresses are computed once before the
  loop, and the reduction is one flat loop over R*S*ceil(C/BK) slabs whose tap (r, s)
  advances when the channel counter wraps.
- `pick_tile` keeps the GPU busy: 64 x 128 tiles with 8 x 8 per thread where the layer
  has enough outputs, smaller tiles or 4 x 4 per thread where that would leave most of
  the GPU's warp slots empty (late layers, small batches).
- Stride, padding and dilation are handled in the pixel arithmetic; out-of-range
  filters / pixels are clamped to the last valid one (they feed outputs never stored),
  the reduction edge and the padding read zeros.

One buffer: load a slab, ``syncthreads``, multiply, ``syncthreads``. Step 6 overlaps
the loads with the multiplication.
"""

from dataclasses import dataclass

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
from ._launch import ceil_div, picked_launcher

TILES = ((64, 128, 8, 8), (64, 64, 8, 8), (64, 64, 4, 4), (32, 64, 4, 4))
MIN_WARPS_PER_SM = 4  # below this many resident warps per SM, latency shows


def pick_tile(p, sms: int = 132, tiles=TILES) -> tuple:
    """(BM, BN, TM, TN): the first of `tiles` whose grid gives every SM MIN_WARPS_PER_SM warps."""
    for BM, BN, TM, TN in tiles:
        threads = ceil_div(p.K, BM) * ceil_div(p.N * p.P * p.Q, BN) * (BM // TM) * (BN // TN)
        if threads // 32 >= MIN_WARPS_PER_SM * sms:
            return BM, BN, TM, TN
    return tiles[-1]


@dataclass(frozen=True)
class Config:
    """A tile shape for `make_kernel` (BM filters x BN pixels x BK channels per slab)."""

    BM: int = 64
    BN: int = 128
    BK: int = 8
    TM: int = 8
    TN: int = 8
    min_blocks: int | None = None

    def __str__(self):
        s = f"{self.BM}x{self.BN}x{self.BK}"
        if (self.TM, self.TN) != (8, 8):
            s += f" t{self.TM}x{self.TN}"
        return s + (f" b{self.min_blocks}" if self.min_blocks else "")


BK = 16  # channels per slab of a picked tile: half the barriers of 8, faster on the H200


def picked(p) -> Config:
    """`pick_tile`'s tile for ConvParams p, as a Config with BK channels per slab."""
    BM, BN, TM, TN = pick_tile(p)
    return Config(BM, BN, BK, TM, TN)


def make_kernel(BM=64, BN=128, BK=8, TM=8, TN=8, min_blocks=None):
    """Implicit-GEMM kernel: BM filters x BN output pixels per block."""
    TX, TY = BN // TN, BM // TM
    NT = TX * TY
    HM, HN = TM // 2, TN // 2
    if NT < BM or NT < BN:
        raise ValueError(f"{BM}x{BN} tile with {TM}x{TN} per thread has {NT} threads: fewer "
                         "than its rows or columns (each thread loads one A and one B column)")
    LTX, LBM, LBN = _log2(TX, "threads along N"), _log2(BM), _log2(BN)
    for v, what in ((BM, "BM"), (BN, "BN"), (TM, "TM"), (TN, "TN")):
        _log2(v, what)  # masks replace % and //: powers of two only
    _log2(BK, "BK")
    A_LOADS, B_LOADS = BM * BK // NT, BK * BN // NT
    A_STEP, B_STEP = NT // BM, NT // BN  # slab rows between a thread's loads
    HALF_M, HALF_N = BM // 2, BN // 2

    def conv2d_implicit_gemm_kernel(x, wt, y, prm):
        N, C, H, W, K = prm[0], prm[1], prm[2], prm[3], prm[4]
        R, S, P, Q = prm[5], prm[6], prm[7], prm[8]
        sh, sw, ph, pw, dh, dw = prm[9], prm[10], prm[11], prm[12], prm[13], prm[14]
        As = cuda.shared.array((BK, BM), float32, alignment=SMEM_ALIGN)  # [k][filter]
        Bs = cuda.shared.array((BK, BN), float32, alignment=SMEM_ALIGN)  # [k][pixel]
        tid = cuda.threadIdx.x & (NT - 1)
        tx, ty = tid & (TX - 1), tid >> LTX  # thread rows of TX threads
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
        for i in range(TM):
            for jj in range(TN):
                acc[i, jj] = float32(0.0)

        n_slabs = R * S * ((C + BK - 1) // BK)  # wt rows: R*S taps x Cp channels
        r, s, c0 = 0, 0, 0  # the tap and first channel of slab t
        x_off = 0
        inside = False
        for t in range(n_slabs):
            if c0 == 0:  # a new tap: where is this pixel's input, is it padding?
                h = h_base + r * dh
                w = w_base + s * dw
                inside = 0 <= h < H and 0 <= w < W
                x_off = x_img + h * W + w
            a_base = t * (BK * K)  # slab t = rows t*BK.. of wt: no test (zero padded)
            for ld in range(A_LOADS):  # 1. global -> shared: slab t
                As[a_kk + ld * A_STEP, a_m] = wt[uint64(a_base + a_off[ld])]
            x_c = x_off + c0 * HW
            c_left = C - c0 - b_kk  # channels left for this thread's first row
            for ld in range(B_LOADS):
                v = float32(0.0)
                if inside and ld * B_STEP < c_left:
                    v = x[uint64(x_c + b_off[ld])]
                Bs[b_kk + ld * B_STEP, b_n] = v
            c0 += BK
            if c0 >= C:
                c0 = 0
                s += 1
                if s == S:
                    s = 0
                    r += 1
            cuda.syncthreads()  # 2. the slab is complete
            for kk in unroll(BK):  # 3. multiply it, k unrolled, 128-bit reads
                for i in range(HM):
                    af[i] = As[kk, am + i]
                    af[HM + i] = As[kk, HALF_M + am + i]
                for jj in range(HN):
                    bf[jj] = Bs[kk, bn + jj]
                    bf[HN + jj] = Bs[kk, HALF_N + bn + jj]
                for i in range(TM):
                    for jj in range(TN):
                        acc[i, jj] += af[i] * bf[jj]
            cuda.syncthreads()  # 4. everyone is done before the next slab overwrites it

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

    kernel = cuda.jit(**jit_options(NT, min_blocks))(unrolled(conv2d_implicit_gemm_kernel))
    kernel.tile = dict(BM=BM, BN=BN, BK=BK, TM=TM, TN=TN, threads=NT, min_blocks=min_blocks)
    return kernel


_LAUNCHERS: dict = {}


def launcher_for(cfg: Config):
    """The launcher of one tile shape (compiled on first use, then cached)."""
    return tile_launcher(_LAUNCHERS, make_kernel, "conv2d_implicit_gemm", cfg)


conv2d_implicit_gemm = picked_launcher(
    "conv2d_implicit_gemm", launcher_for, picked,
    "Implicit GEMM on the tile `pick_tile` picks (BM x BN per block, TM x TN per thread).")
KERNEL = make_kernel()
BM, BN = KERNEL.tile["BM"], KERNEL.tile["BN"]  # the default tile
SIGNATURE = IGEMM_SIGNATURE
conv2d_implicit_gemm.kernel = KERNEL
_LAUNCHERS[Config()] = igemm_launcher(KERNEL, "conv2d_implicit_gemm")
