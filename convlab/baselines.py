"""Library baselines timed beside the course's kernels: cuDNN (PyTorch) and cuBLAS (CuPy).

fp32 baselines run with TF32 off (PyTorch's cudnn/matmul allow_tf32 flags; CuPy without
CUPY_TF32), so the race is fair: same precision, same inputs, same run.
"""

from __future__ import annotations

import numpy as np

from .bench import Impl
from .runtime import import_optional


def torch_available() -> bool:
    torch = import_optional("torch")
    return bool(torch is not None and torch.cuda.is_available())


def cupy_available() -> bool:
    cp = import_optional("cupy")
    try:
        return bool(cp is not None and cp.cuda.runtime.getDeviceCount() > 0)
    except Exception:  # noqa: BLE001
        return False


def set_torch_precision(precision: str):
    """'fp32' (TF32 off), 'tf32' (TF32 on); returns torch."""
    torch = import_optional("torch")
    tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    return torch


def cudnn_conv_impl(problem, precision: str = "fp32", name: str | None = None) -> Impl:
    """PyTorch conv2d (cuDNN) at fp32 (TF32 off), tf32 or fp16 (inputs cast once)."""
    torch = import_optional("torch")
    F = torch.nn.functional
    dtype = torch.float16 if precision == "fp16" else torch.float32
    kw = problem.kwargs

    def prepare(x, w):
        set_torch_precision(precision)
        s = dict(x=torch.from_numpy(x).cuda().to(dtype), w=torch.from_numpy(w).cuda().to(dtype))
        s["out"] = F.conv2d(s["x"], s["w"], **kw)
        return s

    def run(s):
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        s["out"] = F.conv2d(s["x"], s["w"], **kw)

    def fetch(s):
        torch.cuda.synchronize()
        return s["out"].float().cpu().numpy()

    return Impl(name or f"cuDNN {precision}", prepare, run, fetch, kind="library")


def cublas_im2col_impl(problem, name: str = "im2col + cuBLAS") -> Impl:
    """Explicit im2col on the GPU (CuPy) followed by one cuBLAS SGEMM, TF32 off."""
    cp = import_optional("cupy")
    from . import reference as ref

    p = ref.conv_params(problem.x_shape, problem.w_shape, **problem.kwargs)
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation

    def prepare(x, w):
        return dict(x=cp.asarray(x), w=cp.asarray(w).reshape(p.K, -1), out=None)

    def run(s):
        xp = cp.pad(s["x"], ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        cols = cp.empty((p.C, p.R, p.S, p.N, p.P, p.Q), dtype=cp.float32)
        for r in range(p.R):
            for c in range(p.S):
                cols[:, r, c] = xp[:, :, r * dh: r * dh + sh * p.P: sh,
                                   c * dw: c * dw + sw * p.Q: sw].transpose(1, 0, 2, 3)
        y = s["w"] @ cols.reshape(p.C * p.R * p.S, -1)
        s["out"] = y.reshape(p.K, p.N, p.P, p.Q).transpose(1, 0, 2, 3)

    def fetch(s):
        return cp.asnumpy(s["out"])

    return Impl(name, prepare, run, fetch, kind="library")


def cublas_gemm(a, b):
    """C = A @ B through cuBLAS (CuPy), fp32 (TF32 off unless CUPY_TF32 is set)."""
    cp = import_optional("cupy")
    return cp.matmul(a, b)


def as_numpy(a) -> np.ndarray:
    if hasattr(a, "copy_to_host"):
        return a.copy_to_host()
    if hasattr(a, "get"):
        return a.get()
    return np.asarray(a)
