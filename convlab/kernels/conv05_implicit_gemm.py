"""Ladder step 5: implicit GEMM, im2col done on the fly into shared memory.

The convolution is the GEMM  Y[k, j] = sum_l  A[k, l] * B[l, j]  with
M = K (filters), N = N*P*Q (output pixels, j), and a reduction of length C*R*S (l).
Explicit im2col writes B to device memory (R*S times the input); here each block
builds only the slab of B it needs, in shared memory, straight from x.

- The reduction is ordered (r, s, c) instead of (c, r, s): one slab of BK = 8 rows has
  a single filter tap (r, s) and 8 consecutive channels, so a thread finds its input
  pixel once per tap (bounds test included) and then steps by H*W per channel; no
  division in the main loop. The filters are rearranged once per call to match,
  ``wt[(r*S + s)*Cp + c, k]`` (`_blocking.rsck_weights_kernel`, a tiny kernel; Cp is
  C rounded up to BK, the extra channels hold zeros).
- Block tile: 64 filters x 128 output pixels, 128 threads, 8x8 outputs per thread
  (the register blocking of lesson 07). A thread loads one output pixel's column of
  the B slab; the 128 threads of a block read 128 neighbouring pixels: coalesced.
- Stride, padding and dilation are handled in the pixel arithmetic; partial tiles are
  zero-filled (reduction) or not stored (outputs).

Plain on purpose: shared-memory reads are 32-bit, one buffer, the k-loop is rolled.
The next steps (`conv06_implicit_gemm_v4`, `conv07_implicit_gemm_pipelined`) fix that.
"""

from numba import cuda, float32

from ._blocking import IGEMM_SIGNATURE, conv_plan, flat, rsck_weights_into
from ._launch import launcher

BM, BN, BK = 64, 128, 8  # filters, output pixels, reduction step per slab
TM, TN = 8, 8
THREADS = (BM // TM) * (BN // TN)  # 128 = BN: one B column per thread


@cuda.jit
def conv2d_implicit_gemm_kernel(x, wt, y, prm):
    N, C, H, W, K = prm[0], prm[1], prm[2], prm[3], prm[4]
    R, S, P, Q = prm[5], prm[6], prm[7], prm[8]
    sh, sw, ph, pw, dh, dw, Cp = prm[9], prm[10], prm[11], prm[12], prm[13], prm[14], prm[15]
    As = cuda.shared.array((BK, BM), float32)  # filters  [channel step, filter]
    Bs = cuda.shared.array((BK, BN), float32)  # im2col   [channel step, output pixel]
    tid = cuda.threadIdx.x
    tx, ty = tid % (BN // TN), tid // (BN // TN)
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
                    for i in range(TM):
                        af[i] = As[kk, ty * TM + i]
                    for jj in range(TN):
                        bf[jj] = Bs[kk, tx * TN + jj]
                    for i in range(TM):
                        for jj in range(TN):
                            acc[i, jj] += af[i] * bf[jj]
                cuda.syncthreads()

    for jj in range(TN):
        jo = cuda.blockIdx.x * BN + tx * TN + jj
        if jo < N * PQ:
            no = jo // PQ
            base = no * K * PQ + (jo - no * PQ)
            for i in range(TM):
                k = k0 + ty * TM + i
                if k < K:
                    y[base + k * PQ] = acc[i, jj]


@launcher
def conv2d_implicit_gemm(x, w, out, stride=1, padding=0, dilation=1, groups=1):
    """Implicit GEMM: 64 filters x 128 pixels per block, 8x8 outputs per thread."""
    plan = conv_plan("conv2d_implicit_gemm", x, w, out, stride, padding, dilation, groups, BM, BN,
                     BK)
    wt = rsck_weights_into(plan, w)
    conv2d_implicit_gemm_kernel[plan.grid, THREADS](flat(x), wt, flat(out), plan.prm)
    return out


KERNEL, SIGNATURE = conv2d_implicit_gemm_kernel, IGEMM_SIGNATURE
conv2d_implicit_gemm.kernel = KERNEL
