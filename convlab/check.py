"""Checkers that learners call and the grader reuses.

What makes them hard to fool (each has fooled a public checker before):

- fresh random, non-uniform data on every call, and odd, non-square shapes that are
  not multiples of any tile, with stride / padding / dilation where the task has them;
- outputs filled with a *marked* NaN before the run, so an element left unwritten is
  told apart from one the code computed as NaN;
- NaN and Inf fail explicitly (``abs(diff) > tol`` is False for NaN);
- the tolerance grows with the reduction length and is measured against
  ``conv(|x|, |w|)``, so it is tight where the answer is small;
- a function that writes ``out`` runs twice on the same inputs: a result that moves
  between runs is a race (missing ``syncthreads``, stale shared memory).

``check_conv2d(fn)`` prints one pass line or raises `CheckError` with a report: the case
that failed, the first bad index, max abs / rel error and (in a notebook) an error map.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from dataclasses import dataclass, field

import numpy as np

from . import reference as ref

# A quiet NaN with a payload no arithmetic produces: "this element was never written".
POISON_BITS = np.uint32(0x7FC0DEAD)
POISON = POISON_BITS.view(np.float32)
EPS = {"fp32": 2.0**-24, "tf32": 2.0**-11, "fp16": 2.0**-11, "bf16": 2.0**-8}


class CheckError(AssertionError):
    """A checker found a wrong answer; ``.report`` holds the details."""

    def __init__(self, report: str, comparison: Comparison | None = None):
        super().__init__(report)
        self.report = report
        self.comparison = comparison


def poisoned(shape, dtype=np.float32) -> np.ndarray:
    """An array of `shape` filled with the 'not written' marker NaN."""
    return np.full(shape, POISON, dtype=dtype)


def random_array(shape, rng: np.random.Generator, dtype=np.float32) -> np.ndarray:
    """Non-uniform test data: a normal with a non-zero mean plus a ramp along every axis.

    No two elements are equal, so swapped or shifted indices change the answer.
    """
    a = rng.standard_normal(shape) + 0.25
    for axis, n in enumerate(shape):
        ramp = np.linspace(-0.5, 0.5, n).reshape([-1 if i == axis else 1
                                                   for i in range(len(shape))])
        a = a + ramp * (axis + 1) / len(shape)
    return a.astype(dtype)


@dataclass
class Comparison:
    """Element-wise comparison of an output with a reference."""

    shape: tuple
    ok: bool
    not_written: int = 0
    nonfinite: int = 0
    bad: int = 0
    first_bad: tuple | None = None
    max_abs: float = 0.0
    max_rel: float = 0.0
    rtol: float = 0.0
    err: np.ndarray | None = field(default=None, repr=False)
    messages: list = field(default_factory=list)

    def summary(self) -> str:
        return "; ".join(self.messages) if self.messages else (
            f"max abs err {self.max_abs:.2e}, max rel err {self.max_rel:.2e} (tol {self.rtol:.1e})")

    def error_map(self) -> np.ndarray:
        """|error| reduced to the last two axes (max over the others); NaN where unwritten."""
        e = self.err
        while e.ndim > 2:
            e = np.nanmax(e, axis=0) if np.isfinite(e).any() else e[0]
        return e

    def show(self, title: str = "error map"):
        """Plot the error map (bright = wrong, white = never written)."""
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(4, 3.2))
        m = ax.imshow(self.error_map(), cmap="magma", interpolation="nearest")
        ax.set_title(f"{title}: |out - ref| (blank = not written)", fontsize=9)
        ax.set_xlabel("column")
        ax.set_ylabel("row")
        fig.colorbar(m, ax=ax)
        return fig


def compare(out, expected, absref=None, reduction: int = 1, precision: str = "fp32",
            rtol: float | None = None) -> Comparison:
    """Compare `out` with `expected` (float64 reference).

    absref: ``conv(|x|, |w|)`` (the sum of absolute products behind each element);
    the tolerance on element i is ``rtol · absref[i]``, with rtol from the precision and
    the reduction length unless given.
    """
    out = np.asarray(out)
    expected = np.asarray(expected, dtype=np.float64)
    if out.shape != expected.shape:
        return Comparison(out.shape, False, messages=[
            f"wrong output shape {out.shape}, expected {expected.shape}"])
    if absref is None:
        absref = np.abs(expected)
    if rtol is None:
        rtol = 2.5 * (0.0 if precision == "fp32" else EPS[precision]) + 8 * EPS["fp32"] * max(
            1.0, np.sqrt(reduction))
    tol = rtol * np.asarray(absref, np.float64) + 1e-30
    c = Comparison(out.shape, True, rtol=rtol)
    o32 = out.astype(np.float32, copy=False)
    unwritten = o32.view(np.uint32) == POISON_BITS if out.dtype == np.float32 else np.zeros(
        out.shape, bool)
    nonfinite = ~np.isfinite(out) & ~unwritten
    diff = np.abs(out.astype(np.float64) - expected)
    bad = ~(diff <= tol) | unwritten | nonfinite  # NaN diff is bad
    c.err = np.where(unwritten, np.nan, diff)
    c.not_written, c.nonfinite, c.bad = int(unwritten.sum()), int(nonfinite.sum()), int(bad.sum())
    finite = np.isfinite(diff)
    if finite.any():
        c.max_abs = float(diff[finite].max())
        c.max_rel = float((diff[finite] / (np.asarray(absref)[finite] + 1e-30)).max())
    if c.bad:
        c.ok = False
        c.first_bad = tuple(int(i) for i in np.argwhere(bad)[0])
        if c.not_written == out.size:
            c.messages.append(f"nothing was written: all {out.size} outputs still hold the "
                              "'not written' marker (not implemented yet?)")
        elif c.not_written:
            first = tuple(int(i) for i in np.argwhere(unwritten)[0])
            c.messages.append(f"{c.not_written} of {out.size} outputs were never written, "
                              f"first at index {first}")
        if c.nonfinite:
            first = tuple(int(i) for i in np.argwhere(nonfinite)[0])
            c.messages.append(f"{c.nonfinite} outputs are NaN or Inf, first at index {first} "
                              f"(value {out[first]})")
        wrong = c.bad - c.not_written - c.nonfinite
        if wrong:
            idx = tuple(int(i) for i in np.argwhere(bad & ~unwritten & ~nonfinite)[0])
            c.messages.append(
                f"{wrong} of {out.size} outputs are wrong, first at index {idx}: got "
                f"{float(out[idx]):.6g}, expected {float(expected[idx]):.6g} (max abs err "
                f"{c.max_abs:.3g}, max rel err {c.max_rel:.3g}, tolerance {rtol:.1e} relative)")
    return c


# ----------------------------------------------------------------------------------------
# Calling the learner's function


def _device():
    from .runtime import cuda

    return cuda()


def _accepts(fn, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


def _writes_out(fn) -> bool:
    try:
        return "out" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _to_host(a):
    if a is None:
        return None
    if hasattr(a, "copy_to_host"):
        return a.copy_to_host()
    if hasattr(a, "get") and not isinstance(a, np.ndarray):
        return a.get()  # CuPy
    if hasattr(a, "detach"):
        return a.detach().cpu().numpy()  # torch
    return np.asarray(a)


# Hooks for the autograder (convlab.grading.sandbox): context managers entered around every
# call of the learner's function, e.g. to make convlab.reference and convlab.kernels refuse to
# run inside an answer and to check afterwards that nothing was tampered with. Empty outside
# grading, so the checkers behave the same in a learner's notebook.
ANSWER_GUARDS: list = []


@contextlib.contextmanager
def learner_call(fn):
    """Run the body as 'the learner's code is running' (enters every ANSWER_GUARDS hook)."""
    with contextlib.ExitStack() as stack:
        for guard in tuple(ANSWER_GUARDS):
            stack.enter_context(guard(fn))
        yield


