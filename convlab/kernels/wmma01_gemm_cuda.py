"""Tensor cores: a WMMA fp16 GEMM and an implicit-GEMM convolution (fp32 accumulate).

CUDA C through CuPy ``RawModule`` (lesson 12). A tensor core multiplies small matrix
tiles in one instruction; CUDA exposes it to a *warp* as WMMA (warp matrix multiply-
accumulate): the 32 threads of a warp together load a 16x16 tile of A and one of B
(fp16) into "fragments", multiply them and add the 16x16 product into an fp32
accumulator fragment, ``D = A @ B + C``, 4096 multiply-adds per instruction.

The source uses PTX's ``wmma.load`` / ``wmma.mma`` / ``wmma.store`` instructions through
inline ``asm``: exactly what the C++ API ``nvcuda::wmma`` (``<mma.h>``) compiles to, but
with no header to find, so NVRTC compiles it anywhere (CuPy on Colab, or CI without a
GPU). Halves travel as 16-bit integers (``unsigned short``) for the same reason.

Three kernels, one source:

- ``wmma_gemm_simple``: one warp per 16x16 tile of C, fragments loaded straight from
  global memory. The smallest correct tensor-core GEMM; M, N, K multiples of 16.
- ``wmma_gemm_tiled<BM, BN, BK, WM, WN, STAGES>``: a block computes BM x BN of C, each
  warp WM x WN of it ((WM/16) x (WN/16) accumulator fragments); slabs of A (BM x BK) and
  B (BK x BN) arrive in shared memory by 16-byte ``cp.async`` copies, STAGES slabs in
  flight; rows padded by 8 halves so that fragment loads do not hit the same banks.
  M, N multiples of BM, BN and K of BK (`gemm_wmma` pads other shapes).
- ``wmma_conv<BM, BN, BK, WM, WN>``: implicit-GEMM convolution, NCHW fp16 input, filters
  packed once per call into an fp16 (R*S*Cp, Kp) matrix (``pack_filters``); the input
  patches are gathered into shared memory (two slabs, the next one loaded into registers
  while the tensor cores work on the current one); fp32 output, any stride / padding /
  dilation and sizes (partial tiles masked), groups refused.

Numbers: both inputs rounded to fp16 (11 significant bits), products exact, sums in fp32.
`compile_ptx` compiles the source with NVRTC for ``compute_70``+ without a GPU (CI).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._launch import Unsupported, ceil_div, launcher
from ._launch import device_pointer as _ptr

CUDA_SOURCE = r"""
// Warp matrix multiply-accumulate, m16n16k16, fp16 inputs, fp32 accumulators, in PTX.
// A fragment of A or B: 8 registers of two halves each; an accumulator: 8 floats.
typedef unsigned short half_t;   // fp16 bits

#ifndef CONVLAB_EMULATE  // (tools/wmma_emulate.py runs this file on the CPU with its own helpers)
struct FragAB { unsigned r[8]; };
struct FragC  { float r[8]; };

__device__ __forceinline__ void frag_zero(FragC& c) {
#pragma unroll
    for (int i = 0; i < 8; ++i) c.r[i] = 0.0f;
}

