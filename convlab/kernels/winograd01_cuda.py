"""Winograd F(m x m, 3 x 3) on the GPU, m = 2 or 4: a 3x3 stride-1 convolution with
(m + 2)^2 multiplications per m x m output tile instead of 9 m^2 (lesson 11, after the
NumPy derivation in `convlab.winograd`, whose exact matrices the kernels are built from).

Three CUDA C kernels (``csrc/winograd.cu``, CuPy) around a batched GEMM: the filters and
the input tiles go to the Winograd domain (U: a^2 x K x C, V: a^2 x C x T with a = m + 2,
T the number of output tiles), a^2 GEMMs ``M[xi] = U[xi] @ V[xi]`` do the multiplications
— the course's batched register-blocked SGEMM (`gemm06_batched_cuda`), or with
``gemm="cublas"`` CuPy's strided-batched cuBLAS SGEMM (fp32, TF32 off) — and the output
transform turns M back into m x m tiles. V and M go through memory between the steps (a
fused kernel keeps them on chip); their bytes are part of the time. F(4x4) does 2.25
multiplications per output instead of F(2x2)'s 4, and rounds more (its matrices hold 4,
5, 8, 1/24).
"""

from __future__ import annotations

import functools
from functools import partial
from pathlib import Path

import numpy as np

from .. import winograd
from ._launch import Unsupported, ceil_div, conv_launch_params, launcher, workspace
from .gemm06_batched_cuda import sgemm_batched

SOURCE_PATH = Path(__file__).parent / "csrc" / "winograd.cu"


def _literal(M) -> str:
    return "{" + ", ".join("{" + ", ".join(f"{float(v)!r}f" for v in row) + "}"
                           for row in M) + "}"


def header(m: int) -> str:
    """The matrices of F(m, 3) as device constants, for the kernel source."""
    mats = winograd.winograd_matrices(m, 3, winograd.POINTS[m])
    a = m + 2
    return (f"#define WINO_M {m}\n"
            f"__device__ const float BT[{a}][{a}] = {_literal(mats['BT'])};\n"
            f"__device__ const float G[{a}][3] = {_literal(mats['G'])};\n"
            f"__device__ const float AT[{m}][{a}] = {_literal(mats['AT'])};\n")


def source(m: int = 2) -> str:
    return header(m) + SOURCE_PATH.read_text()


@functools.cache
def module(m: int):
    """The compiled kernels of F(m) (CuPy RawModule, compiled at the first call)."""
    import cupy as cp

    return cp.RawModule(code=source(m), options=("-std=c++17",))


@functools.cache
def _kernels(m: int):
    return tuple(module(m).get_function(k) for k in ("wino_filter", "wino_input", "wino_output"))


@launcher
def conv2d_winograd_cuda(x, w, out, stride=1, padding=0, dilation=1, groups=1, m: int = 2,
                         gemm: str = "course"):
    """F(m x m, 3x3): x (N, C, H, W), w (K, C, 3, 3), out (N, K, P, Q) fp32 device arrays;
    stride 1, dilation 1, equal padding on both axes; m = 2 or 4; gemm "course" or
    "cublas" (the batched GEMM in the middle)."""
    name = f"conv2d_winograd_f{m}_cuda"
    if m not in (2, 4):
        raise ValueError(f"{name}: m must be 2 or 4, got {m}")
    p = conv_launch_params(name, x, w, out, stride, padding, dilation, groups,
                           supports=("padding",))
    if (p.R, p.S) != (3, 3) or p.padding[0] != p.padding[1]:
        raise Unsupported(f"{name}: needs a 3x3 filter and equal padding, got {p.R}x{p.S} "
                          f"padding {p.padding}")
    if max(p.C, p.K) > 65535:
        raise Unsupported(f"{name}: C, K must be at most 65535")
    if gemm not in ("course", "cublas"):
        raise ValueError(f"{name}: gemm must be 'course' or 'cublas', got {gemm!r}")
    if gemm == "course" and p.C % 4:
        raise Unsupported(f"{name}: the course GEMM needs C % 4 == 0, got C={p.C}")
    a2 = (m + 2) ** 2
    TY, TX = ceil_div(p.P, m), ceil_div(p.Q, m)
    T = p.N * TY * TX
    if a2 * max(p.C, p.K) * T >= 2**31:
        raise Unsupported(f"{name}: the Winograd-domain arrays need 64-bit sizes")
    import cupy as cp

    xa, wa, ya = cp.asarray(x), cp.asarray(w), cp.asarray(out)
    U, V, M = (workspace(f"winograd {t}", s) for t, s in (
        ("U", (a2, p.K, p.C)), ("V", (a2, p.C, T)), ("M", (a2, p.K, T))))
    kf, ki, ko = _kernels(m)
    i32 = np.int32
    kf((ceil_div(p.K * p.C, 256),), (256,), (wa, U, i32(p.K), i32(p.C)))
    ki((ceil_div(T, 128), p.C), (128,), (xa, V, i32(p.C), i32(p.H), i32(p.W), i32(TY), i32(TX),
                                         i32(T), i32(p.padding[0])))
    if gemm == "cublas":
        cp.matmul(U, V, out=M)
    else:
        sgemm_batched(U, V, M)
    ko((ceil_div(T, 128), p.K), (128,), (M, ya, i32(p.K), i32(p.P), i32(p.Q), i32(TY),
                                         i32(TX), i32(T)))
    return out


conv2d_winograd_f2_cuda = launcher(partial(conv2d_winograd_cuda, m=2))
conv2d_winograd_f4_cuda = launcher(partial(conv2d_winograd_cuda, m=4))
conv2d_winograd_f4_cublas = launcher(partial(conv2d_winograd_cuda, m=4, gemm="cublas"))
