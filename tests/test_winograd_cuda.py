"""The GPU Winograd convolution (convlab/kernels/winograd01_cuda.py) and its batched SGEMM.

Without a GPU: the CUDA C compiles with NVRTC to PTX in which the transform matrices are
folded into the arithmetic (no loads of them); the constants the kernels are compiled with
are convlab.winograd's exact matrices; bad arguments are refused before anything needs
CuPy; and, where g++ is installed, the kernels themselves run on the CPU (every CUDA thread
an OS thread, `__syncthreads` a barrier: tools/wmma_emulate.py's prelude) on odd shapes
and are compared with float64. On a GPU (marked gpu): the launcher against the reference.
"""

from __future__ import annotations

import ctypes
import shutil
from fractions import Fraction

import numpy as np
import pytest

from convlab import check, winograd
from convlab.kernels import Unsupported
from convlab.kernels import winograd01_cuda as WC
from convlab.kernels.gemm06_batched_cuda import GEMM_PATH

from ._emulate import assert_close_to_reference, build_cpu_library
from ._nvrtc import nvrtc_available

needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="cuda-python's NVRTC missing")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


@pytest.mark.parametrize("m", [2, 4])
def test_header_holds_the_exact_matrices(m):
    mats = winograd.winograd_matrices(m, 3, winograd.POINTS[m])
    text = WC.header(m)
    for name in ("BT", "G", "AT"):
        line = next(s for s in text.splitlines() if f" {name}[" in s)
        body = line.split("=", 1)[1].strip().rstrip(";")
        rows = [[float(v.strip().rstrip("f")) for v in r.strip("{} ").split(",")]
                for r in body[1:-1].split("}, {")]
        want = [[float(Fraction(v)) for v in row] for row in mats[name]]
        assert np.array_equal(np.array(rows), np.array(want)), name
        if name == "BT":  # the fractions moved into G: B^T is integral
            assert np.array_equal(np.array(rows), np.round(rows))


@needs_nvrtc
@pytest.mark.parametrize("m", [2, 4])
def test_ptx_folds_the_matrices(m):
    from convlab.kernels._nvrtc import nvrtc_ptx

    ptx = nvrtc_ptx(WC.source(m), "winograd.cu", (), "compute_80")
    for k in ("wino_filter", "wino_input", "wino_output"):
        assert f".entry {k}" in ptx
    loads = [line for line in ptx.splitlines() if line.strip().startswith("ld.global")]
    assert loads and not any(s in line for line in loads for s in ("BT", "AT", "G+", "[G]"))
    gemm = nvrtc_ptx(GEMM_PATH.read_text(), "sgemm_batched.cu", (), "compute_80",
                     options=("-DBM=64",))
    assert ".entry sgemm_batched" in gemm and "fma.rn.f32" in gemm


@pytest.mark.parametrize("kw, err", [
    (dict(stride=2, padding=1), Unsupported), (dict(padding=(1, 0)), Unsupported),
    (dict(padding=1, m=3), ValueError), (dict(padding=1, gemm="fast"), ValueError)])
def test_refusals_before_cupy(kw, err):
    x = np.zeros((1, 8, 9, 9), np.float32)
    w = np.zeros((4, 8, 3, 3), np.float32)
    stride = kw.get("stride", 1)
    pad = kw.get("padding", 0)
    P = (9 + 2 * (pad if isinstance(pad, int) else pad[0]) - 3) // stride + 1
    Q = (9 + 2 * (pad if isinstance(pad, int) else pad[1]) - 3) // stride + 1
    out = np.zeros((1, 4, P, Q), np.float32)
    with pytest.raises(err):
        WC.conv2d_winograd_cuda(x, w, out, **kw)
    with pytest.raises(Unsupported, match="3x3"):
        WC.conv2d_winograd_cuda(x, np.zeros((4, 8, 5, 5), np.float32),
                                np.zeros((1, 4, 5, 5), np.float32))


