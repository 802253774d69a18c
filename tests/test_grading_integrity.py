"""Tampering with the grader never raises a score; an endless loop costs only its task.

Each submission in tests/data/grading/answers/attack_s*.py tries several attacks (one per
task) on the fixture exercise, on top of right answers where the attack leaves a task
alone, so the other tasks show that the attack cost only its own. All are graded once,
in one batch (as an instructor would), through the command line that writes results.json.
"""

from __future__ import annotations

import json
import re

import pytest

from convlab.grading.batch import grade_batch

from ._grading import FIXTURE, SOLVED, by_task, submission

CELL_TIMEOUT = 25  # the endless loop costs this much

# submission -> (answer files, {task: (score, kind, message regex)}, total score)
ATTACKS = {
    "s1": (("attack_s1.py",), {
        "fx.box": (0, "tampering", r"changed convlab\.check\.check_filter2d"),
        "fx.gemm": (0, "tampering", r"while your function ran: it changed convlab\.check\.compare"),
        "fx.tiled": (0, "failed", r"changing check_conv2d\.__code__ is not allowed"),
    }, 0),
    "s2": (("attack_s2.py",), {
        "fx.box": (0, "tampering", r"numpy\.allclose.*numpy\.testing\.assert_allclose"),
        "fx.gemm": (0, "tampering", r"the instructor's 'check_gemm'"),
        "fx.tiled": (0, "failed", r"conv2d_coalesced is not allowed inside an answer"),
    }, 0),
    "s3": (("attack_s3.py",), {
        "fx.box": (0, "failed", r"convlab\.reference\.filter2d is not allowed inside an answer"),
        "fx.gemm": (0, "failed", r"checker's stack frames is not allowed"),
        "fx.tiled": (0, "failed", r"checker's stack frames is not allowed"),
    }, 0),
    "s4": ((*SOLVED, "attack_s4.py"), {
        "fx.box": (0, "failed", r"outputs are wrong"),
        "fx.gemm": (0, "failed", r"reading \S+\.ipynb is not allowed while grading"),
        "fx.tiled": (0, "not-implemented", r"nothing was written"),
    }, 0),
    "s5": ((*SOLVED, "solution_tiled.py", "attack_s5.py"), {
        "fx.box": (0, "failed", r"SystemExit"),
        "fx.gemm": (0, "crashed", r"the kernel died while testing"),
        "fx.tiled": (3, "passed", r""),  # graded as usual after the restart
    }, 3),
    "s6": ((*SOLVED, "attack_s6.py"), {
        "fx.box": (0, "timeout", rf"timed out after {CELL_TIMEOUT} s while testing"),
        "fx.gemm": (1, "passed", r""),  # the other tasks are graded as usual
        "fx.tiled": (0, "not-implemented", r"nothing was written"),
    }, 1),
    "s7": ((*SOLVED, "attack_s7.py"), {
        "fx.box": (0, "tampering", r"did not run through the grader"),
        "fx.gemm": (0, "tampering", r"did not run through the grader"),
        "fx.tiled": (0, "not-implemented", r"did not run through the grader"),
    }, 0),
}


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    folder = tmp_path_factory.mktemp("attacks")
    out = folder / "graded"
    decoy = folder / "decoy" / "results.json"  # a results.json the attack knows the path of
    for name, (files, _, _) in ATTACKS.items():
        target = out / f"{name}.results.json"
        submission(folder / f"{name}.ipynb", *files,
                   replace={"@OUT@": str(target), "/tmp/results.json": str(decoy)})
    rows = grade_batch(folder, out, jobs=2, instructor=FIXTURE, cell_timeout=CELL_TIMEOUT,
                       progress=False)
    results = {r["submission"]: json.loads((out / f"{r['submission']}.results.json").read_text())
               for r in rows}
    for name, data in results.items():
        print(f"--- {name}\n{data['output']}")
    return folder, results


@pytest.mark.parametrize("name", list(ATTACKS))
def test_tampering_does_not_raise_the_score(attacked, name):
    _, results = attacked
    data = results[name]
    _, expect, total = ATTACKS[name]
    tests = by_task(data)
    kinds = data["extra_data"]["tasks"]
    for task, (score, kind, pattern) in expect.items():
        t = tests[task]
        assert t["score"] == score, (task, t["output"])
        assert kinds[task] == kind, (task, kinds[task], t["output"])
        assert re.search(pattern, t["output"], re.S), (task, t["output"])
    assert data["score"] == total


def test_results_json_is_written_by_the_grader_only(attacked):
    folder, results = attacked
    # the attack tried to write the real results file, a decoy and one in its folder
    assert not (folder / "decoy" / "results.json").exists()
    data = results["s4"]
    assert data["score"] == 0 and data["tests"][0]["name"] == "fx.box"
    assert "score" in data and data["extra_data"]["instructor"] == "fixture.ipynb"


def test_fake_pass_lines_are_not_a_pass(attacked):
    _, results = attacked
    box = by_task(results["s4"])["fx.box"]
    assert box["status"] == "failed" and box["output"].startswith("✗")


def test_flags_for_review_name_what_was_tried(attacked):
    _, results = attacked
    flags = {k: v["extra_data"]["flags"] for k, v in results.items()}
    assert "touches the checker or the grader" in flags["s1"]["fx.box"]
    assert "mentions results.json" in flags["s4"]["fx.box"]
    assert "prints pass-like lines" in flags["s4"]["fx.box"]
    assert "tries to exit the interpreter" in flags["s5"]["fx.gemm"]
    assert "touches the notebook machinery" in flags["s7"]["fx.box"]
    hidden = [t for t in results["s1"]["tests"] if t["visibility"] == "hidden"]
    assert hidden and hidden[0]["max_score"] == 0  # a review note, never points


def test_endless_loop_costs_one_timeout_and_a_restart(attacked):
    _, results = attacked
    data = results["s6"]
    assert data["extra_data"]["restarts"] == 1
    assert data["execution_time"] < CELL_TIMEOUT + 40
    assert results["s5"]["extra_data"]["restarts"] == 1  # os._exit: one restart too


# Lessons 11 and 12 ship helpers in the package that would answer their own tasks.
PACKAGE_ANSWERS = {
    "11_beyond_direct_conv": ("11.fft_filter", "def filter2d_fft(image, kernel):\n"
                              "    from convlab import fft_conv\n"
                              "    return fft_conv.filter2d_fft(image, kernel)\n"),
}


@pytest.mark.parametrize("lesson", list(PACKAGE_ANSWERS))
def test_package_helpers_cannot_answer_lesson_tasks(tmp_path, lesson):
    from convlab.grading import notebook as nbf
    from convlab.grading.grade import grade

    root = FIXTURE.parents[3]
    task, answer = PACKAGE_ANSWERS[lesson]
    nb = nbf.read(root / "exercises" / f"{lesson}.ipynb")
    cells = [c for c in nb.cells if c.get("cell_type") == "code"
             and nbf.exercise_id(nbf.source(c)) == task]
    assert len(cells) == 1
    cells[0]["source"] = f"# EXERCISE: {task}\n{answer}"
    path = tmp_path / f"{lesson}.ipynb"
    path.write_text(nbf.writes(nb), encoding="utf-8")
    from convlab.grading.gradescope import results_json

    data = results_json(grade(path, root / "solutions" / f"{lesson}.ipynb"))
    entry = by_task(data)[task]
    assert entry["score"] == 0
    assert re.search(r"not allowed inside an answer", entry["output"]), entry["output"]
