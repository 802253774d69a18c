// im2col on the GPU (lesson 02's layout): cols[n][l][p * Q + q] = x[n][c][p sh - ph + r dh]
// [q sw - pw + s dw] with l = (c R + r) S + s, zero outside the image and for the padding
// rows L <= l < Lp (the GEMM reads K in multiples of 4). One thread per (n, l, pq); a
// warp writes 32 consecutive pq of one row.
extern "C" __global__ void im2col(const float* __restrict__ x, float* __restrict__ cols,
                                  int C, int H, int W, int R, int S, int P, int Q, int sh,
                                  int sw, int ph, int pw, int dh, int dw, int L, int Lp) {
    const int pq = blockIdx.x * blockDim.x + threadIdx.x;
    const int l = blockIdx.y, n = blockIdx.z;
    if (pq >= P * Q) return;
    float v = 0.0f;
    if (l < L) {
        const int s = l % S, r = (l / S) % R, c = l / (R * S);
        const int p = pq / Q, q = pq - p * Q;
        const int h = p * sh - ph + r * dh, w = q * sw - pw + s * dw;
        if (h >= 0 && h < H && w >= 0 && w < W)
            v = x[(((long long)n * C + c) * H + h) * W + w];
    }
    cols[((long long)n * Lp + l) * P * Q + pq] = v;
}
