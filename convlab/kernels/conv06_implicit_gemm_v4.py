"""Ladder step 6: the implicit GEMM of step 5 with 128-bit, conflict-free shared reads.

Same tiles, same loads as `conv05_implicit_gemm`; only the way a thread reads its 8
filter values and 8 pixel values per k changes:

- Its 8x8 block is split into 2x2 sub-blocks of 4x4, half a tile apart (filters
  ``4*ty + i`` and ``BM/2 + 4*ty + i``, pixels likewise). For one k its values are two
  runs of 4 neighbouring floats in each slab: four 128-bit reads instead of sixteen
  32-bit ones, and a quarter-warp's reads cover 128 consecutive bytes (no bank
  conflicts).
- The compiler only emits ``ld.shared.v4.f32`` if the shared arrays are 16-byte aligned
  (``alignment=16``) and it can prove the index >= 0. Numba wraps negative indices
  like Python, so ``tid % 16`` (signed) keeps wrap-around code and scalar loads;
  ``tid & 15`` is provably >= 0. Look for ``ld.shared.v4.f32`` in the PTX
  (`kernels.ptx_report`).
"""

from numba import cuda, float32

from ._blocking import IGEMM_SIGNATURE, SMEM_ALIGN, conv_plan, flat, rsck_weights_into
from ._launch import launcher

BM, BN, BK = 64, 128, 8  # filters, output pixels, reduction step per slab
TM, TN = 8, 8
HM, HN = TM // 2, TN // 2  # 4x4 sub-blocks
THREADS = (BM // TM) * (BN // TN)  # 128 = BN: one B column per thread
assert BN // TN == 16  # tx = tid & 15, ty = tid >> 4


@cuda.jit
def conv2d_implicit_gemm_v4_kernel(x, wt, y, prm):
    N, C, H, W, K = prm[0], prm[1], prm[2], prm[3], prm[4]
    R, S, P, Q = prm[5], prm[6], prm[7], prm[8]
    sh, sw, ph, pw, dh, dw, Cp = prm[9], prm[10], prm[11], prm[12], prm[13], prm[14], prm[15]
    As = cuda.shared.array((BK, BM), float32, alignment=SMEM_ALIGN)
    Bs = cuda.shared.array((BK, BN), float32, alignment=SMEM_ALIGN)
    tid = cuda.threadIdx.x & (THREADS - 1)  # masks: provably >= 0
    tx, ty = tid & (BN // TN - 1), (tid >> 4) & (BM // TM - 1)
    am, bn = ty * HM, tx * HN  # first filter / pixel of this thread's sub-blocks
    k0 = cuda.blockIdx.y * BM  # first filter of the tile
    PQ, HW = P * Q, H * W

    # The output pixel whose B column this thread loads, for every slab.
    j = cuda.blockIdx.x * BN + tid
    n = j // PQ
    p = (j % PQ) // Q
    q = j % Q
    col_ok = j < N * PQ

    acc = cuda.local.array((TM, TN), float32)
    af = cuda.local.array(TM, float32)
    bf = cuda.local.array(TN, float32)
    for i in range(TM):
        for jj in range(TN):
            acc[i, jj] = float32(0.0)

    for r in range(R):
        for s in range(S):
            h = p * sh - ph + r * dh
            w = q * sw - pw + s * dw
            inside = col_ok and 0 <= h < H and 0 <= w < W
            x_off = n * C * HW + h * W + w  # channel 0 of this tap's input pixel
            for c0 in range(0, C, BK):
                for ld in range(BM * BK // THREADS):  # A slab: 8 rows of wt, 64 filters
                    idx = tid + ld * THREADS
                    kk, m = idx // BM, idx % BM
                    v = float32(0.0)
                    if c0 + kk < C and k0 + m < K:
                        v = wt[((r * S + s) * Cp + c0 + kk) * K + k0 + m]
                    As[kk, m] = v
                for kk in range(BK):  # B slab: this pixel, 8 channels
                    v = float32(0.0)
                    if inside and c0 + kk < C:
                        v = x[x_off + (c0 + kk) * HW]
                    Bs[kk, tid] = v
                cuda.syncthreads()
                for kk in range(BK):
                    for i in range(HM):  # 2 + 2 reads of 128 bits
                        af[i] = As[kk, am + i]
                        af[HM + i] = As[kk, BM // 2 + am + i]
                    for jj in range(HN):
                        bf[jj] = Bs[kk, bn + jj]
                        bf[HN + jj] = Bs[kk, BN // 2 + bn + jj]
                    for i in range(TM):
                        for jj in range(TN):
                            acc[i, jj] += af[i] * bf[jj]
                cuda.syncthreads()

    for jj in range(TN):
        jo = cuda.blockIdx.x * BN + (jj // HN) * (BN // 2) + bn + jj % HN
        if jo < N * PQ:
            no = jo // PQ
            base = no * K * PQ + (jo - no * PQ)
            for i in range(TM):
                k = k0 + (i // HM) * (BM // 2) + am + i % HM
                if k < K:
                    y[base + k * PQ] = acc[i, jj]


@launcher
def conv2d_implicit_gemm_v4(x, w, out, stride=1, padding=0, dilation=1, groups=1):
    """Implicit GEMM with 128-bit shared-memory reads (64x128 tiles, 8x8 per thread)."""
    plan = conv_plan("conv2d_implicit_gemm_v4", x, w, out, stride, padding, dilation, groups,
                     BM, BN, BK)
    wt = rsck_weights_into(plan, w)
    conv2d_implicit_gemm_v4_kernel[plan.grid, THREADS](flat(x), wt, flat(out), plan.prm)
    return out


KERNEL, SIGNATURE = conv2d_implicit_gemm_v4_kernel, IGEMM_SIGNATURE
conv2d_implicit_gemm_v4.kernel = KERNEL
