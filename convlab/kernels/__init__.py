"""The course's GPU kernels, one module per ladder step, in ladder order.

Importing this package imports numba, so it runs `convlab.setup()` first (real GPU or
simulator). Every conv launcher has the signature of `_launch`::

    conv2d_<name>(x, w, out, stride=1, padding=0, dilation=1, groups=1) -> out
"""

from .. import runtime as _runtime

_runtime.setup()

from . import (  # noqa: E402
    conv01_naive,
    conv02_coalesced,
    conv03_tiled,
    filter01_naive,
    filter02_tiled,
    gemm01_tiled,
)
from ._launch import Unsupported, ceil_div  # noqa: E402
from .conv01_naive import conv2d_naive  # noqa: E402
from .conv02_coalesced import conv2d_coalesced  # noqa: E402
from .conv03_tiled import conv2d_tiled  # noqa: E402
from .filter01_naive import filter2d_naive  # noqa: E402
from .filter02_tiled import filter2d_tiled  # noqa: E402
from .gemm01_tiled import gemm_tiled  # noqa: E402

# The conv ladder, in the order the lessons build it: name -> launcher.
CONV_LADDER = {
    "naive": conv2d_naive,
    "coalesced": conv2d_coalesced,
    "tiled": conv2d_tiled,
}

# Every kernel module, for PTX and register reports: name -> module with KERNEL, SIGNATURE.
MODULES = {
    "naive": conv01_naive,
    "coalesced": conv02_coalesced,
    "tiled": conv03_tiled,
    "filter_naive": filter01_naive,
    "filter_tiled": filter02_tiled,
    "gemm_tiled": gemm01_tiled,
}

# Single-channel image filters ('same' zero padding): filter2d_<name>(image, kernel, out).
FILTER_LADDER = {
    "naive": filter2d_naive,
    "tiled": filter2d_tiled,
}

# Matrix products for the im2col path: gemm_<name>(a, b, out).
GEMM_LADDER = {
    "tiled": gemm_tiled,
}


def ptx_report(cc=(9, 0)) -> dict:
    """Compile every kernel to PTX for compute capability `cc` (no GPU needed).

    Returns name -> {"ptx": text, "lines": count}. Fails loudly if any kernel does not
    compile, which is how CI catches a broken numba-cuda / NumPy combination.
    """
    if _runtime.is_simulator():
        raise RuntimeError("ptx_report() needs the real CUDA target: convlab.setup('gpu')")
    from numba import cuda

    out = {}
    for name, mod in MODULES.items():
        ptx, _ = cuda.compile_ptx(mod.KERNEL.py_func, mod.SIGNATURE, cc=cc)
        out[name] = {"ptx": ptx, "lines": ptx.count("\n")}
    return out


__all__ = ["CONV_LADDER", "FILTER_LADDER", "GEMM_LADDER", "MODULES", "Unsupported", "ceil_div",
           "conv2d_coalesced", "conv2d_naive", "conv2d_tiled", "filter2d_naive",
           "filter2d_tiled", "gemm_tiled", "ptx_report"]
