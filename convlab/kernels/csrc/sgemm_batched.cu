// Batched fp32 GEMM: C[b] (M x N) = A[b] (M x K) @ B[b] (K x N), row-major, b = blockIdx.z;
// the matrices of batch b start sa, sb, sc elements after those of batch b - 1 (sa = 0: one
// A for every b, e.g. a conv's filters against each image's columns).
// The course's register-blocked GEMM (gemm04's design) in CUDA C: a block computes BM x BN
// of C (128 x 64 or 64 x 128) with 128 threads, a thread 8 x 8 of it as 2 x 2 sub-blocks of 4 x 4 (rows ty*4 and
// BM/2 + ty*4, columns tx*4 and BN/2 + tx*4), so its shared-memory reads are float4s that
// a warp spreads over all banks. Slabs of BK along K: A's slab is stored transposed
// (As[k][m]); the next slab's global loads are in registers while this one is multiplied
// (two shared buffers, one barrier per slab). K % 4 == 0; edges are masked.

#ifndef BM
#define BM 128                     // 128 (BN = 64) or 64 (BN = 128)
#endif
#define BN (8192 / BM)
#define BK 16
#define NT 128                     // threads: (BN / 8) x (BM / 8)
#define TXN (BN / 8)
#define A_F4 (BM * BK / 4 / NT)    // float4 loads of A per thread per slab
#define B_F4 (BK * BN / 4 / NT)

static_assert(BM == 64 || BM == 128, "BM is 64 or 128");

// GATHER=1: B is not read from memory but gathered from an NCHW image (im2col fused into
// the loads: B[b][l][pq] = x[b][c][p sh - ph + r dh][q sw - pw + s dw], l = (c R + r) S + s,
// zero outside the image and for l >= L): conv_gather_gemm, a convolution whose reduction
// is exactly C*R*S (rounded up to 4 by the caller's zero filter columns).
#ifndef GATHER
#define GATHER 0
#endif

#if GATHER
struct Geometry { int C, H, W, R, S, Q, sh, sw, ph, pw, dh, dw, L; };
extern "C" __global__ void __launch_bounds__(NT)
conv_gather_gemm(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                 int M, int N, int K, long long sa, long long sb, long long sc, int Cc, int H,
                 int W, int R, int S, int Q, int sh, int sw, int ph, int pw, int dh, int dw,
                 int L) {
    const Geometry g = {Cc, H, W, R, S, Q, sh, sw, ph, pw, dh, dw, L};
#else
extern "C" __global__ void __launch_bounds__(NT)
sgemm_batched(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
              int M, int N, int K, long long sa, long long sb, long long sc) {
#endif
    __shared__ __align__(16) float As[2][BK][BM];
    __shared__ __align__(16) float Bs[2][BK][BN];
    const int b = blockIdx.z;
    A += b * sa;
    B += b * sb;
    C += b * sc;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int tid = threadIdx.x;
    // thread grid: 8 x 4 threads per warp patch (tx fastest within a row of 8)
    const int tx = tid % TXN, ty = tid / TXN;
    const bool vec_n = (N % 4) == 0;

    float4 ra[A_F4], rb[B_F4];
#if GATHER
    // the input corner of each output pixel this thread loads (its columns never change)
    int h0[B_F4][4], w0[B_F4][4];
#pragma unroll
    for (int j = 0; j < B_F4; ++j) {
        int c = ((tid + j * NT) % (BN / 4)) * 4;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            int pq = n0 + c + e, p = pq / g.Q, q = pq - p * g.Q;
            h0[j][e] = pq < N ? p * g.sh - g.ph : -(1 << 29);   // past N: never inside
            w0[j][e] = q * g.sw - g.pw;
        }
    }
#endif
    auto fetch = [&](int k0) {
#pragma unroll
        for (int j = 0; j < A_F4; ++j) {
            int i = tid + j * NT, r = i / (BK / 4), c = (i % (BK / 4)) * 4;
            int m = m0 + r, k = k0 + c;
            ra[j] = (m < M && k < K) ? *reinterpret_cast<const float4*>(A + (long long)m * K + k)
                                     : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int j = 0; j < B_F4; ++j) {
            int i = tid + j * NT, r = i / (BN / 4), c = (i % (BN / 4)) * 4;
            int k = k0 + r, n = n0 + c;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if GATHER
            if (k < g.L) {
                int cc = k / (g.R * g.S), rs = k - cc * g.R * g.S, rr = rs / g.S, ss = rs - rr * g.S;
                const float* xc = B + (long long)cc * g.H * g.W;
                float e4[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    int h = h0[j][e] + rr * g.dh, w = w0[j][e] + ss * g.dw;
                    e4[e] = (h >= 0 && h < g.H && w >= 0 && w < g.W) ? xc[h * g.W + w] : 0.0f;
                }
                v = make_float4(e4[0], e4[1], e4[2], e4[3]);
            }
#else
            if (k < K) {
                const float* p = B + (long long)k * N + n;
                if (vec_n && n + 3 < N) {
                    v = *reinterpret_cast<const float4*>(p);
                } else {
                    if (n < N) v.x = p[0];
                    if (n + 1 < N) v.y = p[1];
                    if (n + 2 < N) v.z = p[2];
                    if (n + 3 < N) v.w = p[3];
                }
            }
#endif
            rb[j] = v;
        }
    };
    auto store = [&](int buf) {
#pragma unroll
        for (int j = 0; j < A_F4; ++j) {
            int i = tid + j * NT, r = i / (BK / 4), c = (i % (BK / 4)) * 4;
            As[buf][c + 0][r] = ra[j].x;
            As[buf][c + 1][r] = ra[j].y;
            As[buf][c + 2][r] = ra[j].z;
            As[buf][c + 3][r] = ra[j].w;
        }
#pragma unroll
        for (int j = 0; j < B_F4; ++j) {
            int i = tid + j * NT, r = i / (BN / 4), c = (i % (BN / 4)) * 4;
            *reinterpret_cast<float4*>(&Bs[buf][r][c]) = rb[j];
        }
    };

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

    const int KT = (K + BK - 1) / BK;
    fetch(0);
    store(0);
    __syncthreads();
    for (int kt = 0; kt < KT; ++kt) {
        const int buf = kt & 1;
        if (kt + 1 < KT) fetch((kt + 1) * BK);
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[8], bb[8];
            float4 a0 = *reinterpret_cast<const float4*>(&As[buf][k][ty * 4]);
            float4 a1 = *reinterpret_cast<const float4*>(&As[buf][k][BM / 2 + ty * 4]);
            float4 b0 = *reinterpret_cast<const float4*>(&Bs[buf][k][tx * 4]);
            float4 b1 = *reinterpret_cast<const float4*>(&Bs[buf][k][BN / 2 + tx * 4]);
            a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w;
            a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
            bb[0] = b0.x; bb[1] = b0.y; bb[2] = b0.z; bb[3] = b0.w;
            bb[4] = b1.x; bb[5] = b1.y; bb[6] = b1.z; bb[7] = b1.w;
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], bb[j], acc[i][j]);
        }
        if (kt + 1 < KT) store(buf ^ 1);
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int m = m0 + (i < 4 ? ty * 4 + i : BM / 2 + ty * 4 + i - 4);
        if (m >= M) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int n = n0 + (h == 0 ? tx * 4 : BN / 2 + tx * 4);
            float* p = C + (long long)m * N + n;
            const float* v = &acc[i][4 * h];
            if (vec_n && n + 3 < N) {
                *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
            } else {
                for (int e = 0; e < 4; ++e)
                    if (n + e < N) p[e] = v[e];
            }
        }
    }
}
