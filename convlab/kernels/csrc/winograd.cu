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
