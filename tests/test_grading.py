"""Exercises build and the autograder: format, build --check, grading, batch, Gradescope.

Kernel-backed gradings are shared through module-scoped fixtures (each grading starts a
Jupyter kernel, a few seconds); the integrity attacks are in test_grading_attacks.py.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import nbformat
import pytest

from convlab import check
from convlab.__main__ import main as cli
from convlab.grading import notebook as nbf
from convlab.grading.batch import grade_batch, submission_names
from convlab.grading.build import build, repo_root, solution_notebooks
from convlab.grading.grade import choose_answers, grade
from convlab.grading.gradescope import results_json, write_autograder

from ._grading import FIXTURE, SOLVED, by_task, submission

ROOT = repo_root(Path(__file__).resolve().parents[1])
REAL_SOLUTIONS = solution_notebooks(ROOT / "solutions")
PRIVATE_TEST = """\
# an instructor's private tests: one block per '# TEST:' line
# TEST: fx.box points=2
import numpy as _np
_img = _np.arange(35, dtype=_np.float32).reshape(5, 7) ** 0.5
_k = _np.ones((3, 3), _np.float32)
assert _np.allclose(filter2d_numpy(_img, _k)[2, 3], _img[1:4, 2:5].sum(), rtol=1e-5)

# TEST: 99.other points=5
raise AssertionError("a test for another notebook: never merged here")
"""


# ----------------------------------------------------------------------------------------
# The format (no kernel)


CELL = """\
# EXERCISE: 01.demo
import numpy as np


def f(x):
    if x is not None:
        ### BEGIN SOLUTION
        y = x * 2
        return y
        ### END SOLUTION
    return None
