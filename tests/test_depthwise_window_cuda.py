"""The depthwise layer as a copy that computes (convlab/kernels/depthwise05_window_cuda.py,
csrc/depthwise_window.cu).

Without a GPU: the kernel's CUDA C runs on the CPU (tests/_emulate.py) on several images
and channels (each plane its own taps), runs of 4 outputs that cross a row (14-float rows),
8, 2 and 1 outputs per run, 1 to 3 runs per thread (runs past the end), 16-, 8- and 4-byte
vectors, 3x3, 5x5 and 3x5 filters, a last block past the end, NaN-poisoned outputs,
against float64 `reference.conv2d` with groups = C, no read outside x and w (the
emulator's `__ldg` counts them) and no store past y; the source compiles with NVRTC to the
vector loads the window needs, with no shared or local memory; launches it cannot run are
refused before CuPy. On a GPU (marked gpu): the launcher against the reference.
"""

from __future__ import annotations

import ctypes
import functools
import shutil

import numpy as np
import pytest

from convlab import check
from convlab.kernels import depthwise05_window_cuda as D

from ._depthwise import GPU_SHAPES, SAME_PADDING_REFUSALS, assert_launcher_on_gpu, assert_refused
from ._emulate import assert_close_to_reference, build_cpu_library
from ._nvrtc import nvrtc_available

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

# (x shape, R, S, v, lw, threads, cs_stores, u)
CASES = [
    ((2, 3, 14, 14), 3, 3, 4, 4, 32, 0, 1),  # runs of 4 cross rows of 14; last block part-empty
    ((1, 3, 8, 12), 3, 3, 8, 4, 64, 1, 1),   # two 16-byte streaming stores per thread
    ((1, 3, 7, 8), 5, 5, 4, 4, 32, 0, 1),    # 5x5: window rows two planes' rows away
    ((1, 4, 6, 6), 3, 5, 2, 2, 32, 1, 1),    # 3x5, 8-byte vectors
    ((2, 2, 5, 7), 3, 3, 1, 1, 32, 0, 1),    # 35-float planes: one output, 4-byte loads
    ((2, 5, 14, 14), 3, 3, 4, 4, 32, 0, 2),  # two runs a grid apart: 490 runs, 512 threads' worth
    ((1, 3, 7, 8), 3, 3, 4, 4, 32, 1, 3),    # three runs: the second and third past the end
]


@functools.cache
def _library() -> ctypes.CDLL:
    lines = [D.SOURCE_PATH.read_text(), 'extern "C" long run_dw(int which, unsigned blocks, '
             'const float* x, const float* w, float* y, int total, int C, int taps) {',
             "  g_ldg_ranges[0][0] = (const char*)x;",
             "  g_ldg_ranges[0][1] = (const char*)(x + total);",
             "  g_ldg_ranges[1][0] = (const char*)w;",
             "  g_ldg_ranges[1][1] = (const char*)(w + taps);",
             "  g_ldg_nranges = 2; g_ldg_outside = 0;"]
    for i, (shape, R, S, v, lw, threads, cs_stores, u) in enumerate(CASES):
        name = D.kernel_name(shape[2], shape[3], R, S, v, lw, threads, cs_stores, u)
        lines.append(f"  if (which == {i}) run_grid(blocks, 1, 1, {threads}, [=] {{ "
                     f"{name}(x, w, y, total, C); }});")
    lines += ["  g_ldg_nranges = 0;", "  return g_ldg_outside;", "}"]
    return build_cpu_library("\n".join(lines))


