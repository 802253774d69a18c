"""Argument checks shared by the single-channel image-filter launchers (filter01, filter02)."""

from __future__ import annotations

import numpy as np

from ._launch import Unsupported


def filter_launch_params(name: str, image, kernel, out) -> tuple:
    """Validate ``filter2d_<name>(image (H, W), kernel (R, S), out (H, W))``; return H, W, R, S."""
    for label, a in (("image", image), ("kernel", kernel), ("out", out)):
        if a is None or not hasattr(a, "shape"):
            raise TypeError(f"{name}: {label} must be a device array, got {type(a).__name__}")
        if np.dtype(a.dtype) != np.float32:
            raise TypeError(f"{name}: {label} must be float32, got {a.dtype}")
        if len(a.shape) != 2:
            raise ValueError(f"{name}: {label} must be 2-D, got shape {tuple(a.shape)}")
    H, W = image.shape
    R, S = kernel.shape
    if R % 2 == 0 or S % 2 == 0:
        raise Unsupported(f"{name}: 'same' padding needs an odd filter size, got {R}x{S}")
    if tuple(out.shape) != (H, W):
        raise ValueError(f"{name}: out has shape {tuple(out.shape)}, expected {(H, W)}")
    if H * W >= 2**31:
        raise Unsupported(f"{name}: images of 2**31 pixels or more need 64-bit indices")
    return H, W, R, S


def jit_options(threads: int, min_blocks: int = 0) -> dict:
    """``cuda.jit`` launch bounds on a GPU; nothing under the simulator, which refuses them."""
    from ..runtime import is_simulator

    if is_simulator() or not min_blocks:
        return {}
    return {"launch_bounds": (threads, min_blocks)}
