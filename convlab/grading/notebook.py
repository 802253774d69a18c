"""The exercise notebook format: markers, cells, tasks (no Jupyter kernel needed here).

An exercise notebook has graded tasks. For a task id such as ``01.sobel``:

- the answer cell starts with ``# EXERCISE: 01.sobel``; the solution sits between
  ``### BEGIN SOLUTION`` and ``### END SOLUTION`` (at the code's indentation);
- test cells start with ``# TEST: 01.sobel points=2``; an optional hidden part sits between
  ``### BEGIN HIDDEN TESTS`` and ``### END HIDDEN TESTS``;
- a solution region with ``### BEGIN HOLE: <what to write>`` / ``### END HOLE`` regions in
  it becomes a skeleton: its other lines stay given and each hole becomes
  ``# TODO(learner): <what to write>`` and ``pass`` (``### BEGIN HOLE a, b: ...`` gives
  ``a, b = ...`` instead), so the structure and the index arithmetic are given;
- cells that start with ``# SELF-CHECK: 01.sobel`` are the learner's own checks (stage
  checks, the self-check): they stay in the exercise and are left out of grading.

A task scores its points (the sum over its TEST cells) iff all its TEST cells run
without error.
"""

from __future__ import annotations

import ast
import copy
import io
import json
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

EXERCISE_RE = re.compile(r"^\s*#\s*EXERCISE:\s*(?P<id>[\w.\-]+)\s*$")
TEST_RE = re.compile(
    r"^\s*#\s*TEST:\s*(?P<id>[\w.\-]+)(?:\s+points\s*=\s*(?P<points>\d+(?:\.\d+)?))?\s*$")
BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
BEGIN_HOLE = re.compile(r"^###\s*BEGIN HOLE(?:\s+(?P<names>[A-Za-z_][\w\s,]*?))?\s*:\s*"
                        r"(?P<text>\S.*?)\s*$")
END_HOLE = "### END HOLE"
SELF_CHECK_RE = re.compile(r"^\s*#\s*SELF-CHECK:\s*(?P<id>[\w.\-]+)\s*$")
STUB_LINES = ("# YOUR CODE HERE", "pass")
MARKDOWN_STUB = "YOUR ANSWER HERE"


class NotebookFormatError(ValueError):
    """A notebook breaks the exercise format (unmatched markers, a test without a task...)."""


# ----------------------------------------------------------------------------------------
# Cells


