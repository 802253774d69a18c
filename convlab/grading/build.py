"""solutions/NN_*.ipynb -> exercises/NN_*.ipynb (``python -m convlab exercises build``).

The exercise keeps every cell of the solution, with solution regions replaced by
``# YOUR CODE HERE`` + ``pass``, hidden-test regions removed, outputs and execution counts
cleared. The output is a pure function of the solution, so ``--check`` (rebuild in
memory, compare bytes) is stable and CI can run it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from . import notebook as nbf

NOTEBOOK_NAME = re.compile(r"^\d\d_[\w\-]+\.ipynb$")


def repo_root(start=None) -> Path:
    """The folder holding solutions/: `start` when given; else the current folder if it
    has one, else the checkout this package lives in."""
    if start is not None:
        return Path(start)
    here = Path.cwd()
    if (here / "solutions").is_dir():
        return here
    pkg_parent = Path(__file__).resolve().parents[2]
    if (pkg_parent / "solutions").is_dir():
        return pkg_parent
    return here


def solution_notebooks(solutions_dir) -> list[Path]:
    d = Path(solutions_dir)
    return sorted(p for p in d.glob("*.ipynb") if NOTEBOOK_NAME.match(p.name)) if d.is_dir() else []


@dataclass
class BuildReport:
    written: list = field(default_factory=list)  # exercise files (re)written
    stale: list = field(default_factory=list)  # exercise files out of date (or orphaned)
    removed: list = field(default_factory=list)  # orphaned exercise files deleted
    unchanged: list = field(default_factory=list)
    problems: list = field(default_factory=list)  # solution notebooks that break the format
    warnings: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.stale

    def text(self, check: bool) -> str:
        lines = [f"format problem: {p}" for p in self.problems]
        lines += [f"warning: {w}" for w in self.warnings]
        if check:
            lines += [f"stale: {p} (run `python -m convlab exercises build`)" for p in self.stale]
            if self.ok:
                lines.append(f"exercises up to date ({len(self.unchanged)} notebooks)")
        else:
            lines += [f"wrote {p}" for p in self.written]
            lines += [f"removed {p} (no solution notebook)" for p in self.removed]
            lines.append(f"{len(self.written)} written, {len(self.unchanged)} unchanged, "
                         f"{len(self.removed)} removed")
        return "\n".join(lines)


def exercise_text(solution_path: Path, root: Path) -> str:
    nb = nbf.read(solution_path)
    rel = solution_path.resolve().relative_to(root.resolve()) if solution_path.resolve(
    ).is_relative_to(root.resolve()) else Path(solution_path.name)
    return nbf.writes(nbf.exercise_notebook(nb, str(rel), generated_from=rel.as_posix()))


def build(root=None, check: bool = False) -> BuildReport:
    """Regenerate exercises/ from solutions/ (check=True: only compare, write nothing)."""
    root = repo_root(root)
    sol_dir, ex_dir = root / "solutions", root / "exercises"
    rep = BuildReport()
    wanted = set()
    for sol in solution_notebooks(sol_dir):
        target = ex_dir / sol.name
        wanted.add(sol.name)
        rel_target = target.relative_to(root).as_posix()
        try:
            nb = nbf.read(sol)
            if any(c.get("outputs") for c in nb.cells if c.get("cell_type") == "code"):
                rep.warnings.append(f"{sol.relative_to(root)} is committed with outputs "
                                    "(solutions/ should have none)")
            text = exercise_text(sol, root)
        except nbf.NotebookFormatError as e:
            rep.problems.append(str(e))
            continue
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current == text:
            rep.unchanged.append(rel_target)
        elif check:
            rep.stale.append(rel_target)
        else:
            ex_dir.mkdir(exist_ok=True)
            target.write_text(text, encoding="utf-8")
            rep.written.append(rel_target)
    if ex_dir.is_dir():
        for ex in solution_notebooks(ex_dir):
            if ex.name not in wanted:
                rel = ex.relative_to(root).as_posix()
                if check:
                    rep.stale.append(rel + " (its solution notebook is gone)")
                else:
                    ex.unlink()
                    rep.removed.append(rel)
    return rep
