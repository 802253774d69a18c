// Implicit GEMM over the flat reduction index, filters read in place, NCHW float32:
//   y[n, k, p, q] = sum_l A[k, l] * B[l, j],  A = w as the (K, L) row-major matrix it is
//   (L = C*R*S, l = (c R + r) S + s), j = (n, p, q) an output pixel, B gathered from x.
// No weight transform, no memset, no second kernel: one launch per convolution.
// MODE 0: 1x1, no padding: B[c, j] = x[n, c, p sh, q sw] (contiguous rows for stride 1).
// MODE 1: anything else: B[l, j] = x[n, c, p sh - ph + r dh, q sw - pw + s dw], zero outside.
// A block computes BM filters x BN pixels (64 x 64, 32 x 64 or 32 x 32: NT0 = 64 threads per
// group), a thread TM x TN of them as (TM/4) x (TN/4) sub-blocks of 4 x 4, so its
// shared-memory reads are float4s. Slabs of BK reduction indices; the global loads of the
// next PREFETCH slabs wait in registers (PREFETCH sets) while this one is multiplied (two
// shared buffers, one barrier per slab): a slab's loads have PREFETCH slabs of work to
// arrive in, where a slab of a small tile is far shorter than a load's latency.
// Sliced K (KS groups of NT0 threads, KS = 1, 2 or 4): all KS * NT0 threads load each slab
// (1/KS of it each), group g multiplies its rows kk in [g BK/KS, (g+1) BK/KS) into its own
// TM x TN sums; after the reduction groups 1..KS-1 leave theirs in shared memory (over the
// slab buffers) and group 0 adds them in the order 1, 2, ..., KS-1, then stores. More warps
// per SM for the same grid, when the grid is too small to fill the GPU.
// Split-K (gridDim.z parts): part z reduces slabs [z T/Z, (z+1) T/Z) into its own slice of
// ws (y's layout); the last part of a tile to finish (a counter per tile) adds the slices
// in the order 0, 1, ..., Z-1 into y and resets the counter to zero for the next launch:
// the result does not depend on which part finishes first (run-to-run reproducible).
// flat_subsample: a strided 1x1 layer's input as the dense (N, C, P, Q) array it reads,
// xs[n, c, p, q] = x[n, c, p sh, q sw], for the launcher to run the GEMM at stride 1 on it
// (B rows as float4s instead of four scalar loads each).
// flags: 1 = A rows as float4 (L % 4 == 0, w aligned), 2 = B rows as float4 (MODE 0,
// stride 1, P*Q % 4 == 0, x aligned), 4 = y stored as float4 (P*Q % 4 == 0, y and ws aligned).

#ifndef __CUDACC__  // compiled for the CPU by the tests (blocks run one after the other)
inline void __threadfence() {}
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float __ldcg(const float* p) { return *p; }
inline float4 __ldcg(const float4* p) { return *p; }
#endif

#define BK 16
#ifndef PREFETCH
#define PREFETCH 2   // slabs whose loads are in flight (register sets)
#endif

// A thread's outputs: pixels jb..jb+3 of filter m for each sub-block (g, i). run4(i, g, o)
// where the four are one float4 at offset o, else one(i, g, e, o) for each pixel in range.
template <int BM, int BN, int TM, int NH, int MH, class Run4, class One>
__device__ __forceinline__ void each_output(int m0, int n0, int tx, int ty, int K, int PQ,
                                            int NPQ, bool y_vec, Run4 run4, One one) {
#pragma unroll
    for (int g = 0; g < NH; ++g) {
        const int jb = n0 + g * (BN / NH) + tx * 4;
        if (jb >= NPQ) continue;
        const int ib = jb / PQ, pb = jb - ib * PQ;
        const bool vec = y_vec && jb + 3 < NPQ;
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const int m = m0 + (i / 4) * (BM / MH) + ty * 4 + (i % 4);
            if (m >= K) continue;
            if (vec) {
                run4(i, g, ((size_t)ib * K + m) * PQ + pb);
            } else {
                int im = ib, pp = pb;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (jb + e < NPQ) one(i, g, e, ((size_t)im * K + m) * PQ + pp);
                    if (++pp == PQ) { pp = 0; ++im; }
                }
            }
        }
    }
}

