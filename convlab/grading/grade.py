"""Grade one notebook: ``python -m convlab grade NOTEBOOK``.

1. The instructor's notebook is the solution notebook with its solution regions stubbed
   and its hidden tests kept (plus private tests, when a folder is given); with an
   assignment named, a submission that has none of its tasks is an error.
2. Only the learner's answer cells (matched by their ``# EXERCISE: <id>`` line; among
   several with one id, the last one that is not the stub) are copied into it.
3. The learner's process is a fresh kernel (`kernel.KernelSession`: isolated by the OS
   where the grader can, a scratch folder, limits): it runs the instructor's other cells
   and the answers, cell by cell, under a per-cell and a total time limit.
4. The ``# TEST:`` cells run in *this* process (`verdict.TestScope`): the checkers draw
   their cases from a secret seed, send only inputs to the learner's functions, and
   compare what comes back with their own reference. A task scores its points iff all
   its test cells ran without error here. A timeout or a dead kernel costs the task it
   happened in: the kernel is restarted and what the remaining tasks need is run again.
"""

from __future__ import annotations

import ast
import json
import os
import re
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import notebook as nbf
from .build import repo_root, solution_notebooks
from .kernel import CellRun, KernelSession, isolation, remove_tree

DEFAULT_CELL_TIMEOUT = 120.0
DEFAULT_TOTAL_TIMEOUT = 900.0
EXCERPT = 600  # characters of the learner's own output shown per task


class GradingError(RuntimeError):
    """The grader could not grade (no instructor notebook, unreadable submission...)."""


# ----------------------------------------------------------------------------------------
# Results


@dataclass
class TaskResult:
    id: str
    max_score: float
    score: float = 0.0
    passed: bool = False
    kind: str = "not-run"  # passed | failed | not-implemented | timeout | crashed
    message: str = ""
    output: str = ""  # the grader's own lines (pass lines of its checkers)
    learner_output: str = ""  # what the learner's code printed while graded (capped)
    seconds: float = 0.0
    flags: list = field(default_factory=list)

    @property
    def status(self) -> str:
        return "passed" if self.passed else "failed"


@dataclass
class GradeResult:
    submission: str
    instructor: str
    tasks: list
    seconds: float = 0.0
    log: list = field(default_factory=list)  # what the grader did that is worth knowing
    restarts: int = 0
    error: str | None = None  # set when the submission could not be graded at all
    cell_errors: list = field(default_factory=list)  # (kind, cell index, task, "Name: value")
    isolation: dict = field(default_factory=dict)
    assignment: str = ""
    speed: list = field(default_factory=list)  # speed.SpeedResult of the timed tasks

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tasks) + sum(s.score for s in self.speed)

    @property
    def max_score(self) -> float:
        return sum(t.max_score for t in self.tasks) + sum(s.max_score for s in self.speed)

    @property
    def flags(self) -> dict:
        return {t.id: t.flags for t in self.tasks if t.flags}

    def summary(self) -> str:
        lines = [f"{Path(self.submission).name}: {_num(self.score)} / {_num(self.max_score)} "
                 f"points ({self.seconds:.1f} s, graded against "
                 f"{Path(self.instructor).name or '?'})"]
        if self.error:
            lines.append(f"  could not grade: {self.error}")
        for t in self.tasks:
            mark = "✓" if t.passed else "✗"
            lines.append(f"  {mark} {t.id:<16} {_num(t.score):>4} / {_num(t.max_score):<4} "
                         f"{t.kind}")
            if not t.passed and t.message:
                lines += ["      " + line for line in t.message.splitlines()[:12]]
        for sp in self.speed:
            mark = "✓" if sp.passed else ("·" if sp.kind == "not-graded" else "✗")
            lines.append(f"  {mark} {sp.id:<16} {_num(sp.score):>4} / {_num(sp.max_score):<4} "
                         f"{sp.line()}"[:400])
        if self.flags:
            lines.append("  for review (not scored): " + "; ".join(
                f"{k}: {', '.join(v)}" for k, v in self.flags.items()))
        iso = self.isolation
        if iso and not iso.get("os"):
            lines.append("  note: no OS isolation of the learner's code here ("
                         + "; ".join(iso.get("missing", [])) + "): in-process guard rails only")
        lines += [f"  note: {x}" for x in self.log]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        from .gradescope import results_json

        return results_json(self)


def _num(x) -> str:
    return f"{x:g}"


# ----------------------------------------------------------------------------------------
# Which notebook, which answers


@dataclass
class Step:
    kind: str  # answer | test | setup
    task: str | None
    source: str
    index: int