def call(fn, inputs: list, out_shape, kwargs: dict, device: bool):
    """Run fn once; return its output on the host (or raise CheckError).

    fn either returns the output or, when it has a parameter named ``out``, fills a
    poisoned ``out`` that the checker passes in.
    """
    cuda = _device() if device else None
    args = [cuda.to_device(a) for a in inputs] if device else [a.copy() for a in inputs]
    for k, v in kwargs.items():
        if not _accepts(fn, k):
            raise CheckError(f"{_name(fn)} does not accept the argument {k}={v!r}, "
                             "which this task needs")
    if _writes_out(fn):
        out = cuda.to_device(poisoned(out_shape)) if device else poisoned(out_shape)
        with learner_call(fn):
            fn(*args, out=out, **kwargs)
            if device:
                cuda.synchronize()
        return _to_host(out)
    with learner_call(fn):
        result = fn(*args, **kwargs)
        if device:
            cuda.synchronize()
        # the learner's object may run code when converted: convert inside the guard
        result = None if result is None else np.asarray(_to_host(result))
    if result is None:
        raise CheckError(f"{_name(fn)} returned None: not implemented yet? (it must return "
                         "the output array, or take an `out` argument and fill it)")
    return result


def _name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _in_notebook() -> bool:
    return "ipykernel" in sys.modules


def _fail(task: str, case: str, comp: Comparison):
    text = f"{task} FAILED on {case}\n  " + "\n  ".join(comp.messages or [comp.summary()])
    if _in_notebook() and comp.err is not None and comp.err.size:
        try:
            import matplotlib.pyplot as plt

            comp.show(task)
            plt.show()
        except Exception:  # noqa: BLE001  (the picture is a bonus, the report is the point)
            pass
    raise CheckError(text, comp)


