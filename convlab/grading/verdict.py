"""Test cells run in the grader's process, against the learner's functions run elsewhere.

`TestScope` is the namespace the instructor's ``# TEST:`` cells execute in, inside the
grader's process: the imports of the instructor's cells, the instructor definitions a
test uses (executed here, so a learner's own helper or constant named like one stays
the learner's), and, for each name an answer cell defines, a `RemoteFunction` into the
learner's process. ``convlab.check`` functions are seen through a view that replaces
their ``seed`` by one derived from a secret drawn for this grading: the learner's
process knows neither the data nor the expected outputs. A test passes iff its cell
raises nothing here; nothing printed or returned by the learner's process decides it.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import hashlib
import inspect
import io
import sys
import time
import types
from dataclasses import dataclass

from . import notebook as nbf
from .remote import Channel, KernelLost, RemoteFunction, install_trace_dispatch

MAX_TEST_OUTPUT = 4000


@dataclass
class TestRun:
    status: str  # ok | error | timeout | dead
    ename: str = ""
    evalue: str = ""
    stdout: str = ""
    seconds: float = 0.0
    learner_output: str = ""


def free_names(tree) -> set:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Load)}


def _bound(stmt) -> list:
    return nbf.bound_names(ast.unparse(stmt))


class _CappedIO(io.StringIO):
    def write(self, s):
        if self.tell() < MAX_TEST_OUTPUT:
            return super().write(s[: MAX_TEST_OUTPUT - self.tell()])
        return len(s)


class TestScope:
    """The grader-side namespace of a grading notebook's tests (see the module docstring).

    setup: [(cell index, source)] of the instructor's other cells; answer_names: names the
    instructor's answer cells bind (the task's interface); secret: bytes for the seeds.
    """

    def __init__(self, setup, answer_names, secret: bytes, mode: str):
        self.answer_names = set(answer_names)
        self.secret, self.mode, self.calls = secret, mode, 0
        self.ns: dict = {"__builtins__": builtins, "__name__": "__convlab_test__"}
        self.defs: list = []  # (cell index, names, compiled statement, its free names)
        _grader_mode(mode)
        install_trace_dispatch()
        for index, text in setup:
            try:
                tree = ast.parse(nbf.python_source(text))
            except SyntaxError:
                continue
            for stmt in tree.body:
                if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    with contextlib.suppress(Exception):
                        exec(compile(ast.Module([stmt], []), f"<instructor cell {index}>",
                                     "exec"), self.ns)
                elif isinstance(stmt, (ast.FunctionDef, ast.ClassDef, ast.Assign,
                                       ast.AnnAssign, ast.AsyncFunctionDef)):
                    names = set(_bound(stmt))
                    if names:
                        code = compile(ast.Module([stmt], []), f"<instructor cell {index}>",
                                       "exec")
                        self.defs.append((index, names, code, free_names(stmt)))
        self._views()

    # seeds the learner's process cannot know
    def seed(self, seed):
        self.calls += 1
        h = hashlib.blake2b(f"{seed!r}/{self.calls}".encode(), key=self.secret[:64],
                            digest_size=8)
        return int.from_bytes(h.digest(), "little")

    def _seeded(self, fn):
        try:
            takes_seed = "seed" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            takes_seed = False
        if not takes_seed:
            return fn

        def seeded(*args, seed=None, **kwargs):
            return fn(*args, seed=self.seed(seed), **kwargs)

        seeded.__name__ = seeded.__qualname__ = fn.__name__
        seeded.__doc__ = fn.__doc__
        return seeded

    def _views(self):
        import convlab
        import convlab.check as check

        scope = self

        class CheckView(types.ModuleType):
            def __getattr__(self, name):
                v = getattr(check, name)
                return scope._seeded(v) if name.startswith("check_") and callable(v) else v

        class ConvlabView(types.ModuleType):
            def __getattr__(self, name):
                return self._check if name == "check" else getattr(convlab, name)

        cv = CheckView("convlab.check")
        lv = ConvlabView("convlab")
        lv._check = cv
        for k, v in list(self.ns.items()):
            if v is convlab:
                self.ns[k] = lv
            elif v is check:
                self.ns[k] = cv
            elif callable(v) and getattr(v, "__module__", "").startswith("convlab.check") and (
                    getattr(v, "__name__", "").startswith("check_")):
                self.ns[k] = self._seeded(v)

    def _pull(self, name: str, before: int, seen: set, channel) -> None:
        """Execute here the latest instructor statement binding `name` before cell `before`."""
        if name in seen:
            return
        seen.add(name)
        found = [d for d in self.defs if name in d[1] and d[0] < before]
        if not found:
            return
        index, names, code, needs = found[-1]
        for other in sorted(needs - names):
            self._need(other, before, seen, channel)
        with contextlib.suppress(Exception):
            exec(code, self.ns)

    def _need(self, name, before, seen, channel):
        if name in self.answer_names:
            self._bind_remote(name, channel)
        elif name not in self.ns and not hasattr(builtins, name):
            self._pull(name, before, seen, channel)

    def _bind_remote(self, name: str, channel: Channel) -> None:
        desc = channel.describe(name)
        self.ns.pop(name, None)
        if desc.get("missing") or not desc.get("ok", True):
            return  # the test raises NameError, as in the learner's notebook
        if desc.get("callable"):
            self.ns[name] = RemoteFunction(channel, name, desc)
        elif "value" in desc:
            self.ns[name] = desc["value"]

    def run(self, index: int, source: str, name: str, channel: Channel,
            timeout: float) -> TestRun:
        """Run test cell `index` here; its learner calls go through `channel`."""
        t0 = time.perf_counter()
        channel.deadline, channel.output = t0 + timeout, []
        out = _CappedIO()
        try:
            tree = ast.parse(nbf.python_source(source))
            seen: set = set()
            for n in sorted(free_names(tree)):
                self._need(n, index, seen, channel)
            code = compile(tree, f"<test {name}>", "exec")
            with contextlib.redirect_stdout(out), _grader_mode(self.mode):
                exec(code, self.ns)
        except KernelLost as e:
            return TestRun(e.kind, stdout=out.getvalue(), seconds=time.perf_counter() - t0,
                           learner_output="".join(channel.output))
        except Exception as e:  # noqa: BLE001  (the test failed: that is the verdict)
            return TestRun("error", type(e).__name__, str(e), out.getvalue(),
                           time.perf_counter() - t0, "".join(channel.output))
        return TestRun("ok", stdout=out.getvalue(), seconds=time.perf_counter() - t0,
                       learner_output="".join(channel.output))


class _grader_mode(contextlib.ContextDecorator):  # noqa: N801  (used as a context manager)
    """In the grader's process, let the checkers see the grading mode ('sim': small cases).

    Calling it once (outside a ``with``) chooses the mode when numba is not imported yet.
    """

    def __init__(self, mode: str):
        from convlab import runtime

        self.runtime, self.mode = runtime, mode
        if "numba" not in sys.modules:
            runtime.setup(mode)

    def __enter__(self):
        self.old = self.runtime._state.get("mode")
        self.runtime._state["mode"] = self.mode
        return self

    def __exit__(self, *exc):
        self.runtime._state["mode"] = self.old
        return False