@needs_gxx
@pytest.mark.parametrize("which", range(len(CASES)))
def test_kernel_on_the_cpu(which):
    shape, R, S, v, lw, threads, _, u = CASES[which]
    rng = np.random.default_rng(which + 70)
    x = check.random_array(shape, rng)
    w = check.random_array((shape[1], 1, R, S), rng)
    total = x.size
    y_and_guard = np.full(total + 64, 1234.5, np.float32)  # 64 floats no store may reach
    y = y_and_guard[:total].reshape(shape)
    y[...] = check.poisoned(shape)
    blocks = -(-(total // v) // (u * threads))
    lib = _library()
    lib.run_dw.restype = ctypes.c_long
    outside = lib.run_dw(which, blocks, *(ctypes.c_void_p(a.ctypes.data) for a in (x, w, y)),
                         total, shape[1], w.size)
    assert outside == 0, f"{outside} reads outside x and w"
    assert (y_and_guard[total:] == 1234.5).all(), "a store past the end of y"
    assert_close_to_reference(y, x, w, padding=(R // 2, S // 2), groups=shape[1])


def test_outputs_per_thread_stay_in_one_plane():
    assert D.outputs_per_thread(14, 14, 4) == 4
    assert D.outputs_per_thread(14, 14, 8) == 4     # 196 = 4 * 49
    assert D.outputs_per_thread(5, 7, 4) == 1
    assert D.outputs_per_thread(3, 6, 8) == 2


def _vectors_per_thread(W, R, S, v, lw) -> int:
    """Vectors of x covering filter row r's run [f0 + (r-PH) W - PW, ... + v-1 + S-1], with
    f0 on lw floats: counted here from the run's ends, not from the kernel's formula."""
    n = 0
    for r in range(R):
        lo = (r - R // 2) * W - S // 2
        hi = lo + v - 1 + S - 1
        n += len({f // lw for f in range(lo, hi + 1)})
    return n


@pytest.mark.skipif(not nvrtc_available(), reason="cuda-python's NVRTC missing")
@pytest.mark.parametrize("H, W, vectors", [(14, 14, 7), (112, 112, 9)])
def test_ptx_loads_the_window_once_in_16_byte_vectors(H, W, vectors):
    from convlab.kernels._nvrtc import nvrtc_ptx

    assert _vectors_per_thread(W, 3, 3, 4, 4) == vectors
    assert sum(n for _, n in D.window_runs(W, 3, 3, 4, 4)) == vectors
    for v, lw in ((8, 4), (2, 2), (1, 1)):
        assert sum(n for _, n in D.window_runs(W, 3, 3, v, lw)) == _vectors_per_thread(
            W, 3, 3, v, lw)
    for cs_stores, store in ((0, "st.global.v4.f32"), (1, "st.global.cs.v4.f32")):
        ptx = nvrtc_ptx(D.SOURCE_PATH.read_text(), "depthwise_window.cu",
                        [D.kernel_name(H, W, 3, 3, 4, 4, 256, cs_stores)], "compute_80")
        lines = [ln.strip() for ln in ptx.splitlines()]
        loads = [ln for ln in lines if ln.startswith("ld.global")]
        assert sum(".v4.f32" in ln for ln in loads) == vectors
        assert [ln.split()[0] for ln in lines if ln.startswith("st.")] == [store]
        assert not any(".shared" in ln or ".local" in ln for ln in lines)
        assert "bar.sync" not in ptx
    ptx = nvrtc_ptx(D.SOURCE_PATH.read_text(), "depthwise_window.cu",
                    [D.kernel_name(H, W, 3, 3, 4, 4, 256, 0, 2)], "compute_80")
    assert ptx.count(".v4.f32") - ptx.count("st.global.v4.f32") == 2 * vectors  # u = 2


@pytest.mark.parametrize("kw, match", SAME_PADDING_REFUSALS + [
    (dict(v=16), "bad tiling"),
    (dict(u=5), "bad tiling"),
    (dict(threads=48), "bad tiling")])
def test_refusals_before_cupy(kw, match):
    assert_refused(D.launch, kw, match)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_launcher_on_gpu(shape):
    assert_launcher_on_gpu(D.launch, shape,
                           ({}, dict(v=8, threads=128), dict(v=2, cs_stores=1),
                            dict(v=1, threads=64), dict(u=2), dict(u=4, cs_stores=1)))
