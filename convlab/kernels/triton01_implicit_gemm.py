"""Implicit-GEMM convolution in Triton: the rung beside the Numba ladder.

The same GEMM view as `conv05_implicit_gemm` (M = N*P*Q output pixels, N = K filters,
reduction C*R*S, the im2col matrix gathered on the fly), written as block programs: each
program computes one BLOCK_M x BLOCK_N tile of the output with `tl.dot` on
BLOCK_M x BLOCK_K and BLOCK_K x BLOCK_N tiles. What the Numba ladder does by hand, Triton
decides: where the tiles live (shared memory, registers), how loads are vectorised, how
many stages the loads are pipelined over (`num_stages`), and, through the autotuner, which
tile shape runs. fp32 inputs with ``input_precision="ieee"``: plain FMA, no TF32 (the
'tf32' precision shows what Triton's default, tensor cores, would give).

x (N, C, H, W), w (K, C, R, S), out (N, K, P, Q), all float32 and contiguous, on the GPU
(PyTorch tensors, or anything with ``__cuda_array_interface__``, such as Numba device
arrays). Needs Triton and a GPU; `available()` says whether both are here.
"""

from __future__ import annotations

import importlib.util

from .. import reference as ref
from .. import runtime
from ..errors import Unsupported

_KERNEL = None


def available() -> bool:
    """Triton and PyTorch importable, and a real GPU (not the simulator)."""
    return (not runtime.is_simulator() and importlib.util.find_spec("triton") is not None
            and importlib.util.find_spec("torch") is not None)


def _configs(triton):
    c = triton.Config
    return [c(dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=16), num_warps=8, num_stages=3),
            c(dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=16), num_warps=4, num_stages=4),
            c(dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=16), num_warps=4, num_stages=4),
            c(dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32), num_warps=8, num_stages=2),
            c(dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32), num_warps=4, num_stages=3),
            c(dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32), num_warps=4, num_stages=3)]


def kernel():
    """The jitted, autotuned Triton kernel (built on first use: importing Triton is slow)."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    # the key: what makes two layers different problems (a stride-2 layer and a stride-1
    # one can share M, K and C*R*S)
    @triton.autotune(configs=_configs(triton),
                     key=["M", "K", "CRS", "H", "W", "stride_h", "stride_w", "PRECISION"])
    @triton.jit
    def conv2d_triton_kernel(x_ptr, w_ptr, out_ptr, C, H, W, K, P, Q, M, CRS,
                             stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
                             R: tl.constexpr, S: tl.constexpr, PRECISION: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr):
        # Programs along M vary fastest: neighbours share the filter tile in L2.
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # output pixels (n, p, q)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # filters k
        PQ = P * Q
        n = offs_m // PQ
        pq = offs_m % PQ
        h0 = (pq // Q) * stride_h - pad_h
        w0 = (pq % Q) * stride_w - pad_w
        x_base = n * (C * H * W)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, CRS, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)  # reduction index (c, r, s)
            c = offs_k // (R * S)
            rs = offs_k % (R * S)
            h = h0[:, None] + (rs // S)[None, :] * dil_h
            w = w0[:, None] + (rs % S)[None, :] * dil_w
            a_mask = ((offs_m[:, None] < M) & (offs_k[None, :] < CRS) & (h >= 0) & (h < H)
                      & (w >= 0) & (w < W))
            a = tl.load(x_ptr + x_base[:, None] + (c[None, :] * H + h) * W + w, mask=a_mask,
                        other=0.0)
            b_mask = (offs_k[:, None] < CRS) & (offs_n[None, :] < K)
            b = tl.load(w_ptr + offs_n[None, :] * CRS + offs_k[:, None], mask=b_mask,
                        other=0.0)
            acc += tl.dot(a, b, input_precision=PRECISION)
        out = out_ptr + (n[:, None] * K + offs_n[None, :]) * PQ + pq[:, None]
        tl.store(out, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < K))

    _KERNEL = conv2d_triton_kernel
    return _KERNEL


def _tensor(a):
    import torch

    return a if isinstance(a, torch.Tensor) else torch.as_tensor(a, device="cuda")


def conv2d_triton(x, w, out, stride=1, padding=0, dilation=1, precision: str = "fp32"):
    """out = conv2d(x, w) by the Triton kernel (autotuned per shape on first call).

    precision: 'fp32' (FMA, TF32 off, as the course's kernels) or 'tf32' (tensor cores,
    inputs rounded to 10-bit mantissas: what `tl.dot` does by default).
    """
    if precision not in ("fp32", "tf32"):
        raise Unsupported(f"precision must be 'fp32' or 'tf32', got {precision!r}")
    p = ref.conv_params(x.shape, w.shape, stride, padding, dilation)
    if tuple(out.shape) != p.out_shape:
        raise Unsupported(f"out must have shape {p.out_shape}, got {tuple(out.shape)}")
    if not available():
        raise Unsupported("the Triton rung needs Triton, PyTorch and a GPU")
    import triton

    xt, wt, ot = _tensor(x), _tensor(w), _tensor(out)
    import torch

    for name, t in (("x", xt), ("w", wt), ("out", ot)):
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise Unsupported(f"{name} must be a contiguous float32 tensor (NCHW), got "
                              f"{t.dtype}{'' if t.is_contiguous() else ', not contiguous'}")
    M, CRS = p.N * p.P * p.Q, p.C * p.R * p.S
    if max(xt.numel(), wt.numel(), ot.numel()) >= 2**31:
        raise Unsupported("the Triton rung indexes with 32-bit offsets: tensor too large")

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(p.K, meta["BLOCK_N"]))

    kernel()[grid](xt, wt, ot, p.C, p.H, p.W, p.K, p.P, p.Q, M, CRS, *p.stride, *p.padding,
                   *p.dilation, R=p.R, S=p.S,
                   PRECISION="ieee" if precision == "fp32" else "tf32")
    return out


def best_config() -> dict | None:
    """The tile shape the autotuner chose for the last shape it ran, or None."""
    k = _KERNEL
    if k is None or not getattr(k, "best_config", None):
        return None
    cfg = k.best_config
    return dict(**cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