def _ids(nb) -> set:
    return {nbf.exercise_id(nbf.source(c)) for c in nb.cells
            if c.get("cell_type") == "code"} - {None}


def find_instructor(submission_nb, submission_path: Path, instructor=None,
                    assignment: str | None = None) -> Path:
    """The solution (or grading) notebook the submission belongs to.

    instructor: a notebook, or a folder of them (default: the checkout's solutions/).
    assignment: a notebook's stem or its two-digit number in that folder (bound: the
    submission must share a task with it). Otherwise, the notebook sharing most task ids
    with the submission wins (then the same file name).
    """
    ids = _ids(submission_nb)
    if instructor is not None and Path(instructor).is_file():
        chosen = Path(instructor)
    else:
        folder = Path(instructor) if instructor is not None else repo_root() / "solutions"
        candidates = (solution_notebooks(folder) or sorted(folder.glob("*.ipynb"))
                      ) if folder.is_dir() else []
        if assignment:
            named = [c for c in candidates if assignment in (c.stem, c.name, c.stem[:2])]
            if not named:
                raise GradingError(f"no notebook of assignment {assignment!r} in {folder}")
            chosen = named[0]
        else:
            best, best_key = None, (0, False)
            for c in candidates:
                try:
                    tasks = set(nbf.layout(nbf.read(c)).tasks)
                except nbf.NotebookFormatError:
                    continue
                key = (len(ids & tasks), c.name == submission_path.name)
                if key > best_key:
                    best, best_key = c, key
            if best is None:
                raise GradingError(
                    f"no instructor notebook in {folder} has the tasks of this submission "
                    f"({', '.join(sorted(ids)) or 'it has no # EXERCISE: cells'})")
            return best
    if assignment or instructor is not None:
        try:
            tasks = set(nbf.layout(nbf.read(chosen)).tasks)
        except nbf.NotebookFormatError as e:
            raise GradingError(f"the instructor notebook is broken: {e}") from e
        if ids and not ids & tasks:
            raise GradingError(
                f"this submission is not for {chosen.stem}: its tasks "
                f"({', '.join(sorted(ids))}) are not that assignment's "
                f"({', '.join(sorted(tasks))})")
    return chosen


def _code_key(text: str) -> str:
    """The cell's code without comments and layout (to recognise an untouched stub)."""
    try:
        return ast.dump(ast.parse(nbf.python_source(text)))
    except SyntaxError:
        return "\n".join(line.rstrip() for line in text.strip().splitlines())


def choose_answers(nb, stubs: dict) -> dict:
    """id -> the learner's answer: the last cell with that id that is not the stub (the
    last one when all are), as the learner would have run the notebook top to bottom."""
    found: dict = {}
    for c in nb.cells:
        if c.get("cell_type") == "code":
            tid = nbf.exercise_id(nbf.source(c))
            if tid:
                found.setdefault(tid, []).append(nbf.source(c))
    out = {}
    for tid, texts in found.items():
        stub = _code_key(stubs[tid]) if tid in stubs else None
        real = [t for t in texts if _code_key(t) != stub]
        out[tid] = (real or texts)[-1]
    return out


def _plan(grading_nb) -> list[Step]:
    steps = []
    for i, c in enumerate(grading_nb.cells):
        if c.get("cell_type") != "code" or not nbf.source(c).strip():
            continue
        text = nbf.source(c)
        ex, tm = nbf.exercise_id(text), nbf.test_marker(text)
        if ex:
            steps.append(Step("answer", ex, text, i))
        elif tm:
            steps.append(Step("test", tm[0], text, i))
        else:
            steps.append(Step("setup", None, text, i))
    return steps


def _answer_names(steps) -> set:
    """Names the instructor's answer cells bind (imports aside): the tasks' interface."""
    names = set()
    for s in steps:
        if s.kind != "answer":
            continue
        try:
            tree = ast.parse(nbf.python_source(s.source))
        except SyntaxError:
            continue
        for stmt in tree.body:
            if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
                names.update(nbf.bound_names(ast.unparse(stmt)))
    return names


def _names_outside_answers(nb) -> dict:
    """name -> the first line of the submission's first code cell that binds it and is not
    an answer cell: the grader never runs such cells."""
    out: dict = {}
    for c in nb.cells:
        if c.get("cell_type") != "code":
            continue
        text = nbf.source(c)
        if nbf.exercise_id(text) or nbf.test_marker(text):
            continue
        first = _first_line(text)[:80]
        for name in nbf.bound_names(text):
            out.setdefault(name, first)
    return out


