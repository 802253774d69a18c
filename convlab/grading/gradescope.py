"""Gradescope: the results.json format and the autograder bundle.

``python -m convlab autograder --out autograder.zip`` writes a zip with

- ``setup.sh``: installs Python and convlab (no GPU extras) into /autograder/venv;
- ``run_autograder``: grades the submitted notebook and writes
  /autograder/results/results.json;
- ``convlab_src/``: the package source;
- ``graders/``: the grading notebooks, i.e. the solution notebooks with their solution
  regions stubbed (no solution ships) and hidden tests kept;
- ``private_tests/``: the instructor's private tests, when a folder is given.
"""

from __future__ import annotations

import json
import stat
import zipfile
from pathlib import Path

from . import notebook as nbf
from .build import repo_root, solution_notebooks

VISIBILITY = "visible"


def results_json(result) -> dict:
    """Gradescope's results.json for a GradeResult."""
    tests = []
    for t in result.tasks:
        text = "✓ passed" if t.passed else f"✗ {t.message or t.kind}"
        if t.output.strip():
            text += "\n" + t.output.rstrip()
        if getattr(t, "learner_output", "").strip():
            text += "\n--- what your code printed while graded (an excerpt):\n" + t.learner_output
        tests.append({"name": t.id, "score": t.score, "max_score": t.max_score,
                      "status": t.status, "output": text, "visibility": VISIBILITY})
    for sp in getattr(result, "speed", []):
        entry = {"name": sp.id, "score": sp.score, "max_score": sp.max_score,
                 "output": sp.line(), "visibility": VISIBILITY}
        if sp.kind != "not-graded":
            entry["status"] = "passed" if sp.passed else "failed"
        tests.append(entry)
    flags = result.flags
    if flags:
        tests.append({"name": "integrity review (instructor only, not scored)", "score": 0,
                      "max_score": 0, "status": "passed", "visibility": "hidden",
                      "output": "\n".join(f"{k}: {', '.join(v)}" for k, v in flags.items())})
    out = {"score": result.score, "execution_time": round(result.seconds, 1),
           "output": result.summary(), "visibility": VISIBILITY, "stdout_visibility": "hidden",
           "tests": tests,
           "extra_data": {"max_score": result.max_score, "restarts": result.restarts,
                          "flags": flags, "instructor": Path(result.instructor).name,
                          "tasks": {t.id: t.kind for t in result.tasks},
                          "cell_errors": [list(e) for e in result.cell_errors],
                          "log": result.log, "isolation": getattr(result, "isolation", {}),
                          "assignment": getattr(result, "assignment", "")}}
    speeds = getattr(result, "speed", [])
    if speeds:
        from .speed import leaderboard

        board = leaderboard(speeds)
        if board:
            out["leaderboard"] = board
        out["extra_data"]["speed"] = {
            s.task: {"kind": s.kind, "score": s.score, "max_score": s.max_score,
                     "speed": s.speed, "share_of_par": s.share, "course": s.course,
                     "course_ms": s.course_ms, "learner_ms": s.learner_ms,
                     "gflops": s.gflops, "message": s.message} for s in speeds}
        for d in out["extra_data"]["speed"].values():
            for k, v in d.items():
                if isinstance(v, float) and v != v or v in (float("inf"), float("-inf")):
                    d[k] = None
    if result.error:
        out["output"] = f"Could not grade this submission: {result.error}\n\n" + out["output"]
        out["extra_data"]["error"] = result.error
    return out


def error_results(message: str, max_score: float = 0) -> dict:
    """results.json for a submission that could not be graded at all."""
    return {"score": 0, "output": message, "visibility": VISIBILITY,
            "stdout_visibility": "hidden", "tests": [],
            "extra_data": {"max_score": max_score, "error": message}}


