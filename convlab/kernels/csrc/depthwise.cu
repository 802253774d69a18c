// Depthwise convolution (groups = C, w (C, 1, R, S)), NCHW fp32, shaped like a copy:
// y[n][c][p][q] = sum_{r,s} w[c][0][r][s] * x[n][c][p ST - PH + r][q ST - PW + s].
//
// A block owns one contiguous piece of x and one of y: G whole planes (TP == P; G planes
// of NCHW lie one after the other) or a band of TP output rows of one plane (G == 1; the
// input rows of a band are contiguous too). Three phases:
//  1. copy the input piece into shared memory exactly as it lies in memory, every load
//     of a thread issued before the first store (VEC = 4: 16-byte loads and stores);
//  2. compute: a thread takes V outputs down one column and slides down its window of
//     (V-1) ST + R rows x S in shared memory (zero outside the image and the rows the
//     block holds: a test per window row and column, not per tap); each row it reads
//     feeds the up to R outputs it belongs to; the outputs go to a shared output tile;
//  3. copy the output tile to y, contiguous (VEC = 4: 16-byte stores).
// A grid smaller than the number of pieces makes the blocks persistent: a block loops
// over pieces b, b + gridDim.x, ..., and issues the loads of its next piece before it
// computes the current one, so its loads stay in flight through phases 2 and 3 (the
// blocks of a one-piece-per-block grid all load, then all compute, in step).
// Every shape is a template parameter: divisions by constants, loops unrolled.

template <int VEC> struct VecOf { typedef float type; };
template <> struct VecOf<4> { typedef float4 type; };

// Loads of n elements of VEC floats into registers r (THREADS threads, N per thread at
// most), and their stores: split so that other work can run while the loads are in flight.
template <int VEC, int THREADS, int N>
__device__ __forceinline__ void load_piece(typename VecOf<VEC>::type (&r)[N],
                                           const typename VecOf<VEC>::type* __restrict__ src,
                                           int n, int tid) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
        const int i = tid + k * THREADS;
        if (i < n) r[k] = src[i];
    }
}

template <int VEC, int THREADS, int N>
__device__ __forceinline__ void store_piece(typename VecOf<VEC>::type* __restrict__ dst,
                                            const typename VecOf<VEC>::type (&r)[N], int n,
                                            int tid) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
        const int i = tid + k * THREADS;
        if (i < n) dst[i] = r[k];
    }
}

// Piece b: plane0 and gcount planes (whole planes), or band `band` (rows p0 .. p0 + pc - 1)
// of plane plane0; its input rows h_lo .. h_hi - 1 at x + in_off (in_len floats).
struct Piece { int plane0, gcount, p0, pc, h_lo, h_hi, in_off, in_len; };

template <int H, int W, int P, int R, int ST, int PH, int G, int TP>
__device__ __forceinline__ Piece piece(int b, int NC) {
    constexpr bool WHOLE = TP == P;
    constexpr int BANDS = (P + TP - 1) / TP;
    Piece c;
    const int band = b % BANDS;
    c.plane0 = (b / BANDS) * G;
    c.gcount = min(G, NC - c.plane0);
    c.p0 = band * TP;
    c.pc = min(TP, P - c.p0);
    c.h_lo = WHOLE ? 0 : max(0, c.p0 * ST - PH);
    c.h_hi = WHOLE ? H : min(H, (c.p0 + c.pc - 1) * ST - PH + R);
    c.in_off = c.plane0 * (H * W) + c.h_lo * W;
    c.in_len = WHOLE ? c.gcount * (H * W) : (c.h_hi - c.h_lo) * W;
    return c;
}

#define DW_PARAMS int H, int W, int P, int Q, int R, int S, int ST, int PH, int PW, int G, \
    int TP, int V, int THREADS, int VEC
#define DW_ARGS H, W, P, Q, R, S, ST, PH, PW, G, TP, V, THREADS, VEC