def _first_line(text: str) -> str:
    """A cell's first non-blank line, stripped: how the messages name a cell."""
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


_UNDEFINED = re.compile(r"NameError: name '(\w+)' is not defined")


def _explain_undefined(t, outside: dict) -> None:
    """A NameError for a name the learner bound in a cell the grader does not run: say so
    (the self-check passed in their notebook, where that cell had run)."""
    m = _UNDEFINED.search(t.message)
    if m and m.group(1) in outside:
        name = m.group(1)
        t.message += (f"\n({name!r} is defined in your notebook in a cell that is not this "
                      f"task's answer cell (the one starting `{outside[name]}`): the grader "
                      "runs only the '# EXERCISE' cells, in a fresh copy of the exercise; "
                      f"define {name!r} inside the answer cell)")


def _deniable(path: Path, folder: bool = False) -> Path:
    """The folder of `path` when the kernel does not need anything in it, else the file."""
    path = path.resolve()
    d = path if folder else path.parent
    if any(n == d or d in n.parents for n in _needed()):
        return path
    return d


def _needed() -> list[Path]:
    return [Path(__file__).resolve().parents[1], Path(sys.prefix).resolve(),
            Path(sys.base_prefix).resolve(), Path(os.__file__).resolve().parent,
            Path(tempfile.gettempdir()).resolve()]


def _hideable(paths) -> list[str]:
    """Paths to hide from the kernel, without any the kernel needs to run."""
    out = []
    need = _needed()
    for p in paths:
        p = Path(p).resolve()
        if p == Path("/") or any(n == p or p in n.parents for n in need):
            continue
        if str(p) not in out:
            out.append(str(p))
    return out


# ----------------------------------------------------------------------------------------
# Grading


