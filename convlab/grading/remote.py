"""The learner's functions as seen from the grader: calls that run in the learner's process.

A `RemoteFunction` stands for a name the learner's answer defines (``conv2d_tiled``). The
checkers, running in the grader's process, call it like the real function: its array
arguments go to the learner's process as ``.npy`` files, the function runs there, and the
return value and the arguments afterwards (an ``out`` it filled) come back and are
written into the grader's own arrays. The checker compares them with its reference.

`RemoteTrace` holds the memory-access facts a traced call recorded (``convlab.trace``
runs where the learner's kernel runs); the technique checks read them like a `Trace`.
They come from the learner's process, so a learner who forges the tracer's records can
pass a technique check (never an output check): the README says so.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import stat
import time
from types import SimpleNamespace

import numpy as np

from . import wire

MAX_REPLY_BYTES = 256 << 20
_IDENT = re.compile(r"^[A-Za-z_]\w{0,79}$")
_classes: dict = {}


class KernelLost(BaseException):  # noqa: N818  (not an Exception: no checker may catch it)
    """The learner's process timed out or died during a graded call."""

    def __init__(self, kind: str, seconds: float):
        super().__init__(kind)
        self.kind, self.seconds = kind, seconds


def learner_error(ename: str, evalue: str) -> Exception:
    """An exception named like the learner's (its class never leaves their process)."""
    name = ename if isinstance(ename, str) and _IDENT.match(ename) else "Error"
    cls = _classes.get(name)
    if cls is None:
        cls = _classes[name] = type(name, (Exception,), {"__module__": "learner"})
    return cls(str(evalue)[:2000])


class RemoteFunction:
    """A callable of the learner's process (see the module docstring)."""

    def __init__(self, channel, name: str, desc: dict):
        self._channel, self._name = channel, name
        self.__name__ = self.__qualname__ = str(desc.get("name") or name)[:200]
        params = desc.get("params")
        self.__signature__ = _signature(params) if isinstance(params, list) else None
        src = desc.get("sources")  # read in the learner's process (check.source)
        self.sources = ({str(k)[:80]: str(v)[:20_000] for k, v in list(src.items())[:8]}
                        if isinstance(src, dict) else {})

    def __repr__(self):
        return f"<the learner's {self._name}>"

    @property
    def device(self):
        """Never the learner's word: a plain NumPy function would say False and be handed
        host arrays in a GPU task. A graded test states ``device=`` itself."""
        raise TypeError(f"the test calls a checker on the learner's {self._name} without "
                        "device=True or device=False: a graded test must say whether the task "
                        "passes device arrays (the submission does not get to decide)")

    def __call__(self, *args, **kwargs):
        return self._channel.call(self._name, args, kwargs)[0]

    def traced(self, *args, **kwargs):
        result, facts = self._channel.call(self._name, args, kwargs, trace=True)
        return RemoteTrace(facts, result)


def _signature(params) -> inspect.Signature | None:
    try:
        out = []
        for name, kind, default in params[:64]:
            if not (isinstance(name, str) and _IDENT.match(name)):
                return None
            kind = inspect._ParameterKind(int(kind))
            d = inspect.Parameter.empty
            if isinstance(default, list) and len(default) == 1 and (
                    default[0] is None or isinstance(default[0], (bool, int, float, str))):
                d = default[0]
            out.append(inspect.Parameter(name, kind, default=d))
        return inspect.Signature(out)
    except (TypeError, ValueError):
        return None