"""


def test_solution_region_becomes_stub_at_its_indentation():
    out = nbf.strip_solution(CELL)
    assert "        # YOUR CODE HERE\n        pass\n    return None" in out
    assert "y = x * 2" not in out and "BEGIN SOLUTION" not in out
    compile(out, "stub", "exec")  # still valid Python


def test_hidden_tests_are_removed_and_markers_checked():
    text = "# TEST: 01.demo points=2\ncheck(f)\n### BEGIN HIDDEN TESTS\ncheck(f, seed=3)\n" \
           "### END HIDDEN TESTS\nprint('done')\n"
    assert nbf.strip_hidden(text) == "# TEST: 01.demo points=2\ncheck(f)\nprint('done')\n"
    for broken, why in [("### BEGIN SOLUTION\nx = 1\n", "never closed"),
                        ("x = 1\n### END SOLUTION\n", "without"),
                        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n",
                         "inside another")]:
        with pytest.raises(nbf.NotebookFormatError, match=why):
            nbf.strip_solution(broken, "nb, cell 3")


def test_markers_and_layout():
    assert nbf.exercise_id("\n# EXERCISE: 06.tiled_halo\nx = 1") == "06.tiled_halo"
    assert nbf.exercise_id("x = 1\n# EXERCISE: 06.a") is None  # must be the first line
    assert nbf.test_marker("# TEST: 06.a points=3\ncheck()") == ("06.a", 3)
    assert nbf.test_marker("#TEST: 06.a  points = 1.5") == ("06.a", 1.5)
    nb = nbf.nbformat.v4.new_notebook(cells=[
        nbf.nbformat.v4.new_code_cell("# TEST: 01.b points=1\nx"),  # a test before its answer
        nbf.nbformat.v4.new_code_cell(CELL),
        nbf.nbformat.v4.new_code_cell("# TEST: 01.demo points=2\nx"),
        nbf.nbformat.v4.new_code_cell("# TEST: 01.demo points=1\nx"),
        nbf.nbformat.v4.new_code_cell("# EXERCISE: 01.c\n### BEGIN SOLUTION\n### END SOLUTION")])
    lay = nbf.layout(nb)
    assert lay.tasks["01.demo"].points == 3 and lay.tasks["01.demo"].test_cells == [2, 3]
    text = "\n".join(lay.problems)
    assert "tests task 01.b, which has no '# EXERCISE:'" in text
    assert "task 01.c has no '# TEST: 01.c points=N' cell" in text


def test_fixture_exercise_is_clean_and_deterministic():
    sol = nbf.read(FIXTURE)
    sol.cells[1]["outputs"] = [nbf.nbformat.v4.new_output("stream", text="hello\n")]
    sol.cells[1]["execution_count"] = 7
    ex = nbf.exercise_notebook(sol, "fixture", generated_from="solutions/99_fixture.ipynb")
    text = nbf.writes(ex)
    assert text == nbf.writes(nbf.exercise_notebook(sol, "fixture",
                                                    generated_from="solutions/99_fixture.ipynb"))
    for c in ex.cells:
        if c["cell_type"] == "code":
            assert c["outputs"] == [] and c["execution_count"] is None
    for gone in ("BEGIN SOLUTION", "HIDDEN TESTS", "seed=11", "sliding_window_view(padded",
                 "cuda.syncthreads()"):
        assert gone not in text, gone
    assert text.count("# YOUR CODE HERE") == 4  # box, gemm, the kernel and its launcher
    assert ex.metadata["convlab"]["generated_from"] == "solutions/99_fixture.ipynb"
    grading = nbf.writes(nbf.grading_notebook(nbf.read(FIXTURE), "fixture"))
    assert "seed=11" in grading and "sliding_window_view(padded" not in grading


def test_a_learners_function_never_says_whether_it_runs_on_the_device():
    """A plain NumPy function would say no and be handed host arrays in a GPU task: a
    graded checker call must state device= itself."""
    from convlab.grading.remote import RemoteFunction

    fn = RemoteFunction(None, "conv2d_tiled", {"name": "conv2d_tiled", "device": True})
    with pytest.raises(TypeError, match="device=True or device=False"):
        check.check_conv2d(fn, quiet=True)


def test_bound_names_and_flags():
    names = nbf.bound_names("%matplotlib inline\nimport numpy as np, os.path\n"
                            "from x import y as z\na, (b, *c) = 1, (2, 3)\n"
                            "for i in range(2):\n    d = i\n"
                            "def f(): e = 1\nclass K: pass\nwith open('x') as fh: pass\n")
    assert names == sorted(["np", "os", "z", "a", "b", "c", "i", "d", "f", "K", "fh"])
    assert nbf.scan_flags("def f(a):\n    return a  # sys.exit() in a comment is fine\n") == []
    flags = nbf.scan_flags("import convlab.check\nconvlab.check.compare = None\n"
                           "print('✓ all tests passed')\nsys.exit(0)")
    assert {"touches the checker or the grader", "assigns into a module",
            "prints pass-like lines", "tries to exit the interpreter"} <= set(flags)
    for reach in ("y = x._ary", "v = vars(x)['_ary']", "z = x.__dict__",
                  "from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray",
                  "s = x.__getstate__()", "r = x.__reduce_ex__(4)",
                  "d = cuda.device_array(s, t, buffer=h)", "cuda.reduce(f)(x)",
                  "from numba.cuda import simulator", "k.BlockThread = object",
                  "y[0] = x._item.sum()"):
        assert "reaches into the simulator's device arrays" in nbf.scan_flags(reach), reach
    assert "renames its module" in nbf.scan_flags("__name__ = 'convlab.trace'\n")
    in_kernel = "runs NumPy or Python containers inside a kernel"
    kernel = "@cuda.jit\ndef k(x, y):\n    i = cuda.grid(1)\n    {}\n"
    for body in ("y[0] = np.asarray(x).sum()", "acc = [x[i]]", "y[i] = np.dot(x, x)",
                 "HOST[i] = x[i]", "Box.x = x"):
        assert any(f.startswith(in_kernel) for f in nbf.scan_flags(kernel.format(body))), body
    for body in ("y[i] = np.float32(0.5) * np.sqrt(x[i])",
                 "t = cuda.local.array((4,), float32)\n    t[0] = x[i]\n    y[i] = t[0]",
                 "buffer = cuda.shared.array((4,), float32)\n    buffer[0] = x[i]"):
        assert nbf.scan_flags(kernel.format(body)) == [], body
    assert "builds functions from code objects" in nbf.scan_flags(
        "f = types.FunctionType(g.__code__.replace(co_filename=n), {})")
    assert nbf.scan_flags("def f(x):\n    return np.asarray(x).sum()\n") == []  # not a kernel
    # Numba's CPU compiler may run NumPy; scipy.signal is not the signal module
    for cpu in ("@njit\ndef f(x):\n    y = np.zeros(3)\n    return y",
                "@numba.njit(parallel=True)\ndef f(x):\n    return np.zeros(3)"):
        assert nbf.scan_flags(cpu) == [], cpu
    for sig in ("from scipy.signal import correlate2d", "y = scipy.signal.correlate2d(x, k)"):
        assert "starts processes or handles signals" not in nbf.scan_flags(sig), sig
    for handler in ("import signal", "signal.signal(signal.SIGTERM, f)"):
        assert "starts processes or handles signals" in nbf.scan_flags(handler), handler
    assert any(f.startswith(in_kernel) for f in nbf.scan_flags(
        "@jit\ndef k(x):\n    y = np.zeros(3)\n"))  # a bare jit may be cuda.jit
    # source compiled under a file name of one's choice (the tracer's folder is exempt)
    for run in ("import code\ncode.InteractiveInterpreter(g).runsource(s, p, 'exec')",
                "from code import InteractiveConsole", "import codeop"):
        assert "runs source through the code module" in nbf.scan_flags(run), run
    assert "reads module file paths" in nbf.scan_flags("d = os.path.dirname(t.__file__)")
    for io in ("x = np.load(p)", "np.save(p, y)", "os.replace(a, b)", "n = os.listdir(d)",
               "y.tofile(p)"):
        assert "reads or writes files or folders" in nbf.scan_flags(io), io
    patched = "assigns into a module or class it imported"
    for patch in ("import json as _j\n_j.dump = f", "from numpy.lib import format as F\n"
                  "F.write_array = f", "import convlab.grading.worker as W\nW._cfg['r'].n = 0",
                  "import os\nsetattr(os, 'replace', f)", "from x import K\ndel K.method"):
        assert any(f.startswith(patched) for f in nbf.scan_flags(patch)), patch
    assert not any(f.startswith(patched) for f in nbf.scan_flags(
        "import numpy as np\ny = np.zeros(3)\ny[0] = 1\n"))
    # the same routes, hidden the usual ways (each once got through with no flag)
    hidden = {
        "w = s.modules['conv' + 'lab.grading.worker']": "builds names from pieces of strings",
        "c = getattr(w, name)": "reaches attributes or names dynamically",
        "type(np).__setattr__(m, n, f)": "reaches attributes or names dynamically",
        "fmt = np.lib.format\nfmt.write_array = f": "assigns into a module or class it imported",
        "import pathlib": "imports modules an answer does not need (pathlib)",
        "for p in P('.outbox').iterdir():\n    p.write_text(t)":
            "touches the grader's folders or the notebook's events",
        "ip.events.register('post_run_cell', f)":
            "touches the grader's folders or the notebook's events",
    }
    for src, flag in hidden.items():
        assert any(f.startswith(flag) for f in nbf.scan_flags(src)), src
    ordinary = ("import math\nfrom numba import cuda\nimport numpy as np\n"
                "class Tile:\n    def __init__(self):\n        self.n = 4\n"
                "@cuda.jit\ndef k(x, y):\n    i = cuda.grid(1)\n    y[i] = math.sqrt(x[i])\n"
                "def launch(x, y):\n    print('tile ' + str(Tile().n))\n    k[1, 4](x, y)\n")
    assert nbf.scan_flags(ordinary) == []
    for late in ("class A:\n    def __del__(self):\n        pass", "weakref.finalize(o, f)",
                 "atexit.register(f)"):
        assert "runs code when objects are freed or at exit" in nbf.scan_flags(late), late
    # a kernel that calls a plain Python function of the cell, against a device function
    plain = "a kernel calls a plain Python function of the cell"
    helper = ("def _work(x, y):\n    y[0] = sum(x[j] for j in range(4))\n"
              "@cuda.jit\ndef k(x, y):\n    _work(x, y)\n")
    assert any(f.startswith(plain) for f in nbf.scan_flags(helper))
    device = ("@cuda.jit(device=True)\ndef add(a, b):\n    return a + b\n"
              "@cuda.jit\ndef k(x, y):\n    i = cuda.grid(1)\n    y[i] = add(x[i], 1.0)\n"
              "def launch(x, y):\n    k[1, 4](x, y)\n")
    assert nbf.scan_flags(device) == []


def test_private_tests_load_and_merge(tmp_path):
    (tmp_path / "extra.py").write_text(PRIVATE_TEST)
    cells = nbf.load_private_tests(tmp_path)
    assert [nbf.test_marker(nbf.source(c)) for c in cells] == [("fx.box", 2), ("99.other", 5)]
    gnb = nbf.grading_notebook(nbf.read(FIXTURE), "fixture", cells)
    lay = nbf.layout(gnb)
    assert lay.tasks["fx.box"].points == 3 and "99.other" not in lay.tasks
    box = lay.tasks["fx.box"]
    assert box.test_cells[-1] == box.test_cells[0] + 1  # right after the public test
    assert "filter2d_numpy(_img, _k)" in nbf.source(gnb.cells[box.test_cells[-1]])


def test_exercise_line_after_comments_and_the_answer_that_is_not_the_stub():
    assert nbf.exercise_id("# my second try\n\n%%time\n# EXERCISE: 06.a\nx = 1") == "06.a"
    assert nbf.exercise_id("# TEST: 06.a points=1\n# EXERCISE: 06.a") is None
    assert nbf.exercise_id("import numpy\n# EXERCISE: 06.a") is None
    stub = "# EXERCISE: fx.a\ndef f(x):\n    # YOUR CODE HERE\n    pass\n"
    answer = "# EXERCISE: fx.a\ndef f(x):\n    return 2 * x\n"
    nb = nbf.nbformat.v4.new_notebook(cells=[
        nbf.nbformat.v4.new_code_cell(answer),  # a new cell above the untouched stub
        nbf.nbformat.v4.new_code_cell(stub.replace("pass", "pass  # still to do")),
        nbf.nbformat.v4.new_code_cell("# EXERCISE: fx.b\ny = 1\n"),
        nbf.nbformat.v4.new_code_cell("# EXERCISE: fx.b\ny = 2\n")])
    chosen = choose_answers(nb, {"fx.a": stub, "fx.b": "# EXERCISE: fx.b\ny = 0\n"})
    assert chosen == {"fx.a": answer, "fx.b": "# EXERCISE: fx.b\ny = 2\n"}


def test_gradebook_names_are_unique(tmp_path):
    subs = [tmp_path / "a" / "b__c.ipynb", tmp_path / "a__b" / "c.ipynb", tmp_path / "d.ipynb"]
    names = submission_names(subs, tmp_path)
    assert names[subs[0]] == "a__b__c" and names[subs[1]] == "a__b__c~2"
    assert len(set(names.values())) == 3


@pytest.mark.parametrize("broken", [
    '{"cells": [{"cell_type": "code", "source": ["x = 1\\n", 7], "metadata": {}}]}',
    '{"cells": [7]}', '{"cells": {}}', "[" * 100_000])
def test_malformed_notebooks_are_error_results(tmp_path, broken):
    bad = tmp_path / "bad.ipynb"
    bad.write_text(broken)
    res = grade(bad, FIXTURE)
    assert res.error and res.score == 0 and res.tasks == []
    assert re.search(r"not (a|text)|broken|not a notebook cell", res.error), res.error
    assert "Could not grade" in results_json(res)["output"]


def test_a_submission_for_another_assignment_is_an_error(tmp_path):
    sub = tmp_path / "00_setup.ipynb"
    shutil.copy(ROOT / "exercises" / "00_setup.ipynb", sub)
    res = grade(sub, ROOT / "solutions", assignment="06")
    assert res.error and "is not for 06_shared_memory_tiling" in res.error, res.error
    assert results_json(res)["score"] == 0


def test_unreadable_submission_is_reported_not_raised(tmp_path):
    bad = tmp_path / "bad.ipynb"
    bad.write_text('{"cells": [')
    res = grade(bad, FIXTURE)
    assert res.error and "JSON is broken" in res.error and res.score == 0
    data = results_json(res)
    assert data["score"] == 0 and "Could not grade" in data["output"]


# ----------------------------------------------------------------------------------------
# exercises build [--check]


def _copy_solution(root: Path, name="01_fixture.ipynb") -> Path:
    (root / "solutions").mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(FIXTURE, root / "solutions" / name))


def test_build_and_check(tmp_path, capsys):
    assert build(tmp_path, check=True).ok  # nothing yet: nothing stale
    sol = _copy_solution(tmp_path)
    assert cli(["exercises", "build", "--check", "--root", str(tmp_path)]) == 1
    assert "stale: exercises/01_fixture.ipynb" in capsys.readouterr().out
    assert cli(["exercises", "build", "--root", str(tmp_path)]) == 0
    ex = tmp_path / "exercises" / "01_fixture.ipynb"
    first = ex.read_bytes()
    assert cli(["exercises", "build", "--check", "--root", str(tmp_path)]) == 0
    assert build(tmp_path).unchanged == ["exercises/01_fixture.ipynb"]  # stable bytes
    assert ex.read_bytes() == first
    sol.write_text(sol.read_text().replace("BLOCK = 8", "BLOCK = 16"))
    rep = build(tmp_path, check=True)
    assert rep.stale == ["exercises/01_fixture.ipynb"] and not rep.ok
    ex.write_bytes(first)
    (tmp_path / "exercises" / "02_gone.ipynb").write_bytes(first)  # its solution is gone
    rep = build(tmp_path, check=True)
    assert "exercises/02_gone.ipynb (its solution notebook is gone)" in rep.stale
    rep = build(tmp_path)
    assert rep.removed == ["exercises/02_gone.ipynb"] and "BLOCK = 16" in ex.read_text()


def test_build_rejects_a_broken_solution(tmp_path):
    sol = _copy_solution(tmp_path)
    sol.write_text(sol.read_text().replace("### END SOLUTION", "", 1))
    rep = build(tmp_path)
    assert not rep.ok and "never closed" in rep.problems[0]
    assert not (tmp_path / "exercises" / "01_fixture.ipynb").exists()


def test_repository_exercises_are_up_to_date():
    rep = build(ROOT, check=True)
    assert rep.ok, rep.text(check=True)


# ----------------------------------------------------------------------------------------
# Grading the fixture: the solution scores full marks, the exercise zero


@pytest.fixture(scope="session")  # session: xdist may interleave other files
def fixture_gradings(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fixture")
    private = tmp / "private"
    private.mkdir()
    (private / "tests.py").write_text(PRIVATE_TEST)
    exercise = tmp / "exercise.ipynb"
    exercise.write_text(nbf.writes(nbf.exercise_notebook(nbf.read(FIXTURE), "fixture")))
    out = {}
    for name, path in (("solution", FIXTURE), ("exercise", exercise)):
        t0 = time.perf_counter()
        res = grade(path, FIXTURE, private)
        out[name] = (res, time.perf_counter() - t0)
        print(res.summary())
    return out


def test_fixture_solution_scores_full_marks_with_private_tests(fixture_gradings):
    res, _ = fixture_gradings["solution"]
    assert res.error is None and res.cell_errors == []
    assert [t.id for t in res.tasks] == ["fx.box", "fx.gemm", "fx.tiled"]
    assert all(t.passed and t.score == t.max_score for t in res.tasks), res.summary()
    assert res.max_score == 7  # 1 + 1 + 3, and the private test's 2 points on fx.box
    assert res.score == 7 and "1 private test cell(s) merged" in res.log[0]
    assert "✓ conv2d: 5 cases passed" in res.tasks[2].output


def test_a_task_whose_tests_did_not_all_run_scores_zero(tmp_path, monkeypatch):
    """The total time limit falls between fx.box's public test (passed) and its private
    one: the task must not keep the points of the test that ran."""
    import types

    from convlab.grading import grade as grade_mod
    from convlab.grading import verdict

    (tmp_path / "tests.py").write_text(PRIVATE_TEST)
    offset = [0.0]
    monkeypatch.setattr(grade_mod, "time", types.SimpleNamespace(
        perf_counter=lambda: time.perf_counter() + offset[0]))
    run = verdict.TestScope.run

    def run_then_jump(self, index, source, name, *a, **k):
        out = run(self, index, source, name, *a, **k)
        if name == "fx.box":
            offset[0] = 1e6  # past the deadline once fx.box's first test has run
        return out

    monkeypatch.setattr(verdict.TestScope, "run", run_then_jump)
    res = grade(FIXTURE, FIXTURE, tmp_path)
    box = res.tasks[0]
    assert box.id == "fx.box" and not box.passed and box.score == 0, res.summary()
    assert "not all of its tests ran" in box.message
    assert res.score == 0 and all(t.kind == "not-run" for t in res.tasks[1:])


def test_fixture_exercise_scores_zero_with_not_implemented(fixture_gradings):
    res, _ = fixture_gradings["exercise"]
    assert res.score == 0 and res.max_score == 7
    assert res.cell_errors == []  # every other cell runs without error
    for t in res.tasks:
        assert t.kind == "not-implemented" and "not implemented" in t.message, t
    msg = {t.id: t.message for t in res.tasks}
    assert "returned None" in msg["fx.box"] and "nothing was written" in msg["fx.tiled"]


def test_grading_times_are_reported(fixture_gradings):
    """Measured, not asserted (CI machines differ): see the README for the numbers."""
    times = {k: round(v[1], 1) for k, v in fixture_gradings.items()}
    print(f"grading times: {times} s")
    assert all(res.seconds > 0 for res, _ in fixture_gradings.values())


def test_grade_cli_writes_results_json(tmp_path, capsys):
    sub = submission(tmp_path / "mine.ipynb", "solution_gemm.py")
    out = tmp_path / "res" / "results.json"
    assert cli(["grade", str(sub), "--instructor", str(FIXTURE), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    tests = by_task(data)
    assert data["score"] == 1 and tests["fx.gemm"]["status"] == "passed"
    for t in data["tests"]:
        assert set(t) == {"name", "score", "max_score", "status", "output", "visibility"}
    assert tests["fx.box"]["status"] == "failed" and tests["fx.tiled"]["max_score"] == 3
    text = capsys.readouterr().out
    assert "mine.ipynb: 1 / 5 points" in text and "✓ fx.gemm" in text


def test_the_jail_mounts_a_course_installed_under_tmp(monkeypatch, tmp_path):
    """A checkout or virtual environment under /tmp (a CI clone, a pytest folder) vanished
    behind the jail's fresh /tmp: the kernel's Python was "No such file"."""
    from convlab.grading import jail, kernel

    site = Path("/tmp") / f"convlab-site-{os.getpid()}"
    site.mkdir(exist_ok=True)
    try:
        monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}/nonexistent")
        monkeypatch.setattr(kernel.sys, "prefix", str(tmp_path))
        dirs = [d for d in kernel._exposed_dirs() if jail.in_private_tmp(d)]  # re-mounted
        assert str(site.resolve()) in dirs and str(tmp_path.resolve()) in dirs
        assert "/nonexistent" not in kernel._exposed_dirs()
        assert all(d.startswith(("/tmp/", "/var/tmp/", "/dev/shm/")) for d in dirs)
    finally:
        site.rmdir()


def test_results_in_the_temp_folder_do_not_deny_the_graders_own_scratch(tmp_path):
    """`--out /tmp/r.json` denies writes to /tmp, which holds the grader's scratch and
    outbox: the answer's replies must still get through (they did not: every task 0)."""
    import tempfile
    import uuid

    sub = submission(tmp_path / "mine.ipynb", "solution_gemm.py")
    out = Path(tempfile.gettempdir()) / f"convlab-test-{uuid.uuid4().hex}.json"
    try:
        assert cli(["grade", str(sub), "--instructor", str(FIXTURE), "--out", str(out)]) == 0
        tests = by_task(json.loads(out.read_text()))
        assert tests["fx.gemm"]["status"] == "passed", tests["fx.gemm"]["output"]
    finally:
        out.unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------
