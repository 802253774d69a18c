"""Attacks on the grader score no more than fair; unusual correct answers score full.

One submission per attack family of tests/data/grading/answers/attack_*.py (reach the
checkers, skip the tests, read solutions, leak, offload, a plain NumPy function), plus one
with four correct but unusual answers, all graded once in one batch. A second batch holds a
killer, a saboteur and two honest notebooks (only where the grader can isolate the learner's
process: the killer signals every process it can see).
"""

from __future__ import annotations

import csv
import json
import os
import re
import site
from pathlib import Path

import pytest

from convlab.grading import jail
from convlab.grading import notebook as nbf
from convlab.grading.batch import grade_batch

from ._grading import FIXTURE, SOLVED, answers, by_task, submission

ROOT = FIXTURE.parents[3]
CELL_TIMEOUT = 20
HONEST = (*SOLVED, "solution_tiled.py")

# submission -> (answer files, {task: (score, message regex)}); fair = the honest tasks only
FAMILIES = {
    "checkers": (("attack_checkers.py",), {
        "fx.box": (0, r"outputs are wrong"), "fx.gemm": (0, r"outputs are wrong"),
        "fx.tiled": (0, r"nothing was written")}),
    "skip": (("attack_skip.py",), {  # its thread is still alive in the GPU task's calls
        "fx.box": (0, r"returned None"), "fx.gemm": (0, r"outputs are wrong"),
        "fx.tiled": (0, r"ThreadError: 1 thread\(s\) started by the answer")}),
    "read": ((*SOLVED, "attack_read.py"), {
        "fx.box": (1, r""), "fx.gemm": (1, r""), "fx.tiled": (0, r"nothing was written")}),
    "leak": (("solution_box.py", "attack_leak.py"), {
        "fx.box": (1, r""), "fx.gemm": (0, r"not implemented"),
        "fx.tiled": (0, r"not implemented")}),
    "offload": ((*SOLVED, "attack_offload.py"), {
        "fx.box": (1, r""), "fx.gemm": (1, r""),
        "fx.tiled": (0, r"HostCopyError: \d+ device-to-host copies")}),
    "numpy": ((*SOLVED, "attack_numpy.py"), {  # the message names what counts, and that
        "fx.box": (1, r""), "fx.gemm": (1, r""),  # the self-check does not count it
        "fx.tiled": (0, r"HostCopyError: \d+ device-to-host copies.*printing an element.*"
                        r"Your notebook's self-check does not count these")}),
    "thread": ((*SOLVED, "attack_thread.py"), {
        "fx.box": (1, r""), "fx.gemm": (1, r""),
        "fx.tiled": (0, r"ThreadError: 1 thread\(s\) started by the answer")}),
    "package": ((*SOLVED, "attack_package.py"), {
        "fx.box": (1, r""), "fx.gemm": (1, r""),
        "fx.tiled": (0, r"WireError: cannot send a value of type Later")}),
}

OWN_HELPER = """\
# EXERCISE: fx.box
T = 3  # my own constant, named like the instructor's
def ceil_div(n, d):  # my own helper, named like the instructor's import
    return -(-n // d) + 0 * T


def filter2d_numpy(image, kernel):
    assert T == 3 and ceil_div(7, 2) == 4, "the grader changed my names"
    R, S = kernel.shape
    padded = np.pad(image, ((R // 2, R // 2), (S // 2, S // 2)))
    return np.einsum("hwrs,rs->hw", sliding_window_view(padded, (R, S)),
                     kernel).astype(image.dtype)
"""


