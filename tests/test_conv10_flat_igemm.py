"""The one-launch implicit GEMM in pure Numba (convlab/kernels/conv10_flat_igemm.py).

Under the simulator: every tile and both modes on shapes that are multiples of no tile
(several filter tiles, partial last tiles and slabs, several split parts, a 1x1 with
stride 2, a padded and a dilated 3x3, a 7x7/2 stem with 3 channels), outputs poisoned
with NaN, against float64; the split-K result is the float32 sum of the workspace slices
in the fixed order 0, 1, ..., Z-1 (not the reverse), the same bit for bit on a second run,
with the counters back at zero; the tile rule is `flat_igemm_cuda.choose`'s; the sweep
summary counts the kernel as pure Numba. On a GPU (marked gpu): ResNet-50 shapes at
batch 1 and odd shapes with every tile, against float64, reproducible run to run.
"""

from __future__ import annotations

import numpy as np
import pytest

from convlab import check, ladder
from convlab import reference as ref
from convlab.kernels import Unsupported
from convlab.kernels import conv10_flat_igemm as M
from convlab.kernels import flat_igemm_cuda as F
from convlab.runtime import cuda, is_simulator

# (tile or None for `choose`, x shape, w shape, conv kwargs): small enough for the simulator
CASES = [
    (None, (2, 37, 5, 5), (40, 37, 1, 1), {}),  # 1x1 rows: 2 x 2 tiles, P Q odd, 3 slabs
    (F.Tile(32, 64, 2), (1, 20, 9, 9), (33, 20, 1, 1), dict(stride=2)),  # 1x1 /2, 2 parts
    (None, (1, 13, 6, 6), (20, 13, 3, 3), dict(padding=1)),  # 3x3: choose splits in 2
    (None, (1, 3, 9, 11), (8, 3, 7, 7), dict(stride=2, padding=3)),  # stem-like, 2 parts
    (F.Tile(64, 64), (1, 20, 5, 6), (70, 20, 1, 1), dict(padding=1)),  # gathered 1x1
]
IDS = ["1x1", "1x1-stride2-split", "3x3-split", "stem", "64x64-padded-1x1"]
SPLIT3 = (F.Tile(32, 32, 3), (1, 5, 6, 5), (12, 5, 3, 3), dict(padding=2, dilation=2))


def _run(fn, x, w, kw):
    """fn on device copies of x, w and a NaN-poisoned output; the output on the host."""
    c = cuda()
    p = ref.conv_params(x.shape, w.shape, **kw)
    out = c.to_device(check.poisoned(p.out_shape))
    fn(c.to_device(x), c.to_device(w), out, **kw)
    c.synchronize()
    return out.copy_to_host()


def _assert_matches_float64(out, x, w, kw):
    case = check.reference_case(x, w, **kw)
    comp = check.compare(out, case["expected"], case["absref"], case["reduction"])
    assert comp.ok, comp.summary()


def _data(xs, wsh, seed=7):
    rng = np.random.default_rng(seed)
    return check.random_array(xs, rng), check.random_array(wsh, rng)


@pytest.mark.parametrize("tile, xs, wsh, kw", CASES, ids=IDS)
def test_matches_float64(tile, xs, wsh, kw):
    x, w = _data(xs, wsh)
    fn = M.make_launcher(tile)
    out = _run(fn, x, w, kw)
    _assert_matches_float64(out, x, w, kw)
    (plan,) = fn.plans.values()
    p = ref.conv_params(xs, wsh, **kw)
    assert plan["tile"] == (tile or F.choose(p, ks=1)) and plan["mode"] == F.mode_of(p)
    if plan["parts"] > 1:
        assert not plan["counters"].copy_to_host().any()


def test_cases_reach_every_path():
    plans = [M.plan_args(ref.conv_params(xs, wsh, **kw), t or F.choose(
        ref.conv_params(xs, wsh, **kw))) for t, xs, wsh, kw in [*CASES, SPLIT3]]
    assert {a["mode"] for a in plans} == {0, 1}
    assert {a["parts"] for a in plans} >= {1, 2, 3}
    assert all(a["grid"][0] * a["grid"][1] > 1 for a in plans[:2])  # several tiles
    assert (F.choose(ref.conv_params((1, 13, 6, 6), (20, 13, 3, 3), padding=1), ks=1)
            == F.Tile(32, 32, 2))  # the rule itself splits the few-block 3x3


