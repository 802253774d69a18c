// Hopper (sm_90a only): warpgroup MMA (wgmma.mma_async) fed by TMA bulk tensor copies.
//
// C (M x N; fp32, or the input type with -DOUT_HALF=1) = A (M x K) @ B^T, A and B stored
// K-major (rows of K), bf16 (or fp16 with -DF16=1), products exact, sums in fp32. With
// -DCONV=1, A is the implicit-GEMM view of an NHWC input: row = output pixel, column =
// (r, s, c) (stride 1; the TMA box is moved by (r, s), and its out-of-range rows arrive as
// zeros, which is the padding).
//
// Block: 1 + CONSUMERS warpgroups of 128 threads, one block per SM, persistent over the
// output tiles. Warpgroup 0 is the producer: one thread issues TMA copies of A (BM x 64)
// and B (BN x 64) into a ring of STAGES slots, each slot with a "full" mbarrier (the copy
// engine counts the bytes in) and an "empty" one (the consumers arrive when they have read
// it). Consumer warpgroup c multiplies rows 64c .. 64c + 63 of the slot by all BN rows of
// B: four wgmma.m64nBNk16 per slot, one slot's group in flight while the next is issued,
// the accumulators (BN / 2 floats per thread) in registers. setmaxnreg moves registers
// from the producer (which needs few) to the consumers.
//
// With -DMMA_SYNC=1 the consumers multiply with ldmatrix + mma.sync instead (each warp 64
// rows by BN / 4 columns, as the cp.async mma.sync tile's warps do), everything else
// unchanged: the same math as mma_sync.cu's top tile, fed by TMA and mbarriers.
//
// Shared-memory tiles use the 128-byte swizzle: rows of 64 halves (128 bytes), 16-byte
// chunk j of row r stored at chunk j ^ (r % 8). TMA writes that layout and wgmma's matrix
// descriptor (swizzle mode 1, 1024 bytes between 8-row groups) reads it, so neither side
// has bank conflicts and no thread computes an address.

#ifndef BN
#define BN 256
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef CONSUMERS
#define CONSUMERS 2
#endif
#ifndef F16
#define F16 0
#endif
#ifndef CONV
#define CONV 0
#endif
#ifndef BQ
#define BQ 16   // CONV: output columns per block tile (BM / BQ rows)
#endif
#ifndef GROUP_M
#define GROUP_M 8
#endif
#ifndef OUT_HALF
#define OUT_HALF 0   // 1: C stored in the input type (bf16 or fp16), else fp32
#endif
#ifndef MMA_SYNC
#define MMA_SYNC 0   // 1: the consumers multiply with ldmatrix + mma.sync instead of wgmma
#endif
#define BM (64 * CONSUMERS)
#define BK 64
#define NTHREADS (128 * (CONSUMERS + 1))
#define A_BYTES (BM * BK * 2)
#define B_BYTES (BN * BK * 2)
// MMA_SYNC with OUT_HALF: each consumer warp's staged output rows (64 of BN / 4 + 8
// halves) after the slots and their mbarriers (full and empty, 8 bytes each)
#define EPI_OFF (STAGES * (A_BYTES + B_BYTES) + 16 * STAGES)
#define EROW (BN / 4 + 8)
#if F16
#define WG_T "f16"
#else
#define WG_T "bf16"
#endif

static_assert(BN == 64 || BN == 128 || BN == 256, "wgmma n is 64, 128 or 256 here");
static_assert(!(MMA_SYNC && CONV), "the mma.sync consumers are written for the GEMM only");
static_assert(A_BYTES % 1024 == 0 && B_BYTES % 1024 == 0,
              "the 128-byte swizzle (TMA, descriptors, ldmatrix XORs) needs 1024-byte slots");