def grade(submission, instructor=None, private_tests=None, *, cell_timeout: float | None = None,
          total_timeout: float | None = None, mode: str = "sim", deny_write=(), hide=(),
          assignment: str | None = None, speed: bool = False,
          speed_reason: str | None = None) -> GradeResult:
    """Grade one submitted notebook; never raises for a bad submission (see .error).

    hide: more paths the learner's process must not read (a batch folder, other results).
    speed: also time the speed tasks (needs mode 'gpu'); speed_reason: why they are not
    graded otherwise (reported as "not graded here").
    """
    from . import speed as speed_mod

    timed = bool(speed and mode == "gpu")
    cell_timeout = cell_timeout or DEFAULT_CELL_TIMEOUT
    total_timeout = total_timeout or DEFAULT_TOTAL_TIMEOUT
    t_start = time.perf_counter()
    submission = Path(submission)
    iso = isolation()
    try:
        sub_nb = nbf.read(submission)
    except nbf.NotebookFormatError as e:
        return GradeResult(str(submission), str(instructor or ""), [], error=str(e),
                           isolation=iso)
    try:
        instr_path = find_instructor(sub_nb, submission, instructor, assignment)
    except GradingError as e:
        if "is not for" in str(e):
            return GradeResult(str(submission), str(instructor or ""), [], error=str(e),
                               isolation=iso)
        raise
    instr_nb = nbf.read(instr_path)
    private = nbf.load_private_tests(private_tests) if private_tests else None
    try:
        gnb = nbf.grading_notebook(instr_nb, instr_path.name, private)
    except nbf.NotebookFormatError as e:
        raise GradingError(f"the instructor notebook is broken: {e}") from e
    lay = nbf.layout(gnb)
    tasks = {tid: TaskResult(tid, t.points) for tid, t in lay.tasks.items()}
    steps = _plan(gnb)
    stubs = {s.task: s.source for s in steps if s.kind == "answer"}
    answers = choose_answers(sub_nb, stubs)
    log = []
    if private:
        n = sum(1 for c in gnb.cells if c.get("metadata", {}).get("convlab", {}).get("private"))
        log.append(f"{n} private test cell(s) merged from {private_tests}")
    foreign = sorted(set(answers) - set(tasks))
    if foreign:
        log.append(f"answer cells for tasks this assignment does not have: {', '.join(foreign)}")
    for s in steps:
        if s.kind == "answer":
            if s.task in answers:
                s.source = answers[s.task]
                if _code_key(s.source) == _code_key(stubs[s.task]):
                    tasks[s.task].flags.append("stub")
                tasks[s.task].flags += nbf.scan_flags(s.source)
            else:
                tasks[s.task].flags.append("missing")

    result = GradeResult(str(submission), str(instr_path), list(tasks.values()), log=log,
                         isolation=iso, assignment=instr_path.stem)
    priv = Path(tempfile.mkdtemp(prefix="convlab-grader-"))
    scratch = Path(tempfile.mkdtemp(prefix="convlab-work-"))
    inbox = Path(tempfile.mkdtemp(prefix="convlab-inbox-"))
    os.chmod(inbox, 0o755)
    outbox = scratch / ".outbox"
    outbox.mkdir()
    deny_read = [str(_deniable(instr_path)), str(_deniable(submission))]
    root = repo_root()
    for d in (root / "solutions", root / ".git", root / "tests"):
        if d.exists():
            deny_read.append(str(d.resolve()))
    if private_tests:
        deny_read.append(str(_deniable(Path(private_tests), folder=True)))
    deny_read += [str(priv), *map(str, hide)]
    cfg = inbox / "worker.json"
    cfg.write_text(json.dumps({"inbox": str(inbox), "outbox": str(outbox), "speed": timed,
                               "sandbox": {
        "deny_read": deny_read,
        "deny_write": [str(Path(__file__).resolve().parents[1]), str(priv), str(inbox),
                       *map(str, deny_write)],
        "allow_write": [str(scratch)]}}))
    os.chmod(cfg, 0o644)
    init = (f"import convlab.grading.worker as _cg\n_cg.install({str(cfg)!r})\ndel _cg\n")
    session = KernelSession(scratch, priv, mode, readonly=[inbox], init=init,
                            hide=_hideable([*deny_read, *deny_write, Path.home()]),
                            total_timeout=total_timeout)
    if session.jailed:
        os.chown(outbox, session.uid, session.uid)
    try:
        from .remote import Channel
        from .verdict import TestScope

        scope = TestScope([(s.index, s.source) for s in steps if s.kind == "setup"],
                          _answer_names(_plan(gnb)), secrets.token_bytes(32), mode)
        channel = Channel(session, inbox, outbox)
        _execute(session, scope, channel, steps, tasks, answers, cell_timeout,
                 t_start + total_timeout, result)
        if timed and result.error is None:
            result.speed = speed_mod.grade_speed(channel, tasks, t_start + total_timeout,
                                                 cell_timeout)
    finally:
        session.close()
        survivors = session.survivors()
        if survivors:
            result.log.append(f"{len(survivors)} process(es) of the learner's code survived "
                              "the kernel")
        for d in (priv, scratch, inbox):
            remove_tree(d)
    if not timed:
        result.speed = speed_mod.not_graded(tasks, speed_reason or (
            speed_mod.NOT_GRADED if mode != "gpu" else "not graded: time the speed tasks "
            "with --gpu"))
    _finish_messages(tasks)
    outside = _names_outside_answers(sub_nb)
    for t in tasks.values():
        if not t.passed:
            _explain_undefined(t, outside)
            holes = nbf.unfilled_holes(answers.get(t.id, ""))
            if holes and t.kind != "not-implemented":
                t.message += ("\n(your answer still has unfilled holes of the exercise: "
                              + "; ".join(holes[:4]) + ("; …" if len(holes) > 4 else "") + ")")
    result.seconds = time.perf_counter() - t_start
    return result


def _finish_messages(tasks) -> None:
    for t in tasks.values():
        stub, missing = "stub" in t.flags, "missing" in t.flags
        t.flags = [f for f in t.flags if f not in ("stub", "missing")]
        if missing:
            t.kind = "not-implemented" if t.kind in ("failed", "not-run") else t.kind
            t.message = (f"not implemented: the submission has no '# EXERCISE: {t.id}' answer "
                         "cell (it must be the cell's first line of code); the stub was "
                         "graded\n" + t.message)
        elif stub and not t.passed:
            t.kind = "not-implemented"
            t.message = ("not implemented: the answer cell is still the exercise's stub (its "
                         "`# YOUR CODE HERE` / `# TODO(learner)` holes are unfilled)\n"
                         + t.message)


