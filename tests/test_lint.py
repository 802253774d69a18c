"""No development history where learners read it, no noise in committed outputs.

- Notebook prose (markdown cells of notebooks/, solutions/, exercises/) and the package's
  docstrings and comments must not mention the internal design file (COURSE.md), internal
  folders, "run 1" / "run 2" style run labels, or issue / pull-request numbers: provenance
  lives in the results files' metadata.
- Committed outputs must not hold ``NumbaPerformanceWarning`` blocks or a widget's text
  fallback (``IntSlider(value=…)``, ``VBox(children=…``, "Error displaying widget"), which
  is what a reader without a widget frontend sees instead of the widget.

The planted tests show each check failing on a notebook or module written to break it.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p for d in ("notebooks", "solutions", "exercises")
                   for p in (ROOT / d).glob("*.ipynb"))

HISTORY = re.compile(
    r"COURSE\.md"
    r"|\brun[ _-]?\d+\b(?![–\-—×x.,]?\d)"  # "run 2", "run1"; not "run 2–64× slower"
    r"|\b(?:issue|PR|pull request)s?\s*#?\d+"
    r"|(?<![\w&#/])#\d+\b"  # "#17"; not "&#x27;" or a heading
    r"|/work/|\b(?:shared|notes)/",
    re.IGNORECASE)
NUMBA_WARNING = "NumbaPerformanceWarning"
WIDGET_FALLBACK = re.compile(
    r"^\s*(?:interactive|[VH]?Box|GridBox|Tab|Accordion|\w*Slider|Dropdown|ToggleButtons|"
    r"Button|Checkbox|Play|RadioButtons|Select(?:Multiple|ionSlider)?|Text(?:area)?)\("
    r"|\b(?:Int|Float)(?:Range)?Slider\(|Error displaying widget", re.MULTILINE)
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def history_mentions(text: str) -> list[str]:
    """Each match of HISTORY with a little context, for the failure message."""
    out = []
    for m in HISTORY.finditer(text):
        ctx = text[max(0, m.start() - 40):m.end() + 40].replace("\n", " ")
        out.append(f"{m.group(0)!r} in '…{ctx}…'")
    return out


def _source(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def _cells(path: Path) -> list:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def prose_offenders(path: Path) -> list[str]:
    """History mentions in a notebook's markdown cells: 'cell N: ...'."""
    return [f"cell {i}: {hit}" for i, c in enumerate(_cells(path))
            if c.get("cell_type") == "markdown" for hit in history_mentions(_source(c))]


def _output_text(out) -> str:
    data = out.get("data", {})
    parts = [out.get("text", ""), data.get("text/plain", ""), out.get("traceback", [])]
    return "".join("".join(p) if isinstance(p, list) else p for p in parts)


def output_offenders(path: Path) -> list[str]:
    """Committed outputs with a NumbaPerformanceWarning or a widget's text fallback."""
    bad = []
    for i, c in enumerate(_cells(path)):
        for out in c.get("outputs", []) if c.get("cell_type") == "code" else []:
            text = _output_text(out)
            if NUMBA_WARNING in text:
                bad.append(f"cell {i}: a {NUMBA_WARNING} block")
            m = WIDGET_FALLBACK.search(text)
            if m:
                kind = "widget output" if WIDGET_MIME in out.get("data", {}) else "output"
                bad.append(f"cell {i}: {kind} shows the widget's text fallback "
                           f"{text[m.start():m.start() + 60]!r}")
    return bad


def python_offenders(path: Path) -> list[str]:
    """History mentions in a module's docstrings and comments: 'file:line: ...'."""
    src = path.read_text(encoding="utf-8")
    rel = _rel(path)
    bad = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            bad += [f"{rel}:{getattr(node, 'lineno', 1)} docstring: {hit}"
                    for hit in history_mentions(doc or "")]
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            bad += [f"{rel}:{tok.start[0]} comment: {hit}" for hit in history_mentions(tok.string)]
    return bad


def package_groups() -> list[str]:
    """'convlab' (its top-level modules) and each subpackage folder, one test each."""
    pkg = ROOT / "convlab"
    subs = sorted(p.relative_to(ROOT).as_posix() for p in pkg.iterdir()
                  if p.is_dir() and (p / "__init__.py").exists())
    return ["convlab", *subs]


def group_files(group: str) -> list[Path]:
    d = ROOT / group
    return sorted(d.glob("*.py")) if group == "convlab" else sorted(d.rglob("*.py"))