typedef unsigned long long u64;

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void wgmma_n64(float* d, unsigned long long da,
                                           unsigned long long db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." WG_T "." WG_T " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_n128(float* d, unsigned long long da,
                                           unsigned long long db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." WG_T "." WG_T " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_n256(float* d, unsigned long long da,
                                           unsigned long long db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." WG_T "." WG_T " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_tile(float* d, u64 da, u64 db, int accumulate) {
#if BN == 256
    wgmma_n256(d, da, db, accumulate);
#elif BN == 128
    wgmma_n128(d, da, db, accumulate);
#else
    wgmma_n64(d, da, db, accumulate);
#endif
}

// Matrix descriptor of a K-major tile with the 128-byte swizzle, starting at `p`
// (1024-byte aligned slot; +32 bytes per k16 step is added to the start field).
__device__ __forceinline__ u64 desc_sw128(const void* p) {
    u64 addr = smem_addr(p);
    return ((addr & 0x3FFFF) >> 4)          // start address, 16-byte units
           | (u64(1) << 16)                 // leading-dimension offset (unused: swizzled)
           | (u64(1024 >> 4) << 32)         // stride offset: 8 rows x 128 bytes
           | (u64(1) << 62);                // swizzle mode: 128-byte
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait0() {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait1() {
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}
__device__ __forceinline__ void fence_operand(float& x) {
    asm volatile("" : "+f"(x) :: "memory");
}

#if MMA_SYNC
__device__ __forceinline__ void ldsm_x4(unsigned* r, unsigned addr) {   // a shared address
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." WG_T "." WG_T ".f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif
__device__ __forceinline__ void mbar_init(u64* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(u64* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u64* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(u64* bar, int parity) {
    asm volatile("{\n.reg .pred done;\nWAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT;\n}\n" :: "r"(smem_addr(bar)), "r"(parity) : "memory");
}

__device__ __forceinline__ void tma_load_2d(void* dst, const void* map, u64* bar, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n"
                 :: "r"(smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar))
                 : "memory");
}
__device__ __forceinline__ void tma_load_4d(void* dst, const void* map, u64* bar, int c0, int c1,
                                            int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                 :: "r"(smem_addr(dst)), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
                    "r"(smem_addr(bar)) : "memory");
}

struct Problem {   // GEMM: M, N, K; CONV adds the input and filter geometry
    int M, N, K;
    int Nb, H, W, C, P, Q, R, S, ph, pw, dh, dw, tiles_p, tiles_q;
};

// Tile t of the output (grouped: GROUP_M block rows share their B tiles in L2).
__device__ __forceinline__ void tile_coords(int t, int nbm, int nbn, int& bm, int& bn) {
    const int per_group = GROUP_M * nbn;
    const int first_m = (t / per_group) * GROUP_M;
    const int gsz = min(nbm - first_m, GROUP_M);
    bm = first_m + (t % per_group) % gsz;
    bn = (t % per_group) / gsz;
}

__device__ __forceinline__ unsigned pack2(float v0, float v1) {   // low half v0, high v1
    unsigned packed;
#if F16
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(v1), "f"(v0));
#else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(v1), "f"(v0));
#endif
    return packed;
}

__device__ __forceinline__ void store2(void* out, long long off, float v0, float v1) {
#if OUT_HALF
    *reinterpret_cast<unsigned*>(reinterpret_cast<unsigned short*>(out) + off) = pack2(v0, v1);
#else
    *reinterpret_cast<float2*>(reinterpret_cast<float*>(out) + off) = make_float2(v0, v1);
#endif
}

// Persistent: gridDim.x blocks walk the nbm x nbn output tiles (tile = blockIdx.x, then
// + gridDim.x ...); the slab counter `it` runs across tiles, so the producer loads the
// next tile's first slabs while the consumers finish the current one.
// Tensor maps (CUtensorMap, 128 bytes each) live in global memory: maps[0] = A, maps[1] = B.
extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
wgmma_tma_kernel(const u64* __restrict__ maps, void* __restrict__ Cout, int M, int N, int K,
                 int Nb, int H, int W, int C, int P, int Q, int R, int S, int ph, int pw, int dh,
                 int dw, int tiles_p, int tiles_q, int nbm, int nbn) {
    const Problem pb = {M, N, K, Nb, H, W, C, P, Q, R, S, ph, pw, dh, dw, tiles_p, tiles_q};
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    unsigned char* sA = smem;
    unsigned char* sB = smem + STAGES * A_BYTES;
    u64* full = reinterpret_cast<u64*>(smem + STAGES * (A_BYTES + B_BYTES));
    u64* empty = full + STAGES;
    const void* map_a = maps;
    const void* map_b = maps + 16;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int ntiles = nbm * nbn;
#if CONV
    const int cchunks = pb.C / BK;
    const int KT = pb.R * pb.S * cchunks;
#else
    const int KT = (pb.K + BK - 1) / BK;
#endif

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], CONSUMERS * 128);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {   // producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (tid == 0) {
            asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n"
                         :: "l"(map_a) : "memory");
            asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n"
                         :: "l"(map_b) : "memory");
            int it = 0;
            for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
                int bm, bn;
                tile_coords(t, nbm, nbn, bm, bn);
#if CONV
                const int img = bm / (pb.tiles_p * pb.tiles_q);
                const int p0 = (bm / pb.tiles_q) % pb.tiles_p * (BM / BQ);
                const int q0 = bm % pb.tiles_q * BQ;
#endif
                for (int kt = 0; kt < KT; ++kt, ++it) {
                    const int s = it % STAGES, round = it / STAGES;
                    if (round > 0) mbar_wait(&empty[s], (round - 1) & 1);
                    mbar_expect_tx(&full[s], A_BYTES + B_BYTES);
#if CONV
                    const int rs = kt / cchunks, c0 = (kt - rs * cchunks) * BK;
                    const int r = rs / pb.S, sx = rs - r * pb.S;
                    tma_load_4d(sA + s * A_BYTES, map_a, &full[s], c0, q0 + sx * pb.dw - pb.pw,
                                p0 + r * pb.dh - pb.ph, img);
                    tma_load_2d(sB + s * B_BYTES, map_b, &full[s], rs * pb.C + c0, bn * BN);
#else
                    tma_load_2d(sA + s * A_BYTES, map_a, &full[s], kt * BK, bm * BM);
                    tma_load_2d(sB + s * B_BYTES, map_b, &full[s], kt * BK, bn * BN);
#endif
                }
            }
        }
    } else {   // consumers
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        const int c = wg - 1;
        const int w = tid / 32, g = (tid % 32) / 4, tq = tid % 4;
#if MMA_SYNC
        // Warp w of consumer c: rows 64c .. 64c + 63 of the tile, columns w BN/4 .. + BN/4,
        // as 4 x NI mma.sync m16n8k16 per 16-deep step, fragments by ldmatrix from the
        // TMA's swizzled slots (16-byte chunk j of row r at j ^ (r % 8): step kk's chunk
        // 2 kk + h is the lane's step-0 offset XOR 32 kk bytes; 16 rows further is 2048
        // bytes, the XOR unchanged). Each warp waits for a slot's "full" barrier itself and
        // arrives on its "empty" one after the mma.sync that used its last fragments: no
        // block-wide barrier. Fragments double-buffered: step kk + 1's are loaded (for the
        // last step: the next slot's first) before step kk's mma.sync.
        constexpr int WNW = BN / 4, NI = WNW / 8;
        const int lane = tid % 32;
        const int ar = c * 64 + (lane & 15), br = w * WNW + (lane & 7) + ((lane >> 4) << 3);
        const unsigned a_off = ar * 128 + (((lane >> 4) ^ (ar & 7)) << 4);
        const unsigned b_off = br * 128 + ((((lane >> 3) & 1) ^ (br & 7)) << 4);
        // per step kk, the lane's row address in slot 0: the XOR touches bits 5-6 only, which
        // a slot's offset (a multiple of 1024) and 16 rows (2048) leave alone, so both add on
        unsigned a_kk[BK / 16], b_kk[BK / 16];
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            a_kk[kk] = (smem_addr(sA) + a_off) ^ (kk << 5);
            b_kk[kk] = (smem_addr(sB) + b_off) ^ (kk << 5);
        }
        float acc[4][NI][4];
        unsigned af[2][4][4], bf[2][NI / 2][4];
        auto load_frags = [&](unsigned (&a)[4][4], unsigned (&b)[NI / 2][4], int s, int kk) {
#pragma unroll
            for (int i = 0; i < 4; ++i) ldsm_x4(a[i], a_kk[kk] + s * A_BYTES + 2048 * i);
#pragma unroll
            for (int j = 0; j < NI / 2; ++j) ldsm_x4(b[j], b_kk[kk] + s * B_BYTES + 2048 * j);
        };
        int it = 0;
        for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
            int bm, bn;
            tile_coords(t, nbm, nbn, bm, bn);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
            mbar_wait(&full[it % STAGES], (it / STAGES) & 1);
            load_frags(af[0], bf[0], it % STAGES, 0);
            for (int kt = 0; kt < KT; ++kt, ++it) {
                const int s = it % STAGES;
#pragma unroll
                for (int kk = 0; kk < BK / 16; ++kk) {
                    if (kk + 1 < BK / 16) {
                        load_frags(af[(kk + 1) & 1], bf[(kk + 1) & 1], s, kk + 1);
                    } else if (kt + 1 < KT) {
                        const int s2 = (it + 1) % STAGES;
                        mbar_wait(&full[s2], ((it + 1) / STAGES) & 1);
                        load_frags(af[0], bf[0], s2, 0);
                    }
#pragma unroll
                    for (int i = 0; i < 4; ++i)
#pragma unroll
                        for (int j = 0; j < NI; ++j)
                            mma16816(acc[i][j], af[kk & 1][i], bf[kk & 1][j / 2][(j & 1) * 2],
                                     bf[kk & 1][j / 2][(j & 1) * 2 + 1]);
                }
                mbar_arrive(&empty[s]);
            }
