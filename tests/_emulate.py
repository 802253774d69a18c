"""CUDA C kernels without barriers or with __syncthreads, compiled for the CPU by g++.

Every CUDA thread is an OS thread and __syncthreads a barrier over the block (the prelude
of tools/wmma_emulate.py, plus float4); blocks run one after the other. Used by the tests
of the kernels whose C cannot run under the Numba simulator.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def assert_close_to_reference(out, x, w, rtol: float = 1e-5, **kw) -> None:
    """out (host) equals float64 conv2d(x, w, **kw) within rtol of conv(|x|, |w|) at every
    element, every element written and finite (`check.compare` on `check.reference_case`)."""
    from convlab import check

    case = check.reference_case(x, w, **kw)
    comp = check.compare(out, case["expected"], case["absref"], rtol=rtol)
    assert comp.ok, comp.summary()


def _wmma_emulate():
    path = ROOT / "tools" / "wmma_emulate.py"
    spec = importlib.util.spec_from_file_location("wmma_emulate", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def prelude() -> str:
    return _wmma_emulate().PRELUDE + r"""
#include <atomic>
struct float4 { float x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct float2 { float x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
// __ldg reads through a bounds check: a test that lists the buffers a kernel may read
// (g_ldg_ranges) counts every read outside them in g_ldg_outside and gets zeros instead
static const char* g_ldg_ranges[8][2];
static int g_ldg_nranges = 0;
static std::atomic<long> g_ldg_outside{0};
template <class T> inline T __ldg(const T* p) {
    const char *a = reinterpret_cast<const char*>(p), *b = reinterpret_cast<const char*>(p + 1);
    bool inside = g_ldg_nranges == 0;
    for (int i = 0; i < g_ldg_nranges; ++i)
        inside = inside || (a >= g_ldg_ranges[i][0] && b <= g_ldg_ranges[i][1]);
    if (!inside) { ++g_ldg_outside; return T{}; }
    return *p;
}
template <class T> inline void __stcs(T* p, T v) { *p = v; }
#define __host__
"""


# __shfl_up_sync / __shfl_down_sync for the emulator: lanes publish their value, meet at
# the warp barrier, read their source lane's value (a lane whose source is outside the
# warp keeps its own, as on the GPU). The first barrier keeps a fast lane from
# overwriting a value a slow lane has not read yet.
SHUFFLE = r"""
static float g_lanes[1024];
inline float shfl_from(float v, int src) {
    __syncwarp();
    g_lanes[threadIdx.x] = v;
    __syncwarp();
    const int lane = threadIdx.x & 31;
    return (src >= 0 && src < 32) ? g_lanes[threadIdx.x - lane + src] : v;
}
inline float __shfl_up_sync(unsigned, float v, int d) {
    return shfl_from(v, (threadIdx.x & 31) - d); }
inline float __shfl_down_sync(unsigned, float v, int d) {
    return shfl_from(v, (threadIdx.x & 31) + d); }
"""


def build_cpu_library(source: str) -> ctypes.CDLL:
    """`source` (kernels + extern "C" wrappers calling run_grid) after the prelude, as a
    shared library (`wmma_emulate.compile_library`: cached by content in the temp dir)."""
    return _wmma_emulate().compile_library(prelude() + "\n" + source, "convlab_cpu",
                                           flags=("-O1", "-pthread"))
