// Tensor cores through mma.sync (sm_80+): a GEMM and an implicit-GEMM convolution.
//
// C (M x N, fp32 or fp16) = A (M x Kd) @ B^T, where B is stored N x Kd ("K-major", the
// layout conv filters already have as (K, R, S, C)). Inputs fp16 (or bf16 with -DBF16=1),
// products exact, sums in fp32.
//
// One block computes BM x BN of C; each warp WM x WN of it, as (WM/16) x (WN/8) tiles of
// mma.sync.m16n8k16 (fp32 accumulators: 4 per thread per tile). Per slab of BK along Kd,
// A (BM x BK) and B (BN x BK) sit in shared memory as rows of BK halves; ldmatrix.x4 loads
// four 8x8 matrices per instruction straight into the fragment registers mma.sync wants.
//
// Compile-time switches (the lesson-12 ladder, one step each):
//   ASYNC=0    global -> registers -> shared, two buffers (the classic double buffer)
//   ASYNC=1    cp.async 16-byte copies, STAGES slabs in flight (wait_group STAGES-2)
//   SWIZZLE=0  rows padded by 8 halves (ldmatrix's 8 row addresses hit 8 bank groups)
//   SWIZZLE=1  no padding: 16-byte chunk c of row r is stored at chunk c ^ (r % 8) inside
//              its 128-byte line (rows of 8, 16.. chunks) or, for 4-chunk rows, XOR over
//              128-byte lines
//   CONV=1     A is gathered from an NHWC input (implicit GEMM: row m = output pixel
//              (n, p, q), column kd = (r, s, c)); padding comes from zero-filled copies
//   OUT_F16=1  C stored as fp16 (else fp32)
// and three scheduling switches (ASYNC=1 only; off by default):
//   FRAG_PIPE=1  two sets of fragment registers: the ldmatrix of step kk + 1 is issued
//                before the mma.sync of step kk, across slab boundaries too (the wait and
//                the barrier move to just before the last step's mma.sync); BK 32, 64 or
//                128 with the swizzle
//   GPTR=1       GEMM loads from per-thread pointers computed once, advanced by BK per
//                slab; rows past M (N) read row M - 1 (N - 1), whose products land only in
//                rows (columns) of C that are never stored: no row check per chunk, only
//                the Kd tail check (ignored with CONV=1, whose gather has its own state)
//   SERPENTINE=1 mma.sync of a step in snake order (j reversed on odd i), so consecutive
//                mma.sync share their B fragment
//   TAPS=1       CONV with C % BK == 0 and R * S <= 32: every slab lies inside one filter
//                tap (r, s), so the gather is GPTR's loader for the input: per row of A an
//                offset and a mask of the taps inside the image, computed once; per slab
//                one tap offset for the whole block. No division or bounds check per chunk
//   KSLICE=2     sliced K: each warp tile is computed by two warps, one taking the first
//                half of every slab's 16-deep steps, the other the second; their sums are
//                added through shared memory before the epilogue (twice the warps per
//                block for the same tile and registers per thread: more latency hidden
//                where one block per SM is all the grid has)
// one for the last wave (GEMM, FRAG_PIPE and GPTR):
//   STREAMK=1    stream-K: where the tiles leave the last wave part-empty (the launcher
//                decides: sk_tiles > 0), the grid is 1-D: blocks 0 .. n_dp - 1 take a whole
//                tile each, the last sk_blocks (at most one per SM: all resident at once)
//                an equal share of the remaining sk_tiles' slabs in (tile, slab) order. A
//                share shorter than a tile holds at most two segments: the head of one tile
//                (done first) and the tail of the one before. A segment that does not end its
//                tile leaves its fp32 sums in `work` and raises its flag; the one that ends it
//                waits for the flags of the blocks before it (lower indices only, which did
//                those shares first), adds their sums and stores C.
// and one epilogue switch:
//   EPI_SMEM=1   C staged per warp in shared memory (the pipeline's slots; the launcher's
//                MmaConfig.smem_bytes covers the staged rows), then stored as 16-byte row
//                chunks (element by element when N is not a multiple of 16 bytes)
// Limits (the launcher checks): Kd % 8 == 0 (16-byte chunks); CONV needs C % 8 == 0,
// TAPS C % BK == 0 and R * S <= 32.

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 32
#endif
#ifndef WM
#define WM 64
#endif
#ifndef WN
#define WN 64
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef ASYNC
#define ASYNC 1
#endif
#ifndef SWIZZLE
#define SWIZZLE 1
#endif
#ifndef CONV
#define CONV 0
#endif
#ifndef OUT_F16
#define OUT_F16 0
#endif
#ifndef BF16
#define BF16 0
#endif
#ifndef GROUP_M
#define GROUP_M 8
#endif
#ifndef FRAG_PIPE
#define FRAG_PIPE 0
#endif
#ifndef GPTR
#define GPTR 0
#endif
#ifndef SERPENTINE
#define SERPENTINE 0
#endif
#ifndef EPI_SMEM
#define EPI_SMEM 0
#endif
#ifndef TAPS
#define TAPS 0
#endif
#ifndef KSLICE
#define KSLICE 1
#endif
#ifndef STREAMK
#define STREAMK 0
#endif
#define SK_FLAGS 1024   // stream-K: flags first in `work`, then the shares' sums
#define USE_TAPS (TAPS && CONV)
#define USE_GPTR ((GPTR && !CONV) || USE_TAPS)