# Every real solution notebook scores full marks; every generated exercise scores zero


@pytest.fixture(scope="session")  # session: xdist may interleave other files
def real_gradings(tmp_path_factory):
    if not REAL_SOLUTIONS:
        return {}
    tmp = tmp_path_factory.mktemp("real")
    for sol in REAL_SOLUTIONS:
        shutil.copy(sol, tmp / f"sol__{sol.name}")
        ex = nbf.exercise_notebook(nbf.read(sol), sol.name)
        (tmp / f"ex__{sol.name}").write_text(nbf.writes(ex))
    out = tmp / "graded"
    grade_batch(tmp, out, jobs=2, instructor=ROOT / "solutions", progress=False)
    return {p.name: json.loads(p.read_text()) for p in out.glob("*.results.json")}


@pytest.mark.parametrize("name", [p.stem for p in REAL_SOLUTIONS] or ["(no solutions yet)"])
def test_real_solution_full_marks_and_exercise_zero(name, real_gradings, fixture_gradings):
    if not REAL_SOLUTIONS:  # solutions/ is empty: the fixture stands in (tests above)
        assert fixture_gradings["solution"][0].score == 7
        return
    sol = real_gradings[f"sol__{name}.results.json"]
    ex = real_gradings[f"ex__{name}.results.json"]
    extra = sol["extra_data"]
    assert sol["score"] == extra["max_score"] > 0, sol["output"]
    assert extra["cell_errors"] == [], extra["cell_errors"]
    assert ex["score"] == 0, ex["output"]
    assert ex["extra_data"]["cell_errors"] == [], ex["extra_data"]["cell_errors"]
    for t in ex["tests"]:
        if t["visibility"] != "hidden" and not t["name"].endswith(" speed"):  # speed: 0 of 0
            assert "not implemented" in t["output"], t


