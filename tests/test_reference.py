"""convlab.reference against SciPy (and PyTorch where installed), and its error messages."""

import numpy as np
import pytest
from scipy import signal

from convlab import reference as ref
from convlab.check import random_array


def scipy_conv2d(x, w, stride, padding, dilation, groups):
    """An independent conv2d: SciPy's correlate per (n, k, c), then stride by slicing."""
    (sh, sw), (ph, pw), (dh, dw) = (ref.pair(stride), ref.pair(padding), ref.pair(dilation))
    N, C, H, W = x.shape
    K, Cg, R, S = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    wd = np.zeros((K, Cg, dh * (R - 1) + 1, dw * (S - 1) + 1))
    wd[:, :, ::dh, ::dw] = w  # dilation = a filter with holes
    P, Q = ref.conv2d_output_shape((H, W), (R, S), stride, padding, dilation)
    Kg = K // groups
    y = np.zeros((N, K, P, Q))
    for n in range(N):
        for k in range(K):
            g = k // Kg
            acc = sum(signal.correlate(xp[n, g * Cg + c], wd[k, c], mode="valid")
                      for c in range(Cg))
            y[n, k] = acc[::sh, ::sw][:P, :Q]
    return y


def random_problem(rng):
    groups = int(rng.choice([1, 1, 2, 3]))
    Cg, Kg = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    R, S = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    stride = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    dilation = (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
    padding = (int(rng.integers(0, 3)), int(rng.integers(0, 3)))
    H = int(rng.integers(dilation[0] * (R - 1) + 1, 16))
    W = int(rng.integers(dilation[1] * (S - 1) + 1, 16))
    x = random_array((int(rng.integers(1, 3)), Cg * groups, H, W), rng)
    w = random_array((Kg * groups, Cg, R, S), rng)
    return x, w, dict(stride=stride, padding=padding, dilation=dilation, groups=groups)


@pytest.mark.parametrize("seed", range(12))
def test_conv2d_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    x, w, kw = random_problem(rng)
    expected = scipy_conv2d(x, w, **kw)
    np.testing.assert_allclose(ref.conv2d(x, w, **kw), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ref.conv2d_im2col(x, w, **kw), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("seed", range(3))
def test_naive_matches_vectorized(seed):
    rng = np.random.default_rng(100 + seed)
    x, w, kw = random_problem(rng)
    np.testing.assert_allclose(ref.conv2d_naive(x, w, **kw), ref.conv2d(x, w, **kw),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(6))
def test_conv2d_matches_torch(seed):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(200 + seed)
    x, w, kw = random_problem(rng)
    expected = torch.nn.functional.conv2d(torch.from_numpy(x).double(),
                                          torch.from_numpy(w).double(), **kw).numpy()
    np.testing.assert_allclose(ref.conv2d(x, w, **kw), expected, rtol=1e-5, atol=1e-5)


def test_im2col_layout_and_col2im_adjoint():
    rng = np.random.default_rng(1)
    x = random_array((2, 3, 7, 9), rng).astype(np.float64)
    kw = dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2))
    cols = ref.im2col(x, (3, 2), **kw)
    P, Q = ref.conv2d_output_shape((7, 9), (3, 2), **kw)
    assert cols.shape == (3 * 3 * 2, 2 * P * Q)
    # row (c, r, s), column (n, p, q): pick one entry by hand
    c, r, s, n, p, q = 1, 2, 1, 1, 2, 3
    h, col = p * 2 - 1 + r * 1, q * 1 - 2 + s * 2
    assert cols[(c * 3 + r) * 2 + s, (n * P + p) * Q + q] == x[n, c, h, col]
    # col2im is the adjoint of im2col: <im2col(x), Y> == <x, col2im(Y)>
    Y = rng.standard_normal(cols.shape)
    lhs = np.sum(cols * Y)
    rhs = np.sum(x * ref.col2im(Y, x.shape, (3, 2), **kw))
    assert np.isclose(lhs, rhs)


def test_depthwise_and_separable():
    rng = np.random.default_rng(2)
    x = random_array((2, 4, 9, 8), rng)
    wd, wp = random_array((4, 1, 3, 3), rng), random_array((6, 4, 1, 1), rng)
    y = ref.separable_conv2d(x, wd, wp, padding=1)
    per_channel = np.stack([ref.conv2d(x[:, c:c + 1], wd[c:c + 1], padding=1)[:, 0]
                            for c in range(4)], axis=1)
    np.testing.assert_allclose(y, np.einsum("kc,ncpq->nkpq", wp[:, :, 0, 0], per_channel),
                               rtol=1e-5, atol=1e-5)


def test_filter2d_same_size():
    rng = np.random.default_rng(3)
    img, k = random_array((10, 13), rng), random_array((3, 5), rng)
    np.testing.assert_allclose(ref.filter2d(img, k),
                               signal.correlate(img, k, mode="same"), rtol=1e-5, atol=1e-5)


def test_counts():
    x, w = (32, 128, 28, 28), (128, 128, 3, 3)
    assert ref.conv2d_flops(x, w, padding=1) == 2 * 32 * 128 * 28 * 28 * 128 * 9
    assert ref.conv2d_bytes(x, w, padding=1) == 4 * (2 * 32 * 128 * 28 * 28 + 128 * 128 * 9)
    assert ref.im2col_bytes(x, (3, 3), padding=1) == 4 * 128 * 9 * 32 * 28 * 28
    assert ref.conv2d_output_shape((224, 224), (7, 7), 2, 3) == (112, 112)
    assert ref.conv2d_params_count(64, 64, 3, 3, groups=64) == 64 * 9


@pytest.mark.parametrize("x_shape,w_shape,kw,match", [
    ((1, 3, 8, 8), (4, 2, 3, 3), {}, "input channels per group"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"padding": -1}, "padding must be >= 0"),
    ((1, 3, 8, 8), (4, 1, 3, 3), {"groups": 2}, "divisible by groups"),
    ((3, 8, 8), (4, 3, 3, 3), {}, "4-D NCHW"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"stride": 0}, "stride must be >= 1"),
    ((1, 3, 2, 2), (4, 3, 3, 3), {}, "does not fit"),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"stride": 1.5}, "int or a pair"),
])
def test_bad_arguments_raise_clear_errors(x_shape, w_shape, kw, match):
    x, w = np.ones(x_shape, np.float32), np.ones(w_shape, np.float32)
    with pytest.raises((ValueError, TypeError), match=match):
        ref.conv2d(x, w, **kw)


def test_integer_input_refused():
    with pytest.raises(TypeError, match="floating point"):
        ref.conv2d(np.ones((1, 1, 4, 4), np.int32), np.ones((1, 1, 3, 3), np.float32))
