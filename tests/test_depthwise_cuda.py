"""The CUDA C depthwise convolution (convlab/kernels/depthwise03_cuda.py, csrc/depthwise.cu).

Without a GPU: the kernel's CUDA C runs on the CPU (tests/_emulate.py: every CUDA thread
an OS thread, `__syncthreads` a barrier) on odd shapes, both tilings (whole planes with a
partial last group, bands with a partial last band), float4 and scalar paths, stride 1
and 2, 3x3 and 5x5, strips that do not divide the band, fewer threads than work items,
persistent blocks (fewer blocks than pieces, the next piece loaded during the current),
NaN-poisoned outputs, against float64 `reference.conv2d(..., groups=C)`; the source
compiles with NVRTC to 16-byte loads and stores; bad arguments are refused before CuPy.
On a GPU (marked gpu): the launcher against the reference.
"""

from __future__ import annotations

import ctypes
import functools
import shutil

import numpy as np
import pytest

from convlab import check
from convlab import reference as ref
from convlab.kernels import Unsupported
from convlab.kernels import depthwise03_cuda as D

from ._emulate import assert_close_to_reference, build_cpu_library
from ._nvrtc import nvrtc_available

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

# (x shape, R, stride, padding, g, tp, v, threads, vec, blocks); tp None: whole planes;
# blocks None: one per piece, else that many persistent blocks
CASES = [
    ((2, 5, 6, 6), 3, 1, 1, 3, None, 4, 64, 4, None),   # 10 planes, groups of 3: last has 1
    ((1, 7, 7, 7), 3, 1, 1, 2, None, 3, 32, 1, None),   # 49-float planes: scalar; 42 items
    ((2, 3, 13, 16), 3, 1, 1, 1, 5, 2, 64, 4, None),    # bands of 5 rows: 5, 5, 3
    ((1, 2, 11, 9), 3, 1, 1, 1, 4, 3, 32, 1, None),     # bands, scalar, v does not divide tp
    ((1, 3, 12, 24), 3, 2, 1, 1, 4, 2, 32, 4, None),    # stride 2, bands
    ((1, 3, 9, 9), 3, 2, 1, 2, None, 5, 32, 1, None),   # stride 2, whole planes
    ((1, 4, 8, 8), 5, 1, 2, 2, None, 4, 32, 4, None),   # 5x5, padding 2
    ((1, 2, 10, 12), 3, 1, 0, 1, 3, 3, 32, 1, None),    # no padding, bands
    ((2, 5, 6, 6), 3, 1, 1, 3, None, 4, 64, 4, 3),      # persistent: 4 pieces, 3 blocks
    ((2, 3, 13, 16), 3, 1, 1, 1, 5, 2, 64, 4, 4),       # persistent bands: 18 pieces, 4 blocks
    ((1, 3, 9, 9), 3, 2, 1, 2, None, 5, 32, 1, 1),      # persistent, one block, scalar
]


def _template_args(case) -> tuple:
    shape, R, stride, pad, g, tp, v, threads, vec, _ = case
    N, C, H, W = shape
    P, Q = ref.conv2d_output_shape((H, W), (R, R), stride, pad)
    return (H, W, P, Q, R, R, stride, pad, pad, g, P if tp is None else tp, v, threads, vec)


@functools.cache
def _library() -> ctypes.CDLL:
    lines = [D.SOURCE_PATH.read_text(), 'extern "C" void run_depthwise(int which, unsigned blocks,'
             ' const float* x, const float* w, float* y, int NC, int C) {']
    for i, case in enumerate(CASES):
        a = _template_args(case)
        name = D.kernel_name(*a, persist=case[-1] is not None)
        lines.append(f"  if (which == {i}) run_grid(blocks, 1, 1, {a[12]}, [=] {{ "
                     f"{name}(x, w, y, NC, C); }});")
    lines.append("}")
    return build_cpu_library("\n".join(lines))


