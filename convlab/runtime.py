"""Where the course runs: a real CUDA GPU or the Numba CUDA simulator.

`setup()` must decide before numba is imported, because numba reads
``NUMBA_ENABLE_CUDASIM`` once, at import. That is why ``import convlab`` never
imports numba, and why every module that needs numba calls `setup()` first.

`doctor()` prints what this machine has and every known problem with its fix.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata as md
import os
import platform as _platform
import sys
from dataclasses import dataclass, field

MODES = ("gpu", "sim")
_state: dict = {"mode": None, "fixes": []}


@dataclass
class Problem:
    """One thing wrong with the environment, and how to fix it."""

    what: str
    fix: str
    fatal: bool = True

    def __str__(self) -> str:
        return f"{'PROBLEM' if self.fatal else 'note'}: {self.what}\n    fix: {self.fix}"


@dataclass
class Report:
    """What `doctor()` found: facts as (name, value) rows, and problems."""

    rows: list = field(default_factory=list)
    problems: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(p.fatal for p in self.problems)


# ----------------------------------------------------------------------------------------
# Detection that never imports numba


def hosted_platform() -> str:
    """'colab', 'kaggle' or 'local'."""
    if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ:
        return "colab"
    if "KAGGLE_KERNEL_RUN_TYPE" in os.environ or os.path.isdir("/kaggle/working"):
        return "kaggle"
    return "local"


def _libcuda():
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll", "libcuda.dylib"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def driver_info() -> dict:
    """Driver version and GPU count straight from libcuda (no numba, no toolkit).

    Returns ``{"driver": None}`` when there is no NVIDIA driver.
    """
    lib = _libcuda()
    if lib is None:
        return {"driver": None, "gpus": 0, "error": "libcuda not found (no NVIDIA driver)"}
    if lib.cuInit(0) != 0:
        return {"driver": None, "gpus": 0, "error": "cuInit failed (driver present, no usable GPU)"}
    version, count = ctypes.c_int(0), ctypes.c_int(0)
    lib.cuDriverGetVersion(ctypes.byref(version))
    lib.cuDeviceGetCount(ctypes.byref(count))
    v = version.value
    return {"driver": f"{v // 1000}.{(v % 1000) // 10}", "gpus": count.value, "error": None}


def gpu_available() -> bool:
    """True when a CUDA driver reports at least one GPU."""
    return driver_info()["gpus"] > 0


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _vtuple(v: str | None) -> tuple:
    out = []
    for part in (v or "0").split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


# ----------------------------------------------------------------------------------------
# Setup


def apply_compat_fixes() -> list[str]:
    """Patch known incompatibilities before numba-cuda compiles anything.

    NumPy 2.5 removed ``np.row_stack``; numba-cuda 0.30.4 registers an overload for it
    while compiling its first kernel and fails on every kernel. The alias is restored
    (it was ``np.vstack`` all along).
    """
    import numpy as np

    fixes = []
    try:
        np.row_stack  # noqa: B018
    except AttributeError:
        np.row_stack = np.vstack
        fixes.append("numpy>=2.5: restored np.row_stack = np.vstack for numba-cuda 0.30.x")
    for f in fixes:
        if f not in _state["fixes"]:
            _state["fixes"].append(f)
    return fixes


def setup(mode: str | None = None) -> str:
    """Choose the real GPU or the simulator, before numba is imported; return the mode.

    mode: 'gpu', 'sim' or None (auto: the ``CONVLAB_MODE`` variable, else
    ``NUMBA_ENABLE_CUDASIM``, else 'gpu' when a driver reports a GPU).
    Calling it again with the same answer is free; asking to switch after numba is
    imported raises, because numba cannot switch (restart the kernel).
    """
    if mode is None:
        mode = os.environ.get("CONVLAB_MODE") or None
    if mode is None and os.environ.get("NUMBA_ENABLE_CUDASIM") in ("0", "1"):
        mode = "sim" if os.environ["NUMBA_ENABLE_CUDASIM"] == "1" else None
    if mode is None:
        mode = _state["mode"] or ("gpu" if gpu_available() else "sim")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")

    if "numba" in sys.modules:
        current = _numba_mode()
        if current != mode:
            raise RuntimeError(
                f"numba is already imported in {current!r} mode, so convlab cannot switch to "
                f"{mode!r}. Restart the kernel and call convlab.setup({mode!r}) before "
                "anything imports numba."
            )
    elif mode == "sim":
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    if mode == "sim":
        _lock_simulator_shared_arrays()
        _fast_scalar_casts()
        if not _run_simulator_blocks_one_thread_at_a_time():
            # Another numba-cuda: its simulator may run a block's threads all at once and
            # poll them at syncthreads(); switching threads more often helps it (~1.3-3x).
            sys.setswitchinterval(min(sys.getswitchinterval(), 3e-4))
    else:
        os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
    _state["mode"] = mode
    apply_compat_fixes()
    return mode


def _lock_simulator_shared_arrays() -> None:
    """Make the simulator's ``cuda.shared.array`` allocation thread-safe.

    numba-cuda's simulator (0.30.x) creates a block's shared array when the first of its
    threads reaches the call, with an unlocked "look up, else create" on a dict keyed by
    (file, line). Two threads switched between the look-up and the store get two different
    arrays: each writes its half of the tile into its own, and the readers see
    uninitialized memory. Rare (once in a full CI run, a checker reported values of 1e23),
    but it fails a correct kernel; a lock around the look-up and the store removes it.
    """
    try:
        import threading

        from numba.cuda.simulator import kernelapi

        shared = kernelapi.FakeCUDAShared
        types, numpy_support = kernelapi.types, kernelapi.numpy_support  # as it uses them
    except Exception:  # noqa: BLE001  (another numba-cuda: leave it alone)
        return
    if getattr(shared.array, "_convlab_locked", False):
        return
    original = shared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if alignment is not None or shape == 0:  # refused, or dynamic shared memory
            return original(self, shape, dtype, alignment)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)  # the simulator's key
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                if isinstance(dtype, types.Type):
                    dtype = numpy_support.as_dtype(dtype)
                import numpy as np

                res = np.empty(shape, dtype)
                self._allocations[caller] = res
        return res

    array._convlab_locked = True
    shared.array = array
    if "simulator: shared arrays allocated under a lock" not in _state["fixes"]:
        _state["fixes"].append("simulator: shared arrays allocated under a lock")


def _fast_scalar_casts() -> None:
    """``float32(x)`` of a Python or NumPy number without numba's detour (simulator only).

    Under the simulator a kernel's ``float32(a * b)`` calls numba's ``Type.__call__``, which
    imports ``numba.core.typing`` and tests ``isinstance`` against an abstract class on
    every call before it casts: a quarter of a naive conv's time under the simulator and the
    tracer. A plain number goes straight to the same cast; anything else (a signature such
    as ``float32(float32[:])``) to numba's own ``__call__``.
    """
    try:
        import numpy as np
        from numba.core.types import abstract
    except Exception:  # noqa: BLE001  (another numba: leave it alone)
        return
    original = abstract.Type.__call__
    if getattr(original, "_convlab_fast", False):
        return
    plain = frozenset({int, float, bool, np.bool_, np.float16, np.float32, np.float64,
                       np.int8, np.int16, np.int32, np.int64,
                       np.uint8, np.uint16, np.uint32, np.uint64})

    def call(self, *args):
        if len(args) == 1 and type(args[0]) in plain:
            return self.cast_python_value(args[0])
        return original(self, *args)

    call._convlab_fast, call.original = True, original
    abstract.Type.__call__ = call
    if "simulator: scalar casts without numba's detour" not in _state["fixes"]:
        _state["fixes"].append("simulator: scalar casts without numba's detour")


def _run_simulator_blocks_one_thread_at_a_time() -> bool:
    """Run a simulated block's threads one at a time, handing on at each ``syncthreads``.

    numba-cuda's simulator (0.30.x) starts every thread of a block at once and has the
    launching thread poll them all in a loop to see which wait at the barrier: 128 threads
    and the poller queue for the GIL after every barrier, most of the time of a tiled kernel
    under the simulator. With `barrier.BlockBarrier`, a thread runs until it reaches a
    barrier and then hands the turn on; the last to arrive goes on. Same threads, same
    kernel code, same errors (the first thread that raised, with its tid and ctaid). The
    threads take turns in a random order, drawn anew for every block of every launch: a GPU
    orders nothing between barriers, and a racy kernel's result then moves between two runs
    (the checkers' second run), as the old manager's thread switches made it move by chance.
    """
    try:
        from numba.cuda.simulator import kernel as simkernel

        manager, thread = simkernel.BlockManager, simkernel.BlockThread
        original_thread_run = thread.run
        probe = manager(None, (1, 1, 1), (1, 1, 1), False)
        assert {"_f", "_block_dim", "_debug"} <= set(vars(probe))
        probe = thread(lambda: None, probe, (0, 0, 0), (0, 0, 0), False)
        assert {"_target", "thread_id", "threadIdx", "exception"} <= set(vars(probe))
    except Exception:  # noqa: BLE001  (another numba-cuda: leave it alone)
        return False
    if getattr(manager.run, "_convlab_serial", False):
        return True
    import numpy as np

    from .barrier import BarrierAbort, BlockBarrier

    order_rng = np.random.default_rng()  # not seeded: a race should move between runs

    def run_block(self, grid_point, *args):
        def target():
            self._f(*args)

        # every thread object is made here (the grader's host-read guard knows a kernel's
        # threads by the code that made them), started only when its turn comes
        threads = []
        for p in np.ndindex(*self._block_dim):  # (not a comprehension: its own frame)
            threads.append(thread(target, self, grid_point, p, self._debug))
        by_tid = sorted(threads, key=lambda t: t.thread_id)
        self._by_tid = by_tid
        order = order_rng.permutation(len(threads))  # a new order every launch: see above
        self._barrier = BlockBarrier(len(threads), start=lambda j: by_tid[j].start(),
                                     order=order)
        by_tid[order[0]].start()
        self._barrier.finished.wait()
        for t in threads:
            if t.ident is not None:
                t.join()
        if self._barrier.error is not None:  # the first thread that raised: (error, traceback)
            e, tb = self._barrier.error
            raise e.with_traceback(tb)

    def run_thread(self):
        manager = self._manager
        barrier = getattr(manager, "_barrier", None)
        if barrier is None:  # a thread started outside a launch
            return original_thread_run(self)
        target = self._target
        j = self.thread_id
        while j is not None:  # this OS thread runs CUDA thread j, then any it is handed
            me = manager._by_tid[j]
            self.threadIdx, self.thread_id, self.exception = me.threadIdx, j, None
            self._target, self._args, self._kwargs = target, (), {}
            try:
                barrier.enter(j)
                original_thread_run(self)  # stores an exception in self.exception
            except BarrierAbort:
                self.exception = None  # stopped because another thread raised
            finally:
                if self.exception is not None:
                    barrier.fail(self.exception)
                j = barrier.exit()

    def syncthreads(self):
        self._manager._barrier.sync()

    run_block._convlab_serial = True
    manager.run = run_block
    thread.run = run_thread
    thread.syncthreads = syncthreads
    if "simulator: a block's threads run one at a time" not in _state["fixes"]:
        _state["fixes"].append("simulator: a block's threads run one at a time")
    return True


def _numba_mode() -> str:
    from numba import config

    return "sim" if config.ENABLE_CUDASIM else "gpu"


def mode() -> str:
    """The current mode, running `setup()` with defaults if nobody has yet."""
    return _state["mode"] or setup()


def is_simulator() -> bool:
    return mode() == "sim"


def cuda():
    """``numba.cuda``, imported only after `setup()` has chosen the mode."""
    mode()
    from numba import cuda as _cuda

    return _cuda


# ----------------------------------------------------------------------------------------
# Doctor

_SMOKE_SRC = """
def _convlab_smoke(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = x[i] * float32(2.0) + float32(1.0)
"""


def _smoke_kernel():
    from numba import float32

    cuda_ = cuda()
    ns = {"cuda": cuda_, "float32": float32}
    exec(_SMOKE_SRC, ns)  # noqa: S102  (a fixed kernel, compiled fresh each time)
    return ns["_convlab_smoke"]


def compile_smoke(cc: tuple = (7, 5)) -> str:
    """Compile a tiny kernel to PTX for compute capability `cc`; needs NVVM, not a GPU.

    This is the check that catches a broken numba-cuda/NumPy pair: the simulator never
    compiles, so it cannot see one.
    """
    cuda_ = cuda()
    if is_simulator():
        raise RuntimeError("compile_smoke() needs the real CUDA target; run without the simulator")
    ptx, _ = cuda_.compile_ptx(_smoke_kernel(), "(float32[:], float32[:])", cc=cc)
    return ptx


def run_smoke() -> None:
    """Compile and run a tiny kernel on the current target and check its answer."""
    import numpy as np

    cuda_ = cuda()
    kernel = cuda_.jit(_smoke_kernel())
    x = np.arange(1000, dtype=np.float32)
    y = np.full_like(x, np.nan)
    kernel[4, 256](x, y)
    if not np.array_equal(y, 2 * x + 1):
        raise RuntimeError("smoke kernel returned a wrong answer")


# ----------------------------------------------------------------------------------------
# Known breakages of hosted runtimes (Colab, Kaggle): each check is a pure function of the
# versions and the driver, so it can be tested without those machines.

COURSE_DIST = "convlab-course"  # the distribution; the import name is convlab
_CUDA_WHEELS = ("cuda-bindings", "cuda-toolkit", "nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvcc",
                "nvidia-nvjitlink-cu12", "nvidia-nvjitlink", "cupy-cuda12x", "cupy-cuda13x")


def course_repository() -> str:
    """The course's repository URL from the installed metadata ('' when unknown)."""
    try:
        urls = md.metadata(COURSE_DIST).get_all("Project-URL") or []
    except md.PackageNotFoundError:
        return ""
    for entry in urls:
        name, _, url = entry.partition(",")
        if name.strip().lower() == "repository":
            return url.strip()
    return ""


def _install_hint() -> str:
    repo = course_repository()
    return (f'pip install --force-reinstall --no-deps "{COURSE_DIST} @ git+{repo}"' if repo
            else "reinstall this course (make lab, or pip install -e . in its checkout)")


def convlab_problems(summary_of_convlab_dist: str | None, other_packages=()) -> list:
    """A distribution named ``convlab`` (ConvLab-3, or this course under its old name), and
    other folders named convlab on sys.path that are not this course.

    summary_of_convlab_dist: the Summary of the installed ``convlab`` distribution, or None.
    """
    out = []
    s = summary_of_convlab_dist
    if s is not None and "convolution" in s.lower():
        out.append(Problem(
            "this course is also installed under its old distribution name 'convlab'",
            f"pip uninstall -y convlab, then {_install_hint()}", fatal=False))
    elif s is not None:
        out.append(Problem(
            "ConvLab-3 (a dialog-system toolkit; PyPI's 'convlab') is installed: it uses the "
            "import name convlab too, so its files and this course's share one folder and "
            "uninstalling either breaks the other",
            f"pip uninstall -y convlab, then {_install_hint()}"))
    for path in other_packages:
        out.append(Problem(
            f"another package named convlab is on the path ({path}): where it comes first "
            "(another folder, another kernel) `import convlab` is not this course",
            f"remove it, or pip uninstall -y convlab; this course is {COURSE_DIST}",
            fatal=False))
    return out


def _other_convlab_folders() -> list:
    """Folders named convlab on sys.path other than this package (ConvLab-3's, a copy)."""
    here = os.path.dirname(os.path.abspath(__file__))
    seen, out = {os.path.realpath(here)}, []
    for entry in sys.path:
        cand = os.path.join(entry or os.getcwd(), "convlab")
        if os.path.isfile(os.path.join(cand, "__init__.py")):
            real = os.path.realpath(cand)
            if real not in seen:
                seen.add(real)
                if not os.path.isfile(os.path.join(cand, "kernels", "conv01_naive.py")):
                    out.append(cand)
    return out


def version_problems(v: dict) -> list:
    """NumPy / numba / numba-cuda versions a hosted runtime preinstalls that do not fit.

    v: {distribution: version or None} for numpy, numba, numba-cuda.
    """
    out = []
    np_v, numba_v = _vtuple(v.get("numpy")), v.get("numba")
    if v.get("numpy") and np_v < (1, 24):
        out.append(Problem(f"NumPy {v['numpy']} is older than the course needs (1.24)",
                           'pip install "numpy>=1.24,<2.5", then restart the kernel'))
    if numba_v and _vtuple(numba_v) < (0, 60):
        out.append(Problem(
            f"numba {numba_v} is older than numba-cuda 0.30.4 needs (0.60)",
            'pip install "numba>=0.60" "numba-cuda==0.30.4", then restart the kernel'))
    return out


def stale_module_problems(loaded: dict, installed: dict) -> list:
    """Modules imported before pip changed them: the kernel runs the old version.

    loaded: {distribution: version imported in this process}; installed: on disk.
    """
    out = []
    for dist, old in loaded.items():
        new = installed.get(dist)
        if old and new and _vtuple(old) != _vtuple(new):
            out.append(Problem(
                f"{dist} {old} is imported in this kernel, but {new} is installed (pip changed "
                "it after the import)",
                "restart the kernel (Colab: Runtime > Restart session; Kaggle: Run > Restart "
                "& clear cell outputs), then run the notebook from the top"))
    return out


def _cuda_major(v: dict) -> int | None:
    """The CUDA major version of the installed CUDA wheels (12, 13), None without any."""
    majors = set()
    for dist in ("cuda-bindings", "cuda-toolkit"):
        if v.get(dist):
            majors.add(_vtuple(v[dist])[0])
    if v.get("cupy-cuda13x"):
        majors.add(13)
    if v.get("cupy-cuda12x"):
        majors.add(12)
    return max(majors) if majors else None


def driver_problems(driver: str | None, v: dict) -> list:
    """CUDA 12 vs 13: the driver's CUDA version against the installed CUDA wheels, and a
    toolkit newer than the driver without nvJitLink (CUDA_ERROR_UNSUPPORTED_PTX_VERSION).

    driver: "12.4" (what libcuda reports) or None; v: {distribution: version or None}.
    """
    if not driver:
        return []
    out = []
    drv = _vtuple(driver)[:2]
    cu12 = '"numba-cuda[cu12]==0.30.4" "cuda-bindings<13"'
    if drv[0] < 13 and v.get("cuda-bindings") and _vtuple(v["cuda-bindings"])[0] >= 13:
        out.append(Problem(
            f"the driver supports CUDA {driver}, but cuda-bindings {v['cuda-bindings']} is "
            "for CUDA 13: numba-cuda cannot talk to this driver",
            f"pip install {cu12}, then restart the kernel"))
    if drv[0] < 13 and v.get("cupy-cuda13x"):
        out.append(Problem(
            f"the driver supports CUDA {driver}, but CuPy is built for CUDA 13 (cupy-cuda13x)",
            "pip uninstall -y cupy-cuda13x && pip install cupy-cuda12x", fatal=False))
    nvvm = v.get("nvidia-cuda-nvcc-cu12") or v.get("nvidia-cuda-nvcc")
    jitlink = v.get("nvidia-nvjitlink-cu12") or v.get("nvidia-nvjitlink")
    if nvvm and _vtuple(nvvm)[:2] > drv and _vtuple(nvvm)[0] == drv[0] and not jitlink:
        out.append(Problem(
            f"NVVM {'.'.join(map(str, _vtuple(nvvm)[:2]))} writes PTX newer than the CUDA "
            f"{driver} driver loads (CUDA_ERROR_UNSUPPORTED_PTX_VERSION), and nvJitLink, "
            "which would link it for this driver, is missing",
            'pip install "numba-cuda[cu12]==0.30.4" (brings nvJitLink), then restart'))
    return out


def device_problems(cc: tuple, v: dict) -> list:
    """Compute capability: the Kaggle P100 (6.0) and T4 (7.5), and CUDA 13's 7.5 floor."""
    out = []
    name = f"{cc[0]}.{cc[1]}"
    if cc < (7, 5) and _cuda_major(v) == 13:
        out.append(Problem(
            f"compute capability {name} is not supported by CUDA 13 builds",
            'use CUDA 12 wheels: pip install "numba-cuda[cu12]==0.30.4" "cuda-bindings<13" '
            "cupy-cuda12x, then restart the kernel"))
    if cc < (5, 0):
        out.append(Problem(f"compute capability {name} is older than CUDA 12 supports (5.0)",
                           "use a newer GPU (Colab: T4/L4/A100; Kaggle: T4 or P100)"))
    elif cc < (7, 0):
        out.append(Problem(
            f"compute capability {name} (e.g. Kaggle's P100) has no tensor cores: lesson 12's "
            "tensor-core rows and the WMMA kernel are skipped; everything else runs",
            "for lesson 12 pick a T4 or newer (Kaggle: Accelerator > GPU T4 x2)", fatal=False))
    elif cc < (8, 0):
        out.append(Problem(
            f"compute capability {name} (e.g. the T4) has FP16 tensor cores but no BF16 or "
            "TF32 (those need 8.0): lesson 12 skips them",
            "for BF16/TF32 pick an L4 or A100 (Colab)", fatal=False))
    return out


def _loaded_versions() -> dict:
    out = {}
    for dist, mod in (("numpy", "numpy"), ("numba", "numba"), ("numba-cuda", "numba_cuda")):
        m = sys.modules.get(mod)
        v = getattr(m, "__version__", None) if m else None
        if isinstance(v, str):
            out[dist] = v
    return out


def hosted_problems(drv: dict) -> list:
    """Every check above, on this machine (doctor calls it)."""
    v = {d: _version(d) for d in ("numpy", "numba", "numba-cuda", *_CUDA_WHEELS)}
    try:
        summary = md.metadata("convlab").get("Summary", "") or ""
    except md.PackageNotFoundError:
        summary = None
    return (convlab_problems(summary, _other_convlab_folders()) + version_problems(v)
            + stale_module_problems(_loaded_versions(), v)
            + driver_problems(drv.get("driver"), v))


def diagnose() -> Report:
    """Collect the facts and problems `doctor()` prints."""
    rep = Report()
    rows, problems = rep.rows, rep.problems
    rows.append(("python", sys.version.split()[0]))
    rows.append(("platform", f"{_platform.platform()} ({hosted_platform()})"))

    np_v, numba_v, nbc_v = _version("numpy"), _version("numba"), _version("numba-cuda")
    for dist in ("numpy", "numba", "numba-cuda", "cupy-cuda12x", "cupy-cuda13x", "torch",
                 "scipy", "ipywidgets", "jupyterlab"):
        v = _version(dist)
        if v or dist in ("numpy", "numba", "numba-cuda"):
            rows.append((dist, v or "not installed"))

    if numba_v is None or nbc_v is None:
        problems.append(Problem("numba / numba-cuda is not installed",
                                'pip install "numba-cuda==0.30.4" (or: make lab)'))
    elif _vtuple(nbc_v)[:2] != (0, 30):
        problems.append(Problem(
            f"numba-cuda {nbc_v} is not the 0.30.x series the course is tested with",
            'pip install "numba-cuda==0.30.4"', fatal=False))
    if _vtuple(np_v) >= (2, 5):
        problems.append(Problem(
            f"NumPy {np_v} removed np.row_stack, which numba-cuda 0.30.4 needs to compile",
            "convlab.setup() restores the alias (applied in this process); for other code "
            'pin: pip install "numpy<2.5"', fatal=False))

    drv = driver_info()
    rows.append(("NVIDIA driver", drv["driver"] or f"none ({drv['error']})"))
    rows.append(("GPUs (driver)", str(drv["gpus"])))
    problems.extend(hosted_problems(drv))
    forced_sim = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" and _state["mode"] != "sim"
    if forced_sim and drv["gpus"] > 0:
        problems.append(Problem("NUMBA_ENABLE_CUDASIM=1 is set although a GPU is present",
                                "unset NUMBA_ENABLE_CUDASIM, or call convlab.setup('gpu')",
                                fatal=False))
    if os.environ.get("CUPY_TF32") not in (None, "", "0"):
        problems.append(Problem("CUPY_TF32 is set: CuPy float32 GEMMs use TF32 (less accurate)",
                                "unset CUPY_TF32 for fp32 baselines", fatal=False))
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        problems.append(Problem("ipywidgets is missing: the explorers show as text",
                                'pip install "ipywidgets>=8"', fatal=False))

    if numba_v is None or nbc_v is None:
        return rep
    try:
        current = mode()
    except RuntimeError as e:
        problems.append(Problem(str(e), "restart the kernel"))
        return rep
    rows.append(("mode", "Numba CUDA simulator (no timings)" if current == "sim" else "real GPU"))
    rows.extend(("compat fix", f) for f in _state["fixes"])
    try:
        cuda_ = cuda()
    except Exception as e:  # noqa: BLE001  (numba refuses this NumPy, a broken install)
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        problems.append(Problem(
            f"numba {numba_v} cannot be imported with NumPy {np_v}: {msg}",
            'pip install "numpy>=1.24,<2.5" "numba>=0.60" "numba-cuda==0.30.4", then restart '
            "the kernel"))
        return rep
    if "numba_cuda" not in (getattr(cuda_, "__file__", "") or ""):
        problems.append(Problem(
            "numba's own (deprecated) CUDA target is in use, not numba-cuda",
            'pip install "numba-cuda==0.30.4", then restart the kernel', fatal=False))
    if current == "gpu":
        try:
            dev = cuda_.get_current_device()
            cc = dev.compute_capability
            rows.append(("device", dev.name.decode() if isinstance(dev.name, bytes) else dev.name))
            rows.append(("compute capability", f"{cc[0]}.{cc[1]}"))
            rows.append(("multiprocessors", str(dev.MULTIPROCESSOR_COUNT)))
            free, total = cuda_.current_context().get_memory_info()
            rows.append(("GPU memory", f"{total / 2**30:.1f} GiB ({free / 2**30:.1f} free)"))
            rt = cuda_.runtime.get_version()
            rows.append(("CUDA runtime (numba)", f"{rt[0]}.{rt[1]}"))
            problems.extend(device_problems(tuple(cc), {d: _version(d) for d in _CUDA_WHEELS}))
        except Exception as e:  # noqa: BLE001  (doctor reports, never crashes)
            problems.append(Problem(
                f"cannot open the GPU: {e}",
                "check nvidia-smi; on Colab: Runtime > Change runtime type > GPU"))
            return rep
    try:
        run_smoke()
        rows.append(("smoke kernel", "compiled and ran correctly" if current == "gpu"
                     else "ran correctly in the simulator"))
    except Exception as e:  # noqa: BLE001
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        fix = 'pip install "numba-cuda[cu12]==0.30.4"  (nvJitLink handles a newer toolkit)'
        if "UNSUPPORTED_PTX_VERSION" in str(e):
            fix = ('the driver is older than the toolkit: pip install "numba-cuda[cu12]==0.30.4" '
                   "(brings nvJitLink), then restart")
        problems.append(Problem(
            f"a kernel failed to compile or run: {type(e).__name__}: {msg}", fix))
    return rep


SHORT_ROWS = ("platform", "mode", "device", "compute capability", "smoke kernel")


def doctor(file=None, short: bool = False) -> Report:
    """Print platform, driver, CUDA, compute capability, versions and problems with fixes.

    short=True prints only the platform, mode, device and smoke-kernel rows (the install
    cell's summary); problems and the verdict always.
    """
    file = file or sys.stdout
    rep = diagnose()
    rows = [(k, v) for k, v in rep.rows if k in SHORT_ROWS] if short else rep.rows
    width = max(len(k) for k, _ in rows) if rows else 0
    print("convlab doctor" + (" (short; convlab.doctor() shows everything)" if short else ""),
          file=file)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}", file=file)
    if rep.problems:
        print("", file=file)
        for p in rep.problems:
            print(str(p), file=file)
    print("\nverdict: " + ("OK" if rep.ok else "problems found (fixes above)"), file=file)
    return rep


def import_optional(name: str):
    """Import an optional package (cupy, torch) or return None."""
    try:
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001  (a broken optional install is as good as none)
        return None