def _group_params():
    return list(package_groups())


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def _ids(paths):
    return [f"{p.parent.name}/{p.name}" for p in paths]


# ----------------------------------------------------------------------------------------
# The repository


def test_there_is_something_to_lint():
    assert any(p.parent.name == "notebooks" for p in NOTEBOOKS)
    assert "convlab/kernels" in package_groups()
    assert len(group_files("convlab")) > 5


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_prose_has_no_development_history(path):
    bad = prose_offenders(path)
    assert not bad, f"{_rel(path)}:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_committed_outputs_have_no_warnings_or_widget_fallbacks(path):
    bad = output_offenders(path)
    assert not bad, f"{_rel(path)}:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("group", _group_params())
def test_package_docstrings_have_no_development_history(group):
    files = group_files(group)
    assert files, f"no modules in {group}"
    bad = [b for f in files for b in python_offenders(f)]
    assert not bad, "\n  ".join(["development history in docstrings/comments:", *bad])


# ----------------------------------------------------------------------------------------
# The checks can fail


def _notebook(tmp_path, cells) -> Path:
    nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    p = tmp_path / "planted.ipynb"
    p.write_text(json.dumps(nb), encoding="utf-8")
    return p


def _md(text):
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _code(outputs):
    return {"cell_type": "code", "metadata": {}, "source": "f()", "execution_count": 1,
            "outputs": outputs}


def test_a_planted_run_2_sentence_fails_the_prose_check(tmp_path):
    clean = _notebook(tmp_path, [_md("# 05 · Coalescing\n\nGPUs run 2–64× slower in fp64.")])
    assert prose_offenders(clean) == []
    planted = _notebook(tmp_path, [
        _md("# 05 · Coalescing\n\nGPUs run 2–64× slower in fp64."),
        _md("The tiles are wider.\nRun 2 measured both layouts on the same work.")])
    bad = prose_offenders(planted)
    assert len(bad) == 1 and bad[0].startswith("cell 1: 'Run 2'"), bad
    with pytest.raises(AssertionError, match=r"cell 1: 'Run 2' in .*measured both layouts"):
        test_notebook_prose_has_no_development_history(planted)


@pytest.mark.parametrize("sentence, hit", [
    ("COURSE.md's reference numbers expected 30%.", "COURSE.md"),
    ("as in run1 of the sweep", "run1"),
    ("fixed for issue 17", "issue 17"),
    ("see #15 for the ceilings", "#15"),
    ("written in /work/notes/plan.md", "/work/"),
])
def test_each_kind_of_history_is_caught(tmp_path, sentence, hit):
    bad = prose_offenders(_notebook(tmp_path, [_md(sentence)]))
    assert bad and bad[0].startswith(f"cell 0: {hit!r}"), bad


def test_planted_warning_and_widget_fallback_outputs_fail(tmp_path):
    warning = {"output_type": "stream", "name": "stderr",
               "text": "dispatcher.py:748: NumbaPerformanceWarning: Grid size 1 will likely "
                       "result in GPU under-utilization\n"}
    widget = {"output_type": "execute_result", "execution_count": 1, "metadata": {},
              "data": {WIDGET_MIME: {"model_id": "ab", "version_major": 2, "version_minor": 0},
                       "text/plain": "interactive(children=(IntSlider(value=3, max=9), "
                                     "Output()))"}}
    fine = {"output_type": "stream", "name": "stdout", "text": "✓ conv2d: 6 cases passed\n"}
    assert output_offenders(_notebook(tmp_path, [_code([fine])])) == []
    bad = output_offenders(_notebook(tmp_path, [_code([fine, warning]), _code([widget])]))
    assert bad[0] == "cell 0: a NumbaPerformanceWarning block", bad
    assert bad[1].startswith("cell 1: widget output shows the widget's text fallback "
                             "'interactive(children=(IntSlider"), bad
    assert len(bad) == 2


def test_planted_docstring_and_comment_fail(tmp_path):
    mod = tmp_path / "planted.py"
    mod.write_text('"""A kernel.\n\nOn the H200 (run 2, batch 32) it was fastest."""\n\n'
                   "def f():\n    return 1  # tuned in run 1\n\n\n"
                   'def g():\n    """Clean: runs 2-64x slower in fp64."""\n', encoding="utf-8")
    bad = python_offenders(mod)
    assert len(bad) == 2, bad
    assert "planted.py:1 docstring: 'run 2' in '…" in bad[0], bad
    assert "planted.py:6 comment: 'run 1'" in bad[1], bad
