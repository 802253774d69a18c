// 2-D image filter ("same" size, zero padding, cross-correlation as reference.filter2d):
// out[y][x] = sum_{r,s} TAPS[r][s] * img[y - FR/2 + r][x - FS/2 + s].
// Needs a header defining FR, FS (odd) and TAPS[FR][FS] (constants folded into the FMAs),
// or FR, FS and PLANE_TAPS: then the kernel is the depthwise layer (at the end), every
// plane of x filtered with its channel's taps, read from memory.
//
// A warp owns 32 * VEC adjacent columns and a strip of V rows; lane l owns VEC columns
// (VEC = 4: one float4, a 16-byte load and store per row). Each lane slides down its
// strip keeping FR rows of its window in registers: every input row is loaded once per
// strip, as one coalesced read per warp (512 bytes with VEC = 4). The FS/2 neighbour
// columns on each side come from the adjacent lanes (__shfl_up_sync / __shfl_down_sync);
// only the edge lanes read them from memory (lanes 0 and 31 when VEC >= FS/2). Rows are
// fetched PF rows ahead of the one being assembled, so PF loads of every thread are in
// flight while it computes. The warps of
// a block stack vertically (strips of neighbouring rows: their halo rows hit in cache).
#define HR (FR / 2)
#define HS (FS / 2)
#define HS1 (HS > 0 ? HS : 1)
#define FULL_MASK 0xffffffffu

template <int VEC>
struct RawRow {        // a row as loaded: the lane's own columns, and the halo edge lanes read
    float own[VEC];
    float left[HS1];
    float right[HS1];
};

// Halo column k (1..HS) on the left sits in lane - d at element e: d = ceil(k / VEC).
template <int VEC>
__device__ __forceinline__ void load_row(RawRow<VEC>& a, const float* __restrict__ img, int H,
                                         int W, int y, int c0, int lane) {
    const bool rowok = y >= 0 && y < H;
    const int base = (rowok ? y : 0) * W;
    if (VEC == 4) {
        float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (rowok && c0 < W) t = *reinterpret_cast<const float4*>(img + base + c0);
        a.own[0] = t.x; a.own[VEC > 1 ? 1 : 0] = t.y;
        a.own[VEC > 2 ? 2 : 0] = t.z; a.own[VEC > 3 ? 3 : 0] = t.w;
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i)
            a.own[i] = (rowok && c0 + i < W) ? img[base + c0 + i] : 0.0f;
    }
#pragma unroll
    for (int k = 1; k <= HS; ++k) {
        const int d = (k + VEC - 1) / VEC;
        const int cl = c0 - k, cr = c0 + VEC - 1 + k;
        a.left[k - 1] = 0.0f;
        a.right[k - 1] = 0.0f;
        if (lane < d && rowok && cl >= 0 && cl < W) a.left[k - 1] = img[base + cl];
        if (lane + d > 31 && rowok && cr < W) a.right[k - 1] = img[base + cr];
    }
}

// The row's window v[0 .. VEC + 2 HS): halo from the neighbouring lanes (every lane calls).
template <int VEC>
__device__ __forceinline__ void assemble(float (&v)[VEC + 2 * HS], const RawRow<VEC>& a,
                                         int lane) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[HS + i] = a.own[i];
#pragma unroll
    for (int k = 1; k <= HS; ++k) {
        const int d = (k + VEC - 1) / VEC;
        const float l = __shfl_up_sync(FULL_MASK, a.own[VEC * d - k], d);
        const float r = __shfl_down_sync(FULL_MASK, a.own[k - 1 - VEC * (d - 1)], d);
        v[HS - k] = lane < d ? a.left[k - 1] : l;
        v[HS + VEC - 1 + k] = lane + d > 31 ? a.right[k - 1] : r;
    }
}

