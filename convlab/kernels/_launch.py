"""What every kernel launcher shares: argument checks, refusals, grid arithmetic.

The common launcher signature (device arrays, float32, NCHW)::

    conv2d_<name>(x, w, out, stride=1, padding=0, dilation=1, groups=1) -> out

x (N, C, H, W), w (K, C, R, S), out (N, K, P, Q) preallocated by the caller. A kernel
refuses what it does not support with `Unsupported`; it never returns a wrong answer.
"""

from __future__ import annotations

import numpy as np

from ..errors import Unsupported  # noqa: F401  (re-exported: kernels raise it)
from ..reference import ConvParams, conv_params

# Argument types of the direct-conv kernels (x, w, y, stride, padding, dilation), for
# compiling to PTX without a GPU (cuda.compile_ptx) and reading register counts.
CONV_SIGNATURE = ("(float32[:, :, :, ::1], float32[:, :, :, ::1], float32[:, :, :, ::1], "
                  "int64, int64, int64, int64, int64, int64)")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def conv_launch_params(name: str, x, w, out, stride, padding, dilation, groups,
                       supports=("stride", "padding", "dilation")) -> ConvParams:
    """Validate a launch; return its ConvParams or raise a clear error."""
    for label, a in (("x", x), ("w", w), ("out", out)):
        if a is None or not hasattr(a, "shape"):
            raise TypeError(f"{name}: {label} must be a device array, got {type(a).__name__}")
        if np.dtype(a.dtype) != np.float32:
            raise TypeError(f"{name}: {label} must be float32, got {a.dtype}")
    if groups != 1:
        raise Unsupported(f"{name} does not support groups={groups} (only 1)")
    p = conv_params(x.shape, w.shape, stride, padding, dilation, groups)
    if "stride" not in supports and p.stride != (1, 1):
        raise Unsupported(f"{name} does not support stride {p.stride} (only 1)")
    if "padding" not in supports and p.padding != (0, 0):
        raise Unsupported(f"{name} does not support padding {p.padding} (only 0)")
    if "dilation" not in supports and p.dilation != (1, 1):
        raise Unsupported(f"{name} does not support dilation {p.dilation} (only 1)")
    if tuple(out.shape) != p.out_shape:
        raise ValueError(f"{name}: out has shape {tuple(out.shape)}, expected {p.out_shape}")
    return p


def direct_launch_args(name: str, x, w, out, stride, padding, dilation, groups):
    """Validated ConvParams and the int32 scalars (C, H, W, K, P, Q, sh, sw, ph, pw, dh, dw)
    of the flat direct-conv kernels, which index in 32 bits."""
    p = conv_launch_params(name, x, w, out, stride, padding, dilation, groups)
    if max(x.size, w.size, out.size) >= 2**31:
        raise Unsupported(f"{name}: tensors of 2**31 elements or more need 64-bit indices")
    if p.N > 65535 or p.K > 65535:
        raise Unsupported(f"{name}: N={p.N}, K={p.K}: the grid allows 65535 of each")
    i32 = np.int32
    scalars = tuple(i32(v) for v in (p.C, p.H, p.W, p.K, p.P, p.Q, *p.stride, *p.padding,
                                     *p.dilation))
    return p, scalars


PLAN_LIMIT = 256  # launch plans a launcher keeps (one per layer shape and arguments)


def remember(cache: dict, key, plan):
    """Store ``cache[key] = plan`` (key None: an unhashable call, not stored) and return plan.

    A launcher called in a loop plans once per shape: checks, tiling and the configured
    kernel (``kernel[grid, block, stream]``) come from the plan. A key holds shapes,
    dtypes and arguments (and values read at this very call, such as filter taps that
    are compiled in), never a buffer's address or contents from an earlier call: the
    kernels read the buffers afresh at every launch.
    """
    if key is not None:
        if len(cache) >= PLAN_LIMIT:
            cache.clear()
        cache[key] = plan
    return plan


def configured(kernel, grid, block, stream=0):
    """``kernel[grid, block, stream]``, made once and called for every launch of a plan.

    On a GPU that is Numba's launch configuration object. The simulator's ``kernel[...]``
    sets the grid on the kernel itself and returns the kernel, so a kept one would take the
    grid of whichever plan configured it last: there the launch configures on every call.
    Both have ``dispatcher``, ``griddim`` and ``blockdim`` (for a bare launch to compare).
    """
    from ..runtime import is_simulator

    if is_simulator():
        return _SimLaunch(kernel, grid, block, stream)
    return kernel[grid, block, stream]


class _SimLaunch:
    """A launch configuration kept under the simulator: configures at every call."""

    __slots__ = ("dispatcher", "griddim", "blockdim", "stream")

    def __init__(self, kernel, grid, block, stream):
        self.dispatcher, self.griddim, self.blockdim, self.stream = kernel, grid, block, stream

    def __call__(self, *args):
        return self.dispatcher[self.griddim, self.blockdim, self.stream](*args)


