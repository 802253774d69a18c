"""The launchers' per-shape plans (depthwise, filter, conv top), under the simulator: a new
shape gets a new plan, a repeat reuses it, and new values in the same buffers (weights,
taps, inputs) are always used; the CUDA C depthwise launchers' shared plan cache
(`planned_conv`); the call-time measurement's dry run."""

import numpy as np
import pytest

import convlab
from convlab import check
from convlab import reference as ref

convlab.setup()
from numba import cuda  # noqa: E402

from convlab.kernels import _blocking  # noqa: E402
from convlab.kernels import conv08_implicit_gemm_tuned as c8  # noqa: E402
from convlab.kernels import depthwise01_direct as dw  # noqa: E402
from convlab.kernels import depthwise02_smem as dws  # noqa: E402
from convlab.kernels import filter02_tiled as f2  # noqa: E402
from convlab.kernels._launch import Unsupported, configured  # noqa: E402

DEPTHWISE = [pytest.param(dw, id="direct"), pytest.param(dws, id="smem")]


def _close(got, exp):
    assert np.isfinite(got).all(), "NaN left in the output: an element was not written"
    scale = float(np.abs(exp).max())
    np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-5 * scale)


def _depthwise_case(shape, stride, padding, seed):
    rng = np.random.default_rng(seed)
    x = check.random_array(shape, rng)
    w = check.random_array((shape[1], 1, 3, 3), rng)
    return x, w, dict(stride=stride, padding=padding)


def _depthwise_ref(x, w, kw):
    return ref.conv2d(x.astype(np.float64), w.astype(np.float64), groups=x.shape[1], **kw)


def _new_keys(cache, before):
    return [k for k in cache if k not in before]


@pytest.mark.parametrize("mod", DEPTHWISE)
def test_depthwise_plans_one_per_shape_and_reuses_it(mod):
    mod._PLANS.clear()
    # the first two share one compiled kernel (only N differs) with different grids
    cases = [_depthwise_case((3, 8, 7, 9), 1, 1, 1), _depthwise_case((1, 8, 7, 9), 1, 1, 2),
             _depthwise_case((2, 2, 9, 6), 2, 1, 3)]
    keys, plans = [], []
    for x, w, kw in cases:  # three shapes: three plans
        before = dict(mod._PLANS)
        out = cuda.to_device(check.poisoned(_depthwise_ref(x, w, kw).shape))
        mod.launch(cuda.to_device(x), cuda.to_device(w), out, kw["stride"], kw["padding"])
        _close(out.copy_to_host(), _depthwise_ref(x, w, kw))
        (k,) = _new_keys(mod._PLANS, before)
        keys.append(k)
        plans.append(mod._PLANS[k])
    assert len(set(keys)) == 3
    for i in (0, 1, 0, 2):  # interleaved repeats: the same plans, each with its own grid
        x, w, kw = cases[i]
        before = dict(mod._PLANS)
        out = cuda.to_device(check.poisoned(_depthwise_ref(x, w, kw).shape))
        mod.launch(cuda.to_device(x), cuda.to_device(w), out, kw["stride"], kw["padding"])
        _close(out.copy_to_host(), _depthwise_ref(x, w, kw))
        assert not _new_keys(mod._PLANS, before)
        assert mod._PLANS[keys[i]] is plans[i]


@pytest.mark.parametrize("mod", DEPTHWISE)
def test_depthwise_reads_new_weights_and_inputs_in_the_same_buffers(mod):
    x, w, kw = _depthwise_case((1, 5, 6, 11), 1, 1, 3)
    w_bad = w.copy()
    w_bad[2, 0, 1, 1] = np.nan  # channel 2 of the first call's output is NaN
    dx, dwt = cuda.to_device(x), cuda.to_device(w_bad)
    out = cuda.to_device(check.poisoned(_depthwise_ref(x, w, kw).shape))
    launcher = mod.conv2d_depthwise if mod is dw else mod.conv2d_depthwise_smem
    launcher(dx, dwt, out, **kw)
    first = out.copy_to_host()
    assert np.isnan(first[0, 2]).any() and np.isfinite(first[0, [0, 1, 3, 4]]).all()
    rng = np.random.default_rng(4)
    for _ in range(2):  # new values written into the same device arrays
        x2 = check.random_array(x.shape, rng)
        w2 = check.random_array(w.shape, rng)
        dx.copy_to_device(x2)
        dwt.copy_to_device(w2)
        out.copy_to_device(check.poisoned(out.shape))
        launcher(dx, dwt, out, **kw)
        _close(out.copy_to_host(), _depthwise_ref(x2, w2, kw))