// One warp's strip: output rows y0 .. y0 + V - 1, walked down (UP false) or up (UP true).
// Walking up, the j-th row fetched is y0 + V - 1 + HR - j and the window's rows arrive in
// reverse, so tap row r meets the row fetched FR - 1 - r steps before the newest.
template <int VEC, int V, int PF, bool UP>
__device__ __forceinline__ void strip(const float* __restrict__ img, float* __restrict__ out,
                                      int H, int W, int y0, int c0, int lane,
                                      const float (&taps)[FR][FS]) {
    constexpr int NR = V + FR - 1;  // input rows a strip reads
    const int first = UP ? y0 + V - 1 + HR : y0 - HR, step = UP ? -1 : 1;
    RawRow<VEC> queue[PF];
    float win[FR][VEC + 2 * HS];
#pragma unroll
    for (int j = 0; j < PF && j < NR; ++j)
        load_row<VEC>(queue[j], img, H, W, first + step * j, c0, lane);
#pragma unroll
    for (int j = 0; j < NR; ++j) {
        assemble<VEC>(win[j % FR], queue[j % PF], lane);
        if (j + PF < NR) load_row<VEC>(queue[j % PF], img, H, W, first + step * (j + PF), c0, lane);
        if (j >= FR - 1) {
            const int o = j - (FR - 1);
            float acc[VEC];
#pragma unroll
            for (int i = 0; i < VEC; ++i) acc[i] = 0.0f;
#pragma unroll
            for (int r = 0; r < FR; ++r) {
#pragma unroll
                for (int s = 0; s < FS; ++s) {
#pragma unroll
                    for (int i = 0; i < VEC; ++i)
                        acc[i] = fmaf(taps[UP ? FR - 1 - r : r][s], win[(o + r) % FR][i + s],
                                      acc[i]);
                }
            }
            const int y = UP ? y0 + V - 1 - o : y0 + o;
            if (y < H && c0 < W) {
                if (VEC == 4) {
                    *reinterpret_cast<float4*>(out + y * W + c0) =
                        make_float4(acc[0], acc[VEC > 1 ? 1 : 0], acc[VEC > 2 ? 2 : 0],
                                    acc[VEC > 3 ? 3 : 0]);
                } else {
#pragma unroll
                    for (int i = 0; i < VEC; ++i)
                        if (c0 + i < W) out[y * W + c0 + i] = acc[i];
                }
            }
        }
    }
}

// This warp's strip of the block (a 1-D block of 32 WARPS threads, warps stacked
// vertically; blockIdx.x: 32 VEC columns, blockIdx.y: V WARPS rows): odd strips walk up
// when ALT (see filter2d). A warp past the bottom returns whole, so the shuffles in strip
// always see 32 lanes.
template <int VEC, int V, int WARPS, int PF, bool ALT>
__device__ __forceinline__ void warp_strip(const float* __restrict__ img,
                                           float* __restrict__ out, int H, int W,
                                           const float (&taps)[FR][FS]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c0 = (blockIdx.x * 32 + lane) * VEC;
    const int sg = blockIdx.y * WARPS + warp;  // strip index
    const int y0 = sg * V;
    if (y0 >= H) return;
    if (ALT && (sg & 1))
        strip<VEC, V, PF, true>(img, out, H, W, y0, c0, lane, taps);
    else
        strip<VEC, V, PF, false>(img, out, H, W, y0, c0, lane, taps);
}

#ifndef PLANE_TAPS
// Grid: (ceil(W / (32 VEC)), ceil(H / (V WARPS))); block: 32 WARPS threads (1-D). MINB:
// blocks per SM the registers must allow (0: the compiler's choice; 1 lets it hoist every
// load of the unrolled strip, at up to 255 registers). ALT: odd strips walk up, so the
// two strips on either side of every boundary read the rows they share at about the same
// time (both first, or both last) and the second read can hit in L1 or L2, instead of a strip's
// lifetime later, when the rows may have left the L2.
template <int VEC, int V, int WARPS, int PF, int MINB, bool ALT>
__global__ void __launch_bounds__(WARPS * 32, MINB)
filter2d(const float* __restrict__ img, float* __restrict__ out, int H, int W) {
    warp_strip<VEC, V, WARPS, PF, ALT>(img, out, H, W, TAPS);
}
#else
// The depthwise layer (groups = C, stride 1, padding FR/2 x FS/2) as one filter per plane:
// plane n C + c of x (H x W, NCHW) filtered with w[c] (FR x FS) into the same plane of y.
// Grid: (ceil(W / (32 VEC)), ceil(H / (V WARPS)), N C planes); block: 32 WARPS threads.
template <int VEC, int V, int WARPS, int PF, bool ALT>
__global__ void __launch_bounds__(WARPS * 32)
depthwise_strips(const float* __restrict__ x, const float* __restrict__ w,
                 float* __restrict__ y, int H, int W, int C) {
    const long long plane = blockIdx.z;
    float taps[FR][FS];
#pragma unroll
    for (int r = 0; r < FR; ++r)
#pragma unroll
        for (int s = 0; s < FS; ++s) taps[r][s] = w[(plane % C) * (FR * FS) + r * FS + s];
    warp_strip<VEC, V, WARPS, PF, ALT>(x + plane * H * W, y + plane * H * W, H, W, taps);
}
#endif
