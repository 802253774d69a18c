"""Exercise builder: skeleton holes, learner-only SELF-CHECK cells, generated self-checks."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

from convlab.grading import notebook as nbf
from convlab.grading.build import repo_root, solution_notebooks

ROOT = repo_root(Path(__file__).resolve().parents[1])

SKELETON = """\
# EXERCISE: 01.demo
def f(x, n):
    ### BEGIN SOLUTION
    out = []
    for i in range(n):
        ### BEGIN HOLE: append x times i
        out.append(x * i)
        ### END HOLE
    ### BEGIN HOLE a, b: the first and the last
    a, b = out[0], out[-1]
    ### END HOLE
    return a + b
    ### END SOLUTION
"""


def test_holes_keep_the_given_lines_and_still_parse():
    out = nbf.strip_solution(SKELETON)
    assert out == ("# EXERCISE: 01.demo\ndef f(x, n):\n    out = []\n    for i in range(n):\n"
                   "        # TODO(learner): append x times i\n        pass\n"
                   "    # TODO(learner): the first and the last\n    a, b = ...\n"
                   "    return a + b\n")
    ast.parse(out)
    assert "HOLE" not in out and "x * i" not in out


def test_unfilled_holes_are_listed_and_filled_ones_are_not():
    """The grader names the holes a failing answer still holds: the skeleton's own holes,
    not an out[...] index, and none once they are filled."""
    holes = nbf.unfilled_holes(nbf.strip_solution(SKELETON))
    assert holes == ["# TODO(learner): append x times i (still `pass`)", "line 8: a, b = ..."]
    half = nbf.strip_solution(SKELETON).replace("        pass\n", "        out.append(x)\n")
    assert nbf.unfilled_holes(half) == ["line 8: a, b = ..."]
    assert nbf.unfilled_holes(SKELETON.replace("return a + b", "out[...] = 0")) == []


def test_a_region_without_holes_is_still_the_stub():
    out = nbf.strip_solution("def f():\n    ### BEGIN SOLUTION\n    return 1\n"
                             "    ### END SOLUTION\n")
    assert out == "def f():\n    # YOUR CODE HERE\n    pass\n"


@pytest.mark.parametrize("text, message", [
    ("### BEGIN HOLE: x\nx = 1\n### END HOLE\n", "a hole outside a solution region"),
    ("### BEGIN SOLUTION\n### BEGIN HOLE: x\n### BEGIN HOLE: y\n### END HOLE\n"
     "### END SOLUTION\n", "a hole inside another one"),
    ("### BEGIN SOLUTION\n### BEGIN HOLE: x\nx = 1\n### END SOLUTION\n",
     "line 2: a hole is never closed"),
    ("### BEGIN SOLUTION\n### BEGIN HOLE\nx = 1\n### END HOLE\n### END SOLUTION\n",
     "a hole needs the text of its TODO"),
    ("### BEGIN SOLUTION\nx = 1\n### END HOLE\n### END SOLUTION\n", "without a hole"),
])
def test_broken_holes_are_format_errors(text, message):
    with pytest.raises(nbf.NotebookFormatError, match=re.escape(message)):
        nbf.strip_solution(text)


def _notebook():
    cells = [nbformat.v4.new_code_cell(SKELETON),
             nbformat.v4.new_code_cell("# SELF-CHECK: 01.demo\nassert f(2, 3) == 4"),
             nbformat.v4.new_code_cell("# TEST: 01.demo points=2\nassert f(2, 3) == 4\n"
                                       "### BEGIN HIDDEN TESTS\nassert f(1, 2) == 1\n"
                                       "### END HIDDEN TESTS"),
             nbformat.v4.new_code_cell('# TEST: 01.demo points=1\nassert f(1, 1) == 0, "x\\\\"')]
    nb = nbformat.v4.new_notebook(cells=cells)
    for i, c in enumerate(nb.cells):
        c["id"] = f"c{i}"
    return nb


def test_self_check_cells_stay_for_the_learner_and_leave_grading():
    nb = _notebook()
    ex = nbf.exercise_notebook(nb, "demo")
    grading = nbf.grading_notebook(nb, "demo")
    assert [nbf.self_check_id(nbf.source(c)) for c in ex.cells] == [
        None, "01.demo", None, None, "01.demo"]
    assert all(nbf.self_check_id(nbf.source(c)) is None for c in grading.cells)
    assert len(grading.cells) == 3


def test_generated_self_check_runs_the_public_tests_only(capsys):
    ex = nbf.exercise_notebook(_notebook(), "demo")
    cell = nbf.source(ex.cells[-1])
    assert ex.cells[-1]["id"] == "self-check-01-demo"
    assert "f(1, 2)" not in cell  # the hidden test stays hidden
    solved = {}
    exec(compile(SKELETON.replace("### BEGIN HOLE: append x times i", "")
                 .replace("### BEGIN HOLE a, b: the first and the last", "")
                 .replace("### END HOLE", "").replace("### BEGIN SOLUTION", "")
                 .replace("### END SOLUTION", ""), "answer", "exec"), solved)
    exec(compile(cell, "self-check", "exec"), solved)
    assert "01.demo: 3 / 3 points from the public tests" in capsys.readouterr().out
    stub = {}
    exec(compile(nbf.source(ex.cells[0]), "stub", "exec"), stub)
    exec(compile(cell, "self-check", "exec"), stub)
    out = capsys.readouterr().out
    assert "01.demo: 0 / 3 points" in out and "✗ test 1 (2 points): TypeError" in out


def test_a_self_check_for_an_unknown_task_is_a_format_problem():
    nb = _notebook()
    nb.cells[1].source = "# SELF-CHECK: 01.other\npass"
    assert any("names no task" in p for p in nbf.validate_solution(nb, "demo"))


GPU_NOTEBOOKS = [p for p in solution_notebooks(ROOT / "solutions") if p.name[:2] in
                 {"04", "05", "06", "07", "08", "09"}]


@pytest.mark.parametrize("path", GPU_NOTEBOOKS, ids=lambda p: p.stem)
def test_gpu_tasks_have_skeletons_and_three_hints(path):
    nb = nbf.read(path)
    ex = nbf.exercise_notebook(nb, path.name)
    lay = nbf.layout(nb, path.name)
    for tid, task in lay.tasks.items():
        answer = nbf.source(ex.cells[[nbf.exercise_id(nbf.source(c)) for c in ex.cells]
                                     .index(tid)])
        assert "# TODO(learner):" in answer, f"{tid}: no skeleton"
        ast.parse(nbf.python_source(answer))
        after = nb.cells[task.answer_cell + 1]
        assert after.cell_type == "markdown", f"{tid}: no hints under the answer"
        summaries = re.findall(r"<details><summary>Hint (\d): ", nbf.source(after))
        assert summaries == ["1", "2", "3"], f"{tid}: {summaries}"
        assert nbf.source(after).count("</details>") == 3
        checks = [c for c in ex.cells if nbf.self_check_id(nbf.source(c)) == tid]
        assert any("convlab.check.self_check(" in nbf.source(c) for c in checks), tid
