"""The learner's side of a graded call (imported only in the grading kernel).

The grader runs one-line cells such as ``...worker.call(7)``: read request 7 from the
inbox, call the learner's function on its inputs, write what came out (the return
value and every array argument afterwards) to the outbox. Nothing here decides
anything: the grader compares what it reads back with its own reference. A traced
call also records memory-access facts with `convlab.trace` for the grader to check.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import sys
import traceback

from . import wire

_cfg: dict = {}
# what the reply is written with, bound when the worker is imported (before any learner
# code): an answer that later replaces json.dump or os.replace does not change it
_dumps, _replace, _open = json.dumps, os.replace, open


def install(config_path: str) -> None:
    """Read the grader's settings and set up the in-process guard rails (second layer)."""
    if _cfg:
        raise RuntimeError("the grading worker is already installed")
    with open(config_path, encoding="utf-8") as f:
        cfg = json.load(f)
    if cfg.get("speed"):  # the clocks and course kernels, captured before learner code
        from . import speed_worker

        try:
            speed_worker.install(cfg, cfg["outbox"], cfg["inbox"])
        except Exception as e:  # noqa: BLE001  (correctness grading goes on; speed says why)
            speed_worker.INSTALL_ERROR.append(f"{type(e).__name__}: {e}"[:500])
    from . import host_reads, sandbox

    _cfg.update(cfg, guard=sandbox.install(cfg.get("sandbox", {})),
                host_reads=host_reads.install(),  # before any learner code: nothing to keep
                threads=frozenset(sys._current_frames()), kept=[])


def _ns() -> dict:
    try:
        return get_ipython().user_ns  # noqa: F821  (inside IPython)
    except NameError:
        return vars(sys.modules["__main__"])


def _reply(n: int, data: dict) -> None:
    path = os.path.join(_cfg["outbox"], f"resp-{n}.json")
    tmp = path + ".tmp"
    text = _dumps(data)
    with _open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    _replace(tmp, path)


def _error(e: BaseException) -> dict:
    tb = traceback.extract_tb(e.__traceback__)
    where = [f"{os.path.basename(fr.filename)}:{fr.lineno}" for fr in tb[-3:]]
    from convlab.check.core import raised_at

    return {"ok": False, "ename": type(e).__name__,
            "evalue": (str(e)[:2000] + raised_at(e)), "where": where}


def describe(n: int, name: str) -> None:
    """What the grader needs to know to call `name`: callable, signature, flags."""
    ns = _ns()
    if name not in ns:
        return _reply(n, {"ok": True, "missing": True})
    obj = ns[name]
    out = {"ok": True, "missing": False, "callable": callable(obj),
           "name": str(getattr(obj, "__name__", name))[:200], "params": None}
    if not callable(obj):
        try:
            enc = wire.Encoder(_cfg["outbox"], f"val{n}")
            out["value"] = enc(obj)
        except Exception as e:  # noqa: BLE001
            out["value_error"] = f"{type(e).__name__}: {e}"[:500]
        return _reply(n, out)
    try:
        sig = inspect.signature(obj)
        params = []
        for p in sig.parameters.values():
            default = None
            if p.default is not p.empty:
                d = p.default
                default = [d] if d is None or isinstance(d, (bool, int, float, str)) else [None]
            params.append([p.name, int(p.kind), default])
        out["params"] = params
    except (TypeError, ValueError):
        pass
    try:  # read here, where the source is (checks that read the answer's code ask for it)
        from convlab.check.source import sources

        out["sources"] = sources(obj)
    except Exception:  # noqa: BLE001
        out["sources"] = {}
    return _reply(n, out)


def _to_device(a):
    from numba import cuda

    return cuda.to_device(a)


