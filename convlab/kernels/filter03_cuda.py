"""Image filter, step 3: CUDA C at copy speed (16-byte loads and stores, halo by shuffle).

`filter02_tiled` stages a tile in shared memory and reads it back; Numba cannot emit
16-byte vector loads, so each thread moves 4 bytes per instruction. This kernel
(``csrc/filter.cu``, NVRTC through CuPy) keeps everything in registers: a warp owns
32 x 4 adjacent columns (one float4 per lane) and slides down a strip of V rows,
holding R rows of its window; the S//2 columns left and right of a lane's float4 come
from the neighbouring lanes by ``__shfl_up_sync`` / ``__shfl_down_sync`` (only the
first and last lane read theirs from memory), and rows are fetched PF rows ahead so
several 16-byte loads per thread are in flight. Every input row is read once per strip,
every output written once: the traffic of a copy plus (R - 1) / V halo rows, which
neighbouring strips bring into the cache at the same moment (odd strips walk up, even
ones down: the rows two strips share are both strips' first rows, or both strips' last).

The default strips are short (V = 2: a warp issues its four row loads at once, writes two
rows and is gone), the fastest in the H200 sweep (tools/gpu/memory_bound.py). Long strips
read fewer halo rows, but each warp waits through many DRAM round trips one after the
other with few loads in flight; short strips read every row twice, the second time (the
intent; not profiled) from L1 when both strips run in one block, from the L2 otherwise.

Rows must start on 16 bytes for float4 (W % 4 == 0, aligned buffers); otherwise the same
kernel runs with one column per lane (scalar loads). The taps are compiled in as
constants (one compiled module per filter, cached), as in filter02.

Launcher signature (device arrays, float32; taps a host array, or a device array copied
to the host on every call)::

    filter2d_cuda(image (H, W), taps (R, S), out (H, W)) -> out
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from ._filter import filter_launch_params
from ._launch import Unsupported, ceil_div, check_array, device_pointer, launcher, remember

SOURCE_PATH = Path(__file__).parent / "csrc" / "filter.cu"
NAME = "filter2d_cuda"
MAX_SIZE = 9  # largest R and S (the unrolled kernel grows as V * R * S)
# Default: V rows per strip, warps per block (stacked vertically), rows fetched ahead (all
# V + R - 1 of a 3x3 strip), blocks per SM the registers must allow (launch bounds; 0: the
# compiler's choice), odd strips walking up (neighbouring strips read their shared rows at
# the same time). Chosen by tools/gpu/memory_bound.py's sweep on 4096^2.
DEFAULT = dict(v=2, warps=8, pf=4, minb=0, alt=1)


def header(taps) -> str:
    """FR, FS and the taps as constants, for the kernel source."""
    t = np.asarray(taps, np.float32)
    R, S = t.shape
    rows = ", ".join("{" + ", ".join(f"{float(v)!r}f" for v in row) + "}" for row in t)
    return f"#define FR {R}\n#define FS {S}\n__device__ const float TAPS[FR][FS] = {{{rows}}};\n"


def source(taps) -> str:
    return header(taps) + SOURCE_PATH.read_text()


def kernel_name(vec: int, v: int, warps: int, pf: int, minb: int = 0, alt: int = 1) -> str:
    return f"filter2d<{vec}, {v}, {warps}, {pf}, {minb}, {'true' if alt else 'false'}>"


@functools.cache
def _kernel(shape: tuple, tap_bytes: bytes, name: str):
    import cupy as cp

    taps = np.frombuffer(tap_bytes, np.float32).reshape(shape)
    mod = cp.RawModule(code=source(taps), options=("-std=c++17",), name_expressions=(name,))
    return mod.get_function(name)


def _host_taps(taps) -> np.ndarray:
    if hasattr(taps, "copy_to_host"):  # Numba
        taps = taps.copy_to_host()
    elif hasattr(taps, "get"):  # CuPy
        taps = taps.get()
    return np.ascontiguousarray(np.asarray(taps, np.float32))


def vectorised(image, out) -> bool:
    """Whether the float4 path applies: rows of a multiple of 4 floats, 16-byte aligned."""
    return (image.shape[1] % 4 == 0 and device_pointer(image) % 16 == 0
            and device_pointer(out) % 16 == 0)


def plan(image, taps, out, v: int, warps: int, pf: int, minb: int = 0, alt: int = 1) -> tuple:
    """Check a launch: (kernel, grid, block, int32 H, int32 W)."""
    H, W, R, S = filter_launch_params(NAME, image, taps, out)
    for label, a in (("image", image), ("out", out)):
        check_array(NAME, label, a, (H, W), ("float32",))
    if max(R, S) > MAX_SIZE:
        raise Unsupported(f"{NAME}: filters up to {MAX_SIZE}x{MAX_SIZE}, got {R}x{S}")
    if not (1 <= v <= 64 and 1 <= warps <= 32 and 1 <= pf <= 8 and 0 <= minb <= 64 // warps):
        raise Unsupported(f"{NAME}: bad tiling v={v} warps={warps} pf={pf} minb={minb}")
    vec = 4 if vectorised(image, out) else 1
    grid = (ceil_div(W, 32 * vec), ceil_div(H, v * warps))
    if grid[1] > 65535:
        raise Unsupported(f"{NAME}: {grid[1]} block rows exceed the grid's 65535")
    host = _host_taps(taps)
    k = _kernel(host.shape, host.tobytes(), kernel_name(vec, v, warps, pf, minb, alt))
    return k, grid, (32 * warps,), np.int32(H), np.int32(W)


_PLANS: dict = {}


def launch(image, taps, out, v: int = DEFAULT["v"], warps: int = DEFAULT["warps"],
           pf: int = DEFAULT["pf"], minb: int = DEFAULT["minb"], alt: int = DEFAULT["alt"]):
    """Run the filter with an explicit tiling (the GPU sweep uses it). The plan is kept per
    shapes, addresses' alignment, tiling and tap values (they are compiled in)."""
    try:
        host = _host_taps(taps)
        key = (image.shape, out.shape, str(image.dtype), str(out.dtype), host.shape,
               host.tobytes(), vectorised(image, out), v, warps, pf, minb, alt)
        run = _PLANS.get(key)
    except (AttributeError, TypeError, ValueError, IndexError):  # checked by plan
        key = run = None
    if run is None:
        run = remember(_PLANS, key, plan(image, taps, out, v, warps, pf, minb, alt))
    import cupy as cp

    k, grid, block, H, W = run
    k(grid, block, (cp.asarray(image), cp.asarray(out), H, W))
    return out


@launcher
def filter2d_cuda(image, taps, out):
    """2-D filter ('same' zero padding, odd R, S up to 9): float4 rows, halo by shuffle."""
    return launch(image, taps, out, **DEFAULT)
