"""Helpers that lessons 07-09 and their exercises use: pictures (convlab.viz) and the
traced checkers (convlab.check: one chosen conv problem, global loads per output, bank
conflicts). Quick under the simulator: small launches only."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from convlab import check, viz  # noqa: E402
from convlab import reference as ref  # noqa: E402


def _texts(fig):
    return " ".join(t.get_text() for ax in fig.axes for t in ax.texts + [ax.title]
                    + ([fig._suptitle] if fig._suptitle else []))


# ---------------------------------------------------------------------------------------
# Pictures


def test_register_block_counts_loads_and_refuses_bad_threads():
    fig = viz.draw_register_block(BM=16, BN=16, BK=4, TM=4, TN=4, thread=(1, 2))
    assert "4 + 4 = 8 loads, 16 FMAs: 2.0 FMAs per load" in _texts(fig)
    fig = viz.draw_register_block(BM=32, BN=32, BK=4, TM=8, TN=8, thread=(0, 0), split=True)
    assert "two runs of 4" in _texts(fig) and "4.0 FMAs per load" in _texts(fig)
    with pytest.raises(ValueError):
        viz.draw_register_block(BM=16, BN=16, TM=4, TN=4, thread=(4, 0))


def test_occupancy_by_hand():
    # 143 registers -> 18 x 256 per warp = 4608; 65536 // 4608 = 14 warps: one 8-warp block
    assert viz.occupancy(143, 256) == dict(blocks=1, warps=8, occupancy=0.125,
                                           limited_by="registers")
    # 32 registers: the 64-warp limit binds, not the registers
    o = viz.occupancy(32, 128)
    assert o["warps"] == 64 and o["limited_by"] == "warps"
    assert viz.occupancy(128, 128)["warps"] == 16 and viz.occupancy(300, 128)["blocks"] == 0
    assert viz.occupancy(32, 128, smem_per_block=100 * 1024)["limited_by"] == "shared memory"
    assert viz.plot_occupancy([("a", 64), ("b", 200, 256)]).axes


def test_vector_reads_count_wavefronts():
    assert viz.vector_read_wavefronts(8, split=False) == 2
    assert viz.vector_read_wavefronts(8, split=True) == 1
    assert viz.vector_read_wavefronts(16, split=False) == 4
    assert "2 wavefronts" in _texts(viz.draw_vector_reads(8))


def test_implicit_gemm_slab_has_the_right_pixels():
    fig = viz.draw_implicit_gemm(C=2, H=4, W=4, tap=(1, 0), BK=2, BN=8)
    slab = [t.get_text() for t in fig.axes[2].texts]
    # tap (1, 0), pad 1: output (p, q) reads input (p, q - 1); column 0 is padding
    assert slab[:8] == ["0", "a0", "a1", "a2", "0", "a4", "a5", "a6"]
    with pytest.raises(ValueError):
        viz.draw_implicit_gemm(tap=(3, 0))


def test_double_buffering_timeline_is_shorter():
    # one buffer: 4 x (load 1 + FMAs 1) = 8; two: load 0, then 4 FMA steps = 5
    fig = viz.draw_double_buffering(load_us=1.0, compute_us=1.0, sync_us=0.0, n=4)
    assert "(1.60x shorter here)" in _texts(fig)
    assert "4 slabs in 8 time units" in _texts(fig) and "4 slabs in 5 time units" in _texts(fig)


# ---------------------------------------------------------------------------------------
# Checkers


def test_check_conv2d_case_passes_right_and_fails_wrong():
    def right(x, w, stride=1, padding=0, dilation=1):
        return ref.conv2d(x, w, stride=stride, padding=padding, dilation=dilation)

    def off_by_one_padding(x, w, stride=1, padding=0, dilation=1):
        return ref.conv2d(x, w, stride=stride, padding=0, dilation=dilation)[..., :-1, :-1] \
            if padding else right(x, w, stride, padding, dilation)

    assert "1 cases passed" in check.check_conv2d_case(right, (1, 3, 9, 7), (2, 3, 3, 3),
                                                       stride=2, padding=1, dilation=2,
                                                       quiet=True)
    with pytest.raises(check.CheckError):
        check.check_conv2d_case(off_by_one_padding, (1, 3, 9, 7), (2, 3, 3, 3), padding=1,
                                quiet=True)


@pytest.fixture(scope="module")
def small_conv():
    from convlab.runtime import cuda

    c = cuda()
    rng = np.random.default_rng(4)
    x = c.to_device(check.random_array((1, 4, 8, 8), rng))
    w = c.to_device(check.random_array((32, 4, 3, 3), rng))
    return x, w, c.device_array((1, 32, 8, 8), np.float32)


def test_check_loads_per_output_tells_register_blocking_from_naive(small_conv):
    from convlab import kernels

    x, w, out = small_conv
    # naive: every output loads C*R*S values of x and of w (fewer at the padded border)
    with pytest.raises(check.CheckError, match="global-memory loads per output"):
        check.check_loads_per_output(kernels.conv2d_naive, x, w, out, padding=1,
                                     max_per_output=20, quiet=True)
    line = check.check_loads_per_output(kernels.conv2d_register_blocked, x, w, out, padding=1,
                                        max_per_output=20, quiet=True)
    assert float(line.split(": ")[2].split()[0]) < 10  # 36 / 8 filters + the staged filters
    # of x alone, by the launcher's argument name: 36 taps / 8 filters per thread
    line = check.check_loads_per_output(kernels.conv2d_register_blocked, x, w, out, padding=1,
                                        array="x", max_per_output=4.5, quiet=True)
    assert 3.0 < float(line.split(": ")[2].split()[0]) <= 4.5
    with pytest.raises(check.CheckError, match="cannot find the array 'img'"):
        check.check_loads_per_output(kernels.conv2d_register_blocked, x, w, out, padding=1,
                                     array="img", max_per_output=4.5, quiet=True)
    # shared memory: conv04 reads its 8 filter values per tap from shared memory
    line = check.check_loads_per_output(kernels.conv2d_register_blocked, x, w, out, padding=1,
                                        space="shared", max_per_output=40, quiet=True)
    assert "shared-memory loads" in line
    # conv05 writes its rearranged filters to global memory: not only the output
    with pytest.raises(check.CheckError, match="writes 2 global arrays"):
        check.check_loads_per_output(kernels.conv2d_implicit_gemm, x, w, out, padding=1,
                                     max_per_output=20, quiet=True)


def test_check_bank_conflicts_tells_the_layouts_apart():
    from convlab.kernels import GEMM_LADDER
    from convlab.runtime import cuda

    c = cuda()
    rng = np.random.default_rng(5)
    a = c.to_device(check.random_array((64, 16), rng))
    b = c.to_device(check.random_array((16, 64), rng))
    out = c.device_array((64, 64), np.float32)
    with pytest.raises(check.CheckError, match="3.00-way"):  # As 2-way, Bs 4-way
        check.check_bank_conflicts(GEMM_LADDER["register_blocked"], a, b, out, quiet=True)
    assert "1.00-way" in check.check_bank_conflicts(GEMM_LADDER["double_buffered"], a, b, out,
                                                    quiet=True)


def test_simulator_shared_arrays_are_allocated_once_per_block_under_a_lock(monkeypatch):
    from convlab.runtime import is_simulator

    if not is_simulator():
        pytest.skip("the simulator's allocator")
    import threading
    import time

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