#define WMMA_LOAD(NAME, WHICH, LAYOUT, SPACE)                                              \
__device__ __forceinline__ void NAME(FragAB& f, const half_t* p, int ld) {                 \
    asm volatile("wmma.load." WHICH ".sync.aligned." LAYOUT ".m16n16k16" SPACE ".f16 "     \
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, [%8], %9;\n"                           \
                 : "=r"(f.r[0]), "=r"(f.r[1]), "=r"(f.r[2]), "=r"(f.r[3]),                \
                   "=r"(f.r[4]), "=r"(f.r[5]), "=r"(f.r[6]), "=r"(f.r[7])                 \
                 : "l"(p), "r"(ld));                                                       \
}
// generic addresses (global or shared): the simple kernel; shared: the tiled ones
WMMA_LOAD(load_a_row, "a", "row", "")
WMMA_LOAD(load_b_row, "b", "row", "")
WMMA_LOAD(load_a_row_s, "a", "row", ".shared")
WMMA_LOAD(load_a_col_s, "a", "col", ".shared")
WMMA_LOAD(load_b_row_s, "b", "row", ".shared")

#define WMMA_MMA(NAME, AL, BL)                                                             \
__device__ __forceinline__ void NAME(FragC& d, const FragAB& a, const FragAB& b) {         \
    asm volatile("wmma.mma.sync.aligned." AL "." BL ".m16n16k16.f32.f32 "                  \
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, "                                      \
                 "{%8, %9, %10, %11, %12, %13, %14, %15}, "                                \
                 "{%16, %17, %18, %19, %20, %21, %22, %23}, "                              \
                 "{%0, %1, %2, %3, %4, %5, %6, %7};\n"                                     \
                 : "+f"(d.r[0]), "+f"(d.r[1]), "+f"(d.r[2]), "+f"(d.r[3]),                \
                   "+f"(d.r[4]), "+f"(d.r[5]), "+f"(d.r[6]), "+f"(d.r[7])                 \
                 : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]),                    \
                   "r"(a.r[4]), "r"(a.r[5]), "r"(a.r[6]), "r"(a.r[7]),                    \
                   "r"(b.r[0]), "r"(b.r[1]), "r"(b.r[2]), "r"(b.r[3]),                    \
                   "r"(b.r[4]), "r"(b.r[5]), "r"(b.r[6]), "r"(b.r[7]));                   \
}
WMMA_MMA(mma_row_row, "row", "row")
WMMA_MMA(mma_col_row, "col", "row")

#define WMMA_STORE(NAME, SPACE)                                                            \
__device__ __forceinline__ void NAME(float* p, const FragC& c, int ld) {                   \
    asm volatile("wmma.store.d.sync.aligned.row.m16n16k16" SPACE ".f32 "                   \
                 "[%0], {%1, %2, %3, %4, %5, %6, %7, %8}, %9;\n"                           \
                 :: "l"(p), "f"(c.r[0]), "f"(c.r[1]), "f"(c.r[2]), "f"(c.r[3]),           \
                    "f"(c.r[4]), "f"(c.r[5]), "f"(c.r[6]), "f"(c.r[7]), "r"(ld)           \
                 : "memory");                                                              \
}
WMMA_STORE(store_c, "")
WMMA_STORE(store_c_s, ".shared")

__device__ __forceinline__ const half_t* to_shared(const half_t* p) {
    // a shared-memory address for the .shared forms (64-bit, as "l" operands need)
    return reinterpret_cast<const half_t*>((size_t)__cvta_generic_to_shared(p));
}
__device__ __forceinline__ float* to_shared(float* p) {
    return reinterpret_cast<float*>((size_t)__cvta_generic_to_shared(p));
}
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
// Ampere and later: global -> shared without passing through registers
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}
#else
// Volta / Turing (T4): no cp.async; a plain 16-byte copy through registers
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    *reinterpret_cast<uint4*>(smem) = *reinterpret_cast<const uint4*>(gmem);
}
__device__ __forceinline__ void cp_async_commit() {}
template <int N>
__device__ __forceinline__ void cp_async_wait() {}
#endif
__device__ __forceinline__ half_t f32_to_f16(float v) {
    half_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}

#endif  // CONVLAB_EMULATE

// ---------------------------------------------------------------------------------------
// C (M x N, fp32) = A (M x K, fp16, row-major) @ B (K x N, fp16, row-major).
// One warp per 16x16 tile of C; M, N, K multiples of 16.
extern "C" __global__ void wmma_gemm_simple(const half_t* __restrict__ a,
                                            const half_t* __restrict__ b,
                                            float* __restrict__ c, int M, int N, int K) {
    const int m0 = blockIdx.y * 16, n0 = blockIdx.x * 16;
    FragAB fa, fb;
    FragC acc;
    frag_zero(acc);
    for (int k0 = 0; k0 < K; k0 += 16) {
        load_a_row(fa, a + (size_t)m0 * K + k0, K);
        load_b_row(fb, b + (size_t)k0 * N + n0, N);
        mma_row_row(acc, fa, fb);
    }
    store_c(c + (size_t)m0 * N + n0, acc, N);
}

// ---------------------------------------------------------------------------------------
// The tiled GEMM: block tile BM x BN, slabs of BK, warp tile WM x WN, STAGES in flight.
template <int BM, int BN, int BK, int WM, int WN, int STAGES>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32)
wmma_gemm_tiled(const half_t* __restrict__ a, const half_t* __restrict__ b,
                float* __restrict__ c, int M, int N, int K)
{
    constexpr int WARPS_N = BN / WN;
    constexpr int NT = (BM / WM) * WARPS_N * 32;
    constexpr int FM = WM / 16, FN = WN / 16;         // fragments per warp
    constexpr int LDA = BK + 8, LDB = BN + 8;         // padded rows (halves)
    constexpr int A_CHUNKS = BM * BK / 8, B_CHUNKS = BK * BN / 8;   // 16-byte pieces
    static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0, "tiles");
    static_assert(BK % 16 == 0 && A_CHUNKS % NT == 0 && B_CHUNKS % NT == 0, "slab loads");

    __shared__ __align__(128) half_t As[STAGES][BM * LDA];
    __shared__ __align__(128) half_t Bs[STAGES][BK * LDB];

    const int tid = threadIdx.x, warp = tid >> 5;
    const int wm = (warp / WARPS_N) * WM, wn = (warp % WARPS_N) * WN;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int T = K / BK;

    auto load_slab = [&](int t, int stage) {
        const half_t* ag = a + (size_t)m0 * K + t * BK;
#pragma unroll
        for (int i = 0; i < A_CHUNKS / NT; ++i) {
            const int ch = tid + i * NT, row = ch / (BK / 8), col = (ch % (BK / 8)) * 8;
            cp_async16(&As[stage][row * LDA + col], ag + (size_t)row * K + col);
        }
        const half_t* bg = b + (size_t)t * BK * N + n0;
#pragma unroll
        for (int i = 0; i < B_CHUNKS / NT; ++i) {
            const int ch = tid + i * NT, row = ch / (BN / 8), col = (ch % (BN / 8)) * 8;
            cp_async16(&Bs[stage][row * LDB + col], bg + (size_t)row * N + col);
        }
    };

    FragC acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) frag_zero(acc[i][j]);