def _border_mask(case) -> np.ndarray | None:
    """Outputs whose receptive field touches the padding or the image's outermost pixels."""
    kw = case["kwargs"]
    x, w = case["inputs"][:2]
    if x.ndim != 4:
        return None
    kw = {"groups": x.shape[1] // w.shape[1], **kw}  # depthwise cases leave groups implied
    p = ref.conv_params(x.shape, w.shape, **kw)
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
    rows = np.arange(p.P) * sh - ph
    cols = np.arange(p.Q) * sw - pw
    rb = (rows <= 0) | (rows + dh * (p.R - 1) >= p.H - 1)
    cb = (cols <= 0) | (cols + dw * (p.S - 1) >= p.W - 1)
    return rb[:, None] | cb[None, :]


def _hints(case, out, comp: Comparison, passed: list) -> list:
    """Name the likely mistake from which cases passed and where the errors are."""
    hints = []
    kw, x = case["kwargs"], case["inputs"][0]
    shapes = [c["inputs"][0].shape for c in passed]
    if x.ndim == 4 and x.shape[2] != x.shape[3] and shapes and all(
            s[-1] == s[-2] for s in shapes):
        hints.append("it passed a square input and failed a non-square one: are H and W "
                     "(or P and Q, rows and columns) mixed up somewhere?")
    if ref.pair(kw.get("stride", 1)) != (1, 1) and passed and all(
            ref.pair(c["kwargs"].get("stride", 1)) == (1, 1) for c in passed):
        hints.append(f"every stride-1 case passed, this one has stride={kw['stride']}: is the "
                     "stride applied (to both rows and columns)?")
    if ref.pair(kw.get("dilation", 1)) != (1, 1) and passed and all(
            ref.pair(c["kwargs"].get("dilation", 1)) == (1, 1) for c in passed):
        hints.append(f"every undilated case passed, this one has dilation={kw['dilation']}: is "
                     "the dilation applied to the filter offsets?")
    band = _border_mask(case)
    if band is not None and comp.bad and band.any() and not band.all():
        bad = ~(np.abs(out.astype(np.float64) - case["expected"]) <= comp.rtol * case["absref"])
        bad2d = bad.reshape(-1, *bad.shape[-2:]).any(axis=0)
        if not (bad2d & ~band).any():
            hints.append("all errors are where the filter window overlaps the image border: "
                         "check the padding offset and the bounds tests (off by one?)")
    if x.ndim == 4 and comp.bad:
        wf = case["inputs"][1]
        flipped = ref.conv2d(x.astype(np.float64), wf[:, :, ::-1, ::-1].astype(np.float64),
                             **{"groups": x.shape[1] // wf.shape[1], **kw})
        if compare(out, flipped, case["absref"], case["reduction"]).ok:
            hints.append("the output equals a true convolution (flipped filter): deep-learning "
                         "'convolution' is cross-correlation, do not flip the filter")
    return hints


def _run_cases(task: str, fn, cases, device, runs: int, quiet: bool, precision: str):
    if device is None:
        device = bool(getattr(fn, "device", False))
    if _writes_out(fn) is False and runs > 1:
        runs = 1  # a pure function cannot race with itself; one run is enough
    _race_check(task, fn, cases, device)  # a race explains any wrong answer: report it first
    worst, passed = 0.0, []
    for case in cases:
        first = None
        for _ in range(runs):
            try:
                out = call(fn, case["inputs"], case["expected"].shape, case["kwargs"], device)
            except CheckError:
                raise
            except Exception as e:  # noqa: BLE001  (report the learner's exception as a failure)
                raise CheckError(
                    f"{task} raised on {case['label']}: {type(e).__name__}: {e}") from e
            comp = compare(out, case["expected"], case["absref"], case["reduction"], precision)
            if not comp.ok:
                comp.messages += [f"hint: {h}" for h in _hints(case, out, comp, passed)]
                _fail(task, case["label"], comp)
            if first is None:
                first = out
            elif not np.array_equal(first, out, equal_nan=True):
                d = np.argwhere(first != out)[0]
                raise CheckError(
                    f"{task} FAILED on {case['label']}\n  results differ between two runs on the "
                    f"same inputs (first at index {tuple(int(i) for i in d)}): a race, such as a "
                    "missing cuda.syncthreads() or a read of shared memory nobody wrote yet")
            worst = max(worst, comp.max_rel)
        passed.append(case)
    line = f"✓ {task}: {len(cases)} cases passed (max rel err {worst:.1e})"
    if not quiet:
        print(line)
    return line


def _race_check(task: str, fn, cases, device) -> None:
    """Under the simulator, trace a GPU launcher on the smallest case (convlab.trace):
    two threads touching one shared address between the same barriers is a race even
    when the simulator happened to give the right answer."""
    from .runtime import is_simulator

    if not device or not cases or not is_simulator():
        return
    from . import trace

    case = min(cases, key=lambda c: sum(np.size(a) for a in c["inputs"]))
    cuda = _device()
    args = [cuda.to_device(a) for a in case["inputs"]]
    try:
        with learner_call(fn):
            if _writes_out(fn):
                out = cuda.to_device(poisoned(case["expected"].shape))
                t = trace.trace_launch(fn, *args, out=out, **case["kwargs"])
            else:
                t = trace.trace_launch(fn, *args, **case["kwargs"])
        races = t.races()
    except Exception:  # noqa: BLE001  (the tracer cannot model this code: the checks above stand)
        return
    if races:
        more = f"\n  ({len(races)} different hazards in all)" if len(races) > 1 else ""
        raise CheckError(
            f"{task} FAILED on {case['label']}\n  {races[0]}{more}\n  hint: missing "
            "cuda.syncthreads()? Every thread must finish writing a shared tile before others "
            "read it, and finish reading it before anyone overwrites it")


# ----------------------------------------------------------------------------------------
# Cases


def conv2d_cases(rng, *, stride=True, padding=True, dilation=False, groups=False, small=None):
    """Test problems for a conv2d implementation: odd, non-square, not tile multiples.

    small: tiny shapes for the simulator (default: when the runtime is the simulator).
    """
    if small is None:
        from .runtime import is_simulator

        small = is_simulator()
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
        x, w = random_array(b["x"], rng), random_array(b["w"], rng)
        p = ref.conv_params(x.shape, w.shape, **kw)
        expected = ref.conv2d(x.astype(np.float64), w.astype(np.float64), **kw)
        absref = ref.conv2d(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), **kw)
        label = (f"x{b['x']} w{b['w']} " + " ".join(f"{k}={v}" for k, v in kw.items())).strip()
        cases.append(dict(inputs=[x, w], kwargs=kw, expected=expected, absref=absref,
                          reduction=p.reduction, label=label))
    return cases


def check_conv2d(fn, *, stride=True, padding=True, dilation=False, groups=False,
                 device=None, seed=None, runs: int = 2, precision="fp32", quiet=False) -> str:
    """Check a conv2d implementation on fresh random problems; raise CheckError if wrong.

    fn(x, w, stride=, padding=[, dilation=, groups=]) returns y (N, K, P, Q), or, when it
    has an ``out`` parameter, fills ``out``. device=True passes CUDA device arrays (for
    GPU launchers; default: ``fn.device``). Flags say which features the task covers.
    """
    rng = np.random.default_rng(seed)
    cases = conv2d_cases(rng, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return _run_cases("conv2d", fn, cases, device, runs, quiet, precision)


def nhwc_adapter(fn):
    """An NHWC GPU conv launcher seen as an NCHW one, for the conv2d checker.

    fn(x (N, H, W, C), w (R, S, C, K), out (N, P, Q, K), stride=, padding=) fills out
    (device arrays; w in "HWIO" order, TensorFlow's filter layout). The adapter transposes
    the checker's NCHW inputs on the host, runs fn on a poisoned NHWC output, and hands
    the result back as NCHW (so reports name NCHW indices (n, k, p, q)).
    """
    def conv2d_nhwc_as_nchw(x, w, out, **kwargs):
        c = _device()
        xh = np.ascontiguousarray(_to_host(x).transpose(0, 2, 3, 1))
        wh = np.ascontiguousarray(_to_host(w).transpose(2, 3, 1, 0))
        N, K, P, Q = out.shape
        oh = c.to_device(poisoned((N, P, Q, K)))
        fn(c.to_device(xh), c.to_device(wh), oh, **kwargs)
        c.synchronize()
        out.copy_to_device(np.ascontiguousarray(_to_host(oh).transpose(0, 3, 1, 2)))

    conv2d_nhwc_as_nchw.device = True
    conv2d_nhwc_as_nchw.__name__ = _name(fn)
    conv2d_nhwc_as_nchw.__wrapped_nhwc__ = fn
    return conv2d_nhwc_as_nchw


def check_conv2d_nhwc(fn, *, stride=True, padding=True, seed=None, runs: int = 2,
                      quiet=False) -> str:
    """Check an NHWC conv2d GPU launcher (see `nhwc_adapter`) on the conv2d cases."""
    return check_conv2d(nhwc_adapter(fn), stride=stride, padding=padding, device=True,
                        seed=seed, runs=runs, quiet=quiet)


def check_coalesced(fn, *args, max_sectors: float = 4.5, kinds=("load", "store"),
                    quiet=False, **kwargs) -> str:
    """Trace one launch of the GPU launcher ``fn(*args, **kwargs)`` (device arrays) with
    `convlab.trace` and fail if, for a kind of global access, the warp requests average
    more than `max_sectors` 32-byte sectors (32 consecutive floats take 4; a broadcast 1).

    Works under the simulator and on a GPU (the tracer runs the kernel on the CPU).
    """
    from . import trace

    name = _name(fn)
    try:
        with learner_call(fn):
            t = trace.trace_launch(fn, *args, **kwargs)
    except trace.TraceError as e:
        raise CheckError(f"coalescing FAILED: {e} (not implemented yet?)") from None
    stats = list(t.global_stats())
    found = []
    for kind in kinds:
        rows = [r for r in stats if r["kind"] == kind]
        if not rows:
            raise CheckError(f"coalescing FAILED: {name} makes no global {kind}s "
                             "(not implemented yet?)")
        spr = t.sectors_per_request(kind)
        found.append(f"{kind}s {spr:.1f}")
        if not spr <= max_sectors:
            worst = max(rows, key=lambda r: r["sectors_per_req"])
            raise CheckError(
                f"coalescing FAILED: {name}'s global {kind}s take {spr:.1f} sectors per warp "
                f"request on average (at most {max_sectors} allowed; 32 neighbouring floats "
                f"take 4); worst: {worst['site']} with {worst['sectors_per_req']:.1f}\n  hint: "
                "give neighbouring threads (threadIdx.x) neighbouring addresses in memory")
    line = f"✓ coalescing: {name}: sectors per warp request: " + ", ".join(found)
    if not quiet:
        print(line)
    return line


def filter2d_cases(rng, *, small=None, kernels=None):
    """Single-image, single-filter problems ('same' zero padding), odd sizes."""
    if small is None:
        from .runtime import is_simulator

        small = is_simulator()
    sizes = [(13, 21), (9, 6)] if small else [(123, 77), (64, 301)]
    kernels = kernels or [(3, 3), (5, 3)]
    cases = []
    for (H, W), (R, S) in zip(sizes, kernels, strict=False):
        img, k = random_array((H, W), rng), random_array((R, S), rng)
        pad = (R // 2, S // 2)
        expected = ref.filter2d(img.astype(np.float64), k.astype(np.float64))
        absref = ref.filter2d(np.abs(img).astype(np.float64), np.abs(k).astype(np.float64))
        cases.append(dict(inputs=[img, k], kwargs={}, expected=expected, absref=absref,
                          reduction=R * S, label=f"image {H}x{W}, filter {R}x{S}, pad {pad}"))
    return cases


def check_filter2d(fn, *, device=None, seed=None, runs=2, quiet=False) -> str:
    """Check a single-channel 2-D filter: fn(image (H, W), kernel (R, S)) -> (H, W).

    Zero padding keeps the size ('same'); kernels are odd-sized and non-square.
    """
    rng = np.random.default_rng(seed)
    return _run_cases("filter2d", fn, filter2d_cases(rng), device, runs, quiet, "fp32")


def gemm_cases(rng, *, small=None):
    if small is None:
        from .runtime import is_simulator

        small = is_simulator()
    shapes = [(17, 23, 9), (5, 40, 33)] if small else [(131, 77, 201), (64, 257, 100)]
    cases = []
    for M, N, K in shapes:
        a, b = random_array((M, K), rng), random_array((K, N), rng)
        expected = a.astype(np.float64) @ b.astype(np.float64)
        absref = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
        cases.append(dict(inputs=[a, b], kwargs={}, expected=expected, absref=absref,
                          reduction=K, label=f"A {M}x{K} @ B {K}x{N}"))
    return cases


def check_gemm(fn, *, device=None, seed=None, runs=2, precision="fp32", quiet=False) -> str:
    """Check a matrix product: fn(A (M, K), B (K, N)) -> C (M, N), odd M, N, K."""
    rng = np.random.default_rng(seed)
    return _run_cases("gemm", fn, gemm_cases(rng), device, runs, quiet, precision)


# ----------------------------------------------------------------------------------------
# Lessons 00-03: roofline arithmetic, im2col / col2im, splitting work


def _value_call(task: str, fn, args: tuple, kwargs: dict, label: str):
    """Call the learner's fn on plain values (under the grader's guards); report a raise."""
    try:
        with learner_call(fn):
            return fn(*args, **kwargs)
    except CheckError:
        raise
    except Exception as e:  # noqa: BLE001  (the learner's exception is the failure)
        raise CheckError(f"{task} raised on {label}: {type(e).__name__}: {e}") from e


def _as_float(task: str, value, label: str) -> float:
    if value is None:
        raise CheckError(f"{task} returned None on {label}: not implemented yet?")
    try:
        v = float(np.asarray(value, dtype=np.float64).reshape(()))
    except (TypeError, ValueError) as e:
        raise CheckError(f"{task} must return one number, got {value!r} on {label}") from e
    if not np.isfinite(v):
        raise CheckError(f"{task} returned {v} on {label}")
    return v


def _close(got: float, want: float, rtol: float = 1e-6) -> bool:
    return abs(got - want) <= rtol * max(abs(want), 1e-300)


def _pass(task: str, n: int, quiet: bool, what: str = "cases") -> str:
    line = f"✓ {task}: {n} {what} passed"
    if not quiet:
        print(line)
    return line


def check_roofline(fn, *, seed=None, quiet=False) -> str:
    """fn(intensity FLOP/byte, peak GFLOP/s, bandwidth GB/s) -> attainable GFLOP/s.

    Cases on both sides of the ridge point, on the ridge, and at zero intensity.
    """
    rng = np.random.default_rng(seed)
    task, cases = "roofline", []
    for _ in range(3):
        peak, bw = float(rng.uniform(50, 60000)), float(rng.uniform(10, 5000))
        ridge = peak / bw
        cases += [(ridge * rng.uniform(0.02, 0.9), peak, bw), (ridge * rng.uniform(1.1, 50), peak,
                  bw), (ridge, peak, bw)]
    cases.append((0.0, 100.0, 10.0))
    for ai, peak, bw in cases:
        label = f"intensity {ai:.4g} FLOP/B, peak {peak:.4g} GFLOP/s, bandwidth {bw:.4g} GB/s"
        got = _as_float(task, _value_call(task, fn, (ai, peak, bw), {}, label), label)
        want = min(peak, ai * bw)
        if not _close(got, want):
            hint = ""
            if _close(got, ai * bw):
                hint = " (that is intensity × bandwidth: no ceiling can exceed the peak)"
            elif _close(got, peak):
                hint = " (that is the peak: below the ridge, memory bandwidth limits)"
            raise CheckError(f"{task} FAILED on {label}: got {got:.6g}, expected {want:.6g}"
                             f"{hint}")
    return _pass(task, len(cases), quiet)


def check_gemm_intensity(fn, *, seed=None, quiet=False) -> str:
    """fn(M, N, K, itemsize=4) -> FLOP per byte of C = A @ B (A M×K, B K×N).

    FLOPs 2·M·N·K over the compulsory bytes: read A and B once, write C once.
    """
    rng = np.random.default_rng(seed)
    task = "gemm intensity"
    shapes = [(int(a), int(b), int(c)) for a, b, c in rng.integers(1, 3000, size=(4, 3))]
    shapes += [(1, 4096, 4096), (4096, 1, 1), (7, 7, 7)]
    n = 0
    for M, N, K in shapes:
        for itemsize in (4, 2):
            label = f"M={M}, N={N}, K={K}, itemsize={itemsize}"
            kw = {} if itemsize == 4 else {"itemsize": itemsize}
            got = _as_float(task, _value_call(task, fn, (M, N, K), kw, label), label)
            want = 2 * M * N * K / ((M * K + K * N + M * N) * itemsize)
            if not _close(got, want):
                raise CheckError(f"{task} FAILED on {label}: got {got:.6g}, expected {want:.6g} "
                                 "(2·M·N·K FLOPs over (M·K + K·N + M·N)·itemsize bytes)")
            n += 1
    return _pass(task, n, quiet)


def check_crossover(fn, *, seed=None, quiet=False) -> str:
    """fn(batches, cpu_ms, gpu_ms) -> the smallest batch from which the GPU is faster
    at that batch and at every larger batch measured; None when it is not faster at the
    largest. batches ascend; cpu_ms / gpu_ms are times per call (lists of floats).
    """
    rng = np.random.default_rng(seed)
    task = "crossover"
    b = [1, 2, 4, 8, 16, 32, 64, 128]
    cases = []
    for cross in (3, 0, None):  # crosses at b[3]; GPU always faster; never faster
        cpu = [float(x) * rng.uniform(0.9, 1.1) for x in b]
        gpu = []
        for i in range(len(b)):
            faster = cross is not None and i >= cross
            gpu.append(cpu[i] * (rng.uniform(0.2, 0.8) if faster else rng.uniform(1.2, 5)))
        cases.append((b, cpu, gpu, None if cross is None else b[cross]))
    # a noisy dip: faster once at batch 2, slower again, then faster from 32 on
    cpu = [float(x) for x in b]
    gpu = [c * f for c, f in zip(cpu, [2, 0.9, 1.5, 1.3, 1.1, 0.7, 0.5, 0.3], strict=True)]
    cases.append((b, cpu, gpu, 32))
    # odd batch sizes, numpy arrays
    b2 = np.array([3, 5, 9, 17, 33])
    cases.append((b2, np.array([3.0, 5, 9, 17, 33]), np.array([20.0, 20, 20, 20, 20]), 33))
    for batches, cpu_ms, gpu_ms, want in cases:
        label = f"batches {list(map(int, batches))}, cpu {np.round(cpu_ms, 2).tolist()}, gpu " \
                f"{np.round(gpu_ms, 2).tolist()}"
        got = _value_call(task, fn, (batches, cpu_ms, gpu_ms), {}, label)
        if want is None:
            if got is not None:
                raise CheckError(f"{task} FAILED on {label}: got {got!r}, expected None (the "
                                 "GPU is not faster at the largest batch)")
            continue
        if got is None or _as_float(task, got, label) != want:
            raise CheckError(f"{task} FAILED on {label}: got {got!r}, expected {want} (the "
                             "first batch from which the GPU stays faster)")
    return _pass(task, len(cases), quiet)


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


def check_im2col(fn, *, seed=None, quiet=False) -> str:
    """fn(x (N, C, H, W), kernel_hw, stride=, padding=, dilation=) -> cols.

    cols has shape (C·R·S, N·P·Q): row (c, r, s), column (n, p, q), zeros for padding,
    the layout of `convlab.reference.im2col`.
    """
    task = "im2col"
    cases = _im2col_cases(np.random.default_rng(seed))
    for x, hw, kw in cases:
        label = _label(x.shape, hw, kw)
        expected = ref.im2col(x.astype(np.float64), hw, **kw)
        try:
            out = call(_bind(fn, hw), [x], expected.shape, kw, False)
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
            once = ref.col2im(np.ones_like(cols), x.shape, hw, **kw)
            bad = ~(np.abs(out - expected) <= comp.rtol * absref)
            if out.shape == expected.shape and bad.any() and (once[bad] > 1).all():
                comp.messages.append("hint: pixels covered by several windows must receive "
                                     "the SUM of their copies (+=, not =)")
            _fail(task, label, comp)
    return _pass(task, len(cases), quiet)


def _ranges(parts) -> list:
    out = []
    for p in parts:
        if isinstance(p, slice):
            if p.step not in (None, 1):
                raise ValueError(f"slice {p} has a step; parts must be contiguous")
            out.append((p.start or 0, p.stop))
        elif isinstance(p, range):
            if p.step != 1:
                raise ValueError(f"range {p} has a step; parts must be contiguous")
            out.append((p.start, p.stop))
        else:
            a, b = p
            out.append((int(a), int(b)))
    return out


def check_partition(fn, *, seed=None, quiet=False) -> str:
    """fn(n_items, n_workers) -> parts: (start, stop) pairs, slices or ranges.

    Every item in exactly one part, in order, no part empty, min(n_items, n_workers)
    parts whose sizes differ by at most one (no worker idles while another has 2 more).
    """
    rng = np.random.default_rng(seed)
    task = "partition"
    cases = [(8, 4), (10, 4), (3, 4), (1, 1), (97, 8), (64, 3)]
    cases += [(int(rng.integers(1, 500)), int(rng.integers(1, 17))) for _ in range(4)]
    for n, workers in cases:
        label = f"{n} items over {workers} workers"
        parts = _value_call(task, fn, (n, workers), {}, label)
        if parts is None:
            raise CheckError(f"{task} returned None on {label}: not implemented yet?")
        try:
            spans = _ranges(list(parts))
        except (TypeError, ValueError) as e:
            raise CheckError(f"{task} on {label}: parts must be (start, stop) pairs, slices or "
                             f"ranges, got {parts!r} ({e})") from e
        seen = np.zeros(n, int)
        for a, b in spans:
            if not (0 <= a <= b <= n):
                raise CheckError(f"{task} FAILED on {label}: part ({a}, {b}) is outside "
                                 f"0..{n}")
            seen[a:b] += 1
        if (seen > 1).any():
            raise CheckError(f"{task} FAILED on {label}: item {int(np.argmax(seen > 1))} is in "
                             f"{int(seen.max())} parts: that work would be done more than once")
        if (seen == 0).any():
            raise CheckError(f"{task} FAILED on {label}: item {int(np.argmax(seen == 0))} is in "
                             "no part: that work would never be done")
        sizes = [b - a for a, b in spans]
        if len(spans) != min(n, workers) or min(sizes) == 0:
            raise CheckError(f"{task} FAILED on {label}: {len(spans)} parts of sizes {sizes}, "
                             f"expected {min(n, workers)} non-empty parts")
        if [a for a, _ in spans] != sorted(a for a, _ in spans):
            raise CheckError(f"{task} FAILED on {label}: parts are not in order: {spans}")
        if max(sizes) - min(sizes) > 1:
            raise CheckError(f"{task} FAILED on {label}: sizes {sizes} differ by more than one: "
                             "the biggest part decides when all workers are done")
    return _pass(task, len(cases), quiet)


# ----------------------------------------------------------------------------------------
# Lessons 07-09: one problem of the lesson's choosing; traffic and bank conflicts, traced


def check_conv2d_case(fn, x_shape, w_shape, *, stride=1, padding=0, dilation=1, groups=1,
                      device=None, seed=None, runs: int = 2, precision="fp32",
                      quiet=False) -> str:
    """Check a conv2d implementation on one problem of the caller's choosing.

    Same checks as `check_conv2d` (fresh random non-uniform data, a poisoned output, NaN
    and Inf fail, run `runs` times for races, traced for shared-memory races under the
    simulator), on x of `x_shape` and w of `w_shape`. For lessons that run a kernel on one
    small shape; graded tasks use `check_conv2d`, whose shapes the checker picks.
    """
    rng = np.random.default_rng(seed)
    kw = dict(stride=stride, padding=padding)
    if ref.pair(dilation) != (1, 1):
        kw["dilation"] = dilation
    if groups != 1:
        kw["groups"] = groups
    x, w = random_array(tuple(x_shape), rng), random_array(tuple(w_shape), rng)
    p = ref.conv_params(x.shape, w.shape, **kw)
    case = dict(inputs=[x, w], kwargs=kw, reduction=p.reduction,
                expected=ref.conv2d(x.astype(np.float64), w.astype(np.float64), **kw),
                absref=ref.conv2d(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64),
                                  **kw),
                label=f"x{tuple(x_shape)} w{tuple(w_shape)} "
                      + " ".join(f"{k}={v}" for k, v in kw.items()))
    return _run_cases("conv2d", fn, [case], device, runs, quiet, precision)


def _trace_answer(what: str, fn, args, kwargs):
    from . import trace

    try:
        with learner_call(fn):
            return trace.trace_launch(fn, *args, **kwargs)
    except trace.TraceError as e:
        raise CheckError(f"{what} FAILED: {e} (not implemented yet?)") from None


def traffic(t) -> dict:
    """From a `convlab.trace` Trace: loads (one per thread per element) of each global and of
    each shared array, and the distinct elements stored into each global array."""
    stats = list(t.global_stats())
    glob = sorted({r["array"] for r in stats if r["kind"] == "load"})
    stored = sorted({r["array"] for r in stats if r["kind"] == "store"})
    shared: dict = {}
    for r in t.shared_stats():
        if r["kind"] == "load":
            shared[r["array"]] = shared.get(r["array"], 0) + int(
                round(r["requests"] * r["threads_per_req"]))
    return dict(global_loads={a: int(t.load_counts(a).sum()) for a in glob},
                shared_loads=shared,
                stored={a: int((t.load_counts(a, kind="store") > 0).sum()) for a in stored})


def check_loads_per_output(fn, *args, max_per_output: float, array: str | None = None,
                           space: str = "global", only_output: bool = True, quiet=False,
                           **kwargs) -> str:
    """Trace one launch of the GPU launcher ``fn(*args, **kwargs)`` and fail if its kernels
    load more than `max_per_output` values per output element from `space` ('global' or
    'shared') memory, counting every load of every thread (caches are not modelled), of
    the launcher argument named `array` only if given (pass it to the kernel unchanged);
    with `only_output`, also fail if any global array besides one output is written (an
    im2col matrix, say).

    Register blocking shows up here: a thread that computes several outputs from every
    value it loads divides the loads per output.
    """
    if space not in ("global", "shared"):
        raise ValueError(f"space must be 'global' or 'shared', got {space!r}")
    name = _name(fn)
    t = _trace_answer("loads per output", fn, args, kwargs)
    tr = traffic(t)
    if not tr["stored"]:
        raise CheckError(f"loads per output FAILED: {name} stores nothing to global memory "
                         "(not implemented yet?)")
    if only_output and len(tr["stored"]) > 1:
        extra = ", ".join(f"{a} ({n} elements)" for a, n in tr["stored"].items())
        raise CheckError(f"loads per output FAILED: {name} writes {len(tr['stored'])} global "
                         f"arrays: {extra}; only the output should be written (build "
                         "intermediate tiles in shared memory or registers instead)")
    outputs = sum(tr["stored"].values())
    loads = tr[f"{space}_loads"]
    if array is not None:
        try:
            arr = t.array(array)
        except Exception:  # noqa: BLE001  (the tracer's TraceError names what it has)
            raise CheckError(f"loads per output FAILED: the tracer cannot find the array "
                             f"{array!r} in {name}'s kernels: pass it to the kernel as it is "
                             "(not a reshaped view)") from None
        count = loads.get(arr.name, 0)
    else:
        count = sum(loads.values())
    per = count / outputs
    what = f"{space}-memory loads" + (f" of {array}" if array else "")
    if not per <= max_per_output:
        raise CheckError(
            f"loads per output FAILED: {name} makes {per:.2f} {what} per output ({count} for "
            f"{outputs} outputs; at most {max_per_output:g} allowed)\n  hint: let each "
            "thread compute several outputs from every value it loads (register blocking)")
    line = f"✓ loads per output: {name}: {per:.2f} {what} per output (at most {max_per_output:g})"
    if not quiet:
        print(line)
    return line


def check_bank_conflicts(fn, *args, max_ways: float = 1.0, kind="load", quiet=False,
                         **kwargs) -> str:
    """Trace one launch of ``fn(*args, **kwargs)`` and fail if its shared-memory accesses
    of `kind` ('load', 'store' or None for both) average more than `max_ways` wavefronts
    per request phase (1.0: conflict-free; 4-byte accesses, as the tracer sees them)."""
    name = _name(fn)
    what = {"load": "loads", "store": "stores"}.get(kind, "accesses")
    t = _trace_answer("bank conflicts", fn, args, kwargs)
    rows = [r for r in t.shared_stats() if kind is None or r["kind"] == kind]
    if not rows:
        raise CheckError(f"bank conflicts FAILED: {name} makes no shared-memory {what} "
                         "(not implemented yet?)")
    ways = t.bank_conflicts(kind=kind)
    if not ways <= max_ways:
        worst = max(rows, key=lambda r: r["ways"])
        raise CheckError(
            f"bank conflicts FAILED: {name}'s shared-memory {what} are "
            f"{ways:.2f}-way on average (at most {max_ways:g} allowed); worst: {worst['site']} "
            f"({worst['ways']:.1f}-way)\n  hint: within a warp, threads that read different "
            "words should read different banks (word address mod 32)")
    line = f"✓ bank conflicts: {name}: shared-memory {what} {ways:.2f}-way on average"
    if not quiet:
        print(line)
    return line


# ----------------------------------------------------------------------------------------
# Lessons 10-11: pipeline timing, weighted splits, separable factors, depthwise, large filters


def check_pipeline_time(fn, *, seed=None, quiet=False) -> str:
    """fn(times, slots=None) -> when the last batch leaves the last stage.

    times: (batches, stages) durations; each stage is one worker taking the batches in
    order; a batch enters stage s when it has left stage s - 1 and stage s is free. slots:
    at most that many batches in flight (a batch enters the first stage only when the
    batch `slots` places earlier has left the last stage); None: no limit.
    """
    def reference(times, slots=None) -> float:
        """Finish time of a pipeline: stage s of batch b starts when stage s - 1 of batch b and
        stage s of batch b - 1 have finished, and (with `slots`) batch b's first stage when
        batch b - slots has left the last stage."""
        t = np.asarray(times, dtype=np.float64)
        B, S = t.shape
        end = np.zeros((B, S))
        for b in range(B):
            for s in range(S):
                start = max(end[b, s - 1] if s else 0.0, end[b - 1, s] if b else 0.0)
                if s == 0 and slots is not None and b >= slots:
                    start = max(start, end[b - slots, S - 1])
                end[b, s] = start + t[b, s]
        return float(end[-1, -1])

    rng = np.random.default_rng(seed)
    task = "pipeline time"
    cases = [(np.array([[3.0]]), None), (np.array([[2.0, 5.0, 1.0]]), None),
             (np.array([[4.0, 4.0]] * 5), None), (np.array([[1.0, 6.0, 2.0]] * 4), None)]
    for _ in range(3):
        B, S = int(rng.integers(3, 9)), int(rng.integers(2, 5))
        cases.append((rng.uniform(0.5, 5.0, (B, S)).round(3), None))
    for slots in (1, 2, 3):
        B, S = int(rng.integers(4, 9)), int(rng.integers(2, 5))
        cases.append((rng.uniform(0.5, 5.0, (B, S)).round(3), slots))
    cases.append((np.array([[1.0, 9.0, 1.0]] * 4), 2))
    for times, slots in cases:
        label = f"times {times.tolist()}" + (f", slots={slots}" if slots is not None else "")
        kw = {} if slots is None else {"slots": slots}
        got = _as_float(task, _value_call(task, fn, (times.copy(),), kw, label), label)
        want = reference(times, slots)
        if not _close(got, want, 1e-9):
            hint = ""
            if _close(got, float(times.sum()), 1e-9) and slots != 1:
                hint = " (that is the serial time: every stage of every batch one after another)"
            elif _close(got, float(times.sum(axis=0).max()), 1e-9):
                hint = (" (that is the busiest stage's total: the pipeline also has to fill and "
                        "drain)")
            elif slots is not None and _close(got, reference(times), 1e-9):
                hint = f" (that ignores slots={slots}: a batch needs a free slot to start)"
            raise CheckError(f"{task} FAILED on {label}: got {got:.6g}, expected {want:.6g}"
                             f"{hint}")
    return _pass(task, len(cases), quiet)


def check_weighted_split(fn, *, seed=None, quiet=False) -> str:
    """fn(n_items, speeds) -> parts: one (start, stop) pair (or slice / range) per device,
    in device order, contiguous, covering 0..n; device i with speed s_i finishes its part
    at size_i / s_i, and the slowest finish must be as early as any split allows."""
    rng = np.random.default_rng(seed)
    task = "weighted split"
    cases = [(10, [1.0, 1.0]), (10, [1.0, 3.0]), (7, [2.0, 1.0, 1.0]), (1, [1.0, 5.0]),
             (100, [1.0, 1.0, 1.0, 1.0]), (64, [0.7, 1.9]), (5, [1.0, 100.0])]
    for _ in range(4):
        k = int(rng.integers(2, 6))
        cases.append((int(rng.integers(1, 400)), rng.uniform(0.2, 4.0, k).round(3).tolist()))
    for n, speeds in cases:
        label = f"{n} items over devices with speeds {speeds}"
        parts = _value_call(task, fn, (n, list(speeds)), {}, label)
        if parts is None:
            raise CheckError(f"{task} returned None on {label}: not implemented yet?")
        try:
            spans = _ranges(list(parts))
        except (TypeError, ValueError) as e:
            raise CheckError(f"{task} on {label}: parts must be (start, stop) pairs, slices or "
                             f"ranges, got {parts!r} ({e})") from e
        if len(spans) != len(speeds):
            raise CheckError(f"{task} FAILED on {label}: {len(spans)} parts for {len(speeds)} "
                             "devices (one part per device, empty ones included)")
        pos = 0
        for a, b in spans:
            if a != pos or b < a:
                raise CheckError(f"{task} FAILED on {label}: parts {spans} are not contiguous "
                                 f"from 0 in device order")
            pos = b
        if pos != n:
            raise CheckError(f"{task} FAILED on {label}: parts {spans} end at {pos}, not {n}")
        sizes = [b - a for a, b in spans]
        got = max(sz / s for sz, s in zip(sizes, speeds, strict=True))
        best_sizes = [0] * len(speeds)  # greedy: each item to the device done first with it
        for _ in range(n):
            i = min(range(len(speeds)), key=lambda j: (best_sizes[j] + 1) / speeds[j])
            best_sizes[i] += 1
        best = max(sz / s for sz, s in zip(best_sizes, speeds, strict=True))
        if got > best * (1 + 1e-9):
            raise CheckError(f"{task} FAILED on {label}: sizes {sizes} finish at {got:.4g} "
                             f"(time units of one item on a speed-1 device); sizes {best_sizes} "
                             f"finish at {best:.4g}")
    return _pass(task, len(cases), quiet)


def check_separable_factors(fn, *, seed=None, quiet=False) -> str:
    """fn(kernel (R, S)) -> (col (R,), row (S,)) with outer(col, row) == kernel, or None
    when the kernel is not separable (rank > 1 beyond rounding)."""
    rng = np.random.default_rng(seed)
    task = "separable factors"
    sob = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], np.float64)
    g = np.exp(-np.arange(-3, 4) ** 2 / 4.0)
    cases = [(sob, True), (np.outer(g, g) / np.outer(g, g).sum(), True),
             (np.ones((5, 3)) / 15, True), (np.array([[0, 1, 0], [1, -4, 1], [0, 1, 0]], float),
                                            False)]
    def vec(n):
        return random_array((n,), rng).astype(np.float64)

    for R, S in ((3, 5), (7, 1), (1, 9), (5, 5)):
        cases.append((np.outer(vec(R), vec(S)), True))  # float64: rank 1 to rounding
    for R, S in ((3, 3), (5, 4)):
        cases.append((np.outer(vec(R), vec(S)) + 0.5 * np.outer(vec(R), vec(S)), False))
    cases.append((random_array((4, 6), rng).astype(np.float64), False))
    for k, separable in cases:
        label = f"kernel {k.shape[0]}x{k.shape[1]} {np.round(k, 3).tolist()}"
        got = _value_call(task, fn, (k.copy(),), {}, label)
        if not separable:
            if got is not None:
                raise CheckError(f"{task} FAILED on {label}: this kernel has rank > 1 (not an "
                                 f"outer product), expected None, got {got!r}")
            continue
        if got is None:
            raise CheckError(f"{task} FAILED on {label}: it is separable (rank 1), got None")
        try:
            col, row = (np.asarray(v, np.float64).reshape(-1) for v in got)
        except (TypeError, ValueError) as e:
            raise CheckError(f"{task} on {label}: expected (col, row), got {got!r}") from e
        if col.shape != (k.shape[0],) or row.shape != (k.shape[1],):
            raise CheckError(f"{task} FAILED on {label}: col must have {k.shape[0]} values and "
                             f"row {k.shape[1]}, got {col.shape} and {row.shape}")
        err = np.abs(np.outer(col, row) - k).max()
        if not err <= 1e-6 * max(np.abs(k).max(), 1e-30):
            raise CheckError(f"{task} FAILED on {label}: outer(col, row) differs from the "
                             f"kernel by up to {err:.3g}")
    return _pass(task, len(cases), quiet)


def depthwise_cases(rng, *, multiplier: int = 1, stride=True, small=None):
    """Depthwise problems: w (C·multiplier, 1, R, S), groups = C; odd shapes, padding."""
    if small is None:
        from .runtime import is_simulator

        small = is_simulator()
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
        x = random_array(xs, rng)
        w = random_array((C * multiplier, 1, R, S), rng)
        kw = dict(stride=st, padding=pad)
        expected = ref.conv2d(x.astype(np.float64), w.astype(np.float64), groups=C, **kw)
        absref = ref.conv2d(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64),
                            groups=C, **kw)
        cases.append(dict(inputs=[x, w], kwargs=kw, expected=expected, absref=absref,
                          reduction=R * S, label=f"x{xs} w{tuple(w.shape)} groups={C} "
                                                 f"stride={st} padding={pad}"))
    return cases


