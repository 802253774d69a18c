"""The CUDA C image filter (convlab/kernels/filter03_cuda.py, csrc/filter.cu).

Without a GPU: the kernel's CUDA C runs on the CPU (tests/_emulate.py: every CUDA thread
an OS thread; the warp shuffles through a per-warp buffer between two warp barriers) on
odd images, both paths (float4 rows, one column per lane), several filter sizes, NaN-
poisoned outputs, against float64 `reference.filter2d`; the source compiles with NVRTC
with the taps folded in; bad arguments are refused before CuPy. On a GPU (marked gpu):
the launcher against the reference.
"""

from __future__ import annotations

import ctypes
import functools
import shutil

import numpy as np
import pytest

from convlab import check
from convlab.kernels import Unsupported
from convlab.kernels import filter03_cuda as F

from ._emulate import SHUFFLE, assert_close_to_reference, build_cpu_library
from ._nvrtc import nvrtc_available

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

# (vec, v, warps, pf, alt): odd strips walking up or not, strips of 3 to 5 rows, and the
# default (strips of 2, every row load in flight)
CONFIGS = [(4, 4, 2, 2, 1), (1, 3, 2, 1, 1), (4, 5, 1, 3, 0), (1, 4, 1, 2, 0), (4, 2, 8, 4, 1)]


def _wrapper() -> str:
    lines = ['extern "C" void run_filter(int which, unsigned gx, unsigned gy, const float* img,'
             ' float* out, int H, int W) {']
    for i, (vec, v, warps, pf, alt) in enumerate(CONFIGS):
        lines.append(f"  if (which == {i}) run_grid(gx, gy, 1, {32 * warps}, [=] {{ "
                     f"{F.kernel_name(vec, v, warps, pf, 0, alt)}(img, out, H, W); }});")
    lines.append("}")
    return "\n".join(lines)


@functools.cache
def _library(shape: tuple, tap_bytes: bytes) -> ctypes.CDLL:
    taps = np.frombuffer(tap_bytes, np.float32).reshape(shape)
    return build_cpu_library(SHUFFLE + F.source(taps) + _wrapper())


def run_on_cpu(image, taps, which: int) -> np.ndarray:
    """The kernel of CONFIGS[which] on the CPU, out NaN-poisoned first."""
    vec, v, warps = CONFIGS[which][:3]
    H, W = image.shape
    if vec == 4:
        assert W % 4 == 0
    out = check.poisoned((H, W))
    lib = _library(taps.shape, taps.tobytes())
    lib.run_filter(which, -(-W // (32 * vec)), -(-H // (v * warps)),
                   ctypes.c_void_p(image.ctypes.data), ctypes.c_void_p(out.ctypes.data), H, W)
    return out


def _assert_filter(out, image, taps):
    R, S = taps.shape
    assert_close_to_reference(out[None, None], image[None, None], taps[None, None],
                              padding=(R // 2, S // 2))


@needs_gxx
@pytest.mark.parametrize("which, shape", [
    (0, (13, 132)),   # float4: 33 float4 per row, two warps across, H not a multiple of V
    (2, (11, 8)),     # float4: a warp mostly past the right edge
    (1, (9, 37)),     # scalar: W odd, two warps across
    (3, (6, 70)),     # scalar: three warps across, H a multiple of nothing
    (4, (37, 136))])  # float4, the default: 8 warps of 2-row strips, a block past the bottom
@pytest.mark.parametrize("R, S", [(3, 3), (5, 3), (1, 7), (7, 5)])
def test_kernel_on_the_cpu(which, shape, R, S):
    rng = np.random.default_rng(R * 10 + S + which + shape[1])
    image = check.random_array(shape, rng)
    taps = check.random_array((R, S), rng)
    _assert_filter(run_on_cpu(image, taps, which), image, taps)


@needs_gxx
def test_wide_filter_reaches_two_lanes_on_the_scalar_path():
    rng = np.random.default_rng(5)
    image = check.random_array((7, 40), rng)
    taps = check.random_array((3, 9), rng)  # 4 halo columns: lanes 0-3 and 28-31 load
    _assert_filter(run_on_cpu(image, taps, 1), image, taps)


def test_header_holds_the_taps():
    taps = check.random_array((3, 5), np.random.default_rng(1))
    text = F.header(taps)
    body = text.split("=", 1)[1].strip().rstrip(";")
    rows = [[np.float32(v.strip().rstrip("f")) for v in r.strip("{} ").split(",")]
            for r in body[1:-1].split("}, {")]
    assert np.array_equal(np.array(rows, np.float32), taps)
    assert "#define FR 3" in text and "#define FS 5" in text


@pytest.mark.skipif(not nvrtc_available(), reason="cuda-python's NVRTC missing")
def test_ptx_uses_vector_loads_and_folds_the_taps():
    from convlab.kernels._nvrtc import nvrtc_ptx

    taps = np.array([[1, 2, 1], [2, 4, 2], [1, 2, 1]], np.float32) / 16
    names = [F.kernel_name(4, 16, 4, 2), F.kernel_name(1, 16, 4, 2, alt=0)]
    ptx = nvrtc_ptx(F.source(taps), "filter.cu", names, "compute_80")
    loads = [ln for ln in ptx.splitlines() if ln.strip().startswith("ld.")]
    assert any(".v4.f32" in ln for ln in loads)
    assert any("st.global.v4.f32" in ln for ln in ptx.splitlines())
    assert not any("TAPS" in ln for ln in loads)
    assert "shfl.sync.up" in ptx and "shfl.sync.down" in ptx


@pytest.mark.parametrize("kw, err, match", [
    (dict(taps=np.ones((2, 3), np.float32)), Unsupported, "odd"),
    (dict(taps=np.ones((11, 3), np.float32)), Unsupported, "up to 9"),
    (dict(out=np.zeros((8, 9), np.float32)), ValueError, "shape"),
    (dict(image=np.zeros((8, 8), np.float64)), TypeError, "float32")])
def test_refusals_before_cupy(kw, err, match):
    args = dict(image=np.zeros((8, 8), np.float32), taps=np.ones((3, 3), np.float32),
                out=np.zeros((8, 8), np.float32))
    args.update(kw)
    with pytest.raises(err, match=match):
        F.filter2d_cuda(args["image"], args["taps"], args["out"])


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(67, 260), (45, 37), (300, 4096)])
@pytest.mark.parametrize("R, S", [(3, 3), (5, 7)])
def test_launcher_on_gpu(shape, R, S):
    from numba import cuda

    rng = np.random.default_rng(R + S + shape[1])
    image = check.random_array(shape, rng)
    taps = check.random_array((R, S), rng)
    for cfg in (F.DEFAULT, dict(v=8, warps=2, pf=1, alt=0),
                dict(v=32, warps=2, pf=4, minb=1)):
        out = cuda.to_device(check.poisoned(shape))
        F.launch(cuda.to_device(image), taps, out, **cfg)
        _assert_filter(out.copy_to_host(), image, taps)
    out = cuda.to_device(check.poisoned(shape))
    F.filter2d_cuda(cuda.to_device(image), cuda.to_device(taps), out)  # taps on the device
    _assert_filter(out.copy_to_host(), image, taps)
