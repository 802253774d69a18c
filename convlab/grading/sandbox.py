"""The in-process guard rails of the grading kernel: a second layer, not the defence.

Scores never come from the learner's process (the grader compares outputs in its own
process, and the OS isolates this one: see `jail`). These rails only make the obvious
shortcuts fail loudly, also where the grader could not get OS isolation:

1. the functions that *compute an answer* (``convlab.reference`` convolutions,
   ``convlab.kernels`` launchers and kernels, ``convlab.baselines``...) are wrapped so that
   they raise `NotAllowedInAnswer` while a graded call of the learner's function runs
   (helpers such as ``conv2d_output_shape`` or ``ceil_div`` stay allowed);
2. an audit hook refuses reading the solutions / instructor / private-test folders,
   writing any ``results.json`` or under the grader's folders, learner code starting
   processes, and signalling other processes.

Code in the same process can always go around both (closures, ctypes): the README's
integrity table says which attacks only these rails stop.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import pkgutil
import re
import sys
import threading
import types

# What an answer may not call while it is being checked. In convlab.reference,
# convlab.baselines and convlab.precision: every public function except helpers. In
# convlab.kernels and convlab.cpu: kernels, launchers (``@launcher``) and functions named
# like an answer or a kernel factory. A module can allow more names with
# ``GRADING_ALLOWED = ("name", ...)``.
_HELPER_NAMES = re.compile(
    r"^(pair|conv_params|ConvParams|pad_nchw|.*_shape|.*_shapes|.*_flops|.*_bytes|.*_count|"
    r"arithmetic_intensity|ceil_div|launcher|.*_launch_params|.*_report|.*_available|"
    r".*_grid|set_.*|as_numpy|Unsupported)$")
_WRAP_ALL_MODULES = ("convlab.reference", "convlab.baselines", "convlab.precision",
                     "convlab.formats", "convlab.census")
_ANSWER_MODULES = ("convlab.reference", "convlab.baselines", "convlab.kernels", "convlab.cpu",
                   "convlab.precision", "convlab.formats", "convlab.census",
                   "convlab.fft_conv", "convlab.winograd", "convlab.pipeline")
_ANSWER_NAMES = re.compile(
    r"^(conv2d.*|filter2d.*|gemm.*|im2col.*|col2im.*|depthwise.*|separable.*|make_.*|"
    r"launch.*|.*_launch|launcher_for|prepare|transpose.*|nchw_to_nhwc|nhwc_to_nchw)$")
_SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.spawn",
                           "os.posix_spawn", "os.fork", "os.forkpty", "os.startfile",
                           "pty.spawn", "os.killpg"})
# Library code that only passes a request on: the frame that called it decides.
_HELPER_FILES = ("inspect.py", "traceback.py", "linecache.py", "logging", "warnings.py",
                 "contextlib.py", "functools.py", "threading.py", "subprocess.py", "os.py",
                 "pty.py", "shutil.py", "platform.py", "popen_fork.py", "popen_spawn_posix.py",
                 "context.py", "process.py", "pool.py", "thread.py", "base_events.py",
                 "unix_events.py")


class NotAllowedInAnswer(PermissionError):
    """The answer used something it must not (the package's solution, the grader's files)."""


_installed: dict = {}


def _is_kernel(obj) -> bool:
    name = type(obj).__name__
    if name not in ("FakeCUDAKernel", "CUDADispatcher", "Dispatcher"):
        return False
    return not (getattr(obj, "_device", False)
                or getattr(obj, "targetoptions", {}).get("device", False))


class _Launch:
    __slots__ = ("_go", "_check")

    def __init__(self, go, check):
        self._go, self._check = go, check

    def __call__(self, *args, **kwargs):
        self._check()
        return self._go(*args, **kwargs)


class _KernelProxy:
    """A CUDA kernel that refuses to launch inside an answer."""

    __slots__ = ("_kernel", "_check")

    def __init__(self, kernel, check):
        object.__setattr__(self, "_kernel", kernel)
        object.__setattr__(self, "_check", check)

    def __getitem__(self, config):
        return _Launch(self._kernel[config], self._check)

    def __call__(self, *args, **kwargs):
        self._check()
        return self._kernel(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._kernel, name)


def _guarded(fn, check_now):
    def guarded(*args, **kwargs):
        check_now()
        return fn(*args, **kwargs)

    for a in ("__name__", "__qualname__", "__doc__", "__module__"):
        with contextlib.suppress(AttributeError, TypeError):
            setattr(guarded, a, getattr(fn, a))
    with contextlib.suppress(TypeError, ValueError):
        guarded.__signature__ = inspect.signature(fn)
    guarded.__dict__.update({k: v for k, v in vars(fn).items() if k != "__wrapped__"})
    return guarded


def _wrap_answer_functions(refuse) -> None:
    import convlab

    convlab.setup()
    for m in pkgutil.walk_packages(convlab.__path__, "convlab."):
        if not m.name.startswith(_ANSWER_MODULES):
            continue
        with contextlib.suppress(Exception):
            importlib.import_module(m.name)
    wrapped: dict = {}
    answer_mods = [mod for name, mod in sorted(sys.modules.items())
                   if mod is not None and name.startswith(_ANSWER_MODULES)]
    for mod in answer_mods:
        allowed = set(getattr(mod, "GRADING_ALLOWED", ()))
        wrap_all = mod.__name__.startswith(_WRAP_ALL_MODULES)
        for name, obj in list(vars(mod).items()):
            if (name.startswith("_") or _HELPER_NAMES.match(name) or name in allowed
                    or id(obj) in wrapped):
                continue
            what = f"{mod.__name__}.{name}"
            if _is_kernel(obj):
                wrapped[id(obj)] = _KernelProxy(obj, refuse(what))
            elif (isinstance(obj, types.FunctionType) and obj.__module__ == mod.__name__
                  and (wrap_all or getattr(obj, "device", False) is True
                       or _ANSWER_NAMES.match(name))):
                wrapped[id(obj)] = _guarded(obj, refuse(what))
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith("convlab") or name.startswith("convlab.grading"):
            continue
        for attr, obj in list(vars(mod).items()):
            if id(obj) in wrapped:
                setattr(mod, attr, wrapped[id(obj)])
            elif isinstance(obj, dict) and not attr.startswith("__"):
                for k, v in list(obj.items()):
                    if id(v) in wrapped:
                        obj[k] = wrapped[id(v)]


def install(cfg: dict):
    """Set up the rails in this (grading) kernel; return the guard for graded calls.

    cfg: ``deny_read`` and ``deny_write`` (paths), ``allow_write`` (folders inside a denied
    one that stay writable: the learner's scratch folder). The guard is a context manager factory:
    ``with guard():`` marks "the learner's function is running".
    """
    if _installed:
        raise RuntimeError("the grading sandbox is already installed")
    norm = os.path.realpath
    deny_read = tuple(norm(p) for p in cfg.get("deny_read", []))
    deny_write = tuple(norm(p) for p in cfg.get("deny_write", []))
    # the learner's own scratch folder stays writable when a denied folder holds it
    allow_write = tuple(norm(p) for p in cfg.get("allow_write", []))
    sep = os.sep
    state = {"active": 0}
    local = threading.local()

    def refuse(what):
        def check_now():
            if state["active"]:
                raise NotAllowedInAnswer(
                    f"{what} is not allowed inside an answer: the task asks for your own "
                    "implementation (the package's reference and kernels are the solution)")
        return check_now

    _wrap_answer_functions(refuse)

    @contextlib.contextmanager
    def guard():
        state["active"] += 1
        try:
            yield
        finally:
            state["active"] = max(0, state["active"] - 1)

    import numpy

    import convlab

    trusted = tuple({os.path.realpath(p) + sep for p in (
        sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.__file__),
        os.path.dirname(os.path.dirname(convlab.__file__)) + sep + "convlab",
        os.path.dirname(numpy.__file__))} | {os.path.realpath(p) + sep for p in sys.path
                                              if "site-packages" in p})

    def learner_initiated() -> bool:
        f = sys._getframe(2)  # 0: this function, 1: the hook, 2: the audited code
        while f is not None:
            fn = f.f_code.co_filename
            if fn.endswith(_HELPER_FILES) or f.f_code in hook_codes:
                f = f.f_back
                continue
            return not fn.startswith(trusted)
        return False

    def path_of(p):
        if isinstance(p, int):
            return None
        try:
            return norm(os.fsdecode(p))
        except (TypeError, ValueError):
            return None

    def under(path, roots) -> bool:
        return any(path == r or path.startswith(r + sep) for r in roots)

    def hook(event, args):
        if getattr(local, "busy", False):
            return
        local.busy = True
        try:
            if event == "open":
                path = path_of(args[0])
                if path is None:
                    return
                mode, flags = args[1], args[2] if len(args) > 2 else 0
                writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT
                                                        | os.O_TRUNC | os.O_APPEND))
                if writing and (os.path.basename(path) == "results.json"
                                or (under(path, deny_write) and not under(path, allow_write))):
                    raise NotAllowedInAnswer(f"writing {path} is not allowed while grading")
                if under(path, deny_read):
                    raise NotAllowedInAnswer(f"reading {path} is not allowed while grading")
            elif event in ("os.remove", "os.rename", "os.rmdir", "shutil.rmtree", "os.truncate",
                           "os.chmod", "os.link", "os.symlink"):
                for a in args[:2]:
                    path = path_of(a)
                    if path and ((under(path, deny_write) and not under(path, allow_write))
                                 or under(path, deny_read)):
                        raise NotAllowedInAnswer(f"{event} on {path} is not allowed while "
                                                 "grading")
            elif event in _SPAWN_EVENTS:
                if learner_initiated():  # convlab.doctor() may run nvidia-smi; answers may not
                    raise NotAllowedInAnswer(f"{event}: starting processes is not allowed in an "
                                             "answer while grading")
            elif event == "os.kill":
                if args[0] != os.getpid():
                    raise NotAllowedInAnswer("signalling other processes is not allowed while "
                                             "grading")
        finally:
            local.busy = False

    hook_codes = frozenset({hook.__code__, learner_initiated.__code__})
    sys.addaudithook(hook)
    _installed["yes"] = True
    return guard
