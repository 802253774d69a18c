"""GEMM step 5: the register-blocked GEMM in CUDA C, batched (``csrc/sgemm_batched.cu``).

gemm04's design (8 x 8 outputs per thread as 2 x 2 sub-blocks of 4 x 4, the A slab stored
transposed, the next slab in registers while this one is multiplied) written in CUDA C,
with a batch index (``blockIdx.z``) and per-batch strides, so one launch does many GEMMs
of one shape: Winograd's (m + 2)^2 products (`winograd01_cuda`) or a conv's filters
against each image's columns (`im2col01_cuda`, stride 0 for the filters). fp32, row-major.
`conv_gather_gemm` is the same kernel with the columns gathered from the image inside its
loads (im2col fused away).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from ._launch import Unsupported, ceil_div

GEMM_PATH = Path(__file__).parent / "csrc" / "sgemm_batched.cu"
@functools.cache
def _gemm_kernel(bm: int, gather: bool = False):
    import cupy as cp

    return cp.RawKernel(GEMM_PATH.read_text(), "conv_gather_gemm" if gather else "sgemm_batched",
                        options=("-std=c++17", f"-DBM={bm}", f"-DGATHER={int(gather)}"))


def _block(M: int) -> tuple:
    """(BM, BN) of the kernel for M rows: 64 x 128 when M <= 64, else 128 x 64."""
    bm = 64 if M <= 64 else 128
    return bm, 8192 // bm


def sgemm_batched(a, b, out):
    """out[i] = a[i] @ b[i] for fp32 C-contiguous CuPy arrays b (B, K, N), out (B, M, N) and
    a (B, M, K), or a (M, K) for one A against every b[i]; K % 4 == 0."""
    Bt, K, N = b.shape
    M = a.shape[-2]
    shared_a = a.ndim == 2
    if (a.shape[-1] != K or out.shape != (Bt, M, N) or K % 4
            or (not shared_a and a.shape[0] != Bt)):
        raise Unsupported(f"sgemm_batched: shapes {a.shape} @ {b.shape} -> {out.shape} "
                          "(K % 4 == 0 needed)")
    bm, bn = _block(M)
    i32, i64 = np.int32, np.int64
    _gemm_kernel(bm)((ceil_div(N, bn), ceil_div(M, bm), Bt), (128,),
                     (a, b, out, i32(M), i32(N), i32(K), i64(0 if shared_a else M * K),
                      i64(K * N), i64(M * N)))
    return out


def conv_gather_gemm(wp, x, out, p, L: int):
    """out[n] (K x P*Q) = wp (K x Lp) @ im2col(x[n]) with the columns gathered from x inside
    the GEMM's loads (never stored): x (N, C, H, W), wp the filters as (K, Lp) with zero
    columns from L = C*R*S to Lp (a multiple of 4), p the `ConvParams`; fp32 CuPy arrays."""
    K, Lp = wp.shape
    PQ = p.P * p.Q
    bm, bn = _block(K)
    i32, i64 = np.int32, np.int64
    geom = (p.C, p.H, p.W, p.R, p.S, p.Q, *p.stride, *p.padding, *p.dilation, L)
    _gemm_kernel(bm, True)((ceil_div(PQ, bn), ceil_div(K, bm), p.N), (128,),
                           (wp, x, out, i32(K), i32(PQ), i32(Lp), i64(0),
                            i64(p.C * p.H * p.W), i64(K * PQ), *(i32(v) for v in geom)))
    return out
