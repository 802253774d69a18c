"""convlab.runtime: mode choice before numba, the NumPy 2.5 shim, doctor, PTX compilation."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from numba import cuda  # (conftest has chosen the mode)

import convlab
from convlab import runtime


def py(code: str, **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", "CONVLAB_MODE")}
    e.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=e, timeout=300)


def test_import_convlab_does_not_import_numba():
    r = py("import sys, convlab; import convlab.reference, convlab.check, convlab.problems; "
           "print('numba' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_setup_sim_sets_the_variable_before_numba():
    r = py("""
        import os, convlab
        assert convlab.setup('sim') == 'sim'
        assert os.environ['NUMBA_ENABLE_CUDASIM'] == '1'
        from numba import config
        print(config.ENABLE_CUDASIM)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() in ("1", "True")


def test_switching_after_numba_import_raises_clearly():
    r = py("""
        import convlab
        convlab.setup('sim')
        import numba.cuda
        try:
            convlab.setup('gpu')
        except RuntimeError as e:
            print(e)
    """)
    assert "Restart the kernel" in r.stdout, r.stdout + r.stderr


def test_mode_from_environment():
    r = py("import convlab; print(convlab.setup())", CONVLAB_MODE="sim")
    assert r.stdout.strip() == "sim"
    with pytest.raises(ValueError, match="mode must be one of"):
        runtime.setup("tpu")


def test_hosted_platform_detection(monkeypatch):
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    if not os.path.isdir("/kaggle/working"):
        assert runtime.hosted_platform() == "local"
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    assert runtime.hosted_platform() == "kaggle"
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-x")
    assert runtime.hosted_platform() == "colab"


# NumPy 2.5 removed np.row_stack; numba-cuda 0.30.4 then fails on every kernel. Simulate
# NumPy 2.5 by deleting the alias, and show the failure and the fix. Needs NVVM (the
# nvidia-cuda-nvcc wheel), not a GPU.
COMPILE = """
    import numpy as np
    if hasattr(np, "row_stack"):
        del np.row_stack  # what NumPy 2.5 did
    {setup}
    from numba import cuda, float32
    from convlab.kernels.conv02_coalesced import KERNEL as k, SIGNATURE
    ptx, _ = cuda.compile_ptx(k.py_func, SIGNATURE, cc=(9, 0))
    assert ".target sm_90" in ptx and "ld.global" in ptx
    print("compiled", len(ptx))
"""


def test_numpy25_breaks_numba_cuda_without_the_shim():
    r = py("""
        import numpy as np
        if hasattr(np, "row_stack"):
            del np.row_stack  # what NumPy 2.5 did; no convlab, so no shim
        from numba import cuda, float32
        def k(x):
            x[0] = float32(1.0)
        cuda.compile_ptx(k, "(float32[:],)", cc=(9, 0))
    """)
    assert r.returncode != 0 and "row_stack" in r.stderr, r.stdout + r.stderr[-2000:]


def test_setup_shims_numpy25_and_kernels_compile_to_ptx():
    r = py(COMPILE.format(setup="import convlab; convlab.setup('gpu')"), CONVLAB_MODE="gpu")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("compiled")