#define FLAT_PARAMS const float* __restrict__ x, const float* __restrict__ w, \
    float* __restrict__ y, float* __restrict__ ws, int* __restrict__ counters, \
    int N, int C, int H, int W, int K, int R, int S, int P, int Q, \
    int sh, int sw, int ph, int pw, int dh, int dw, int slabs_per_part, int flags
#define FLAT_ARGS x, w, y, ws, counters, N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw, dh, dw, \
    slabs_per_part, flags
#define FLAT_THREADS(BM, BN, KS) \
    ((KS) * ((BM) / ((BM) >= 64 ? 8 : 4)) * ((BN) / ((BN) >= 64 ? 8 : 4)))

template <int BM, int BN, int MODE, int KS>
__device__ __forceinline__ void flat_igemm_body(FLAT_PARAMS)
{
    constexpr int TM = BM >= 64 ? 8 : 4, TN = BN >= 64 ? 8 : 4;   // outputs per thread
    constexpr int MH = TM / 4, NH = TN / 4;                         // 4 x 4 sub-blocks
    constexpr int TXN = BN / TN;                                     // threads along pixels
    constexpr int NT0 = (BM / TM) * TXN;          // threads of one group
    constexpr int NT = KS * NT0;
    constexpr int KG = BK / KS;                   // rows kk of a slab per group
    constexpr int A_PIECES = BM * BK / 4;         // float4 pieces of an A slab
    constexpr int A_F4 = (A_PIECES + NT - 1) / NT;  // ... per thread (fewer: some idle)
    constexpr int B_ROWS = NT / (BN / 4);         // rows of a B slab in one pass (> BK: idle)
    constexpr int B_F4 = (BK + B_ROWS - 1) / B_ROWS;
    static_assert(KS == 1 || KS == 2 || KS == 4, "sliced K: 1, 2 or 4 groups");
    static_assert(NT % (BN / 4) == 0, "a thread loads the same 4 pixels of every B row");

    // the slab buffers, and over them the partial sums of groups 1..KS-1 at the end
    union Smem {
        struct Slabs { float A[2][BK][BM]; float B[2][BK][BN]; } s;
        float part[(KS > 1 ? KS - 1 : 1) * BM * BN];
    };
    __shared__ __align__(16) Smem sm;
    __shared__ int s_last;
    auto& As = sm.s.A;
    auto& Bs = sm.s.B;

    const int tid = threadIdx.x;
    const int grp = KS == 1 ? 0 : tid / NT0, lt = KS == 1 ? tid : tid % NT0;
    const int tx = lt % TXN, ty = lt / TXN;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int L = C * R * S, HW = H * W, PQ = P * Q, NPQ = N * PQ, RS = R * S;
    const int T = (L + BK - 1) / BK;
    const int t0 = blockIdx.z * slabs_per_part, t1 = min(T, t0 + slabs_per_part);
    const bool a_vec = flags & 1, b_vec = flags & 2, y_vec = flags & 4;

    // the 4 pixels (columns) this thread loads, fixed for the whole reduction
    const int b_c4 = (tid % (BN / 4)) * 4, b_r = tid / (BN / 4);
    int xoff[4], h0[4], w0[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int j = n0 + b_c4 + e;
        const int img = j / PQ, pq = j - img * PQ, p = pq / Q, q = pq - p * Q;
        h0[e] = p * sh - ph;
        w0[e] = q * sw - pw;
        xoff[e] = j < NPQ ? img * C * HW + (MODE == 0 ? h0[e] * W + w0[e] : 0) : -1;
    }

    float4 ra[PREFETCH][A_F4], rb[PREFETCH][B_F4];   // slab t0 + i in set i % PREFETCH
    auto fetch = [&](int t, float4 (&ra)[A_F4], float4 (&rb)[B_F4]) {
        const int l0 = t * BK;
#pragma unroll
        for (int i = 0; i < A_F4; ++i) {
            const int idx = tid + i * NT, r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
            const int m = m0 + r, l = l0 + c;
            const float* src = w + (size_t)m * L + l;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if ((A_PIECES % NT == 0 || idx < A_PIECES) && m < K) {
                if (a_vec && l + 3 < L) {
                    v = *reinterpret_cast<const float4*>(src);
                } else {
                    if (l < L) v.x = src[0];
                    if (l + 1 < L) v.y = src[1];
                    if (l + 2 < L) v.z = src[2];
                    if (l + 3 < L) v.w = src[3];
                }
            }
            ra[i] = v;
        }
#pragma unroll
        for (int i = 0; i < B_F4; ++i) {
            const int l = l0 + b_r + i * B_ROWS;
            float e4[4] = {0.f, 0.f, 0.f, 0.f};
            if ((BK % B_ROWS == 0 || b_r + i * B_ROWS < BK) && l < L) {
                if (MODE == 0) {
                    if (b_vec) {
                        if (xoff[0] >= 0) {
                            const float4 v = *reinterpret_cast<const float4*>(
                                x + xoff[0] + (size_t)l * HW);
                            e4[0] = v.x; e4[1] = v.y; e4[2] = v.z; e4[3] = v.w;
                        }
                    } else {
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            if (xoff[e] >= 0) e4[e] = x[xoff[e] + (size_t)l * HW];
                    }
                } else {
                    const int c = l / RS, rs = l - c * RS, r = rs / S, s = rs - r * S;
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int h = h0[e] + r * dh, ww = w0[e] + s * dw;
                        if (xoff[e] >= 0 && (unsigned)h < (unsigned)H && (unsigned)ww < (unsigned)W)
                            e4[e] = x[xoff[e] + c * HW + h * W + ww];
                    }
                }
            }
            rb[i] = make_float4(e4[0], e4[1], e4[2], e4[3]);
        }
    };
    auto store = [&](int buf, const float4 (&ra)[A_F4], const float4 (&rb)[B_F4]) {
#pragma unroll
        for (int i = 0; i < A_F4; ++i) {
            const int idx = tid + i * NT, r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
            if (A_PIECES % NT != 0 && idx >= A_PIECES) continue;
            As[buf][c + 0][r] = ra[i].x;
            As[buf][c + 1][r] = ra[i].y;
            As[buf][c + 2][r] = ra[i].z;
            As[buf][c + 3][r] = ra[i].w;
        }
#pragma unroll
        for (int i = 0; i < B_F4; ++i)
            if (BK % B_ROWS == 0 || b_r + i * B_ROWS < BK)
                *reinterpret_cast<float4*>(&Bs[buf][b_r + i * B_ROWS][b_c4]) = rb[i];
    };

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int jj = 0; jj < TN; ++jj) acc[i][jj] = 0.0f;

    if (t0 < t1) {
        fetch(t0, ra[0], rb[0]);
        store(0, ra[0], rb[0]);
    }
