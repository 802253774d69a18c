// Winograd F(m x m, 3 x 3) for a 3x3, stride-1 convolution, fp32, in three steps around a
// batched GEMM (lesson 11). ALPHA = m + 2; xi runs over the ALPHA x ALPHA tile positions.
//
//   U[xi][k][c] = (G g G^T)[xi]          filters                             wino_filter
//   V[xi][c][t] = (B^T d B)[xi]          ALPHA x ALPHA input tile t, per c     wino_input
//   M[xi]       = U[xi] @ V[xi]          ALPHA^2 GEMMs (K x C) @ (C x T)      (cuBLAS)
//   y tile t    = A^T M[.][k][t] A       m x m outputs per (k, t)             wino_output
//
// The matrices BT (ALPHA x ALPHA), G (ALPHA x 3) and AT (m x ALPHA) come from
// convlab.winograd (exact fractions, printed as float literals into the header the launcher
// prepends). Loops over them are unrolled, so their zeros and ones cost nothing. Tile
// t = (n, ty, tx) makes outputs (m ty .. m ty + m - 1, m tx ..), from input rows m ty - pad ...

#ifndef WINO_M
#error "the launcher defines WINO_M and the matrices BT, G, AT"
#endif
#define ALPHA (WINO_M + 2)
#define XI (ALPHA * ALPHA)

template <int R, int K, int C>
__device__ __forceinline__ void matmul_const(const float (&A)[R][K], const float (&X)[K][C],
                                             float (&Y)[R][C]) {
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < C; ++j) {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < K; ++k)
                if (A[i][k] != 0.0f) s += A[i][k] * X[k][j];
            Y[i][j] = s;
        }
}

// Y = X @ B^T for a constant B (R2 x K): Y[i][j] = sum_k X[i][k] B[j][k]
template <int R, int K, int R2>
__device__ __forceinline__ void matmul_const_t(const float (&X)[R][K], const float (&B)[R2][K],
                                               float (&Y)[R][R2]) {
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < R2; ++j) {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < K; ++k)
                if (B[j][k] != 0.0f) s += X[i][k] * B[j][k];
            Y[i][j] = s;
        }
}

extern "C" __global__ void wino_filter(const float* __restrict__ w, float* __restrict__ U,
                                       int K, int C) {
    int kc = blockIdx.x * blockDim.x + threadIdx.x;   // k * C + c
    if (kc >= K * C) return;
    float g[3][3], t[ALPHA][3], u[ALPHA][ALPHA];
#pragma unroll
    for (int i = 0; i < 9; ++i) g[i / 3][i % 3] = w[(long long)kc * 9 + i];
    matmul_const(G, g, t);      // G g
    matmul_const_t(t, G, u);    // (G g) G^T
    const long long plane = (long long)K * C;
#pragma unroll
    for (int xi = 0; xi < XI; ++xi) U[xi * plane + kc] = u[xi / ALPHA][xi % ALPHA];
}

extern "C" __global__ void wino_input(const float* __restrict__ x, float* __restrict__ V,
                                      int C, int H, int W, int TY, int TX, int T, int pad) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    int c = blockIdx.y;
    if (t >= T) return;
    int tx = t % TX, ty = (t / TX) % TY, n = t / (TX * TY);
    const float* xc = x + ((long long)n * C + c) * H * W;
    int h0 = WINO_M * ty - pad, w0 = WINO_M * tx - pad;
    float d[ALPHA][ALPHA], b[ALPHA][ALPHA], v[ALPHA][ALPHA];
#pragma unroll
    for (int i = 0; i < ALPHA; ++i)
#pragma unroll
        for (int j = 0; j < ALPHA; ++j) {
            int h = h0 + i, ww = w0 + j;
            d[i][j] = (h >= 0 && h < H && ww >= 0 && ww < W) ? xc[h * W + ww] : 0.0f;
        }
    matmul_const(BT, d, b);     // B^T d
    matmul_const_t(b, BT, v);   // (B^T d) B
    const long long plane = (long long)C * T;
    float* out = V + (long long)c * T + t;
#pragma unroll
    for (int xi = 0; xi < XI; ++xi) out[xi * plane] = v[xi / ALPHA][xi % ALPHA];
}

