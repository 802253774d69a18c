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

import numpy as np
from numba import cuda, float32

from ..runtime import is_simulator
from ._launch import Unsupported, ceil_div

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


# Argument types of the implicit-GEMM kernels, for compiling to PTX:
# (x, wt, y flat, N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw, dh, dw); wt is the flat
# (R*S*Cp, K) filter matrix of `rsck_weights`.
IGEMM_SIGNATURE = "(float32[::1], float32[::1], float32[::1], " + ", ".join(["int64"] * 15) + ")"


def conv_grid(p, BM: int, BN: int) -> tuple[int, int]:
    """Blocks along the outputs N*P*Q (x) and the filters K (y)."""
    gy = ceil_div(p.K, BM)
    if gy > 65535:
        raise Unsupported(f"K={p.K} filters need {gy} block rows of {BM}; CUDA allows 65535")
    return ceil_div(p.N * p.P * p.Q, BN), gy


def conv_scalar_args(p) -> tuple:
    """The 15 integer arguments of the implicit-GEMM kernels, in IGEMM_SIGNATURE order."""
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
    return (p.N, p.C, p.H, p.W, p.K, p.R, p.S, p.P, p.Q, sh, sw, ph, pw, dh, dw)


def flat(a):
    """A 1-D view of a C-contiguous device array (no copy)."""
    return a.reshape(int(np.prod(a.shape)))


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
            if (isinstance(it, ast.Call) and isinstance(it.func, ast.Name)
                    and it.func.id == "unroll" and isinstance(node.target, ast.Name)):
                n = eval(compile(ast.Expression(it.args[0]), "<unroll>", "eval"),  # noqa: S307
                         self.env)
                for k in range(int(n)):
                    for stmt in node.body:
                        out.append(_Subst(node.target.id, k).visit(copy.deepcopy(stmt)))
            else:
                out.append(node)
        return out


def unrolled(fn):
    """Return fn with every ``for v in unroll(n):`` loop written out n times.

    The constants of the loop bounds and the body come from fn's closure (a kernel
    factory's tile sizes) and globals. The result is an ordinary Python function, ready
    for ``cuda.jit``; the simulator runs it the same way.
    """
    import ast
    import inspect
    import textwrap

    env = dict(fn.__globals__)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
        env[name] = cell.cell_contents
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    func = tree.body[0]
    func.decorator_list = []
    func.body = _Unroller(env).visit_body(func.body)
    ast.fix_missing_locations(tree)
    code = compile(tree, f"<unrolled {fn.__name__}>", "exec")
    exec(code, env)  # noqa: S102  (our own kernel source, rewritten)
    new = env[fn.__name__]
    new.unrolled_source = ast.unparse(func)
    return new