@pytest.mark.parametrize("mod", DEPTHWISE)
def test_depthwise_cached_shape_still_refuses_bad_arguments(mod):
    x, w, kw = _depthwise_case((1, 3, 5, 7), 1, 1, 5)
    dx, dwt = cuda.to_device(x), cuda.to_device(w)
    out = cuda.to_device(check.poisoned((1, 3, 5, 7)))
    mod.launch(dx, dwt, out, **kw)  # planned
    with pytest.raises(TypeError, match="out must be float32"):
        mod.launch(dx, dwt, cuda.to_device(np.zeros((1, 3, 5, 7))), **kw)
    with pytest.raises(ValueError, match="out has shape"):
        mod.launch(dx, dwt, cuda.to_device(check.poisoned((1, 3, 5, 6))), **kw)
    with pytest.raises(TypeError, match="x must be a device array"):
        mod.launch(None, dwt, out, **kw)
    with pytest.raises(Unsupported, match="dilation"):
        mod.launch(dx, dwt, out, stride=1, padding=2, dilation=2)


def test_configured_launch_keeps_each_grid_under_the_simulator():
    @cuda.jit
    def fill(a, v):
        i = cuda.grid(1)
        if i < a.size:
            a[i] = v

    small, large = cuda.to_device(np.zeros(8, np.float32)), cuda.to_device(np.zeros(40,
                                                                                     np.float32))
    run_large, run_small = configured(fill, 5, 8), configured(fill, 1, 8)
    run_large(large, np.float32(2.0))
    run_small(small, np.float32(1.0))
    run_large(large, np.float32(3.0))  # all 5 blocks, not the 1 block configured last
    assert (large.copy_to_host() == 3.0).all() and (small.copy_to_host() == 1.0).all()


TILE = dict(tx=8, ty=2, v=2)  # 16 threads per block: quick under the simulator


def test_filter_plans_per_shape_and_filter_values():
    f2._PLANS.clear()
    rng = np.random.default_rng(6)
    taps = check.random_array((3, 3), rng)
    images = [check.random_array((13, 19), rng), check.random_array((6, 23), rng)]
    outs = [cuda.to_device(check.poisoned(im.shape)) for im in images]
    dims = [cuda.to_device(im) for im in images]
    for i in (0, 1, 0, 1):
        outs[i].copy_to_device(check.poisoned(images[i].shape))
        f2.launch(dims[i], taps, outs[i], **TILE)
        _close(outs[i].copy_to_host(), ref.filter2d(images[i], taps))
    assert len(f2._PLANS) == 2  # one per image shape, reused
    taps[1, 1] = np.nan  # changed in place: the compiled values must follow
    f2.launch(dims[0], taps, outs[0], **TILE)
    assert np.isnan(outs[0].copy_to_host()).any() and len(f2._PLANS) == 3
    taps[:] = check.random_array((3, 3), rng)
    outs[0].copy_to_device(check.poisoned(images[0].shape))
    f2.launch(dims[0], taps, outs[0], **TILE)
    _close(outs[0].copy_to_host(), ref.filter2d(images[0], taps))


def test_filter_reads_new_device_taps_in_the_same_buffer():
    rng = np.random.default_rng(7)
    image = check.random_array((9, 12), rng)
    dimg, out = cuda.to_device(image), cuda.to_device(check.poisoned(image.shape))
    dtaps = cuda.to_device(check.random_array((5, 3), rng))
    for _ in range(2):
        taps = check.random_array((5, 3), rng)
        dtaps.copy_to_device(taps)
        out.copy_to_device(check.poisoned(image.shape))
        f2.launch(dimg, dtaps, out, **TILE)
        _close(out.copy_to_host(), ref.filter2d(image, taps))
    with pytest.raises(TypeError, match="out must be float32"):
        f2.launch(dimg, dtaps, cuda.to_device(np.zeros(image.shape)), **TILE)


def _conv_case(xs, ws, stride, padding, seed):
    rng = np.random.default_rng(seed)
    return (check.random_array(xs, rng), check.random_array(ws, rng),
            dict(stride=stride, padding=padding))


def _conv_ref(x, w, kw):
    return ref.conv2d(x.astype(np.float64), w.astype(np.float64), **kw)


def test_conv_top_new_weights_and_a_second_shape():
    conv = c8.conv2d_implicit_gemm_tuned
    cases = [_conv_case((1, 3, 5, 6), (4, 3, 3, 3), 1, 1, 8),
             _conv_case((2, 5, 5, 4), (3, 5, 3, 3), 2, 1, 9)]
    dev = [(cuda.to_device(x), cuda.to_device(w),
            cuda.to_device(check.poisoned(_conv_ref(x, w, kw).shape))) for x, w, kw in cases]
    rng = np.random.default_rng(10)
    _blocking._PLANS.clear()
    for i in (0, 1, 0):
        x, w, kw = cases[i]
        dx, dwt, out = dev[i]
        w_new = check.random_array(w.shape, rng)  # new filters, same buffer
        dwt.copy_to_device(w_new)
        out.copy_to_device(check.poisoned(out.shape))
        conv(dx, dwt, out, **kw)
        _close(out.copy_to_host(), _conv_ref(x, w_new, kw))
    assert len(_blocking._PLANS) == 2  # one plan per shape, reused
    w_bad = cases[0][1].copy()
    w_bad[1, 0, 0, 0] = np.nan  # filter 1's outputs turn NaN, the others stay right
    dx, dwt, out = dev[0]
    dwt.copy_to_device(w_bad)
    conv(dx, dwt, out, **cases[0][2])
    got = out.copy_to_host()
    assert np.isnan(got[:, 1]).any()
    exp = _conv_ref(cases[0][0], cases[0][1], cases[0][2])
    _close(got[:, [0, 2, 3]], exp[:, [0, 2, 3]])


