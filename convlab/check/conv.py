"""Checkers of array answers: conv2d (NCHW, NHWC, one chosen case), 2-D filters, GEMM,
depthwise conv, im2col and col2im.

Each draws fresh problems (`*_cases`: odd shapes, not tile multiples, the features the
task covers), runs the learner's function on them and compares with a float64 reference
(`core.reference_case`). A function with an ``out`` parameter fills a poisoned output and
runs twice; ``device=True`` passes CUDA device arrays (GPU launchers).
"""

from __future__ import annotations

import numpy as np

from .. import reference as ref
from ..errors import CheckError
from .core import (
    _fail,
    _pass,
    _run_cases,
    call,
    compare,
    random_array,
    reference_case,
)


def _small(small) -> bool:
    """Tiny shapes (the simulator runs every CUDA thread in Python) unless told."""
    if small is None:
        from ..runtime import is_simulator

        return is_simulator()
    return bool(small)


def conv2d_cases(rng, *, stride=True, padding=True, dilation=False, groups=False, small=None):
    """Test problems for a conv2d implementation: odd, non-square, not tile multiples.

    small: tiny shapes for the simulator (default: when the runtime is the simulator).
    """
    small = _small(small)
    if small:
        base = [dict(x=(1, 3, 9, 9), w=(2, 3, 3, 3), stride=1, padding=0),
                dict(x=(2, 3, 11, 14), w=(4, 3, 3, 3), stride=1, padding=1),
                dict(x=(1, 2, 9, 7), w=(3, 2, 3, 3), stride=1, padding=0)]
    else:
        base = [dict(x=(2, 7, 31, 31), w=(5, 7, 3, 3), stride=1, padding=0),
                dict(x=(3, 13, 29, 37), w=(19, 13, 3, 3), stride=1, padding=1),
                dict(x=(2, 5, 41, 23), w=(7, 5, 3, 3), stride=1, padding=0)]
    if stride:
        base.append(dict(x=(1, 3, 13, 10), w=(5, 3, 3, 2), stride=(2, 3),
                         padding=(1, 0) if padding else 0))
    if padding:
        base.append(dict(x=(2, 2, 8, 11), w=(3, 2, 5, 3), stride=1, padding=(2, 1)))
    if dilation:
        base.append(dict(x=(1, 3, 12, 13), w=(2, 3, 3, 3), stride=1,
                         padding=2 if padding else 0, dilation=2))
    if groups:
        base.append(dict(x=(2, 6, 9, 10), w=(9, 2, 3, 3), stride=1, padding=1 if padding else 0,
                         groups=3))
    cases = []
    for b in base:
        kw = {k: b[k] for k in ("stride", "padding", "dilation", "groups") if k in b}
        cases.append(reference_case(random_array(b["x"], rng), random_array(b["w"], rng), **kw))
    return cases