def check_depthwise(fn, *, multiplier: int = 1, stride=True, device=None, seed=None,
                    runs: int = 2, quiet=False) -> str:
    """Check a depthwise conv: fn(x (N, C, H, W), w (C·multiplier, 1, R, S), [out], stride=,
    padding=) -> y (N, C·multiplier, P, Q); output channel k reads input channel
    k // multiplier (PyTorch's conv2d with groups = C)."""
    rng = np.random.default_rng(seed)
    cases = depthwise_cases(rng, multiplier=multiplier, stride=stride)
    return _run_cases("depthwise", fn, cases, device, runs, quiet, "fp32")


def check_filter2d_large(fn, *, seed=None, quiet=False) -> str:
    """Check fn(image (H, W), kernel (R, S)) -> (H, W) ('same' zero padding) with large,
    odd, non-square kernels (up to 15 wide): the filters FFT convolution is for."""
    rng = np.random.default_rng(seed)
    cases = filter2d_cases(rng, small=False, kernels=[(9, 5), (15, 7)])
    H, W = 41, 58
    img, k = random_array((H, W), rng), random_array((3, 11), rng)
    cases.append(dict(inputs=[img, k], kwargs={},
                      expected=ref.filter2d(img.astype(np.float64), k.astype(np.float64)),
                      absref=ref.filter2d(np.abs(img).astype(np.float64),
                                          np.abs(k).astype(np.float64)),
                      reduction=33, label=f"image {H}x{W}, filter 3x11, pad (1, 5)"))
    return _run_cases("filter2d (large filters)", fn, cases, False, 1, quiet, "fp32")


