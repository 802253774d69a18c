"""im2col + GEMM on the GPU (convlab/kernels/im2col01_cuda.py).

Without a GPU: the im2col kernel's CUDA C runs on the CPU (tests/_emulate.py) on odd
shapes with stride, padding and dilation, against NumPy's im2col of lesson 02
(`reference.im2col`); its padding rows are zero; the source compiles with NVRTC; bad
arguments are refused before CuPy. On a GPU (marked gpu): the launcher against the
reference, including the 1x1 path that uses x as its own column matrix.
"""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

from convlab import check
from convlab import reference as ref
from convlab.kernels import Unsupported
from convlab.kernels import im2col01_cuda as IC

from ._emulate import assert_close_to_reference, build_cpu_library
from ._nvrtc import nvrtc_available

WRAPPER = r"""
extern "C" void run_im2col(unsigned gx, unsigned gy, unsigned gz, const float* x, float* cols,
                           const int* a) {
    run_grid(gx, gy, gz, 256, [=] { im2col(x, cols, a[0], a[1], a[2], a[3], a[4], a[5], a[6],
                                         a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14]); });
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("shape, wshape, stride, pad, dil", [
    ((2, 3, 11, 9), (5, 3, 7, 7), 2, 3, 1),     # the stem's shape of problem, small
    ((1, 5, 8, 7), (4, 5, 3, 2), (1, 2), (1, 0), (2, 1)),
    ((2, 6, 5, 5), (3, 6, 1, 1), 1, 0, 1)])
def test_im2col_kernel_on_the_cpu(shape, wshape, stride, pad, dil):
    lib = build_cpu_library(IC.SOURCE_PATH.read_text() + WRAPPER)
    p = ref.conv_params(shape, wshape, stride, pad, dil)
    L = p.C * p.R * p.S
    Lp = -(-L // 4) * 4
    PQ = p.P * p.Q
    x = check.random_array(shape, np.random.default_rng(L))
    cols = np.full((p.N, Lp, PQ), np.nan, np.float32)
    args = np.array([p.C, p.H, p.W, p.R, p.S, p.P, p.Q, *p.stride, *p.padding, *p.dilation,
                     L, Lp], np.int32)
    lib.run_im2col(-(-PQ // 256), Lp, p.N, ctypes.c_void_p(x.ctypes.data),
                   ctypes.c_void_p(cols.ctypes.data), ctypes.c_void_p(args.ctypes.data))
    want = ref.im2col(x, (p.R, p.S), stride=p.stride, padding=p.padding, dilation=p.dilation)
    got = cols[:, :L].transpose(1, 0, 2).reshape(L, p.N * PQ)
    assert np.array_equal(got, want.reshape(L, -1))
    assert np.all(cols[:, L:] == 0)


GATHER_WRAPPER = r"""
extern "C" void run_gather(unsigned gx, unsigned gy, unsigned gz, const float* A, const float* x,
                           float* C, const long long* s, const int* a) {
    run_grid(gx, gy, gz, 128, [=] { conv_gather_gemm(A, x, C, a[0], a[1], a[2], s[0], s[1],
        s[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14],
        a[15]); });
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("bm", [64, 128])
@pytest.mark.parametrize("shape, wshape, stride, pad, dil", [
    ((2, 3, 13, 11), (70, 3, 7, 7), 2, 3, 1), ((1, 5, 9, 8), (9, 5, 3, 2), (1, 2), (1, 0), (2, 1))])
def test_gather_gemm_on_the_cpu(bm, shape, wshape, stride, pad, dil):
    from convlab.kernels.gemm06_batched_cuda import GEMM_PATH

    lib = build_cpu_library(f"#define BM {bm}\n#define GATHER 1\n" + GEMM_PATH.read_text()
                            + GATHER_WRAPPER)
    p = ref.conv_params(shape, wshape, stride, pad, dil)
    L = p.C * p.R * p.S
    Lp = -(-L // 4) * 4
    PQ = p.P * p.Q
    rng = np.random.default_rng(L + bm)
    x = check.random_array(shape, rng)
    w = check.random_array(wshape, rng)
    wp = np.zeros((p.K, Lp), np.float32)
    wp[:, :L] = w.reshape(p.K, L)
    out = np.full((p.N, p.K, p.P, p.Q), np.nan, np.float32)
    strides = np.array([0, p.C * p.H * p.W, p.K * PQ], np.int64)
    args = np.array([p.K, PQ, Lp, p.C, p.H, p.W, p.R, p.S, p.Q, *p.stride, *p.padding,
                     *p.dilation, L], np.int32)
    bn = 8192 // bm
    lib.run_gather(-(-PQ // bn), -(-p.K // bm), p.N, *(ctypes.c_void_p(a.ctypes.data) for a in
                                                       (wp, x, out, strides, args)))
    assert_close_to_reference(out, x, w, stride=stride, padding=pad, dilation=dil)


@pytest.mark.skipif(not nvrtc_available(), reason="cuda-python's NVRTC missing")
def test_source_compiles():
    from convlab.kernels._nvrtc import nvrtc_ptx

    assert ".entry im2col" in nvrtc_ptx(IC.SOURCE_PATH.read_text(), "im2col.cu", (),
                                        "compute_80")


def test_refusals_before_cupy():
    with pytest.raises(Unsupported, match="groups"):
        IC.conv2d_im2col_cuda(np.zeros((1, 4, 5, 5), np.float32),
                              np.zeros((4, 2, 3, 3), np.float32),
                              np.zeros((1, 4, 3, 3), np.float32), groups=2)
    with pytest.raises(TypeError, match="float32"):
        IC.conv2d_im2col_cuda(np.zeros((1, 4, 5, 5), np.float64),
                              np.zeros((4, 4, 3, 3), np.float32),
                              np.zeros((1, 4, 3, 3), np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("wshape, kw", [((6, 3, 7, 7), dict(stride=2, padding=3)),
                                        ((6, 5, 1, 1), {}),
                                        ((6, 5, 3, 3), dict(padding=1, dilation=2))])
def test_launcher_on_gpu(wshape, kw, fused):
    from numba import cuda

    rng = np.random.default_rng(3)
    C = wshape[1]
    x = check.random_array((3, C, 17, 13), rng)
    w = check.random_array(wshape, rng)
    p = ref.conv_params(x.shape, w.shape, **kw)
    out = cuda.to_device(check.poisoned(p.out_shape))
    fn = IC.conv2d_im2col_fused_cuda if fused else IC.conv2d_im2col_cuda
    fn(cuda.to_device(x), cuda.to_device(w), out, **kw)
    assert_close_to_reference(out.copy_to_host(), x, w, **kw)