typedef unsigned short u16;  // fp16 / bf16 bits

#define MN_WARPS ((BM / WM) * (BN / WN))   // warps per slice of K
#define NWARPS (MN_WARPS * KSLICE)
#define KSTEPS (BK / 16 / KSLICE)   // 16-deep steps per warp and slab
#define NTHREADS (NWARPS * 32)
#define MI (WM / 16)
#define NI (WN / 8)
#define KCH (BK / 8)  // 16-byte chunks per shared-memory row
#if SWIZZLE
#define LDS BK
#else
#define LDS (BK + 8)
#endif
#define A_STAGE (BM * LDS)  // halves
#define B_STAGE (BN * LDS)
#define A_CHUNKS (BM * KCH)
#define B_CHUNKS (BN * KCH)
#if OUT_F16
#define OUT_T u16
#else
#define OUT_T float
#endif
#define EPAD 8   // elements of padding per staged output row (MmaConfig.EPI_PAD)
#define A_PER ((A_CHUNKS + NTHREADS - 1) / NTHREADS)
#define B_PER ((B_CHUNKS + NTHREADS - 1) / NTHREADS)

static_assert(BM % WM == 0 && BN % WN == 0, "warps must tile the block");
static_assert(WM % 16 == 0 && WN % 16 == 0 && BK % 16 == 0, "mma tiles are 16 x 8 x 16");
static_assert(!SWIZZLE || KCH == 4 || KCH % 8 == 0,
              "the swizzle needs rows of 64 bytes or of whole 128-byte lines (BK 32, 64, 128..)");
static_assert(ASYNC || STAGES == 2, "register staging uses two buffers");
static_assert(!FRAG_PIPE || (ASYNC && KSTEPS % 2 == 0 &&
                             (!SWIZZLE || BK == 32 || BK == 64 || BK == 128)),
              "fragment double buffering: cp.async, an even number of 16-deep steps per "
              "warp, and BK 32, 64 or 128 with the swizzle");
static_assert(KSLICE >= 1 && (BK / 16) % KSLICE == 0, "K slices split each slab's steps");
static_assert(!USE_GPTR || (ASYNC && NTHREADS % KCH == 0 && A_CHUNKS % NTHREADS == 0 &&
                            B_CHUNKS % NTHREADS == 0),
              "per-thread pointers: cp.async, every thread the same column in every chunk");
static_assert(!STREAMK || (!CONV && FRAG_PIPE && USE_GPTR && KSLICE == 1),
              "stream-K: the GEMM with the fragment pipeline and per-thread pointers");