def check_conv2d(fn, *, stride=True, padding=True, dilation=False, groups=False,
                 device=None, seed=None, runs: int = 2, precision="fp32", dtype=None,
                 quiet=False) -> str:
    """Check a conv2d implementation on fresh random problems; raise CheckError if wrong.

    fn(x, w, stride=, padding=[, dilation=, groups=]) returns y (N, K, P, Q), or, when it
    has an ``out`` parameter, fills ``out``. device=True passes CUDA device arrays (for
    GPU launchers; default: ``fn.device``). Flags say which features the task covers.
    dtype: the type the task asks the result in (float32 where it says so), checked.
    """
    rng = np.random.default_rng(seed)
    cases = conv2d_cases(rng, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return _run_cases("conv2d", fn, cases, device, runs, quiet, precision, dtype)


def check_conv2d_case(fn, x_shape, w_shape, *, stride=1, padding=0, dilation=1, groups=1,
                      device=None, seed=None, runs: int = 2, precision="fp32",
                      name: str = "conv2d", quiet=False) -> str:
    """Check a conv2d implementation on one problem of the caller's choosing.

    Same checks as `check_conv2d` (fresh random non-uniform data, a poisoned output, NaN
    and Inf fail, run `runs` times for races, traced for shared-memory races under the
    simulator), on x of `x_shape` and w of `w_shape`. For lessons that run a kernel on one
    small shape; graded tasks use `check_conv2d`, whose shapes the checker picks. name:
    what the reports call fn (say which parts of the learner's code it runs).
    """
    rng = np.random.default_rng(seed)
    kw = dict(stride=stride, padding=padding)
    if ref.pair(dilation) != (1, 1):
        kw["dilation"] = dilation
    if groups != 1:
        kw["groups"] = groups
    case = reference_case(random_array(tuple(x_shape), rng), random_array(tuple(w_shape), rng),
                          **kw)
    return _run_cases(name, fn, [case], device, runs, quiet, precision)


def nhwc_case(case: dict) -> dict:
    """An NCHW conv case in the layouts an NHWC launcher takes: x (N, H, W, C), w (R, S, C,
    K) ("HWIO"), out (N, P, Q, K); its label and reports name those shapes and indices."""
    x, w = case["inputs"]
    out = dict(case, layout="nhwc")
    out["inputs"] = [np.ascontiguousarray(x.transpose(0, 2, 3, 1)),
                     np.ascontiguousarray(w.transpose(2, 3, 1, 0))]
    for k in ("expected", "absref"):
        out[k] = np.ascontiguousarray(case[k].transpose(0, 2, 3, 1))
    kw = " ".join(f"{k}={v}" for k, v in case["kwargs"].items())
    out["label"] = (f"x{out['inputs'][0].shape} (N, H, W, C), w{out['inputs'][1].shape} "
                    f"(R, S, C, K), out{out['expected'].shape} (N, P, Q, K) {kw}").strip()
    return out


def check_conv2d_nhwc(fn, *, stride=True, padding=True, seed=None, runs: int = 2,
                      quiet=False) -> str:
    """Check an NHWC conv2d GPU launcher on the conv2d cases, in its own layouts:
    fn(x (N, H, W, C), w (R, S, C, K), out (N, P, Q, K), stride=, padding=) fills out
    (device arrays; w in "HWIO" order, TensorFlow's filter layout). Reports name NHWC
    shapes and (n, p, q, k) indices."""
    rng = np.random.default_rng(seed)
    cases = [nhwc_case(c) for c in conv2d_cases(rng, stride=stride, padding=padding)]
    return _run_cases("conv2d (NHWC)", fn, cases, True, runs, quiet, "fp32")


def filter2d_cases(rng, *, small=None, kernels=None):
    """Single-image, single-filter problems ('same' zero padding), odd sizes."""
    small = _small(small)
    sizes = [(13, 21), (9, 6)] if small else [(123, 77), (64, 301)]
    kernels = kernels or [(3, 3), (5, 3)]
    cases = []
    for (H, W), (R, S) in zip(sizes, kernels, strict=False):
        cases.append(_filter_case(random_array((H, W), rng), random_array((R, S), rng)))
    return cases


def _filter_case(img, k) -> dict:
    (H, W), (R, S) = img.shape, k.shape
    return reference_case(img, k, op=ref.filter2d, reduction=R * S,
                          label=f"image {H}x{W}, filter {R}x{S}, pad {(R // 2, S // 2)}")


def check_filter2d(fn, *, device=None, seed=None, runs=2, dtype=None, quiet=False) -> str:
    """Check a single-channel 2-D filter: fn(image (H, W), kernel (R, S)) -> (H, W).

    Zero padding keeps the size ('same'); kernels are odd-sized and non-square. dtype: the
    type the task asks the result in, checked.
    """
    rng = np.random.default_rng(seed)
    return _run_cases("filter2d", fn, filter2d_cases(rng), device, runs, quiet, "fp32", dtype)


def check_filter2d_large(fn, *, seed=None, quiet=False) -> str:
    """Check fn(image (H, W), kernel (R, S)) -> (H, W) ('same' zero padding) with large,
    odd, non-square kernels (up to 15 wide): the filters FFT convolution is for."""
    rng = np.random.default_rng(seed)
    cases = filter2d_cases(rng, small=False, kernels=[(9, 5), (15, 7)])
    cases.append(_filter_case(random_array((41, 58), rng), random_array((3, 11), rng)))
    return _run_cases("filter2d (large filters)", fn, cases, False, 1, quiet, "fp32")


def gemm_cases(rng, *, small=None):
    small = _small(small)
    # the third: N well past what a grid sized by K (or M) covers, K past what M covers
    shapes = ([(17, 23, 9), (5, 40, 33), (9, 70, 5)] if small else
              [(131, 77, 201), (64, 257, 100), (33, 300, 7)])
    cases = []
    for M, N, K in shapes:
        cases.append(reference_case(random_array((M, K), rng), random_array((K, N), rng),
                                    op=np.matmul, reduction=K, label=f"A {M}x{K} @ B {K}x{N}"))
    return cases


def check_gemm(fn, *, device=None, seed=None, runs=2, precision="fp32", quiet=False) -> str:
    """Check a matrix product: fn(A (M, K), B (K, N)) -> C (M, N), odd M, N, K."""
    rng = np.random.default_rng(seed)
    return _run_cases("gemm", fn, gemm_cases(rng), device, runs, quiet, precision)


def depthwise_cases(rng, *, multiplier: int = 1, stride=True, small=None):
    """Depthwise problems: w (C·multiplier, 1, R, S), groups = C; odd shapes, padding."""
    small = _small(small)
    if small:
        specs = [((1, 3, 7, 9), (3, 3), 1, 1), ((2, 2, 6, 5), (3, 3), 1, 0),
                 ((1, 2, 5, 8), (3, 5), 1, (1, 2))]
        if stride:
            specs.append(((1, 2, 9, 7), (3, 3), 2, 1))
    else:
        specs = [((2, 7, 31, 29), (3, 3), 1, 1), ((3, 5, 20, 17), (3, 3), 1, 0),
                 ((1, 6, 19, 23), (3, 5), 1, (1, 2))]
        if stride:
            specs.append(((2, 5, 27, 24), (3, 3), 2, 1))
    cases = []
    for xs, (R, S), st, pad in specs:
        C = xs[1]
        w_shape = (C * multiplier, 1, R, S)
        cases.append(reference_case(
            random_array(xs, rng), random_array(w_shape, rng), stride=st, padding=pad,
            reference_kwargs=dict(groups=C),
            label=f"x{xs} w{w_shape} groups={C} stride={st} padding={pad}"))
    return cases


def check_depthwise(fn, *, multiplier: int = 1, stride=True, device=None, seed=None,
                    runs: int = 2, quiet=False) -> str:
    """Check a depthwise conv: fn(x (N, C, H, W), w (C·multiplier, 1, R, S), [out], stride=,
    padding=) -> y (N, C·multiplier, P, Q); output channel k reads input channel
    k // multiplier (PyTorch's conv2d with groups = C)."""
    rng = np.random.default_rng(seed)
    cases = depthwise_cases(rng, multiplier=multiplier, stride=stride)
    return _run_cases("depthwise", fn, cases, device, runs, quiet, "fp32")


def _im2col_cases(rng):
    specs = [((1, 2, 5, 6), (3, 3), dict(stride=1, padding=0, dilation=1)),
             ((2, 3, 7, 5), (3, 2), dict(stride=1, padding=1, dilation=1)),
             ((2, 2, 9, 8), (2, 3), dict(stride=(2, 1), padding=(1, 0), dilation=1)),
             ((1, 3, 11, 10), (3, 3), dict(stride=1, padding=2, dilation=2)),
             ((3, 1, 8, 13), (1, 4), dict(stride=(1, 3), padding=(0, 2), dilation=(1, 2)))]
    return [(random_array(xs, rng), hw, kw) for xs, hw, kw in specs]


def _bind(fn, *front):
    """fn with `front` inserted after the first argument (keeps fn's name for reports)."""
    import functools

    @functools.wraps(fn)
    def bound(first, **kw):
        return fn(first, *front, **kw)

    return bound


def _label(shape, hw, kw) -> str:
    return f"x{tuple(shape)}, filter {hw}, " + ", ".join(f"{k}={v}" for k, v in kw.items())


def check_im2col(fn, *, device=None, seed=None, quiet=False) -> str:
    """fn(x (N, C, H, W), kernel_hw, stride=, padding=, dilation=) -> cols.

    cols has shape (C·R·S, N·P·Q): row (c, r, s), column (n, p, q), zeros for padding,
    the layout of `convlab.reference.im2col`. device=True passes x as a CUDA device array
    (default: ``fn.device``).
    """
    task = "im2col"
    if device is None:
        device = bool(getattr(fn, "device", False))
    cases = _im2col_cases(np.random.default_rng(seed))
    for x, hw, kw in cases:
        label = _label(x.shape, hw, kw)
        expected = ref.im2col(x.astype(np.float64), hw, **kw)
        try:
            out = call(_bind(fn, hw), [x], expected.shape, kw, device)
        except CheckError:
            raise
        except Exception as e:  # noqa: BLE001
            raise CheckError(f"{task} raised on {label}: {type(e).__name__}: {e}") from e
        comp = compare(out, expected, np.abs(expected), 1)
        if not comp.ok:
            if out.shape == expected.shape[::-1]:
                comp.messages.append("hint: the result is transposed: rows are (c, r, s), "
                                     "columns (n, p, q)")
            _fail(task, label, comp)
    return _pass(task, len(cases), quiet)


def check_col2im(fn, *, seed=None, quiet=False) -> str:
    """fn(cols, x_shape, kernel_hw, stride=, padding=, dilation=) -> x (N, C, H, W).

    The adjoint of im2col: every column entry is added back to the pixel it came from
    (entries that came from the padding are dropped).
    """
    task = "col2im"
    rng = np.random.default_rng(seed)
    cases = _im2col_cases(rng)
    passed = []
    for x, hw, kw in cases:
        label = _label(x.shape, hw, kw)
        cols = random_array(ref.im2col(x, hw, **kw).shape, rng)
        expected = ref.col2im(cols.astype(np.float64), x.shape, hw, **kw)
        absref = ref.col2im(np.abs(cols).astype(np.float64), x.shape, hw, **kw)
        shape = tuple(x.shape)
        try:
            out = call(_bind(fn, shape, hw), [cols], expected.shape, kw, False)
        except CheckError:
            raise
        except Exception as e:  # noqa: BLE001
            raise CheckError(f"{task} raised on {label}: {type(e).__name__}: {e}") from e
        R, S = ref.pair(hw)
        comp = compare(out, expected, absref, R * S)
        if not comp.ok:
            if out.shape == expected.shape:
                bad = ~(np.abs(out - expected) <= comp.rtol * absref)
                # which pixel each column entry came from (0: the padding)
                src = ref.im2col(np.arange(1, x.size + 1, dtype=np.float64).reshape(x.shape),
                                 hw, **kw).round().astype(np.int64)
                one_copy = all(np.isclose(cols[src == p + 1], v, rtol=1e-5, atol=1e-7).any()
                               for p, v in zip(np.flatnonzero(bad)[:50], out[bad][:50],
                                               strict=True))
                if bad.any() and one_copy:
                    comp.messages.append("hint: each wrong pixel holds one of its copies: "
                                         "pixels covered by several windows must receive the "
                                         "SUM of their copies (+=, not =)")
                if ref.pair(kw.get("dilation", 1)) != (1, 1) and passed and all(
                        ref.pair(k.get("dilation", 1)) == (1, 1) for k in passed):
                    comp.messages.append(f"hint: every undilated case passed, this one has "
                                         f"dilation={kw['dilation']}: is the dilation applied "
                                         "to the window's taps?")
            _fail(task, label, comp)
        passed.append(kw)
    return _pass(task, len(cases), quiet)