# ----------------------------------------------------------------------------------------
# Lesson 12: precisions and tensor-core numerics


def _rounding_inputs(rng, fmt: str) -> np.ndarray:
    """float32 values that test a rounding to `fmt`: a wide range of magnitudes, exact
    ties with an even and an odd kept part, the neighbours of ties, zeros, fp32
    subnormals, values near the top of the range, infinities and NaN."""
    from .precision import FORMATS

    drop = 23 - FORMATS[fmt].mantissa
    wide = (rng.standard_normal(400) * np.exp(rng.uniform(-60, 60, 400))).astype(np.float32)
    kept = rng.integers(0x00800000 >> drop, 0x7F000000 >> drop, 60, dtype=np.uint32) << drop
    tie = np.uint32(1 << (drop - 1))
    bits = np.concatenate([kept | tie, (kept | tie) + 1, (kept | tie) - 1])
    ties = bits.astype(np.uint32).view(np.float32)
    sub = (rng.integers(1, 0x007FFFFF, 20, dtype=np.uint32)).view(np.float32)
    special = np.array([0.0, -0.0, 1.0, -1.0, 3.4e38, -3.39e38, 3.3e38, np.inf, -np.inf,
                        np.nan], np.float32)
    # NaNs whose payload would round into Inf, or carry into the sign bit
    nans = np.array([0x7F800001, 0xFF800001, 0x7FFFFFFF, 0x7FBFFFFF, 0xFFFFFFFF],
                    np.uint32).view(np.float32)
    x = np.concatenate([wide, ties, -ties, sub, -sub, special, nans])
    return x[rng.permutation(x.size)].reshape(-1, 5)  # 2-D on purpose