// Offset (in halves) of 16-byte chunk c of shared-memory row r.
__device__ __forceinline__ int smem_off(int r, int c) {
#if SWIZZLE
#if KCH >= 8
    return r * BK + ((c & ~7) | ((c ^ r) & 7)) * 8;
#else
    int idx = r * KCH + c, line = idx >> 3;
    return ((line << 3) | ((idx ^ line) & 7)) * 8;
#endif
#else
    return r * LDS + c * 8;
#endif
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
    // dst: a shared-memory address; src-size 0 writes sixteen zero bytes (the Kd tail, the
    // conv's padding)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}

__device__ __forceinline__ void ldsm_x4(unsigned* r, unsigned addr) {   // a shared address
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
#if BF16
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#endif
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Stream-K's flags, as CUTLASS's semaphores: every thread's sums are written before a
// __syncthreads, then one thread releases at GPU scope; the waiting block's one thread
// acquires, then a __syncthreads lets the others read.
__device__ __forceinline__ void flag_release(unsigned* f) {
    asm volatile("fence.acq_rel.gpu;\n st.relaxed.gpu.global.u32 [%0], %1;\n"
                 :: "l"(f), "r"(1u) : "memory");
}
__device__ __forceinline__ unsigned flag_acquire(const unsigned* f) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(f) : "memory");
    return v;
}

__device__ __forceinline__ unsigned pack_f16x2(float lo, float hi) {  // lo in the low half
    unsigned packed;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
}

// The accumulators' fragment layout: thread (g = lane / 4, t = lane % 4) holds rows g, g + 8
// and columns 2t, 2t + 1 of each 16 x 8 tile; f(r, c, v0, v1) for each pair of neighbours,
// r and c inside the warp's WM x WN tile (v0, v1 the accumulators themselves).
template <class F>
__device__ __forceinline__ void each_pair(float (&acc)[MI][NI][4], int lane, F f) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                f(i * 16 + g + h * 8, j * 8 + 2 * t, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
}

__device__ __forceinline__ void store_pair(OUT_T* d, float v0, float v1) {
#if OUT_F16
    *reinterpret_cast<unsigned*>(d) = pack_f16x2(v0, v1);
#else
    *reinterpret_cast<float2*>(d) = make_float2(v0, v1);
#endif
}

struct Problem {   // everything the loaders need; GEMM uses M, N, Kd only
    int M, N, Kd;
    int H, W, C, P, Q, S, sh, sw, ph, pw, dh, dw;
};

// Source of A's 16-byte chunk: row m, column kd (a multiple of 8). Sets `valid`.
__device__ __forceinline__ const u16* a_src(const u16* A, const Problem& pb, int m, int kd,
                                            bool& valid) {
    valid = m < pb.M && kd < pb.Kd;
    return valid ? A + (long long)m * pb.Kd + kd : A;
}

// Conv: what a thread keeps about one of the output pixels (rows of A) it loads, computed
// once: the image's offset in x and the top-left input corner of the pixel's window.
struct ConvRow { int base, h0, w0; };   // base < 0: the row is past M

__device__ __forceinline__ ConvRow conv_corner(const Problem& pb, int n, int p, int q) {
    return {n * pb.H * pb.W * pb.C, p * pb.sh - pb.ph, q * pb.sw - pb.pw};
}

__device__ __forceinline__ ConvRow conv_row(const Problem& pb, int m) {
    ConvRow cr = {-1, 0, 0};
    if (m < pb.M) {
        int q = m % pb.Q, t = m / pb.Q;
        cr = conv_corner(pb, t / pb.P, t % pb.P, q);
    }
    return cr;
}

// Conv: source of the chunk at column kd = (r, s, c) of row `cr` (zeros: padding, tails).
__device__ __forceinline__ const u16* conv_src(const u16* A, const Problem& pb, ConvRow cr,
                                               int kd, bool& valid) {
    int rs = kd / pb.C, c = kd - rs * pb.C, r = rs / pb.S, s = rs - r * pb.S;
    int h = cr.h0 + r * pb.dh, w = cr.w0 + s * pb.dw;
    valid = cr.base >= 0 && kd < pb.Kd && h >= 0 && h < pb.H && w >= 0 && w < pb.W;
    return valid ? A + cr.base + (h * pb.W + w) * pb.C + c : A;
}

__device__ __forceinline__ const u16* b_src(const u16* B, const Problem& pb, int n, int kd,
                                            bool& valid) {
    valid = n < pb.N && kd < pb.Kd;
    return valid ? B + (long long)n * pb.Kd + kd : B;
}

// Grouped rasterization: tile `bid` of nbm x nbn is block row bm, column bn; GROUP_M
// block rows share their B tiles in L2.
__device__ __forceinline__ void tile_of(int bid, int nbn, int nbm, int& bm, int& bn) {
    const int per_group = GROUP_M * nbn;
    const int first_m = (bid / per_group) * GROUP_M;
    const int gsz = min(nbm - first_m, GROUP_M);
    bm = first_m + (bid % per_group) % gsz;
    bn = (bid % per_group) / gsz;
}