# ----------------------------------------------------------------------------------------
# Batch grading: planted bugs score partially with specific messages; bad JSON is one row

PLANTED = {
    "nosync": r"(?s)shared-memory race.*missing cuda\.syncthreads",
    "halo": r"(?s)outputs are wrong.*overlaps the image border.*off by one",
    "stride": r"(?s)stride=\(2, 3\).*outputs are wrong.*is the stride applied",
    "square": r"(?s)outputs are wrong.*gets a square input right and this non-square one wrong",
    "nowrite": r"nothing was written",
}


@pytest.fixture(scope="session")  # session: xdist may interleave other files
def planted_batch(tmp_path_factory):
    folder = tmp_path_factory.mktemp("batch")
    for bug in PLANTED:
        submission(folder / f"student_{bug}" / "06_tiled.ipynb", *SOLVED, f"tiled_{bug}.py")
    (folder / "student_broken").mkdir()
    (folder / "student_broken" / "06_tiled.ipynb").write_text('{"cells": [{"cell_type": ')
    # fx.box right, with a helper the learner defined in a cell of their own above it
    nb = nbf.read(submission(folder / "student_outside" / "06_tiled.ipynb", *SOLVED,
                             replace={"np.einsum(": "box_sum("}))
    at = next(i for i, c in enumerate(nb.cells) if "# EXERCISE: fx.box" in nbf.source(c))
    nb.cells.insert(at, nbformat.v4.new_code_cell(
        "# my helper\nbox_sum = np.einsum  # the sum over each window\n"))
    (folder / "student_outside" / "06_tiled.ipynb").write_text(nbf.writes(nb))
    # fx.box's answer cell does not parse: its test's NameError follows from that
    submission(folder / "student_syntax" / "06_tiled.ipynb", *SOLVED,
               replace={"def filter2d_numpy(image, kernel):": "def filter2d_numpy(image, kernel)"})
    out = folder / "graded"
    t0 = time.perf_counter()
    rows = grade_batch(folder, out, jobs=2, instructor=FIXTURE, cell_timeout=60,
                       progress=True)
    print(f"batch of {len(rows)} in {time.perf_counter() - t0:.1f} s")
    return folder, out, rows


