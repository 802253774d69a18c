"""Speed grading: tiers, leaderboard, the "not graded here" path, the exploit detectors
(fed made-up observations), the input generator and sampled reference; on a GPU
(``-m gpu``), `grade(..., speed=True)` on lesson 07's GEMM task: the solution, a slow
correct answer, and one exploit per family of tests/data/speed/exploit_*.py.
"""

from __future__ import annotations

import json
import math
import re
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from convlab import reference as ref
from convlab.grading import notebook as nbf
from convlab.grading import speed
from convlab.grading.grade import GradeResult, TaskResult
from convlab.grading.gradescope import results_json
from convlab.grading.speed import Problem, Repeat, SpeedResult, SpeedTask
from convlab.grading.speed_worker import buffer_seed, values

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "speed"
SOLUTION = ROOT / "solutions" / "07_register_blocking.ipynb"
TASK = "07.gemm"


# ----------------------------------------------------------------------------------------
# Inputs and the sampled reference


def test_values_are_exact_and_differ_per_seed():
    v = values(12345, np.arange(100_000))
    assert v.dtype == np.float32 and v.min() >= -1 and v.max() < 1
    assert len(np.unique(v)) > 99_000  # non-uniform: almost no repeats
    assert not np.array_equal(v, values(12346, np.arange(100_000)))
    assert np.array_equal(values(12345, [7, 99_999]), v[[7, 99_999]])
    assert buffer_seed(5, 0) != buffer_seed(5, 1) != buffer_seed(6, 1)


def test_device_kernels_match_the_host_generator():
    from numba import cuda

    from convlab.grading import speed_worker as sw

    a = cuda.device_array(37, np.float32)
    sw.fill_values(a, 99)
    host = a.copy_to_host()
    assert np.array_equal(host.view(np.uint32), values(99, np.arange(37)).view(np.uint32))
    assert sw.count_changed(a, 99) == 0
    assert np.array_equal(sw.gather_values(a, np.array([36, 0, 5])), host[[36, 0, 5]])
    host[3], host[30] = 0.5, np.nan
    b = cuda.to_device(host)
    assert sw.count_changed(b, 99) == 2
    assert sw.count_nonfinite(b) == 1
    o = cuda.device_array(5, np.float32)
    sw.kernels()["poison"][sw._grid(5)](o.view(np.uint32))
    assert np.all(o.copy_to_host().view(np.uint32) == sw.POISON_BITS)
    from convlab.check import POISON_BITS

    assert sw.POISON_BITS == int(POISON_BITS)


SMALL = {
    "gemm": Problem("gemm", ((7, 5), (5, 6)), (7, 6)),
    "filter": Problem("filter", ((9, 11), (3, 5)), (9, 11)),
    "conv": Problem("conv", ((2, 3, 6, 7), (4, 3, 3, 3)), (2, 4, 6, 7), {"padding": 1}),
    "conv_nhwc": Problem("conv_nhwc", ((2, 6, 7, 3), (3, 3, 3, 4)), (2, 6, 7, 4),
                         {"padding": 1}),
}


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_sample_reference_is_the_reference(kind):
    p = SMALL[kind]
    seeds = [buffer_seed(777, k) for k in range(2)]
    a, b = (values(s, np.arange(math.prod(sh))).reshape(sh).astype(np.float64)
            for s, sh in zip(seeds, p.inputs, strict=True))
    if kind == "gemm":
        want = a @ b
    elif kind == "filter":
        want = ref.filter2d(a, b)
    elif kind == "conv":
        want = ref.conv2d(a, b, padding=1)
    else:
        want = ref.conv2d(a.transpose(0, 3, 1, 2), b.transpose(3, 2, 0, 1),
                          padding=1).transpose(0, 2, 3, 1)
    flat = np.arange(math.prod(p.out))
    got, absref = speed.sample_reference(p, seeds, flat)
    assert np.allclose(got, want.ravel(), rtol=1e-12, atol=1e-12)
    assert np.all(absref >= np.abs(got) - 1e-12) and np.all(absref > 0)


