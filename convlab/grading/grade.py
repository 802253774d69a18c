"""Grade one notebook: ``python -m convlab grade NOTEBOOK``.

1. The instructor's notebook is the solution notebook with its solution regions stubbed
   and its hidden tests kept (plus private tests, when a folder is given).
2. Only the learner's answer cells (matched by their ``# EXERCISE: <id>`` line) are copied
   into it; tests, problem sizes and checkers come from the instructor.
3. A fresh kernel (simulator mode, a temporary folder as working directory, the guard
   rails of `convlab.grading.sandbox`) runs it cell by cell under a per-cell and a total
   time limit. A timeout or a dead kernel costs the task it happened in: the kernel is
   restarted and what the remaining tasks need is run again.
4. Each task scores its points iff all its TEST cells ran without error (the kernel's
   execution status, never printed text). Results: a summary and Gradescope's
   results.json, written by this process only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import notebook as nbf
from .build import repo_root, solution_notebooks

KERNEL_NAME = "convlab-grader"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
DEFAULT_CELL_TIMEOUT = 120.0
DEFAULT_TOTAL_TIMEOUT = 900.0


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
    kind: str = "not-run"  # passed | failed | not-implemented | timeout | crashed | tampering
    message: str = ""
    output: str = ""
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

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tasks)

    @property
    def max_score(self) -> float:
        return sum(t.max_score for t in self.tasks)

    @property
    def flags(self) -> dict:
        return {t.id: t.flags for t in self.tasks if t.flags}

    def summary(self) -> str:
        lines = [f"{Path(self.submission).name}: {_num(self.score)} / {_num(self.max_score)} "
                 f"points ({self.seconds:.1f} s, graded against {Path(self.instructor).name})"]
        if self.error:
            lines.append(f"  could not grade: {self.error}")
        for t in self.tasks:
            mark = "✓" if t.passed else "✗"
            lines.append(f"  {mark} {t.id:<16} {_num(t.score):>4} / {_num(t.max_score):<4} "
                         f"{t.kind}")
            if not t.passed and t.message:
                lines += ["      " + line for line in t.message.splitlines()[:12]]
        if self.flags:
            lines.append("  for review (not scored): " + "; ".join(
                f"{k}: {', '.join(v)}" for k, v in self.flags.items()))
        lines += [f"  note: {x}" for x in self.log]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        from .gradescope import results_json

        return results_json(self)


def _num(x) -> str:
    return f"{x:g}"


# ----------------------------------------------------------------------------------------
# Kernel


@dataclass
class CellRun:
    status: str  # ok | error | timeout | dead
    ename: str = ""
    evalue: str = ""
    traceback: str = ""
    stdout: str = ""
    seconds: float = 0.0


def _kernel_spec_dir(root: Path) -> Path:
    d = root / "kernels" / KERNEL_NAME
    d.mkdir(parents=True, exist_ok=True)
    (d / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "convlab grader", "language": "python"}))
    return root / "kernels"


class KernelSession:
    """One grading kernel, run cell by cell; restartable."""

    def __init__(self, workdir: Path, private: Path, env: dict, deny_read=(), deny_write=(),
                 startup_timeout: float = 60):
        self.workdir, self.private, self.env = workdir, private, env
        self.deny_read, self.deny_write = list(deny_read), list(deny_write)
        self.startup_timeout = startup_timeout
        self.client = None
        self.seq = 0
        self.secret = b""
        self.starts = 0

    def start(self):
        from jupyter_client.kernelspec import KernelSpecManager
        from jupyter_client.manager import AsyncKernelManager
        from nbclient import NotebookClient

        spec_dir = _kernel_spec_dir(self.private)
        km = AsyncKernelManager(kernel_name=KERNEL_NAME,
                                kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec_dir)]))
        nb = nbf.nbformat.v4.new_notebook()
        client = NotebookClient(nb, km=km, timeout=60, allow_errors=True,
                                startup_timeout=int(self.startup_timeout), kernel_name=KERNEL_NAME,
                                record_timing=False, iopub_timeout=5)
        client.on_cell_executed = self._on_executed
        self._log = open(self.private / "kernel.log", "ab")  # noqa: SIM115  (closed in stop)
        client.start_new_kernel(cwd=str(self.workdir), env=self.env, stdout=self._log,
                                stderr=self._log)
        client.start_new_kernel_client()
        self.client = client
        self.starts += 1
        self.secret, self.seq = secrets.token_bytes(32), 0
        cfg = self.private / f"sandbox-{self.starts}.json"
        self.ledger = self.private / f"ledger-{self.starts}.txt"
        cfg.write_text(json.dumps({"secret": self.secret.hex(), "deny_read": self.deny_read,
                                   "deny_write": self.deny_write, "ledger": str(self.ledger)}))
        os.chmod(cfg, 0o600)
        run = self.run(f"import convlab.grading.sandbox as _cg\n_cg.install({str(cfg)!r})\n"
                       "del _cg\n", self.startup_timeout)
        if run.status != "ok":
            raise GradingError(f"the grading kernel did not start: {run.ename}: {run.evalue}")

    def _on_executed(self, cell, cell_index, execute_reply):
        self._reply = execute_reply

    def _mac(self, seq, kind, arg) -> str:
        return hmac.new(self.secret, f"{seq} {kind} {arg}".encode(),
                        hashlib.sha256).hexdigest()[:20]

    def marker(self, kind: str, arg: str) -> str:
        line = f"# convlab-grader {self.seq} {kind} {arg} {self._mac(self.seq, kind, arg)}\n"
        self.last_seq = self.seq
        self.seq += 1
        return line

    def noted(self, seq: int, kind: str, arg: str) -> bool:
        """Did the sandbox's audit hook record marked cell `seq` as clean (out of band)?"""
        line = f"{seq} {kind} {arg} ok"
        want = f"{line} {self._mac(-1, 'ledger', line)}"
        try:
            return want in self.ledger.read_text(encoding="utf-8").splitlines()
        except OSError:
            return False

    def run(self, source: str, timeout: float) -> CellRun:
        from nbclient.exceptions import CellTimeoutError, DeadKernelError

        cell = nbf.nbformat.v4.new_code_cell(source)
        self.client.nb.cells = [cell]
        self.client.timeout = max(1, int(round(timeout)))
        self._reply = None
        t0 = time.perf_counter()
        try:
            self.client.execute_cell(cell, 0)
        except CellTimeoutError:
            return CellRun("timeout", seconds=time.perf_counter() - t0,
                           stdout=_stream(cell, "stdout"))
        except DeadKernelError:
            return CellRun("dead", seconds=time.perf_counter() - t0,
                           stdout=_stream(cell, "stdout"))
        except Exception as e:  # noqa: BLE001  (a broken channel is a dead kernel to us)
            return CellRun("dead", ename=type(e).__name__, evalue=str(e),
                           seconds=time.perf_counter() - t0)
        dt = time.perf_counter() - t0
        content = (self._reply or {}).get("content", {})
        if content.get("status") == "ok":
            return CellRun("ok", stdout=_stream(cell, "stdout"), seconds=dt)
        if content.get("status") == "error":
            return CellRun("error", ename=content.get("ename", ""),
                           evalue=content.get("evalue", ""),
                           traceback=ANSI.sub("", "\n".join(content.get("traceback", []))),
                           stdout=_stream(cell, "stdout"), seconds=dt)
        return CellRun("dead", ename="NoReply", evalue=f"kernel replied {content!r}", seconds=dt)

    def stop(self):
        if self.client is not None:
            try:
                self.client._cleanup_kernel()
            except Exception:  # noqa: BLE001
                pass
            self.client = None
            self._log.close()