@pytest.fixture(scope="module")
def emulated():
    """{m: ctypes library} with the Winograd kernels of F(m) and the batched SGEMM (BM = 128
    with m = 2, BM = 64 with m = 4), compiled for the CPU."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    libs = {}
    for m, bm in ((2, 128), (4, 64)):
        gemm = f"#define BM {bm}\n" + GEMM_PATH.read_text()
        src = "\n".join([WC.source(m), gemm, 'extern "C" {',
                         "void run_filter(unsigned g, const float* w, float* U, int K, int C) {"
                         " run_grid(g, 1, 1, 256, [=] { wino_filter(w, U, K, C); }); }",
                         "void run_input(unsigned gx, unsigned gy, const float* x, float* V, int C,"
                         " int H, int W, int TY, int TX, int T, int pad) { run_grid(gx, gy, 1, 128,"
                         " [=] { wino_input(x, V, C, H, W, TY, TX, T, pad); }); }",
                         "void run_output(unsigned gx, unsigned gy, const float* M, float* y,"
                         " int K, int P, int Q, int TY, int TX, int T) { run_grid(gx, gy, 1, 128,"
                         " [=] { wino_output(M, y, K, P, Q, TY, TX, T); }); }",
                         "void run_gemm(unsigned gx, unsigned gy, unsigned gz, const float* A,"
                         " const float* B, float* C, int M, int N, int K, long long sa) {"
                         " run_grid(gx, gy, gz, 128, [=] { sgemm_batched(A, B, C, M, N, K, sa,"
                         " (long long)K * N, (long long)M * N); }); }", "}"])
        libs[m] = (build_cpu_library(src), bm)
    return libs


def _p(a):
    return ctypes.c_void_p(a.ctypes.data)


def _gemm(lib, bm, a, b):
    Bt, K, N = b.shape
    M = a.shape[-2]
    out = np.full((Bt, M, N), np.nan, np.float32)
    bn = 8192 // bm
    sa = 0 if a.ndim == 2 else M * K   # one A for every batch, or one per batch
    lib.run_gemm(-(-N // bn), -(-M // bm), Bt, _p(a), _p(b), _p(out), M, N, K,
                 ctypes.c_longlong(sa))
    return out


@needs_gxx
@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("N", [37, 72])   # the scalar edge path and the float4 path
def test_batched_sgemm_on_the_cpu(emulated, m, N):
    lib, bm = emulated[m]
    rng = np.random.default_rng(m * 100 + N)
    a = check.random_array((3, 70, 20), rng)     # M = 70: a partial block row either way
    b = check.random_array((3, 20, N), rng)
    out = _gemm(lib, bm, a, b)
    exp = np.matmul(a.astype(np.float64), b.astype(np.float64))
    scale = np.matmul(np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))
    assert np.all(np.isfinite(out))
    assert np.max(np.abs(out - exp) / scale) < 1e-6
    shared = _gemm(lib, bm, a[1], b)           # one A against every B (stride 0)
    exp = np.matmul(a[1].astype(np.float64), b.astype(np.float64))
    assert np.max(np.abs(shared - exp) / np.matmul(np.abs(a[1]), np.abs(b))) < 1e-6


@needs_gxx
@pytest.mark.parametrize("m, shape, pad", [(2, (2, 8, 7, 5), 1), (4, (1, 12, 9, 11), 1),
                                           (4, (2, 4, 6, 6), 0)])
def test_winograd_kernels_on_the_cpu(emulated, m, shape, pad):
    lib, bm = emulated[m]
    N, C, H, W = shape
    K = 6
    rng = np.random.default_rng(C + m)
    x = check.random_array(shape, rng)
    w = check.random_array((K, C, 3, 3), rng)
    P, Q = H + 2 * pad - 2, W + 2 * pad - 2
    TY, TX = -(-P // m), -(-Q // m)
    T, a2 = N * TY * TX, (m + 2) ** 2
    U = np.full((a2, K, C), np.nan, np.float32)
    V = np.full((a2, C, T), np.nan, np.float32)
    lib.run_filter(-(-K * C // 256), _p(w), _p(U), K, C)
    lib.run_input(-(-T // 128), C, _p(x), _p(V), C, H, W, TY, TX, T, pad)
    M = _gemm(lib, bm, U, V)
    y = np.full((N, K, P, Q), np.nan, np.float32)
    lib.run_output(-(-T // 128), K, _p(M), _p(y), K, P, Q, TY, TX, T)
    assert_close_to_reference(y, x, w, padding=pad)


@pytest.mark.gpu
@pytest.mark.parametrize("gemm", ["course", "cublas"])
@pytest.mark.parametrize("m", [2, 4])
def test_launcher_on_gpu(m, gemm):
    from numba import cuda

    rng = np.random.default_rng(7)
    x = check.random_array((3, 20, 13, 10), rng)
    w = check.random_array((9, 20, 3, 3), rng)
    out = cuda.to_device(check.poisoned((3, 9, 13, 10)))
    WC.conv2d_winograd_cuda(cuda.to_device(x), cuda.to_device(w), out, padding=1, m=m,
                            gemm=gemm)
    assert_close_to_reference(out.copy_to_host(), x, w, padding=1)
