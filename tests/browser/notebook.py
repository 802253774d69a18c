"""What a learner does to a notebook in JupyterLab, done through Playwright's page.

Menus are clicked, sliders are moved with the keyboard and text is typed; the state the
test reads (prompts, outputs, images) comes from the page's DOM only.
"""

from __future__ import annotations

import base64
import hashlib
import re
import time

import ipywidgets

PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"

# Text that a widget or a plot shows when it did not render: the widget's repr (the
# text/plain fallback JupyterLab shows without the widget manager), the manager's error
# box, or matplotlib's figure repr when no image was produced. A widget's repr has only
# keyword arguments (IntSlider(value=3, max=9), Output()); matplotlib's Text(0.5, 1.0, 't')
# has positional ones and is not a fallback.
WIDGET_NAMES = sorted(
    n for n in dir(ipywidgets)
    if isinstance(getattr(ipywidgets, n), type)
    and issubclass(getattr(ipywidgets, n), ipywidgets.DOMWidget))
_NAMES = "|".join(WIDGET_NAMES)
FALLBACK = re.compile(
    rf"^\s*(?:{_NAMES}|interactive)\((?:\)|\w+=)|Error displaying widget|Loading widget\.\.\.|"
    r"could not be displayed|<Figure size \d+x\d+ with \d+ Axes>",
    re.M)
try:  # the filter explorer's own text fallback says what is missing
    from convlab.widgets import NO_FRONTEND as _EXPLORER_FALLBACK
except ImportError:
    _EXPLORER_FALLBACK = "could not be displayed"
FALLBACK_TEXTS = (_EXPLORER_FALLBACK,)
ERROR = re.compile(r"Traceback \(most recent call last\)|^\w*(?:Error|Exception)\b", re.M)

_STATE_JS = """(panel) => {
  const nb = document.querySelector(panel);
  if (!nb) return null;
  const ind = nb.querySelector('.jp-Notebook-ExecutionIndicator');
  return {
    status: ind ? ind.dataset.status : null,
    prompts: [...nb.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]
      .map(e => e.textContent.trim()),
    cells: nb.querySelectorAll('.jp-Notebook .jp-Cell').length,
  };
}"""

_OUTPUTS_JS = """(panel) => {
  const nb = document.querySelector(panel);
  return [...nb.querySelectorAll('.jp-OutputArea-output')].map(o => ({
    mime: o.dataset.mimeType || '',
    text: (o.innerText || '').slice(0, 2000),
    cell: [...nb.querySelectorAll('.jp-Notebook .jp-Cell')]
      .findIndex(c => c.contains(o)),
    imgs: [...o.querySelectorAll('img')].map(i => ({
      src: i.getAttribute('src') || '', complete: i.complete,
      w: i.naturalWidth, h: i.naturalHeight})),
    widgets: o.querySelectorAll('.jupyter-widgets').length,
  }));
}"""

# Pixels of every image in one element, as PNG data URLs: a blob: URL (ipywidgets.Image)
# gets a new address even for the same picture, so the pixels are compared, not the src.
_PIXELS_JS = """(el) => [...el.querySelectorAll('img')].map(img => {
  if (!img.complete || !img.naturalWidth) return 'not-loaded';
  const c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  c.getContext('2d').drawImage(img, 0, 0);
  return c.toDataURL('image/png');
})"""


def state(page) -> dict | None:
    return page.evaluate(_STATE_JS, PANEL)


def open_notebook(page, url: str, n_cells: int, timeout: float = 90) -> dict:
    """Load a notebook page; wait until all its n_cells are shown and its kernel is idle."""
    page.goto(url)
    page.wait_for_function(
        "([panel, n]) => { const nb = document.querySelector(panel);"
        " return nb && nb.querySelectorAll('.jp-Notebook .jp-Cell').length >= n; }",
        arg=[PANEL, n_cells], timeout=timeout * 1000)
    page.wait_for_selector(f"{PANEL} .jp-Notebook-ExecutionIndicator[data-status='idle']",
                           timeout=timeout * 1000)
    return state(page)


def menu(page, top: str, item: str) -> None:
    """Click a main-menu item, e.g. menu(page, 'Run', 'Run All Cells')."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{re.escape(top)}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$")).click()


def wait_kernel_idle(page, timeout: float, settle: float = 1.5) -> dict:
    """Wait until no cell is queued or running ([*]) and the kernel reports idle.

    Both must hold for `settle` seconds, so that the gap between two cells of
    'Run All' does not count as the end.
    """
    deadline, since = time.monotonic() + timeout, None
    while True:
        st = state(page)
        quiet = st and st["status"] == "idle" and not any("*" in p for p in st["prompts"])
        now = time.monotonic()
        if quiet:
            since = since or now
            if now - since >= settle:
                return st
        else:
            since = None
        if now > deadline:
            raise TimeoutError(f"kernel still busy after {timeout:.0f} s: {st}")
        time.sleep(0.25)


def outputs(page) -> list[dict]:
    return page.evaluate(_OUTPUTS_JS, PANEL)


def pixels_digest(locator) -> list[str]:
    """sha256 of each image's pixels inside the element (decoded in the browser)."""
    out = []
    for url in locator.evaluate(_PIXELS_JS):
        if url.startswith("data:"):
            url = base64.b64decode(url.split(",", 1)[1])
        out.append(hashlib.sha256(url if isinstance(url, bytes) else url.encode()).hexdigest())
    return out


def cell_source(cell) -> str:
    """The text the cell's editor shows (CodeMirror 6 lines)."""
    return "\n".join(cell.locator(".cm-content .cm-line").all_inner_texts())