def _stream(cell, name: str) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == name)


# ----------------------------------------------------------------------------------------
# Grading


@dataclass
class Step:
    kind: str  # answer | test | setup
    task: str | None
    source: str
    index: int
    binds: list = field(default_factory=list)


def find_instructor(submission_nb, submission_path: Path, instructor=None) -> Path:
    """The solution (or grading) notebook the submission belongs to.

    instructor: a notebook, or a folder of them (default: the checkout's solutions/).
    In a folder, the notebook sharing most task ids with the submission wins (then the
    same file name).
    """
    if instructor is not None and Path(instructor).is_file():
        return Path(instructor)
    folder = Path(instructor) if instructor is not None else repo_root() / "solutions"
    candidates = solution_notebooks(folder) or sorted(folder.glob("*.ipynb")) if folder.is_dir(
    ) else []
    ids = {nbf.exercise_id(nbf.source(c)) for c in submission_nb.cells
           if c.get("cell_type") == "code"} - {None}
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
        raise GradingError(f"no instructor notebook in {folder} has the tasks of this submission "
                           f"({', '.join(sorted(ids)) or 'it has no # EXERCISE: cells'})")
    return best


def _answers(nb) -> dict:
    out = {}
    for c in nb.cells:
        if c.get("cell_type") == "code":
            tid = nbf.exercise_id(nbf.source(c))
            if tid:
                out[tid] = nbf.source(c)  # the last one wins, as when the learner ran them
    return out


