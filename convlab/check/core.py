"""What every checker shares: test data, the comparison, calling the learner's code.

What makes the checkers hard to fool (each has fooled a public checker before):

- fresh random, non-uniform data on every call (`random_array`), and odd, non-square
  shapes that are not multiples of any tile, with stride / padding / dilation where the
  task has them;
- outputs filled with a *marked* NaN before the run (`poisoned`), so an element left
  unwritten is told apart from one the code computed as NaN;
- NaN and Inf fail explicitly (``abs(diff) > tol`` is False for NaN);
- the tolerance grows with the reduction length and is measured against
  ``conv(|x|, |w|)`` (`reference_case`), so it is tight where the answer is small;
- a function that writes ``out`` runs twice on the same inputs: a result that moves
  between runs is a race (missing ``syncthreads``, stale shared memory); under the
  simulator a GPU launcher is traced for shared-memory races instead (`convlab.trace`)
  and then runs each case once.

`compare` reports the first bad index, max abs / rel error and an error map; `_run_cases`
runs a list of `reference_case` problems and raises `CheckError` with that report.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import sys
from dataclasses import dataclass, field

import numpy as np

from .. import reference as ref
from ..errors import CheckError

# A quiet NaN with a payload no arithmetic produces: "this element was never written".
POISON_BITS = np.uint32(0x7FC0DEAD)


POISON = POISON_BITS.view(np.float32)


EPS = {"fp32": 2.0**-24, "tf32": 2.0**-11, "fp16": 2.0**-11, "bf16": 2.0**-8}


def array_module(a):
    """CuPy for a CuPy array (without importing CuPy otherwise), else NumPy."""
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


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
        a += ramp * (axis + 1) / len(shape)   # in place: the same sums, no copy per axis
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
        import warnings

        e = self.err if isinstance(self.err, np.ndarray) else self.err.get()  # CuPy
        with warnings.catch_warnings():  # an all-NaN column (never written) stays NaN
            warnings.simplefilter("ignore", RuntimeWarning)
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
    the reduction length unless given. CuPy arrays are compared on the GPU, in the same
    float64 steps (the same results; `err` is then a CuPy array).
    """
    xp = array_module(out)          # NumPy, or CuPy for outputs left on the GPU
    out = xp.asarray(out)
    expected = xp.asarray(expected, dtype=xp.float64)
    if out.shape != expected.shape:
        return Comparison(out.shape, False, messages=[
            f"wrong output shape {out.shape}, expected {expected.shape}"])
    if absref is None:
        absref = xp.abs(expected)
    if rtol is None:
        rtol = 2.5 * (0.0 if precision == "fp32" else EPS[precision]) + 8 * EPS["fp32"] * max(
            1.0, np.sqrt(reduction))
    # whole-array passes with few temporaries: outputs of 10^8 elements are checked here
    absref = xp.asarray(absref, xp.float64)
    # the relative error's scale; an element whose every term is zero (all padding) must be
    # exactly 0 and has none (an error there is absolute, and named below)
    scaled = xp.where(absref > 0, absref, xp.inf)
    tol = xp.multiply(absref, rtol, out=xp.empty_like(scaled))
    tol += 1e-30
    c = Comparison(out.shape, True, rtol=rtol)
    unwritten = _unwritten(out, xp)
    nonfinite = ~xp.isfinite(out)
    nonfinite &= ~unwritten
    diff = out.astype(xp.float64)
    diff -= expected
    xp.abs(diff, out=diff)           # NaN where unwritten (the marker is a NaN) or non-finite
    bad = ~(diff <= tol)             # NaN diff is bad
    bad |= unwritten
    bad |= nonfinite
    del tol
    c.err = diff
    c.not_written, c.nonfinite, c.bad = int(unwritten.sum()), int(nonfinite.sum()), int(bad.sum())
    finite = xp.isfinite(diff)
    if bool(finite.all()):
        c.max_abs = float(diff.max())
        c.max_rel = float(xp.divide(diff, scaled, out=scaled).max())
    elif bool(finite.any()):
        c.max_abs = float(diff[finite].max())
        c.max_rel = float((diff[finite] / scaled[finite]).max())
    if c.bad:
        c.ok = False
        c.first_bad = tuple(int(i) for i in xp.argwhere(bad)[0])
        if c.not_written == out.size:
            c.messages.append(f"nothing was written: all {out.size} outputs still hold the "
                              "'not written' marker (not implemented yet?)")
        elif c.not_written:
            first = tuple(int(i) for i in xp.argwhere(unwritten)[0])
            c.messages.append(f"{c.not_written} of {out.size} outputs were never written, "
                              f"first at index {first}")
        if c.nonfinite:
            first = tuple(int(i) for i in xp.argwhere(nonfinite)[0])
            c.messages.append(f"{c.nonfinite} outputs are NaN or Inf, first at index {first} "
                              f"(value {out[first]}: never written, where the output starts "
                              "as NaN, or computed from a NaN or an overflow)")
        wrong = c.bad - c.not_written - c.nonfinite
        if wrong:
            idx = tuple(int(i) for i in xp.argwhere(bad & ~unwritten & ~nonfinite)[0])
            zero = " (exactly 0: every term there is zero, padding)" if float(
                absref[idx]) == 0 else ""
            c.messages.append(
                f"{wrong} of {out.size} outputs are wrong, first at index {idx}: got "
                f"{float(out[idx]):.6g}, expected {float(expected[idx]):.6g}{zero} (max abs err "
                f"{c.max_abs:.3g}, max rel err {c.max_rel:.3g}, tolerance {rtol:.1e} relative)")
    return c


