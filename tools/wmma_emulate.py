"""Run the WMMA kernels' CUDA C on the CPU, to test their index and pipeline logic
without a GPU (a developer tool; needs g++ with C++20).

    .venv/bin/python tools/wmma_emulate.py            # every candidate config, both modes

The kernel source (convlab/kernels/wmma01_gemm_cuda.py) is compiled by g++ with
``-DCONVLAB_EMULATE`` and this prelude in place of the PTX helpers:

- every CUDA thread is an OS thread (``std::thread``); ``__syncthreads`` is a
  ``std::barrier`` over the block, ``__syncwarp`` one over the warp; blocks run one after
  the other, so ``__shared__`` becomes a function-local ``static``;
- a WMMA "fragment" holds the whole 16x16 tile in every lane (each lane does the warp's
  work redundantly: identical writes), so the fragment layouts inside a warp are not
  modelled (they belong to the hardware), but every address, stride, layout flag
  (row / col), bound, stage and barrier of the kernels is;
- ``cp.async`` copies land either when issued ("early") or only at the
  ``cp.async.wait_group`` that guarantees them ("late"): a read of a slab before its wait,
  or a write into a slab other warps still read, shows up as a wrong answer.

Each kernel is compared with float64 NumPy on fp16-rounded inputs (odd sizes for the conv).
"""

from __future__ import annotations

import ctypes
import hashlib
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

PRELUDE = r"""
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>
using std::min; using std::max;
struct dim3_ { unsigned x = 0, y = 0, z = 0; };
thread_local dim3_ threadIdx, blockIdx;
dim3_ gridDim, blockDim;
struct uint4 { unsigned x, y, z, w; };
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
std::barrier<>* g_block_bar = nullptr;
std::vector<std::unique_ptr<std::barrier<>>> g_warp_bars;
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
inline void __syncwarp() { g_warp_bars[threadIdx.x / 32]->arrive_and_wait(); }

typedef unsigned short half_t;
inline float h2f(half_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? std::ldexp((float)m, -24) : std::ldexp((float)(m | 1024), e - 25);
    return s ? -v : v;
}
inline half_t f32_to_f16(float f) {    // round to nearest even (finite, in range)
    _Float16 h = (_Float16)f;
    half_t u; std::memcpy(&u, &h, 2); return u;
}
struct FragAB { float v[256]; };   // the whole 16x16 tile, in every lane
struct FragC  { float v[256]; };
inline void frag_zero(FragC& c) { for (int i = 0; i < 256; ++i) c.v[i] = 0.0f; }
inline void load_a_row(FragAB& f, const half_t* p, int ld) {
    for (int m = 0; m < 16; ++m) for (int k = 0; k < 16; ++k)
        f.v[m * 16 + k] = h2f(p[m * ld + k]); }
inline void load_a_col(FragAB& f, const half_t* p, int ld) {
    for (int m = 0; m < 16; ++m) for (int k = 0; k < 16; ++k)
        f.v[m * 16 + k] = h2f(p[k * ld + m]); }
inline void load_b_row(FragAB& f, const half_t* p, int ld) {
    for (int k = 0; k < 16; ++k) for (int n = 0; n < 16; ++n)
        f.v[k * 16 + n] = h2f(p[k * ld + n]); }
inline void load_a_row_s(FragAB& f, const half_t* p, int ld) { load_a_row(f, p, ld); }
inline void load_a_col_s(FragAB& f, const half_t* p, int ld) { load_a_col(f, p, ld); }
inline void load_b_row_s(FragAB& f, const half_t* p, int ld) { load_b_row(f, p, ld); }
inline void mma_(FragC& d, const FragAB& a, const FragAB& b) {
    for (int m = 0; m < 16; ++m) for (int n = 0; n < 16; ++n) {
        double s = 0; for (int k = 0; k < 16; ++k) s += (double)a.v[m * 16 + k] * b.v[k * 16 + n];
        d.v[m * 16 + n] += (float)s; } }
inline void mma_row_row(FragC& d, const FragAB& a, const FragAB& b) { mma_(d, a, b); }
inline void mma_col_row(FragC& d, const FragAB& a, const FragAB& b) { mma_(d, a, b); }
inline void store_c(float* p, const FragC& c, int ld) {
    for (int m = 0; m < 16; ++m) for (int n = 0; n < 16; ++n) p[m * ld + n] = c.v[m * 16 + n]; }
inline void store_c_s(float* p, const FragC& c, int ld) { store_c(p, c, ld); }
inline const half_t* to_shared(const half_t* p) { return p; }
inline float* to_shared(float* p) { return p; }

// cp.async: copies land at issue (early) or at the wait that guarantees them (late)
int g_late = 0;
struct Copy { void* dst; const void* src; };
thread_local std::vector<Copy> t_open;
thread_local std::vector<std::vector<Copy>> t_groups;
inline void cp_async16(void* smem, const void* gmem) {
    if (g_late) t_open.push_back({smem, gmem}); else std::memcpy(smem, gmem, 16); }
inline void cp_async_commit() { t_groups.push_back(t_open); t_open.clear(); }
template <int N> inline void cp_async_wait() {
    while ((int)t_groups.size() > N) {
        for (auto& c : t_groups.front()) std::memcpy(c.dst, c.src, 16);
        t_groups.erase(t_groups.begin()); } }

template <typename F>
void run_grid(unsigned gx, unsigned gy, unsigned gz, unsigned nt, F body) {
    gridDim = {gx, gy, gz}; blockDim = {nt, 1, 1};
    for (unsigned bz = 0; bz < gz; ++bz) for (unsigned by = 0; by < gy; ++by)
    for (unsigned bx = 0; bx < gx; ++bx) {
        std::barrier<> bar(nt); g_block_bar = &bar;
        g_warp_bars.clear();
        for (unsigned w = 0; w < (nt + 31) / 32; ++w)
            g_warp_bars.emplace_back(new std::barrier<>(std::min(32u, nt - 32 * w)));
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < nt; ++t) ts.emplace_back([=] {
            threadIdx = {t, 0, 0}; blockIdx = {bx, by, bz};
            t_open.clear(); t_groups.clear();
            body(); });
        for (auto& t : ts) t.join();
    }
}
"""