def _normal(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


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
            steps.append(Step("setup", None, text, i, nbf.bound_names(text)))
    return steps


def _deniable(path: Path, folder: bool = False) -> Path:
    """The folder of `path` when the kernel does not need anything in it, else the file."""
    path = path.resolve()
    d = path if folder else path.parent
    needed = [Path(__file__).resolve().parents[1], Path(sys.prefix).resolve(), Path.cwd()]
    if any(n == d or d in n.parents for n in needed):
        return path
    return d


def kernel_env(mode: str = "sim") -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JPY_", "JUPYTER_"))}
    env.update(CONVLAB_MODE=mode, CONVLAB_GRADING="1", MPLBACKEND="Agg",
               PYTHONDONTWRITEBYTECODE="1", PYDEVD_DISABLE_FILE_VALIDATION="1")
    env["NUMBA_ENABLE_CUDASIM"] = "1" if mode == "sim" else "0"
    return env


def grade(submission, instructor=None, private_tests=None, *, cell_timeout: float | None = None,
          total_timeout: float | None = None, mode: str = "sim",
          deny_write=()) -> GradeResult:
    """Grade one submitted notebook; never raises for a bad submission (see .error)."""
    cell_timeout = cell_timeout or DEFAULT_CELL_TIMEOUT
    total_timeout = total_timeout or DEFAULT_TOTAL_TIMEOUT
    t_start = time.perf_counter()
    submission = Path(submission)
    try:
        sub_nb = nbf.read(submission)
    except nbf.NotebookFormatError as e:
        return GradeResult(str(submission), str(instructor or ""), [], error=str(e))
    instr_path = find_instructor(sub_nb, submission, instructor)
    instr_nb = nbf.read(instr_path)
    private = nbf.load_private_tests(private_tests) if private_tests else None
    try:
        gnb = nbf.grading_notebook(instr_nb, instr_path.name, private)
    except nbf.NotebookFormatError as e:
        raise GradingError(f"the instructor notebook is broken: {e}") from e
    lay = nbf.layout(gnb)
    tasks = {tid: TaskResult(tid, t.points) for tid, t in lay.tasks.items()}
    answers = _answers(sub_nb)
    log = []
    if private:
        n = sum(1 for c in gnb.cells if c.get("metadata", {}).get("convlab", {}).get("private"))
        log.append(f"{n} private test cell(s) merged from {private_tests}")
    steps = _plan(gnb)
    for s in steps:
        if s.kind == "answer":
            stub = s.source
            if s.task in answers:
                s.source = answers[s.task]
                if _normal(s.source) == _normal(stub):
                    tasks[s.task].flags.append("stub")
            else:
                tasks[s.task].flags.append("missing")
            tasks[s.task].flags += nbf.scan_flags(s.source) if s.task in answers else []

    result = GradeResult(str(submission), str(instr_path), list(tasks.values()), log=log)
    priv = Path(tempfile.mkdtemp(prefix="convlab-grader-"))
    work = Path(tempfile.mkdtemp(prefix="convlab-work-"))
    deny_read = [str(_deniable(instr_path))]
    if (repo_root() / "solutions").is_dir():
        deny_read.append(str((repo_root() / "solutions").resolve()))
    if private_tests:
        deny_read.append(str(_deniable(Path(private_tests), folder=True)))
    deny_read.append(str(priv))
    pkg = Path(__file__).resolve().parents[1]
    session = KernelSession(work, priv, kernel_env(mode), deny_read=deny_read,
                            deny_write=[str(pkg), str(priv), *map(str, deny_write)])
    try:
        _execute(session, steps, tasks, answers, cell_timeout, t_start + total_timeout, result)
    finally:
        session.stop()
        shutil.rmtree(priv, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    for t in tasks.values():
        stub, missing = "stub" in t.flags, "missing" in t.flags
        t.flags = [f for f in t.flags if f not in ("stub", "missing")]
        if missing:
            t.kind = "not-implemented" if t.kind in ("failed", "not-run") else t.kind
            t.message = (f"not implemented: the submission has no '# EXERCISE: {t.id}' answer "
                         "cell (it must be the cell's first line); the stub was graded\n"
                         + t.message)
        elif stub and not t.passed:
            t.kind = "not-implemented"
            t.message = ("not implemented: the answer cell still holds the `# YOUR CODE HERE` "
                         "stub\n" + t.message)
    result.seconds = time.perf_counter() - t_start
    return result


def _execute(session: KernelSession, steps, tasks, answers, cell_timeout, deadline, result):
    done: list[Step] = []  # steps whose effects the next tests may need (for a replay)
    failed_task_steps: set = set()
    answer_errors: dict = {}

    def remaining():
        return deadline - time.perf_counter()

    def start_and_replay():
        for _attempt in range(3):
            session.stop()
            session.start()
            ok = True
            for s in list(done):
                run = _run_step(session, s, min(cell_timeout, max(1, remaining())))
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
            if t is not None and t.kind == "not-run":
                t.message = "not run: the total time limit was reached"
            continue
        if s.kind == "test" and t is not None and t.kind not in ("not-run", "passed"):
            continue  # an earlier test of this task failed: the task scores 0 anyway
        timeout = min(cell_timeout, max(1.0, remaining()))
        run = _run_step(session, s, timeout)
        if t is not None:
            t.seconds += run.seconds
        if s.kind != "test" and run.status != "ok":
            result.cell_errors.append((s.kind, s.index, s.task, run.status if run.status != "error"
                                       else f"{run.ename}: {run.evalue}"))
        if s.kind == "answer":
            if run.status == "error":
                answer_errors[s.task] = f"{run.ename}: {run.evalue}"
            elif run.status in ("timeout", "dead"):
                answer_errors[s.task] = (
                    f"your answer cell timed out after {timeout:.0f} s (an endless loop?)"
                    if run.status == "timeout" else "your answer cell made the kernel die "
                    "(os._exit, a crash, or out of memory)")
        if s.kind == "test":
            _score_test(t, s, run, timeout, answer_errors.get(s.task), s.task in answers)
        if run.status in ("timeout", "dead"):
            if s.kind == "setup":
                result.log.append(f"instructor cell {s.index} {run.status}")
            if s.kind == "answer" and t is not None:
                t.kind = "timeout" if run.status == "timeout" else "crashed"
                t.message = answer_errors[s.task]
                failed_task_steps.add(s.task)
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
            result.log.append(f"instructor cell {s.index} raised {run.ename}: {run.evalue}")


def _run_step(session: KernelSession, s: Step, timeout: float) -> CellRun:
    if s.kind == "answer":
        return session.run(s.source, timeout)
    if s.kind == "setup":
        run = session.run(s.source, timeout)
        if run.status in ("ok", "error"):
            rec = session.run(session.marker("record", ",".join(s.binds) or "-") + "pass\n",
                              timeout)
            if rec.status not in ("ok",):
                return rec if rec.status in ("timeout", "dead") else run
        return run
    # a test: the marked cell, then the check cell; both must be in the sandbox's ledger
    run = session.run(session.marker("test", s.task) + s.source, timeout)
    test_seq = session.last_seq
    if run.status != "ok":
        return run
    chk = session.run(session.marker("check", s.task) + "pass\n", timeout)
    if chk.status != "ok":
        chk.stdout = run.stdout + chk.stdout
        chk.seconds += run.seconds
        return chk
    run.seconds += chk.seconds
    if not (session.noted(test_seq, "test", s.task)
            and session.noted(session.last_seq, "check", s.task)):
        return CellRun("error", "TamperingError", "the test cell did not run through the "
                       "grader's sandbox (was the notebook machinery patched?)",
                       stdout=run.stdout, seconds=run.seconds)
    return run


def _score_test(t: TaskResult, s: Step, run: CellRun, timeout: float, answer_error, answered):
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
    elif run.ename == "TamperingError":
        t.kind, t.message = "tampering", run.evalue
    else:
        t.kind = "failed"
        if run.ename in ("CheckError",):
            t.message = run.evalue
        elif run.ename == "NameError" and not answered:
            t.message = (f"{run.ename}: {run.evalue} (the submission has no '# EXERCISE: "
                         f"{t.id}' cell)")
        else:
            t.message = f"{run.ename}: {run.evalue}"
        if run.evalue.startswith("tampering detected"):
            t.kind = "tampering"
    if answer_error:
        t.message += f"\n(your answer cell raised {answer_error})"
    if run.stdout.strip():
        t.output += _tail(run.stdout)


def _pass_lines(text: str) -> str:
    return "".join(line + "\n" for line in text.splitlines() if line.startswith("✓"))


def _tail(text: str, n: int = 1500) -> str:
    return text if len(text) <= n else "…" + text[-n:]