#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
        if (st < T) load_slab(st, st);
        cp_async_commit();
    }
    for (int t = 0; t < T; ++t) {
        cp_async_wait<STAGES - 2>();   // slab t has landed (this thread's copies) ...
        __syncthreads();               // ... everybody's; and slab t-1 is no longer read
        if (t + STAGES - 1 < T) load_slab(t + STAGES - 1, (t + STAGES - 1) % STAGES);
        cp_async_commit();
        const half_t* as = to_shared(&As[t % STAGES][0]);
        const half_t* bs = to_shared(&Bs[t % STAGES][0]);
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            FragAB fa[FM], fb[FN];
#pragma unroll
            for (int i = 0; i < FM; ++i) load_a_row_s(fa[i], as + (wm + 16 * i) * LDA + kk, LDA);
#pragma unroll
            for (int j = 0; j < FN; ++j) load_b_row_s(fb[j], bs + kk * LDB + wn + 16 * j, LDB);
#pragma unroll
            for (int i = 0; i < FM; ++i)
#pragma unroll
                for (int j = 0; j < FN; ++j) mma_row_row(acc[i][j], fa[i], fb[j]);
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j)
            store_c(c + (size_t)(m0 + wm + 16 * i) * N + n0 + wn + 16 * j, acc[i][j], N);
}

// ---------------------------------------------------------------------------------------
// Implicit-GEMM convolution. Y[k, j] = sum_l Wt[l, k] * X[l, j]: k a filter, j = (n, p, q)
// an output pixel, l = (r, s, c) the reduction index.

// fp32 x -> fp16 (round to nearest even)
extern "C" __global__ void to_half(const float* __restrict__ x, half_t* __restrict__ y,
                                   long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = f32_to_f16(x[i]);
}

// wt[((r*S + s)*Cp + c)*Kp + k] = fp16(w[k, c, r, s]), zero where c >= C or k >= K.
// W_HALF: w is already fp16 (bits copied) instead of fp32.
template <bool W_HALF>
__global__ void pack_filters(const void* __restrict__ w, half_t* __restrict__ wt,
                             int K, int C, int R, int S, int Cp, int Kp) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= R * S * Cp * Kp) return;
    int k = i % Kp, rest = i / Kp;
    int c = rest % Cp, rs = rest / Cp;
    int r = rs / S, s = rs % S;
    half_t v = 0;
    if (k < K && c < C) {
        size_t src = ((size_t)(k * C + c) * R + r) * S + s;
        v = W_HALF ? static_cast<const half_t*>(w)[src]
                   : f32_to_f16(static_cast<const float*>(w)[src]);
    }
    wt[i] = v;
}