#pragma unroll
    for (int d = 1; d < PREFETCH; ++d)
        if (t0 + d < t1) fetch(t0 + d, ra[d], rb[d]);
    __syncthreads();
    // slab s = t + d sits in shared buffer (s - t0) & 1; set d is free (slab s was stored):
    // it takes slab s + PREFETCH, and slab s + 1 goes from set (d + 1) % PREFETCH to the
    // other buffer after this slab's multiply
    for (int t = t0; t < t1; t += PREFETCH) {
#pragma unroll
        for (int d = 0; d < PREFETCH; ++d) {
            const int s = t + d;
            if (s >= t1) break;
            const int buf = (s - t0) & 1;
            if (s + PREFETCH < t1) fetch(s + PREFETCH, ra[d], rb[d]);
#pragma unroll
            for (int k = 0; k < KG; ++k) {
                const int kk = grp * KG + k;
                float a[TM], b[TN];
#pragma unroll
                for (int h = 0; h < MH; ++h) {
                    const float4 v = *reinterpret_cast<const float4*>(
                        &As[buf][kk][h * (BM / MH) + ty * 4]);
                    a[4 * h] = v.x; a[4 * h + 1] = v.y; a[4 * h + 2] = v.z; a[4 * h + 3] = v.w;
                }
#pragma unroll
                for (int g = 0; g < NH; ++g) {
                    const float4 v = *reinterpret_cast<const float4*>(
                        &Bs[buf][kk][g * (BN / NH) + tx * 4]);
                    b[4 * g] = v.x; b[4 * g + 1] = v.y; b[4 * g + 2] = v.z; b[4 * g + 3] = v.w;
                }
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int jj = 0; jj < TN; ++jj) acc[i][jj] = fmaf(a[i], b[jj], acc[i][jj]);
            }
            if (s + 1 < t1) store(buf ^ 1, ra[(d + 1) % PREFETCH], rb[(d + 1) % PREFETCH]);
            __syncthreads();
        }
    }

    // sliced K: group 0 adds the other groups' sums in the order 1, 2, ..., KS-1 (the slab
    // buffers are free: every thread has passed the last slab's barrier)
    if (KS > 1) {
        if (grp > 0) {
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int jj = 0; jj < TN; ++jj)
                    sm.part[(((grp - 1) * TM + i) * TN + jj) * NT0 + lt] = acc[i][jj];
        }
        __syncthreads();
        if (grp == 0) {
            for (int g = 1; g < KS; ++g)
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int jj = 0; jj < TN; ++jj)
                        acc[i][jj] += sm.part[(((g - 1) * TM + i) * TN + jj) * NT0 + lt];
        }
    }

    // epilogue: element (m, j) of y lives at (img K + m) PQ + pq; ws slices share the layout
    const size_t n_out = (size_t)N * K * PQ;
    const int parts = gridDim.z;
    float* dst = parts > 1 ? ws + blockIdx.z * n_out : y;
    if (grp == 0) {  // only group 0 holds the sums; every thread still reaches the barriers
        each_output<BM, BN, TM, NH, MH>(
            m0, n0, tx, ty, K, PQ, NPQ, y_vec,
            [&](int i, int g, size_t o) {
                const float* v = &acc[i][4 * g];
                *reinterpret_cast<float4*>(&dst[o]) = make_float4(v[0], v[1], v[2], v[3]);
            },
            [&](int i, int g, int e, size_t o) { dst[o] = acc[i][4 * g + e]; });
    }
    if (parts == 1) return;

    // split-K: the last part of this tile to arrive sums the slices in a fixed order
    __threadfence();           // this block's slice is visible to every block ...
    __syncthreads();           // ... for all of its threads, before the counter moves
    if (tid == 0) {
        int* count = &counters[blockIdx.y * gridDim.x + blockIdx.x];
        const int before = atomicAdd(count, 1);
        s_last = before == parts - 1;
        if (s_last) *count = 0;  // every part has counted: ready for the next launch
    }
    __syncthreads();
    if (!s_last || grp != 0) return;
    __threadfence();
    each_output<BM, BN, TM, NH, MH>(
        m0, n0, tx, ty, K, PQ, NPQ, y_vec,
        [&](int, int, size_t o) {
            float4 s = __ldcg(reinterpret_cast<const float4*>(ws + o));
            for (int z = 1; z < parts; ++z) {
                const float4 u = __ldcg(reinterpret_cast<const float4*>(ws + z * n_out + o));
                s.x += u.x; s.y += u.y; s.z += u.z; s.w += u.w;
            }
            *reinterpret_cast<float4*>(&y[o]) = s;
        },
        [&](int, int, int, size_t o) {
            float s = __ldcg(ws + o);
            for (int z = 1; z < parts; ++z) s += __ldcg(ws + z * n_out + o);
            y[o] = s;
        });
}

