"""convlab.cpu: the Numba CPU convolutions of lesson 03 and their helpers."""

import numpy as np
import pytest

from convlab import check, cpu
from convlab import reference as ref
from convlab.kernels import Unsupported

GENERAL = [cpu.conv2d_loops, cpu.conv2d_prange, cpu.conv2d_reordered]


@pytest.mark.parametrize("fn", GENERAL, ids=lambda f: f.__name__)
def test_general_versions_pass_the_checker_with_stride_padding_dilation(fn):
    check.check_conv2d(fn, dilation=True, seed=1, quiet=True)


BLOCKED = [cpu.conv2d_blocked, cpu.conv2d_blocked_flat]


@pytest.mark.parametrize("fn", BLOCKED, ids=lambda f: f.__name__)
def test_blocked_passes_the_checker_on_what_it_supports(fn):
    check.check_conv2d(fn, stride=False, seed=2, quiet=True)


@pytest.mark.parametrize("fn", BLOCKED, ids=lambda f: f.__name__)
@pytest.mark.parametrize("K", [1, 3, 5, 8, 9])
@pytest.mark.parametrize("rows", [1, 3, 7, 100])
def test_blocked_filter_tail_and_row_tiles(fn, K, rows):
    rng = np.random.default_rng(K * 100 + rows)
    x = check.random_array((2, 3, 11, 13), rng)
    w = check.random_array((K, 3, 5, 3), rng)  # 5 rows, 3 wide: any R works
    y = fn(x, w, padding=(2, 1), rows=rows)
    expect = ref.conv2d(x.astype(np.float64), w.astype(np.float64), padding=(2, 1))
    assert y.shape == expect.shape and y.dtype == np.float32
    assert np.allclose(y, expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw,w_shape", [
    (dict(stride=2), (4, 3, 3, 3)),
    (dict(dilation=2), (4, 3, 3, 3)),
    (dict(), (4, 3, 3, 5)),      # 5 wide
    (dict(groups=3), (3, 1, 3, 3)),
])
@pytest.mark.parametrize("fn", BLOCKED, ids=lambda f: f.__name__)
def test_blocked_refuses_what_it_does_not_support(fn, kw, w_shape):
    x = np.ones((1, 3, 9, 9), np.float32)
    with pytest.raises(Unsupported):
        fn(x, np.ones(w_shape, np.float32), **kw)


@pytest.mark.parametrize("fn", GENERAL, ids=lambda f: f.__name__)
def test_general_versions_refuse_groups(fn):
    with pytest.raises(Unsupported):
        fn(np.ones((1, 4, 6, 6), np.float32), np.ones((4, 2, 3, 3), np.float32), groups=2)


def test_versions_reject_non_arrays():
    with pytest.raises(TypeError):
        cpu.conv2d_reordered([[1.0]], np.ones((1, 1, 1, 1), np.float32))


def test_variants_are_in_lesson_order_and_agree():
    rng = np.random.default_rng(3)
    x, w = check.random_array((2, 4, 10, 12), rng), check.random_array((6, 4, 3, 3), rng)
    outs = [fn(x, w, padding=1) for fn in cpu.VARIANTS.values()]
    assert list(cpu.VARIANTS.values())[0] is cpu.conv2d_loops
    for y in outs[1:]:
        assert np.allclose(y, outs[0], rtol=1e-5, atol=1e-5)


def test_thread_sweep_times_each_count_and_restores_the_setting():
    before = cpu.threads()
    calls = []
    pts = cpu.thread_sweep(lambda: calls.append(cpu.threads()), counts=[1, cpu.max_threads()],
                           repeat=2)
    assert [t for t, _ in pts] == [1, cpu.max_threads()]
    assert all(ms >= 0 for _, ms in pts)
    assert 1 in calls and cpu.max_threads() in calls  # the count really changed
    assert cpu.threads() == before


def test_sweep_counts():
    assert cpu.sweep_counts(16) == [1, 2, 4, 8, 16]
    assert cpu.sweep_counts(6) == [1, 2, 4, 6]
    assert cpu.sweep_counts(1) == [1]


def test_split_batch_computes_each_image_once_and_repeat_whole_repeats():
    rng = np.random.default_rng(4)
    x, w = check.random_array((5, 2, 8, 7), rng), check.random_array((3, 2, 3, 3), rng)
    seen = []

    def conv(xs, ws, **kw):
        seen.append(xs.shape[0])
        return cpu.conv2d_loops(xs, ws, **kw)

    one = cpu.conv2d_loops(x, w, padding=1)
    good = cpu.split_batch(conv, x, w, workers=3, padding=1)
    assert np.array_equal(good, one) and sum(seen) == x.shape[0] and len(seen) == 3
    seen.clear()
    bad = cpu.repeat_whole(conv, x, w, workers=4, padding=1)
    assert bad.shape == (4 * x.shape[0],) + one.shape[1:] and sum(seen) == 4 * x.shape[0]
    assert all(np.array_equal(bad[i * 5:(i + 1) * 5], one) for i in range(4))


def test_time_interleaved_and_time_scaled():
    order = []
    t = cpu.time_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                             rounds=3, warmup=1, settle=1)
    assert set(t) == {"a", "b"} and all(len(v.samples_ms) == 3 for v in t.values())
    assert order[:2] == ["a", "b"] and order[2:6] == ["a", "a", "b", "b"]  # interleaved
    x, w = np.ones((4, 1, 5, 5), np.float32), np.ones((6, 1, 3, 3), np.float32)
    shapes = []
    est, tim, factor = cpu.time_scaled(lambda a, b: shapes.append((a.shape, b.shape)), x, w,
                                       images=2, filters=3)
    assert factor == pytest.approx(4)
    assert shapes == [((2, 1, 5, 5), (3, 1, 3, 3))]
    assert est == pytest.approx(tim.median_ms * 4)


def test_cores_follow_the_affinity_mask_and_fall_back_to_the_cpu_count(monkeypatch):
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    assert cpu.cores() == 3  # the cores this process may use, not the machine's
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # macOS, Windows
    monkeypatch.setattr(os, "cpu_count", lambda: 7)
    assert cpu.cores() == 7
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert cpu.cores() == 1
    import numba

    assert cpu.max_threads() == numba.config.NUMBA_NUM_THREADS
