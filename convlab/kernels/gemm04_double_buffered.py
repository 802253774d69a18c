"""GEMM step 4: double buffering, register prefetch, warp tiling, an unrolled k-loop.

Built on `gemm03_vectorized` (transposed A slab, 4x4 sub-blocks, 128-bit shared reads):

1. Two shared-memory buffers. While the block multiplies slab t out of one buffer, each
   thread already has the global loads of slab t+1 in flight into registers; after the
   FMAs it writes them to the other buffer. One ``syncthreads`` per slab instead of two,
   and the global-memory latency hides behind 512 FMAs per thread.
2. Warp tiling: the 32 threads of a warp form an 8x4 patch of the thread grid (not a
   16x2 strip), so one 128-bit read of A or B by a warp touches 64 or 128 distinct
   bytes: one shared-memory wavefront each, four per k instead of six.
3. The k-loop over the slab is unrolled: Numba has no ``#pragma unroll`` and the
   compiler leaves a 64-FMA body rolled, paying address arithmetic and a branch per k.
   ``for kk in unroll(BK):`` marks the loop and `_blocking.unrolled` rewrites the
   kernel's source with BK copies of the body (kk = 0, 1, ...), so every shared-memory
   address becomes base + immediate (``kernel.unrolled_source`` shows the result).

``make_kernel(BM, BN, BK, TM, TN, min_blocks)`` builds it for power-of-two tiles; the
module's kernel uses 128x64x16 tiles (8x8 per thread, 128 threads), the fastest shape
on the H200 at 4096^3 (57% of cuBLAS for 128x128x8, 72% for 128x64x8 and 78% for
128x64x16, 253 registers and no spills; convlab/results/h200.json).
"""

from numba import cuda, float32, int64, uint64

from ._blocking import (
    FLAT_GEMM_SIGNATURE,
    SMEM_ALIGN,
    flat,
    gemm_grid,
    gemm_launch_params,
    jit_options,
    nothing_to_launch,
    unroll,
    unrolled,
)
from ._blocking import log2 as _log2
from ._launch import launcher


