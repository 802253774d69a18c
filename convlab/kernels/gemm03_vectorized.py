"""GEMM step 3: 128-bit shared-memory reads through a transposed, conflict-free layout.

Same block and thread tiles as `gemm02_register_blocked`, three changes:

1. The A slab is stored transposed, ``As[k, m]``: a thread's 8 A values for one k are
   now a row, like its 8 B values, so both can be read 4 floats at a time.
2. A thread's 8x8 block is split into 2x2 sub-blocks of 4x4, half a tile apart
   (rows ``4*ty + i`` and ``BM/2 + 4*ty + i``, likewise columns). Each 128-bit read of
   a quarter-warp then covers 128 consecutive bytes: no bank conflicts. The A slab rows
   are padded by 4 floats so that the transposing stores do not collide either.
3. Indices come from masks (``tid & 15``), which Numba can prove non-negative, and the
   shared arrays are 16-byte aligned: together these let the compiler emit
   ``ld.shared.v4.f32`` (check the PTX: `kernels.ptx_report`).

``make_kernel(BM, BN, BK, TM, TN)`` builds the kernel for any power-of-two tiles; the
module's kernel is the 128x128x8 / 8x8 one.
"""

from numba import cuda, float32

from ._blocking import (
    GEMM_SIGNATURE,
    SMEM_ALIGN,
    gemm_grid,
    gemm_launch_params,
    jit_options,
    nothing_to_launch,
)
from ._blocking import log2 as _log2
from ._launch import launcher


def make_kernel(BM=128, BN=128, BK=8, TM=8, TN=8):
    """A (BM x BN)-tile GEMM kernel, (TM x TN) outputs per thread, all sizes powers of 2."""
    TX, TY = BN // TN, BM // TM  # threads along the columns / rows of the tile
    NT = TX * TY
    HM, HN = TM // 2, TN // 2  # 4x4 sub-blocks
    LTX, LBK, LBN = _log2(TX), _log2(BK), _log2(BN)
    for v, what in ((BM, "BM"), (BN, "BN"), (TM, "TM"), (TN, "TN")):
        _log2(v, what)  # masks replace % and //: powers of two only
    AP = BM + 4  # padded row of the transposed A slab (keeps 16-byte alignment)
    A_LOADS, B_LOADS = BM * BK // NT, BK * BN // NT
    if A_LOADS < 1 or B_LOADS < 1 or HM < 1 or HN < 1:
        raise ValueError("tile too small for its thread count")

    @cuda.jit(**jit_options(NT))
    def gemm_vectorized_kernel(a, b, c, M, N, K):
        As = cuda.shared.array((BK, AP), float32, alignment=SMEM_ALIGN)
        Bs = cuda.shared.array((BK, BN), float32, alignment=SMEM_ALIGN)
        tid = cuda.threadIdx.x & (NT - 1)
        tx = tid & (TX - 1)
        ty = (tid >> LTX) & (TY - 1)
        m0 = (cuda.blockIdx.y & 0xFFFF) * BM
        n0 = (cuda.blockIdx.x & 0x7FFFFFFF) * BN
        am, bn = ty * HM, tx * HN  # first row / column of this thread's sub-blocks

        acc = cuda.local.array((TM, TN), float32)
        af = cuda.local.array(TM, float32)
        bf = cuda.local.array(TN, float32)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = float32(0.0)

        for k0 in range(0, K, BK):
            for ld in range(A_LOADS):  # consecutive threads read consecutive k of a row
                idx = tid + ld * NT
                kk, m = idx & (BK - 1), idx >> LBK
                v = float32(0.0)
                if m0 + m < M and k0 + kk < K:
                    v = a[m0 + m, k0 + kk]
                As[kk, m] = v  # transposed
            for ld in range(B_LOADS):
                idx = tid + ld * NT
                n, kk = idx & (BN - 1), idx >> LBN
                v = float32(0.0)
                if k0 + kk < K and n0 + n < N:
                    v = b[k0 + kk, n0 + n]
                Bs[kk, n] = v
            cuda.syncthreads()
            for kk in range(BK):
                for i in range(HM):  # two 128-bit reads of A, two of B
                    af[i] = As[kk, am + i]
                    af[HM + i] = As[kk, BM // 2 + am + i]
                for j in range(HN):
                    bf[j] = Bs[kk, bn + j]
                    bf[HN + j] = Bs[kk, BN // 2 + bn + j]
                for i in range(TM):
                    for j in range(TN):
                        acc[i, j] += af[i] * bf[j]
            cuda.syncthreads()

        for i in range(TM):
            row = m0 + (i // HM) * (BM // 2) + am + i % HM
            if row < M:
                for j in range(TN):
                    col = n0 + (j // HN) * (BN // 2) + bn + j % HN
                    if col < N:
                        c[row, col] = acc[i, j]

    gemm_vectorized_kernel.tile = dict(BM=BM, BN=BN, BK=BK, TM=TM, TN=TN, threads=NT)
    return gemm_vectorized_kernel


def make_launcher(kernel):
    t = kernel.tile

    @launcher
    def gemm_vectorized(a, b, out):
        """out = a @ b (device arrays, float32), 128-bit shared-memory reads."""
        M, N, K = gemm_launch_params("gemm_vectorized", a, b, out)
        if nothing_to_launch(out, M, N, K):
            return out
        kernel[gemm_grid(M, N, t["BM"], t["BN"]), t["threads"]](a, b, out, M, N, K)
        return out

    gemm_vectorized.kernel = kernel
    return gemm_vectorized


KERNEL = make_kernel()
SIGNATURE = GEMM_SIGNATURE
gemm_vectorized = make_launcher(KERNEL)