def check_rounding(fn, fmt: str = "bf16", *, seed=None, quiet=False) -> str:
    """Check fn(x float32 array) -> the values rounded to `fmt` ('bf16' or 'tf32'),
    round to nearest with ties to even, returned as float32 (same shape); infinities stay,
    NaN stays NaN, values that round past the largest finite value become infinite."""
    from .precision import round_to

    task = f"round to {fmt}"
    rng = np.random.default_rng(seed)
    x = _rounding_inputs(rng, fmt)
    want = round_to(x, fmt)
    got = _value_call(task, fn, (x.copy(),), {}, f"{x.size} values")
    if got is None:
        raise CheckError(f"{task} returned None: not implemented yet?")
    got = np.asarray(got)
    if got.shape != x.shape:
        raise CheckError(f"{task} FAILED: output shape {got.shape}, expected {x.shape}")
    got = got.astype(np.float32)
    nan_ok = np.isnan(want) == np.isnan(got)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(want) & np.isnan(got))
    bad = ~(same & nan_ok)
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        xi, gi, wi = x[i], got[i], want[i]
        hints = []
        trunc = (x.view(np.uint32) >> np.uint32(23 - _fmt_mant(fmt))) << np.uint32(
            23 - _fmt_mant(fmt))
        if np.array_equal(got.view(np.uint32)[np.isfinite(x)], trunc[np.isfinite(x)]):
            hints.append("the low bits were cut off (round toward zero): add half of the "
                         "dropped part first, then cut")
        elif np.isnan(xi):
            hints.append("NaN must stay NaN (adding the rounding increment can turn a NaN's "
                         "bits into Inf): pass non-finite values through")
        elif np.isinf(xi):
            hints.append("infinities must stay infinite")
        elif abs(float(gi) - float(xi)) == abs(float(wi) - float(xi)):
            hints.append("a tie (exactly half-way) went the wrong way: ties go to the "
                         "neighbour whose last kept bit is 0 (even)")
        raise CheckError(
            f"{task} FAILED on {int(bad.sum())} of {x.size} values; first at {i}: x = "
            f"{float(xi)!r} (bits {int(x.view(np.uint32)[i]):#010x}): got {float(gi)!r} "
            f"(bits {int(got.view(np.uint32)[i]):#010x}), expected {float(wi)!r} (bits "
            f"{int(want.view(np.uint32)[i]):#010x})" + "".join(f"\n  hint: {h}" for h in hints))
    return _pass(task, x.size, quiet, "values")


