"""Speed grading on a GPU (``convlab grade --gpu``): a task's kernel against the course's.

Every task in `SPEED_TASKS` has a timed launcher; once the task's tests pass, the grader
times it against the course kernel of the same rung (a `convlab.kernels` ladder entry)
on one problem (`PROBLEMS`), in the learner's process on the same GPU, one cell per
call (`speed_worker`): fresh buffers and values for every repeat, from seeds drawn here
and revealed one repeat at a time; the L2 flushed before each call; CUDA events on the
default stream plus the worker's wall clock around the call and a device-wide
synchronize; the grader's own clock around every cell. After each call the grader draws
output and input indices, reads the values back and compares them with its own
reference (`sample_reference`), and the worker counts changed inputs and NaN/Inf.

What the worker reported goes through pure detectors (`DETECTORS`, one function per
known judge exploit, testable with made-up observations): wrong or replayed outputs,
inputs mutated in place, timers patched, work the timed stream did not see, time the
grader's clock saw but the events did not, the course kernel slowed by other work. Any
finding scores the speed part 0. Otherwise the speed is the course kernel's median
time over the learner's (capped by what the grader's clock allows) and `TIERS` turns
its share of the task's `par` into points.

Without a GPU every speed task is reported "not graded here" (0 of 0 points).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from .speed_worker import buffer_seed, values

# (at least this share of par speed, points, label), best first
TIERS = ((1.0, 3, "≥ 1.0× par"), (0.8, 2, "≥ 0.8× par"), (0.5, 1, "≥ 0.5× par"))
SPEED_POINTS = TIERS[0][1]
REPEATS = 10  # timed calls of the learner's kernel (and of the course kernel)
NOOP_REPEATS = 3  # the harness alone, for the grader's clock
REFILL_EVERY = 3  # every third learner repeat refills the previous repeat's buffers
OUT_SAMPLES = 256  # output elements checked per repeat (plus the corners)
IN_SAMPLES = 64  # input elements checked per input and repeat (plus the corners)
SLOW_CALL_S = 2.0  # a learner call slower than this is timed fewer times
NOT_GRADED = "not graded here: no CUDA GPU"


@dataclass(frozen=True)
class SpeedTask:
    """task: the exercise task; fn: the learner's launcher; problem: a `PROBLEMS` key;
    ladder, rung: the course kernel; par: the share of the course kernel's speed that
    counts as 1.0x for `TIERS` (the course kernels are tuned beyond what the task asks)."""

    task: str
    fn: str
    problem: str
    ladder: str
    rung: str
    par: float = 1.0


# par: about 0.9 of the solution's speed as a share of the course kernel's, measured on the
# H200 (``convlab grade solutions/NN_*.ipynb --gpu`` prints it; the run is kept in
# results/h200_grade_calibration_*.txt), so that the solution lands in the top tier.
SPEED_TASKS = {t.task: t for t in (
    SpeedTask("06.tiled_filter", "filter2d_shared", "filter", "FILTER_LADDER", "tiled", 0.55),
    SpeedTask("06.tiled_gemm", "conv2d_im2col", "conv", "CONV_LADDER", "tiled", 0.2),
    SpeedTask("07.gemm", "gemm_blocked", "gemm", "GEMM_LADDER", "register_blocked", 0.65),
    SpeedTask("07.multifilter", "conv2d_multifilter", "conv", "CONV_LADDER",
              "register_blocked", 0.12),
    SpeedTask("08.implicit", "conv2d_implicit", "conv", "CONV_LADDER", "implicit_gemm", 0.09),
    SpeedTask("08.nhwc", "conv2d_nhwc_implicit", "conv_nhwc", "CONV_LADDER", "implicit_gemm",
              0.1),
    SpeedTask("09.conflict_free", "gemm_v4", "gemm", "GEMM_LADDER", "vectorized", 0.7),
    SpeedTask("09.double_buffered", "gemm_db", "gemm", "GEMM_LADDER", "double_buffered", 0.23),
)}


# ----------------------------------------------------------------------------------------
# Problems: shapes, and the reference at sampled output indices


@dataclass(frozen=True)
class Problem:
    """kind: gemm | filter | conv | conv_nhwc; inputs, out: shapes; kwargs: the call's;
    host: inputs the course launcher takes as NumPy arrays; fixed: inputs whose values
    stay the same in every repeat (the filter taps, compiled into the course kernel);
    course: the problem the course kernel runs (its own layout), when not this one."""

    kind: str
    inputs: tuple
    out: tuple
    kwargs: dict = field(default_factory=dict)
    host: tuple = ()
    fixed: tuple = ()
    course: str | None = None

    def spec(self) -> dict:
        return {"inputs": [list(s) for s in self.inputs], "out": list(self.out),
                "kwargs": dict(self.kwargs), "host": list(self.host)}

    @property
    def flops(self) -> float:
        return 2.0 * math.prod(self.out) * reduction(self)


PROBLEMS = {
    "gemm": Problem("gemm", ((4096, 4096), (4096, 4096)), (4096, 4096)),
    "filter": Problem("filter", ((4096, 4096), (5, 5)), (4096, 4096), host=(1,), fixed=(1,)),
    "conv": Problem("conv", ((32, 64, 56, 56), (64, 64, 3, 3)), (32, 64, 56, 56),
                    {"stride": 1, "padding": 1}),
    "conv_nhwc": Problem("conv_nhwc", ((32, 56, 56, 64), (3, 3, 64, 64)), (32, 56, 56, 64),
                         {"stride": 1, "padding": 1}, course="conv"),
}


def reduction(p: Problem) -> int:
    """Products summed into one output element."""
    if p.kind == "gemm":
        return p.inputs[0][1]
    if p.kind == "filter":
        return p.inputs[1][0] * p.inputs[1][1]
    if p.kind == "conv":
        return math.prod(p.inputs[1][1:])
    return math.prod(p.inputs[1][:3])


def sample_reference(p: Problem, seeds, flat) -> tuple[np.ndarray, np.ndarray]:
    """(expected, sum of |products|) in float64 at the flat output indices `flat`, from
    the repeat's buffer seeds (inputs made by `values`)."""
    flat = np.asarray(flat, dtype=np.int64)
    idx = np.unravel_index(flat, p.out)

    def get(k, *index):
        shape = p.inputs[k]
        inside = np.ones(np.broadcast(*index).shape, bool)
        clipped = []
        for i, n in zip(index, shape, strict=True):
            inside &= (i >= 0) & (i < n)
            clipped.append(np.clip(i, 0, n - 1))
        v = values(seeds[k], np.ravel_multi_index(clipped, shape)).astype(np.float64)
        return np.where(inside, v, 0.0)

    if p.kind == "gemm":
        K = p.inputs[0][1]
        k = np.arange(K)[None, :]
        prod = get(0, idx[0][:, None], k) * get(1, k, idx[1][:, None])
    elif p.kind == "filter":
        R, S = p.inputs[1]
        r, s = np.meshgrid(np.arange(R), np.arange(S), indexing="ij")
        r, s = r.ravel()[None, :], s.ravel()[None, :]
        y, x = idx[0][:, None], idx[1][:, None]
        prod = get(0, y + r - R // 2, x + s - S // 2) * get(1, r, s)
    elif p.kind == "conv":
        _, C, R, S = p.inputs[1]
        pad = int(p.kwargs.get("padding", 0))
        c, r, s = (a.ravel()[None, :] for a in np.meshgrid(
            np.arange(C), np.arange(R), np.arange(S), indexing="ij"))
        n, k, y, x = (i[:, None] for i in idx)
        prod = get(0, n, c, y + r - pad, x + s - pad) * get(1, k, c, r, s)
    else:  # conv_nhwc: x (N, H, W, C), w (R, S, C, K), out (N, P, Q, K)
        R, S, C, _ = p.inputs[1]
        pad = int(p.kwargs.get("padding", 0))
        r, s, c = (a.ravel()[None, :] for a in np.meshgrid(
            np.arange(R), np.arange(S), np.arange(C), indexing="ij"))
        n, y, x, k = (i[:, None] for i in idx)
        prod = get(0, n, y + r - pad, x + s - pad, c) * get(1, r, s, c, k)
    return prod.sum(axis=1), np.abs(prod).sum(axis=1)


def sample_indices(rng: np.random.Generator, shape, n: int) -> np.ndarray:
    """n random flat indices of an array of `shape` plus its first and last elements."""
    size = math.prod(shape)
    return np.unique(np.concatenate([[0, size - 1], rng.integers(0, size, n)])).astype(np.int64)


# ----------------------------------------------------------------------------------------
# What the worker and the grader observed, and the detectors


@dataclass
class Repeat:
    """One timed call. who: learner | course | noop; event_ms: CUDA events on the timed
    stream; wall_ms: the worker's clock around the call and a device-wide synchronize;
    grader_ms: the grader's clock around the whole cell; flush_ms: the L2 flush, timed
    by the same events; patched: timing functions found replaced; refill: new values in
    the previous repeat's buffers; for learner repeats, the check after the call: bad
    outputs (of `checked`), changed inputs (sampled, and counted on the device), NaN/Inf
    in the whole output."""

    who: str
    event_ms: float
    wall_ms: float
    grader_ms: float
    flush_ms: float = 0.0
    patched: list = field(default_factory=list)
    refill: bool = False
    checked: int = 0
    bad: int = 0
    not_written: int = 0
    first_bad: str = ""
    inputs_changed: int = 0
    inputs_changed_device: int = 0
    nonfinite: int = 0
    warmup: bool = False  # the first call (compiles): checked, not timed


SIDE_STREAM_SLACK_MS = 1.0  # wall time a call may spend outside the timed stream...
SIDE_STREAM_SHARE = 0.5  # ...or this share of its wall time, whichever is more
HIDDEN_SLACK_MS = 5.0  # grader-clock time the events may miss (cell overhead noise)...
HIDDEN_SHARE = 0.5  # ...or this share of the course kernel's time, whichever is more
FLUSH_SLOWDOWN = 1.5  # the flush slower than this around the course kernel: interference
WALL_CAP = 1.5  # the speed may exceed what the grader's clock shows by this factor
WALL_MIN_MS = 2.0  # the grader's clock caps the speed only above this much kernel time


def _med(xs) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(xs) if xs else float("nan")


def _who(reps, who, warmup=False):
    """The timed repeats of `who` (and its warm-up call, with warmup=True)."""
    return [r for r in reps if r.who == who and (warmup or not r.warmup)]


def _label(r: Repeat, i: int) -> str:
    return "the warm-up call" if r.warmup else f"timed call {i}"


def _numbered(reps):
    """(label, repeat) of the learner's calls: the warm-up, then timed call 1, 2..."""
    out, i = [], 0
    for r in _who(reps, "learner", warmup=True):
        i += 0 if r.warmup else 1
        out.append((_label(r, i), r))
    return out


def detect_wrong_outputs(reps) -> str | None:
    """Outputs that differ from the reference after the call: skipped work, or results
    replayed from an earlier call (a refill repeat wrong while fresh ones are right)."""
    calls = _numbered(reps)
    bad = [(k, label, r) for k, (label, r) in enumerate(calls) if r.bad or r.nonfinite]
    if not bad:
        return None
    k, label, r = bad[0]
    if not r.bad:  # the sample missed it; the worker's count over the whole output did not
        return (f"{label}: {r.nonfinite} outputs are NaN or Inf (not written?); the output "
                "must be complete after every call")
    fresh_ok = any(not x.bad for _, x in calls if not x.refill)
    if r.refill and fresh_ok:
        why = ("the buffers of the call before held new values and the output was the old "
               "one: results replayed by input address")
    elif r.not_written == r.checked:
        why = "nothing was written: work skipped on a repeated call"
    elif k > 0 and not calls[0][1].bad:
        why = "the first call was right, a later one wrong: work skipped on repeats"
    else:
        why = "the output is wrong on the timing problem"
    return f"{label}: {r.bad} of {r.checked} checked outputs wrong ({r.first_bad}); {why}"


def detect_mutated_inputs(reps) -> str | None:
    """Inputs changed by the call (they must be read only)."""
    for label, r in _numbered(reps):
        n = max(r.inputs_changed, r.inputs_changed_device)
        if n:
            return (f"{label} changed {n} input element(s) in place: inputs must stay as "
                    "they were")
    return None


def detect_patched_timers(reps) -> str | None:
    """Timing functions replaced in the learner's process (the timer canary)."""
    names = sorted({n for r in reps for n in r.patched})
    if names:
        return ("timing functions were replaced in your process: " + ", ".join(names)
                + " (the grader keeps its own; replacing them is an exploit)")
    return None


def detect_side_stream(reps) -> str | None:
    """Work the timed stream did not see: the wall clock around the call and a
    device-wide synchronize much longer than its events."""
    for i, r in enumerate(_who(reps, "learner")):
        gap = r.wall_ms - r.event_ms
        if gap > max(SIDE_STREAM_SLACK_MS, SIDE_STREAM_SHARE * r.wall_ms):
            return (f"timed call {i + 1}: the events on the timed stream saw "
                    f"{r.event_ms:.3f} ms, the wall clock {r.wall_ms:.3f} ms: work on a "
                    "stream the timer does not see")
    return None


def _overhead(reps) -> float:
    """The harness' own time on the grader's clock (no-op calls)."""
    return _med([r.grader_ms for r in _who(reps, "noop")])


def detect_hidden_time(reps) -> str | None:
    """Time on the grader's own clock that the reported event times do not account for,
    for the learner's calls and (the canary) for the course kernel's."""
    base = _overhead(reps)
    course = _med([r.event_ms for r in _who(reps, "course")])
    if not math.isfinite(base) or not math.isfinite(course):
        return None
    limit = max(HIDDEN_SLACK_MS, HIDDEN_SHARE * course)
    for who, what in (("course", "the course kernel's calls (the timer canary)"),
                      ("learner", "your kernel's calls")):
        rs = _who(reps, who)
        hidden = _med([r.grader_ms - base for r in rs]) - _med([r.event_ms for r in rs])
        if hidden > limit:
            return (f"the grader's clock saw {hidden:.2f} ms per call more than the "
                    f"reported times of {what}: timers forged, or work hidden from them")
    return None


def detect_interference(reps) -> str | None:
    """The course kernel's repeats slowed by other GPU work (the L2 flush, the same in
    every repeat, took longer around them than around the learner's)."""
    fc = _med([r.flush_ms for r in _who(reps, "course")])
    fl = _med([r.flush_ms for r in _who(reps, "learner")])
    if math.isfinite(fc) and math.isfinite(fl) and fc > FLUSH_SLOWDOWN * fl + 0.05:
        return (f"the L2 flush took {fc:.3f} ms around the course kernel and {fl:.3f} ms "
                "around yours: other GPU work ran while the course kernel was timed")
    return None


DETECTORS = (detect_wrong_outputs, detect_mutated_inputs, detect_patched_timers,
             detect_side_stream, detect_hidden_time, detect_interference)


def findings(reps) -> list[str]:
    return [m for d in DETECTORS if (m := d(reps))]


def measured_speed(reps) -> tuple[float, float, float]:
    """(speed, course ms, learner ms): the course kernel's median event time over the
    learner's, capped at WALL_CAP times the same ratio on the grader's clock."""
    tc = _med([r.event_ms for r in _who(reps, "course")])
    tl = _med([r.event_ms for r in _who(reps, "learner")])
    if not (tl > 0 and tc > 0):
        return 0.0, tc, tl
    speed = tc / tl
    base = _overhead(reps)
    wc = _med([r.grader_ms for r in _who(reps, "course")]) - base
    wl = _med([r.grader_ms for r in _who(reps, "learner")]) - base
    if math.isfinite(base) and wc > WALL_MIN_MS and wl > 0:
        speed = min(speed, WALL_CAP * wc / wl)
    return speed, tc, tl


def tier(share: float) -> tuple[int, str]:
    """(points, label) for a speed that is `share` of par."""
    for threshold, points, label in TIERS:
        if share >= threshold:
            return points, label
    return 0, f"< {TIERS[-1][0]:g}× par"


# ----------------------------------------------------------------------------------------
# Results


@dataclass
class SpeedResult:
    task: str
    max_score: float
    score: float = 0.0
    kind: str = "not-graded"  # graded | exploit | not-timed | not-graded
    message: str = ""
    speed: float | None = None  # x the course kernel
    share: float | None = None  # of par
    course_ms: float | None = None
    learner_ms: float | None = None
    course: str = ""
    gflops: float | None = None

    @property
    def id(self) -> str:
        return f"{self.task} speed"

    @property
    def passed(self) -> bool:
        return self.kind == "graded" and self.score > 0

    def line(self) -> str:
        if self.kind == "graded":
            return (f"{self.speed:.2f}× {self.course} ({self.learner_ms:.3f} ms vs "
                    f"{self.course_ms:.3f} ms), {self.share:.2f}× par: {self.message}")
        return self.message


def not_graded(task_ids, reason: str = NOT_GRADED) -> list[SpeedResult]:
    """The speed part of each task in `task_ids` that has one, reported as not graded."""
    return [SpeedResult(t, 0.0, kind="not-graded", message=reason)
            for t in task_ids if t in SPEED_TASKS]


def verdict(st: SpeedTask, reps) -> SpeedResult:
    """Score one task's speed from its observations (warm-up calls included)."""
    course = f"{st.ladder}[{st.rung!r}]"
    res = SpeedResult(st.task, SPEED_POINTS, course=course)
    found = findings(reps)
    if found:
        res.kind, res.message = "exploit", "speed scores 0: " + "; ".join(found)
        return res
    speed, tc, tl = measured_speed(reps)
    res.speed, res.course_ms, res.learner_ms = speed, tc, tl
    res.share = speed / st.par
    points, label = tier(res.share)
    res.kind, res.score, res.message = "graded", float(points), f"tier {label}"
    if tl > 0:
        res.gflops = PROBLEMS[st.problem].flops / (tl * 1e6)
    return res


def leaderboard(speeds) -> list[dict]:
    """Gradescope leaderboard entries: speed (x course kernel, higher first) and time."""
    out = []
    for s in speeds:
        if s.kind == "not-graded":
            continue
        ok = s.kind == "graded"
        out.append({"name": f"{s.task} speed (× course kernel)",
                    "value": round(s.speed, 3) if ok else 0, "order": "desc"})
        out.append({"name": f"{s.task} time (ms)",
                    "value": round(s.learner_ms, 4) if ok else 1e9, "order": "asc"})
    return out


# ----------------------------------------------------------------------------------------
# Running it: one cell per call through the grading channel


class _Run:
    """The cells of one task's timing, with the grader's clock around each."""

    def __init__(self, channel, st: SpeedTask, rng: np.random.Generator):
        self.ch, self.st, self.rng = channel, st, rng
        self.p = PROBLEMS[st.problem]
        self.cp = PROBLEMS[self.p.course] if self.p.course else self.p
        self.lost = False  # the learner's process timed out or died

    def cell(self, op: str, req: dict, timeout: float) -> tuple[dict, float]:
        from . import wire

        ch = self.ch
        ch.n += 1
        n = ch.n
        enc = wire.Encoder(ch.inbox, f"q{n}")
        req = {k: (enc(v) if isinstance(v, np.ndarray) else v) for k, v in req.items()}
        if "inputs" in req and isinstance(req["inputs"], list):
            req["inputs"] = [enc(v) if isinstance(v, np.ndarray) else v for v in req["inputs"]]
        with open(os.path.join(ch.inbox, f"req-{n}.json"), "w", encoding="utf-8") as f:
            json.dump(req, f)
        line = (f"__import__('convlab.grading.speed_worker', fromlist=['w']).{op}({n})\n")
        old = ch.deadline
        ch.deadline = time.perf_counter() + timeout
        t0 = time.perf_counter()
        try:
            ch._run(line)
            ms = (time.perf_counter() - t0) * 1e3
            reply = ch._reply(n)
            if reply.get("ok") and op == "verify":
                dec = wire.Decoder(ch.outbox, 1 << 26)
                reply["out"] = dec(reply.get("out"))
                reply["inputs"] = [dec(v) for v in reply.get("inputs") or []]
        finally:
            ch.deadline = old
            ch._clean(n)
        if not reply.get("ok"):
            from .remote import learner_error

            raise learner_error(reply.get("ename", "Error"), reply.get("evalue", ""))
        return reply, ms

    def setup(self, timeout):
        fixed = {str(i): secrets.randbits(32) for i in self.p.fixed}
        self.fixed = fixed
        self.cell("setup", {"task": self.st.task, "fn": self.st.fn, "ladder": self.st.ladder,
                            "rung": self.st.rung, "fixed": fixed,
                            "problems": {"learner": self.p.spec(), "course": self.cp.spec()}},
                  timeout)

    def repeat(self, who: str, timeout: float, refill: bool = False) -> Repeat:
        seed = secrets.randbits(32)
        reply, ms = self.cell("repeat", {"task": self.st.task, "who": who, "seed": seed,
                                         "refill": refill}, timeout)
        r = Repeat(who, float(reply.get("event_ms", float("nan"))),
                   float(reply.get("wall_ms", float("nan"))), ms,
                   float(reply.get("flush_ms", float("nan"))),
                   [str(x) for x in reply.get("patched") or []][:20], refill)
        if who == "learner":
            self.check(r, seed, timeout)
        return r

    def check(self, r: Repeat, seed: int, timeout: float) -> None:
        from convlab.check.core import compare

        p = self.p
        seeds = [int(self.fixed.get(str(i), buffer_seed(seed, i))) for i in range(len(p.inputs))]
        out_idx = sample_indices(self.rng, p.out, OUT_SAMPLES)
        in_idx = [sample_indices(self.rng, s, IN_SAMPLES) for s in p.inputs]
        reply, _ = self.cell("verify", {"task": self.st.task, "out": out_idx,
                                        "inputs": in_idx}, timeout)
        got = np.asarray(reply["out"], dtype=np.float32)
        expected, absref = sample_reference(p, seeds, out_idx)
        if got.shape != expected.shape:
            r.bad = r.checked = len(out_idx)
            r.first_bad = "the worker sent the wrong number of values"
            return
        c = compare(got, expected, absref, reduction=reduction(p))
        r.checked, r.bad, r.not_written = len(out_idx), c.bad, c.not_written
        if c.bad:
            k = c.first_bad[0]
            where = tuple(int(i) for i in np.unravel_index(out_idx[k], p.out))
            r.first_bad = f"first at {where}: got {float(got[k]):.6g}, expected " \
                          f"{float(expected[k]):.6g}"
        for k, (vals, idx) in enumerate(zip(reply["inputs"], in_idx, strict=True)):
            want = values(seeds[k], idx)
            v = np.asarray(vals, dtype=np.float32)
            r.inputs_changed += int(np.sum(v.view(np.uint32) != want.view(np.uint32))) if \
                v.shape == want.shape else len(idx)
        r.inputs_changed_device = int(sum(int(x) for x in reply.get("changed") or []))
        r.nonfinite = int(reply.get("nonfinite") or 0)
        r.patched = sorted(set(r.patched) | {str(x) for x in reply.get("patched") or []})

    def forget(self, timeout):
        from .remote import KernelLost

        try:
            self.cell("forget", {"task": self.st.task}, timeout)
        except (Exception, KernelLost):  # noqa: BLE001
            self.lost = True


def time_task(channel, st: SpeedTask, deadline: float, cell_timeout: float) -> SpeedResult:
    """Time one task's kernel against the course kernel (the task's tests passed)."""
    from .remote import KernelLost

    rng = np.random.default_rng(secrets.randbits(64))
    run = _Run(channel, st, rng)

    def left():
        return max(1.0, min(cell_timeout, deadline - time.perf_counter()))

    reps: list[Repeat] = []
    try:
        run.setup(left())
        for who in ("learner", "course"):  # warm-up calls: compile; the learner's is checked
            reps.append(run.repeat(who, left()))
            reps[-1].warmup = True
        n = REPEATS
        for i in range(REPEATS):
            if i >= n or time.perf_counter() > deadline:
                break
            if i < NOOP_REPEATS:
                reps.append(run.repeat("noop", left()))
            reps.append(run.repeat("course", left()))
            reps.append(run.repeat("learner", left(), refill=(i % REFILL_EVERY ==
                                                              REFILL_EVERY - 1)))
            if reps[-1].grader_ms > SLOW_CALL_S * 1e3:  # a slow kernel: fewer calls
                n = min(n, REFILL_EVERY)
    except KernelLost as e:
        run.lost = True
        what = "timed out" if e.kind == "timeout" else "died"
        return SpeedResult(st.task, SPEED_POINTS, kind="not-timed",
                           message=f"not timed: the learner's process {what} while timed")
    except Exception as e:  # noqa: BLE001  (the learner's launcher raised on the problem)
        return SpeedResult(st.task, SPEED_POINTS, kind="not-timed",
                           message=f"not timed: {type(e).__name__}: {e}"[:600])
    finally:
        if not run.lost:
            run.forget(5.0)
    if not _who(reps, "learner"):
        return SpeedResult(st.task, SPEED_POINTS, kind="not-timed",
                           message="not timed: the time limit was reached")
    return verdict(st, reps)


def grade_speed(channel, tasks: dict, deadline: float, cell_timeout: float) -> list:
    """The speed part of every task of `tasks` (id -> TaskResult) that has one."""
    out = []
    lost = False
    for tid, t in tasks.items():
        st = SPEED_TASKS.get(tid)
        if st is None:
            continue
        if lost:
            out.append(SpeedResult(tid, SPEED_POINTS, kind="not-timed", message=(
                "not timed: the learner's process was lost timing an earlier task")))
            continue
        if not t.passed:
            out.append(SpeedResult(tid, SPEED_POINTS, kind="not-timed",
                                   message="not timed: the task's tests did not pass"))
            continue
        out.append(time_task(channel, st, deadline, cell_timeout))
        lost = out[-1].message.startswith("not timed: the learner's process")
    return out