def test_batch_gradebook_survives_a_broken_submission(planted_batch):
    folder, out, rows = planted_batch
    with open(out / "gradebook.csv", newline="") as f:
        book = {r["submission"]: r for r in csv.DictReader(f)}
    assert set(book) == {f"student_{b}__06_tiled"
                         for b in [*PLANTED, "broken", "outside", "syntax"]}
    broken = book["student_broken__06_tiled"]
    assert broken["status"] == "error" and "JSON is broken" in broken["error"]
    assert float(broken["score"]) == 0
    data = json.loads((out / "student_broken__06_tiled.results.json").read_text())
    assert data["score"] == 0 and "JSON is broken" in data["output"]
    for bug in PLANTED:
        row = book[f"student_{bug}__06_tiled"]
        assert row["status"] == "graded" and float(row["fx.box"]) == 1 and float(
            row["fx.tiled"]) == 0


@pytest.mark.parametrize("bug", list(PLANTED))
def test_planted_bug_scores_partially_with_its_message(planted_batch, bug):
    _, out, _ = planted_batch
    data = json.loads((out / f"student_{bug}__06_tiled.results.json").read_text())
    assert data["score"] == 2  # fx.box and fx.gemm right, the tiled kernel wrong
    tiled = by_task(data)["fx.tiled"]
    assert tiled["status"] == "failed" and tiled["score"] == 0
    import re

    assert re.search(PLANTED[bug], tiled["output"]), tiled["output"]
    others = [re.search(PLANTED[b], tiled["output"]) for b in PLANTED if b != bug]
    assert not any(others), f"{bug}: the message also matches another bug's"


