"""Ladder step 9: the implicit GEMM in CUDA C, through CuPy ``RawKernel``.

What pure Numba cannot express, and this version uses:

- 128-bit global loads: the filter slab arrives in 16-byte pieces;
- asynchronous copies (``cp.async``, Ampere and later): global memory goes straight to
  shared memory without passing through registers, in a pipeline of STAGES slabs:
  while the block multiplies slab t, slabs t+1 .. t+STAGES-1 are in flight. The
  padding and the channel edge come free: ``cp.async`` with a source size of 0 bytes
  writes zeros;
- 128-bit stores of the outputs (``float4``) when a row of the output is a multiple of 4;
- 32-bit index arithmetic, ``#pragma unroll`` and templates: the tile shape is a
  compile-time constant, and every shape is one instantiation of one source.

The algorithm is the one of `conv07_implicit_gemm_warp_tiled`: reduction ordered
(r, s, c), filters rearranged once per call into a (R*S*Cp, Kp) matrix padded with zeros
(Cp: channels rounded up to BK, Kp: filters rounded up to BM) so that the filter loads
need no bounds test; a block computes BM filters x BN output pixels, a thread 8x8 of
them (2x2 sub-blocks of 4x4, a warp an 8x4 patch of threads). Optionally the reduction is
split over ``gridDim.z`` blocks (split-K, atomic adds into a zeroed output) for layers
with too few output tiles to fill the GPU. ``conv2d_implicit_gemm_cuda`` picks the tile
shape per layer (`choose`: the H200 autotuning table, else a rule);
``make_launcher(Config(...))`` fixes one.

NCHW float32, any stride / padding / dilation, any sizes (partial tiles are masked);
groups are refused. Needs CuPy (``pip install cupy-cuda12x``) and compute capability
>= 8.0 for ``cp.async``. `compile_ptx` compiles the source with NVRTC without a GPU
(CI does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._launch import Unsupported, ceil_div, conv_launch_params, launcher, picked_launcher
from ._launch import device_pointer as _ptr

CUDA_SOURCE = r"""
// Implicit-GEMM convolution, NCHW float32. Y[k, j] = sum_l A[l, k] * B[l, j],
// j = (n, p, q) output pixel, l = (r, s, c) reduction index.

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, int src_bytes) {
    // src_bytes = 0: nothing is read and the 4 bytes of shared memory become zero
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void st_global_v4(float* gmem, const float* v) {
    // one 128-bit store (the compiler, left alone, split the float4 store into four)
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};\n"
                 :: "l"(__cvta_generic_to_global(gmem)), "f"(v[0]), "f"(v[1]), "f"(v[2]),
                    "f"(v[3]) : "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}

// y[i] = ws[i] + ws[n + i] + ... + ws[(parts - 1) n + i], always in this order.
extern "C" __global__ void split_sum(const float* __restrict__ ws, float* __restrict__ y,
                                     long long n, int parts) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = ws[i];
        for (int p = 1; p < parts; ++p) v += ws[p * n + i];
        y[i] = v;
    }
}

// wt[((r*S + s)*Cp + c)*Kp + k] = w[k, c, r, s], zero where c >= C or k >= K.
extern "C" __global__ void rsck_weights(const float* __restrict__ w, float* __restrict__ wt,
                                        int K, int C, int R, int S, int Cp, int Kp) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= R * S * Cp * Kp) return;
    int k = i % Kp, rest = i / Kp;
    int c = rest % Cp, rs = rest / Cp;
    int r = rs / S, s = rs % S;
    wt[i] = (k < K && c < C) ? w[((k * C + c) * R + r) * S + s] : 0.0f;
}