def make_kernel(BM=128, BN=128, BK=8, TM=8, TN=8, min_blocks=None):
    """Double-buffered, warp-tiled, k-unrolled GEMM kernel for (BM x BN) tiles."""
    TX, TY = BN // TN, BM // TM
    NT = TX * TY
    HM, HN = TM // 2, TN // 2
    if TX < 8 or TY < 4 or NT < 32:
        raise ValueError("warp tiling needs at least 8x4 threads")
    WX = TX // 8  # warps along the columns of the tile
    LWX, LBK, LBN = _log2(WX, "warps along N"), _log2(BK), _log2(BN)
    for v, what in ((BM, "BM"), (BN, "BN"), (TM, "TM"), (TN, "TN")):
        _log2(v, what)  # masks replace % and //: powers of two only
    AP = BM + 4
    A_LOADS, B_LOADS = BM * BK // NT, BK * BN // NT
    HALF_M, HALF_N = BM // 2, BN // 2

    def gemm_double_buffered_kernel(a, b, c, M, N, K):
        # a, b, c are flat (1-D) views: the kernel keeps its own offsets
        As = cuda.shared.array((2, BK, AP), float32, alignment=SMEM_ALIGN)
        Bs = cuda.shared.array((2, BK, BN), float32, alignment=SMEM_ALIGN)
        tid = cuda.threadIdx.x & (NT - 1)
        lane, warp = tid & 31, tid >> 5
        tx = ((warp & (WX - 1)) << 3) | (lane & 7)  # a warp is an 8x4 patch of threads
        ty = ((warp >> LWX) << 2) | (lane >> 3)
        m0 = (cuda.blockIdx.y & 0xFFFF) * BM
        n0 = (cuda.blockIdx.x & 0x7FFFFFFF) * BN
        am, bn = ty * HM, tx * HN

        acc = cuda.local.array((TM, TN), float32)
        af = cuda.local.array(TM, float32)
        bf = cuda.local.array(TN, float32)
        ra = cuda.local.array(A_LOADS, float32)  # the prefetched next slab
        rb = cuda.local.array(B_LOADS, float32)
        # Where this thread's loads start, computed once. Rows of A past M and columns
        # of B past N are clamped to the last one: they only feed outputs that are never
        # stored. Only the reduction edge (k >= K) must read as zero.
        a_off = cuda.local.array(A_LOADS, int64)
        a_k = cuda.local.array(A_LOADS, int64)
        b_off = cuda.local.array(B_LOADS, int64)
        b_k = cuda.local.array(B_LOADS, int64)
        for ld in range(A_LOADS):
            idx = tid + ld * NT
            a_k[ld] = idx & (BK - 1)
            a_off[ld] = min(m0 + (idx >> LBK), M - 1) * K + a_k[ld]
        for ld in range(B_LOADS):
            idx = tid + ld * NT
            b_k[ld] = idx >> LBN
            b_off[ld] = b_k[ld] * N + min(n0 + (idx & (BN - 1)), N - 1)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = float32(0.0)

        n_slabs = (K + BK - 1) // BK
        for t in range(n_slabs + 1):
            k0 = t * BK
            if t < n_slabs:  # global -> registers: slab t, in flight during the FMAs
                for ld in range(A_LOADS):
                    v = float32(0.0)
                    if k0 + a_k[ld] < K:
                        v = a[uint64(a_off[ld] + k0)]
                    ra[ld] = v
                for ld in range(B_LOADS):
                    v = float32(0.0)
                    if k0 + b_k[ld] < K:
                        v = b[uint64(b_off[ld] + k0 * N)]
                    rb[ld] = v
            if t > 0:  # multiply slab t-1 from its buffer; k unrolled (see `unrolled`)
                buf = (t - 1) & 1
                for kk in unroll(BK):
                    for i in range(HM):  # four 128-bit reads
                        af[i] = As[buf, kk, am + i]
                        af[HM + i] = As[buf, kk, HALF_M + am + i]
                    for j in range(HN):
                        bf[j] = Bs[buf, kk, bn + j]
                        bf[HN + j] = Bs[buf, kk, HALF_N + bn + j]
                    for i in range(TM):  # the 8x8 outer product
                        for j in range(TN):
                            acc[i, j] += af[i] * bf[j]
            if t < n_slabs:  # registers -> the other buffer (last read before the
                buf = t & 1  # previous syncthreads, so nobody is reading it now)
                for ld in range(A_LOADS):
                    idx = tid + ld * NT
                    As[buf, idx & (BK - 1), idx >> LBK] = ra[ld]
                for ld in range(B_LOADS):
                    idx = tid + ld * NT
                    Bs[buf, idx >> LBN, idx & (BN - 1)] = rb[ld]
            cuda.syncthreads()

        for i in range(TM):
            row = m0 + (i // HM) * HALF_M + am + i % HM
            if row < M:
                for j in range(TN):
                    col = n0 + (j // HN) * HALF_N + bn + j % HN
                    if col < N:
                        c[row * N + col] = acc[i, j]

    gemm_double_buffered_kernel = cuda.jit(**jit_options(NT, min_blocks))(
        unrolled(gemm_double_buffered_kernel))
    gemm_double_buffered_kernel.tile = dict(BM=BM, BN=BN, BK=BK, TM=TM, TN=TN, threads=NT,
                                            min_blocks=min_blocks)
    return gemm_double_buffered_kernel


def make_launcher(kernel, name="gemm_double_buffered"):
    t = kernel.tile

    @launcher
    def gemm_double_buffered(a, b, out):
        """out = a @ b (device arrays, float32): double-buffered, warp-tiled, unrolled."""
        M, N, K = gemm_launch_params(name, a, b, out)
        if nothing_to_launch(out, M, N, K):
            return out
        grid = gemm_grid(M, N, t["BM"], t["BN"])
        kernel[grid, t["threads"]](flat(a), flat(b), flat(out), M, N, K)
        return out

    gemm_double_buffered.kernel = kernel
    gemm_double_buffered.__name__ = name
    return gemm_double_buffered


KERNEL = make_kernel(BM=128, BN=64, BK=16)
SIGNATURE = FLAT_GEMM_SIGNATURE
gemm_double_buffered = make_launcher(KERNEL)