#if OUT_HALF
            // staged: the warp's 64 x WNW tile into its own rows of shared memory (EROW
            // halves apart: 4 banks further per row, so the pairs of a store and the
            // 16-byte chunks of a row read land in distinct banks), then whole 16-byte
            // chunks of rows to C
            unsigned short* ep = reinterpret_cast<unsigned short*>(smem + EPI_OFF)
                                 + (c * 4 + w) * 64 * EROW;
            __syncwarp();   // the previous tile's reads of these rows are done
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int j = 0; j < NI; ++j) {
                        *reinterpret_cast<unsigned*>(ep + (i * 16 + g + 8 * h) * EROW + 8 * j
                                                     + 2 * tq) = pack2(acc[i][j][2 * h],
                                                                       acc[i][j][2 * h + 1]);
                    }
            __syncwarp();
            constexpr int CPR = WNW / 8;   // 16-byte chunks per row
#pragma unroll 4
            for (int q = lane; q < 64 * CPR; q += 32) {
                const int r = q / CPR, k = q % CPR;
                const long long row = (long long)bm * BM + c * 64 + r;
                const int col = bn * BN + w * WNW + 8 * k;
                if (row >= pb.M || col >= pb.N) continue;
                const unsigned short* src = ep + r * EROW + 8 * k;
                unsigned short* dst = reinterpret_cast<unsigned short*>(Cout) + row * pb.N + col;
                if (pb.N % 8 == 0) {
                    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
                } else {
                    for (int e = 0; e < 8 && col + e < pb.N; ++e) dst[e] = src[e];
                }
            }
