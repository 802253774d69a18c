"""Every lesson notebook (notebooks/) runs top to bottom ("Restart and Run All") with
nbclient: one test per notebook (solution notebooks run in tests/test_grading.py).

Under the simulator (CI) the notebooks pick tiny sizes by themselves and each should take
well under a minute; on a GPU machine they run at full size (the lead's GPU run), so the
time limit there is larger. Nothing is skipped: a notebook that is missing nbclient's
kernel, or raises in any cell, fails its test with the cell and the error.

Structure checks ride along (cheap, one test per notebook): the first code cell calls
``convlab.setup()``; solution notebooks are committed without outputs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

import convlab

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted(
    (ROOT / "solutions").glob("*.ipynb"))
SIM = convlab.is_simulator()
CELL_TIMEOUT = 300 if SIM else 600  # seconds per cell
NOTEBOOK_TIMEOUT = 600 if SIM else 1800  # seconds per notebook (pytest-timeout)
SLOW_NOTE_S = 60  # under the simulator a notebook slower than this is reported


def _ids(paths):
    return [f"{p.parent.name}/{p.name}" for p in paths]


def test_every_lesson_has_one_notebook_and_its_exercises():
    def lessons(folder):
        return [p.name[:2] for p in NOTEBOOKS if p.parent.name == folder]

    assert lessons("notebooks") == [f"{i:02d}" for i in range(14)]  # the syllabus: 00-13
    assert lessons("solutions") == [f"{i:02d}" for i in range(13)]  # 13 grades the ladder
    lesson = {p.name for p in NOTEBOOKS if p.parent.name == "notebooks"}
    assert {p.name for p in NOTEBOOKS if p.parent.name == "solutions"} <= lesson


def _kernel_env() -> dict:
    env = dict(os.environ)
    env["CONVLAB_MODE"] = "sim" if SIM else "gpu"
    if SIM:
        # CI sizes: a developer's CONVLAB_REAL_CPU=1 must not turn CI into a benchmark
        env.pop("CONVLAB_REAL_CPU", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


# The lessons run here. Every solution notebook runs top to bottom in tests/test_grading.py
# (graded against itself in the grading kernel, which fails on any cell error), so running
# solutions/ here as well would only do that work twice.
LESSONS = [p for p in NOTEBOOKS if p.parent.name == "notebooks"]


@pytest.mark.timeout(NOTEBOOK_TIMEOUT)
@pytest.mark.parametrize("path", LESSONS, ids=_ids(LESSONS))
def test_notebook_runs_top_to_bottom(path):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.monotonic()
    try:
        client.execute(env=_kernel_env(), cwd=str(path.parent))
    except CellExecutionError as e:
        pytest.fail(f"{path.parent.name}/{path.name} raised in a cell:\n{str(e)[-4000:]}")
    seconds = time.monotonic() - t0
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, f"error outputs: {[(o['ename'], o['evalue']) for o in errors]}"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), "some code cells did not run"
    print(f"{path.parent.name}/{path.name}: {len(code)} code cells in {seconds:.1f} s "
          f"({'simulator' if SIM else 'GPU'})")
    if SIM and seconds > SLOW_NOTE_S:
        print(f"NOTE: {path.name} took {seconds:.0f} s under the simulator; keep it under "
              f"{SLOW_NOTE_S} s")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_structure(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "a notebook without code cells"
    first = code[0].source
    assert "import convlab" in first and "convlab.setup()" in first, (
        f"the first code cell must be `import convlab` / `convlab.setup()`, got:\n{first}")
    if path.parent.name == "solutions":
        with_outputs = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                        and (c.get("outputs") or c.get("execution_count"))]
        assert not with_outputs, (f"solutions/ are committed without outputs; cells "
                                  f"{with_outputs} have some (clear them)")
