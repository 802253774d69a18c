"""The course in a real browser: JupyterLab from .venv, headless Debian Chromium, Playwright.

Lesson 01 is opened, its outputs cleared and all its cells run from the Run menu under
the simulator; then the filter explorer's slider is moved with the keyboard and its
picture must change, every plot must be a decoded PNG image and no output may show a
widget's text fallback (what JupyterLab shows when the widget extension is missing).
The generated exercise notebook of lesson 01 must open with its first answer cell
editable. Screenshots go to artifacts/browser/.

Needs Debian's chromium (apt-get install chromium chromium-driver), the `playwright`
Python package (the `dev` extra) and .venv (made by `make lab` / `make test`). Without
them the tests skip with the reason, unless CONVLAB_BROWSER_REQUIRED=1 (set by .ci/run
when it installed the browser), which turns a skip into a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import nbformat
import pytest

from tests.browser import notebook as nb
from tests.browser.lab import (
    ARTIFACTS,
    CHROMIUM_ARGS,
    ROOT,
    chromium_path,
    jupyter_lab,
    jupyter_lab_command,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(420)]

LESSON = os.environ.get("CONVLAB_BROWSER_LESSON", "notebooks/01_convolution_numpy.ipynb")
EXERCISE = os.environ.get("CONVLAB_BROWSER_EXERCISE", "exercises/01_convolution_numpy.ipynb")
REQUIRED = os.environ.get("CONVLAB_BROWSER_REQUIRED") == "1"
RUN_ALL_TIMEOUT = 240  # seconds for lesson 01 under the simulator on 2 busy cores


def _unavailable(reason: str):
    if REQUIRED:
        pytest.fail(f"{reason} (CONVLAB_BROWSER_REQUIRED=1: CI installed the browser)")
    pytest.skip(reason)


def _shot(target, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    target.screenshot(path=str(path))
    return path


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    cmd = jupyter_lab_command()
    if cmd is None:
        _unavailable("no .venv/bin/jupyter: run `make lab` or `make test` first")
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "root"
    root.mkdir()
    # The server gets a copy of the course notebooks: running them must not rewrite the
    # repository's files (JupyterLab autosaves).
    for rel in {LESSON, EXERCISE}:
        if (ROOT / rel).exists():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, root / rel)
    with jupyter_lab(cmd, root, tmp) as server:
        yield server


@pytest.fixture(scope="module")
def browser():
    exe = chromium_path()
    if exe is None:
        _unavailable("Debian's chromium is not installed (apt-get install chromium "
                     "chromium-driver); the browser test needs it")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed (pip install -e '.[dev]')")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser, request):
    ctx = browser.new_context(viewport={"width": 1280, "height": 1000})
    pg = ctx.new_page()
    pg.set_default_timeout(30_000)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.console_errors = errors
    yield pg
    try:  # the page as the test left it, pass or fail
        _shot(pg, f"{request.node.name}-last.png")
    finally:
        ctx.close()


def _explorer(page):
    """The first cell output that holds a slider widget and an image: the filter explorer."""
    cells = page.locator(f"{nb.PANEL} .jp-Notebook .jp-CodeCell")
    for i in range(cells.count()):
        cell = cells.nth(i)
        out = cell.locator(".jp-Cell-outputWrapper")
        if out.locator(".widget-slider [role='slider']").count() and \
                out.locator("img").count():
            return i, out
    return None, None


def test_lesson01_runs_and_its_explorer_redraws(page, lab):
    assert (lab.root / LESSON).exists(), f"{LESSON} is missing"
    t0 = time.monotonic()
    cells = nbformat.read(lab.root / LESSON, 4).cells
    n_code = sum(c.cell_type == "code" for c in cells)
    st = nb.open_notebook(page, lab.url(LESSON), len(cells))
    assert len(st["prompts"]) == n_code, f"{len(st['prompts'])} code cells shown of {n_code}"

    # What a learner does: clear old outputs, then Run > Run All Cells.
    nb.menu(page, "Edit", "Clear Outputs of All Cells")
    nb.menu(page, "Run", "Run All Cells")
    st = nb.wait_kernel_idle(page, RUN_ALL_TIMEOUT)
    t_run = time.monotonic() - t0
    _shot(page, "lesson01-after-run-all.png")
    outs = nb.outputs(page)

    errors = [o for o in outs if nb.ERROR.search(o["text"]) and "stderr" in o["mime"]]
    if errors:
        pytest.fail("cell raised:\n" + "\n---\n".join(
            f"cell {o['cell']}: {o['text'].strip()[:800]}" for o in errors), pytrace=False)
    not_run = [i for i, p in enumerate(st["prompts"]) if not re.fullmatch(r"\[\d+\]:", p)]
    assert not not_run, f"code cells {not_run} did not run (prompts {st['prompts']})"

    fallback = [o for o in outs if nb.FALLBACK.search(o["text"])
                or any(t in o["text"] for t in nb.FALLBACK_TEXTS)]
    if fallback:
        pytest.fail(
            "a widget or plot rendered as text (is the widget extension "
            "@jupyter-widgets/jupyterlab-manager installed and enabled?):\n"
            + "\n---\n".join(f"cell {o['cell']}: {o['text'].strip()[:400]}" for o in fallback),
            pytrace=False)

    plots = [o for o in outs if o["mime"] == "image/png"]
    assert plots, "no matplotlib plot rendered as an image/png output"
    broken = [(o["cell"], i["src"][:40]) for o in plots for i in o["imgs"]
              if not (i["complete"] and i["w"] > 0 and i["src"].startswith("data:image/png"))]
    assert not broken, f"plot images not decoded: {broken}"
    assert sum(o["widgets"] for o in outs), "no widget rendered in any output"

    # The filter explorer: move its slider with the keyboard, its picture must change.
    idx, explorer = _explorer(page)
    assert explorer is not None, "no output with a slider widget and an image (the explorer)"
    explorer.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    before_px = nb.pixels_digest(explorer)
    assert before_px and "not-loaded" not in str(before_px), before_px
    _shot(explorer, "lesson01-explorer-before.png")
    handle = explorer.locator(".widget-slider [role='slider']").first
    readout = explorer.locator(".widget-slider .widget-readout").first
    v0, r0 = handle.get_attribute("aria-valuenow"), readout.inner_text()
    at_max = float(v0) >= float(handle.get_attribute("aria-valuemax"))
    handle.focus()
    for _ in range(3):
        handle.press("ArrowLeft" if at_max else "ArrowRight")
    v1, r1 = handle.get_attribute("aria-valuenow"), readout.inner_text()
    assert v1 != v0 and r1 != r0, f"slider did not move: value {v0}->{v1}, readout {r0}->{r1}"

    deadline = time.monotonic() + 60
    while nb.pixels_digest(explorer) == before_px:
        assert time.monotonic() < deadline, (
            f"explorer image did not change within 60 s after the slider moved {r0} -> {r1}")
        page.wait_for_timeout(250)
    nb.wait_kernel_idle(page, 60)
    page.wait_for_timeout(500)
    after_px = nb.pixels_digest(explorer)
    assert after_px != before_px and "not-loaded" not in str(after_px)
    _shot(explorer, "lesson01-explorer-after.png")
    _shot(page, "lesson01-explorer-page.png")  # the explorer inside JupyterLab
    assert not page.console_errors, f"page errors: {page.console_errors}"
    print(f"lesson 01: {n_code} code cells ran in {t_run:.0f} s; {len(plots)} png plots; "
          f"explorer in code cell {idx}: slider {r0} -> {r1}, image changed")


def test_exercise01_answer_cell_is_editable(page, lab):
    assert (lab.root / EXERCISE).exists(), (
        f"{EXERCISE} is missing (python -m convlab exercises build)")
    cells = nbformat.read(lab.root / EXERCISE, 4).cells
    answers = [i for i, c in enumerate(cells)
               if c.cell_type == "code" and c.source.lstrip().startswith("# EXERCISE:")]
    assert answers, f"{EXERCISE} has no '# EXERCISE:' answer cell"
    assert not any("### BEGIN SOLUTION" in c.source for c in cells), "solution left in exercise"

    st = nb.open_notebook(page, lab.url(EXERCISE), len(cells))
    assert st["cells"] == len(cells), f"{st['cells']} cells shown of {len(cells)}"
    cell = page.locator(f"{nb.PANEL} .jp-Notebook .jp-Cell").nth(answers[0])
    shown = nb.cell_source(cell)
    assert shown.startswith("# EXERCISE:") and "# YOUR CODE HERE" in shown, shown[:300]

    editor = cell.locator(".cm-content")
    assert editor.get_attribute("contenteditable") == "true", "answer cell is read-only"
    editor.click()
    page.keyboard.press("Control+End")
    marker = f"typed_by_browser_test = {os.getpid()}"
    page.keyboard.press("Enter")
    page.keyboard.type(marker)
    page.wait_for_timeout(300)
    after = nb.cell_source(cell)
    _shot(cell, "exercise01-answer-cell.png")
    assert marker in after, f"typed text not in the cell:\n{after}"
    assert after.replace(marker, "").rstrip() == shown.rstrip(), "typing changed other text"