def test_sample_indices_hold_the_corners():
    idx = speed.sample_indices(np.random.default_rng(1), (13, 17), 20)
    assert idx[0] == 0 and idx[-1] == 13 * 17 - 1 and np.all(np.diff(idx) > 0)


def test_speed_tasks_name_real_rungs():
    for st in speed.SPEED_TASKS.values():
        assert st.problem in speed.PROBLEMS and 0 < st.par <= 1
        assert st.ladder in ("GEMM_LADDER", "CONV_LADDER", "FILTER_LADDER")
    import convlab.kernels as K

    for st in speed.SPEED_TASKS.values():
        assert st.rung in getattr(K, st.ladder), st


def test_each_exercise_notebook_says_which_of_its_tasks_are_timed_and_for_how_much():
    by_lesson: dict = {}
    for tid in speed.SPEED_TASKS:
        by_lesson.setdefault(tid.split(".")[0], []).append(tid)
    for lesson, tasks in by_lesson.items():
        (path,) = (ROOT / "exercises").glob(f"{lesson}_*.ipynb")
        text = " ".join(" ".join("".join(c["source"]).split())
                        for c in json.loads(path.read_text())["cells"]
                        if c["cell_type"] == "markdown")
        said = re.search(r"Graded on a GPU .*?tasks (.*?) are also timed .*?up to (\d+) more "
                         r"points each, in tiers at ([0-9.,and ]+?) of a par speed", text)
        assert said, f"{path.name} does not say which of its tasks are timed"
        assert sorted(re.findall(r"`(\d\d\.\w+)`", said.group(1))) == sorted(tasks)
        assert int(said.group(2)) == speed.SPEED_POINTS
        assert (sorted(float(v) for v in re.findall(r"\d+(?:\.\d+)?", said.group(3)))
                == sorted(t for t, _, _ in speed.TIERS))


# ----------------------------------------------------------------------------------------
# Tiers and the verdict


def test_tiers():
    assert speed.tier(1.0)[0] == 3 and speed.tier(7.0)[0] == 3
    assert speed.tier(0.999)[0] == 2 and speed.tier(0.8)[0] == 2
    assert speed.tier(0.79)[0] == 1 and speed.tier(0.5)[0] == 1
    assert speed.tier(0.49)[0] == 0 and speed.tier(0.0)[0] == 0
    assert speed.SPEED_POINTS == max(p for _, p, _ in speed.TIERS)


def honest(course_ms=8.0, learner_ms=4.0, n=6, overhead=3.0, flush=0.05):
    """Observations of an honest answer (times in ms; the grader's clock adds overhead)."""
    reps = [Repeat("noop", 0.01, 0.1, overhead, flush) for _ in range(3)]
    for i in range(n):
        jitter = 1 + 0.01 * ((i * 7) % 5)
        reps.append(Repeat("course", course_ms * jitter, course_ms * jitter + 0.1,
                           overhead + course_ms * jitter + 0.1, flush))
        reps.append(Repeat("learner", learner_ms * jitter, learner_ms * jitter + 0.2,
                           overhead + learner_ms * jitter + 0.2, flush, refill=i % 3 == 2,
                           checked=258))
    return reps


ST = SpeedTask("t.gemm", "f", "gemm", "GEMM_LADDER", "register_blocked", par=0.5)