def _unusual(dest: Path) -> Path:
    """Four correct answers the old grader failed: a helper and a constant named like the
    instructor's, an answer in a new cell above the untouched stub, a comment above the
    ``# EXERCISE:`` line."""
    nb = nbf.exercise_notebook(nbf.read(FIXTURE), "fixture")
    ans = {**answers(Path(FIXTURE).parent / "answers" / "solution_gemm.py"),
           **answers(Path(FIXTURE).parent / "answers" / "solution_tiled.py")}
    cells = []
    for c in nb.cells:
        tid = nbf.exercise_id(nbf.source(c)) if c.get("cell_type") == "code" else None
        if tid == "fx.box":
            c["source"] = OWN_HELPER
        elif tid == "fx.gemm":  # a new cell above the stub, which stays as it was
            cells.append(nbf.nbformat.v4.new_code_cell(ans[tid]))
        elif tid == "fx.tiled":
            c["source"] = "# my tiled kernel, second try\n\n" + ans[tid]
        cells.append(c)
    nb.cells = cells
    dest.write_text(nbf.writes(nb), encoding="utf-8")
    return dest


def _write_families(folder: Path, out: Path, names) -> None:
    """One submission per attack family in `names`, writing (if it can) to out and to a
    decoy results file under folder."""
    decoy = folder / "decoy" / "results.json"
    for name in names:
        submission(folder / f"{name}.ipynb", *FAMILIES[name][0], replace={
            "@OUT@": str(out / f"{name}.results.json"), "/tmp/results.json": str(decoy),
            "@FIXTURE@": str(FIXTURE), "@ROOT@": str(ROOT)})


def _check_family(data: dict, name: str) -> None:
    """Each task of family `name` scored and explained as FAMILIES says, and no more."""
    tests = by_task(data)
    for task, (score, pattern) in FAMILIES[name][1].items():
        assert tests[task]["score"] == score, (name, task, tests[task]["output"])
        assert re.search(pattern, tests[task]["output"], re.S), (name, task,
                                                                 tests[task]["output"])
    assert data["score"] == sum(s for s, _ in FAMILIES[name][1].values())


@pytest.fixture(scope="session")  # session: xdist may interleave other files
def families(tmp_path_factory):
    folder = tmp_path_factory.mktemp("families")
    out = folder / "graded"
    _write_families(folder, out, FAMILIES)
    _unusual(folder / "unusual.ipynb")
    rows = grade_batch(folder, out, jobs=2, instructor=FIXTURE, cell_timeout=CELL_TIMEOUT,
                       progress=False)
    results = {r["submission"]: json.loads((out / f"{r['submission']}.results.json").read_text())
               for r in rows}
    for name, data in results.items():
        print(f"--- {name}\n{data['output']}")
    return folder, out, results


@pytest.mark.parametrize("name", list(FAMILIES))
def test_attack_family_scores_no_more_than_fair(families, name):
    _, _, results = families
    _check_family(results[name], name)


def test_unusual_correct_answers_score_full(families):
    _, _, results = families
    data = results["unusual"]
    assert data["score"] == data["extra_data"]["max_score"] == 5, data["output"]
    assert not data["extra_data"]["flags"].get("fx.box"), data["extra_data"]["flags"]


def test_results_are_the_graders_and_leak_nothing(families):
    folder, out, results = families
    assert not (folder / "decoy" / "results.json").exists()
    assert results["read"]["extra_data"]["instructor"] == "fixture.ipynb"
    hidden_source = "seed=11"  # the fixture's hidden test
    for name, data in results.items():
        visible = json.dumps([t for t in data["tests"] if t["visibility"] != "hidden"])
        assert hidden_source not in visible, name
        assert "convlab.check.check_filter2d(filter2d_numpy" not in visible, name
        assert (out / f"{name}.results.json").stat().st_size < 60_000, name
    box = by_task(results["leak"])["fx.box"]
    excerpt = box["output"].split("while graded (an excerpt):\n", 1)[1]
    assert 100 < len(excerpt) < 700 and "more characters" in excerpt
    tiled = by_task(results["read"])["fx.tiled"]
    assert tiled["output"].startswith("✗")  # its printed pass lines are not a pass