extern "C" __global__ void __launch_bounds__(NTHREADS)
mma_sync_kernel(const u16* __restrict__ A, const u16* __restrict__ B, void* __restrict__ Cout,
                float* __restrict__ work, int M, int N, int Kd, int H, int W, int C, int P,
                int Q, int S, int sh, int sw, int ph, int pw, int dh, int dw, int sk_blocks,
                int sk_tiles) {
    const Problem pb = {M, N, Kd, H, W, C, P, Q, S, sh, sw, ph, pw, dh, dw};
    extern __shared__ __align__(256) u16 smem[];
    u16* As = smem;
    u16* Bs = smem + STAGES * A_STAGE;
    // the same, as shared-memory addresses (32 bits: the copies' and ldmatrix's arithmetic)
    const unsigned sA = smem_addr(As), sB = smem_addr(Bs);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int mn = warp % MN_WARPS, ks = warp / MN_WARPS;   // warp tile, slice of K
    const int wm = mn / (BN / WN), wn = mn % (BN / WN);
    const int k0 = ks * KSTEPS;   // this warp's first 16-deep step of every slab
    const int KT_TILE = (pb.Kd + BK - 1) / BK;   // slabs of a whole tile

#if STREAMK
    const int nbn = (pb.N + BN - 1) / BN, nbm = (pb.M + BM - 1) / BM;
    const int n_dp = nbn * nbm - sk_tiles, sk = (int)blockIdx.x - n_dp;   // sk < 0: whole
    auto sk_begin = [&](int s) {   // first slab of share s, in the sk_tiles' (tile, slab)
        return (int)((long long)s * sk_tiles * KT_TILE / sk_blocks);
    };
    unsigned* flags = reinterpret_cast<unsigned*>(work);
    float4* sums = reinterpret_cast<float4*>(work + SK_FLAGS);   // share s: MI NI x NTHREADS
    const int sa = sk < 0 ? 0 : sk_begin(sk), sb = sk < 0 ? KT_TILE : sk_begin(sk + 1);
    const int last = (sb - 1) / KT_TILE;   // the tile (of the sk_tiles) of this share's end
    const int nseg = sk < 0 ? 1 : 1 + (sa < last * KT_TILE);
#pragma unroll 1
    for (int seg = 0; seg < nseg; ++seg) {
        // segment 0: the tile of slab sb - 1, from max(sa, its first slab); 1: the tile
        // before it, from sa to its end
        const int t = last - seg, t0 = t * KT_TILE;
        const int tile = sk < 0 ? (int)blockIdx.x : n_dp + t;
        const int kbeg = sk < 0 ? 0 : max(sa, t0) - t0;
        const int kend = sk < 0 ? KT_TILE : min(sb, t0 + KT_TILE) - t0;
        // (the loop's body, to the kernel's end, is left unindented: one tile's segment)
#else
    const int nbn = gridDim.x, nbm = gridDim.y;
    {
        const int tile = blockIdx.y * nbn + blockIdx.x, kbeg = 0, kend = KT_TILE;
#endif
    const int KT = kend - kbeg;   // slabs of this block's part of the tile
    int bm, bn;
    tile_of(tile, nbn, nbm, bm, bn);

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#if USE_TAPS
    // the loader below
#elif CONV
    ConvRow rows[A_PER];
#pragma unroll
    for (int j = 0; j < A_PER; ++j) rows[j] = conv_row(pb, bm * BM + (tid + j * NTHREADS) / KCH);
    auto a_chunk = [&](int j, int kd, bool& ok) { return conv_src(A, pb, rows[j], kd, ok); };
#else
    auto a_chunk = [&](int j, int kd, bool& ok) {
        return a_src(A, pb, bm * BM + (tid + j * NTHREADS) / KCH, kd, ok);
    };
#endif

#if USE_GPTR
    // Chunk j of this thread is row r0 + j * RSTEP, column c8 of the slab, in A and in B
    // (NTHREADS % KCH == 0): one pointer per operand, advanced by BK per slab, the same
    // stride Kd * RSTEP for both operands; rows past M / N clamped to the last row.
    constexpr int RSTEP = NTHREADS / KCH;
    const int r0 = tid / KCH, c8 = (tid % KCH) * 8;
    const int gstep = RSTEP * pb.Kd;
    const u16* bg = B + (long long)min(bn * BN + r0, pb.N - 1) * pb.Kd + c8 + kbeg * BK;
    const int bjmax = max(0, min(B_PER - 1, (pb.N - 1 - (bn * BN + r0)) / RSTEP));
#if USE_TAPS
    // row j: the offset in x of its window's corner (tap 0, this thread's channels c8) and
    // bit r * S + s set where tap (r, s) lies inside the image (no bits: the row is past M);
    // the slab's tap (r, s) and channels c0: one offset tap_off, the same for every row.
    // Row j's pixel (n, p, q) is RSTEP pixels after row j - 1's: one division per block,
    // then carries; the taps' mask from S column bits and R row bits.
    int aoff[A_PER];
    unsigned taps[A_PER];
    const int R = pb.Kd / (pb.S * pb.C);
    const int m0 = bm * BM + r0, t0 = m0 / pb.Q;
    int q = m0 - t0 * pb.Q, p = t0 % pb.P, n = t0 / pb.P;
#pragma unroll
    for (int j = 0; j < A_PER; ++j) {
        const ConvRow cr = conv_corner(pb, n, p, q);
        aoff[j] = cr.base + (cr.h0 * pb.W + cr.w0) * pb.C + c8;
        unsigned cols = 0, t = 0;   // bit s: column w0 + s * dw inside the image
        for (int s = 0; s < pb.S; ++s) {
            const int w = cr.w0 + s * pb.dw;
            cols |= (unsigned)(w >= 0 && w < pb.W) << s;
        }
        for (int r = 0; r < R; ++r) {
            const int h = cr.h0 + r * pb.dh;
            if (h >= 0 && h < pb.H) t |= cols << (r * pb.S);
        }
        taps[j] = m0 + j * RSTEP < pb.M ? t : 0u;
        q += RSTEP;   // the next row's pixel
        while (q >= pb.Q) {
            q -= pb.Q;
            ++p;
        }
        while (p >= pb.P) {
            p -= pb.P;
            ++n;
        }
    }
    int tap = 0, tap_r = 0, tap_s = 0, tap_c = 0, tap_off = 0;   // of the next slab loaded
#else
    const u16* ag = A + (long long)min(bm * BM + r0, pb.M - 1) * pb.Kd + c8 + kbeg * BK;
    const int ajmax = max(0, min(A_PER - 1, (pb.M - 1 - (bm * BM + r0)) / RSTEP));
#endif
    // shared offsets: rows 16 apart keep the swizzle's XOR (see a_off below)
    const int s0 = smem_off(r0, tid % KCH);
    auto s_at = [&](int j) {
        return RSTEP % 16 == 0 ? s0 + j * RSTEP * LDS : smem_off(r0 + j * RSTEP, tid % KCH);
    };
    auto load_slab = [&](int slot, int kt) {   // slabs kt = kbeg, kbeg + 1, ... in order
        const bool kin = c8 < pb.Kd - kt * BK;   // the Kd tail
#if USE_TAPS
#pragma unroll
        for (int j = 0; j < A_PER; ++j) {
            const bool ok = (taps[j] >> tap) & 1;
            cp_async16(sA + 2 * (slot * A_STAGE + s_at(j)), ok ? A + aoff[j] + tap_off : A, ok);
        }
        tap_c += BK;
        tap_off += BK;
        if (tap_c == pb.C) {   // the next tap: (r, s + 1) or (r + 1, 0)
            tap_c = 0;
            ++tap;
            if (++tap_s == pb.S) {
                tap_s = 0;
                ++tap_r;
            }
            tap_off = (tap_r * pb.dh * pb.W + tap_s * pb.dw) * pb.C;
        }
#else
#pragma unroll
        for (int j = 0; j < A_PER; ++j)
            cp_async16(sA + 2 * (slot * A_STAGE + s_at(j)), ag + min(j, ajmax) * gstep, kin);
        ag += BK;
#endif
#pragma unroll
        for (int j = 0; j < B_PER; ++j)
            cp_async16(sB + 2 * (slot * B_STAGE + s_at(j)), bg + min(j, bjmax) * gstep, kin);
        bg += BK;
    };
#elif ASYNC
    auto load_slab = [&](int slot, int kt) {
#pragma unroll
        for (int j = 0; j < A_PER; ++j) {
            int i = tid + j * NTHREADS;
            if (A_CHUNKS % NTHREADS == 0 || i < A_CHUNKS) {
                int r = i / KCH, c = i % KCH;
                bool ok;
                const u16* src = a_chunk(j, kt * BK + c * 8, ok);
                cp_async16(sA + 2 * (slot * A_STAGE + smem_off(r, c)), src, ok);
            }
        }
#pragma unroll
        for (int j = 0; j < B_PER; ++j) {
            int i = tid + j * NTHREADS;
            if (B_CHUNKS % NTHREADS == 0 || i < B_CHUNKS) {
                int r = i / KCH, c = i % KCH;
                bool ok;
                const u16* src = b_src(B, pb, bn * BN + r, kt * BK + c * 8, ok);
                cp_async16(sB + 2 * (slot * B_STAGE + smem_off(r, c)), src, ok);
            }
        }
    };
#else
    uint4 ra[A_PER], rb[B_PER];
    auto fetch_slab = [&](int kt) {   // global -> registers
#pragma unroll
        for (int j = 0; j < A_PER; ++j) {
            int i = tid + j * NTHREADS;
            bool ok = false;
            const u16* src = A;
            if (A_CHUNKS % NTHREADS == 0 || i < A_CHUNKS)
                src = a_chunk(j, kt * BK + (i % KCH) * 8, ok);
            ra[j] = ok ? *reinterpret_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < B_PER; ++j) {
            int i = tid + j * NTHREADS;
            bool ok = false;
            const u16* src = B;
            if (B_CHUNKS % NTHREADS == 0 || i < B_CHUNKS)
                src = b_src(B, pb, bn * BN + i / KCH, kt * BK + (i % KCH) * 8, ok);
            rb[j] = ok ? *reinterpret_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
        }
    };
    auto store_slab = [&](int slot) {  // registers -> shared
#pragma unroll
        for (int j = 0; j < A_PER; ++j) {
            int i = tid + j * NTHREADS;
            if (A_CHUNKS % NTHREADS == 0 || i < A_CHUNKS)
                *reinterpret_cast<uint4*>(As + slot * A_STAGE + smem_off(i / KCH, i % KCH)) = ra[j];
        }
#pragma unroll
        for (int j = 0; j < B_PER; ++j) {
            int i = tid + j * NTHREADS;
            if (B_CHUNKS % NTHREADS == 0 || i < B_CHUNKS)
                *reinterpret_cast<uint4*>(Bs + slot * B_STAGE + smem_off(i / KCH, i % KCH)) = rb[j];
        }
    };
#endif

    // Where this lane's ldmatrix rows start, per 16-deep step kk (slot 0, first tile): the
    // i-th A tile and j-th B pair are 16 rows further (16 * LDS halves in every layout: the
    // swizzle's XOR depends on the row only through row % 8 or row / 2 % 8, which a shift
    // by 16 rows keeps), so the loop below adds constants only.
    int a_off[BK / 16], b_off[BK / 16];
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {   // (steps of other slices unused, folded away)
        a_off[kk] = smem_off(wm * WM + (lane & 15), kk * 2 + (lane >> 4));
        b_off[kk] = smem_off(wn * WN + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1));
    }
#if FRAG_PIPE
    // Step kk reads chunk 2 kk (+ the lane's half) of its rows: the swizzle XORs the chunk
    // index with 2 kk, the padding adds it, so one offset per lane and operand serves every
    // kk (fewer live registers beside the second set of fragments). The XOR goes on the
    // address, after the slot's base: it flips bits 5 to 4 + log2(BK / 16) only (bit 7
    // with BK = 128: chunk 8 onwards lies in the row's second line, which the swizzle
    // leaves in place), inside the 2 BK-byte rows the stages are aligned to.
    auto frag_base = [&](unsigned stage, int off0, int kk) {
        const unsigned p = stage + 2 * off0;
        return SWIZZLE ? p ^ (unsigned)(kk * 32) : p + kk * 32;
    };
#else
    auto frag_base = [&](unsigned stage, int off0, int kk) { return stage + 2 * off0; };
#endif

    // one 16-deep step: fragments of step kk of a slot, then MI x NI mma.sync on them
    auto load_frags = [&](unsigned (&af)[MI][4], unsigned (&bf)[NI / 2][4], int slot, int kk) {
        const unsigned as = frag_base(sA + 2 * slot * A_STAGE, FRAG_PIPE ? a_off[0] : a_off[kk], kk);
        const unsigned bs = frag_base(sB + 2 * slot * B_STAGE, FRAG_PIPE ? b_off[0] : b_off[kk], kk);
#pragma unroll
        for (int i = 0; i < MI; ++i)   // rows lane % 16, k-half lane / 16
            ldsm_x4(af[i], as + 2 * i * 16 * LDS);
#pragma unroll
        for (int j = 0; j < NI / 2; ++j)  // two n8 tiles (b0, b1 each) per ldmatrix.x4
            ldsm_x4(bf[j], bs + 2 * j * 16 * LDS);
    };
    auto mma_step = [&](const unsigned (&af)[MI][4], const unsigned (&bf)[NI / 2][4]) {
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int jj = 0; jj < NI; ++jj) {
                const int j = (SERPENTINE && (i & 1)) ? NI - 1 - jj : jj;
                mma16816(acc[i][j], af[i], bf[j / 2][(j & 1) * 2], bf[j / 2][(j & 1) * 2 + 1]);
            }
    };
    auto compute_slab = [&](int slot) {
#pragma unroll
        for (int kk = k0; kk < k0 + KSTEPS; ++kk) {
            unsigned af[MI][4], bf[NI / 2][4];
            load_frags(af, bf, slot, kk);
            mma_step(af, bf);
        }
    };

#if FRAG_PIPE
    // The copies run as in the plain loop (slab kt + STAGES - 1 issued at the start of slab
    // kt, into the slot of slab kt - 1); slab kt + 1 is waited for in the last step of slab
    // kt, whose fragments are then already in registers:
    //  - wait_group STAGES - 2, then the barrier: this thread's copies of slab kt + 1 have
    //    landed (slabs kt + 2 .. kt + STAGES - 1 may be in flight), after it everyone's;
    //  - every warp issues its last ldmatrix of slot rd (slab kt) in step KSTEPS - 2, before
    //    that barrier, and the copies of slab kt + STAGES into slot rd come after it (at
    //    the start of slab kt + 1), so no warp can still be reading a slot being written;
    //  - the copies are issued while one fragment set is dead (the other holds step 0).
    unsigned af[2][MI][4], bf[2][NI / 2][4];
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_slab(s, kbeg + s);
        cp_async_commit();
    }
    cp_async_wait<STAGES - 2>();
    __syncthreads();   // slab 0 landed for everyone
    load_frags(af[0], bf[0], 0, k0);
    int rd = 0, wr = STAGES - 1;   // slots of slab kt and of slab kt - 1
    for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {   // this warp's steps k0 + kk
            if (kk == 0) {
                if (kt + STAGES - 1 < KT) load_slab(wr, kbeg + kt + STAGES - 1);
                cp_async_commit();
            }
            if (kk == KSTEPS - 1) {
                cp_async_wait<STAGES - 2>();
                __syncthreads();   // slab kt + 1 landed; nobody reads slot rd any more
                const int nx = rd + 1 == STAGES ? 0 : rd + 1;
                if (kt + 1 < KT) load_frags(af[(kk + 1) & 1], bf[(kk + 1) & 1], nx, k0);
                wr = rd;
                rd = nx;
            } else {
                load_frags(af[(kk + 1) & 1], bf[(kk + 1) & 1], rd, k0 + kk + 1);
            }
            mma_step(af[kk & 1], bf[kk & 1]);
        }
    }
    cp_async_wait<0>();
