"""Guard rails inside the grading kernel (imported only by the kernel the grader starts).

The grader's first cell calls `install(config_path)` before any learner code runs. It

1. imports the modules the checkers depend on and **snapshots** them: every attribute of
   ``convlab.*`` (not ``convlab.grading``), ``numpy``, ``numpy.testing``, ``numpy.linalg``,
   ``math``, ``numba.cuda`` and ``builtins``, the functions' code objects, and the
   IPython hooks that decide whether a cell failed;
2. wraps the functions that *compute an answer* (``convlab.reference`` convolutions,
   ``convlab.kernels`` launchers and kernels, ``convlab.baselines``) so that they raise
   `NotAllowedInAnswer` while the learner's function runs inside a checker (helpers such
   as ``conv2d_output_shape`` or ``ceil_div`` stay allowed);
3. registers a guard in ``convlab.check.ANSWER_GUARDS`` that marks "learner code is
   running" and, when the learner's function returns, verifies and restores the snapshot;
4. adds an **audit hook** (which Python cannot remove) that refuses, from then on:
   writing any file named ``results.json`` or under the grader's folders, reading the
   solutions / instructor / private-test folders, learner code starting processes or
   tracing (``sys.settrace``), killing other processes, ``gc.get_objects``/``get_referrers``,
   replacing the code of protected functions or the attributes of protected classes,
   and - while the learner's function runs - reaching the checker's stack frames
   (``sys._getframe``, ``tb_frame``, ``gi_frame``...);
5. restores the snapshot (and the instructor's variables) whenever the grader compiles
   a test cell, and fails that test with `TamperingError` when anything had changed.

The grader marks its own cells with a first line ``# convlab-grader SEQ KIND ARG MAC``
(an HMAC with a secret that only the audit hook holds, in sequence), so learner code
cannot replay or forge them. See the README ("Exercises and grading") for what this
does not stop: code in the same process can always, with enough effort, subvert it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import importlib
import inspect
import json
import os
import pkgutil
import re
import sys
import threading
import types

MARK = "# convlab-grader "
# What an answer may not call while it is being checked. In convlab.reference,
# convlab.baselines and convlab.precision: every public function except helpers. In
# convlab.kernels and convlab.cpu: kernels, launchers (``@launcher``) and functions named
# like an answer or a kernel factory. A module can allow more names with
# ``GRADING_ALLOWED = ("name", ...)``.
_HELPER_NAMES = re.compile(
    r"^(pair|conv_params|ConvParams|pad_nchw|.*_shape|.*_shapes|.*_flops|.*_bytes|.*_count|"
    r"arithmetic_intensity|ceil_div|launcher|.*_launch_params|.*_report|.*_available|"
    r".*_grid|set_.*|as_numpy|Unsupported)$")
_WRAP_ALL_MODULES = ("convlab.reference", "convlab.baselines", "convlab.precision")
_ANSWER_MODULES = ("convlab.reference", "convlab.baselines", "convlab.kernels", "convlab.cpu",
                   "convlab.precision", "convlab.fft_conv", "convlab.winograd",
                   "convlab.pipeline")
_ANSWER_NAMES = re.compile(
    r"^(conv2d.*|filter2d.*|gemm.*|im2col.*|col2im.*|depthwise.*|separable.*|make_.*|"
    r"launch.*|.*_launch|launcher_for|prepare|transpose.*|nchw_to_nhwc|nhwc_to_nchw)$")
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
_SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.spawn",
                           "os.posix_spawn", "os.fork", "os.forkpty", "os.startfile",
                           "pty.spawn", "os.killpg"})
_INTROSPECTION = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents"})
_TRACING = frozenset({"sys.settrace", "sys.setprofile"})  # fine for convlab.trace, not answers
_FRAME_EVENTS = frozenset({"sys._getframe", "sys._current_frames"})
# Library code that only passes a request on: the frame that called it decides.
_HELPER_FILES = ("inspect.py", "traceback.py", "linecache.py", "logging", "warnings.py",
                 "contextlib.py", "functools.py", "threading.py", "subprocess.py", "os.py",
                 "pty.py", "shutil.py", "platform.py", "popen_fork.py", "popen_spawn_posix.py",
                 "context.py", "process.py", "pool.py", "thread.py", "base_events.py",
                 "unix_events.py")
_SHELL_METHODS = ("run_cell", "run_cell_async", "run_code", "run_ast_nodes", "transform_cell",
                  "showtraceback", "_showtraceback", "showsyntaxerror", "should_run_async",
                  "transform_ast", "ex", "ev", "safe_execfile")
_KERNEL_METHODS = ("do_execute", "execute_request", "dispatch_shell", "finish_metadata")


class TamperingError(ValueError):
    """The submission changed the checker, the grader or what the tests rely on."""


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


def install(config_path: str) -> None:
    """Set up the guard rails in this (grading) kernel. Once per process."""
    if _installed:
        raise RuntimeError("the grading sandbox is already installed")
    with open(config_path, encoding="utf-8") as f:
        cfg = json.load(f)
    os.unlink(config_path)
    secret = bytes.fromhex(cfg["secret"])
    ledger = cfg.get("ledger")
    norm = os.path.realpath
    deny_read = tuple(norm(p) for p in cfg.get("deny_read", []))
    deny_write = tuple(norm(p) for p in cfg.get("deny_write", []))
    sep = os.sep

    # 1. the modules the checkers rely on, imported before any learner code
    import numpy
    import numpy.linalg
    import numpy.testing

    import convlab
    import convlab.check as check

    convlab.setup()

    for m in pkgutil.walk_packages(convlab.__path__, "convlab."):
        if m.name.startswith(("convlab.grading", "convlab.__main__")):
            continue
        with contextlib.suppress(Exception):
            importlib.import_module(m.name)
    numba_cuda = None
    with contextlib.suppress(Exception):
        from numba import cuda as numba_cuda
    try:
        shell = get_ipython()  # noqa: F821  (inside IPython)
    except NameError:
        shell = None

    # 2. answer-giving functions refuse to run inside an answer
    state = {"active": 0, "restoring": False, "seq": 0, "pending": None, "last": None}
    local = threading.local()

    def refuse(what):
        def check_now():
            if state["active"]:
                raise NotAllowedInAnswer(
                    f"{what} is not allowed inside an answer: the task asks for your own "
                    "implementation (the package's reference and kernels are the solution)")
        return check_now

    wrapped: dict = {}
    answer_mods = [mod for name, mod in sorted(sys.modules.items())
                   if mod is not None and name.startswith(_ANSWER_MODULES)
                   and not name.startswith("convlab.grading")]
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

    # 3. the snapshot
    protected_names = sorted(n for n, m in sys.modules.items() if m is not None and (
        (n == "convlab" or n.startswith("convlab.")) and not n.startswith("convlab.grading")))
    protected_names += ["numpy", "numpy.testing", "numpy.linalg", "math", "builtins"]
    if numba_cuda is not None:
        protected_names.append("numba.cuda")
    modules = {n: sys.modules[n] for n in protected_names if n in sys.modules}
    snap = {}
    protected_ids = set()
    code_snap = {}
    for n, mod in modules.items():
        d = dict(vars(mod))
        if n == "builtins":
            d = {k: v for k, v in d.items() if not k.startswith("_")
                 and k not in ("exit", "quit", "get_ipython", "display", "input", "raw_input")}
        snap[n] = d
        for v in d.values():
            if isinstance(v, (types.FunctionType, type)) or _is_kernel(v):
                protected_ids.add(id(v))
            if isinstance(v, types.FunctionType):
                code_snap[id(v)] = (v, v.__code__, v.__defaults__, v.__kwdefaults__)
            elif isinstance(v, type) and getattr(v, "__module__", "").startswith(
                    ("convlab", "numpy")):
                for cv in vars(v).values():
                    if isinstance(cv, types.FunctionType):
                        code_snap[id(cv)] = (cv, cv.__code__, cv.__defaults__,
                                             cv.__kwdefaults__)
    extra_classes = []
    if numba_cuda is not None:
        with contextlib.suppress(Exception):
            extra_classes.append(type(numba_cuda.to_device(numpy.zeros(1, numpy.float32))))
    if shell is not None:
        extra_classes += [c for c in type(shell).__mro__ if c is not object]
        kernel = getattr(shell, "kernel", None)
        if kernel is not None:
            extra_classes += [c for c in type(kernel).__mro__ if c is not object]
    for c in extra_classes:
        protected_ids.add(id(c))
    guard_list = check.ANSWER_GUARDS
    guards_before = list(guard_list)  # other tools' hooks stay
    shell_snap = {}
    if shell is not None:
        shell_snap = {
            "user_ns": shell.user_ns,
            "methods": {m for m in _SHELL_METHODS if m in vars(shell)},
            "kernel": getattr(shell, "kernel", None),
            "kernel_methods": {m for m in _KERNEL_METHODS
                               if m in vars(getattr(shell, "kernel", None) or object())},
            "lists": {a: list(getattr(shell, a)) for a in (
                "input_transformers_cleanup", "input_transformers_post", "ast_transformers")
                if isinstance(getattr(shell, a, None), list)},
            "custom_exceptions": shell.custom_exceptions,
        }
    recorded: dict = {}  # instructor variable -> value after the instructor's cell
    sys_modules = sys.modules

    def restore() -> list[str]:
        """Put everything back as the snapshot has it; say what had changed."""
        changed = []
        state["restoring"] = True
        try:
            if sys.modules is not sys_modules:
                changed.append("sys.modules")
            for n, mod in modules.items():
                if sys_modules.get(n) is not mod:
                    sys_modules[n] = mod
                    changed.append(f"sys.modules[{n!r}]")
                d = vars(mod)
                for k, v in snap[n].items():
                    if d.get(k, _MISSING) is not v:
                        d[k] = v
                        changed.append(f"{n}.{k}")
            for f, code, defaults, kwdefaults in code_snap.values():
                if f.__code__ is not code:
                    f.__code__ = code
                    changed.append(f"{f.__module__}.{f.__qualname__}.__code__")
                if f.__defaults__ is not defaults or f.__kwdefaults__ is not kwdefaults:
                    f.__defaults__, f.__kwdefaults__ = defaults, kwdefaults
                    changed.append(f"{f.__module__}.{f.__qualname__} defaults")
            if convlab.check is not check:
                convlab.check = check
            if check.ANSWER_GUARDS is not guard_list or guard_list != [*guards_before,
                                                                         answer_guard]:
                guard_list[:] = [*guards_before, answer_guard]
                check.ANSWER_GUARDS = guard_list
                changed.append("convlab.check.ANSWER_GUARDS")
            if shell is not None:
                for m in _SHELL_METHODS:
                    if m in vars(shell) and m not in shell_snap["methods"]:
                        delattr(shell, m)
                        changed.append(f"IPython shell.{m}")
                kernel = shell_snap["kernel"]
                if getattr(shell, "kernel", None) is not kernel:
                    changed.append("IPython shell.kernel")
                    shell.kernel = kernel
                if kernel is not None:
                    for m in _KERNEL_METHODS:
                        if m in vars(kernel) and m not in shell_snap["kernel_methods"]:
                            delattr(kernel, m)
                            changed.append(f"ipykernel kernel.{m}")
                for a, items in shell_snap["lists"].items():
                    if getattr(shell, a) != items:
                        getattr(shell, a)[:] = items
                        changed.append(f"IPython shell.{a}")
                if shell.custom_exceptions != shell_snap["custom_exceptions"]:
                    shell.custom_exceptions = shell_snap["custom_exceptions"]
                    changed.append("IPython custom exception handler")
                if shell.user_ns is not shell_snap["user_ns"]:
                    changed.append("IPython user namespace")
        finally:
            state["restoring"] = False
            state["active"] = 0
        return changed

    def restore_namespace() -> tuple[list[str], list[str]]:
        """Put the instructor's variables back; return (tampering, notes)."""
        if shell is None:
            return [], []
        ns, bad, notes = shell_snap["user_ns"], [], []
        for k, v in recorded.items():
            if ns.get(k, _MISSING) is not v:
                ns[k] = v
                if callable(v) or isinstance(v, types.ModuleType):
                    bad.append(f"the instructor's {k!r}")
                else:
                    notes.append(k)
        return bad, notes

    @contextlib.contextmanager
    def answer_guard(fn):
        state["active"] += 1
        try:
            yield
        finally:
            state["active"] = max(0, state["active"] - 1)
            if not state["active"]:
                changed = restore()
                if changed:
                    raise check.CheckError(
                        "tampering detected while your function ran: it changed "
                        + ", ".join(changed[:6]) + (" ..." if len(changed) > 6 else "")
                        + " (restored; this test fails)")

    guard_list[:] = [*guards_before, answer_guard]
    protected_ids.update(id(f) for f in (answer_guard, restore, restore_namespace))

    # 4. marked grader cells (compile events) and the audit hook
    def mac(seq, kind, arg) -> str:
        return hmac.new(secret, f"{seq} {kind} {arg}".encode(), hashlib.sha256).hexdigest()[:20]

    def note(seq, kind, arg):
        """Tell the grader, outside the kernel's replies, that a marked cell was clean."""
        if ledger:
            line = f"{seq} {kind} {arg} ok"
            with open(ledger, "a", encoding="utf-8") as f:
                f.write(f"{line} {mac(-1, 'ledger', line)}\n")

    def on_marked(text: str):
        first = text.lstrip().split("\n", 1)[0]
        parts = first[len(MARK):].split()
        if len(parts) != 4:
            raise TamperingError("a malformed grader cell")
        seq, kind, arg, tag = parts
        if not (seq.isdigit() and int(seq) == state["seq"]
                and hmac.compare_digest(tag, mac(int(seq), kind, arg))):
            raise TamperingError("a forged or replayed grader cell")
        state["seq"] += 1
        if kind == "record":
            ns = shell_snap.get("user_ns", {})
            for name in arg.split(","):
                if name != "-" and name in ns:
                    recorded[name] = ns[name]
        elif kind == "test":
            state["pending"] = arg
            changed = restore()
            bad, notes = restore_namespace()
            if changed or bad:
                raise TamperingError(
                    "tampering detected before this test: the answer changed "
                    + ", ".join((changed + bad)[:6]) + (" ..." if len(changed + bad) > 6 else "")
                    + " (restored; this task scores 0)")
            if notes:
                print(f"(grader: restored the instructor's variables {', '.join(notes)})")
            note(seq, kind, arg)
        elif kind == "check":
            pending, state["pending"] = state["pending"], None
            changed = restore()
            if pending != arg:
                raise TamperingError("the test cell did not run through the grader")
            if changed:
                raise TamperingError("tampering detected during this test: something changed "
                                     + ", ".join(changed[:6]) + " (restored)")
            note(seq, kind, arg)

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
        if getattr(local, "busy", False) or state["restoring"]:
            return
        local.busy = True
        try:
            if event == "compile":
                src = args[0]
                if isinstance(src, bytes):
                    with contextlib.suppress(Exception):
                        src = src.decode("utf-8", "replace")
                if isinstance(src, str) and args[1] != "<>":
                    if src.lstrip().startswith(MARK):
                        on_marked(src)
            elif event == "open":
                path = path_of(args[0])
                if path is None:
                    return
                mode, flags = args[1], args[2] if len(args) > 2 else 0
                writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT
                                                        | os.O_TRUNC | os.O_APPEND))
                if writing and (os.path.basename(path) == "results.json"
                                or under(path, deny_write)):
                    raise NotAllowedInAnswer(f"writing {path} is not allowed while grading")
                if under(path, deny_read):
                    raise NotAllowedInAnswer(f"reading {path} is not allowed while grading")
            elif event in ("os.remove", "os.rename", "os.rmdir", "shutil.rmtree", "os.truncate",
                           "os.chmod", "os.link", "os.symlink"):
                for a in args[:2]:
                    path = path_of(a)
                    if path and (under(path, deny_write) or under(path, deny_read)):
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
            elif event in _INTROSPECTION:
                raise NotAllowedInAnswer(f"{event} is not allowed while grading")
            elif event in _TRACING:
                if learner_initiated():
                    raise NotAllowedInAnswer(f"{event} is not allowed in an answer while grading")
            elif event in ("object.__setattr__", "object.__delattr__"):
                if id(args[0]) in protected_ids:
                    raise NotAllowedInAnswer(
                        f"changing {getattr(args[0], '__qualname__', args[0])!s}.{args[1]} is "
                        "not allowed while grading")
            elif state["active"] and (event in _FRAME_EVENTS or (
                    event == "object.__getattr__" and args[1] in _FRAME_ATTRS)):
                if learner_initiated():
                    raise NotAllowedInAnswer(
                        "looking at the checker's stack frames is not allowed inside an answer")
        finally:
            local.busy = False

    hook_codes = frozenset({hook.__code__, learner_initiated.__code__})
    protected_ids.update(id(f) for f in (hook, on_marked, learner_initiated, mac, note,
                                          install))
    sys.addaudithook(hook)
    _installed["yes"] = True


class _Missing:
    pass


_MISSING = _Missing()


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