def test_isolation_is_reported(families):
    _, _, results = families
    iso = results["checkers"]["extra_data"]["isolation"]
    if jail.probe()["ok"]:
        assert iso["os"] is True and iso["missing"] == []
    else:
        assert iso["os"] is False and iso["missing"]
        assert "no OS isolation" in results["checkers"]["output"]


@pytest.mark.gpu
def test_attack_families_on_a_gpu(tmp_path):
    """numba's real device arrays (mode "gpu"): host copies are counted through
    copy_to_host, a reply's device array must be exactly numba's, and a thread the answer
    started refuses the GPU task's call, as under the simulator."""
    names = ("offload", "numpy", "thread", "package")
    out = tmp_path / "graded"
    _write_families(tmp_path, out, names)
    grade_batch(tmp_path, out, jobs=1, instructor=FIXTURE, cell_timeout=120, mode="gpu",
                progress=False)
    for name in names:
        _check_family(json.loads((out / f"{name}.results.json").read_text()), name)


# ----------------------------------------------------------------------------------------
# Breaking grading for others


def _survivors(wait: float = 90) -> list[str]:
    """Processes of jailed users (or the killer's sleepers) alive when the batch has
    returned and still alive `wait` seconds later. Under xdist another file's gradings run
    beside this test, and their kernels (jailed users too) come and go within seconds; a
    process this batch left behind does not go."""
    import time

    deadline = time.monotonic() + wait
    first = set(_jailed_processes())  # the batch has returned: anything of it is here now
    while True:
        left = sorted(first & set(_jailed_processes()))  # later ones are other tests'
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1)


def _jailed_processes() -> list[str]:
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            uid = os.stat(f"/proc/{d}").st_uid
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if uid >= 0x3000_0000 or "convlab-attack-sleeper" in cmd:
            found.append(f"{d} uid={uid} {cmd[:80]}")
    return found


@pytest.mark.skipif(not jail.probe()["ok"], reason="needs OS isolation (root, namespaces): "
                    "the killer signals every process it can see")
def test_killer_and_saboteur_cost_only_themselves(tmp_path):
    folder = tmp_path / "class"
    reps = {"@BATCH@": str(folder), "@ROOT@": str(ROOT)}
    submission(folder / "killer" / "06.ipynb", *HONEST, "batch_killer.py", replace=reps)
    submission(folder / "saboteur" / "06.ipynb", *HONEST, "batch_saboteur.py", replace=reps)
    for name in ("honest_a", "honest_b"):
        submission(folder / name / "06.ipynb", *HONEST)
    before = {p: p.read_bytes() for p in folder.rglob("*.ipynb")}
    out = tmp_path / "graded"
    grade_batch(folder, out, jobs=2, instructor=FIXTURE, cell_timeout=CELL_TIMEOUT,
                progress=False)
    with open(out / "gradebook.csv", newline="") as f:
        book = {r["submission"]: r for r in csv.DictReader(f)}
    assert set(book) == {"killer__06", "saboteur__06", "honest_a__06", "honest_b__06"}
    for name in ("honest_a__06", "honest_b__06"):
        assert float(book[name]["score"]) == 5 and book[name]["status"] == "graded", book[name]
    killer = json.loads((out / "killer__06.results.json").read_text())
    kinds = killer["extra_data"]["tasks"]
    assert kinds["fx.box"] == "crashed" and kinds["fx.gemm"] == "timeout"
    assert killer["score"] == 3  # its honest fx.tiled, graded after two restarts
    assert float(book["saboteur__06"]["fx.box"]) == 0
    assert {p: p.read_bytes() for p in folder.rglob("*.ipynb")} == before  # nothing stubbed
    assert _survivors() == []
    for d in site.getsitepackages():
        assert not (Path(d) / "convlab_attack.pth").exists()
    assert not (ROOT / "convlab_attack_marker").exists()
    assert not Path(os.path.expanduser("~root/convlab_attack_marker")).exists()