// Every tile as a template (the CPU tests, compile_ptx) ...
template <int BM, int BN, int MODE, int KS = 1>
__global__ void __launch_bounds__(FLAT_THREADS(BM, BN, KS)) flat_igemm(FLAT_PARAMS)
{
    flat_igemm_body<BM, BN, MODE, KS>(FLAT_ARGS);
}

// ... and one of them under a C name, chosen by -DFLAT_BM=.. -DFLAT_BN=.. -DFLAT_MODE=..
// -DFLAT_KS=..: a module of one kernel, so that a first use compiles only the tiles it
// runs (a few seconds each) and not all of them (about a minute per prefetch depth).
#ifdef FLAT_BM
extern "C" __global__ void __launch_bounds__(FLAT_THREADS(FLAT_BM, FLAT_BN, FLAT_KS))
flat_igemm_tile(FLAT_PARAMS)
{
    flat_igemm_body<FLAT_BM, FLAT_BN, FLAT_MODE, FLAT_KS>(FLAT_ARGS);
}
#endif

// One thread per element of xs (NC = N * C planes of P x Q).
extern "C" __global__ void flat_subsample(const float* __restrict__ x, float* __restrict__ xs,
                                          int NC, int H, int W, int P, int Q, int sh, int sw)
{
    const int PQ = P * Q;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= NC * PQ) return;
    const int nc = i / PQ, pq = i - nc * PQ, p = pq / Q, q = pq - p * Q;
    xs[i] = x[((size_t)nc * H + p * sh) * W + q * sw];
}
