"""FFT convolution: the convolution theorem, for filters large enough to pay for it.

A correlation in space is a product in frequency: with X = FFT(x) and Wf = FFT(w) (both
zero-padded to one size F),

    x ⋆ w = IFFT( X · conj(Wf) )    (circular; the conjugate makes it a correlation)

and the circular wrap-around only touches outputs beyond the 'valid' ones, so an FFT of
the padded input's own size is enough. A conv layer sums over input channels, which in
frequency is, for every frequency, a small matrix product:

    Y[n, k, f] = sum_c X[n, c, f] · conj(Wf[k, c, f])

Cost: the direct conv does N·K·C·P·Q·R·S multiply-adds, growing with the filter area
R·S; the FFT route does FFTs of N·C + K·C + N·K planes (each ~5 F log2 F flops) and
N·K·C complex multiply-adds per frequency, independent of R·S. So there is a filter size
from which FFT wins: lesson 11 measures it (it depends on the hardware, the image size,
the channel counts and how good the direct implementation is).

`conv2d_fft` works with any array module: NumPy or SciPy on the CPU (scipy.fft runs its
transforms in several threads with workers=-1), CuPy on a GPU.
"""

from __future__ import annotations

import numpy as np

from . import reference as ref


def _fft_module(xp):
    """(rfft2, irfft2, next_fast_len, extra kwargs) for numpy, cupy or 'scipy'."""
    if xp == "scipy":
        import scipy.fft as sf

        return sf.rfft2, sf.irfft2, sf.next_fast_len, {"workers": -1}
    if xp is np:
        try:
            import scipy.fft as sf

            nfl = sf.next_fast_len
        except ImportError:  # pragma: no cover  (scipy is a dependency)
            def nfl(n, real=True):
                return n
        return np.fft.rfft2, np.fft.irfft2, nfl, {}
    import cupyx.scipy.fft as cf  # CuPy

    return xp.fft.rfft2, xp.fft.irfft2, cf.next_fast_len, {}


def fft_size(H: int, W: int, padding: int = 0, fast: bool = True, xp=np) -> tuple:
    """The FFT size for an H x W input padded by `padding`: its own size, rounded up to a
    size with small prime factors (fast transforms) when `fast`."""
    Hp, Wp = H + 2 * padding, W + 2 * padding
    if not fast:
        return Hp, Wp
    nfl = _fft_module(xp)[2]
    return nfl(Hp, real=True), nfl(Wp, real=True)


def conv2d_fft(x, w, padding: int = 0, xp=np, fast: bool = True):
    """NCHW cross-correlation (stride 1, groups 1) through real FFTs; x.dtype arithmetic.

    xp: numpy, the string 'scipy' (scipy.fft, multi-threaded) or cupy.
    """
    mod = np if xp == "scipy" else xp
    rfft2, irfft2, _, kw = _fft_module(xp)
    x, w = mod.asarray(x), mod.asarray(w)
    p = ref.conv_params(x.shape, w.shape, padding=padding)
    Fh, Fw = fft_size(p.H, p.W, padding, fast, xp)
    if padding:
        x = mod.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    X = rfft2(x, s=(Fh, Fw), **kw)  # N C Fh Fw/2+1 (zero-padded to the FFT size)
    Wf = rfft2(w, s=(Fh, Fw), **kw)  # K C Fh Fw/2+1
    # sum over channels: one (N x C) @ (C x K) complex product per frequency
    Xf = X.reshape(p.N, p.C, -1).transpose(2, 0, 1)
    Wc = mod.conj(Wf.reshape(p.K, p.C, -1)).transpose(2, 1, 0)
    Y = mod.matmul(Xf, Wc).transpose(1, 2, 0).reshape(p.N, p.K, Fh, -1)
    y = irfft2(Y, s=(Fh, Fw), **kw)[:, :, :p.P, :p.Q]
    return mod.ascontiguousarray(y.astype(x.dtype, copy=False))


def filter2d_fft(image, kernel, xp=np):
    """One image, one odd-sized filter, 'same' zero padding (the lessons' filter2d)."""
    R, S = kernel.shape
    if R % 2 == 0 or S % 2 == 0 or R != S:
        raise ValueError("filter2d_fft: square odd filters ('same' padding), got "
                         f"{R}x{S}")
    mod = np if xp == "scipy" else xp
    img = mod.asarray(image)[None, None]
    return conv2d_fft(img, mod.asarray(kernel)[None, None], padding=R // 2, xp=xp)[0, 0]


def direct_flops(x_shape, R: int, K: int = 1, padding: int | None = None) -> int:
    """FLOPs of the direct conv of x (N, C, H, W) with K filters R x R ('same' by default)."""
    N, C, H, W = x_shape
    padding = R // 2 if padding is None else padding
    return ref.conv2d_flops(x_shape, (K, C, R, R), padding=padding)


def fft_flops(x_shape, R: int, K: int = 1, padding: int | None = None) -> float:
    """A model of the FFT route's FLOPs: real FFTs of N·C + K·C + N·K planes at ~2.5 F
    log2 F each, plus 8 real FLOPs per complex multiply-add of the channel sum."""
    N, C, H, W = x_shape
    padding = R // 2 if padding is None else padding
    Fh, Fw = fft_size(H, W, padding)
    F = Fh * Fw
    ffts = (N * C + K * C + N * K) * 2.5 * F * np.log2(F)
    return float(ffts + 8 * N * K * C * Fh * (Fw // 2 + 1))


def crossover_size(rows: list, key: str = "R", direct: str = "direct_ms",
                   fft: str = "fft_ms"):
    """From measured rows (dicts, ascending filter size), the smallest filter size from
    which the FFT route stays faster than the direct one; None if it never does."""
    best = None
    for row in reversed(rows):
        if row[fft] < row[direct]:
            best = row[key]
        else:
            break
    return best