def test_honest_observations_find_nothing_and_score_by_tier():
    assert speed.findings(honest()) == []
    r = speed.verdict(ST, honest(course_ms=8.0, learner_ms=4.0))  # 2x course = 4x par
    assert r.kind == "graded" and r.score == 3 and r.speed == pytest.approx(2.0, rel=0.02)
    r = speed.verdict(ST, honest(course_ms=8.0, learner_ms=12.0))  # 0.67x = 1.33 par
    assert r.score == 3
    r = speed.verdict(ST, honest(course_ms=8.0, learner_ms=18.0))  # 0.44x = 0.89 par
    assert r.score == 2 and r.share == pytest.approx(0.889, rel=0.02)
    r = speed.verdict(ST, honest(course_ms=8.0, learner_ms=30.0))  # 0.27x = 0.53 par
    assert r.score == 1
    r = speed.verdict(ST, honest(course_ms=8.0, learner_ms=90.0))
    assert r.score == 0 and r.kind == "graded" and "< 0.5" in r.message


def test_the_grader_clock_caps_the_speed():
    reps = honest(course_ms=8.0, learner_ms=8.0)
    for r in reps:
        if r.who == "learner":  # events claim 4x faster than the grader's clock saw
            r.event_ms /= 4
            r.wall_ms = r.event_ms + 0.1
    s, _, _ = speed.measured_speed(reps)
    assert s == pytest.approx(speed.WALL_CAP, rel=0.05)


def _only(reps, detector, *also):
    """What `detector` found; no detector fires but it (and those in `also`)."""
    found = {d.__name__ for d in speed.DETECTORS if d(reps)}
    assert detector.__name__ in found and found <= {detector.__name__,
                                                    *(d.__name__ for d in also)}, found
    return detector(reps)


def test_detects_replay_by_address():
    reps = honest()
    for r in reps:
        if r.refill:
            r.bad, r.first_bad = 250, "first at (0, 3): got 1, expected 2"
    msg = _only(reps, speed.detect_wrong_outputs)
    assert re.search(r"replayed by input address", msg)


def test_detects_skipped_work():
    reps = honest()
    learner = [r for r in reps if r.who == "learner"]
    for r in learner[1:]:
        r.bad = r.not_written = r.checked
    msg = _only(reps, speed.detect_wrong_outputs)
    assert re.search(r"timed call 2: .*nothing was written", msg)
    for r in learner[1:]:
        r.not_written = 3  # partly written: skipped on repeats
    assert re.search(r"later one wrong: work skipped", speed.detect_wrong_outputs(reps))


def test_detects_partial_work_the_sample_missed():
    reps = honest()
    [r for r in reps if r.who == "learner"][3].nonfinite = 17
    assert re.search(r"timed call 4: 17 outputs are NaN", _only(reps, speed.detect_wrong_outputs))


def test_detects_mutated_inputs():
    reps = honest()
    [r for r in reps if r.who == "learner"][2].inputs_changed_device = 4096
    assert re.search(r"timed call 3 changed 4096 input", _only(reps, speed.detect_mutated_inputs))
    reps = honest()
    [r for r in reps if r.who == "learner"][0].inputs_changed = 1  # only seen in the sample
    assert speed.detect_mutated_inputs(reps)


def test_detects_patched_timers():
    reps = honest()
    reps[5].patched = ["Event.elapsed_time", "time.perf_counter"]
    msg = _only(reps, speed.detect_patched_timers)
    assert "Event.elapsed_time" in msg and "time.perf_counter" in msg


def test_detects_side_streams():
    reps = honest()
    for r in reps:
        if r.who == "learner":
            r.event_ms = 0.02  # the events saw nothing, the device-wide sync waited
    # the grader's own clock may see the missing time too
    msg = _only(reps, speed.detect_side_stream, speed.detect_hidden_time)
    assert re.search(r"stream the timer does not see", msg)


def test_detects_time_hidden_from_the_events_by_the_grader_clock():
    reps = honest(learner_ms=12.0)
    for r in reps:
        if r.who == "learner":  # worker's events and clock both forged to a quarter
            r.event_ms, r.wall_ms = r.event_ms / 4, r.wall_ms / 4
    msg = _only(reps, speed.detect_hidden_time)
    assert "your kernel" in msg
    reps = honest()
    for r in reps:  # every timer forged: the course kernel (the canary) gives it away
        r.event_ms, r.wall_ms = r.event_ms / 4, r.wall_ms / 4
    assert "timer canary" in speed.detect_hidden_time(reps)