def test_split_is_the_fixed_order_sum_of_its_parts():
    tile, xs, wsh, kw = SPLIT3
    x, w = _data(xs, wsh, seed=11)
    fn = M.make_launcher(tile)
    first = _run(fn, x, w, kw)
    _assert_matches_float64(first, x, w, kw)
    (plan,) = fn.plans.values()
    assert plan["parts"] == 3
    parts = plan["ws"].copy_to_host().reshape(3, *first.shape)
    assert np.array_equal(first, (parts[0] + parts[1]) + parts[2])  # float32, order 0, 1, 2
    assert not np.array_equal(first, (parts[2] + parts[1]) + parts[0])  # the order shows
    assert not plan["counters"].copy_to_host().any()  # reset for the next launch
    again = _run(fn, x, w, kw)  # same plan, workspace and counters
    assert np.array_equal(first, again)


def test_passes_the_course_checker():
    tile, xs, wsh, kw = SPLIT3
    check.check_conv2d_case(M.make_launcher(tile), xs, wsh, quiet=True, seed=3, **kw)


def test_refusals():
    x = np.zeros((1, 4, 5, 5), np.float32)
    with pytest.raises(Unsupported, match="groups"):
        M.conv2d_flat_igemm(x, np.zeros((4, 2, 1, 1), np.float32), np.zeros((1, 4, 5, 5),
                                                                              np.float32),
                            groups=2)
    with pytest.raises(ValueError, match="expected"):
        M.conv2d_flat_igemm(x, np.zeros((4, 4, 3, 3), np.float32),
                            np.zeros((1, 4, 5, 5), np.float32))
    with pytest.raises(ValueError, match="no kernel for tile"):
        M.make_kernel(128, 64)
    with pytest.raises(ValueError, match="no kernel for tile"):
        M.plan_args(ref.conv_params((1, 8, 5, 5), (4, 8, 1, 1)), F.Tile(32, 32, 0))


def test_counted_as_pure_numba_by_the_sweep_summary():
    row = dict(layer="1x1 64->256 56x56", batch=1, ms={}, errors={},
               pct_cudnn={"cuDNN fp32": 100.0, "implicit_gemm_tuned": 40.0, "flat_igemm": 90.0,
                          "flat_igemm_cuda": 120.0})
    g = ladder.sweep_summary(dict(rows=[row]))["batch 1 1x1"]
    assert g["best_numba"]["min"] == 90.0 and g["best"]["min"] == 120.0
    assert ("flat_igemm" in ladder.beside_kernels()) == (not is_simulator())


GPU_SHAPES = [
    ((1, 1024, 14, 14), (2048, 1024, 1, 1), dict(stride=2)),  # ResNet-50, batch 1
    ((1, 2048, 7, 7), (512, 2048, 1, 1), {}),
    ((1, 3, 224, 224), (64, 3, 7, 7), dict(stride=2, padding=3)),
    ((1, 512, 7, 7), (512, 512, 3, 3), dict(padding=1)),
    ((1, 64, 56, 56), (64, 64, 3, 3), dict(padding=1)),
    ((3, 37, 11, 13), (70, 37, 3, 3), dict(padding=2, dilation=2)),
    ((2, 67, 33, 41), (93, 67, 1, 1), {}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("xs, wsh, kw", GPU_SHAPES)
def test_on_gpu_every_tile_reproducible(xs, wsh, kw):
    x, w = _data(xs, wsh, seed=5)
    for fn in (M.conv2d_flat_igemm, M.make_launcher(F.Tile(32, 32, 3)),
               M.make_launcher(F.Tile(32, 64)), M.make_launcher(F.Tile(64, 64, 2))):
        first = _run(fn, x, w, kw)
        _assert_matches_float64(first, x, w, kw)
        assert np.array_equal(first, _run(fn, x, w, kw))  # split or not, bit for bit
        for plan in fn.plans.values():
            assert not plan["counters"].copy_to_host().any()
