// The mma.sync ceiling: every warp issues independent mma.sync.m16n8k16 (fp16 in, fp32
// accumulate) on registers only, CHAINS accumulators in flight, no memory traffic.
// 2 * 16 * 8 * 16 = 4096 flops per instruction.
#ifndef CHAINS
#define CHAINS 8
#endif

extern "C" __global__ void mma_peak(float* out, int iters) {
    unsigned a[4], b[2];
    for (int i = 0; i < 4; ++i) a[i] = 0x3c003c00u + threadIdx.x + i;   // halves near 1.0
    for (int i = 0; i < 2; ++i) b[i] = 0x3c003c00u + threadIdx.x * 3 + i;
    float c[CHAINS][4];
#pragma unroll
    for (int j = 0; j < CHAINS; ++j)
        for (int e = 0; e < 4; ++e) c[j][e] = 0.0f;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int j = 0; j < CHAINS; ++j)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                         "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                         : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < CHAINS; ++j) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
    if (s == 1234.5f) out[0] = s;   // keeps the work; never true in practice
}
