"""The depthwise layer as the filter's strips (convlab/kernels/depthwise04_strips_cuda.py,
csrc/filter.cu with PLANE_TAPS).

Without a GPU: the kernel's CUDA C runs on the CPU (tests/_emulate.py) on several images
and channels (each plane its own taps), both paths (float4 rows, one column per lane),
odd shapes, NaN-poisoned outputs, against float64 `reference.conv2d` with groups = C; the
source compiles with NVRTC; launches it cannot run are refused before CuPy. On a GPU
(marked gpu): the launcher against the reference.
"""

from __future__ import annotations

import ctypes
import functools
import shutil

import numpy as np
import pytest

from convlab import check
from convlab.kernels import depthwise04_strips_cuda as D

from ._depthwise import assert_refused
from ._emulate import SHUFFLE, assert_close_to_reference, build_cpu_library
from ._nvrtc import nvrtc_available

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

# (vec, v, warps, pf, alt): the default, and short strips walking one way
CONFIGS = [(4, *D.DEFAULT.values()), (1, 3, 2, 2, 0)]


@functools.cache
def _library(R: int, S: int) -> ctypes.CDLL:
    lines = ['extern "C" void run_dw(int which, unsigned gx, unsigned gy, unsigned gz, '
             'const float* x, const float* w, float* y, int H, int W, int C) {']
    for i, (vec, v, warps, pf, alt) in enumerate(CONFIGS):
        lines.append(f"  if (which == {i}) run_grid(gx, gy, gz, {32 * warps}, [=] {{ "
                     f"{D.kernel_name(vec, v, warps, pf, alt)}(x, w, y, H, W, C); }});")
    lines.append("}")
    return build_cpu_library(SHUFFLE + D.source(R, S) + "\n".join(lines))


def run_on_cpu(x, w, which: int) -> np.ndarray:
    vec, v, warps = CONFIGS[which][:3]
    N, C, H, W = x.shape
    y = check.poisoned(x.shape)
    _library(*w.shape[2:]).run_dw(
        which, -(-W // (32 * vec)), -(-H // (v * warps)), N * C,
        ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(w.ctypes.data),
        ctypes.c_void_p(y.ctypes.data), H, W, C)
    return y


@needs_gxx
@pytest.mark.parametrize("which, shape", [
    (0, (2, 3, 19, 136)),  # float4: two warps across (34 float4), H not a multiple of 16
    (0, (1, 2, 5, 8)),     # float4: a warp mostly past the right edge, one block of rows
    (1, (2, 3, 7, 37))])   # scalar: W odd, two warps across
@pytest.mark.parametrize("R, S", [(3, 3), (5, 3)])
def test_kernel_on_the_cpu(which, shape, R, S):
    rng = np.random.default_rng(R + S + shape[3] + which)
    x = check.random_array(shape, rng)
    w = check.random_array((shape[1], 1, R, S), rng)
    assert_close_to_reference(run_on_cpu(x, w, which), x, w, padding=(R // 2, S // 2),
                              groups=shape[1])


@pytest.mark.skipif(not nvrtc_available(), reason="cuda-python's NVRTC missing")
def test_ptx_uses_vector_loads_and_reads_the_taps():
    from convlab.kernels._nvrtc import nvrtc_ptx

    ptx = nvrtc_ptx(D.source(3, 3), "filter.cu", [D.kernel_name(4, 2, 8, 4)], "compute_80")
    assert ".entry" in ptx and "depthwise_strips" in ptx
    assert any("ld.global" in ln and ".v4.f32" in ln for ln in ptx.splitlines())
    assert "st.global.v4.f32" in ptx
    assert "filter2d" not in ptx  # the filter's kernel (and its TAPS) are not compiled


@pytest.mark.parametrize("kw, match", [
    (dict(stride=2), "stride 1"),
    (dict(padding=0), "same"),
    (dict(w=np.ones((3, 1, 11, 11), np.float32), padding=5), "up to 9"),
    (dict(x=np.zeros((1, 70000, 4, 4), np.float32), w=np.ones((70000, 1, 3, 3), np.float32),
          out=np.zeros((1, 70000, 4, 4), np.float32)), "planes")])
def test_refusals_before_cupy(kw, match):
    assert_refused(D.depthwise_strips_cuda, kw, match)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 32, 112, 112), (3, 5, 33, 45), (1, 4, 9, 260)])
def test_launcher_on_gpu(shape):
    from numba import cuda

    rng = np.random.default_rng(shape[3])
    x = check.random_array(shape, rng)
    w = check.random_array((shape[1], 1, 3, 3), rng)
    for cfg in ({}, dict(v=8, warps=4, pf=2, alt=0)):
        out = cuda.to_device(check.poisoned(shape))
        D.launch(cuda.to_device(x), cuda.to_device(w), out, 1, 1, **cfg)
        assert_close_to_reference(out.copy_to_host(), x, w, padding=1, groups=shape[1])
