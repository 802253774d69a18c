"""Planted bugs in the ladder kernels that the simulator tests must catch.

Each mutant is a kernel module's source with one line changed (the channel-slab offset
frozen, the filter-tile offset forced to 0, ...), compiled as a module of its own. On a
case with several channel slabs (C > BK) and several filter tiles (K > BM) the checker
must reject every mutant and accept the real kernel.
"""

import importlib
import inspect
import linecache
import sys
import types

import pytest

from convlab import check
from convlab.errors import CheckError

# module, launcher name, (source fragment, its replacement), x shape, w shape
MUTANTS = {
    "direct: channel blocks stop after the first": (
        "conv03_tiled", "conv2d_tiled",
        ("for c0 in range(0, C, cb):", "for c0 in range(0, min(C, cb), cb):"),
        (1, 9, 6, 7), (3, 9, 3, 3)),
    "register-blocked: filter tile offset 0": (
        "conv04_register_blocked", "conv2d_register_blocked",
        ("k0 = int32(cuda.blockIdx.y * kpt)", "k0 = int32(0)"),
        (1, 3, 9, 5), (21, 3, 3, 3)),
    "register-blocked: rows of a thread all the same": (
        "conv04_register_blocked", "conv2d_register_blocked",
        ("+ i * SHWI + r * DHWI", "+ r * DHWI"), (1, 3, 9, 5), (5, 3, 3, 3)),
    "implicit GEMM: channel offset frozen": (
        "conv05_implicit_gemm", "conv2d_implicit_gemm",
        ("            c0 += BK\n", "            c0 += 0\n"), (1, 21, 5, 4), (5, 21, 3, 3)),
    "implicit GEMM: filter tile offset 0": (
        "conv05_implicit_gemm", "conv2d_implicit_gemm",
        ("k0 = (cuda.blockIdx.y & 0xFFFF) * BM", "k0 = 0"), (1, 3, 5, 4), (37, 3, 3, 3)),
    "double-buffered: channel offset frozen": (
        "conv06_implicit_gemm_double_buffered", "conv2d_implicit_gemm_double_buffered",
        ("                c0 += BK\n", "                c0 += 0\n"), (1, 21, 5, 4),
        (5, 21, 3, 3)),
    "warp-tiled: filter tile offset 0": (
        "conv07_implicit_gemm_warp_tiled", "conv2d_implicit_gemm_warp_tiled",
        ("k0 = (cuda.blockIdx.y & 0xFFFF) * BM", "k0 = 0"), (1, 3, 5, 4), (37, 3, 3, 3)),
}


def mutant(module: str, old: str, new: str) -> types.ModuleType:
    """A copy of convlab.kernels.<module> with `old` replaced by `new` (which must occur)."""
    real = importlib.import_module(f"convlab.kernels.{module}")
    src = inspect.getsource(real)
    assert src.count(old) >= 1, f"{module}: the fragment to mutate is gone: {old!r}"
    src = src.replace(old, new)
    fname = f"<mutant of {module}>"  # the unroller reads kernel source through linecache
    linecache.cache[fname] = (len(src), None, src.splitlines(True), fname)
    mod = types.ModuleType(f"convlab.kernels._mutant_{module}")
    mod.__package__ = "convlab.kernels"
    mod.__file__ = fname
    sys.modules[mod.__name__] = mod
    try:
        exec(compile(src, fname, "exec"), mod.__dict__)  # noqa: S102
    finally:
        sys.modules.pop(mod.__name__, None)
    return mod


@pytest.mark.parametrize("label", list(MUTANTS))
def test_checker_catches_mutant(label):
    module, fn, (old, new), xs, ws = MUTANTS[label]
    bad = getattr(mutant(module, old, new), fn)
    with pytest.raises(CheckError):
        check.check_conv2d_case(bad, xs, ws, padding=1, quiet=True, runs=1)
    good = getattr(importlib.import_module(f"convlab.kernels.{module}"), fn)
    assert "passed" in check.check_conv2d_case(good, xs, ws, padding=1, quiet=True, runs=1)