def test_an_answer_cell_that_raises_is_named_before_the_test_it_broke(planted_batch):
    _, out, _ = planted_batch
    box = by_task(json.loads((out / "student_syntax__06_tiled.results.json").read_text()))
    assert box["fx.box"]["status"] == "failed"
    assert re.match(r"✗ your answer cell raised SyntaxError: .*\n\(so the test said: .*NameError",
                    box["fx.box"]["output"]), box["fx.box"]["output"]


def test_a_name_from_a_cell_the_grader_does_not_run_is_explained(planted_batch):
    """The learner's self-check passed (their helper cell had run); the grader runs only
    answer cells, so the answer's NameError says where the name is and what to do."""
    _, out, _ = planted_batch
    box = by_task(json.loads((out / "student_outside__06_tiled.results.json").read_text()))
    assert box["fx.box"]["status"] == "failed", box["fx.box"]
    assert re.search(r"(?s)NameError: name 'box_sum' is not defined.*'box_sum' is defined in "
                     r"your notebook in a cell that is not this task's answer cell \(the one "
                     r"starting `# my helper`\).*define 'box_sum' inside the answer cell",
                     box["fx.box"]["output"]), box["fx.box"]["output"]


# ----------------------------------------------------------------------------------------
# Gradescope autograder bundle


