"""Helpers for the grading tests: the fixture exercise and submissions built from answer files.

tests/data/grading/fixture.ipynb is a solution notebook with three tasks (fx.box, fx.gemm,
fx.tiled); tests/data/grading/answers/*.py hold answer cells (each starts at a
``# EXERCISE: <id>`` line) that replace the stubs of the generated exercise notebook.
"""

from __future__ import annotations

from pathlib import Path

from convlab.grading import notebook as nbf

DATA = Path(__file__).parent / "data" / "grading"
FIXTURE = DATA / "fixture.ipynb"
ANSWERS = DATA / "answers"
SOLVED = ("solution_box.py", "solution_gemm.py")  # two of the three tasks right


def answers(path) -> dict:
    """id -> answer cell source, from a file of ``# EXERCISE:`` blocks."""
    out, cur = {}, None
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        tid = nbf.exercise_id(line) if line.startswith("# EXERCISE:") else None
        if tid:
            cur = tid
            out[cur] = [line]
        elif cur:
            out[cur].append(line)
    return {k: "\n".join(v).rstrip() + "\n" for k, v in out.items()}


def submission(dest, *files, replace=None) -> Path:
    """The fixture's exercise notebook with the answers of `files` (later files win)."""
    nb = nbf.exercise_notebook(nbf.read(FIXTURE), "fixture")
    ans = {}
    for f in files:
        ans.update(answers(ANSWERS / f))
    used = set()
    for c in nb.cells:
        tid = nbf.exercise_id(nbf.source(c)) if c.get("cell_type") == "code" else None
        if tid in ans:
            text = ans[tid]
            for k, v in (replace or {}).items():
                text = text.replace(k, v)
            c["source"] = text
            used.add(tid)
    assert used == set(ans), f"answers for unknown tasks: {set(ans) - used}"
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(nbf.writes(nb), encoding="utf-8")
    return dest


def by_task(results: dict) -> dict:
    """results.json -> {task id: test entry}."""
    return {t["name"]: t for t in results["tests"]}