def _execute(session: KernelSession, scope, channel, steps, tasks, answers, cell_timeout,
             deadline, result):
    done: list[Step] = []  # steps whose effects the next tests need (for a replay)
    answer_errors: dict = {}

    def remaining():
        return deadline - time.perf_counter()

    def start_and_replay():
        for _attempt in range(3):
            session.stop()
            session.start()
            ok = True
            for s in list(done):
                run = session.run(s.source, min(cell_timeout, max(1, remaining())))
                if run.status in ("timeout", "dead"):
                    done.remove(s)
                    ok = False
                    break
            if ok:
                return
        raise GradingError("the kernel could not be restarted")

    try:
        session.start()
    except Exception as e:  # noqa: BLE001
        result.error = f"the grading kernel did not start: {e}"
        return
    for s in steps:
        t = tasks.get(s.task) if s.task else None
        if remaining() <= 0:
            if t is not None and s.kind == "test" and t.kind == "passed":
                # a task scores only when every one of its tests ran (private ones too)
                t.kind, t.passed, t.score = "timeout", False, 0.0
                t.message = ("not all of its tests ran: the total time limit was reached; this "
                             "task scores 0")
            elif t is not None and t.kind == "not-run":
                t.message = "not run: the total time limit was reached"
            continue
        if s.kind == "test" and t is not None and t.kind not in ("not-run", "passed"):
            continue  # an earlier test of this task failed: the task scores 0 anyway
        timeout = min(cell_timeout, max(1.0, remaining()))
        if s.kind == "test":
            run = scope.run(s.index, s.source, s.task, channel, timeout)
        else:
            run = session.run(s.source, timeout)
        if t is not None:
            t.seconds += run.seconds
        if s.kind != "test" and run.status != "ok":
            result.cell_errors.append((s.kind, s.index, s.task, run.status if run.status != "error"
                                       else f"{run.ename}: {run.evalue}"[:300]))
        if s.kind == "answer":
            if run.status == "error":
                answer_errors[s.task] = f"{run.ename}: {run.evalue}"[:500]
            elif run.status in ("timeout", "dead"):
                answer_errors[s.task] = (
                    f"your answer cell timed out after {timeout:.0f} s (an endless loop?)"
                    if run.status == "timeout" else "your answer cell made the kernel die "
                    "(os._exit, a crash, or out of memory)")
        if s.kind == "test":
            _score_test(t, run, timeout, answer_errors.get(s.task), s.task in answers)
        if run.status in ("timeout", "dead"):
            if s.kind == "setup":
                result.log.append(f"{_setup_cell(s)} {run.status}")
            if s.kind == "answer" and t is not None:
                t.kind = "timeout" if run.status == "timeout" else "crashed"
                t.message = answer_errors[s.task]
            result.restarts += 1
            try:
                start_and_replay()
            except Exception as e:  # noqa: BLE001
                result.error = f"the kernel could not be restarted: {e}"
                return
            continue
        if s.kind != "test":
            done.append(s)
        if s.kind == "setup" and run.status == "error":
            result.log.append(f"{_setup_cell(s)} raised {run.ename}: {run.evalue}"[:300])


def _setup_cell(s) -> str:
    """An ungraded cell of the exercise, named so a learner finds it in their notebook (the
    grading notebook's cell numbers are not theirs)."""
    first = _first_line(s.source)
    first = first if len(first) <= 60 else first[:59] + "…"
    return f"the exercise's ungraded cell starting `{first}` (it may use your answers)"


def _score_test(t: TaskResult, run, timeout: float, answer_error, answered):
    if run.learner_output.strip():
        t.learner_output = _excerpt(t.learner_output + run.learner_output)
    if run.status == "ok":
        if t.kind == "not-run":
            t.kind, t.passed, t.score = "passed", True, t.max_score
        t.output += _pass_lines(run.stdout)
        return
    t.passed, t.score = False, 0.0
    if run.status == "timeout":
        t.kind = "timeout"
        t.message = (f"timed out after {timeout:.0f} s while testing (an endless loop, or far "
                     "too slow?); this task scores 0, the other tasks are graded as usual")
    elif run.status == "dead":
        t.kind = "crashed"
        t.message = ("the kernel died while testing (os._exit, sys.exit in a thread, a crash, or "
                     "out of memory); this task scores 0, the other tasks are graded as usual")
    else:
        t.kind = "failed"
        if run.ename == "CheckError":
            t.message = run.evalue
        elif run.ename == "NameError" and not answered:
            t.message = (f"{run.ename}: {run.evalue} (the submission has no '# EXERCISE: "
                         f"{t.id}' cell)")
        else:
            t.message = f"{run.ename}: {run.evalue}"
    t.message = t.message[:3000]
    if answer_error:  # the cause first: the test's error follows from it
        t.message = f"your answer cell raised {answer_error}\n(so the test said: {t.message})"


def _pass_lines(text: str) -> str:
    """The grader's own checkers' pass lines (this process printed them)."""
    return "".join(line + "\n" for line in text.splitlines() if line.startswith("✓"))[:2000]


def _excerpt(text: str, n: int = EXCERPT) -> str:
    return text if len(text) <= n else text[:n] + f"… [{len(text) - n} more characters]"


__all__ = ["CellRun", "GradeResult", "GradingError", "TaskResult", "choose_answers",
           "find_instructor", "grade"]