// Phase 2 for piece `cur`: tin (its input rows), taps -> tout. Item = (plane g, strip,
// column q), column fastest.
template <DW_PARAMS>
__device__ __forceinline__ void compute_piece(const Piece& cur, const float* tin,
                                              const float* taps, float* tout, int tid) {
    constexpr int TR = TP == P ? H : (TP - 1) * ST + R;
    constexpr int RS = R * S;
    constexpr int STRIPS = (TP + V - 1) / V;
    constexpr int ITEMS = G * STRIPS * Q;
    constexpr int ROWS = (V - 1) * ST + R;
#pragma unroll
    for (int k = 0; k < (ITEMS + THREADS - 1) / THREADS; ++k) {
        const int it = tid + k * THREADS;
        const int g = it / (STRIPS * Q);
        const int rest = it - g * (STRIPS * Q);
        const int strip = rest / Q;
        const int q = rest - strip * Q;
        const int lp = strip * V;  // first output row of the strip, in the band
        if (it < ITEMS && g < cur.gcount && lp < cur.pc) {
            float tw[RS];
#pragma unroll
            for (int t = 0; t < RS; ++t) tw[t] = taps[g * RS + t];
            const float* plane = tin + g * (TR * W);
            const int hb = (cur.p0 + lp) * ST - PH, wb = q * ST - PW;
            float acc[V];
#pragma unroll
            for (int o = 0; o < V; ++o) acc[o] = 0.0f;
#pragma unroll
            for (int j = 0; j < ROWS; ++j) {  // window row j feeds outputs (j - r) / ST
                const int h = hb + j;
                const bool hok = h >= cur.h_lo && h < cur.h_hi;  // h_lo >= 0, h_hi <= H
                float a[S];
#pragma unroll
                for (int s = 0; s < S; ++s) {
                    const int c = wb + s;
                    a[s] = (hok && c >= 0 && c < W) ? plane[(h - cur.h_lo) * W + c] : 0.0f;
                }
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const int o = (j - r) / ST;
                    if (j >= r && (j - r) % ST == 0 && o < V) {
#pragma unroll
                        for (int s = 0; s < S; ++s) acc[o] = fmaf(tw[r * S + s], a[s], acc[o]);
                    }
                }
            }
#pragma unroll
            for (int o = 0; o < V; ++o)
                if (lp + o < cur.pc) tout[g * (TP * Q) + (lp + o) * Q + q] = acc[o];
        }
    }
}

// Phase 3: the output tile of piece `cur` -> y (contiguous).
template <DW_PARAMS>
__device__ __forceinline__ void store_output(const Piece& cur, const float* tout,
                                             float* __restrict__ y, int tid) {
    typedef typename VecOf<VEC>::type T;
    constexpr int NOUT = (G * TP * Q / VEC + THREADS - 1) / THREADS;
    const int out_len = TP == P ? cur.gcount * (P * Q) : cur.pc * Q;
    T o[NOUT];
    load_piece<VEC, THREADS, NOUT>(o, reinterpret_cast<const T*>(tout), out_len / VEC, tid);
    store_piece<VEC, THREADS, NOUT>(reinterpret_cast<T*>(y + cur.plane0 * (P * Q) + cur.p0 * Q),
                                    o, out_len / VEC, tid);
}

// Grid: BANDS * ceil(NC / G) blocks, one per piece (the bands of a plane group are
// neighbours), or fewer with PERSIST; 1-D blocks of THREADS. NC = N * C planes.
template <DW_PARAMS, bool PERSIST>
__global__ void __launch_bounds__(THREADS)
depthwise(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
          int NC, int C) {
    static_assert(TP == P || G == 1, "bands of one plane per block");
    constexpr int BANDS = (P + TP - 1) / TP;
    constexpr int TR = TP == P ? H : (TP - 1) * ST + R;  // input rows held per plane
    constexpr int IN = G * TR * W, OUT = G * TP * Q, RS = R * S;
    constexpr int NIN = (IN / VEC + THREADS - 1) / THREADS;
    typedef typename VecOf<VEC>::type T;
    __shared__ __align__(16) float tin[IN];
    __shared__ __align__(16) float tout[OUT];
    __shared__ float taps[G * RS];

    const int tid = threadIdx.x;
    const int pieces = BANDS * ((NC + G - 1) / G);
    int b = blockIdx.x;
    if (b >= pieces) return;  // the whole block
    Piece cur = piece<H, W, P, R, ST, PH, G, TP>(b, NC);
    T r[NIN];
    load_piece<VEC, THREADS, NIN>(r, reinterpret_cast<const T*>(x + cur.in_off),
                                  cur.in_len / VEC, tid);
    while (true) {
        // 1. the loaded piece -> shared memory; the taps of its planes (the previous piece
        // finished reading tin and taps before the barrier ahead of its phase 3)
        store_piece<VEC, THREADS, NIN>(reinterpret_cast<T*>(tin), r, cur.in_len / VEC, tid);
        for (int t = tid; t < cur.gcount * RS; t += THREADS)
            taps[t] = w[((cur.plane0 + t / RS) % C) * RS + t % RS];
        __syncthreads();
        const int nb = b + gridDim.x;  // the next piece: its loads in flight from here on
        if (PERSIST && nb < pieces) {
            const Piece nxt = piece<H, W, P, R, ST, PH, G, TP>(nb, NC);
            load_piece<VEC, THREADS, NIN>(r, reinterpret_cast<const T*>(x + nxt.in_off),
                                          nxt.in_len / VEC, tid);
        }
        compute_piece<DW_ARGS>(cur, tin, taps, tout, tid);  // 2.
        __syncthreads();
        store_output<DW_ARGS>(cur, tout, y, tid);  // 3.
        if (!PERSIST || nb >= pieces) break;
        b = nb;
        cur = piece<H, W, P, R, ST, PH, G, TP>(b, NC);
    }
}
