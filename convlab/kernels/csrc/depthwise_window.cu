// Depthwise convolution (groups = C, w (C, 1, R, S)), NCHW fp32, stride 1, "same" padding
// (P = H, Q = W, PH = R / 2, PW = S / 2), with no shared memory and no barrier: shaped like
// a copy kernel, one short run of y per thread.
//
// Thread t computes the V outputs of the flattened y at f0 = t V .. f0 + V - 1 (one plane:
// H W % V == 0). The output at flat index f reads x at f + (r - PH) W + (s - PW) for every
// output, whatever its row: the flat offset is the same, only which taps fall outside the
// plane changes (a test of the output's row and column, per tap). So, per filter row r, the
// V outputs read one run of x, [f0 + (r - PH) W - PW, f0 + (r - PH) W + V - 1 + S - 1 - PW];
// the thread loads the LW-float vectors covering each run into registers (LW = 4: 16-byte
// loads, f0 and the plane starts on 16 bytes) and every register it reads is a
// compile-time index. Neighbouring threads' runs overlap: the overlap is meant to come
// from L1/L2, so that DRAM sees each byte of x about once. Vector indices are clamped into x; a clamped
// vector only feeds taps outside the plane, which are zero.
// CS_STORES: the stores are streaming (st.global.cs: y is not read again soon).
// Every shape is a template parameter: divisions by constants, loops unrolled.

template <int LW> struct VecOf { typedef float type; };
template <> struct VecOf<2> { typedef float2 type; };
template <> struct VecOf<4> { typedef float4 type; };

template <int LW>
__device__ __forceinline__ void unpack(const typename VecOf<LW>::type& v, float* out);
template <> __device__ __forceinline__ void unpack<1>(const float& v, float* out) {
    out[0] = v;
}
template <> __device__ __forceinline__ void unpack<2>(const float2& v, float* out) {
    out[0] = v.x; out[1] = v.y;
}
template <> __device__ __forceinline__ void unpack<4>(const float4& v, float* out) {
    out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
}
template <int LW>
__device__ __forceinline__ typename VecOf<LW>::type pack(const float* in);
template <> __device__ __forceinline__ float pack<1>(const float* in) { return in[0]; }
template <> __device__ __forceinline__ float2 pack<2>(const float* in) {
    return make_float2(in[0], in[1]);
}
template <> __device__ __forceinline__ float4 pack<4>(const float* in) {
    return make_float4(in[0], in[1], in[2], in[3]);
}

// floor(a / b) for a compile-time b > 0 and a of either sign
__host__ __device__ constexpr int floor_div(int a, int b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// First vector (in floats, relative to f0) and vector count of filter row r's run.
template <int W, int S, int V, int LW, int PH, int PW>
struct Run {
    __host__ __device__ static constexpr int lo(int r) {
        return floor_div((r - PH) * W - PW, LW) * LW;
    }
    __host__ __device__ static constexpr int count(int r) {
        return (floor_div((r - PH) * W + V - 1 + S - 1 - PW, LW) * LW - lo(r)) / LW + 1;
    }
    __host__ __device__ static constexpr int most(int R) {  // the longest run's count
        int n = 0;
        for (int r = 0; r < R; ++r) n = count(r) > n ? count(r) : n;
        return n;
    }
};

// Grid: ceil(N C H W / (V U THREADS)) blocks of THREADS threads; total = N C H W floats.
// With U > 1, thread t of the grid's G threads takes the runs of V outputs t, t + G, ...,
// t + (U - 1) G, every load of all of them written first (more bytes in flight per
// thread; each warp's stores stay contiguous; ptxas still places some loads among the
// FMAs of earlier runs).
template <int H, int W, int R, int S, int V, int U, int LW, int THREADS, bool CS_STORES>
__global__ void __launch_bounds__(THREADS)
depthwise_window(const float* __restrict__ x, const float* __restrict__ w,
                 float* __restrict__ y, int total, int C) {
    static_assert(V % LW == 0 && (H * W) % V == 0, "V outputs of one plane, LW-aligned");
    static_assert(R % 2 == 1 && S % 2 == 1, "odd filters ('same' padding)");
    constexpr int PH = R / 2, PW = S / 2, HW = H * W;
    typedef typename VecOf<LW>::type T;
    typedef Run<W, S, V, LW, PH, PW> RunOf;
    constexpr int MAXN = RunOf::most(R);
    const int G = gridDim.x * THREADS;
    const int t = blockIdx.x * THREADS + threadIdx.x;
    if (t * V >= total) return;  // and every later run of the thread
    const T* xv = reinterpret_cast<const T*>(x);
    const int last = total / LW - 1;

    // 1. every load of the thread, written before the first FMA
    float win[U][R][MAXN * LW];
    float taps[U][R * S];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int g = t + u * G;  // the run: outputs g V .. g V + V - 1
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int k = 0; k < MAXN; ++k) {
                if (k < RunOf::count(r)) {  // a constant once r is unrolled
                    const int i = min(max(g * (V / LW) + RunOf::lo(r) / LW + k, 0), last);
                    unpack<LW>(__ldg(xv + i), &win[u][r][k * LW]);
                }
            }
        }
        const float* tw = w + (min(g * V, total - 1) / HW % C) * (R * S);
#pragma unroll
        for (int i = 0; i < R * S; ++i) taps[u][i] = __ldg(tw + i);
    }

    // 2. V outputs per run from registers: tap (r, s) of output v is win[r][v + s - PW +
    // (r - PH) W - lo(r)], zero where row or column falls outside the plane (every run,
    // even one past the end: a test here would let the compiler sink its loads below it)
    float out[U][V];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int f0 = (t + u * G) * V;
        const int pos0 = f0 - f0 / HW * HW;
#pragma unroll
        for (int v = 0; v < V; ++v) {
            const int p = (pos0 + v) / W, q = (pos0 + v) - (pos0 + v) / W * W;
            float acc = 0.0f;
#pragma unroll
            for (int rr = 0; rr < R; ++rr) {  // last row first: with u = 1 ptxas (sm_90)
                const int r = R - 1 - rr;      // then issues all loads but one before the
                                               // first FMA (tools/sass_window_loads.py)
                const bool rok = p + r - PH >= 0 && p + r - PH < H;
#pragma unroll
                for (int ss = 0; ss < S; ++ss) {
                    const int s = S - 1 - ss;
                    const bool ok = rok && q + s - PW >= 0 && q + s - PW < W;
                    const float a = win[u][r][v + s - PW + (r - PH) * W - RunOf::lo(r)];
                    acc = fmaf(taps[u][r * S + s], ok ? a : 0.0f, acc);
                }
            }
            out[u][v] = acc;
        }
    }

    // 3. V / LW vector stores per run inside y
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int f0 = (t + u * G) * V;
        if (f0 >= total) break;
        T* yv = reinterpret_cast<T*>(y + f0);
#pragma unroll
        for (int k = 0; k < V / LW; ++k) {
            if (CS_STORES) __stcs(yv + k, pack<LW>(&out[u][k * LW]));
            else yv[k] = pack<LW>(&out[u][k * LW]);
        }
    }
}