def test_detects_a_slowed_course_kernel():
    reps = honest()
    for r in reps:
        if r.who == "course":
            r.flush_ms = 0.4
    assert re.search(r"other GPU work", _only(reps, speed.detect_interference))


def test_exploit_scores_zero():
    reps = honest(learner_ms=1.0)
    reps[-1].patched = ["cuda.event"]
    r = speed.verdict(ST, reps)
    assert r.kind == "exploit" and r.score == 0 and r.max_score == speed.SPEED_POINTS


# ----------------------------------------------------------------------------------------
# results.json, the leaderboard, "not graded here"


def _result(speeds):
    t = TaskResult(TASK, 4, 4, True, "passed")
    return GradeResult("sub.ipynb", "07_register_blocking.ipynb", [t], speed=speeds)


def test_results_json_has_speed_tests_and_leaderboard():
    graded = speed.verdict(ST, honest(course_ms=8.0, learner_ms=10.0))
    exploit = SpeedResult("t.conv", speed.SPEED_POINTS, kind="exploit",
                          message="speed scores 0: replayed")
    res = _result([graded, exploit])
    data = json.loads(json.dumps(results_json(res), allow_nan=False))
    tests = {t["name"]: t for t in data["tests"]}
    assert tests["t.gemm speed"]["score"] == 3 and tests["t.gemm speed"]["max_score"] == 3
    assert tests["t.conv speed"]["score"] == 0 and tests["t.conv speed"]["status"] == "failed"
    assert data["score"] == 4 + 3 and data["extra_data"]["max_score"] == 4 + 6
    board = {e["name"]: e for e in data["leaderboard"]}
    assert board["t.gemm speed (× course kernel)"]["value"] == pytest.approx(0.8, rel=0.03)
    assert board["t.gemm speed (× course kernel)"]["order"] == "desc"
    assert board["t.gemm time (ms)"]["order"] == "asc"
    assert board["t.conv speed (× course kernel)"]["value"] == 0
    assert data["extra_data"]["speed"]["t.gemm"]["kind"] == "graded"
    assert "t.gemm speed" in res.summary() and "tier" in res.summary()


def test_not_graded_is_zero_of_zero_and_labelled():
    sp = speed.not_graded([TASK, "fx.box", "09.double_buffered"])
    assert [s.task for s in sp] == [TASK, "09.double_buffered"]
    data = json.loads(json.dumps(results_json(_result(sp)), allow_nan=False))
    t = {x["name"]: x for x in data["tests"]}[f"{TASK} speed"]
    assert t["score"] == 0 and t["max_score"] == 0 and "status" not in t
    assert t["output"] == "not graded here: no CUDA GPU"
    assert "leaderboard" not in data and data["extra_data"]["max_score"] == 4
    assert "not graded here: no CUDA GPU" in _result(sp).summary()


def test_grading_without_a_gpu_reports_speed_not_graded(tmp_path):
    from convlab.grading.grade import grade

    path = tmp_path / "07.ipynb"
    path.write_text(nbf.writes(nbf.exercise_notebook(nbf.read(SOLUTION), SOLUTION.stem)))
    res = grade(path, SOLUTION, mode="sim", speed=True, cell_timeout=60)
    assert res.error is None and res.score == 0
    sp = {s.task: s for s in res.speed}
    assert TASK in sp and sp[TASK].kind == "not-graded" and sp[TASK].max_score == 0
    data = results_json(res)
    t = {x["name"]: x for x in data["tests"]}[f"{TASK} speed"]
    assert (t["score"], t["max_score"], t["output"]) == (0, 0, "not graded here: no CUDA GPU")
    assert data["extra_data"]["max_score"] == sum(x.max_score for x in res.tasks)


