"""Values between the grader and the learner's process: JSON plus ``.npy`` files, no pickle.

The grader sends a call's inputs and reads back its outputs through two folders: an
inbox the grader writes (the learner's process may only read it) and an outbox the
learner's process writes. Reading the outbox trusts nothing: no symbolic links, regular
files only, a byte budget, numeric arrays only (``allow_pickle=False``), bounded nesting.

Encoded values (JSON): ``null``, booleans, integers, strings, lists, and tagged objects
``{"f": "nan"}`` (non-finite floats), ``{"t": [...]}`` (tuples), ``{"d": [[k, v], ...]}``
(dicts with string keys), ``{"r": [start, stop, step]}`` (ranges), ``{"s": [start, stop,
step]}`` (slices of integers or None), ``{"a": "file.npy", "dev": bool}`` (arrays; ``dev``:
a CUDA device array on the sending side; a torch tensor is sent as its host array).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat

import numpy as np

from ..check.core import _to_host

MAX_DEPTH = 16
MAX_ITEMS = 100_000
MAX_STR = 20_000
MAX_JSON_BYTES = 4 << 20
_FILE = re.compile(r"^[A-Za-z0-9_.\-]{1,80}\.npy$")
NUMERIC_KINDS = "biufc"
# the writers, bound at import (in the learner's process: before any of its code)
_os_open, _fdopen, _np_save = os.open, os.fdopen, np.save


class WireError(ValueError):
    """A value that cannot be sent, or a reply that breaks the format."""


def _is_device_array(v) -> bool:
    return hasattr(v, "copy_to_host") and hasattr(v, "shape") and not isinstance(v, np.ndarray)


class Encoder:
    """Writes arrays as ``<prefix>-<n>.npy`` in `folder` and returns JSON-able specs."""

    def __init__(self, folder, prefix: str, device_values=None):
        self.folder, self.prefix, self.n, self.items = str(folder), prefix, 0, 0
        # learner side: the grader's own read of a device array (None: not exactly one of
        # the runtime's); without it, a device array's copy_to_host
        self.device_values = device_values

    def array(self, a, device: bool = False) -> dict:
        a = np.ascontiguousarray(a)
        if a.dtype.kind not in NUMERIC_KINDS:
            raise WireError(f"cannot send an array of dtype {a.dtype} (numbers only)")
        name = f"{self.prefix}-{self.n}.npy"
        self.n += 1
        path = os.path.join(self.folder, name)
        fd = _os_open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with _fdopen(fd, "wb") as f:
            _np_save(f, a, allow_pickle=False)
        return {"a": name, "dev": bool(device)}

    def __call__(self, v, depth: int = 0):
        self.items += 1
        if depth > MAX_DEPTH or self.items > MAX_ITEMS:
            raise WireError("the value is nested too deeply or has too many items")
        if v is None or isinstance(v, (bool, str)):
            if isinstance(v, str) and len(v) > MAX_STR:
                raise WireError(f"a string of {len(v)} characters is too long to send")
            return v
        if isinstance(v, (int, np.integer)) and not isinstance(v, np.bool_):
            return int(v)
        if isinstance(v, np.bool_):
            return bool(v)
        if isinstance(v, (float, np.floating)):
            f = float(v)
            return f if math.isfinite(f) else {"f": repr(f)}
        if self.device_values is not None:
            host = self.device_values(v)
            if host is not None:
                return self.array(host, device=True)
        if isinstance(v, np.ndarray):
            return self.array(v)
        if _is_device_array(v):
            if self.device_values is not None:  # a subclass, or a changed class
                raise WireError(f"cannot send a value of type {type(v).__name__}: not one of "
                                "the runtime's own device arrays")
            return self.array(v.copy_to_host(), device=True)
        if isinstance(v, range):
            return {"r": [v.start, v.stop, v.step]}
        if isinstance(v, slice):
            ends = [v.start, v.stop, v.step]
            if not all(e is None or isinstance(e, (int, np.integer)) for e in ends):
                raise WireError("only slices of integers can be sent")
            return {"s": [None if e is None else int(e) for e in ends]}
        if isinstance(v, tuple):
            return {"t": [self(x, depth + 1) for x in v]}
        if isinstance(v, list):
            return [self(x, depth + 1) for x in v]
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                raise WireError("only dicts with string keys can be sent")
            return {"d": [[k, self(x, depth + 1)] for k, x in v.items()]}
        if isinstance(v, np.generic):
            return self(v.item(), depth + 1)
        if (hasattr(v, "detach") and hasattr(v, "cpu")) or hasattr(v, "__array_interface__") or (
                hasattr(v, "__cuda_array_interface__")):  # torch, CuPy: as the checkers take them
            return self(np.asarray(_to_host(v)), depth + 1)
        raise WireError(f"cannot send a value of type {type(v).__name__}")


def read_file(path, limit: int) -> bytes:
    """The bytes of a regular file (not a link) of at most `limit` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise WireError(f"no reply file ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise WireError("the reply is not a regular file")
        if st.st_size > limit:
            raise WireError(f"the reply is {st.st_size} bytes, over the limit of {limit}")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise WireError("the reply grew over the limit while it was read")
    return data


def read_json(path, limit: int = MAX_JSON_BYTES):
    try:
        return json.loads(read_file(path, limit).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise WireError("the reply is not valid JSON") from None


class Decoder:
    """Reads specs written by `Encoder` from `folder`, within a byte budget."""

    def __init__(self, folder, budget: int, to_device=None):
        self.folder, self.budget, self.items = str(folder), budget, 0
        self.to_device = to_device  # called on arrays sent as device arrays (learner side)

    def array(self, spec) -> np.ndarray:
        name = spec.get("a")
        if not isinstance(name, str) or not _FILE.match(name):
            raise WireError("a malformed array name in the reply")
        data = read_file(os.path.join(self.folder, name), self.budget)
        self.budget -= len(data)
        import io

        try:
            a = np.load(io.BytesIO(data), allow_pickle=False)
        except Exception:  # noqa: BLE001  (any malformed file is the same failure)
            raise WireError(f"{name} is not a valid .npy array") from None
        if not isinstance(a, np.ndarray) or a.dtype.kind not in NUMERIC_KINDS:
            raise WireError(f"{name} does not hold a numeric array")
        if spec.get("dev") and self.to_device is not None:
            return self.to_device(a)
        return a

    def __call__(self, v, depth: int = 0):
        self.items += 1
        if depth > MAX_DEPTH or self.items > MAX_ITEMS:
            raise WireError("the reply is nested too deeply or has too many items")
        if v is None or isinstance(v, (bool, int, float)):
            return v
        if isinstance(v, str):
            if len(v) > MAX_STR:
                raise WireError("a string in the reply is too long")
            return v
        if isinstance(v, list):
            return [self(x, depth + 1) for x in v]
        if isinstance(v, dict) and len(v) <= 2:
            if "a" in v:
                return self.array(v)
            if set(v) == {"f"} and v["f"] in ("nan", "inf", "-inf"):
                return float(v["f"])
            if set(v) == {"t"} and isinstance(v["t"], list):
                return tuple(self(x, depth + 1) for x in v["t"])
            if set(v) == {"r"} and isinstance(v["r"], list) and len(v["r"]) == 3 and all(
                    type(x) is int for x in v["r"]):
                return range(*v["r"])
            if set(v) == {"s"} and isinstance(v["s"], list) and len(v["s"]) == 3 and all(
                    x is None or type(x) is int for x in v["s"]):
                return slice(*v["s"])
            if set(v) == {"d"} and isinstance(v["d"], list):
                out = {}
                for kv in v["d"]:
                    if not (isinstance(kv, list) and len(kv) == 2 and isinstance(kv[0], str)):
                        raise WireError("a malformed dict in the reply")
                    out[kv[0]] = self(kv[1], depth + 1)
                return out
        raise WireError("a malformed value in the reply")