template <int BM, int BN, int BK, int STAGES, int MINB>
__global__ void __launch_bounds__((BM / 8) * (BN / 8), MINB)
conv_igemm(const float* __restrict__ x, const float* __restrict__ wt, float* __restrict__ y,
           int N, int C, int H, int W, int K, int R, int S, int P, int Q,
           int sh, int sw, int ph, int pw, int dh, int dw, int Cp, int Kp, int tiles_per_split,
           int workspace)
{
    constexpr int NT = (BM / 8) * (BN / 8);
    constexpr int TX = BN / 8;          // threads along the pixels of the tile
    constexpr int WX = TX / 8;          // warps along the pixels
    constexpr int A_CHUNKS = BK * BM / 4;               // 16-byte pieces of a filter slab
    constexpr int A_PER = (A_CHUNKS + NT - 1) / NT;
    constexpr int B_PER = BK * BN / NT;                 // 4-byte pixels per thread per slab
    constexpr int B_STEP = NT / BN;
    static_assert(NT >= BN && NT % BN == 0, "one B column per thread");
    static_assert(TX >= 8 && (BM / 8) >= 4, "warp tiling needs 8x4 threads");

    __shared__ __align__(16) float As[STAGES][BK][BM];
    __shared__ __align__(16) float Bs[STAGES][BK][BN];

    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int tx = ((warp % WX) << 3) | (lane & 7);
    const int ty = ((warp / WX) << 2) | (lane >> 3);
    const int k0 = blockIdx.y * BM, j0 = blockIdx.x * BN;
    const int PQ = P * Q, HW = H * W, NPQ = N * PQ;
    const int CT = Cp / BK;                     // slabs per filter tap
    const int n_tiles = R * S * CT;
    const int t_begin = blockIdx.z * tiles_per_split;
    const int t_end = min(n_tiles, t_begin + tiles_per_split);

    // this thread's B column: one output pixel (clamped: extra columns are never stored)
    const int b_n = tid % BN, b_kk = tid / BN;
    const int j = min(j0 + b_n, NPQ - 1);
    const int img = j / PQ, pq = j - img * PQ, p = pq / Q, q = pq - p * Q;
    const int h_base = p * sh - ph, w_base = q * sw - pw;
    const float* x_img = x + (size_t)img * C * HW;

    // the next slab to load: index, tap (r, s), first channel
    int ld_t = t_begin;
    int ld_c0 = (t_begin % CT) * BK;
    int ld_r = (t_begin / CT) / S, ld_s = (t_begin / CT) % S;

    auto load_slab = [&](int stage) {
        const float* a_src = wt + (size_t)ld_t * BK * Kp + k0;
#pragma unroll
        for (int i = 0; i < A_PER; ++i) {
            int c = tid + i * NT;
            if (A_CHUNKS % NT == 0 || c < A_CHUNKS) {
                int kk = c / (BM / 4), m4 = (c % (BM / 4)) * 4;
                cp_async16(&As[stage][kk][m4], a_src + (size_t)kk * Kp + m4);
            }
        }
        const int h = h_base + ld_r * dh, w = w_base + ld_s * dw;
        const bool inside = (unsigned)h < (unsigned)H && (unsigned)w < (unsigned)W;
        const float* b_src = x_img + (size_t)(ld_c0 + b_kk) * HW + h * W + w;
#pragma unroll
        for (int i = 0; i < B_PER; ++i) {
            const int kk = b_kk + i * B_STEP;
            const bool ok = inside && (ld_c0 + kk < C);
            cp_async4(&Bs[stage][kk][b_n], ok ? (const void*)(b_src + (size_t)i * B_STEP * HW)
                                              : (const void*)x, ok ? 4 : 0);
        }
        ++ld_t;
        ld_c0 += BK;
        if (ld_c0 >= Cp) { ld_c0 = 0; if (++ld_s == S) { ld_s = 0; ++ld_r; } }
    };

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) acc[i][jj] = 0.0f;