def test_doctor_reports_simulator_and_no_problems():
    r = subprocess.run([sys.executable, "-m", "convlab", "doctor", "--sim"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Numba CUDA simulator" in r.stdout
    assert "ran correctly in the simulator" in r.stdout
    assert "verdict: OK" in r.stdout


def test_doctor_reports_problems_with_fixes(monkeypatch):
    monkeypatch.setenv("CUPY_TF32", "1")
    rep = runtime.diagnose()
    texts = [str(p) for p in rep.problems]
    assert any("CUPY_TF32" in t and "fix:" in t for t in texts)


def test_doctor_flags_numpy_25(monkeypatch):
    monkeypatch.setattr(runtime, "_version", lambda d: "2.5.2" if d == "numpy" else
                        {"numba": "0.68.1", "numba-cuda": "0.30.4"}.get(d))
    rep = runtime.diagnose()
    assert any("row_stack" in p.what for p in rep.problems)


def test_version_is_the_one_in_pyproject():
    from pathlib import Path

    import tomllib

    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert convlab.__version__ == meta["project"]["version"]


def test_simulator_shared_arrays_are_allocated_once_per_block_under_a_lock(monkeypatch):
    from convlab.runtime import is_simulator

    if not is_simulator():
        pytest.skip("the simulator's allocator")
    import threading
    import time

    import numpy as np
    from numba.cuda.simulator import kernelapi

    assert getattr(kernelapi.FakeCUDAShared.array, "_convlab_locked", False)
    real_empty = np.empty

    def slow_empty(*a, **k):  # widen the window between the look-up and the store
        time.sleep(0.02)
        return real_empty(*a, **k)

    monkeypatch.setattr(np, "empty", slow_empty)
    shared = kernelapi.FakeCUDAShared(0)
    got = []

    def thread():
        got.append(shared.array((4,), np.float32))  # one call site: one array per block

    threads = [threading.Thread(target=thread) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 12 and all(a is got[0] for a in got)
    other = shared.array((4,), np.float32)  # another line: another array
    assert other is not got[0]


def _simulator_only():
    if not runtime.is_simulator():
        pytest.skip("the simulator's block scheduling")


def test_simulator_runs_a_blocks_threads_one_at_a_time_between_barriers():
    """A read-modify-write that sleeps between the read and the write loses updates when
    threads run at once; handed on only at barriers and exits, none is lost."""
    _simulator_only()
    @cuda.jit
    def count(cnt, seen):
        t = cuda.threadIdx.x
        for r in range(3):
            v = cnt[0]
            time.sleep(0.0005)  # lets the GIL go (the simulator runs Python)
            cnt[0] = v + 1
            cuda.syncthreads()
            seen[r, t] = cnt[0]  # everyone's increments of this round are in
            cuda.syncthreads()

    n = 24
    cnt, seen = np.zeros(1, np.int64), np.full((3, n), -1, np.int64)
    count[1, n](cnt, seen)
    assert cnt[0] == 3 * n
    assert (seen == (np.arange(1, 4) * n)[:, None]).all()


def test_simulator_block_with_an_early_return_and_syncthreads_count():
    _simulator_only()
    @cuda.jit
    def kernel(out, counts):
        t = cuda.threadIdx.x + cuda.blockDim.x * cuda.threadIdx.y
        if t >= 37:
            return  # threads past the data: the others' barriers must still open
        counts[t] = cuda.syncthreads_count(t % 3 == 0)
        out[t] = t * 2

    out, counts = np.full(48, -1, np.int64), np.full(48, -1, np.int64)
    kernel[1, (16, 3)](out, counts)
    assert (out[:37] == np.arange(37) * 2).all() and (out[37:] == -1).all()
    assert (counts[:37] == len(range(0, 37, 3))).all()


def test_simulator_reports_the_thread_that_raised_and_stops_the_block():
    _simulator_only()
    @cuda.jit
    def kernel(a):
        t = cuda.threadIdx.x
        cuda.syncthreads()
        if t == 5:
            a[100] = 1.0  # out of bounds
        cuda.syncthreads()
        a[t] = t

    a = np.zeros(8, np.float32)
    with pytest.raises(IndexError, match=r"tid=\[5, 0, 0\] ctaid=\[0, 0, 0\]"):
        kernel[2, 8](a)
    assert not a.any()  # nobody went past the second barrier, and block 1 never ran


def test_simulator_runs_a_block_without_barriers_on_one_os_thread():
    """Each thread object is started only when its turn comes; an exited thread's OS thread
    runs the next one (starting 128 OS threads per block was most of a small kernel's time)."""
    _simulator_only()

    @cuda.jit
    def kernel(ids, out):
        t = cuda.threadIdx.x + cuda.blockDim.x * cuda.blockIdx.x
        ids[t] = threading.get_ident()
        out[t] = cuda.threadIdx.x

    ids, out = np.zeros(96, np.uint64), np.full(96, -1, np.int64)
    kernel[3, 32](ids, out)
    assert (out == np.tile(np.arange(32), 3)).all()
    assert all(len(set(ids[b * 32:(b + 1) * 32])) == 1 for b in range(3))


def test_simulator_turn_order_changes_between_launches_so_a_race_moves():
    """Without a barrier between the write and the read, what a thread reads depends on
    which threads ran before it: on a GPU, and in the simulator's order, drawn anew for
    every launch (the checkers' second run relies on it when the tracer cannot run)."""
    _simulator_only()

    @cuda.jit
    def racy(out):
        tile = cuda.shared.array(64, np.int64)
        t = cuda.threadIdx.x
        tile[t] = t + 1
        out[t] = tile[(t + 1) % 64]  # missing cuda.syncthreads() before the read

    runs = []
    for _ in range(2):
        out = np.zeros(64, np.int64)
        racy[1, 64](out)
        runs.append(out)
    assert not np.array_equal(runs[0], runs[1])


def test_simulator_scalar_casts_take_the_short_path_and_cast_as_numba_does():
    _simulator_only()
    from numba import boolean, float32, float64, int32, uint8
    from numba.core.types import abstract

    fast = abstract.Type.__call__
    assert getattr(fast, "_convlab_fast", False)
    assert "simulator: scalar casts without numba's detour" in runtime._state["fixes"]
    original = fast.original  # numba's own
    values = [1.5, -2.75, 3, True, np.float32(0.1), np.float64(1e40), np.int64(-7),
              np.uint8(250), np.float16(0.333)]

    def outcome(f, *args):  # (type of the result or of the error, the result)
        try:
            with np.errstate(all="ignore"):
                r = f(*args)
        except Exception as e:  # noqa: BLE001  (an out-of-range int raises on both paths)
            return type(e), None
        return type(r), r

    for ty in (float32, float64, int32, uint8, boolean):
        for v in values:
            got, want = outcome(ty, v), outcome(original, ty, v)
            assert got[0] is want[0] and (got[1] == want[1] or np.isnan(got[1]) and
                                          np.isnan(want[1])), (ty, v, got, want)
    sig = float32(float32[:], int32)  # a signature still goes to numba's own __call__
    assert sig.return_type == float32 and sig.args == (float32[:], int32)