def test_autograder_zip_contents_and_run(tmp_path):
    root = tmp_path / "course"
    _copy_solution(root, "06_fixture.ipynb")
    private = tmp_path / "private"
    private.mkdir()
    (private / "extra.py").write_text(PRIVATE_TEST)
    zpath = tmp_path / "autograder.zip"
    assert cli(["autograder", "--out", str(zpath), "--root", str(root), "--private-tests",
                str(private)]) == 0
    with zipfile.ZipFile(zpath) as zf:
        names = set(zf.namelist())
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in zf.infolist()}
        grader = zf.read("graders/06_fixture.ipynb").decode()
    assert {"setup.sh", "run_autograder", "graders/06_fixture.ipynb", "private_tests/extra.py",
            "convlab_src/pyproject.toml", "convlab_src/convlab/__init__.py",
            "convlab_src/convlab/check/__init__.py",
            "convlab_src/convlab/grading/sandbox.py"} <= names
    assert modes["setup.sh"] == modes["run_autograder"] == 0o755
    assert not any("__pycache__" in n for n in names)
    assert "BEGIN SOLUTION" not in grader and "sliding_window_view(padded" not in grader
    assert "seed=11" in grader  # hidden tests ship (they are not the solution)

    # run it as Gradescope would, with this checkout's Python instead of /autograder/venv
    ag = tmp_path / "autograder"
    with zipfile.ZipFile(zpath) as zf:
        zf.extractall(ag / "source")
    env = {**os.environ, "AUTOGRADER_ROOT": str(ag), "CONVLAB_PYTHON": sys.executable}
    run = ["bash", str(ag / "source" / "run_autograder")]
    subprocess.run(run, env=env, check=True, capture_output=True, timeout=300)
    assert "No .ipynb file" in (ag / "results" / "results.json").read_text()
    submission(ag / "submission" / "whatever_name.ipynb", "solution_box.py")
    proc = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((ag / "results" / "results.json").read_text())
    assert data["score"] == 3  # fx.box: 1 public point + 2 private ones
    assert by_task(data)["fx.box"]["max_score"] == 3
    assert data["extra_data"]["assignment"] == "06_fixture"

    # the bundle grades its one assignment: a notebook of another lesson is an error
    (ag / "submission" / "whatever_name.ipynb").unlink()
    shutil.copy(ROOT / "exercises" / "00_setup.ipynb", ag / "submission" / "00_setup.ipynb")
    subprocess.run(run, env=env, check=True, capture_output=True, timeout=300)
    data = json.loads((ag / "results" / "results.json").read_text())
    assert data["score"] == 0 and "is not for 06_fixture" in data["output"], data["output"]
    _copy_solution(root, "07_other.ipynb")
    with pytest.raises(ValueError, match="grades one assignment"):
        write_autograder(tmp_path / "two.zip", root)


def test_an_ungraded_cell_that_raised_is_named_by_its_first_line():
    """The grading notebook's cell numbers are not the learner's: the log names the cell."""
    from convlab.grading.grade import Step, _setup_cell

    line = _setup_cell(Step("setup", None, "\n# a demo that uses your partition\nx = 1\n", 12))
    assert "`# a demo that uses your partition`" in line and "12" not in line