# ---------------------------------------------------------------------------------------
# The measurement (dry: simulator, fake clock) and the race table's call_ms column


def test_call_time_dry_run_stores_every_case_with_its_bare_launch(tmp_path):
    import json

    from convlab import measure

    measure.lesson("call_time", dry=True, out=tmp_path)
    data = json.loads((tmp_path / "call_time.json").read_text())
    assert not data["errors"]
    sec = data["sections"]["call_time"]
    assert "failed" not in sec
    names = [(r["case"].split(" (sim")[0], r["name"].split(" 32x")[0]) for r in sec["rows"]]
    assert ("depthwise 512ch 14x14", "depthwise_smem") in names
    assert ("depthwise 32ch 112x112", "depthwise_smem") in names
    assert ("128ch 28x28", "implicit_gemm_tuned") in names
    assert any(n.startswith("filter2d_tiled (NumPy") for _, n in names)
    for r in sec["rows"]:
        assert r["call_us"] > 0 and r["max_rel_err"] is not None
        if r["kind"] == "course" and "device taps" not in r["name"]:
            assert r["call_vs_bare"] == pytest.approx(r["call_us"] / r["bare_call_us"])
    assert sec["depthwise_smem_call_vs_bare_max"] is not None


def test_race_tables_show_call_ms_and_read_rows_stored_without_it():
    from convlab import bench, ladder

    old = dict(name="old", kind="course", ms=0.5, spread=0.01, tflops=1.0, gbps=2.0,
               max_rel_err=1e-7, pct_of_baseline=None)  # a row stored before call_ms
    lad = bench.Ladder("p", 10**9, 10**6, None,
                       rows=[bench.Row(**old), bench.Row(**{**old, "name": "new"},
                                                         call_ms=0.0371)])
    text = lad.table()
    assert "call ms" in text.splitlines()[1] and "0.0371" in text
    assert text.splitlines()[2].split()[2] == "-"
    stored = dict(problem="p", flops=10**9, rows=[dict(old, pct_roofline=None),
                                                  dict(old, name="new", call_ms=0.0371)])
    t2 = ladder.ladder_table(stored)
    assert "call ms" in t2 and "0.0371" in t2 and t2.splitlines()[2].split()[2] == "-"


class _DeviceArray:
    """Shape, dtype and a device address: all `planned_conv` reads of an array."""

    def __init__(self, shape, address):
        self.shape, self.dtype = shape, np.dtype(np.float32)
        self.__cuda_array_interface__ = {"data": (address, False)}


def test_planned_conv_plans_once_per_shape_arguments_tiling_and_alignment(monkeypatch):
    from convlab import runtime
    from convlab.kernels._launch import planned_conv

    monkeypatch.setattr(runtime, "is_simulator", lambda: False)  # a GPU: alignment counts
    calls = []

    def plan(x, w, out, stride, padding, **cfg):
        calls.append((x.shape, stride, padding, cfg))
        return object()

    cache = {}
    x, w, y = (_DeviceArray(s, 4096) for s in ((2, 3, 8, 8), (3, 1, 3, 3), (2, 3, 8, 8)))
    first = planned_conv(cache, plan, x, w, y, (1, 1), dict(v=4))
    assert planned_conv(cache, plan, x, w, y, (1, 1), dict(v=4)) is first and len(calls) == 1
    planned_conv(cache, plan, x, w, y, (1, 1), dict(v=8))          # another tiling
    planned_conv(cache, plan, _DeviceArray(x.shape, 4100), w, y, (1, 1), dict(v=4))  # 4 bytes off
    planned_conv(cache, plan, x, w, y, (2, 1), dict(v=4))          # another stride
    assert len(calls) == 4 and len(cache) == 4
    planned_conv(cache, plan, x, w, y, (1, [1, 1]), dict(v=4))     # unhashable: planned, not kept
    planned_conv(cache, plan, x, w, y, (1, [1, 1]), dict(v=4))
    assert len(calls) == 6 and len(cache) == 4


def test_planned_conv_under_the_simulator_keeps_plans_of_arrays_without_addresses(monkeypatch):
    from convlab import runtime
    from convlab.kernels._launch import planned_conv

    class _SimArray:  # the simulator's arrays have a shape and a dtype, no device address
        def __init__(self, shape):
            self.shape, self.dtype = shape, np.dtype(np.float32)

    monkeypatch.setattr(runtime, "is_simulator", lambda: True)
    cache, calls = {}, []

    def plan(x, w, out, stride, padding):
        calls.append((x.shape, stride, padding))
        return object()

    x, w, y = (_SimArray(s) for s in ((2, 3, 8, 8), (3, 1, 3, 3), (2, 3, 8, 8)))
    first = planned_conv(cache, plan, x, w, y, (1, 1), {})
    assert planned_conv(cache, plan, x, w, y, (1, 1), {}) is first
    assert len(calls) == 1 and len(cache) == 1