def call(n: int) -> None:
    """Run request `n` of the inbox on the learner's function; write reply `n`."""
    try:
        req = wire.read_json(os.path.join(_cfg["inbox"], f"req-{n}.json"))
        fn = _ns()[req["name"]]
        dec = wire.Decoder(_cfg["inbox"], 1 << 34, to_device=_to_device)
        args = [dec(a) for a in req["args"]]
        kwargs = {k: dec(v) for k, v in req["kwargs"]}
        device = any(isinstance(a, dict) and a.get("dev") for a in
                     [*req["args"], *(v for _, v in req["kwargs"])])
    except Exception as e:  # noqa: BLE001
        return _reply(n, {"ok": False, "ename": "GraderRequestError", "evalue": str(e)})
    guard, reads = _cfg["guard"], _cfg["host_reads"]
    _cfg["kept"].clear()  # the previous call's values: read by the grader already
    if device and (foreign := _threads_of_its_own()):
        return _reply(n, foreign)
    # a GPU task's host reads (traced calls too: the tracer's own reads are exempt)
    copies = reads.counting() if device else contextlib.nullcontext()
    try:
        with guard(), copies as counted:
            if req.get("trace"):
                from convlab import trace

                t = trace.trace_launch(fn, *args, **kwargs)
                result = t.result
            else:
                result = fn(*args, **kwargs)
            if device or any(wire._is_device_array(a) for a in args):
                from numba import cuda

                cuda.synchronize()
            # the values go back from inside the guard and the count: learner code that runs
            # while they are read (a property, a replaced class) counts like any other, and
            # device arrays are read by the grader itself, only if exactly the runtime's
            out, enc = _package(n, result, args, kwargs, reads.device_values)
        # kept to the next call: a finalizer of the learner's cannot run before the grader
        # has read this reply (and the reply stands only if no thread of theirs is left)
        _cfg["kept"].extend([result, args, kwargs])
        if device and (foreign := _threads_of_its_own()):
            return _reply(n, foreign)
        if device and counted.n:
            return _reply(n, {"ok": False, "ename": "HostCopyError", "evalue": (
                f"{counted.n} device-to-host copies of arrays inside the graded call: "
                "the task asks for the work on the GPU (no copying to NumPy and back; under "
                "the simulator, reading a device array on the host counts as a copy: "
                "copy_to_host, np.asarray, printing an element, arithmetic on the whole "
                "array, a NumPy array handed to a kernel). Your notebook's self-check does not "
                "count these: remove debugging prints and host copies from the launcher")})
        if req.get("trace"):
            out["trace"] = enc(facts(t))  # plain values, the grader's own
    except wire.WireError as e:
        return _reply(n, {"ok": False, "ename": "WireError", "evalue": str(e)})
    except Exception as e:  # noqa: BLE001  (the learner's error goes back to the grader)
        err = _error(e)
        if req.get("trace") and type(e).__name__ == "TraceError":
            err["trace_error"] = True
        return _reply(n, err)
    return _reply(n, out)


def _threads_of_its_own() -> dict | None:
    """An error reply if Python threads run that were not there when the worker was
    installed (a GPU task's call and its reply must not share the process with code of
    the learner's that could rewrite the reply); None if there are none."""
    new = [i for i in sys._current_frames() if i not in _cfg["threads"]]
    if not new:
        return None
    return {"ok": False, "ename": "ThreadError", "evalue": (
        f"{len(new)} thread(s) started by the answer are still running during a graded GPU "
        "call: end them (join them) before the launcher returns")}


def _package(n: int, result, args, kwargs, device_values):
    """The reply's values (the result, then every argument that is an array) and the
    encoder that wrote them."""
    enc = wire.Encoder(_cfg["outbox"], f"r{n}", device_values=device_values)

    def back(a):
        return enc(a) if hasattr(a, "shape") and hasattr(a, "dtype") else None

    return {"ok": True, "result": enc(result), "args": [back(a) for a in args],
            "kwargs": [[k, back(v)] for k, v in kwargs.items()]}, enc


def facts(t) -> dict:
    """What the technique checks ask a `convlab.trace.Trace`, as plain values."""
    import numpy as np

    def attempt(f, *a, **k):
        try:
            return {"v": f(*a, **k)}
        except Exception as e:  # noqa: BLE001
            return {"e": f"{e}"[:500]}

    g = [dict(r) for r in t.global_stats()]
    s = [dict(r) for r in t.shared_stats()]
    arrays = [{"name": a.name, "aliases": list(a.aliases), "shape": list(a.shape)}
              for a in t.arrays]
    counts = {}
    for name in sorted({r["array"] for r in g}):
        for kind in ("load", "store"):
            c = attempt(t.load_counts, name, kind=kind)
            if "v" in c:
                c["v"] = np.asarray(c["v"], np.int64)
            counts[f"{kind}:{name}"] = c
    return {"global_stats": g, "shared_stats": s, "arrays": arrays, "counts": counts,
            "sectors": {k: attempt(t.sectors_per_request, k) for k in ("load", "store")},
            "conflicts": {str(k): attempt(t.bank_conflicts, kind=k)
                          for k in (None, "load", "store")},
            "barriers": [[str(k)[:200], [int(v) for v in b], int(n)]
                         for k, b, n in t.barriers_per_block()[:1024]],
            "races": [str(r)[:1000] for r in t.races()[:20]],
            "n_races": len(t.races())}