def chosen_launch(name: str, cache: dict, pick, x, w, out, stride, padding, dilation,
                  groups):
    """The launch function `pick(ConvParams)` chose for this layer, remembered per shape and
    arguments in `cache`: the first call validates and chooses, a repeat costs a dict lookup."""
    try:
        key = (x.shape, w.shape, out.shape, stride, padding, dilation, groups)
        launch = cache.get(key)
    except TypeError:  # unhashable arguments: validate and choose every time
        key, launch = None, None
    if launch is None:
        launch = pick(conv_launch_params(name, x, w, out, stride, padding, dilation, groups))
        if key is not None:
            cache[key] = launch
    return launch


def picked_launcher(name: str, launcher_for, pick, doc: str):
    """A launcher (common signature) that runs ``launcher_for(pick(ConvParams))``; the choice
    is made once per shape and arguments (`chosen_launch`)."""
    choice: dict = {}

    @launcher
    def conv2d(x, w, out, stride=1, padding=0, dilation=1, groups=1):
        launch = chosen_launch(name, choice, lambda p: launcher_for(pick(p)), x, w, out, stride,
                               padding, dilation, groups)
        return launch(x, w, out, stride=stride, padding=padding, dilation=dilation,
                      groups=groups)

    conv2d.__name__, conv2d.__doc__ = name, doc
    return conv2d


def launcher(fn):
    """Mark fn as a GPU launcher (device arrays in, fills `out`) for checkers and bench."""
    fn.device = True
    return fn


def planned_conv(cache: dict, plan, x, w, out, args: tuple, cfg: dict):
    """``plan(x, w, out, *args, **cfg)``, kept in `cache` per the arrays' shapes and dtypes,
    args, cfg and the 16-byte alignment of x and out (the vector paths depend on it; the
    simulator's arrays have no address, and its vector paths need no alignment); an
    argument the key cannot hold (checked by plan) plans afresh."""
    from ..runtime import is_simulator

    try:
        aligned = None if is_simulator() else (device_pointer(x) % 16, device_pointer(out) % 16)
        key = (x.shape, w.shape, out.shape, str(x.dtype), str(w.dtype), str(out.dtype), args,
               tuple(sorted(cfg.items())), aligned)
        run = cache.get(key)
    except (AttributeError, TypeError, KeyError):
        key = run = None
    return run if run is not None else remember(cache, key, plan(x, w, out, *args, **cfg))


def device_pointer(a) -> int:
    """Device address of a Numba, CuPy or PyTorch array (no copy, no synchronization)."""
    p = getattr(a, "device_ctypes_pointer", None)  # Numba
    if p is not None:
        return p.value or 0
    if hasattr(a, "data_ptr"):  # torch
        return a.data_ptr()
    data = getattr(a, "data", None)
    if hasattr(data, "ptr"):  # CuPy
        return data.ptr
    return int(a.__cuda_array_interface__["data"][0])


def array_kind(a) -> str:
    """'bfloat16', 'float16' or 'float32' for a NumPy, CuPy or PyTorch array (else its
    dtype's name): torch's dtypes are not NumPy's, and NumPy has no bfloat16."""
    s = str(a.dtype)
    for kind in ("bfloat16", "float16", "float32"):
        if kind in s:
            return kind
    return s


def check_array(name: str, label: str, a, shape, kinds) -> None:
    """Raise unless `a` has `shape`, one of `kinds` (`array_kind`) and C order."""
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name}: {label} has shape {tuple(a.shape)}, expected {tuple(shape)}")
    if array_kind(a) not in kinds:
        raise TypeError(f"{name}: {label} must be {' or '.join(kinds)}, got {a.dtype}")
    contiguous = getattr(a, "is_contiguous", None)  # torch
    if contiguous is not None and not contiguous():
        raise Unsupported(f"{name}: {label} must be contiguous")
    flags = getattr(a, "flags", None)  # NumPy, CuPy
    if flags is not None and hasattr(flags, "c_contiguous") and not flags.c_contiguous:
        raise Unsupported(f"{name}: {label} must be C-contiguous")


_SMS: dict = {}


def sm_count() -> int:
    """Streaming multiprocessors of the current CuPy device (cached: asking CuPy for its
    attributes costs tens of microseconds, more than a small kernel)."""
    import cupy as cp

    dev = cp.cuda.Device().id
    if dev not in _SMS:
        _SMS[dev] = cp.cuda.Device().attributes["MultiProcessorCount"]
    return _SMS[dev]


_WORKSPACE: dict = {}


def workspace(tag: str, shape) -> object:
    """An fp32 CuPy array of `shape` kept for the next call (a launcher's scratch: Winograd's
    U, V, M, im2col's columns): one per tag, replaced when the shape changes, so memory
    stays at one layer's worth (CuPy's pool makes the replacement cheap)."""
    import cupy as cp

    shape = tuple(shape)
    buf = _WORKSPACE.get(tag)
    if buf is None or buf.shape != shape:
        _WORKSPACE[tag] = buf = None  # let the pool take the old one back first
        _WORKSPACE[tag] = buf = cp.empty(shape, cp.float32)
    return buf