def test_gpu_autograder_bundle_installs_gpu_extras_and_grades_with_gpu(tmp_path):
    import zipfile

    from convlab.grading.gradescope import write_autograder

    for gpu in (False, True):
        out = tmp_path / f"ag{gpu}.zip"
        write_autograder(out, ROOT, notebooks=["07"], gpu=gpu)
        with zipfile.ZipFile(out) as z:
            setup, run = z.read("setup.sh").decode(), z.read("run_autograder").decode()
        assert ("convlab_src[gpu]" in setup) is gpu and ("--gpu" in run) is gpu
        assert "--assignment 07_register_blocking" in run


def test_gpu_flag_without_a_gpu_says_why(monkeypatch):
    from convlab import __main__ as cli
    from convlab import runtime

    monkeypatch.setattr(runtime, "gpu_available", lambda: False)
    monkeypatch.setattr(runtime, "driver_info", lambda: {"gpus": 0, "error": "no driver"})
    args = Namespace(gpu=True, mode="sim")
    assert cli._speed_mode(args) == "not graded here: no CUDA GPU (no driver)"
    assert args.mode == "sim"
    assert cli._speed_mode(Namespace(gpu=False, mode="sim")) is None


# ----------------------------------------------------------------------------------------
# On a GPU: lesson 07's GEMM task, graded with --gpu


MARKER = re.compile(r"^\s*### (BEGIN|END) (SOLUTION|HOLE)\b.*$\n?", re.M)


def solution_answer() -> str:
    """The solution's 07.gemm answer cell, without its markers."""
    for c in nbf.read(SOLUTION).cells:
        if c.get("cell_type") == "code" and nbf.exercise_id(nbf.source(c)) == TASK:
            return MARKER.sub("", nbf.source(c))
    raise AssertionError(f"no {TASK} cell in {SOLUTION}")


def submission(dest: Path, before: str = "", after: str = "") -> Path:
    """The exercise notebook with the solution's 07.gemm answer, with extra code before
    (after the ``# EXERCISE:`` line) and after it."""
    nb = nbf.exercise_notebook(nbf.read(SOLUTION), SOLUTION.stem)
    first, _, rest = solution_answer().partition("\n")
    text = f"{first}\n{before}\n{rest}\n{after}\n"
    for c in nb.cells:
        if c.get("cell_type") == "code" and nbf.exercise_id(nbf.source(c)) == TASK:
            c["source"] = text
    dest.write_text(nbf.writes(nb), encoding="utf-8")
    return dest