class Channel:
    """Graded calls into the learner's process through a kernel session.

    session: has ``run(source, timeout) -> CellRun``; inbox: a folder the grader writes and
    the learner's process only reads; outbox: a folder the learner's process writes.
    """

    def __init__(self, session, inbox, outbox):
        self.session, self.inbox, self.outbox = session, str(inbox), str(outbox)
        self.n = 0
        self.deadline = float("inf")
        self.output = []  # what the learner's code printed during graded calls
        self.seconds = 0.0

    def _run(self, line: str):
        left = self.deadline - time.perf_counter()
        if left <= 0:
            raise KernelLost("timeout", 0.0)
        run = self.session.run(line, left)
        self.seconds += run.seconds
        if run.stdout:
            self.output.append(run.stdout)
        if run.status in ("timeout", "dead"):
            raise KernelLost(run.status, run.seconds)
        if run.status != "ok":  # the worker itself was broken by the learner's code
            raise learner_error(run.ename or "Error", run.evalue)

    def _outbox_ok(self) -> bool:
        """The outbox is still the folder the grader made (not a link the learner put)."""
        try:
            return stat.S_ISDIR(os.lstat(self.outbox).st_mode)
        except OSError:
            return False

    def _reply(self, n: int) -> dict:
        if not self._outbox_ok():
            raise learner_error("ReplyError", "the grader's reply folder was replaced")
        try:
            reply = wire.read_json(os.path.join(self.outbox, f"resp-{n}.json"))
        except (wire.WireError, ValueError) as e:
            raise learner_error("ReplyError", f"the grader could not read what your function "
                                f"returned: {e}") from None
        if not isinstance(reply, dict):
            raise learner_error("ReplyError", "a malformed reply")
        return reply

    def describe(self, name: str) -> dict:
        self.n += 1
        n = self.n
        self._run(f"__import__('convlab.grading.worker', fromlist=['w']).describe({n}, "
                  f"{name!r})\n")
        reply = self._reply(n)
        if reply.get("missing") is False and not reply.get("callable") and "value" in reply:
            try:
                reply["value"] = wire.Decoder(self.outbox, MAX_REPLY_BYTES)(reply["value"])
            except wire.WireError as e:
                reply["value_error"] = str(e)
                del reply["value"]
        self._clean(n)
        return reply

    def call(self, name: str, args, kwargs, trace: bool = False):
        self.n += 1
        n = self.n
        enc = wire.Encoder(self.inbox, f"q{n}")
        try:
            req = {"name": name, "args": [enc(a) for a in args],
                   "kwargs": [[k, enc(v)] for k, v in kwargs.items()], "trace": trace}
        except wire.WireError as e:
            raise TypeError(f"the grader cannot pass this argument to your function: {e}"
                            ) from None
        wire_path = os.path.join(self.inbox, f"req-{n}.json")
        import json

        with open(wire_path, "w", encoding="utf-8") as f:
            json.dump(req, f)
        try:
            self._run(f"__import__('convlab.grading.worker', fromlist=['w']).call({n})\n")
            reply = self._reply(n)
            if not reply.get("ok"):
                if trace and reply.get("trace_error"):
                    from convlab.trace import TraceError

                    raise TraceError(str(reply.get("evalue", ""))[:2000])
                raise learner_error(reply.get("ename", "Error"), reply.get("evalue", ""))
            dec = wire.Decoder(self.outbox, MAX_REPLY_BYTES)
            try:
                result = dec(reply.get("result"))
                back = reply.get("args")
                if not isinstance(back, list) or len(back) != len(args):
                    raise wire.WireError("the reply has the wrong number of arguments")
                kback = reply.get("kwargs")
                if not isinstance(kback, list) or len(kback) != len(kwargs):
                    raise wire.WireError("the reply has the wrong number of arguments")
                pairs = list(zip(args, back, strict=True))
                for (k, a), kb in zip(kwargs.items(), kback, strict=True):
                    if not (isinstance(kb, list) and len(kb) == 2 and kb[0] == k):
                        raise wire.WireError("the reply's arguments are not the ones sent")
                    pairs.append((a, kb[1]))
                for a, b in pairs:
                    if isinstance(a, np.ndarray) or wire._is_device_array(a):
                        _write_back(a, dec(b))
                facts = dec(reply.get("trace")) if trace else None
            except wire.WireError as e:
                raise learner_error("ReplyError", f"the grader could not read what your "
                                    f"function returned: {e}") from None
            return result, facts
        finally:
            self._clean(n)

    def _clean(self, n: int) -> None:
        folders = [(self.inbox, (f"q{n}-", f"req-{n}."))]
        if self._outbox_ok():
            folders.append((self.outbox, (f"r{n}-", f"val{n}-", f"resp-{n}.")))
        for folder, prefixes in folders:
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                if name.startswith(prefixes):
                    try:
                        os.unlink(os.path.join(folder, name))
                    except OSError:
                        pass