extern "C" __global__ void wino_output(const float* __restrict__ Mw, float* __restrict__ y,
                                       int K, int P, int Q, int TY, int TX, int T) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    int k = blockIdx.y;
    if (t >= T) return;
    int tx = t % TX, ty = (t / TX) % TY, n = t / (TX * TY);
    const long long plane = (long long)K * T;
    const float* m = Mw + (long long)k * T + t;
    float a[ALPHA][ALPHA], r[WINO_M][ALPHA], o[WINO_M][WINO_M];
#pragma unroll
    for (int xi = 0; xi < XI; ++xi) a[xi / ALPHA][xi % ALPHA] = m[xi * plane];
    matmul_const(AT, a, r);     // A^T m
    matmul_const_t(r, AT, o);   // (A^T m) A
    float* yk = y + ((long long)n * K + k) * P * Q;
#pragma unroll
    for (int i = 0; i < WINO_M; ++i) {
        int p = WINO_M * ty + i;
#pragma unroll
        for (int j = 0; j < WINO_M; ++j) {
            int q = WINO_M * tx + j;
            if (p < P && q < Q) yk[p * Q + q] = o[i][j];
        }
    }
}

#if WINO_M == 2
// Fused F(2x2, 3x3): x and U (wino_filter's [xi][k][c]) in, y out, in one kernel; V and M
// never leave the chip (x is read by every filter block, U by every tile block). A block owns FB_K filters x FB_T output tiles and walks the
// channels in slabs of FB_C:
//  1. each thread transforms one (channel, tile) 4 x 4 input patch into its 16 values,
//     Vs[c][xi][t]; the U slab is copied to Us[c][xi][k];
//  2. the 16 GEMMs: thread (xg, kg, tg) sums xi in 4 xg .. 4 xg + 3, k in 4 kg .., t in
//     4 tg .. (64 sums): two float4 shared reads per xi and channel feed 16 FMAs. The next
//     slab's patch and U values are loaded into registers meanwhile;
//  3. at the end the sums go through shared memory, one half of the filters at a time; in
//     each half every thread turns the 16 values of two (k, tile) pairs into 2 x 2 outputs.
// u_vec: U rows as float4 (C % 4 == 0, U aligned). Grid: (ceil(T / FB_T), ceil(K / FB_K)).
#define FB_K 32
#define FB_T 32
#define FB_C 8
#define FB_THREADS 256
extern "C" __global__ void __launch_bounds__(FB_THREADS)
wino_fused(const float* __restrict__ x, const float* __restrict__ U, float* __restrict__ y,
           int C, int H, int W, int K, int P, int Q, int TY, int TX, int T, int pad, int u_vec) {
    static_assert(XI == 16 && FB_THREADS == (XI / 4) * (FB_K / 4) * (FB_T / 4), "F(2x2)");
    static_assert(FB_C * FB_T == FB_THREADS, "one (channel, tile) patch per thread");
    union Smem {
        struct Slab { float V[FB_C][XI][FB_T]; float U[FB_C][XI][FB_K]; } s;
        float M[XI][FB_K / 2][FB_T];
    };
    __shared__ __align__(16) Smem sm;
    const int tid = threadIdx.x;
    const int t0 = blockIdx.x * FB_T, k0 = blockIdx.y * FB_K;
    const int tg = tid % (FB_T / 4), kg = (tid / (FB_T / 4)) % (FB_K / 4);
    const int xg = tid / ((FB_T / 4) * (FB_K / 4));
    // the input patch this thread transforms: channel ic of the slab, tile it of the block
    const int ic = tid / FB_T, it = tid % FB_T, tile = t0 + it;
    const bool tok = tile < T;
    const int tx = tok ? tile % TX : 0, ty = tok ? (tile / TX) % TY : 0;
    const int n = tok ? tile / (TX * TY) : 0;
    const int h0 = WINO_M * ty - pad, w0 = WINO_M * tx - pad;
    const float* xn = x + (long long)n * C * H * W;
    constexpr int U_F4 = FB_C * XI * FB_K / 4 / FB_THREADS;  // float4s of U per thread

    float d[ALPHA][ALPHA];
    float4 ur[U_F4];
    auto fetch = [&](int c0) {
        const int c = c0 + ic;
        const float* xc = xn + (long long)c * H * W;
#pragma unroll
        for (int i = 0; i < ALPHA; ++i)
#pragma unroll
            for (int j = 0; j < ALPHA; ++j) {
                const int h = h0 + i, ww = w0 + j;
                d[i][j] = (tok && c < C && (unsigned)h < (unsigned)H && (unsigned)ww < (unsigned)W)
                              ? xc[h * W + ww] : 0.0f;
            }
#pragma unroll
        for (int r = 0; r < U_F4; ++r) {
            const int idx = tid + r * FB_THREADS, pair = idx / (FB_C / 4);
            const int c4 = (idx % (FB_C / 4)) * 4, xi = pair / FB_K, k = pair % FB_K;
            const int kk = k0 + k, cc = c0 + c4;
            const float* src = U + ((long long)xi * K + kk) * C + cc;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (kk < K) {
                if (u_vec && cc + 3 < C) {
                    v = *reinterpret_cast<const float4*>(src);
                } else {
                    if (cc < C) v.x = src[0];
                    if (cc + 1 < C) v.y = src[1];
                    if (cc + 2 < C) v.z = src[2];
                    if (cc + 3 < C) v.w = src[3];
                }
            }
            ur[r] = v;
        }
    };
    auto store = [&]() {
        float b[ALPHA][ALPHA], v[ALPHA][ALPHA];
        matmul_const(BT, d, b);     // B^T d
        matmul_const_t(b, BT, v);   // (B^T d) B
#pragma unroll
        for (int xi = 0; xi < XI; ++xi) sm.s.V[ic][xi][it] = v[xi / ALPHA][xi % ALPHA];
#pragma unroll
        for (int r = 0; r < U_F4; ++r) {
            const int idx = tid + r * FB_THREADS, pair = idx / (FB_C / 4);
            const int c4 = (idx % (FB_C / 4)) * 4, xi = pair / FB_K, k = pair % FB_K;
            sm.s.U[c4 + 0][xi][k] = ur[r].x;
            sm.s.U[c4 + 1][xi][k] = ur[r].y;
            sm.s.U[c4 + 2][xi][k] = ur[r].z;
            sm.s.U[c4 + 3][xi][k] = ur[r].w;
        }
    };

    float acc[4][4][4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[e][i][j] = 0.0f;
    const int slabs = (C + FB_C - 1) / FB_C;
    fetch(0);
    for (int s = 0; s < slabs; ++s) {
        __syncthreads();  // every thread is done reading the previous slab
        store();
        __syncthreads();
        if (s + 1 < slabs) fetch((s + 1) * FB_C);  // in flight during the multiplications
#pragma unroll
        for (int c = 0; c < FB_C; ++c)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int xi = xg * 4 + e;
                const float4 a = *reinterpret_cast<const float4*>(&sm.s.U[c][xi][kg * 4]);
                const float4 b = *reinterpret_cast<const float4*>(&sm.s.V[c][xi][tg * 4]);
                const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) acc[e][i][j] = fmaf(av[i], bv[j], acc[e][i][j]);
            }
    }
    constexpr int KH = FB_K / 2;  // filters per half
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        __syncthreads();  // the slab (or the previous half) is no longer read
        if (kg * 4 / KH == half) {
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        sm.M[xg * 4 + e][kg * 4 - half * KH + i][tg * 4 + j] = acc[e][i][j];
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < KH * FB_T / FB_THREADS; ++r) {
            const int pidx = tid + r * FB_THREADS, kl = pidx / FB_T, t = pidx % FB_T;
            const int kk = k0 + half * KH + kl, tt = t0 + t;
            if (kk >= K || tt >= T) continue;
            float a[ALPHA][ALPHA], rr[WINO_M][ALPHA], o[WINO_M][WINO_M];
#pragma unroll
            for (int xi = 0; xi < XI; ++xi) a[xi / ALPHA][xi % ALPHA] = sm.M[xi][kl][t];
            matmul_const(AT, a, rr);     // A^T m
            matmul_const_t(rr, AT, o);   // (A^T m) A
            const int ox = tt % TX, oy = (tt / TX) % TY, on = tt / (TX * TY);
            float* yk = y + ((long long)on * K + kk) * P * Q;
#pragma unroll
            for (int i = 0; i < WINO_M; ++i)
#pragma unroll
                for (int j = 0; j < WINO_M; ++j) {
                    const int p = WINO_M * oy + i, q = WINO_M * ox + j;
                    if (p < P && q < Q) yk[p * Q + q] = o[i][j];
                }
        }
    }
}
#endif