def _fmt_mant(fmt: str) -> int:
    from .precision import FORMATS

    return FORMATS[fmt].mantissa


def _magnitudes(rng, shape, center: float, decades: float = 1.5) -> np.ndarray:
    """Random signs, magnitudes log-uniform within center * 10^(+-decades)."""
    mag = center * 10.0 ** rng.uniform(-decades, decades, shape)
    return (mag * rng.choice([-1.0, 1.0], shape)).astype(np.float32)


def check_scaled_gemm(fn, *, seed=None, quiet=False) -> str:
    """Check fn(A (M, K), B (K, N) float32) -> C (M, N): a GEMM with fp16 tensor-core
    numerics on data outside fp16's range. Each input is multiplied by a power of two
    that brings it into range, rounded to fp16, multiplied with fp32 sums, and the result
    scaled back. Expected: the float64 product of the inputs rounded to 11 significant bits
    (fp16's precision, without its range limits), within fp32 summation error."""
    from .precision import _round_mantissa

    task = "scaled fp16 gemm"
    rng = np.random.default_rng(seed)
    specs = [((17, 23, 33), 3e5, 2e4, "large values (fp16 overflows)"),
             ((9, 40, 21), 2e-6, 5e-7, "tiny values (fp16 underflows)"),
             ((31, 7, 50), 4e5, 3e-6, "A large, B tiny"),
             ((12, 19, 16), 0.5, 2.0, "values in fp16's range")]
    for (M, N, K), ca, cb, what in specs:
        a, b = _magnitudes(rng, (M, K), ca), _magnitudes(rng, (K, N), cb)
        ar = _round_mantissa(a, 10).astype(np.float64)
        br = _round_mantissa(b, 10).astype(np.float64)
        exp, absref = ar @ br, np.abs(ar) @ np.abs(br)
        label = f"A {M}x{K} @ B {K}x{N}, {what}"
        out = _value_call(task, fn, (a.copy(), b.copy()), {}, label)
        if out is None:
            raise CheckError(f"{task} returned None on {label}: not implemented yet?")
        out = np.asarray(out)
        comp = compare(out, exp, absref, K, "fp32")
        if not comp.ok:
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            if not np.isfinite(out).all():
                comp.messages.append("hint: fp16 holds at most 65504 and loses values below "
                                     "6e-5 (0 below 6e-8): scale each input by a power of "
                                     "two before converting")
            elif compare(out, a64 @ b64, np.abs(a64) @ np.abs(b64), K, "fp32").ok:
                comp.messages.append("hint: this is the exact fp32 product: round the scaled "
                                     "inputs to fp16 (np.float16) as a tensor core would")
            else:
                comp.messages.append("hint: use powers of two as scales (2**k changes only "
                                     "the exponent, so the rounding is the same as fp16's "
                                     "at any size), and sum in float32")
            _fail(task, label, comp)
    return _pass(task, len(specs), quiet)