#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
        if (t_begin + st < t_end) load_slab(st);
        cp_async_commit();
    }
    int st_compute = 0, st_load = STAGES - 1;
    for (int t = t_begin; t < t_end; ++t) {
        cp_async_wait<STAGES - 2>();   // slab t has landed (this thread's part) ...
        __syncthreads();               // ... everybody's, and slab t-1 is no longer read
        if (t + STAGES - 1 < t_end) load_slab(st_load);
        cp_async_commit();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            const float* as = &As[st_compute][kk][0];
            const float* bs = &Bs[st_compute][kk][0];
            const float4 a0 = *reinterpret_cast<const float4*>(as + ty * 4);
            const float4 a1 = *reinterpret_cast<const float4*>(as + BM / 2 + ty * 4);
            const float4 b0 = *reinterpret_cast<const float4*>(bs + tx * 4);
            const float4 b1 = *reinterpret_cast<const float4*>(bs + BN / 2 + tx * 4);
            const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int jj = 0; jj < 8; ++jj) acc[i][jj] = fmaf(a[i], b[jj], acc[i][jj]);
        }
        st_compute = (st_compute + 1 == STAGES) ? 0 : st_compute + 1;
        st_load = (st_load + 1 == STAGES) ? 0 : st_load + 1;
    }
    cp_async_wait<0>();

    // epilogue: y[img, k, p, q]; two runs of 4 neighbouring pixels per thread and filter.
    // Split-K: two parts add into y (a + b == b + a: reproducible); more parts each write
    // their own slice of a workspace, summed in a fixed order by split_sum.
    if (workspace) y += (size_t)blockIdx.z * ((size_t)N * K * PQ);
    const bool split = gridDim.z > 1 && !workspace;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int jb = j0 + half * (BN / 2) + tx * 4;
        if (jb >= NPQ) continue;
        const int ib = jb / PQ, pb = jb - ib * PQ;
        const bool vec = !split && (PQ % 4 == 0) && (jb + 3 < NPQ);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int k = k0 + (i / 4) * (BM / 2) + ty * 4 + (i % 4);
            if (k >= K) continue;
            const float* v = &acc[i][half * 4];
            if (vec) {
                st_global_v4(&y[((size_t)ib * K + k) * PQ + pb], v);
            } else {
                int im = ib, pp = pb;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (jb + e < NPQ) {
                        float* dst = &y[((size_t)im * K + k) * PQ + pp];
                        if (split) atomicAdd(dst, v[e]); else *dst = v[e];
                    }
                    if (++pp == PQ) { pp = 0; ++im; }
                }
            }
        }
    }
}
"""


@dataclass(frozen=True)
class Config:
    """A tile shape: BM filters x BN pixels x BK channels per slab, STAGES slabs in flight,
    MINB blocks per SM promised to the compiler (caps registers), SPLIT_K blocks per tile."""

    BM: int = 128
    BN: int = 128
    BK: int = 8
    STAGES: int = 3
    MINB: int = 2
    SPLIT_K: int = 1

    @property
    def threads(self) -> int:
        return (self.BM // 8) * (self.BN // 8)

    @property
    def name_expression(self) -> str:
        return f"conv_igemm<{self.BM}, {self.BN}, {self.BK}, {self.STAGES}, {self.MINB}>"

    def smem_bytes(self) -> int:
        return 4 * self.STAGES * self.BK * (self.BM + self.BN)

    def validate(self):
        for v, what in ((self.BM, "BM"), (self.BN, "BN"), (self.BK, "BK")):
            if v <= 0 or v & (v - 1):
                raise ValueError(f"{what} must be a power of two, got {v}")
        if self.BN < 64 or self.BM < 32 or self.threads < self.BN or self.threads % self.BN:
            raise ValueError(f"unsupported tile {self}: needs BN >= 64, BM >= 32, "
                             "threads >= BN")
        if self.STAGES < 2 or self.smem_bytes() > 48 * 1024:
            raise ValueError(f"{self}: STAGES >= 2 and at most 48 KB of shared memory")
        if not 1 <= self.SPLIT_K <= MAX_SPLIT_K:
            # two parts add atomically into the output (0 + a + b == 0 + b + a exactly);
            # with three or more the order of atomic adds would change the rounding from
            # run to run, so each part writes a workspace slice, summed in a fixed order.
            raise ValueError(f"{self}: SPLIT_K must be 1 to {MAX_SPLIT_K}")
        return self

    def __str__(self):
        s = f"{self.BM}x{self.BN}x{self.BK} s{self.STAGES} b{self.MINB}"
        return s + (f" splitK{self.SPLIT_K}" if self.SPLIT_K > 1 else "")


MAX_SPLIT_K = 16
DEFAULT = Config()
# Candidate shapes for the autotuner (convlab.autotune) and the H200 sweep.
CANDIDATES = [
    Config(128, 128, 8, 3, 2), Config(128, 128, 16, 3, 1), Config(128, 128, 8, 4, 2),
    Config(64, 128, 8, 3, 2), Config(64, 128, 16, 3, 2), Config(64, 128, 8, 4, 2),
    Config(128, 64, 8, 3, 2), Config(128, 64, 16, 3, 2), Config(128, 64, 16, 4, 2),
    Config(64, 64, 8, 4, 4), Config(64, 64, 16, 3, 4),
    Config(128, 128, 8, 3, 2, SPLIT_K=2), Config(128, 64, 8, 3, 2, SPLIT_K=2),
    Config(128, 64, 16, 3, 2, SPLIT_K=2), Config(64, 64, 8, 4, 4, SPLIT_K=2),
]

_MODULES: dict = {}


def _module(configs):
    """One CuPy RawModule with every requested template instantiation (cached)."""
    import cupy as cp

    names = tuple(sorted({c.name_expression for c in configs} | {DEFAULT.name_expression}))
    for key, mod in _MODULES.items():
        if set(names) <= set(key):
            return mod
    mod = cp.RawModule(code=CUDA_SOURCE, options=("-std=c++17",), name_expressions=names)
    _MODULES[names] = mod
    return mod


def prepare(configs=CANDIDATES):
    """Compile every configuration in one NVRTC call (the first launch would otherwise)."""
    _module(configs)


_PLANS: dict = {}


def _plan(name, x, w, out, stride, padding, dilation, groups, cfg: Config):
    """Everything a launch of one shape needs, computed once (see `_blocking.ConvPlan`)."""
    try:
        key = (name, x.shape, w.shape, out.shape, stride, padding, dilation, groups, cfg)
        plan = _PLANS.get(key)
    except TypeError:
        key, plan = None, None
    if plan is not None and x.dtype == w.dtype == out.dtype == np.float32:
        return plan
    import cupy as cp

    p = conv_launch_params(name, x, w, out, stride, padding, dilation, groups)
    cfg.validate()
    if max(p.N * p.C * p.H * p.W, p.N * p.K * p.P * p.Q, p.R * p.S * p.C * p.K) >= 2**31:
        raise Unsupported(f"{name} uses 32-bit indices: tensors must have fewer than 2**31 "
                          "elements")
    mod = _module([cfg])
    Cp = ceil_div(p.C, cfg.BK) * cfg.BK
    Kp = ceil_div(p.K, cfg.BM) * cfg.BM
    n_wt = p.R * p.S * Cp * Kp
    wt = cp.empty(n_wt, dtype=cp.float32)  # rewritten by every call (stream-ordered)
    n_tiles = p.R * p.S * (Cp // cfg.BK)
    per_split = ceil_div(n_tiles, cfg.SPLIT_K)
    split = ceil_div(n_tiles, per_split)
    grid = (ceil_div(p.N * p.P * p.Q, cfg.BN), ceil_div(p.K, cfg.BM), split)
    if grid[1] > 65535:
        raise Unsupported(f"K={p.K} needs {grid[1]} block rows; CUDA allows 65535")
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
    i32 = np.int32
    n_out = p.N * p.K * p.P * p.Q
    ws = cp.empty(split * n_out, dtype=cp.float32) if split > 2 else None
    plan = dict(
        p=p, wt=wt, split=split, out_bytes=4 * n_out, n_out=n_out, ws=ws,
        sum_fn=mod.get_function("split_sum"),
        sum_grid=(min(ceil_div(n_out, 256), 4 * SMS),),
        wt_fn=mod.get_function("rsck_weights"), wt_grid=(ceil_div(n_wt, 256),),
        wt_tail=(wt, *(i32(v) for v in (p.K, p.C, p.R, p.S, Cp, Kp))),
        fn=mod.get_function(cfg.name_expression), grid=grid, block=(cfg.threads,),
        tail=tuple(i32(v) for v in (p.N, p.C, p.H, p.W, p.K, p.R, p.S, p.P, p.Q, sh, sw, ph,
                                    pw, dh, dw, Cp, Kp, per_split, int(split > 2))))
    if key is not None:
        if len(_PLANS) > 256:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def conv_igemm_launch(x, w, out, plan):
    """Launch the weight transform and the implicit GEMM (two RawKernel calls)."""
    import cupy as cp

    u64 = np.uint64
    plan["wt_fn"](plan["wt_grid"], (256,), (u64(_ptr(w)), *plan["wt_tail"]))
    ws = plan["ws"]  # 3+ parts: each into its workspace slice, then one fixed-order sum
    if ws is None and plan["split"] > 1:  # two parts add their sums into a zeroed output
        cp.cuda.runtime.memsetAsync(_ptr(out), 0, plan["out_bytes"],
                                    cp.cuda.get_current_stream().ptr)
    plan["fn"](plan["grid"], plan["block"],
               (u64(_ptr(x)), plan["wt"], u64(_ptr(out)) if ws is None else ws, *plan["tail"]))
    if ws is not None:
        plan["sum_fn"](plan["sum_grid"], (256,), (ws, u64(_ptr(out)), np.int64(plan["n_out"]),
                                                   np.int32(plan["split"])))
    return out


def make_launcher(cfg: Config = DEFAULT, name: str = "conv2d_implicit_gemm_cuda"):
    """A conv launcher (common signature) for one tile configuration."""
    cfg.validate()

    @launcher
    def conv2d_implicit_gemm_cuda(x, w, out, stride=1, padding=0, dilation=1, groups=1):
        plan = _plan(name, x, w, out, stride, padding, dilation, groups, cfg)
        return conv_igemm_launch(x, w, out, plan)

    conv2d_implicit_gemm_cuda.__name__ = name
    conv2d_implicit_gemm_cuda.config = cfg
    return conv2d_implicit_gemm_cuda


SMS = 132  # H200 multiprocessors, for the fallback rule


def split_for(blocks: int, k_tiles: int) -> int:
    """Parts to split the reduction into so that `blocks` output tiles give about two
    blocks per SM, each part keeping at least 4 of the `k_tiles` reduction slabs."""
    return max(1, min(MAX_SPLIT_K, ceil_div(2 * SMS, blocks), k_tiles // 4))


def heuristic(p) -> Config:
    """The rule behind the H200 table (batch 32), for layers it does not hold: 64x64x16
    tiles for K <= 64, else 128x64x16; the reduction split (`split_for`) when the output
    has too few tiles to fill the GPU (batch 1, the late layers)."""
    npq = p.N * p.P * p.Q
    small = p.K <= 64
    cfg = Config(64, 64, 16, 3, 4) if small else Config(128, 64, 16, 3, 2)
    blocks = ceil_div(p.K, cfg.BM) * ceil_div(npq, cfg.BN)
    if blocks < SMS:  # fewer tiles than SMs: split the reduction to fill the GPU
        split = split_for(blocks, p.R * p.S * ceil_div(p.C, cfg.BK))
    else:  # the table's rule: two parts below two blocks per SM
        split = 2 if not small and blocks < 2 * SMS else 1
    return Config(cfg.BM, cfg.BN, cfg.BK, cfg.STAGES, cfg.MINB, SPLIT_K=split)


def choose(p) -> Config:
    """The tile shape for ConvParams p: the H200 autotuning table, else `heuristic`."""
    from .. import results

    cfg = results.tuned("cuda").get(results.problem_key(p))
    return Config(**cfg) if cfg else heuristic(p)


_BY_CONFIG: dict = {}


def _launcher_of(cfg):
    """The (one, shared) launcher of tile shape cfg."""
    return _BY_CONFIG.get(cfg) or _BY_CONFIG.setdefault(cfg, make_launcher(cfg))


conv2d_implicit_gemm_cuda = picked_launcher(
    "conv2d_implicit_gemm_cuda", _launcher_of, choose,
    "The CUDA C implicit GEMM with the tile shape `choose` picks for this layer.")


# ----------------------------------------------------------------------------------------
# Compiling without a GPU (CI): NVRTC from cuda-python


def compile_ptx(configs=(DEFAULT,), arch: str = "compute_90") -> str:
    """Compile CUDA_SOURCE with NVRTC for `arch` (no GPU needed); return the PTX.

    Raises RuntimeError with NVRTC's log if the source does not compile.
    """
    from ._nvrtc import nvrtc_ptx

    return nvrtc_ptx(CUDA_SOURCE, "conv_igemm.cu", [c.name_expression for c in configs], arch)
