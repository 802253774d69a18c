"""Winograd F(m, r): matrices derived from interpolation points, the 2-D F(2x2, 3x3)
convolution, its float32 accuracy (lesson 11)."""

from fractions import Fraction

import numpy as np
import pytest

from convlab import check, winograd
from convlab import reference as ref


def _exact_filter(mats, d, g):
    AT, G, BT = mats["AT"], mats["G"], mats["BT"]
    Gg = [sum(G[i][j] * g[j] for j in range(len(g))) for i in range(len(G))]
    Bd = [sum(BT[i][j] * d[j] for j in range(len(d))) for i in range(len(BT))]
    prod = [a * b for a, b in zip(Gg, Bd, strict=True)]
    return [sum(AT[i][j] * prod[j] for j in range(len(prod))) for i in range(len(AT))]


@pytest.mark.parametrize("m,r,points", [(2, 3, (0, 1, -1)), (4, 3, (0, 1, -1, 2, -2)),
                                        (3, 2, (0, 1, -1)), (2, 5, (0, 1, -1, 2, -2))])
def test_matrices_compute_the_correlation_exactly(m, r, points):
    mats = winograd.winograd_matrices(m, r, points)
    rng = np.random.default_rng(m * 10 + r)
    for _ in range(5):
        d = [Fraction(int(v)) for v in rng.integers(-9, 10, m + r - 1)]
        g = [Fraction(int(v)) for v in rng.integers(-9, 10, r)]
        want = [sum(g[k] * d[i + k] for k in range(r)) for i in range(m)]
        assert _exact_filter(mats, d, g) == want


def test_f23_is_lavins_up_to_signs():
    AT, G, BT = winograd.f23_matrices(np.float64)
    lavin_BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]])
    lavin_G = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]])
    assert np.array_equal(np.abs(BT), np.abs(lavin_BT))
    assert np.array_equal(np.abs(G), np.abs(lavin_G))
    assert set(np.unique(BT)) <= {-1.0, 0.0, 1.0}  # integer input transform: adds only
    assert winograd.multiplications(2) == (36, 16)


def test_bad_points_are_refused():
    with pytest.raises(ValueError):
        winograd.winograd_matrices(2, 3, (0, 1))  # too few
    with pytest.raises(ValueError):
        winograd.winograd_matrices(2, 3, (0, 1, 1))  # not distinct


@pytest.mark.parametrize("shape,K,padding,m", [((2, 3, 9, 8), 4, 1, 2), ((1, 2, 7, 10), 3, 0, 2),
                                              ((1, 3, 11, 6), 2, 2, 4), ((2, 1, 5, 5), 1, 1, 4)])
def test_conv2d_winograd_matches_direct(shape, K, padding, m):
    rng = np.random.default_rng(sum(shape) + K)
    x = check.random_array(shape, rng).astype(np.float64)
    w = check.random_array((K, shape[1], 3, 3), rng).astype(np.float64)
    got = winograd.conv2d_winograd(x, w, padding, m=m)
    exp = ref.conv2d(x, w, padding=padding)
    assert got.shape == exp.shape
    assert np.abs(got - exp).max() < 1e-12 * np.abs(exp).max() * 100


def test_float32_accuracy_within_the_stated_tolerance():
    # the lesson's statement: F(2x2,3x3) in float32 stays within 1e-5 of conv(|x|,|w|);
    # F(4x4) is several times less accurate than F(2x2)
    rng = np.random.default_rng(1)
    x = check.random_array((1, 16, 12, 12), rng)
    w = check.random_array((8, 16, 3, 3), rng)
    e2 = winograd.accuracy(x, w, m=2)
    e4 = winograd.accuracy(x, w, m=4)
    assert e2["winograd"]["max"] < 1e-5
    assert e4["winograd"]["max"] > 2 * e2["winograd"]["max"]


def test_non_3x3_is_refused():
    with pytest.raises(ValueError):
        winograd.conv2d_winograd(np.zeros((1, 1, 8, 8)), np.zeros((1, 1, 5, 5)))
