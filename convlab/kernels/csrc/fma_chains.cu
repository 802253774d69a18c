// fp32 FMA throughput: 8 independent chains per thread, the inner loop unrolled, a 32-bit
// counter. 128 FFMA per iteration against one add and one compare: the issue slots go to
// FMAs, so this approaches SMs x FP32 lanes x 2 x clock.
extern "C" __global__ void fma_chains(float* out, int n_iter) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    float a[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] = i * 1e-9f + j;
    const float m = 0.9999f, k = 1e-6f;
    for (int it = 0; it < n_iter; ++it) {
#pragma unroll
        for (int u = 0; u < 16; ++u) {
#pragma unroll
            for (int j = 0; j < 8; ++j) a[j] = fmaf(a[j], m, k);
        }
    }
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) s += a[j];
    out[i] = s;
}