def source(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def header(text: str) -> str:
    """The first non-blank line of a cell."""
    for line in text.splitlines():
        if line.strip():
            return line
    return ""


def exercise_id(text: str) -> str | None:
    """The task id of an answer cell: its ``# EXERCISE: <id>`` line, which may follow
    blank lines, comments and magics (``%%time``), never code or a ``# TEST:`` line."""
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        m = EXERCISE_RE.match(line)
        if m:
            return m.group("id")
        if TEST_RE.match(line) or not s.startswith(("#", "%")):
            return None
    return None


def test_marker(text: str) -> tuple[str, float] | None:
    m = TEST_RE.match(header(text))
    if not m:
        return None
    pts = float(m.group("points")) if m.group("points") else 1.0
    return m.group("id"), (int(pts) if pts.is_integer() else pts)


def _replace_regions(text: str, begin: str, end: str, stub, where: str) -> str:
    """Replace every begin..end region (marker lines included) by stub(indent) lines."""
    out, inside, indent = [], False, ""
    lines = text.split("\n")
    for n, line in enumerate(lines, 1):
        s = line.strip()
        if s == begin:
            if inside:
                raise NotebookFormatError(f"{where}, line {n}: '{begin}' inside another one")
            inside, indent = True, line[: len(line) - len(line.lstrip())]
            out.extend(indent + x if x else x for x in stub)
        elif s == end:
            if not inside:
                raise NotebookFormatError(f"{where}, line {n}: '{end}' without '{begin}'")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise NotebookFormatError(f"{where}: '{begin}' is never closed by '{end}'")
    return "\n".join(out)


def _is_hole_marker(s: str) -> bool:
    return s.startswith("### BEGIN HOLE") or s == END_HOLE


def _skeleton(region: list, indent: str, where: str) -> list:
    """The lines of one solution region in the exercise: the stub, or (with holes) the
    region's given lines with each hole as a TODO comment and a placeholder."""
    if not any(s.strip().startswith("### BEGIN HOLE") for _, s in region):
        for n, line in region:
            if _is_hole_marker(line.strip()):
                raise NotebookFormatError(f"{where}, line {n}: '{END_HOLE}' without a hole")
        return [indent + x if x else x for x in STUB_LINES]
    out, hole = [], None
    for n, line in region:
        s = line.strip()
        if s.startswith("### BEGIN HOLE"):
            m = BEGIN_HOLE.match(s)
            if hole is not None:
                raise NotebookFormatError(f"{where}, line {n}: a hole inside another one")
            if not m:
                raise NotebookFormatError(f"{where}, line {n}: a hole needs the text of its "
                                          "TODO: '### BEGIN HOLE: what to write'")
            hole = n
            pad = line[: len(line) - len(line.lstrip())]
            names = " ".join((m.group("names") or "").split())
            out.append(f"{pad}# TODO(learner): {m.group('text')}")
            out.append(f"{pad}{names} = ..." if names else f"{pad}pass")
        elif s == END_HOLE:
            if hole is None:
                raise NotebookFormatError(f"{where}, line {n}: '{END_HOLE}' without a hole")
            hole = None
        elif hole is None:
            out.append(line)
    if hole is not None:
        raise NotebookFormatError(f"{where}, line {hole}: a hole is never closed by "
                                  f"'{END_HOLE}'")
    return out


def strip_solution(text: str, where: str = "cell", markdown: bool = False) -> str:
    """Solution regions -> ``# YOUR CODE HERE`` + ``pass`` at the region's indentation,
    or, where the region has holes, its skeleton (see the module docstring)."""
    if markdown:
        return _replace_regions(text, BEGIN_SOLUTION, END_SOLUTION, (MARKDOWN_STUB,), where)
    out, region, indent = [], None, ""
    for n, line in enumerate(text.split("\n"), 1):
        s = line.strip()
        if s == BEGIN_SOLUTION:
            if region is not None:
                raise NotebookFormatError(f"{where}, line {n}: '{BEGIN_SOLUTION}' inside "
                                          "another one")
            region, indent = [], line[: len(line) - len(line.lstrip())]
        elif s == END_SOLUTION:
            if region is None:
                raise NotebookFormatError(f"{where}, line {n}: '{END_SOLUTION}' without "
                                          f"'{BEGIN_SOLUTION}'")
            out.extend(_skeleton(region, indent, where))
            region = None
        elif region is not None:
            region.append((n, line))
        elif _is_hole_marker(s):
            raise NotebookFormatError(f"{where}, line {n}: a hole outside a solution region")
        else:
            out.append(line)
    if region is not None:
        raise NotebookFormatError(f"{where}: '{BEGIN_SOLUTION}' is never closed by "
                                  f"'{END_SOLUTION}'")
    return "\n".join(out)


def self_check_id(text: str) -> str | None:
    """The task of a learner-only cell: its first line ``# SELF-CHECK: <id>``."""
    m = SELF_CHECK_RE.match(header(text))
    return m.group("id") if m else None


def strip_hidden(text: str, where: str = "cell") -> str:
    """Hidden-test regions removed (marker lines included)."""
    return _replace_regions(text, BEGIN_HIDDEN, END_HIDDEN, (), where)


def has_marker(text: str, marker: str) -> bool:
    return any(line.strip() == marker for line in text.splitlines())


# ----------------------------------------------------------------------------------------
# Notebooks


def read(path) -> nbformat.NotebookNode:
    """Read a notebook; raise NotebookFormatError with the reason when it is not one."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise NotebookFormatError(f"{path}: cannot read it ({e})") from e
    return reads(text, str(path))


def reads(text: str, name: str = "notebook") -> nbformat.NotebookNode:
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as e:
        raise NotebookFormatError(f"{name}: not a notebook, the JSON is broken ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise NotebookFormatError(f"{name}: not a notebook (no list of cells)")
    try:
        nb = nbformat.from_dict(data)
        if nb.get("nbformat", 4) < 4:
            nb = nbformat.convert(nb, 4)
    except Exception as e:  # noqa: BLE001  (any malformed notebook is the same failure)
        raise NotebookFormatError(f"{name}: not a readable notebook ({e})") from e
    for i, c in enumerate(nb.cells):
        if not isinstance(c, dict) or not isinstance(c.get("cell_type", "code"), str):
            raise NotebookFormatError(f"{name}: cell {i} is not a notebook cell")
        s = c.get("source", "")
        if not (isinstance(s, str) or (isinstance(s, list) and all(isinstance(x, str)
                                                                    for x in s))):
            raise NotebookFormatError(f"{name}: cell {i} has a source that is not text")
        if "source" in c:
            c["source"] = source(c)
        if not isinstance(c.get("metadata", {}), dict):
            c["metadata"] = {}
        c.setdefault("metadata", {})
    return nb


def writes(nb) -> str:
    """Deterministic JSON text of a notebook (nbformat's layout, a final newline)."""
    return nbformat.writes(nb, version=nbformat.NO_CONVERT).rstrip("\n") + "\n"


@dataclass
class Task:
    id: str
    answer_cell: int | None = None  # index of the (last) answer cell
    test_cells: list = field(default_factory=list)
    points: float = 0

    @property
    def max_score(self) -> float:
        return self.points


@dataclass
class Layout:
    """Where the tasks of a notebook are: id -> Task, in notebook order."""

    tasks: dict
    problems: list = field(default_factory=list)  # format problems, as sentences

    @property
    def max_score(self) -> float:
        return sum(t.points for t in self.tasks.values())


def layout(nb, name: str = "notebook") -> Layout:
    """Find the tasks of a notebook and what is wrong with its format."""
    tasks: dict[str, Task] = {}
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        text = source(cell)
        ex, tm = exercise_id(text), test_marker(text)
        if ex:
            t = tasks.setdefault(ex, Task(ex))
            if t.answer_cell is not None:
                problems.append(f"{name}: task {ex} has two answer cells (cells {t.answer_cell} "
                                f"and {i})")
            t.answer_cell = i
        elif tm:
            tid, pts = tm
            if tid not in tasks or tasks[tid].answer_cell is None:
                problems.append(f"{name}: cell {i} tests task {tid}, which has no "
                                "'# EXERCISE:' answer cell above it")
                tasks.setdefault(tid, Task(tid))
            tasks[tid].test_cells.append(i)
            tasks[tid].points += pts
    for t in tasks.values():
        if not t.test_cells:
            problems.append(f"{name}: task {t.id} has no '# TEST: {t.id} points=N' cell")
    return Layout(tasks, problems)


def validate_solution(nb, name: str, require_solution: bool = True) -> list[str]:
    """Format problems of a solution notebook (an empty list when it is fine).

    require_solution=False accepts answer cells without a solution region (a grading
    notebook, whose solutions are already stubbed).
    """
    lay = layout(nb, name)
    problems, tasks = list(lay.problems), lay.tasks
    for i, cell in enumerate(nb.cells):
        text, where = source(cell), f"{name}, cell {i}"
        try:
            strip_solution(text, where)
            strip_hidden(text, where)
        except NotebookFormatError as e:
            problems.append(str(e))
            continue
        if require_solution and cell.get("cell_type") == "code" and exercise_id(
                text) and not has_marker(text, BEGIN_SOLUTION):
            problems.append(f"{where}: answer cell {exercise_id(text)} has no "
                            f"'{BEGIN_SOLUTION}' region")
        if cell.get("cell_type") == "code" and not exercise_id(text) and has_marker(
                text, BEGIN_SOLUTION):
            problems.append(f"{where}: a solution region outside an '# EXERCISE:' cell")
        if has_marker(text, BEGIN_HIDDEN) and not test_marker(text):
            problems.append(f"{where}: a hidden-test region outside a '# TEST:' cell")
        sid = self_check_id(text) if cell.get("cell_type") == "code" else None
        if sid and sid not in tasks:
            problems.append(f"{where}: '# SELF-CHECK: {sid}' names no task of this notebook")
        if sid and has_marker(text, BEGIN_SOLUTION):
            problems.append(f"{where}: a solution region in a '# SELF-CHECK:' cell")
    return problems


def _clean_cell(cell, index: int):
    cell = copy.deepcopy(cell)
    if cell.get("cell_type") == "code":
        cell["outputs"] = []
        cell["execution_count"] = None
    for key in ("execution", "collapsed", "scrolled", "ExecuteTime"):
        cell.get("metadata", {}).pop(key, None)
    if not cell.get("id"):
        cell["id"] = f"cell-{index}"
    if "attachments" in cell and not cell["attachments"]:
        del cell["attachments"]
    return cell


def _clean_notebook(nb, cells):
    out = copy.deepcopy(nb)
    out.cells = cells
    out.metadata.pop("widgets", None)
    out.nbformat, out.nbformat_minor = 4, max(int(nb.get("nbformat_minor", 5)), 5)
    return out


def exercise_notebook(nb, name: str = "notebook", generated_from: str | None = None):
    """The learner's notebook: solutions stubbed, hidden tests removed, outputs cleared."""
    problems = validate_solution(nb, name)
    if problems:
        raise NotebookFormatError("\n".join(problems))
    cells = []
    last_test = {tid: max(t.test_cells) for tid, t in layout(nb, name).tasks.items()}
    for i, cell in enumerate(nb.cells):
        c = _clean_cell(cell, i)
        where = f"{name}, cell {i}"
        text = strip_solution(source(c), where, markdown=c.get("cell_type") == "markdown")
        c["source"] = strip_hidden(text, where)
        cells.append(c)
        for tid, at in last_test.items():
            if at == i:
                cells.append(self_check_cell(tid, [
                    (test_marker(source(nb.cells[j]))[1],
                     strip_hidden(source(nb.cells[j]), f"{name}, cell {j}"))
                    for j in layout(nb, name).tasks[tid].test_cells]))
    out = _clean_notebook(nb, cells)
    if generated_from:
        out.metadata["convlab"] = {
            "generated_from": generated_from,
            "note": "generated by `python -m convlab exercises build`: edit the solution"}
    return out


def _literal(text: str) -> str:
    """Python source of a string literal holding `text` (triple-quoted where it can be)."""
    if '"""' not in text and "\\" not in text and not text.endswith('"'):
        return '"""\\\n' + text + '"""'
    return repr(text)


def self_check_cell(task: str, tests: list):
    """The learner's self-check for one task: its public tests (points, source with the
    hidden parts removed) run again by `convlab.check.self_check`, which prints the grade."""
    codes = [(pts, src.partition("\n")[2].strip("\n")) for pts, src in tests]
    body = "\n".join(f"    ({pts!r}, {_literal(code)})," for pts, code in codes)
    text = (f"# SELF-CHECK: {task}\n"
            "# The grade this task would get from its public tests. The grader runs them again\n"
            "# in its own process, with hidden cases as well: a pass here is needed, not enough.\n"
            "import convlab.check\n\n"
            f"convlab.check.self_check({task!r}, [\n{body}\n], globals());")
    c = nbformat.v4.new_code_cell(text)
    c["id"] = "self-check-" + re.sub(r"[^A-Za-z0-9_-]", "-", task)
    return c


def grading_notebook(nb, name: str = "notebook", private_tests=None):
    """The instructor's notebook for grading: solutions stubbed, hidden tests kept.

    private_tests: cells (from `load_private_tests`) merged after each task's last test.
    It never contains a solution, so it can ship in an autograder bundle; a notebook
    that is already one (no solution regions) is accepted as it is.
    """
    problems = validate_solution(nb, name, require_solution=False)
    if problems:
        raise NotebookFormatError("\n".join(problems))
    cells = []
    for i, cell in enumerate(nb.cells):
        if cell.get("cell_type") == "code" and self_check_id(source(cell)):
            continue  # the learner's own checks: nothing the grade depends on
        c = _clean_cell(cell, i)
        c["source"] = strip_solution(source(c), f"{name}, cell {i}",
                                     markdown=c.get("cell_type") == "markdown")
        cells.append(c)
    out = _clean_notebook(nb, cells)
    if private_tests:
        merge_private_tests(out, private_tests)
    return out


# ----------------------------------------------------------------------------------------
# Private tests


def load_private_tests(folder) -> list:
    """Instructor test cells from a folder: ``*.py`` files and ``*.ipynb`` notebooks.

    In a ``.py`` file every line ``# TEST: <id> points=N`` starts a new test cell that runs
    to the next such line; in a notebook every code cell that starts with one is a test.
    Returns nbformat code cells.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise NotebookFormatError(f"private tests folder {folder} does not exist")
    cells = []
    for path in sorted(folder.rglob("*")):
        if path.suffix == ".py":
            block: list[str] | None = None
            for line in path.read_text(encoding="utf-8").splitlines():
                if test_marker(line):
                    if block:
                        cells.append("\n".join(block).rstrip() + "\n")
                    block = [line]
                elif block is not None:
                    block.append(line)
            if block:
                cells.append("\n".join(block).rstrip() + "\n")
        elif path.suffix == ".ipynb" and ".ipynb_checkpoints" not in path.parts:
            for c in read(path).cells:
                if c.get("cell_type") == "code" and test_marker(source(c)):
                    cells.append(source(c))
    out = []
    for n, text in enumerate(cells):
        c = nbformat.v4.new_code_cell(text.rstrip("\n"))
        c["id"] = f"private-{n}"
        c["metadata"]["convlab"] = {"private": True}
        out.append(c)
    return out


def merge_private_tests(nb, cells) -> list[str]:
    """Insert each private test after the last test of its task; return the ids merged."""
    merged = []
    for c in cells:
        tid, _ = test_marker(source(c))
        lay = layout(nb)
        t = lay.tasks.get(tid)
        if t is None or t.answer_cell is None:
            continue  # a test for another notebook
        at = max([t.answer_cell, *t.test_cells]) + 1
        nb.cells.insert(at, copy.deepcopy(c))
        merged.append(tid)
    return merged


# ----------------------------------------------------------------------------------------
# Static analysis of cell sources (in the grader process, which the learner cannot touch)


def python_source(text: str) -> str:
    """Cell text with IPython syntax (magics, !shell) turned into plain Python."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(text)
    except Exception:  # noqa: BLE001
        return text


def unfilled_holes(text: str) -> list[str]:
    """The skeleton's holes an answer still holds, as lines to show the learner: a
    ``# TODO(learner)`` line followed by a bare ``pass``, and any ``...`` value."""
    lines = text.splitlines()

    def short(line):
        line = line.strip()
        return line if len(line) <= 72 else line[:71] + "…"

    out = []
    for i, line in enumerate(lines):
        if line.strip().startswith("# TODO(learner)"):
            nxt = next((x.strip() for x in lines[i + 1:] if x.strip()), "")
            if nxt == "pass":
                out.append(f"{short(line)} (still `pass`)")
    try:
        tree = ast.parse(python_source(text))
    except SyntaxError:
        return out
    for node in ast.walk(tree):  # `name = ...`, as the skeleton gives it (not out[...])
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                node.value.value is Ellipsis and 0 < node.lineno <= len(lines):
            out.append(f"line {node.lineno}: {short(lines[node.lineno - 1])}")
    return out


def bound_names(text: str) -> list[str]:
    """Names a cell binds at top level (assignments, defs, imports, for/with targets)."""
    try:
        tree = ast.parse(python_source(text))
    except SyntaxError:
        return []
    names: list[str] = []

    def targets(node):
        if isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for e in node.elts:
                targets(e)
        elif isinstance(node, ast.Starred):
            targets(node.value)

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.append(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    targets(t)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets(node.target)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    if a.name != "*":
                        names.append(a.asname or a.name.split(".")[0])
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                targets(node.target)
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
                visit(node.body)
            elif isinstance(node, (ast.If, ast.While)):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for h in node.handlers:
                    visit(h.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    return sorted(set(names))


# Patterns in an answer that deserve a human look. They do not change the score: the
# sandbox decides that; these explain to the instructor what a submission tried.
_FLAGS = [
    (r"\b(sys\.exit|os\._exit|os\.abort)\b|\b(exit|quit)\s*\(", "tries to exit the interpreter"),
    (r"results\.json", "mentions results.json"),
    (r"\bsolutions\b", "mentions the solutions folder"),
    (r"\bconvlab\.(check|grading)\b|from\s+convlab(\.\w+)?\s+import\s+.*\b(check|grading)\b",
     "touches the checker or the grader"),
    (r"\bconvlab\.(reference|kernels|baselines)\b|from\s+convlab\.(reference|kernels|baselines)"
     r"|from\s+convlab\s+import\s+.*\b(reference|kernels|baselines)\b",
     "uses the package's reference or kernels (refused inside an answer)"),
    (r"\b(setattr|delattr)\s*\(\s*(np|numpy|convlab|sys|builtins|math|os)\b",
     "setattr/delattr on a module"),
    (r"\b(np|numpy|convlab|builtins|math|sys|os)(\.\w+)+\s*=[^=]", "assigns into a module"),
    (r"\b(builtins|__builtins__|__import__|importlib|sys\.modules)\b",
     "reaches into builtins / the import system"),
    (r"\b(gc|ctypes|inspect|sys\._getframe|_getframe|f_back|f_locals|f_globals|tb_frame|"
     r"gi_frame|__closure__|cell_contents|__code__|__globals__|settrace|setprofile|"
     r"addaudithook)\b", "introspects frames, closures or the interpreter"),
    (r"\b(get_ipython|IPython|ipykernel|run_cell|input_transformers|ast_transformers|"
     r"set_custom_exc)\b", "touches the notebook machinery"),
    (r"\b(subprocess|os\.system|os\.popen|os\.fork|multiprocessing)\b|(?<![.\w])signal\b"
     r"(?!\s+import\b)",
     "starts processes or handles signals"),
    (r"\b(mock|monkeypatch)\b", "monkeypatching"),
    (r"(^|[^.\w])(exec|eval|compile)\s*\(", "exec/eval/compile"),
    (r"\b(import\s+code|from\s+code\s+import|codeop|runsource|runcode|"
     r"InteractiveInterpreter|InteractiveConsole|compile_command)\b",
     "runs source through the code module"),
    (r"\b__file__\b", "reads module file paths"),
    (r"\b(np|numpy)\.(load|save|savez|savez_compressed|memmap|loadtxt|savetxt)\b|"
     r"\b(tofile|fromfile|write_text|write_bytes|read_text|read_bytes|iterdir)\b|"
     r"\bos\.(replace|rename|remove|unlink|listdir|scandir|walk)\b|\bglob\b|\bshutil\b",
     "reads or writes files or folders"),
    (r"\b__del__\b|\bweakref\b|\bfinalize\b|\batexit\b",
     "runs code when objects are freed or at exit"),
    (r"\b(getattr|setattr|delattr|globals|locals|attrgetter|methodcaller)\b|"
     r"__(getattribute|setattr|subclasses|loader|spec|builtins|import|base|bases|mro)__",
     "reaches attributes or names dynamically"),
    (r"(['\"])\s*\+\s*[rbuf]*['\"]", "builds names from pieces of strings"),
    (r"\b(outbox|inbox|_cfg|host_reads|audithook|post_run_cell|pre_run_cell|post_execute|"
     r"pre_execute)\b|\.events\b", "touches the grader's folders or the notebook's events"),
    (r"\bopen\s*\(", "opens files"),
    (r"\bthreading\b", "starts threads"),
    (r"\b_ary\b|\b_item\b|\bFake\w*CUDAArray\b|\bsimulator\b|__dict__|\bvars\s*\(|"
     r"__getstate__|__reduce|[(,]\s*buffer\s*=|__array_finalize__|__array_function__|"
     r"\bcuda\.reduce\b|\bBlockThread\b",
     "reaches into the simulator's device arrays"),
    (r"\b(FunctionType|CodeType|co_filename|co_code|__func__)\b",
     "builds functions from code objects"),
    (r"^\s*__name__\s*=", "renames its module"),
]
_PRINT_PASS = re.compile(r"print\s*\([^)]*(✓|✔|\bpass(ed)?\b|\bOK\b|FULL MARKS|score)", re.I)


def _code_without_comments(text: str) -> str:
    code = python_source(text)
    lines = code.split("\n")
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.COMMENT:
                row, col = tok.start
                lines[row - 1] = lines[row - 1][:col]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    return "\n".join(lines)


def scan_flags(text: str) -> list[str]:
    """What in an answer cell looks like an attempt to game the grader (for review)."""
    code = _code_without_comments(text)
    flags = []
    for pattern, why in _FLAGS:
        if why and re.search(pattern, code):
            flags.append(why)
    if _PRINT_PASS.search(code):
        flags.append("prints pass-like lines")
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return flags
    if _python_in_kernels(tree):
        flags.append("runs NumPy or Python containers inside a kernel, or stores outside "
                     "its arguments (the simulator runs them; a GPU would not compile them)")
    if _stores_attributes(tree):
        flags.append("assigns into a module or class it imported, or into an attribute of "
                     "something it did not create (a function the grader's own code may call)")
    if (unusual := _unusual_imports(tree)):
        flags.append(f"imports modules an answer does not need ({', '.join(unusual)})")
    if _plain_calls_in_kernels(tree):
        flags.append("a kernel calls a plain Python function of the cell, not a device "
                     "function (the simulator runs it; a GPU would not compile it)")
    return flags


# inside a @cuda.jit function: NumPy on scalars (np.float32(x), np.sqrt(x)) compiles for
# the GPU; NumPy on arrays and Python containers do not, though the simulator runs them
_KERNEL_NUMPY_OK = {"float16", "float32", "float64", "int8", "int16", "int32", "int64",
                    "uint8", "uint16", "uint32", "uint64", "bool_", "sqrt", "exp", "exp2",
                    "expm1", "log", "log2", "log10", "log1p", "abs", "fabs", "floor", "ceil",
                    "minimum", "maximum", "isnan", "isinf", "isfinite", "sin", "cos", "tan",
                    "arcsin", "arccos", "arctan", "arctan2", "sinh", "cosh", "tanh", "hypot",
                    "round", "trunc", "sign", "copysign", "power", "fmod", "remainder",
                    "fmin", "fmax", "nan", "inf", "pi", "e"}
_KERNEL_ARRAYS = ("local.array", "shared.array", "const.array_like")


# what answers import (numba.cuda kernels, NumPy, the course's launcher and its GPU
# libraries); anything else in an answer cell is for review
_ANSWER_IMPORTS = {"numpy", "numba", "math", "cupy", "torch", "triton", "convlab", "itertools",
                   "dataclasses", "typing", "collections", "__future__"}


def _unusual_imports(tree: ast.AST) -> list[str]:
    found = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    found |= {n.module.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    return sorted(found - _ANSWER_IMPORTS)


def _stores_attributes(tree: ast.AST) -> bool:
    """An attribute is stored or deleted anywhere but on `self` / `cls` (a module reached
    directly or through an alias, say), or setattr'd / delattr'd on a name the cell
    imported."""
    imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}

    def root(node):
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, (ast.Store, ast.Del)):
            if root(n) not in ("self", "cls"):
                return True
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                and n.func.id in ("setattr", "delattr") and n.args
                and root(n.args[0]) in imported):
            return True
    return False


def _is_jit(fn) -> bool:
    """A function compiled for the GPU as far as the source tells (`njit` is Numba's CPU
    compiler: an @njit function may run NumPy)."""
    return any("jit" in t and not re.match(r"(numba\.)?njit\b", t)
               for t in (ast.unparse(d) for d in fn.decorator_list))


def _plain_calls_in_kernels(tree: ast.AST) -> bool:
    """A jit function calls a function the cell defines without jit."""
    defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    plain = {fn.name for fn in defs if not _is_jit(fn)}
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
               and node.func.id in plain
               for fn in defs if _is_jit(fn) for node in ast.walk(fn))


def _python_in_kernels(tree: ast.AST) -> bool:
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or not _is_jit(fn):
            continue
        own = {a.arg for a in fn.args.args} | {  # what a kernel may write: its arguments
            t.id for n in ast.walk(fn) if isinstance(n, ast.Assign)  # and its own arrays
            and any(k in ast.unparse(n.value) for k in _KERNEL_ARRAYS)
            for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(fn):
            if isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(
                    node.ctx, ast.Store):
                base = node
                while isinstance(base, (ast.Subscript, ast.Attribute)):
                    base = base.value
                if isinstance(node, ast.Attribute) or not (
                        isinstance(base, ast.Name) and base.id in own):
                    return True  # a store into something outside the kernel's arguments
            if isinstance(node, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp,
                                 ast.SetComp, ast.GeneratorExp)):
                return True
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in ("np", "numpy") and node.attr not in _KERNEL_NUMPY_OK):
                return True
    return False