def check_conv2d_fp16(fn, *, stride=True, padding=True, seed=None, quiet=False) -> str:
    """Check fn(x, w, stride=, padding=) -> y: a conv2d with tensor-core numerics: x and w
    rounded to fp16, products summed in fp32 (as the lesson's WMMA conv does). Expected:
    the float64 conv of the fp16-rounded inputs, within fp32 summation error."""
    rng = np.random.default_rng(seed)
    cases = conv2d_cases(rng, stride=stride, padding=padding, small=True)
    exact = []
    for c in cases:
        x, w = c["inputs"]
        xr = x.astype(np.float16).astype(np.float64)
        wr = w.astype(np.float16).astype(np.float64)
        exact.append(c["expected"])
        c["expected"] = ref.conv2d(xr, wr, **c["kwargs"])
        c["absref"] = ref.conv2d(np.abs(xr), np.abs(wr), **c["kwargs"])
    try:
        return _run_cases("conv2d (fp16 inputs, fp32 sums)", fn, cases, False, 1, quiet,
                          "fp32")
    except CheckError as e:
        for c, ex in zip(cases, exact, strict=True):
            if c["label"] in str(e):
                out = call(fn, c["inputs"], c["expected"].shape, c["kwargs"], False)
                if compare(out, ex, c["absref"], c["reduction"]).ok:
                    raise CheckError(str(e) + "\n  hint: this is the fp32 conv of the "
                                     "unrounded inputs: round x and w to fp16 first") from None
        raise


# ----------------------------------------------------------------------------------------
# Lesson 13: the capstone is graded by the ladder it produces


def check_ladder(result, kernel: str, *, layers=("64ch 56x56", "128ch 28x28", "256ch 14x14"),
                 baseline: str = "cuDNN fp32", quiet=False) -> str:
    """Check a ladder made by ``convlab bench`` / ``ladder.run_ladder`` (a dict, or the path
    of its ladder.json) for the capstone: a real GPU, every named ResNet layer present, the
    row `kernel` checked against float64 within fp32 tolerance and timed beside the
    `baseline` in the same ladder, and its % of the baseline consistent with the two times.
    Prints one line per layer and the geometric mean; raises CheckError otherwise."""
    import json
    import math
    from pathlib import Path

    task = "capstone ladder"
    if not isinstance(result, dict):
        try:
            result = json.loads(Path(result).read_text())
        except (OSError, ValueError) as e:
            raise CheckError(f"{task}: cannot read {result}: {e}") from None
    device = str(result.get("device", ""))
    if not device or "sim" in device.lower():
        raise CheckError(f"{task} FAILED: the ladder must come from a real GPU (device "
                         f"{device!r}); run it where convlab.is_simulator() is False")
    lads = {lad["problem"].split(":")[0]: lad for lad in result.get("ladders", [])}
    lines, pcts = [], []
    for layer in layers:
        lad = lads.get(layer)
        if lad is None:
            raise CheckError(f"{task} FAILED: layer {layer!r} is missing; found "
                             f"{sorted(lads)} (run the ladder on problems.RESNET)")
        rows = {r["name"]: r for r in lad["rows"]}
        mine, base = rows.get(kernel), rows.get(baseline)
        if base is None:
            raise CheckError(f"{task} FAILED on {layer}: no {baseline} row in the same run")
        if mine is None:
            why = [ln for ln in lad.get("not_timed", []) if kernel in ln]
            raise CheckError(f"{task} FAILED on {layer}: no row {kernel!r}" + (
                f" ({why[0]})" if why else " (was it passed in kernels=...?)"))
        red = 9 * int(layer.split("ch")[0])  # 3x3 filters over C channels
        tol = 8 * EPS["fp32"] * math.sqrt(red)
        if not (mine["max_rel_err"] <= tol and mine["ms"] > 0):
            raise CheckError(f"{task} FAILED on {layer}: {kernel} has max rel err "
                             f"{mine['max_rel_err']:.2e} (fp32 tolerance {tol:.1e}) and "
                             f"{mine['ms']} ms")
        pct = 100 * base["ms"] / mine["ms"]
        if mine.get("pct_of_baseline") is not None and not _close(
                pct, mine["pct_of_baseline"], 1e-6):
            raise CheckError(f"{task} FAILED on {layer}: % of {baseline} "
                             f"{mine['pct_of_baseline']:.3f} does not match the times "
                             f"({pct:.3f}): an edited ladder?")
        pcts.append(pct)
        lines.append(f"  {layer}: {kernel} {mine['ms']:.4f} ms = {pct:.0f}% of {baseline} "
                     f"({base['ms']:.4f} ms), max rel err {mine['max_rel_err']:.1e}")
    geo = math.exp(sum(math.log(p) for p in pcts) / len(pcts))
    line = (f"✓ {task}: {kernel} on {device} ({result.get('date', '?')}): geometric mean "
            f"{geo:.0f}% of {baseline}\n" + "\n".join(lines))
    if not quiet:
        print(line)
    return line