def reference_case(x, w, *, op=None, label: str | None = None, reduction: int | None = None,
                   reference_kwargs: dict | None = None, **kwargs) -> dict:
    """One checked problem: the inputs, the float64 reference and its tolerance scale.

    x, w: the inputs the code under test receives (float32); kwargs: the keyword
    arguments it receives (stride=, padding=...). op(x, w, **kwargs, **reference_kwargs)
    computes the reference in float64 (default `convlab.reference.conv2d`; also
    `reference.filter2d`, `np.matmul`...). Returns dict(inputs, kwargs, expected, absref
    (op on |x|, |w|: the sum of absolute products behind each element), reduction (the
    length of each sum: from the conv shapes unless given), label).
    """
    op = ref.conv2d if op is None else op
    full = {**kwargs, **(reference_kwargs or {})}
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    if reduction is None:
        reduction = ref.conv_params(np.shape(x), np.shape(w), **full).reduction
    if label is None:
        label = (f"x{tuple(np.shape(x))} w{tuple(np.shape(w))} "
                 + " ".join(f"{k}={v}" for k, v in kwargs.items())).strip()
    return dict(inputs=[x, w], kwargs=dict(kwargs), expected=op(x64, w64, **full),
                absref=op(np.abs(x64), np.abs(w64), **full), reduction=int(reduction),
                label=label)


def _device():
    from ..runtime import cuda

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
            ret = fn(*args, out=out, **kwargs)
            if device:
                cuda.synchronize()
            got = _to_host(out)
            # an array of its own returned, `out` untouched: the checker reads `out`
            if ret is not None and _unwritten(got).all() and getattr(ret, "shape", None) == \
                    tuple(out_shape) and not _unwritten(np.asarray(_to_host(ret))).all():
                raise CheckError(f"{_name(fn)} returned an array of its own and left `out` "
                                 "unwritten: the checker reads `out` (launch the kernel on "
                                 "out itself)")
        return got
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


def _unwritten(a, xp=np):
    """Where a float32 array (of array module `xp`) still holds the checker's 'not
    written' marker."""
    a = xp.asarray(a)
    if a.dtype != xp.float32:
        return xp.zeros(a.shape, bool)
    return a.view(xp.uint32) == int(POISON_BITS)


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


def _as_nchw(case, out=None):
    """An NHWC case (`conv.nhwc_case`) and its output seen in NCHW, for the hints."""
    if case.get("layout") != "nhwc":
        return case, out
    x, w = case["inputs"]
    view = dict(case, inputs=[x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1)],
                expected=case["expected"].transpose(0, 3, 1, 2),
                absref=case["absref"].transpose(0, 3, 1, 2), layout="nchw")
    return view, None if out is None else out.transpose(0, 3, 1, 2)