def run_on_cpu(which: int, x, w) -> np.ndarray:
    H, W, P, Q, R, S, stride, ph, pw, g, tp, v, threads, vec = _template_args(CASES[which])
    N, C = x.shape[:2]
    y = check.poisoned((N, C, P, Q))
    pieces = -(-P // tp) * -(-(N * C) // g)
    blocks = pieces if CASES[which][-1] is None else CASES[which][-1]
    assert blocks <= pieces
    _library().run_depthwise(which, blocks, *(ctypes.c_void_p(a.ctypes.data) for a in (x, w, y)),
                             N * C, C)
    return y


@needs_gxx
@pytest.mark.parametrize("which", range(len(CASES)))
def test_kernel_on_the_cpu(which):
    shape, R, stride, pad = CASES[which][:4]
    rng = np.random.default_rng(which + 40)
    x = check.random_array(shape, rng)
    w = check.random_array((shape[1], 1, R, R), rng)
    y = run_on_cpu(which, x, w)
    assert_close_to_reference(y, x, w, stride=stride, padding=pad, groups=shape[1])


def test_default_tiling_of_the_two_layers():
    small = D.default_tiling(32, 512, 14, 14, 14, 14)
    assert small["tp"] == 14 and small["g"] > 1 and 14 % small["v"] == 0
    big = D.default_tiling(32, 32, 112, 112, 112, 112)
    assert big["g"] == 1 and big["tp"] < 112
    for t, (H, P) in ((small, (14, 14)), (big, (112, 112))):
        assert D.smem_bytes(H, H, P, P, 3, 3, 1, t["g"], t["tp"]) <= 24 * 1024
        assert t["threads"] % 32 == 0


@pytest.mark.skipif(not nvrtc_available(), reason="cuda-python's NVRTC missing")
def test_ptx_moves_16_bytes():
    from convlab.kernels._nvrtc import nvrtc_ptx

    t = D.default_tiling(32, 512, 14, 14, 14, 14)
    names = [D.kernel_name(14, 14, 14, 14, 3, 3, 1, 1, 1, t["g"], t["tp"], t["v"], t["threads"],
                           4, persist) for persist in (False, True)]
    ptx = nvrtc_ptx(D.SOURCE_PATH.read_text(), "depthwise.cu", names, "compute_80")
    lines = [ln.strip() for ln in ptx.splitlines()]
    assert any(ln.startswith("ld.global") and ".v4.f32" in ln for ln in lines)
    assert any(ln.startswith("st.global.v4.f32") for ln in lines)
    assert any(ln.startswith("st.shared.v4.f32") for ln in lines)


@pytest.mark.parametrize("kw, err, match", [
    (dict(groups=1), Unsupported, "depthwise"),
    (dict(stride=3), Unsupported, "stride"),
    (dict(g=2, tp=4), Unsupported, "bad tiling"),
    (dict(threads=48), Unsupported, "bad tiling"),
    (dict(g=64, tp=None), Unsupported, "shared memory")])
def test_refusals_before_cupy(kw, err, match):
    x = np.zeros((2, 4, 14, 14), np.float32)
    w = np.zeros((4, 1, 3, 3), np.float32)
    stride = kw.pop("stride", 1)
    P = (14 + 2 - 3) // stride + 1
    y = np.zeros((2, 4, P, P), np.float32)
    with pytest.raises(err, match=match):
        D.launch(x, w, y, stride=stride, padding=1, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, stride, tiling", [
    ((3, 10, 14, 14), 1, {}), ((3, 10, 14, 14), 2, {}), ((2, 3, 112, 112), 1, {}),
    ((2, 3, 112, 112), 2, {}), ((2, 5, 13, 15), 1, {}), ((2, 3, 40, 36), 1, dict(tp=7, v=4)),
    ((3, 7, 14, 14), 1, dict(g=4, v=14)), ((1, 6, 30, 30), 1, dict(tp=30, g=2, threads=64)),
    ((4, 64, 14, 14), 1, dict(per_sm=1)), ((2, 8, 112, 112), 1, dict(per_sm=2)),
    ((2, 8, 112, 112), 2, dict(per_sm=1, tp=8))])
def test_launcher_on_gpu(shape, stride, tiling):
    from numba import cuda

    rng = np.random.default_rng(sum(shape) + stride)
    x = check.random_array(shape, rng)
    w = check.random_array((shape[1], 1, 3, 3), rng)
    kw = dict(stride=stride, padding=1, groups=shape[1])
    P = (shape[2] + 2 - 3) // stride + 1
    Q = (shape[3] + 2 - 3) // stride + 1
    y = cuda.to_device(check.poisoned((shape[0], shape[1], P, Q)))
    D.launch(cuda.to_device(x), cuda.to_device(w), y, **kw, **tiling)
    assert_close_to_reference(y.copy_to_host(), x, w, **kw)