def compile_library(src: str, stem: str, workdir=None,
                    flags=("-O1", "-pthread", "-DCONVLAB_EMULATE")) -> ctypes.CDLL:
    """g++ -shared of `src` (C++20, `flags`), cached by content in workdir or the temp dir."""
    tag = hashlib.sha1(src.encode()).hexdigest()[:12]
    work = Path(workdir or tempfile.gettempdir())
    so = work / f"{stem}_{tag}.so"
    if not so.exists():
        cpp = work / f"{stem}_{tag}.cpp"
        cpp.write_text(src)
        r = subprocess.run(["g++", "-std=c++20", *flags, "-shared", "-fPIC", "-w", str(cpp),
                            "-o", str(so)], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(r.stderr[-4000:])
    return ctypes.CDLL(str(so))


def _load_kernels():
    """The kernel module without importing convlab.kernels (which imports numba)."""
    import importlib.util

    pkg = types.ModuleType("convlab.kernels")
    pkg.__path__ = [str(ROOT / "convlab" / "kernels")]
    sys.modules.setdefault("convlab.kernels", pkg)
    spec = importlib.util.spec_from_file_location(
        "convlab.kernels.wmma01_gemm_cuda", ROOT / "convlab" / "kernels" / "wmma01_gemm_cuda.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def build(gemm_cfgs, conv_cfgs, workdir=None):
    wm = _load_kernels()
    lines = [PRELUDE, wm.CUDA_SOURCE, 'extern "C" {']
    lines.append("void run_simple(const half_t* a, const half_t* b, float* c, int M, int N, "
                 "int K, int late) { g_late = late; run_grid(N / 16, M / 16, 1, 32, [=] { "
                 "wmma_gemm_simple(a, b, c, M, N, K); }); }")
    for i, c in enumerate(gemm_cfgs):
        lines.append(
            f"void run_gemm{i}(const half_t* a, const half_t* b, float* c, int M, int N, int K,"
            f" int late) {{ g_late = late; run_grid(N / {c.BN}, M / {c.BM}, 1, {c.threads}, "
            f"[=] {{ wmma_gemm_tiled<{c.BM}, {c.BN}, {c.BK}, {c.WM}, {c.WN}, {c.STAGES}>"
            f"(a, b, c, M, N, K); }}); }}")
    for i, c in enumerate(conv_cfgs):
        lines.append(
            f"void run_conv{i}(const half_t* x, const half_t* wt, float* y, const int* a, "
            f"int gx, int gy) {{ run_grid(gx, gy, 1, {c.threads}, [=] {{ "
            f"wmma_conv<{c.BM}, {c.BN}, {c.BK}, {c.WM}, {c.WN}>(x, wt, y, a[0], a[1], a[2], "
            "a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], "
            "a[15], a[16]); }); }")
    lines.append("void run_pack(const void* w, half_t* wt, int half, int K, int C, int R, "
                 "int S, int Cp, int Kp) { int n = R * S * Cp * Kp; run_grid((n + 255) / 256,"
                 " 1, 1, 256, [=] { if (half) pack_filters<true>(w, wt, K, C, R, S, Cp, Kp); "
                 "else pack_filters<false>(w, wt, K, C, R, S, Cp, Kp); }); }")
    lines.append("}")
    return compile_library("\n".join(lines), "wmma_emulate", workdir), wm


def _p(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def gemm_case(lib, fn, M, N, K, late, rng):
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    c = np.full((M, N), np.nan, np.float32)
    getattr(lib, fn)(_p(a), _p(b), _p(c), M, N, K, late)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    absref = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    err = np.abs(c - ref) / absref
    return float(np.nanmax(err)) if np.isfinite(c).all() else float("inf")


def conv_case(lib, wm, i, cfg, xs, ws, stride, pad, dil, rng, w_half=False):
    from convlab import reference as ref

    x = rng.standard_normal(xs).astype(np.float16)
    w = rng.standard_normal(ws).astype(np.float16 if w_half else np.float32)
    p = ref.conv_params(xs, ws, stride, pad, dil)
    Cp = -(-p.C // cfg.BK) * cfg.BK
    Kp = -(-p.K // cfg.BM) * cfg.BM
    wt = np.full(p.R * p.S * Cp * Kp, 0x7E00, np.uint16).view(np.float16)
    lib.run_pack(_p(w), _p(wt), int(w_half), p.K, p.C, p.R, p.S, Cp, Kp)
    y = np.full(p.out_shape, np.nan, np.float32)
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
    args = np.array([p.N, p.C, p.H, p.W, p.K, p.R, p.S, p.P, p.Q, sh, sw, ph, pw, dh, dw, Cp,
                     Kp], np.int32)
    gx, gy = -(-p.N * p.P * p.Q // cfg.BN), -(-p.K // cfg.BM)
    getattr(lib, f"run_conv{i}")(_p(x), _p(wt), _p(y), _p(args), gx, gy)
    w16 = w.astype(np.float16).astype(np.float64)
    exp = ref.conv2d(x.astype(np.float64), w16, stride=stride, padding=pad, dilation=dil)
    absr = ref.conv2d(np.abs(x.astype(np.float64)), np.abs(w16), stride=stride, padding=pad,
                      dilation=dil)
    if not np.isfinite(y).all():
        return float("inf")
    return float(np.max(np.abs(y - exp) / (absr + 1e-30)))


def main() -> int:
    sys.path.insert(0, str(ROOT))
    wm = _load_kernels()
    gemm_cfgs = [c.validate() for c in wm.GEMM_CANDIDATES]
    conv_cfgs = [c.validate() for c in wm.CONV_CANDIDATES]
    lib, wm = build(gemm_cfgs, conv_cfgs)
    rng = np.random.default_rng(0)
    tol = 1e-5  # fp32 sums of exact fp16 products, relative to sum |a||b|
    bad = 0
    for late in (0, 1):
        e = gemm_case(lib, "run_simple", 32, 48, 64, late, rng)
        print(f"simple 32x48x64 late={late}: max rel err {e:.1e}")
        bad += not e < tol
        for i, c in enumerate(gemm_cfgs):
            M, N, K = 2 * c.BM, c.BN, 4 * c.BK
            e = gemm_case(lib, f"run_gemm{i}", M, N, K, late, rng)
            print(f"gemm {c} {M}x{N}x{K} late={late}: max rel err {e:.1e}")
            bad += not e < tol
    cases = [((2, 5, 9, 11), (7, 5, 3, 3), 1, 1, 1), ((1, 37, 8, 13), (70, 37, 3, 2), (2, 1),
                                                       (1, 0), 1),
             ((2, 3, 12, 10), (5, 3, 3, 3), 1, 2, 2)]
    for i, c in enumerate(conv_cfgs):
        for xs, ws, st, pd, dl in cases:
            e = conv_case(lib, wm, i, c, xs, ws, st, pd, dl, rng, w_half=i % 2 == 1)
            print(f"conv {c} x{xs} w{ws} stride {st} pad {pd} dil {dl}: max rel err {e:.1e}")
            bad += not e < tol
    print("ALL OK" if not bad else f"{bad} FAILED")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())


# ----------------------------------------------------------------------------------------
# A stand-in for CuPy whose RawModule runs the kernels through this emulator, so that the
# Python launchers (argument lists, grids, plans) run end to end without a GPU.

_SIGNATURES = {  # kernel -> C argument types, in order
    "gemm": ["const half_t*", "const half_t*", "float*", "int", "int", "int"],
    "conv": ["const half_t*", "const half_t*", "float*"] + ["int"] * 17,
    "pack": ["const void*", "half_t*"] + ["int"] * 6,
    "to_half": ["const float*", "half_t*", "long long"],
}


def _kind(name: str) -> str:
    if name.startswith("wmma_gemm"):
        return "gemm"
    if name.startswith("wmma_conv"):
        return "conv"
    if name.startswith("pack_filters"):
        return "pack"
    return name


def build_launchers(names, workdir=None):
    """A shared library with launch_<i>(gx, gy, gz, nt, const uint64_t* args) per name."""
    wm = _load_kernels()
    lines = [PRELUDE, wm.CUDA_SOURCE, 'extern "C" {']
    for i, name in enumerate(names):
        sig = _SIGNATURES[_kind(name)]
        call = ", ".join(f"({t})a[{j}]" for j, t in enumerate(sig))
        lines.append(f"void launch_{i}(unsigned gx, unsigned gy, unsigned gz, unsigned nt, "
                     f"const uint64_t* a) {{ g_late = 1; run_grid(gx, gy, gz, nt, [=] {{ "
                     f"{name}({call}); }}); }}")
    lines.append("}")
    return compile_library("\n".join(lines), "wmma_launch", workdir)


def fake_cupy():
    """A module that looks enough like CuPy for wmma01_gemm_cuda (NumPy arrays on the host;
    kernels run on the CPU through the emulator). Launch records: module.LAUNCHES."""
    fake = types.ModuleType("cupy")
    for k in ("float16", "float32", "float64", "abs", "all", "isfinite", "max", "nan",
              "array_equal", "prod"):
        setattr(fake, k, getattr(np, k))

    class Ptr:
        def __init__(self, a):
            self.ptr = a.ctypes.data

    class Arr(np.ndarray):
        @property
        def data(self):
            return Ptr(self)

        def get(self):
            return np.asarray(self)

    def wrap(a):
        return np.ascontiguousarray(a).view(Arr)

    def asarray(a, dtype=None):
        if hasattr(a, "detach"):  # torch (CPU in a dry run): share its memory
            a = a.detach().numpy()
        elif hasattr(a, "copy_to_host") and not isinstance(a, np.ndarray):
            raise TypeError("fake cupy: numba device arrays are not shared in a dry run")
        a = np.asarray(a, dtype=dtype)
        return a.view(Arr) if a.flags.c_contiguous else wrap(a)

    fake.asarray = asarray
    fake.asnumpy = lambda a: np.asarray(a)
    def shp(s):
        return (s,) if isinstance(s, (int, np.integer)) else tuple(s)

    fake.empty = lambda shape, dtype=np.float32: wrap(np.empty(shp(shape), dtype))
    fake.zeros = lambda shape, dtype=np.float32: wrap(np.zeros(shp(shape), dtype))
    fake.full = lambda shape, v, dtype=np.float32: wrap(np.full(shp(shape), v, dtype))
    fake.LAUNCHES = []

    class RawModule:
        def __init__(self, code, options=(), name_expressions=()):
            self.names = list(name_expressions)
            self.lib = build_launchers(self.names)

        def get_function(self, name):
            i = self.names.index(name)
            n_args = len(_SIGNATURES[_kind(name)])
            fn = getattr(self.lib, f"launch_{i}")

            def launch(grid, block, args):
                if len(args) != n_args:
                    raise TypeError(f"{name} takes {n_args} arguments, got {len(args)}")
                vals = []
                for a in args:
                    if isinstance(a, np.ndarray):
                        vals.append(a.ctypes.data)
                    else:
                        vals.append(int(a) & (2**64 - 1))
                g = tuple(grid) + (1,) * (3 - len(grid))
                fake.LAUNCHES.append((name, g, tuple(block)))
                arr = (ctypes.c_uint64 * len(vals))(*vals)
                fn(ctypes.c_uint(g[0]), ctypes.c_uint(g[1]), ctypes.c_uint(g[2]),
                   ctypes.c_uint(block[0]), arr)
            return launch

    fake.RawModule = RawModule

    class Device:
        compute_capability = "90"

    runtime = types.SimpleNamespace(deviceSynchronize=lambda: None, getDeviceCount=lambda: 1)
    fake.cuda = types.SimpleNamespace(Device=Device, runtime=runtime)
    return fake
