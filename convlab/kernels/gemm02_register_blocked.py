"""GEMM step 2: register blocking, the plain way (128x128 block tiles, 8x8 per thread).

C = A @ B with A (M, K), B (K, N), row-major float32. A block of 256 threads owns a
128x128 tile of C; each thread keeps an 8x8 block of it in registers. Per step of the
reduction the block stages a 128x8 slab of A and an 8x128 slab of B in shared memory;
then, for each of the 8 k's, a thread reads 8 values of A and 8 of B and does 64 FMAs
(an outer product): 16 shared-memory loads for 64 FMAs instead of 2 per FMA.

What this version leaves on the table (the next steps fix it, lessons 08-09):
- the A slab is stored as it sits in memory, ``As[m, k]``: a thread's 8 A values are
  a column, 8 separate 32-bit loads, and the warp's reads of it conflict (2-way for A,
  whose 16 threads of a row share addresses, 4-way for B: 3 on average, lesson 07's trace);
- the indices come from ``tid % 16`` and ``tid // 16``: Numba cannot prove them
  non-negative, keeps Python's wrap-around code, and no load becomes 128 bits wide;
- one shared buffer: the block waits for the global loads of every slab.
"""

from numba import cuda, float32

from ._blocking import GEMM_SIGNATURE, gemm_grid, gemm_launch_params, nothing_to_launch
from ._launch import launcher

BM, BN, BK = 128, 128, 8  # block tile: rows of C, columns of C, reduction step
TM, TN = 8, 8  # per-thread tile
THREADS = (BM // TM) * (BN // TN)  # 256


@cuda.jit
def gemm_register_blocked_kernel(a, b, c, M, N, K):
    As = cuda.shared.array((BM, BK), float32)
    Bs = cuda.shared.array((BK, BN), float32)
    tid = cuda.threadIdx.x
    tx = tid % (BN // TN)  # which 8 columns of the tile
    ty = tid // (BN // TN)  # which 8 rows
    m0 = cuda.blockIdx.y * BM
    n0 = cuda.blockIdx.x * BN

    acc = cuda.local.array((TM, TN), float32)  # registers: every index is a constant
    af = cuda.local.array(TM, float32)
    bf = cuda.local.array(TN, float32)
    for i in range(TM):
        for j in range(TN):
            acc[i, j] = float32(0.0)

    for k0 in range(0, K, BK):
        # stage the slabs: 128*8 = 1024 values each, 4 per thread, zeros past the edges
        for ld in range(BM * BK // THREADS):
            idx = tid + ld * THREADS
            m, kk = idx // BK, idx % BK
            v = float32(0.0)
            if m0 + m < M and k0 + kk < K:
                v = a[m0 + m, k0 + kk]
            As[m, kk] = v
        for ld in range(BK * BN // THREADS):
            idx = tid + ld * THREADS
            kk, n = idx // BN, idx % BN
            v = float32(0.0)
            if k0 + kk < K and n0 + n < N:
                v = b[k0 + kk, n0 + n]
            Bs[kk, n] = v
        cuda.syncthreads()
        for kk in range(BK):
            for i in range(TM):
                af[i] = As[ty * TM + i, kk]
            for j in range(TN):
                bf[j] = Bs[kk, tx * TN + j]
            for i in range(TM):  # the outer product: 64 FMAs
                for j in range(TN):
                    acc[i, j] += af[i] * bf[j]
        cuda.syncthreads()

    for i in range(TM):
        row = m0 + ty * TM + i
        for j in range(TN):
            col = n0 + tx * TN + j
            if row < M and col < N:
                c[row, col] = acc[i, j]


@launcher
def gemm_register_blocked(a, b, out):
    """out = a @ b (device arrays, float32); 128x128 tiles, 8x8 outputs per thread."""
    M, N, K = gemm_launch_params("gemm_register_blocked", a, b, out)
    if nothing_to_launch(out, M, N, K):
        return out
    gemm_register_blocked_kernel[gemm_grid(M, N, BM, BN), THREADS](a, b, out, M, N, K)
    return out


KERNEL, SIGNATURE = gemm_register_blocked_kernel, GEMM_SIGNATURE
gemm_register_blocked.kernel = KERNEL