# Lessons 11 and 12 ship helpers in the package that would answer their own tasks; the
# in-process guard refuses them inside a graded call (a second layer: see the README).
PACKAGE_ANSWERS = {
    "11_beyond_direct_conv": ("11.fft_filter", "def filter2d_fft(image, kernel):\n"
                              "    from convlab import fft_conv\n"
                              "    return fft_conv.filter2d_fft(image, kernel)\n"),
}


@pytest.mark.parametrize("lesson", list(PACKAGE_ANSWERS))
def test_package_helpers_cannot_answer_lesson_tasks(tmp_path, lesson):
    from convlab.grading.grade import grade
    from convlab.grading.gradescope import results_json

    task, answer = PACKAGE_ANSWERS[lesson]
    nb = nbf.read(ROOT / "exercises" / f"{lesson}.ipynb")
    cells = [c for c in nb.cells if c.get("cell_type") == "code"
             and nbf.exercise_id(nbf.source(c)) == task]
    assert len(cells) == 1
    cells[0]["source"] = f"# EXERCISE: {task}\n{answer}"
    path = tmp_path / f"{lesson}.ipynb"
    path.write_text(nbf.writes(nb), encoding="utf-8")
    data = results_json(grade(path, ROOT / "solutions" / f"{lesson}.ipynb"))
    entry = by_task(data)[task]
    assert entry["score"] == 0
    assert re.search(r"not allowed inside an answer", entry["output"]), entry["output"]


def test_without_os_isolation_grading_works_and_says_so(tmp_path, monkeypatch):
    from convlab.grading.grade import grade
    from convlab.grading.gradescope import results_json

    monkeypatch.setattr(jail, "_probe", {"ok": False, "why": "no namespaces here (test)"})
    sub = submission(tmp_path / "mine.ipynb", *HONEST)
    res = grade(sub, FIXTURE)
    assert res.score == res.max_score == 5, res.summary()
    assert "no OS isolation of the learner's code here (no namespaces here (test))" in (
        res.summary())
    iso = results_json(res)["extra_data"]["isolation"]
    assert iso["os"] is False and iso["missing"] == ["no namespaces here (test)"]


@pytest.mark.skipif(not jail.probe()["ok"], reason="needs OS isolation (root, namespaces)")
def test_a_killed_grader_leaves_no_kernel_behind(tmp_path):
    """The grader process SIGKILLed mid-cell (as `grade_one_process` does on its timeout):
    the jail and the learner's kernel go with it."""
    import signal
    import subprocess
    import sys
    import time

    nb = nbf.exercise_notebook(nbf.read(FIXTURE), "fixture")
    for c in nb.cells:
        if c.get("cell_type") == "code" and nbf.exercise_id(nbf.source(c)) == "fx.box":
            c["source"] = "# EXERCISE: fx.box\nimport time\ntime.sleep(600)\n"
    sub = tmp_path / "sleeper.ipynb"
    sub.write_text(nbf.writes(nb), encoding="utf-8")
    before = set(_jailed_processes())
    grader = subprocess.Popen([sys.executable, "-m", "convlab", "grade", str(sub), "--out",
                               str(tmp_path / "r.json"), "--quiet", "--instructor", str(FIXTURE),
                               "--cell-timeout", "300"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        mine: list = []
        while not mine and time.monotonic() < deadline:  # the kernel is up, in its cell
            time.sleep(0.5)
            mine = [p for p in set(_jailed_processes()) - before if "ipykernel" in p]
        assert mine, "the grading kernel never started"
        time.sleep(2)
        grader.send_signal(signal.SIGKILL)
        grader.wait(timeout=30)
        deadline = time.monotonic() + 20
        left = mine
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = sorted(set(mine) & set(_jailed_processes()))
        assert left == [], left
    finally:
        if grader.poll() is None:
            grader.kill()