#elif ASYNC
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_slab(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();   // slab kt landed for everyone; slot (kt-1) % STAGES is free
        int next = kt + STAGES - 1;
        if (next < KT) load_slab(next % STAGES, next);
        cp_async_commit();
        compute_slab(kt % STAGES);
    }
    cp_async_wait<0>();
#else
    fetch_slab(0);
    store_slab(0);
    __syncthreads();
    for (int kt = 0; kt < KT; ++kt) {
        if (kt + 1 < KT) fetch_slab(kt + 1);   // in flight while the tensor cores work
        compute_slab(kt & 1);
        if (kt + 1 < KT) store_slab((kt + 1) & 1);
        __syncthreads();
    }
#endif

#if STREAMK
    if (kend < KT_TILE) {   // not the tile's end: this share's sums to work, then the flag
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j)
                sums[((size_t)sk * MI * NI + i * NI + j) * NTHREADS + tid] =
                    make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]);
        __syncthreads();
        if (tid == 0) flag_release(flags + sk);
        continue;
    }
    // the tile's end: add the shares of the blocks before this one that lie in this tile
    for (int p = sk - 1; p >= 0 && sk_begin(p + 1) > t0; --p) {   // none if sk < 0
        if (tid == 0) {
            while (!flag_acquire(flags + p)) {
            }
            flags[p] = 0;   // consumed: zero again for the next launch
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j) {
                const float4 v = __ldcg(sums + ((size_t)p * MI * NI + i * NI + j) * NTHREADS + tid);
                acc[i][j][0] += v.x;
                acc[i][j][1] += v.y;
                acc[i][j][2] += v.z;
                acc[i][j][3] += v.w;
            }
    }