template <int BM, int BN, int BK, int WM, int WN>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32)
wmma_conv(const half_t* __restrict__ x, const half_t* __restrict__ wt, float* __restrict__ y,
          int N, int C, int H, int W, int K, int R, int S, int P, int Q,
          int sh, int sw, int ph, int pw, int dh, int dw, int Cp, int Kp)
{
    constexpr int WARPS_N = BN / WN;
    constexpr int NW = (BM / WM) * WARPS_N, NT = NW * 32;
    constexpr int FM = WM / 16, FN = WN / 16;
    constexpr int LDA = BM + 8, LDB = BN + 8;       // padded rows (halves)
    constexpr int A_CHUNKS = BK * BM / 8;           // 16-byte pieces of a filter slab
    constexpr int A_PER = (A_CHUNKS + NT - 1) / NT;
    constexpr int B_STEP = NT / BN;                 // threads per pixel column
    constexpr int B_PER = BK / B_STEP;              // halves per thread per slab
    constexpr int LDC = 20;                         // staging tile pitch (floats)
    static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0, "tiles");
    static_assert(NT % BN == 0 && BK % B_STEP == 0 && BK % 16 == 0, "slab loads");

    __shared__ __align__(128) half_t As[2][BK * LDA];     // As[l][m]: A col-major
    __shared__ __align__(128) half_t Bs[2][BK * LDB];     // Bs[l][j]: B row-major
    __shared__ __align__(128) float Cs[NW][16 * LDC];     // one 16x16 tile per warp

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = (warp / WARPS_N) * WM, wn = (warp % WARPS_N) * WN;
    const int k0 = blockIdx.y * BM, j0 = blockIdx.x * BN;
    const int PQ = P * Q, HW = H * W, NPQ = N * PQ;
    const int CT = Cp / BK;                // slabs per filter tap
    const int T = R * S * CT;

    // this thread's pixel column (clamped: columns past the end are computed, never stored)
    const int b_n = tid % BN, b_kk = tid / BN;
    const int j = min(j0 + b_n, NPQ - 1);
    const int img = j / PQ, pq = j - img * PQ, p = pq / Q, q = pq - p * Q;
    const int h_base = p * sh - ph, w_base = q * sw - pw;
    const half_t* x_img = x + (size_t)img * C * HW;

    uint4 a_reg[A_PER];
    half_t b_reg[B_PER];
    int ld_t = 0, ld_c0 = 0, ld_r = 0, ld_s = 0;   // the next slab to load

    auto load_regs = [&]() {
        const half_t* a_src = wt + (size_t)ld_t * BK * Kp + k0;
#pragma unroll
        for (int i = 0; i < A_PER; ++i) {
            const int ch = tid + i * NT;
            if (A_CHUNKS % NT == 0 || ch < A_CHUNKS) {
                const int kk = ch / (BM / 8), m8 = (ch % (BM / 8)) * 8;
                a_reg[i] = *reinterpret_cast<const uint4*>(a_src + (size_t)kk * Kp + m8);
            }
        }
        const int h = h_base + ld_r * dh, w = w_base + ld_s * dw;
        const bool inside = (unsigned)h < (unsigned)H && (unsigned)w < (unsigned)W;
        const half_t* b_src = x_img + (size_t)(ld_c0 + b_kk) * HW + (inside ? h * W + w : 0);
#pragma unroll
        for (int i = 0; i < B_PER; ++i) {
            const bool ok = inside && (ld_c0 + b_kk + i * B_STEP < C);
            b_reg[i] = ok ? b_src[(size_t)i * B_STEP * HW] : (half_t)0;
        }
        ++ld_t;
        ld_c0 += BK;
        if (ld_c0 >= Cp) { ld_c0 = 0; if (++ld_s == S) { ld_s = 0; ++ld_r; } }
    };
    auto store_regs = [&](int stage) {
#pragma unroll
        for (int i = 0; i < A_PER; ++i) {
            const int ch = tid + i * NT;
            if (A_CHUNKS % NT == 0 || ch < A_CHUNKS) {
                const int kk = ch / (BM / 8), m8 = (ch % (BM / 8)) * 8;
                *reinterpret_cast<uint4*>(&As[stage][kk * LDA + m8]) = a_reg[i];
            }
        }
#pragma unroll
        for (int i = 0; i < B_PER; ++i) Bs[stage][(b_kk + i * B_STEP) * LDB + b_n] = b_reg[i];
    };

    FragC acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int jj = 0; jj < FN; ++jj) frag_zero(acc[i][jj]);

    load_regs();
    store_regs(0);
    __syncthreads();
    for (int t = 0; t < T; ++t) {
        const int stage = t & 1;
        if (t + 1 < T) load_regs();          // the next slab travels while we multiply
        const half_t* as = to_shared(&As[stage][0]);
        const half_t* bs = to_shared(&Bs[stage][0]);
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            FragAB fa[FM], fb[FN];
#pragma unroll
            for (int i = 0; i < FM; ++i) load_a_col_s(fa[i], as + kk * LDA + wm + 16 * i, LDA);
#pragma unroll
            for (int jj = 0; jj < FN; ++jj) load_b_row_s(fb[jj], bs + kk * LDB + wn + 16 * jj, LDB);
#pragma unroll
            for (int i = 0; i < FM; ++i)
#pragma unroll
                for (int jj = 0; jj < FN; ++jj) mma_col_row(acc[i][jj], fa[i], fb[jj]);
        }
        if (t + 1 < T) store_regs(stage ^ 1);   // last read in iteration t-1: free
        __syncthreads();
    }

    // epilogue: each warp stages one 16x16 tile at a time and writes y[n, k, p, q]
    float* cs = &Cs[warp][0];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int jj = 0; jj < FN; ++jj) {
            store_c_s(to_shared(cs), acc[i][jj], LDC);
            __syncwarp();
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const int idx = lane + 32 * e, row = idx >> 4, col = idx & 15;
                const int k = k0 + wm + 16 * i + row, jo = j0 + wn + 16 * jj + col;
                if (k < K && jo < NPQ) {
                    const int n = jo / PQ, o = jo - n * PQ;
                    y[((size_t)n * K + k) * PQ + o] = cs[row * LDC + col];
                }
            }
            __syncwarp();
        }
}
"""


# ----------------------------------------------------------------------------------------
# Tile shapes


@dataclass(frozen=True)
class GemmConfig:
    """Block tile BM x BN, slabs of BK, warp tile WM x WN, STAGES slabs in flight."""

    BM: int = 128
    BN: int = 128
    BK: int = 32
    WM: int = 64
    WN: int = 32
    STAGES: int = 2

    @property
    def warps(self) -> int:
        return (self.BM // self.WM) * (self.BN // self.WN)

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def name_expression(self) -> str:
        return (f"wmma_gemm_tiled<{self.BM}, {self.BN}, {self.BK}, {self.WM}, {self.WN}, "
                f"{self.STAGES}>")

    def smem_bytes(self) -> int:
        return 2 * self.STAGES * (self.BM * (self.BK + 8) + self.BK * (self.BN + 8))

    def validate(self):
        _check_tile(self)
        if self.BM * self.BK // 8 % self.threads or self.BK * self.BN // 8 % self.threads:
            raise ValueError(f"{self}: every thread must copy the same number of 16-byte "
                             "pieces of a slab")
        if self.STAGES < 2 or self.smem_bytes() > 48 * 1024:
            raise ValueError(f"{self}: STAGES >= 2 and at most 48 KB of shared memory "
                             f"(needs {self.smem_bytes()} bytes)")
        return self

    def __str__(self):
        return f"{self.BM}x{self.BN}x{self.BK} warp {self.WM}x{self.WN} s{self.STAGES}"


@dataclass(frozen=True)
class ConvConfig:
    """Block tile BM filters x BN output pixels, slabs of BK channels, warp tile WM x WN."""

    BM: int = 64
    BN: int = 128
    BK: int = 32
    WM: int = 32
    WN: int = 32

    @property
    def warps(self) -> int:
        return (self.BM // self.WM) * (self.BN // self.WN)

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def name_expression(self) -> str:
        return f"wmma_conv<{self.BM}, {self.BN}, {self.BK}, {self.WM}, {self.WN}>"

    def smem_bytes(self) -> int:
        return 2 * 2 * self.BK * (self.BM + 8 + self.BN + 8) + 4 * self.warps * 16 * 20

    def validate(self):
        _check_tile(self)
        if self.threads % self.BN or self.threads < self.BN or (
                self.BK % (self.threads // self.BN)):
            raise ValueError(f"{self}: the threads must cover the BN pixel columns evenly "
                             f"({self.threads} threads, BN={self.BN}, BK={self.BK})")
        if self.smem_bytes() > 48 * 1024:
            raise ValueError(f"{self}: at most 48 KB of shared memory "
                             f"(needs {self.smem_bytes()} bytes)")
        return self

    def __str__(self):
        return f"{self.BM}x{self.BN}x{self.BK} warp {self.WM}x{self.WN}"


def _check_tile(cfg):
    for v, what in ((cfg.BM, "BM"), (cfg.BN, "BN"), (cfg.BK, "BK"), (cfg.WM, "WM"),
                    (cfg.WN, "WN")):
        if v < 16 or v & (v - 1):
            raise ValueError(f"{what} must be a power of two >= 16 (fragments are 16x16), "
                             f"got {v}")
    if cfg.BM % cfg.WM or cfg.BN % cfg.WN:
        raise ValueError(f"{cfg}: the warp tile must divide the block tile")
    if not 1 <= cfg.warps <= 16:
        raise ValueError(f"{cfg}: {cfg.warps} warps per block (1 to 16 allowed)")


GEMM_DEFAULT = GemmConfig()
CONV_DEFAULT = ConvConfig()
GEMM_CANDIDATES = [
    GemmConfig(128, 128, 32, 64, 32, 2), GemmConfig(128, 128, 32, 32, 64, 2),
    GemmConfig(128, 128, 16, 64, 32, 3), GemmConfig(128, 128, 16, 64, 64, 4),
    GemmConfig(128, 256, 16, 64, 64, 3), GemmConfig(64, 128, 32, 32, 32, 3),
]
CONV_CANDIDATES = [
    ConvConfig(64, 128, 32, 32, 32), ConvConfig(64, 128, 16, 32, 32),
    ConvConfig(128, 128, 32, 64, 32), ConvConfig(128, 64, 32, 32, 32),
    ConvConfig(64, 64, 32, 32, 32), ConvConfig(128, 128, 16, 32, 64),
]

# ----------------------------------------------------------------------------------------
# Compiling (CuPy on a GPU; NVRTC alone without one)

_HELPERS = ("wmma_gemm_simple", "to_half", "pack_filters<false>", "pack_filters<true>")
_MODULES: dict = {}


def _names(configs) -> tuple:
    return tuple(sorted({c.name_expression for c in configs} | {GEMM_DEFAULT.name_expression,
                                                                CONV_DEFAULT.name_expression}
                        | set(_HELPERS)))


def _module(configs=()):
    """One CuPy RawModule with the requested template instantiations (cached)."""
    import cupy as cp

    names = _names(configs)
    for key, mod in _MODULES.items():
        if set(names) <= set(key):
            return mod
    mod = cp.RawModule(code=CUDA_SOURCE, options=("-std=c++17",), name_expressions=names)
    _MODULES[names] = mod
    return mod


def require_tensor_cores():
    """Raise Unsupported unless this GPU has fp16 tensor cores (compute capability 7.0+).
    Before 8.0 (V100, T4) the tiled GEMM copies slabs through registers (no cp.async)."""
    import cupy as cp

    cc = cp.cuda.Device().compute_capability
    if int(cc) < 70:
        raise Unsupported(f"WMMA needs compute capability 7.0 or higher (tensor cores); this "
                          f"GPU has {cc[:-1]}.{cc[-1]}")
    return int(cc)


def compile_ptx(configs=(GEMM_DEFAULT, CONV_DEFAULT), arch: str = "compute_80") -> str:
    """Compile CUDA_SOURCE with NVRTC for `arch` (no GPU needed); return the PTX.

    Raises RuntimeError with NVRTC's log if the source does not compile.
    """
    from ._nvrtc import nvrtc_ptx

    return nvrtc_ptx(CUDA_SOURCE, "wmma01.cu", _names(configs), arch)


# ----------------------------------------------------------------------------------------
# Launchers


def _dtype(a) -> np.dtype:
    d = a.dtype
    if not isinstance(d, np.dtype) and hasattr(d, "itemsize") and "float16" in str(d):
        return np.dtype(np.float16)  # torch.float16
    if "float32" in str(d):
        return np.dtype(np.float32)
    return np.dtype(d) if isinstance(d, np.dtype) else np.dtype(str(d).replace("torch.", ""))


def _contiguous(name, label, a):
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None and cai.get("strides") not in (None, ()):
        item = _dtype(a).itemsize
        expect, s = [], item
        for n in reversed(a.shape):
            expect.insert(0, s)
            s *= n
        if tuple(cai["strides"]) != tuple(expect):
            raise Unsupported(f"{name}: {label} must be C-contiguous")


@launcher
def gemm_wmma_raw(a, b, out, cfg: GemmConfig | None = None, simple: bool = False):
    """C = A @ B on tensor cores: a (M, K) and b (K, N) fp16, out (M, N) fp32, device arrays.

    The tiled kernel needs M, N, K multiples of the tile (BM, BN, BK); ``simple=True``
    uses one warp per 16x16 tile. Without a `cfg`, shapes that are multiples of 16 but
    not of the default tile take the simple kernel; other shapes are refused (an explicit
    `cfg` the shape does not fit, too): `gemm_fp16` pads them.
    """
    name = "gemm_wmma"
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"{name}: shapes {tuple(a.shape)} @ {tuple(b.shape)} do not chain")
    M, K = a.shape
    N = b.shape[1]
    if tuple(out.shape) != (M, N):
        raise ValueError(f"{name}: out has shape {tuple(out.shape)}, expected {(M, N)}")
    for label, arr, want in (("a", a, np.float16), ("b", b, np.float16),
                             ("out", out, np.float32)):
        if _dtype(arr) != want:
            raise TypeError(f"{name}: {label} must be {np.dtype(want).name}, got {arr.dtype}")
        _contiguous(name, label, arr)
    if M % 16 or N % 16 or K % 16:
        raise Unsupported(f"{name}: M, N, K must be multiples of 16, got {M}, {N}, {K} "
                          "(gemm_fp16 pads)")
    explicit = cfg is not None
    cfg = (cfg or GEMM_DEFAULT).validate()
    if max(M * K, K * N, M * N) >= 2**31:
        raise Unsupported(f"{name}: matrices must have fewer than 2**31 elements")
    tiled = not simple and M % cfg.BM == 0 and N % cfg.BN == 0 and K % cfg.BK == 0
    if explicit and not simple and not tiled:
        raise Unsupported(f"{name}: tile {cfg} needs M, N, K multiples of {cfg.BM}, "
                          f"{cfg.BN}, {cfg.BK}; got {M}, {N}, {K}")
    require_tensor_cores()
    mod = _module([cfg])
    i32 = np.int32
    args = (np.uint64(_ptr(a)), np.uint64(_ptr(b)), np.uint64(_ptr(out)), i32(M), i32(N),
            i32(K))
    if tiled:
        fn = mod.get_function(cfg.name_expression)
        fn((N // cfg.BN, M // cfg.BM), (cfg.threads,), args)
    else:
        fn = mod.get_function("wmma_gemm_simple")
        fn((N // 16, M // 16), (32,), args)
    return out


def gemm_fp16(a, b, cfg: GemmConfig | None = None):
    """A @ B (any shapes, fp32 or fp16, host or device) on tensor cores -> fp32 CuPy array.

    Inputs are rounded to fp16 and zero-padded to the tile; the product is accumulated in
    fp32 and cut back to (M, N).
    """
    import cupy as cp

    cfg = cfg or GEMM_DEFAULT
    a, b = cp.asarray(a), cp.asarray(b)
    M, K = a.shape
    N = b.shape[1]
    Mp, Np, Kp = (ceil_div(M, cfg.BM) * cfg.BM, ceil_div(N, cfg.BN) * cfg.BN,
                  ceil_div(K, cfg.BK) * cfg.BK)
    ap = cp.zeros((Mp, Kp), cp.float16)
    bp = cp.zeros((Kp, Np), cp.float16)
    ap[:M, :K] = a.astype(cp.float16)
    bp[:K, :N] = b.astype(cp.float16)
    c = cp.empty((Mp, Np), cp.float32)
    gemm_wmma_raw(ap, bp, c, cfg)
    return c[:M, :N]


_PLANS: dict = {}


def _plan(x, w, out, stride, padding, dilation, groups, cfg: ConvConfig):
    """Everything a conv launch needs (packed-filter buffer, grid, arguments), cached."""
    from ..reference import conv_params

    name = "conv2d_wmma"
    try:
        key = (tuple(x.shape), tuple(w.shape), tuple(out.shape), str(x.dtype), str(w.dtype),
               stride, padding, dilation, groups, cfg)
        plan = _PLANS.get(key)
    except TypeError:
        key, plan = None, None
    if plan is not None:
        return plan
    for label, arr, ok in (("x", x, (np.float16, np.float32)), ("w", w, (np.float16,
                                                                       np.float32)),
                           ("out", out, (np.float32,))):
        if arr is None or not hasattr(arr, "shape"):
            raise TypeError(f"{name}: {label} must be a device array")
        if _dtype(arr) not in [np.dtype(t) for t in ok]:
            raise TypeError(f"{name}: {label} must be "
                            f"{' or '.join(np.dtype(t).name for t in ok)}, got {arr.dtype}")
        _contiguous(name, label, arr)
    if groups != 1:
        raise Unsupported(f"{name} does not support groups={groups} (only 1)")
    p = conv_params(tuple(x.shape), tuple(w.shape), stride, padding, dilation, groups)
    if tuple(out.shape) != p.out_shape:
        raise ValueError(f"{name}: out has shape {tuple(out.shape)}, expected {p.out_shape}")
    cfg.validate()
    if max(p.N * p.C * p.H * p.W, p.N * p.K * p.P * p.Q, p.R * p.S * p.C * p.K) >= 2**31:
        raise Unsupported(f"{name} uses 32-bit indices: tensors must have fewer than 2**31 "
                          "elements")
    import cupy as cp

    require_tensor_cores()
    mod = _module([cfg])
    Cp = ceil_div(p.C, cfg.BK) * cfg.BK
    Kp = ceil_div(p.K, cfg.BM) * cfg.BM
    n_wt = p.R * p.S * Cp * Kp
    grid = (ceil_div(p.N * p.P * p.Q, cfg.BN), ceil_div(p.K, cfg.BM))
    if grid[1] > 65535:
        raise Unsupported(f"K={p.K} needs {grid[1]} block rows; CUDA allows 65535")
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
    i32 = np.int32
    w_half = _dtype(w) == np.float16
    plan = dict(
        p=p, wt=cp.empty(n_wt, dtype=cp.float16),
        xh=None if _dtype(x) == np.float16 else cp.empty(x.shape, dtype=cp.float16),
        pack=mod.get_function(f"pack_filters<{'true' if w_half else 'false'}>"),
        pack_grid=(ceil_div(n_wt, 256),),
        pack_tail=tuple(i32(v) for v in (p.K, p.C, p.R, p.S, Cp, Kp)),
        to_half=mod.get_function("to_half"),
        fn=mod.get_function(cfg.name_expression), grid=grid, block=(cfg.threads,),
        tail=tuple(i32(v) for v in (p.N, p.C, p.H, p.W, p.K, p.R, p.S, p.P, p.Q, sh, sw, ph,
                                    pw, dh, dw, Cp, Kp)))
    if key is not None:
        if len(_PLANS) > 64:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def make_conv_launcher(cfg: ConvConfig = CONV_DEFAULT, name: str = "conv2d_wmma"):
    """A conv launcher (common signature; x and w may be fp16 or fp32, out fp32) with one
    tile configuration. fp32 x is rounded to fp16 on the GPU first (one more pass)."""
    cfg.validate()

    @launcher
    def conv2d_wmma(x, w, out, stride=1, padding=0, dilation=1, groups=1):
        plan = _plan(x, w, out, stride, padding, dilation, groups, cfg)
        u64 = np.uint64
        xp = _ptr(x)
        if plan["xh"] is not None:  # fp32 input: round it to fp16 first
            n = int(np.prod(x.shape))
            plan["to_half"]((ceil_div(n, 256),), (256,),
                            (u64(xp), plan["xh"], np.int64(n)))
            xp = plan["xh"].data.ptr
        plan["pack"](plan["pack_grid"], (256,), (u64(_ptr(w)), plan["wt"], *plan["pack_tail"]))
        plan["fn"](plan["grid"], plan["block"],
                   (u64(xp), plan["wt"], u64(_ptr(out)), *plan["tail"]))
        return out

    conv2d_wmma.__name__ = name
    conv2d_wmma.config = cfg
    return conv2d_wmma


def choose_conv(K: int) -> ConvConfig:
    """Tile rule: 64 filters per block when the layer has 64 or fewer, else 128."""
    return ConvConfig(64, 128, 32, 32, 32) if K <= 64 else ConvConfig(128, 128, 32, 64, 32)


_BY_CONFIG: dict = {}


@launcher
def conv2d_wmma(x, w, out, stride=1, padding=0, dilation=1, groups=1):
    """The tensor-core implicit GEMM with the tile `choose_conv` picks for this layer."""
    cfg = choose_conv(int(w.shape[0]))
    launch = _BY_CONFIG.get(cfg) or _BY_CONFIG.setdefault(cfg, make_conv_launcher(cfg))
    return launch(x, w, out, stride=stride, padding=padding, dilation=dilation, groups=groups)


def source(start: str | None = None, end: str | None = None) -> str:
    """Lines of CUDA_SOURCE from the first containing `start` up to (not including) the
    first later one containing `end` (for showing a kernel in a notebook)."""
    lines = CUDA_SOURCE.strip("\n").splitlines()
    if start is not None:
        lines = lines[next(i for i, ln in enumerate(lines) if start in ln):]
    if end is not None:
        lines = lines[:next((i for i, ln in enumerate(lines) if i > 0 and end in ln),
                            len(lines))]
    return "\n".join(lines)
