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
    conv04_register_blocked,
    conv05_implicit_gemm,
    conv06_implicit_gemm_double_buffered,
    conv07_implicit_gemm_warp_tiled,
    conv08_implicit_gemm_tuned,
    conv09_implicit_gemm_cuda,
    depthwise01_direct,
    depthwise02_smem,
    depthwise06_window,
    filter01_naive,
    filter02_tiled,
    gemm01_tiled,
    gemm02_register_blocked,
    gemm03_vectorized,
    gemm04_double_buffered,
    gemm05_wide_loads,
    separable01_rows_cols,
)
from ._launch import Unsupported, ceil_div  # noqa: E402
from .conv01_naive import conv2d_naive  # noqa: E402
from .conv02_coalesced import conv2d_coalesced  # noqa: E402
from .conv03_tiled import conv2d_tiled  # noqa: E402
from .conv04_register_blocked import conv2d_register_blocked  # noqa: E402
from .conv05_implicit_gemm import conv2d_implicit_gemm  # noqa: E402
from .conv06_implicit_gemm_double_buffered import conv2d_implicit_gemm_double_buffered  # noqa: E402,E501
from .conv07_implicit_gemm_warp_tiled import conv2d_implicit_gemm_warp_tiled  # noqa: E402
from .conv08_implicit_gemm_tuned import conv2d_implicit_gemm_tuned  # noqa: E402
from .conv09_implicit_gemm_cuda import conv2d_implicit_gemm_cuda  # noqa: E402
from .depthwise01_direct import conv2d_depthwise  # noqa: E402
from .depthwise02_smem import conv2d_depthwise_smem  # noqa: E402
from .depthwise06_window import conv2d_depthwise_window  # noqa: E402
from .filter01_naive import filter2d_naive  # noqa: E402
from .filter02_tiled import filter2d_tiled  # noqa: E402
from .gemm01_tiled import gemm_tiled  # noqa: E402
from .gemm02_register_blocked import gemm_register_blocked  # noqa: E402
from .gemm03_vectorized import gemm_vectorized  # noqa: E402
from .gemm04_double_buffered import gemm_double_buffered  # noqa: E402
from .gemm05_wide_loads import gemm_wide_loads  # noqa: E402
from .separable01_rows_cols import filter2d_separable  # noqa: E402

# The conv ladder, in the order the lessons build it: name -> launcher.
CONV_LADDER = {
    "naive": conv2d_naive,
    "coalesced": conv2d_coalesced,
    "tiled": conv2d_tiled,
    "register_blocked": conv2d_register_blocked,
    "implicit_gemm": conv2d_implicit_gemm,
    "implicit_gemm_double_buffered": conv2d_implicit_gemm_double_buffered,
    "implicit_gemm_warp_tiled": conv2d_implicit_gemm_warp_tiled,
    "implicit_gemm_tuned": conv2d_implicit_gemm_tuned,
}


def _cupy_gpu() -> bool:
    """CuPy importable and a real GPU: the CUDA C (RawKernel) steps can run."""
    import importlib.util

    return not _runtime.is_simulator() and importlib.util.find_spec("cupy") is not None


# The CUDA C step (CuPy RawKernel) joins the ladder where it can run: not in the simulator.
if _cupy_gpu():
    CONV_LADDER["implicit_gemm_cuda"] = conv2d_implicit_gemm_cuda

# Every kernel module, for PTX and register reports: name -> module with KERNEL, SIGNATURE.
MODULES = {
    "naive": conv01_naive,
    "coalesced": conv02_coalesced,
    "tiled": conv03_tiled,
    "filter_naive": filter01_naive,
    "filter_tiled": filter02_tiled,
    "gemm_tiled": gemm01_tiled,
    "register_blocked": conv04_register_blocked,
    "implicit_gemm": conv05_implicit_gemm,
    "implicit_gemm_double_buffered": conv06_implicit_gemm_double_buffered,
    "implicit_gemm_warp_tiled": conv07_implicit_gemm_warp_tiled,
    "gemm_register_blocked": gemm02_register_blocked,
    "gemm_vectorized": gemm03_vectorized,
    "gemm_double_buffered": gemm04_double_buffered,
    "gemm_wide_loads": gemm05_wide_loads,
    "depthwise": depthwise01_direct,
    "depthwise_smem": depthwise02_smem,
    "depthwise_window": depthwise06_window,
    "separable_cols": separable01_rows_cols,
}

# Single-channel image filters ('same' zero padding): filter2d_<name>(image, kernel, out).
FILTER_LADDER = {
    "naive": filter2d_naive,
    "tiled": filter2d_tiled,
}

# Matrix products for the im2col path: gemm_<name>(a, b, out).
GEMM_LADDER = {
    "tiled": gemm_tiled,
    "register_blocked": gemm_register_blocked,
    "vectorized": gemm_vectorized,
    "double_buffered": gemm_double_buffered,
    "wide_loads": gemm_wide_loads,
}


# Depthwise 3x3 convolutions (groups = channels, w (C, 1, R, S)), lesson 11: same signature
# as the conv launchers.
DEPTHWISE_LADDER = {
    "direct": conv2d_depthwise,
    "smem": conv2d_depthwise_smem,
}

# Separable filters as two 1-D passes, lesson 11:
# filter2d_<name>(image (H, W), col_taps (R,), row_taps (S,), out (H, W)).
SEPARABLE_LADDER = {
    "rows_cols": filter2d_separable,
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
        k = mod.KERNEL  # with its launch bounds: they cap the registers, so they change the PTX
        ptx, _ = cuda.compile_ptx(k.py_func, mod.SIGNATURE, cc=cc,
                                  launch_bounds=k.targetoptions.get("launch_bounds"))
        out[name] = {"ptx": ptx, "lines": ptx.count("\n")}
    return out


__all__ = ["CONV_LADDER", "FILTER_LADDER", "GEMM_LADDER", "MODULES", "Unsupported", "ceil_div",
           "conv2d_coalesced", "conv2d_naive", "conv2d_tiled", "filter2d_naive",
           "filter2d_tiled", "gemm_tiled", "ptx_report", "conv2d_register_blocked",
           "conv2d_implicit_gemm", "conv2d_implicit_gemm_double_buffered",
           "conv2d_implicit_gemm_warp_tiled",
           "conv2d_implicit_gemm_tuned", "conv2d_implicit_gemm_cuda", "gemm_register_blocked",
           "gemm_vectorized", "gemm_double_buffered", "gemm_wide_loads",
           "conv08_implicit_gemm_tuned",
           "conv09_implicit_gemm_cuda", "DEPTHWISE_LADDER", "SEPARABLE_LADDER", "conv2d_depthwise",
           "conv2d_depthwise_smem", "conv2d_depthwise_window", "filter2d_separable"]