def _border_mask(case) -> np.ndarray | None:
    """Outputs whose receptive field touches the padding or the image's outermost pixels."""
    case, _ = _as_nchw(case)
    kw = case["kwargs"]
    x, w = case["inputs"][:2]
    if x.ndim == 2 and w.ndim == 2 and case["expected"].shape == x.shape:  # 'same' filter
        (H, W), (R, S) = x.shape, w.shape
        rows, cols = np.arange(H), np.arange(W)
        return ((rows <= R // 2) | (rows >= H - 1 - R // 2))[:, None] | \
            ((cols <= S // 2) | (cols >= W - 1 - S // 2))[None, :]
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


def _hints(case, out, comp: Comparison, passed: list, square_passes=None) -> list:
    """Name the likely mistake from which cases passed and where the errors are.
    square_passes(): whether the code gets a square input with this case's arguments right
    (asked only when every case that passed was square)."""
    case, out = _as_nchw(case, out)
    hints = _argument_hints(case, passed, square_passes) + _where_hints(case, out, comp)
    same = _same_as_hints(case, out, comp)
    if any(h.startswith("the image wrapped") for h in same):  # the border hint's cause
        hints = [h for h in hints if not h.startswith("all errors are where")]
    return hints + same


def _argument_hints(case, passed: list, square_passes) -> list:
    """An argument every passed case left at its default (or a square shape) and this one
    does not."""
    hints = []
    kw, x = case["kwargs"], case["inputs"][0]
    shapes = [_as_nchw(c)[0]["inputs"][0].shape for c in passed]
    if x.ndim == 4 and x.shape[2] != x.shape[3] and shapes and all(
            s[-1] == s[-2] for s in shapes) and square_passes is not None and square_passes():
        hints.append("it gets a square input right and this non-square one wrong (same "
                     "stride and padding): are H and W (or P and Q, rows and columns) mixed up "
                     "somewhere?")
    if ref.pair(kw.get("stride", 1)) != (1, 1) and passed and all(
            ref.pair(c["kwargs"].get("stride", 1)) == (1, 1) for c in passed):
        hints.append(f"every stride-1 case passed, this one has stride={kw['stride']}: is the "
                     "stride applied (to both rows and columns)?")
    if kw.get("groups", 1) != 1 and passed and all(
            c["kwargs"].get("groups", 1) == 1 for c in passed):
        hints.append(f"every groups=1 case passed, this one has groups={kw['groups']}: does "
                     "each filter read only its own group's channels (the group's first "
                     "channel, k // (K // groups) * (C // groups))?")
    if ref.pair(kw.get("dilation", 1)) != (1, 1) and passed and all(
            ref.pair(c["kwargs"].get("dilation", 1)) == (1, 1) for c in passed):
        hints.append(f"every undilated case passed, this one has dilation={kw['dilation']}: is "
                     "the dilation applied to the filter offsets?")
    return hints


def _where_hints(case, out, comp: Comparison) -> list:
    """Wrong outputs that are all unwritten, or all at the image's border."""
    band = _border_mask(case)
    if comp.not_written and comp.not_written == comp.bad:
        return ["every wrong output is one never written: does every output get a thread "
                "(the grid's size, a loop's bound, an early return)?"]
    if band is not None and comp.bad and band.any() and not band.all():
        bad = ~(np.abs(out.astype(np.float64) - case["expected"]) <= comp.rtol * case["absref"])
        bad2d = bad.reshape(-1, *bad.shape[-2:]).any(axis=0)
        if not (bad2d & ~band).any():
            return ["all errors are where the filter window overlaps the image border: "
                    "check the padding offset and the bounds tests (off by one?)"]
    return []


def _same_as_hints(case, out, comp: Comparison) -> list:
    """A wrong output equal to a known wrong computation: an image wrapped around its
    edges (an FFT of the image's size), a depthwise multiplier's other channel mapping, a
    flipped filter (a true convolution)."""
    if not comp.bad:
        return []
    hints = []
    x, wf, kw = case["inputs"][0], case["inputs"][1], case["kwargs"]

    def equals(other) -> bool:
        return out.shape == other.shape and compare(out, other, case["absref"],
                                                     case["reduction"]).ok

    flipped = None
    if x.ndim == 4:
        flipped = ref.conv2d(x.astype(np.float64), wf[:, :, ::-1, ::-1].astype(np.float64),
                             **{"groups": x.shape[1] // wf.shape[1], **kw})
    elif x.ndim == 2 and np.ndim(wf) == 2 and case["expected"].shape == x.shape:
        flipped = ref.filter2d(x.astype(np.float64), wf[::-1, ::-1].astype(np.float64))
        R, S = wf.shape  # the image wrapped around its edges: an FFT of the image's size
        wrapped = sum(float(wf[r, s]) * np.roll(x.astype(np.float64), (R // 2 - r, S // 2 - s),
                                                axis=(0, 1)) for r in range(R) for s in range(S))
        if equals(wrapped):
            hints.append("the image wrapped around its edges (a circular correlation): an FFT "
                         "of the image's size wraps; pad both to at least (H + R - 1, W + S - 1)"
                         " and crop")
    if x.ndim == 4 and np.ndim(wf) == 4 and wf.shape[1] == 1 and \
            wf.shape[0] > x.shape[1] and wf.shape[0] % x.shape[1] == 0:
        C, K = x.shape[1], wf.shape[0]  # depthwise with a multiplier: the other mapping
        strided = ref.conv2d(x[:, [k % C for k in range(K)]].astype(np.float64),
                             wf.astype(np.float64), groups=K, **kw)
        if equals(strided):
            hints.append(f"output channel k read input channel k % {C}: it reads k // "
                         f"{K // C} (a channel's {K // C} filters are neighbours)")
    if flipped is not None and equals(flipped):
        hints.append("the output equals a true convolution (flipped filter): deep-learning "
                     "'convolution' is cross-correlation, do not flip the filter")
    return hints


def _prange_races(fn) -> list:
    """`parallel.prange_races` of a CPU answer (its source read where the function lives:
    a graded call's from the learner's process)."""
    from .parallel import prange_races

    try:
        return prange_races(fn)
    except Exception:  # noqa: BLE001  (source it cannot read: the numbers still decide)
        return []


def _run_cases(task: str, fn, cases, device, runs: int, quiet: bool, precision: str,
               dtype=None):
    if device is None:
        device = bool(getattr(fn, "device", False))
    if not device and (races := _prange_races(fn)):
        raise CheckError(
            f"{task} FAILED: a race between the iterations of a prange loop: {races[0]}: "
            "every iteration writes this element at once (its index does not depend on the "
            "loop's variable), so the result changes from run to run\n  hint: let the prange "
            "loop run over the outputs (rows), each written by one iteration; make scratch "
            "arrays inside the loop")
    if _writes_out(fn) is False and runs > 1:
        runs = 1  # a pure function cannot race with itself; one run is enough
    # a race explains any wrong answer: report it first. Under the simulator a launcher the
    # tracer has checked for races runs each case once: a second run would find a race only
    # if the simulator's turn order (random per launch) happened to expose it, the trace
    # finds it always.
    if _race_check(task, fn, cases, device):
        runs = 1
    worst, passed = 0.0, []
    for case in cases:
        first = None
        for _ in range(runs):
            try:
                out = call(fn, case["inputs"], case["expected"].shape, case["kwargs"], device)
            except CheckError:
                raise
            except Exception as e:  # noqa: BLE001  (report the learner's exception as a failure)
                raise CheckError(f"{task} raised on {case['label']}: {type(e).__name__}: "
                                 f"{e}{raised_at(e)}") from e
            if dtype is not None and out.dtype != np.dtype(dtype):
                raise CheckError(f"{task} FAILED on {case['label']}: returned "
                                 f"{out.dtype} values, the task asks for "
                                 f"{np.dtype(dtype).name} (convert at the end: "
                                 f".astype(np.{np.dtype(dtype).name}))")
            comp = compare(out, case["expected"], case["absref"], case["reduction"], precision)
            if case.get("layout") == "nhwc" and isinstance(comp.err, np.ndarray):
                comp.err = comp.err.transpose(0, 3, 1, 2)  # the picture: rows x columns
            if not comp.ok:
                comp.messages += [f"hint: {h}" for h in _hints(
                    case, out, comp, passed, lambda c=case: _square_passes(fn, c, device))]
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


def _square_passes(fn, case, device) -> bool:
    """Whether fn gets an NCHW conv case right with x made square (H x H), the filter and
    the arguments unchanged: tells an H/W mix-up from a bug the first square case missed."""
    x, w = case["inputs"]
    if case.get("layout") == "nhwc" or x.ndim != 4:
        return False
    rng = np.random.default_rng(1)
    try:
        sq = reference_case(random_array((*x.shape[:2], x.shape[2], x.shape[2]), rng), w,
                            **case["kwargs"])
        out = call(fn, sq["inputs"], sq["expected"].shape, sq["kwargs"], device)
    except Exception:  # noqa: BLE001  (no hint from a case it cannot build or a failed call)
        return False
    return compare(out, sq["expected"], sq["absref"], sq["reduction"]).ok


def _race_check(task: str, fn, cases, device) -> bool:
    """Under the simulator, trace a GPU launcher on the smallest case (convlab.trace):
    two threads touching one shared address between the same barriers is a race even
    when the simulator happened to give the right answer. True when the trace ran and
    found none; raise CheckError when it found one."""
    from ..runtime import is_simulator

    if not device or not cases or not is_simulator():
        return False
    from .. import trace

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
        return False
    if races:
        more = f"\n  ({len(races)} different hazards in all)" if len(races) > 1 else ""
        raise CheckError(f"{task} FAILED on {case['label']}\n  {races[0]}{more}\n  hint: "
                         + _race_hint(str(races[0])))
    return True


_RACE = re.compile(r"race \((RAW|WAR|WAW)\) on [^:]*: thread \d+ \w+ it at (.+?), thread \d+ "
                   r"\w+ it at (.+?), (?:in a kernel|before the first|after cuda)")


def _race_hint(text: str) -> str:
    """What a race report most likely means (the report may come from the learner's
    process as text, so it is read from its words)."""
    m = _RACE.search(text)
    if m and m.group(1) == "WAW" and m.group(2) == m.group(3):
        return ("several threads write the same element at the same line: a barrier cannot "
                "order them, give each element one writer (e.g. threads 0 .. n-1 of the block "
                "copy its n values), or is the thread's part missing from the index?")
    return ("missing cuda.syncthreads()? Every thread must finish writing a shared tile before "
            "others read it, and finish reading it before anyone overwrites it. Or a barrier "
            "sits inside a branch some threads skip; with two buffers, does a step write the "
            "buffer it reads?")


def raised_at(e: BaseException) -> str:
    """Where the learner's code raised `e`: "\n  at line N of <your cell>: <source>" for the
    innermost frame of `e`'s traceback outside Python, NumPy, numba and this package, or ""."""
    import linecache
    import os

    skip = (os.path.dirname(os.__file__), os.path.dirname(os.path.dirname(__file__)),
            "site-packages", "dist-packages")
    found = None
    tb = e.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not any(s in name for s in skip):
            found = (name, tb.tb_lineno)
        tb = tb.tb_next
    # Numba's compile errors name the line in their text ('File "../x.py", line 6:'), a
    # path relative to Numba's folder: found in linecache by its file name
    for where, n in re.findall(r'File "([^"]+)", line (\d+)', str(e))[-1:]:
        if not any(s in where for s in skip):
            base = os.path.basename(where)
            key = next((k for k in list(linecache.cache) if os.path.basename(k) == base), where)
            found = (key, int(n))
    if found is None:
        return ""
    name, line = found
    text = linecache.getline(name, line).strip()
    cell = "your cell" if "ipykernel" in name or name.startswith("<") else os.path.basename(name)
    return f"\n  at line {line} of {cell}: {text[:120]}" if text else ""


def _value_call(task: str, fn, args: tuple, kwargs: dict, label: str):
    """Call the learner's fn on plain values (under the grader's guards); report a raise."""
    try:
        with learner_call(fn):
            return fn(*args, **kwargs)
    except CheckError:
        raise
    except Exception as e:  # noqa: BLE001  (the learner's exception is the failure)
        raise CheckError(f"{task} raised on {label}: {type(e).__name__}: {e}"
                         f"{raised_at(e)}") from e


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
