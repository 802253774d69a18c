"""FFT convolution (lesson 11): against the direct reference on the CPU, CuPy on a GPU."""

import numpy as np
import pytest

from convlab import check, fft_conv
from convlab import reference as ref


@pytest.mark.parametrize("xs,ws,padding", [((2, 3, 17, 12), (4, 3, 5, 5), 2),
                                           ((1, 2, 9, 14), (3, 2, 3, 3), 0),
                                           ((1, 1, 20, 21), (2, 1, 9, 9), 4),
                                           ((2, 2, 8, 7), (1, 2, 7, 7), 3)])
@pytest.mark.parametrize("xp", [np, "scipy"])
def test_conv2d_fft_matches_direct(xs, ws, padding, xp):
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x, w = check.random_array(xs, rng), check.random_array(ws, rng)
    exp = ref.conv2d(x.astype(np.float64), w.astype(np.float64), padding=padding)
    absref = ref.conv2d(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64),
                        padding=padding)
    got = fft_conv.conv2d_fft(x, w, padding, xp=xp)
    assert got.dtype == np.float32
    comp = check.compare(got, exp, absref, rtol=1e-5)
    assert comp.ok, comp.summary()


def test_filter2d_fft_and_sizes():
    rng = np.random.default_rng(2)
    img, k = check.random_array((33, 40), rng), check.random_array((9, 9), rng)
    got = fft_conv.filter2d_fft(img.astype(np.float64), k.astype(np.float64))
    assert np.abs(got - ref.filter2d(img.astype(np.float64), k.astype(np.float64))).max() < 1e-10
    Fh, Fw = fft_conv.fft_size(97, 61, 4)
    assert Fh >= 105 and Fw >= 69
    # the docstring's model by hand: 64 + 2 pads to 66, a fast size rounds it up to 72;
    # three real FFTs (x, w, y) of 72 x 72 and 72 x 37 complex multiply-adds
    F = 72 * 72
    assert fft_conv.fft_flops((1, 1, 64, 64), 3) == pytest.approx(
        3 * 2.5 * F * np.log2(F) + 8 * 72 * 37)
    # the cost does not grow with the filter at a fixed padded size, and grows with filters
    assert fft_conv.fft_flops((1, 1, 64, 64), 3, padding=4) == fft_conv.fft_flops(
        (1, 1, 64, 64), 9, padding=4)
    assert fft_conv.fft_flops((1, 1, 64, 64), 3, K=2) > fft_conv.fft_flops((1, 1, 64, 64), 3)
    assert fft_conv.direct_flops((1, 1, 64, 64), 9) == 2 * 64 * 64 * 81


def test_crossover_size():
    rows = [dict(R=r, direct_ms=d, fft_ms=f) for r, d, f in
            [(3, 1, 5), (5, 2, 5), (9, 6, 5), (15, 20, 5)]]
    assert fft_conv.crossover_size(rows) == 9
    rows[1]["fft_ms"] = 1  # faster from 5 on
    assert fft_conv.crossover_size(rows) == 5
    rows[2]["fft_ms"] = 7  # a dip: faster at 5, slower at 9, faster at 15
    assert fft_conv.crossover_size(rows) == 15
    rows[-1]["fft_ms"] = 30
    assert fft_conv.crossover_size(rows) is None


@pytest.mark.gpu
def test_conv2d_fft_on_cupy():
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(3)
    x, w = check.random_array((2, 3, 40, 33), rng), check.random_array((4, 3, 11, 11), rng)
    exp = ref.conv2d(x.astype(np.float64), w.astype(np.float64), padding=5)
    absref = ref.conv2d(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), padding=5)
    got = fft_conv.conv2d_fft(cp.asarray(x), cp.asarray(w), 5, xp=cp).get()
    assert check.compare(got, exp, absref, rtol=1e-4).ok


def test_large_filter_checker():
    from convlab import check as chk

    def fft_same(image, kernel):
        img, k = np.asarray(image, np.float64), np.asarray(kernel, np.float64)
        (H, W), (R, S) = img.shape, k.shape
        s = (H + R - 1, W + S - 1)
        full = np.fft.irfft2(np.fft.rfft2(img, s=s) * np.fft.rfft2(k[::-1, ::-1], s=s), s=s)
        return full[R // 2:R // 2 + H, S // 2:S // 2 + W]

    chk.check_filter2d_large(fft_same, quiet=True)

    def circular(image, kernel):  # FFT at the image's size: wrap-around at the borders
        img, k = np.asarray(image, np.float64), np.asarray(kernel, np.float64)
        (H, W), (R, S) = img.shape, k.shape
        kp = np.zeros((H, W))
        kp[:R, :S] = k[::-1, ::-1]
        kp = np.roll(kp, (-(R // 2), -(S // 2)), axis=(0, 1))
        return np.fft.irfft2(np.fft.rfft2(img) * np.fft.rfft2(kp), s=(H, W))

    with pytest.raises(chk.CheckError):
        chk.check_filter2d_large(circular, quiet=True)