#endif
#if KSLICE > 1
    // the slices' sums: slices 1.. add theirs, in turn, into fp32 rows of the idle pipeline
    // buffers (one WM x (WN + EPAD) tile per warp tile, after the staging rows below), and
    // slice 0 adds them to its accumulators; only slice 0 stores C
    {
        constexpr int RLD = WN + EPAD;
        float* red = reinterpret_cast<float*>(smem) + ((EPI_SMEM ? MN_WARPS : 0) + mn) * WM * RLD;
        for (int s = 1; s < KSLICE; ++s) {
            __syncthreads();   // every ldmatrix done (s = 1), or slice 0 read slice s - 1
            if (ks == s)
                each_pair(acc, lane, [&](int r, int c, float v0, float v1) {
                    *reinterpret_cast<float2*>(red + r * RLD + c) = make_float2(v0, v1);
                });
            __syncthreads();
            if (ks == 0)
                each_pair(acc, lane, [&](int r, int c, float& v0, float& v1) {
                    const float2 v = *reinterpret_cast<const float2*>(red + r * RLD + c);
                    v0 += v.x;
                    v1 += v.y;
                });
        }
    }
    const bool stores = ks == 0;
#else
    const bool stores = true;
#endif
    const int row0 = bm * BM + wm * WM, col0 = bn * BN + wn * WN;
