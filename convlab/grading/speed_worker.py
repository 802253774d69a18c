"""The timing side of speed grading, in the learner's process (imported only for --gpu).

`install()` runs in the grading kernel before any learner code: it keeps its own
references to the clocks (``time.perf_counter``, the driver's event record / elapsed
time / synchronize calls), the course launchers and the default stream, so that
replacing ``numba.cuda.event`` or ``Event.elapsed_time`` later changes nothing here (and
`patched()` names what was replaced: the timer canary). The grader then runs one cell
per timed call:

- `setup(n)`: the task's problem (shapes, the learner's launcher, the course rung);
- `repeat(n)`: fresh input buffers filled from the seed the grader reveals only now,
  the output poisoned, the L2 flushed (a buffer twice its size written), then the call
  timed with events on the default stream and with the wall clock around the call and a
  device-wide synchronize; a *refill* repeat writes new values into the previous
  repeat's buffers instead (a launcher that replays results by address returns stale
  ones);
- `verify(n)`: after a device-wide synchronize, the output and input values at indices
  the grader draws after the call, the number of input elements that changed anywhere,
  and the output's NaN/Inf count.

Nothing here decides anything: the grader compares what comes back with its own
reference and its own clock (`convlab.grading.speed`).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

_M32 = 0xFFFFFFFF
POISON_BITS = 0x7FC0DEAD  # convlab.check's 'not written' NaN
_T: dict = {}  # what install() captured
_S: dict = {}  # task -> its state (problem, kept buffers)
INSTALL_ERROR: list = []  # why install() failed, if it did
_IO: dict = {}  # the grader's inbox and the outbox
TIMING_NAMES = ("time.perf_counter", "Event.record", "Event.elapsed_time", "Event.synchronize",
                "drv.event_elapsed_time", "cuda.event", "cuda.synchronize", "driver.cuEventRecord",
                "driver.cuEventElapsedTime", "driver.cuCtxSynchronize")


# ----------------------------------------------------------------------------------------
# Input values: a counter-based hash, the same on the host (NumPy) and on the device


def buffer_seed(seed: int, k: int) -> int:
    """The seed of input buffer `k` of a repeat drawn with `seed`."""
    return (int(seed) * 0x2545F491 + (k + 1) * 0x632BE5AB) & _M32


def values(seed: int, index) -> np.ndarray:
    """float32 values in [-1, 1) of the elements at flat `index` of a buffer (exact)."""
    x = (np.asarray(index, dtype=np.uint64) * np.uint64(0x9E3779B1) + np.uint64(seed)) & \
        np.uint64(_M32)
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x85EBCA6B)) & np.uint64(_M32)
    x ^= x >> np.uint64(13)
    x = (x * np.uint64(0xC2B2AE35)) & np.uint64(_M32)
    x ^= x >> np.uint64(16)
    return ((x >> np.uint64(8)).astype(np.float32) * np.float32(2.0**-23) - np.float32(1.0))


def kernels():
    """The device kernels (`speed_kernels`; imports numba)."""
    from . import speed_kernels

    return speed_kernels.KERNELS


def _grid(n: int) -> tuple:
    """Blocks, threads of the grid-stride kernels (one warp under the simulator, which
    runs every thread as an OS thread)."""
    from convlab import runtime

    if runtime.is_simulator():
        return (1, 32)
    return (min(4096, max(1, (n + 255) // 256)), 256)


def fill_values(dev_flat, seed: int) -> None:
    kernels()["fill"][_grid(dev_flat.size)](dev_flat, np.uint32(seed))


def gather_values(dev_flat, index) -> np.ndarray:
    from numba import cuda

    idx = cuda.to_device(np.ascontiguousarray(index, dtype=np.int64))
    out = cuda.device_array(idx.size, np.float32)
    kernels()["gather"][_grid(idx.size)](dev_flat, idx, out)
    return out.copy_to_host()


def count_changed(dev_flat, seed: int) -> int:
    from numba import cuda

    c = cuda.to_device(np.zeros(1, np.int64))
    kernels()["changed"][_grid(dev_flat.size)](dev_flat, np.uint32(seed), c)
    return int(c.copy_to_host()[0])


def count_nonfinite(dev_flat) -> int:
    from numba import cuda

    c = cuda.to_device(np.zeros(1, np.int64))
    kernels()["nonfinite"][_grid(dev_flat.size)](dev_flat, c)
    return int(c.copy_to_host()[0])


# ----------------------------------------------------------------------------------------
# The clocks, captured before the learner's code runs


def _lookup(name: str):
    from numba import cuda
    from numba.cuda.cudadrv import driver as drv

    owner, attr = name.split(".", 1)
    if owner == "time":
        import time

        return getattr(time, attr)
    if owner == "Event":
        return getattr(drv.Event, attr)
    if owner == "drv":
        return getattr(drv, attr)
    if owner == "cuda":
        return getattr(cuda, attr)
    return getattr(drv.driver, attr)


def install(cfg: dict, outbox: str, inbox: str) -> None:
    """Capture the clocks, the default stream, events and the course launchers."""
    if _T:
        return
    _IO.update(inbox=inbox, outbox=outbox)
    import time

    from numba import cuda
    from numba.cuda.cudadrv import driver as drv

    import convlab.kernels as K

    cuda.current_context()
    drv.driver.cuEventRecord  # noqa: B018  (bind the driver calls now, before learner code)
    drv.driver.cuEventElapsedTime  # noqa: B018
    drv.driver.cuCtxSynchronize  # noqa: B018
    names = {n: _lookup(n) for n in TIMING_NAMES}
    ladders = {name: dict(getattr(K, name)) for name in ("GEMM_LADDER", "CONV_LADDER",
                                                          "FILTER_LADDER")}
    codes = {(lad, r): getattr(f, "__code__", None) for lad, d in ladders.items()
             for r, f in d.items()}
    l2 = int(getattr(cuda.get_current_device(), "L2_CACHE_SIZE", 0) or (64 << 20))
    flush_buf = cuda.device_array(max(2 * l2, 64 << 20) // 4, np.float32)
    kernels()
    _T.update(names=names, perf=time.perf_counter, rec=drv.driver.cuEventRecord,
              elapsed=drv.driver.cuEventElapsedTime, sync=drv.driver.cuCtxSynchronize,
              stream=drv._stream_handle(0), events=[cuda.event() for _ in range(4)],
              ladders=ladders, codes=codes, flush=flush_buf, cfg=cfg)


def patched() -> list[str]:
    """The timing functions (and course launchers) that are not the ones captured."""
    out = []
    for n, f in _T["names"].items():
        try:
            now = _lookup(n)
        except Exception:  # noqa: BLE001
            now = None
        if now is not f:
            out.append(n)
    for (lad, r), code in _T["codes"].items():
        if getattr(_T["ladders"][lad][r], "__code__", None) is not code:
            out.append(f"{lad}[{r!r}]")
    return out


# ----------------------------------------------------------------------------------------
# The cells the grader runs


def _ns() -> dict:
    try:
        return get_ipython().user_ns  # noqa: F821  (inside IPython)
    except NameError:
        return vars(sys.modules["__main__"])


def _read(n: int) -> dict:
    from . import wire

    return wire.read_json(os.path.join(_IO["inbox"], f"req-{n}.json"))


def _reply(n: int, data: dict) -> None:
    path = os.path.join(_IO["outbox"], f"resp-{n}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def _fail(n: int, e: BaseException) -> None:
    _reply(n, {"ok": False, "ename": type(e).__name__, "evalue": str(e)[:2000]})


def setup(n: int) -> None:
    """Request n: {task, fn, who: {learner|course: {inputs, out, kwargs, host}}, ladder,
    rung, fixed: {input index: seed}}."""
    try:
        if not _T:
            raise RuntimeError("the timing harness did not start: "
                               + (INSTALL_ERROR[-1] if INSTALL_ERROR else "not installed"))
        req = _read(n)
        st = {"req": req, "kept": [], "last": None}
        ns = _ns()
        if req["fn"] not in ns or not callable(ns[req["fn"]]):
            raise NameError(f"no function named {req['fn']!r} to time")
        st["learner"] = ns[req["fn"]]
        st["course"] = _T["ladders"][req["ladder"]][req["rung"]]
        _S[req["task"]] = st
    except Exception as e:  # noqa: BLE001
        return _fail(n, e)
    return _reply(n, {"ok": True})


def _noop(*args, **kwargs):
    return None


def _buffers(spec: dict, seed: int, fixed: dict, reuse=None):
    """Device inputs filled from `seed` (fixed ones from their own seed) and a poisoned
    output; `reuse`: refill those buffers in place instead of allocating new ones."""
    from numba import cuda

    k = kernels()
    if reuse is None:
        ins = [cuda.device_array(tuple(s), np.float32) for s in spec["inputs"]]
        out = cuda.device_array(tuple(spec["out"]), np.float32)
    else:
        ins, out = reuse["ins"], reuse["out"]
    seeds = []
    for i, a in enumerate(ins):
        s = int(fixed.get(str(i), buffer_seed(seed, i)))
        fill_values(a.reshape(a.size), s)
        seeds.append(s)
    o = out.reshape(out.size).view(np.uint32)
    k["poison"][_grid(o.size)](o)
    return {"ins": ins, "out": out, "seeds": seeds}


def repeat(n: int) -> None:
    """Request n: {task, who: learner|course|noop, seed, refill}; reply the times (ms)."""
    try:
        req = _read(n)
        st = _S[req["task"]]
        who = req["who"]
        spec = st["req"]["problems"]["course" if who == "course" else "learner"]
        fixed = st["req"].get("fixed", {})
        reuse = st["last"] if (req.get("refill") and who == "learner") else None
        bufs = _buffers(spec, int(req["seed"]), fixed, reuse)
        args = list(bufs["ins"])
        for i in spec.get("host", []):
            args[i] = args[i].copy_to_host()
        fn = {"learner": st["learner"], "course": st["course"], "noop": _noop}[who]
        rec, elapsed, sync, perf, stream = (_T["rec"], _T["elapsed"], _T["sync"], _T["perf"],
                                            _T["stream"])
        f0, f1, e0, e1 = (int(e.handle) for e in _T["events"])
        flush = _T["flush"]
        sync()
        rec(f0, stream)
        kernels()["flush"][_grid(flush.size)](flush, np.float32(n % 97))
        rec(f1, stream)
        sync()
        w0 = perf()
        rec(e0, stream)
        fn(*args, bufs["out"], **spec.get("kwargs", {}))
        rec(e1, stream)
        sync()
        w1 = perf()
        data = {"ok": True, "event_ms": float(elapsed(e0, e1)), "wall_ms": (w1 - w0) * 1e3,
                "flush_ms": float(elapsed(f0, f1)), "patched": patched()}
        if who == "learner":
            st["last"] = bufs
            st["kept"].append(bufs)
    except Exception as e:  # noqa: BLE001  (the learner's error goes back to the grader)
        return _fail(n, e)
    return _reply(n, data)


def verify(n: int) -> None:
    """Request n: {task, out: index file, inputs: [index file...]}; the last learner
    repeat's values there, its changed-input and non-finite counts."""
    from . import wire

    try:
        req = _read(n)
        st = _S[req["task"]]
        _T["sync"]()
        bufs = st["last"]
        dec = wire.Decoder(_IO["inbox"], 1 << 28)
        enc = wire.Encoder(_IO["outbox"], f"r{n}")
        out = bufs["out"].reshape(bufs["out"].size)
        data = {"ok": True, "out": enc(gather_values(out, dec(req["out"]))),
                "inputs": [enc(gather_values(a.reshape(a.size), dec(i)))
                           for a, i in zip(bufs["ins"], req["inputs"], strict=True)],
                "changed": [count_changed(a.reshape(a.size), s)
                            for a, s in zip(bufs["ins"], bufs["seeds"], strict=True)],
                "nonfinite": count_nonfinite(out), "patched": patched()}
    except Exception as e:  # noqa: BLE001
        return _fail(n, e)
    return _reply(n, data)


def forget(n: int) -> None:
    """Free the buffers of a task (request n: {task})."""
    try:
        _S.pop(_read(n)["task"], None)
    except Exception as e:  # noqa: BLE001
        return _fail(n, e)
    return _reply(n, {"ok": True})