def fixture(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def grade_gpu(path: Path, monkeypatch):
    from convlab.grading.grade import grade

    monkeypatch.setattr(speed, "REPEATS", 6)
    res = grade(path, SOLUTION, mode="gpu", speed=True, cell_timeout=120, total_timeout=300)
    assert res.error is None, res.summary()
    task = {t.id: t for t in res.tasks}[TASK]
    sp = {s.task: s for s in res.speed}[TASK]
    return res, task, sp


@pytest.mark.gpu
def test_gpu_solution_scores_the_top_tier(tmp_path, monkeypatch):
    res, task, sp = grade_gpu(submission(tmp_path / "solution.ipynb"), monkeypatch)
    assert task.passed, res.summary()
    assert sp.kind == "graded" and sp.score == speed.SPEED_POINTS, (
        f"{sp.line()} (set SPEED_TASKS[{TASK!r}].par to the measured share x par if the "
        "solution is right)")
    data = json.loads(json.dumps(results_json(res), allow_nan=False))
    names = {e["name"] for e in data["leaderboard"]}
    assert f"{TASK} speed (× course kernel)" in names and f"{TASK} time (ms)" in names
    print(res.summary())


@pytest.mark.gpu
def test_gpu_slow_correct_answer_scores_a_lower_tier(tmp_path, monkeypatch):
    path = submission(tmp_path / "slow.ipynb", before=fixture("slow_small_blocks.py"))
    res, task, sp = grade_gpu(path, monkeypatch)
    assert task.passed, res.summary()
    assert sp.kind == "graded" and sp.score < speed.SPEED_POINTS, sp.line()
    print(res.summary())


EXPLOITS = {
    "exploit_replay.py": r"replayed by input address",
    "exploit_skip.py": r"nothing was written|skipped",
    "exploit_side_stream.py": r"stream the timer does not see|grader's clock saw",
    "exploit_mutate.py": r"changed \d+ input element",
    "exploit_timer.py": r"timing functions were replaced.*Event\.elapsed_time",
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(EXPLOITS))
def test_gpu_exploit_scores_zero_for_speed(tmp_path, monkeypatch, name):
    path = submission(tmp_path / name.replace(".py", ".ipynb"), after=fixture(name))
    res, task, sp = grade_gpu(path, monkeypatch)
    assert task.passed, res.summary()  # the exploit passes the tests, so it is timed
    assert sp.score == 0 and sp.kind == "exploit", sp.line()
    assert re.search(EXPLOITS[name], sp.message), sp.message


# ----------------------------------------------------------------------------------------
# The timing cells end to end, in this process under the simulator: the grader's side
# (`speed.time_task`) through a real Channel and files, the worker's side with its clocks
# replaced by the host clock (the simulator has no events)


class _InProcess:
    """A kernel session that runs the grader's one-line cells here."""

    def run(self, source, timeout):
        from convlab.grading.kernel import CellRun

        exec(source, {})
        return CellRun("ok")


def _host_gemm(a, b, out):
    out.copy_to_device(a.copy_to_host() @ b.copy_to_host())
    return out


def _learners():
    seen, replay = set(), {}

    def skip(a, b, out):
        if a.shape in seen:
            return out
        seen.add(a.shape)
        return _host_gemm(a, b, out)

    def by_address(a, b, out):
        key = (id(a), id(b))  # the simulator's arrays have no device address
        if key not in replay:
            replay[key] = _host_gemm(a, b, out).copy_to_host()
        out.copy_to_device(replay[key])
        return out

    def mutate(a, b, out):
        _host_gemm(a, b, out)
        a.copy_to_device(np.zeros(a.shape, np.float32))
        return out

    def wrong(a, b, out):
        _host_gemm(a, b, out)
        host = out.copy_to_host()
        host[1, :] += 1.0  # a whole row: the sample finds it (one element is the tests' job)
        out.copy_to_device(host)
        return out

    def raises(a, b, out):
        raise ValueError("this launcher refuses 24x16")

    return {"honest": (_host_gemm, "graded", r"tier"),
            "skip": (skip, "exploit", r"^speed scores 0: timed call 1: .*nothing was written"),
            "replay": (by_address, "exploit", r"replayed by input address"),
            "mutate": (mutate, "exploit", r"the warm-up call changed \d+ input element"),
            "wrong": (wrong, "exploit", r"\d+ of \d+ checked outputs wrong \(first at \(1, \d+\)"),
            "raises": (raises, "not-timed", r"ValueError: this launcher refuses")}


def test_timing_harness_that_did_not_start_says_why(tmp_path, monkeypatch):
    import time

    from convlab.grading import speed_worker as sw
    from convlab.grading.remote import Channel

    for d in ("in", "out"):
        (tmp_path / d).mkdir()
    monkeypatch.setattr(sw, "_T", {})
    monkeypatch.setattr(sw, "INSTALL_ERROR", ["CudaSupportError: no device"])
    monkeypatch.setattr(sw, "_IO", {"inbox": str(tmp_path / "in"),
                                    "outbox": str(tmp_path / "out")})
    st = SpeedTask("t.gemm", "my_gemm", "gemm", "GEMM_LADDER", "register_blocked")
    ch = Channel(_InProcess(), tmp_path / "in", tmp_path / "out")
    res = speed.time_task(ch, st, time.perf_counter() + 30, 10)
    assert res.kind == "not-timed" and res.score == 0 and res.max_score == speed.SPEED_POINTS
    assert "timing harness did not start: CudaSupportError: no device" in res.message


@pytest.mark.parametrize("name", sorted(_learners()))
def test_timing_cells_end_to_end(tmp_path, monkeypatch, name):
    import time

    from numba import cuda

    from convlab.grading import speed_worker as sw
    from convlab.grading.remote import Channel

    fn, kind, pattern = _learners()[name]
    inbox, outbox = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    outbox.mkdir()
    clock: dict = {}

    class Ev:
        def __init__(self, h):
            self.handle = h

    monkeypatch.setattr(speed, "PROBLEMS", {"gemm": Problem("gemm", ((24, 16), (16, 20)),
                                                            (24, 20))})
    monkeypatch.setattr(speed, "REPEATS", 2)
    monkeypatch.setattr(speed, "REFILL_EVERY", 2)  # the second learner repeat refills
    # the simulator's cells take ~0.2 s, give or take 0.1: the clock detectors are for GPUs
    monkeypatch.setattr(speed, "HIDDEN_SLACK_MS", 1e5)
    monkeypatch.setattr(speed, "FLUSH_SLOWDOWN", 1e5)
    monkeypatch.setattr(sw, "_ns", lambda: {"my_gemm": fn})
    monkeypatch.setattr(sw, "_S", {})
    monkeypatch.setattr(sw, "_T", dict(
        names={}, codes={}, perf=time.perf_counter, sync=lambda: None, stream=0,
        rec=lambda h, s: clock.__setitem__(h, time.perf_counter()),
        elapsed=lambda a, b: (clock[b] - clock[a]) * 1e3,
        events=[Ev(i) for i in range(4)], flush=cuda.device_array(64, np.float32),
        ladders={"GEMM_LADDER": {"register_blocked": _host_gemm}}))
    monkeypatch.setattr(sw, "_IO", {"inbox": str(inbox), "outbox": str(outbox)})
    st = SpeedTask("t.gemm", "my_gemm", "gemm", "GEMM_LADDER", "register_blocked")
    ch = Channel(_InProcess(), inbox, outbox)
    res = speed.time_task(ch, st, time.perf_counter() + 120, 60)
    assert res.kind == kind, res.message
    assert re.search(pattern, res.message), res.message
    assert not list(inbox.iterdir()) and not list(outbox.iterdir())  # cells cleaned up
    assert sw._S == {}  # the task's buffers are freed


@pytest.mark.gpu
@pytest.mark.parametrize("learner, top", [("register_blocked", True), ("tiled", None)])
def test_gpu_harness_in_this_process(tmp_path, monkeypatch, learner, top):
    """The timing cells on the GPU without a grading kernel (harness faults show here
    apart from the isolation's): a course kernel timed against the 07.gemm rung."""
    import time

    import convlab.kernels as K
    from convlab.grading import speed_worker as sw
    from convlab.grading.remote import Channel

    inbox, outbox = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    outbox.mkdir()
    monkeypatch.setattr(sw, "_T", {})
    monkeypatch.setattr(sw, "_S", {})
    monkeypatch.setattr(sw, "_IO", {})
    monkeypatch.setattr(speed, "REPEATS", 6)
    sw.install({}, str(outbox), str(inbox))
    assert sw.patched() == []
    monkeypatch.setattr(sw, "_ns", lambda: {"my_gemm": K.GEMM_LADDER[learner]})
    st = SpeedTask("t.gemm", "my_gemm", "gemm", "GEMM_LADDER", "register_blocked", par=0.5)
    res = speed.time_task(Channel(_InProcess(), inbox, outbox), st,
                          time.perf_counter() + 120, 60)
    print(res.line())
    assert res.kind == "graded", res.message
    if top:
        assert res.score == speed.SPEED_POINTS and 0.7 < res.speed < 1.4, res.line()
