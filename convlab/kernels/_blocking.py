"""What the register-blocked kernels (lessons 07-09) share: GEMM launch checks, tile
arithmetic, compile options that the simulator does not know, the weight transform of
the implicit-GEMM convolutions.

Numba facts these kernels are built around (each one checked in the PTX, see
``kernels.ptx_report``):

- a `cuda.local.array` indexed only by constants (fully unrolled loops over
  compile-time sizes) lives in registers; one run-time index sends it to local memory;
- four neighbouring `cuda.shared.array` reads become one 128-bit ``ld.shared.v4.f32``
  only if the array is 16-byte aligned (``alignment=16``) and the compiler can prove
  the index is not negative: Numba wraps negative indices like Python, so an index
  built from ``tid % 16`` or ``tid >> 4`` (signed) keeps the wrap-around code and
  stays scalar, while ``tid & 15`` is provably >= 0 and vectorizes;
- the simulator knows neither ``alignment`` nor ``launch_bounds``: `SMEM_ALIGN` and
  `jit_options` give ``None`` / ``{}`` there.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32

from ..runtime import is_simulator
from ._launch import Unsupported, ceil_div, configured, conv_launch_params, launcher

SIM = is_simulator()
SMEM_ALIGN = None if SIM else 16  # bytes; None: the simulator refuses the argument

# Argument types of the GEMM kernels (a, b, c, M, N, K) for compiling to PTX.
GEMM_SIGNATURE = ("(float32[:, ::1], float32[:, ::1], float32[:, ::1], int64, int64, "
                  "int64)")
# The same on flat (1-D) views of a, b, c.
FLAT_GEMM_SIGNATURE = "(float32[::1], float32[::1], float32[::1], int64, int64, int64)"


def jit_options(threads: int | None = None, min_blocks: int | None = None) -> dict:
    """``cuda.jit`` keyword arguments: launch bounds on a GPU, nothing under the simulator."""
    if SIM or threads is None:
        return {}
    return {"launch_bounds": (threads, min_blocks) if min_blocks else threads}


def log2(n: int, what: str = "tile size") -> int:
    """log2 of a power of two (tile sizes must be powers of two: masks replace % and //)."""
    if n <= 0 or n & (n - 1):
        raise ValueError(f"{what} must be a power of two, got {n}")
    return n.bit_length() - 1


def gemm_launch_params(name: str, a, b, out) -> tuple[int, int, int]:
    """Validate a GEMM launch (a (M, K) @ b (K, N) -> out (M, N), float32); return M, N, K."""
    for label, arr in (("a", a), ("b", b), ("out", out)):
        if arr is None or not hasattr(arr, "shape"):
            raise TypeError(f"{name}: {label} must be a device array, got {type(arr).__name__}")
        if np.dtype(arr.dtype) != np.float32:
            raise TypeError(f"{name}: {label} must be float32, got {arr.dtype}")
        if len(arr.shape) != 2:
            raise Unsupported(f"{name}: {label} must be 2-D, got shape {tuple(arr.shape)}")
    (M, K), (K2, N) = a.shape, b.shape
    if K2 != K:
        raise ValueError(f"{name}: inner sizes differ: a is {M}x{K}, b is {K2}x{N}")
    if tuple(out.shape) != (M, N):
        raise ValueError(f"{name}: out has shape {tuple(out.shape)}, expected {(M, N)}")
    return int(M), int(N), int(K)


def nothing_to_launch(out, M: int, N: int, K: int) -> bool:
    """True for an empty product, with `out` then holding its answer.

    A grid of zero blocks is a launch error, and a kernel's first slab would read past an
    empty operand: with K = 0 the product is an (M, N) matrix of zeros, which this writes.
    """
    if M and N and not K:
        out.copy_to_device(np.zeros((M, N), np.float32))
    return not (M and N and K)


def gemm_grid(M: int, N: int, BM: int, BN: int) -> tuple[int, int]:
    """Blocks along N (x) and M (y); y is capped at 65535 by CUDA."""
    gy = ceil_div(M, BM)
    if gy > 65535:
        raise Unsupported(f"M={M} needs {gy} block rows of {BM}; CUDA allows 65535")
    return ceil_div(N, BN), gy


# ----------------------------------------------------------------------------------------
# Implicit GEMM: the filters as the GEMM's A operand, in (r, s, c) order


@cuda.jit
def rsck_weights_kernel(w, wt, Cp):
    """wt[((r*S + s)*Cp + c)*K + k] = w[k, c, r, s], zero for the padding channels C <= c < Cp.

    The filters as a flat (R*S*Cp, K) matrix. With the reduction ordered (r, s, c), one
    K-tile of the implicit GEMM has a single filter tap (r, s) and BK consecutive
    channels, so the kernels never divide to find (c, r, s); A-tile rows are contiguous
    along k (coalesced loads); and with Cp a multiple of BK the A loads need no bounds
    test: the padding channels hold zeros.
    """
    i = cuda.grid(1)
    K, C, R, S = w.shape
    if i < K * Cp * R * S:
        k = i % K
        rest = i // K  # (r*S + s)*Cp + c
        c = rest % Cp
        rs = rest // Cp
        v = float32(0.0)
        if c < C:
            v = w[k, c, rs // S, rs % S]
        wt[i] = v


def rsck_weights(w, channel_multiple: int = 1):
    """Launch the weight transform; returns the flat (R*S*Cp*K,) device array.

    Cp is C rounded up to `channel_multiple` (the kernels' BK), padded with zeros.
    """
    K, C, R, S = w.shape
    Cp = ceil_div(C, channel_multiple) * channel_multiple
    n = K * Cp * R * S
    wt = cuda.device_array(n, dtype=np.float32)
    rsck_weights_kernel[ceil_div(n, 256), 256](w, wt, Cp)
    return wt


# The implicit-GEMM kernels take (x, wt, y, prm), all flat (1-D), with
# prm = int64[N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw, dh, dw, Cp]: four arguments,
# because every launch argument costs Python time (ctypes) on each call.
IGEMM_SIGNATURE = "(float32[::1], float32[::1], float32[::1], int64[::1])"


def conv_grid(p, BM: int, BN: int) -> tuple[int, int]:
    """Blocks along the outputs N*P*Q (x) and the filters K (y)."""
    gy = ceil_div(p.K, BM)
    if gy > 65535:
        raise Unsupported(f"K={p.K} filters need {gy} block rows of {BM}; CUDA allows 65535")
    return ceil_div(p.N * p.P * p.Q, BN), gy


@dataclass
class ConvPlan:
    """What a launch of one layer shape needs, computed once and reused.

    A launcher called in a loop must not spend more time in Python than the GPU spends on
    the kernel, or the timing measures Python: each call re-validating the arguments,
    allocating the filter matrix (``cudaMalloc``; Numba's deferred ``cudaFree`` then
    synchronizes the device now and then) and converting 18 scalar arguments cost more
    than a 0.2 ms kernel. The plan keeps the checked ConvParams, the grid, the scalar
    parameters as a small device array, a scratch buffer for the rearranged filters
    (rewritten by every call: calls on one stream are ordered, so reuse is safe) and the
    weight transform's configured launch (`configured`).
    """

    p: object
    grid: tuple
    prm: object
    wt: object
    Cp: int
    tile: tuple | None = None
    rsck: object = None


_PLANS: dict = {}


def conv_plan(name, x, w, out, stride, padding, dilation, groups, BM, BN, BK,
              pick=None) -> ConvPlan:
    """The cached ConvPlan of a launch (validated in full the first time a shape is seen).

    With `pick`, BM is a tile (BM, BN, ...) or None, and None means ``pick(ConvParams)``;
    the plan's tile is the one chosen.
    """
    try:
        key = (name, x.shape, w.shape, out.shape, stride, padding, dilation, groups, BM, BN,
               BK)
        plan = _PLANS.get(key)
    except TypeError:  # unhashable arguments (lists): no cache
        key, plan = None, None
    if plan is not None and x.dtype == w.dtype == out.dtype == np.float32:
        return plan
    p = conv_launch_params(name, x, w, out, stride, padding, dilation, groups)
    tile = None
    if pick is not None:
        tile = tuple(BM) if BM is not None else tuple(pick(p))
        BM, BN = tile[0], tile[1]
    Cp = ceil_div(p.C, BK) * BK
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
    prm = cuda.to_device(np.array([p.N, p.C, p.H, p.W, p.K, p.R, p.S, p.P, p.Q, sh, sw, ph,
                                   pw, dh, dw, Cp], dtype=np.int64))
    wt = cuda.device_array(p.R * p.S * Cp * p.K, dtype=np.float32)
    n = wt.shape[0]
    plan = ConvPlan(p, conv_grid(p, BM, BN), prm, wt, Cp, tile,
                    configured(rsck_weights_kernel, ceil_div(n, 256), 256))
    if key is not None:
        if len(_PLANS) > 256:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def rsck_weights_into(plan: ConvPlan, w):
    """Rearrange w into plan.wt (the (R*S*Cp, K) matrix of `rsck_weights_kernel`): on
    every call, so new filter values are always used."""
    if plan.rsck is None:
        n = plan.wt.shape[0]
        plan.rsck = configured(rsck_weights_kernel, ceil_div(n, 256), 256)
    plan.rsck(w, plan.wt, plan.Cp)
    return plan.wt


_FLAT: dict = {}


def flat(a):
    """A 1-D view of a C-contiguous device array (no copy), cached per array object.

    Making the view costs tens of microseconds of Python per call, as much as a small
    kernel; a launcher called in a loop with the same arrays gets it from the cache. An
    entry dies with its array (weak reference), so no memory is kept alive.
    """
    key = id(a)
    hit = _FLAT.get(key)
    if hit is not None and hit[0]() is a:
        return hit[1]
    n = int(np.prod(a.shape))
    try:
        view = a.reshape(n)
    except NotImplementedError:
        # Numba's device arrays refuse to reshape when an axis of length 1 has a stride other
        # than the C stride, as `cuda.to_device(w[None])` gives (stride 0): index those axes
        # away first (a view), then reshape what is left.
        keep = [i for i, s in enumerate(a.shape) if s != 1] or [a.ndim - 1]
        view = a[tuple(slice(None) if i in keep else 0 for i in range(a.ndim))].reshape(n)
    try:
        ref = weakref.ref(a, lambda _, k=key: _FLAT.pop(k, None))
    except TypeError:
        return view
    _FLAT[key] = (ref, view)
    return view


def igemm_launcher(kernel, name: str):
    """A conv launcher (common signature) for an implicit-GEMM kernel with a ``tile`` dict
    (BM, BN, BK, threads): cached plan, filters rearranged, one launch (the kernel
    configured once per grid)."""
    t = kernel.tile
    runs: dict = {}

    @launcher
    def conv2d_igemm(x, w, out, stride=1, padding=0, dilation=1, groups=1):
        plan = conv_plan(name, x, w, out, stride, padding, dilation, groups, t["BM"], t["BN"],
                         t["BK"])
        wt = rsck_weights_into(plan, w)
        run = runs.get(plan.grid)
        if run is None:
            if len(runs) >= 256:
                runs.clear()
            run = runs[plan.grid] = configured(kernel, plan.grid, t["threads"])
        run(flat(x), wt, flat(out), plan.prm)
        return out

    conv2d_igemm.__name__ = name
    conv2d_igemm.kernel = kernel
    return conv2d_igemm


def tile_launcher(cache: dict, make_kernel, name: str, cfg):
    """The launcher of tile shape `cfg` (BM, BN, BK, TM, TN, min_blocks) of one kernel
    family: ``make_kernel`` compiles it on first use, `cache` keeps it."""
    launch = cache.get(cfg)
    if launch is None:
        kernel = make_kernel(cfg.BM, cfg.BN, cfg.BK, cfg.TM, cfg.TN, cfg.min_blocks)
        launch = cache[cfg] = igemm_launcher(kernel, f"{name} {cfg}")
    return launch


# ----------------------------------------------------------------------------------------
# Unrolling: Numba has no ``#pragma unroll``


def unroll(n):
    """Marks a loop to copy out: ``for kk in unroll(BK):`` (a plain ``range`` if not rewritten)."""
    return range(n)


class _Unroller:
    """Replace ``for v in unroll(n):`` (n a constant) by n copies of the body with v = 0..n-1."""

    def __init__(self, env: dict):
        self.env = env

    def visit_body(self, body: list) -> list:
        import ast
        import copy

        class _Subst(ast.NodeTransformer):
            def __init__(self, name, value):
                self.name, self.value = name, value

            def visit_Name(self, node):
                return ast.Constant(self.value) if node.id == self.name else node

        out = []
        for node in body:
            for field in ("body", "orelse"):
                if isinstance(getattr(node, field, None), list):
                    setattr(node, field, self.visit_body(getattr(node, field)))
            it = node.iter if isinstance(node, ast.For) else None
            fname = getattr(it.func, "id", getattr(it.func, "attr", None)) if isinstance(
                it, ast.Call) else None
            if fname == "unroll" and isinstance(node.target, ast.Name):
                n = eval(compile(ast.Expression(it.args[0]), "<unroll>", "eval"),  # noqa: S307
                         self.env)
                for k in range(int(n)):
                    for stmt in node.body:
                        out.append(_Subst(node.target.id, k).visit(copy.deepcopy(stmt)))
            else:
                out.append(node)
        return out


_UNROLLED = [0]  # how many kernels `unrolled` has rewritten (unique file names)


def unrolled(fn):
    """Return fn with every ``for v in unroll(n):`` loop written out n times.

    The constants of the loop bounds and the body come from fn's closure (a kernel
    factory's tile sizes) and globals. The result is an ordinary Python function, ready
    for ``cuda.jit``; the simulator runs it the same way.
    """
    import ast
    import inspect
    import linecache
    import textwrap

    env = dict(fn.__globals__)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
        env[name] = cell.cell_contents
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    func = tree.body[0]
    func.decorator_list = []
    func.body = _Unroller(env).visit_body(func.body)
    source = ast.unparse(func)
    # compiled from its own text, registered with linecache: tracebacks and the tracer's
    # array names (`convlab.trace`) read the lines of the unrolled kernel
    _UNROLLED[0] += 1
    filename = f"<unrolled {fn.__name__} #{_UNROLLED[0]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), env)  # noqa: S102  (our own kernel, rewritten)
    new = env[fn.__name__]
    new.unrolled_source = source
    return new