#if EPI_SMEM
    // through shared memory: each warp writes its tile into its own rows of the (now idle)
    // pipeline buffers, padded by EPAD elements (conflict-free for the fragment layout),
    // then stores whole rows in 16-byte chunks
    constexpr int ELD = WN + EPAD, VEC = 16 / (int)sizeof(OUT_T), CPR = WN / VEC;
    __syncthreads();   // every warp's last ldmatrix is done: the slots can be reused
    if (!stores) return;   // no barrier below
    OUT_T* cs = reinterpret_cast<OUT_T*>(smem) + mn * WM * ELD;
    each_pair(acc, lane, [&](int r, int c, float v0, float v1) {
        store_pair(cs + r * ELD + c, v0, v1);
    });
    __syncwarp();
    const bool vec_ok = pb.N % VEC == 0;   // 16-byte aligned rows
#pragma unroll
    for (int c = lane; c < WM * CPR; c += 32) {
        const int r = c / CPR, col = col0 + (c % CPR) * VEC, row = row0 + r;
        const OUT_T* src = cs + r * ELD + (c % CPR) * VEC;
        if (row >= pb.M || col >= pb.N) continue;
        OUT_T* d = reinterpret_cast<OUT_T*>(Cout) + (long long)row * pb.N + col;
        if (vec_ok) {   // then col + VEC <= N: col and N are multiples of VEC
            *reinterpret_cast<uint4*>(d) = *reinterpret_cast<const uint4*>(src);
        } else {
            for (int e = 0; e < VEC && col + e < pb.N; ++e) d[e] = src[e];
        }
    }
#else
    if (!stores) return;
    each_pair(acc, lane, [&](int r, int c, float v0, float v1) {
        const int row = row0 + r, col = col0 + c;
        if (row < pb.M && col < pb.N)
            store_pair(reinterpret_cast<OUT_T*>(Cout) + (long long)row * pb.N + col, v0, v1);
    });
#endif
#if STREAMK
    __syncthreads();   // the staged rows read before the next segment's copies
#endif
    }
}