#else
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const long long row = (long long)bm * BM + c * 64 + i * 16 + g + h * 8;
                    if (row < pb.M) {
#pragma unroll
                        for (int j = 0; j < NI; ++j) {
                            const int col = bn * BN + w * WNW + 8 * j + 2 * tq;
                            if (col < pb.N)
                                store2(Cout, row * pb.N + col, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                        }
                    }
                }
#endif
        }
#else
        float d[BN / 2];
        int it = 0;
        for (int t = blockIdx.x; t < ntiles; t += gridDim.x) {
            int bm, bn;
            tile_coords(t, nbm, nbn, bm, bn);
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
            for (int kt = 0; kt < KT; ++kt, ++it) {
                const int s = it % STAGES;
                mbar_wait(&full[s], (it / STAGES) & 1);
                const u64 da = desc_sw128(sA + s * A_BYTES + c * 64 * 128);
                const u64 db = desc_sw128(sB + s * B_BYTES);
                wgmma_fence();
#pragma unroll
                for (int k = 0; k < BK / 16; ++k) wgmma_tile(d, da + 2 * k, db + 2 * k, 1);
                wgmma_commit();
                // one group in flight: the previous slab's multiplies are done, free its slot
                wgmma_wait1();
                if (kt > 0) mbar_arrive(&empty[(it - 1) % STAGES]);
            }
            wgmma_wait0();
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) fence_operand(d[i]);
            mbar_arrive(&empty[(it - 1) % STAGES]);
            // thread (warp w, g, tq): rows 16w + g (+8), columns 8i + 2tq (+1)
#if CONV
            const int img = bm / (pb.tiles_p * pb.tiles_q);
            const int p0 = (bm / pb.tiles_q) % pb.tiles_p * (BM / BQ);
            const int q0 = bm % pb.tiles_q * BQ;
#endif
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int lr = c * 64 + w * 16 + g + h * 8;   // row within the block tile
#if CONV
                const int p = p0 + lr / BQ, q = q0 + lr % BQ;
                const bool ok = p < pb.P && q < pb.Q;
                const long long row = ((long long)img * pb.P + p) * pb.Q + q;
#else
                const long long row = (long long)bm * BM + lr;
                const bool ok = row < pb.M;
#endif
                if (ok) {
#pragma unroll
                    for (int i = 0; i < BN / 8; ++i) {
                        const int col = bn * BN + 8 * i + 2 * tq;
                        if (col < pb.N)
                            store2(Cout, row * pb.N + col, d[4 * i + 2 * h], d[4 * i + 2 * h + 1]);
                    }
                }
            }
        }
#endif
    }
}