def write_results(data: dict, path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, when the autograder image is built (Ubuntu, no GPU).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if command -v apt-get >/dev/null 2>&1; then  # Gradescope's images are Ubuntu
  apt-get update -qq
  apt-get install -y -qq python3 python3-venv python3-pip >/dev/null
fi
python3 -m venv /autograder/venv
/autograder/venv/bin/python -m pip install --quiet --upgrade pip
# convlab without GPU extras: the grader runs every kernel under the Numba CUDA simulator.
/autograder/venv/bin/python -m pip install --quiet /autograder/source/convlab_src
# warm the imports once so the first submission is not slower than the others
CONVLAB_MODE=sim NUMBA_ENABLE_CUDASIM=1 /autograder/venv/bin/python -c \\
  "import convlab; convlab.setup('sim'); import convlab.kernels, convlab.check, nbclient"
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for each submission; it writes $ROOT/results/results.json.
# ROOT and PYTHON can be overridden to try the bundle outside Gradescope.
set -uo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
PYTHON="${CONVLAB_PYTHON:-$ROOT/venv/bin/python}"
SRC="$ROOT/source"
OUT="$ROOT/results/results.json"
mkdir -p "$ROOT/results"
zero() {  # results.json with score 0 and a message
  printf '{"score": 0, "output": "%s", "tests": []}\\n' "$1" > "$OUT"
}
sub=$(find "$ROOT/submission" -name '*.ipynb' -not -path '*/.ipynb_checkpoints/*' 2>/dev/null \\
      | sort | head -n 1)
if [ -z "$sub" ]; then
  zero "No .ipynb file in the submission: upload your exercise notebook."
  exit 0
fi
# the learner's code may see neither the bundle (graders, private tests, this script) nor
# the submission folder: the grader reads the notebook and passes on only its answers
args=(--instructor "$SRC/graders" --out "$OUT" --hide "$SRC" --hide "$ROOT/submission" @OPTIONS@)
if [ -d "$SRC/private_tests" ]; then args+=(--private-tests "$SRC/private_tests"); fi
cd "$ROOT"
"$PYTHON" -m convlab grade "$sub" "${args[@]}"
status=$?
if [ ! -s "$OUT" ]; then
  zero "The grader failed (exit status $status); please tell your instructor."
fi
exit 0
"""

_PACKAGE_FILES = ("pyproject.toml", "README.md", "LICENSE", "LICENSE.md")


def _add(zf: zipfile.ZipFile, name: str, data: bytes | str, executable: bool = False):
    info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
    mode = 0o755 if executable else 0o644
    info.external_attr = (stat.S_IFREG | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data.encode() if isinstance(data, str) else data)


def write_autograder(out, root=None, private_tests=None, notebooks=None,
                     cell_timeout: float | None = None,
                     total_timeout: float | None = None, gpu: bool = False) -> list[str]:
    """Write the Gradescope autograder zip of one assignment; return the names it holds.

    notebooks: the solution notebook (stem, file name or two-digit number) of the
    assignment; may be left out when solutions/ holds only one. A submission whose tasks
    are not that assignment's scores 0 with an error. gpu: for a self-hosted runner with
    a CUDA GPU: setup.sh installs the GPU extras and run_autograder grades with ``--gpu``
    (speed tasks timed, leaderboard entries in results.json).
    """
    root = repo_root(root)
    sols = solution_notebooks(root / "solutions")
    if notebooks:
        keep = set(notebooks)
        sols = [s for s in sols if s.stem in keep or s.name in keep or s.stem[:2] in keep]
    if not sols:
        raise FileNotFoundError(f"no solution notebooks in {root / 'solutions'}")
    if len(sols) > 1:
        raise ValueError("a Gradescope bundle grades one assignment: name it with --notebooks "
                         f"(one of {', '.join(s.stem for s in sols)})")
    options = ["--assignment", sols[0].stem, *(["--gpu"] if gpu else [])]
    if cell_timeout:
        options += ["--cell-timeout", f"{cell_timeout:g}"]
    if total_timeout:
        options += ["--total-timeout", f"{total_timeout:g}"]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pkg = Path(__file__).resolve().parents[1]
    with zipfile.ZipFile(out, "w") as zf:
        setup = SETUP_SH
        if gpu:
            setup = setup.replace("# convlab without GPU extras: the grader runs every kernel "
                                  "under the Numba CUDA simulator.", "# convlab with the GPU "
                                  "extras: kernels run and are timed on the GPU.").replace(
                "/autograder/source/convlab_src\n", "'/autograder/source/convlab_src[gpu]'\n")
        _add(zf, "setup.sh", setup, executable=True)
        _add(zf, "run_autograder", RUN_AUTOGRADER.replace("@OPTIONS@", " ".join(options)),
             executable=True)
        for name in _PACKAGE_FILES:
            p = pkg.parent / name
            if p.is_file():
                _add(zf, f"convlab_src/{name}", p.read_bytes())
        for p in sorted(pkg.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo"):
                _add(zf, f"convlab_src/convlab/{p.relative_to(pkg).as_posix()}", p.read_bytes())
        for s in sols:
            gnb = nbf.grading_notebook(nbf.read(s), s.name)
            _add(zf, f"graders/{s.name}", nbf.writes(gnb))
        if private_tests:
            pdir = Path(private_tests)
            for p in sorted(pdir.rglob("*")):
                if p.is_file() and p.suffix in (".py", ".ipynb"):
                    _add(zf, f"private_tests/{p.relative_to(pdir).as_posix()}", p.read_bytes())
        names = zf.namelist()
    return names
