"""The fused Winograd F(2x2, 3x3) kernel (convlab/kernels/winograd02_fused_cuda.py,
csrc/winograd.cu's wino_fused).

Without a GPU: the kernel and the filter transform run on the CPU (tests/_emulate.py:
every CUDA thread an OS thread, `__syncthreads` a barrier) on odd shapes that reach every
path (several channel slabs and a partial one, several filter and tile blocks and partial
ones, both U load paths, padding 0 and 1), NaN-poisoned, against float64; the source
compiles with NVRTC with the matrices folded in; bad arguments are refused before CuPy.
On a GPU (marked gpu): the launcher against the reference.
"""

from __future__ import annotations

import ctypes
import functools
import shutil

import numpy as np
import pytest

from convlab import check
from convlab.kernels import Unsupported
from convlab.kernels import winograd01_cuda as WC
from convlab.kernels import winograd02_fused_cuda as WF

from ._emulate import assert_close_to_reference, build_cpu_library
from ._nvrtc import nvrtc_available

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


@functools.cache
def _library() -> ctypes.CDLL:
    return build_cpu_library("\n".join([
        WC.source(2), 'extern "C" {',
        "void run_filter(unsigned g, const float* w, float* U, int K, int C) {"
        " run_grid(g, 1, 1, 256, [=] { wino_filter(w, U, K, C); }); }",
        "void run_fused(unsigned gx, unsigned gy, const float* x, const float* U, float* y,"
        " int C, int H, int W, int K, int P, int Q, int TY, int TX, int T, int pad, int u_vec)"
        f" {{ run_grid(gx, gy, 1, {WF.FB_THREADS}, [=] {{ wino_fused(x, U, y, C, H, W, K, P,"
        " Q, TY, TX, T, pad, u_vec); }); }", "}"]))


def _p(a):
    return ctypes.c_void_p(a.ctypes.data)


def run_on_cpu(x, w, pad: int, u_vec: bool) -> np.ndarray:
    N, C, H, W = x.shape
    K = w.shape[0]
    P, Q = H + 2 * pad - 2, W + 2 * pad - 2
    TY, TX = -(-P // 2), -(-Q // 2)
    T = N * TY * TX
    lib = _library()
    U = np.full((16, K, C), np.nan, np.float32)
    lib.run_filter(-(-K * C // 256), _p(w), _p(U), K, C)
    y = check.poisoned((N, K, P, Q))
    gx, gy = WF.grid(K, T)
    lib.run_fused(gx, gy, _p(x), _p(U), _p(y), C, H, W, K, P, Q, TY, TX, T, pad, int(u_vec))
    return y


@needs_gxx
@pytest.mark.parametrize("shape, K, pad, u_vec", [
    ((2, 11, 9, 7), 37, 1, False),   # 2 slabs (the second of 3 channels), 2 filter blocks (37),
                                     # 40 tiles: 2 tile blocks; odd P, Q: partial 2x2 tiles
    ((1, 16, 6, 10), 8, 0, True),    # float4 U rows, 2 full slabs, no padding
    ((3, 4, 5, 5), 33, 1, True)])    # one partial slab, 33 filters, 27 tiles
def test_kernel_on_the_cpu(shape, K, pad, u_vec):
    rng = np.random.default_rng(sum(shape) + K)
    x = check.random_array(shape, rng)
    w = check.random_array((K, shape[1], 3, 3), rng)
    assert_close_to_reference(run_on_cpu(x, w, pad, u_vec), x, w, padding=pad)


@pytest.mark.skipif(not nvrtc_available(), reason="cuda-python's NVRTC missing")
def test_ptx_folds_the_matrices_and_reads_float4():
    from convlab.kernels._nvrtc import nvrtc_ptx

    ptx = nvrtc_ptx(WC.source(2), "winograd.cu", (), "compute_80")
    body = ptx[ptx.index(".entry wino_fused"):]
    loads = [ln for ln in body.splitlines() if ln.strip().startswith("ld.global")]
    assert loads and not any(s in ln for ln in loads for s in ("BT", "AT", "[G]"))
    assert any(".v4.f32" in ln for ln in loads)           # U rows as float4
    assert "ld.shared.v4.f32" in body and "fma.rn.f32" in body
    assert ".entry wino_fused" not in nvrtc_ptx(WC.source(4), "winograd.cu", (), "compute_80")


@pytest.mark.parametrize("kw, match", [
    (dict(stride=2), "stride"),
    (dict(w=np.ones((4, 3, 5, 5), np.float32), padding=2), "3x3"),
    (dict(padding=(1, 0)), "equal padding")])
def test_refusals_before_cupy(kw, match):
    args = dict(x=np.zeros((1, 3, 8, 8), np.float32), w=np.ones((4, 3, 3, 3), np.float32),
                stride=1, padding=1)
    args.update(kw)
    pad = args["padding"] if isinstance(args["padding"], tuple) else (args["padding"],) * 2
    R = args["w"].shape[2]
    P = (8 + 2 * pad[0] - R) // args["stride"] + 1
    Q = (8 + 2 * pad[1] - R) // args["stride"] + 1
    out = np.zeros((1, 4, P, Q), np.float32)
    with pytest.raises((Unsupported, ValueError), match=match):
        WF.conv2d_winograd_fused_cuda(args["x"], args["w"], out, stride=args["stride"],
                                      padding=args["padding"])


@pytest.mark.gpu
@pytest.mark.parametrize("shape, K", [((3, 20, 13, 10), 9), ((2, 64, 28, 28), 70),
                                      ((1, 3, 5, 6), 40)])
def test_launcher_on_gpu(shape, K):
    from numba import cuda

    rng = np.random.default_rng(K)
    x = check.random_array(shape, rng)
    w = check.random_array((K, shape[1], 3, 3), rng)
    out = cuda.to_device(check.poisoned((shape[0], K, shape[2], shape[3])))
    WF.conv2d_winograd_fused_cuda(cuda.to_device(x), cuda.to_device(w), out, padding=1)
    assert_close_to_reference(out.copy_to_host(), x, w, padding=1)