def _write_back(a, b) -> None:
    """Put the learner's version of argument `a` (after the call) into the grader's `a`."""
    if not isinstance(b, np.ndarray) or b.shape != tuple(a.shape) or b.dtype != a.dtype:
        got = f"{b.dtype} {b.shape}" if isinstance(b, np.ndarray) else type(b).__name__
        raise wire.WireError(f"an argument came back as {got}, not {a.dtype} {tuple(a.shape)}")
    if isinstance(a, np.ndarray):
        if a.flags.writeable:
            np.copyto(a, b)
    else:
        a.copy_to_device(b)


# ----------------------------------------------------------------------------------------
# Traces recorded in the learner's process


class RemoteTrace:
    """The subset of `convlab.trace.Trace` the technique checks use, from recorded facts."""

    def __init__(self, facts, result=None):
        if not isinstance(facts, dict):
            facts = {}
        self._f, self.result = facts, result

    def _rows(self, key):
        rows = self._f.get(key)
        return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []

    def global_stats(self):
        return self._rows("global_stats")

    def shared_stats(self, by="site"):
        return self._rows("shared_stats")

    def _value(self, key, sub, what):
        from convlab.trace import TraceError

        d = self._f.get(key)
        v = d.get(sub) if isinstance(d, dict) else None
        if not isinstance(v, dict):
            raise TraceError(f"{what} was not recorded")
        if "v" in v:
            return v["v"]
        raise TraceError(str(v.get("e", f"no {what}")))

    def sectors_per_request(self, kind="load", array=None, site=None) -> float:
        return float(self._value("sectors", kind, f"sectors per {kind} request"))

    def bank_conflicts(self, kind=None, array=None, site=None) -> float:
        return float(self._value("conflicts", str(kind), "bank conflicts"))

    def array(self, name):
        from convlab.trace import TraceError

        for a in self._f.get("arrays") or []:
            if isinstance(a, dict) and (name == a.get("name") or name in (a.get("aliases") or [])):
                return SimpleNamespace(name=a.get("name"), aliases=a.get("aliases"),
                                       shape=tuple(a.get("shape") or ()))
        raise TraceError(f"no array called {name!r} in this trace")

    def load_counts(self, array, kind="load"):
        v = self._value("counts", f"{kind}:{self.array(array).name}", f"{kind} counts")
        return np.asarray(v)

    def barriers_per_block(self) -> list:
        rows = self._f.get("barriers")
        out = []
        for r in rows if isinstance(rows, list) else []:
            if (isinstance(r, list) and len(r) == 3 and isinstance(r[1], list)
                    and isinstance(r[2], int)):
                out.append((str(r[0]), tuple(int(v) for v in r[1]), r[2]))
        return out

    def races(self) -> list:
        r = self._f.get("races")
        return [str(x) for x in r] if isinstance(r, list) else []


def install_trace_dispatch() -> None:
    """Let ``convlab.trace.trace_launch`` trace a RemoteFunction where it runs."""
    from convlab import trace

    if getattr(trace.trace_launch, "_convlab_remote", False):
        return
    original = trace.trace_launch

    @functools.wraps(original)
    def trace_launch(fn, *args, **kwargs):
        if isinstance(fn, RemoteFunction):
            return fn.traced(*args, **kwargs)
        return original(fn, *args, **kwargs)

    trace_launch._convlab_remote = True
    trace.trace_launch = trace_launch
