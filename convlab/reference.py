"""CPU reference convolutions and the arithmetic around them.

Conventions: NCHW input ``x`` of shape (N, C, H, W), filters ``w`` of shape
(K, C // groups, R, S), output (N, K, P, Q). "Convolution" here is what deep-learning
frameworks compute: cross-correlation (the filter is not flipped).

Everything here is plain NumPy and meant to be obviously right, not fast; the tests
cross-check it against SciPy and PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def pair(v, name: str = "value") -> tuple[int, int]:
    """(v, v) for an int, (a, b) for a 2-sequence of ints."""
    if isinstance(v, (int, np.integer)):
        return int(v), int(v)
    try:
        a, b = v
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an int or a pair of ints, got {v!r}") from None
    if not all(isinstance(t, (int, np.integer)) for t in (a, b)):
        raise TypeError(f"{name} must be an int or a pair of ints, got {v!r}")
    return int(a), int(b)


def conv2d_output_shape(hw, kernel_hw, stride=1, padding=0, dilation=1) -> tuple[int, int]:
    """Output (P, Q) for input (H, W) and filter (R, S).

    P = floor((H + 2·pad − dilation·(R − 1) − 1) / stride) + 1, likewise Q.
    """
    (H, W), (R, S) = pair(hw, "input size"), pair(kernel_hw, "kernel size")
    (sh, sw), (ph, pw), (dh, dw) = pair(stride, "stride"), pair(padding, "padding"), pair(
        dilation, "dilation")
    P = (H + 2 * ph - dh * (R - 1) - 1) // sh + 1
    Q = (W + 2 * pw - dw * (S - 1) - 1) // sw + 1
    return P, Q


@dataclass(frozen=True)
class ConvParams:
    """A validated convolution: shapes and hyper-parameters, all as ints."""

    N: int
    C: int
    H: int
    W: int
    K: int
    R: int
    S: int
    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int

    @property
    def P(self) -> int:
        return conv2d_output_shape((self.H, self.W), (self.R, self.S), self.stride,
                                   self.padding, self.dilation)[0]

    @property
    def Q(self) -> int:
        return conv2d_output_shape((self.H, self.W), (self.R, self.S), self.stride,
                                   self.padding, self.dilation)[1]

    @property
    def out_shape(self) -> tuple:
        return (self.N, self.K, self.P, self.Q)

    @property
    def reduction(self) -> int:
        """Products summed into one output element: (C / groups)·R·S."""
        return self.C // self.groups * self.R * self.S


def conv_params(x_shape, w_shape, stride=1, padding=0, dilation=1, groups=1) -> ConvParams:
    """Validate shapes and hyper-parameters; raise a clear error on anything wrong."""
    if len(x_shape) != 4:
        raise ValueError(f"x must be 4-D NCHW (N, C, H, W), got shape {tuple(x_shape)}")
    if len(w_shape) != 4:
        raise ValueError(f"w must be 4-D (K, C/groups, R, S), got shape {tuple(w_shape)}")
    N, C, H, W = (int(v) for v in x_shape)
    K, Cg, R, S = (int(v) for v in w_shape)
    if not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups!r}")
    if C % groups or K % groups:
        raise ValueError(f"channels in ({C}) and out ({K}) must both be divisible by "
                         f"groups ({groups})")
    if Cg != C // groups:
        raise ValueError(f"w has {Cg} input channels per group but x has C={C} and "
                         f"groups={groups}, so w.shape[1] must be {C // groups}")
    stride, padding, dilation = (pair(stride, "stride"), pair(padding, "padding"),
                                 pair(dilation, "dilation"))
    if min(stride) < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    if min(padding) < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    if min(dilation) < 1:
        raise ValueError(f"dilation must be >= 1, got {dilation}")
    if min(N, C, H, W, K, R, S) < 1:
        raise ValueError(f"empty tensor: x {tuple(x_shape)}, w {tuple(w_shape)}")
    p = ConvParams(N, C, H, W, K, R, S, stride, padding, dilation, int(groups))
    if p.P < 1 or p.Q < 1:
        raise ValueError(f"the (dilated) filter {R}x{S} (dilation {dilation}) does not fit the "
                         f"padded input {H}x{W} (padding {padding}): output would be "
                         f"{p.P}x{p.Q}")
    return p


def _check_arrays(x, w):
    for name, a in (("x", x), ("w", w)):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{name} must be a NumPy array, got {type(a).__name__}")
        if a.dtype.kind != "f":
            raise TypeError(f"{name} must be floating point (float32 in the course), "
                            f"got {a.dtype}")


def pad_nchw(x: np.ndarray, padding) -> np.ndarray:
    ph, pw = pair(padding, "padding")
    return np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))


def conv2d_naive(x, w, stride=1, padding=0, dilation=1, groups=1) -> np.ndarray:
    """Direct convolution with explicit loops over every output element.

    Slow on purpose (one Python iteration per output): it is the definition, used on
    tiny shapes. Accumulates in float64, returns x.dtype.
    """
    _check_arrays(x, w)
    p = conv_params(x.shape, w.shape, stride, padding, dilation, groups)
    xp = pad_nchw(x.astype(np.float64), p.padding)
    w64 = w.astype(np.float64)
    (sh, sw), (dh, dw) = p.stride, p.dilation
    Cg, Kg = p.C // p.groups, p.K // p.groups
    y = np.zeros(p.out_shape)
    for n in range(p.N):
        for k in range(p.K):
            g = k // Kg
            for i in range(p.P):
                for j in range(p.Q):
                    acc = 0.0
                    for c in range(Cg):
                        for r in range(p.R):
                            for s in range(p.S):
                                acc += (xp[n, g * Cg + c, i * sh + r * dh, j * sw + s * dw]
                                        * w64[k, c, r, s])
                    y[n, k, i, j] = acc
    return y.astype(x.dtype)


def windows(x, kernel_hw, stride=1, padding=0, dilation=1) -> np.ndarray:
    """View of every receptive field: shape (N, C, P, Q, R, S), no copy.

    Padding makes one padded copy; the windows themselves are a strided view of it.
    """
    (R, S), (sh, sw), (dh, dw) = pair(kernel_hw), pair(stride), pair(dilation)
    xp = pad_nchw(x, padding)
    span_h, span_w = dh * (R - 1) + 1, dw * (S - 1) + 1
    v = sliding_window_view(xp, (span_h, span_w), axis=(2, 3))  # N C H' W' spanH spanW
    return v[:, :, ::sh, ::sw, ::dh, ::dw]


def conv2d(x, w, stride=1, padding=0, dilation=1, groups=1, accumulate=np.float64):
    """Vectorized direct convolution (strided windows + einsum).

    accumulate: dtype of the arithmetic (float64 by default, so it is a trustworthy
    reference); the result has x.dtype.
    """
    _check_arrays(x, w)
    p = conv_params(x.shape, w.shape, stride, padding, dilation, groups)
    G, Cg, Kg = p.groups, p.C // p.groups, p.K // p.groups
    v = windows(x.astype(accumulate, copy=False), (p.R, p.S), p.stride, p.padding, p.dilation)
    v = v[:, :, : p.P, : p.Q].reshape(p.N, G, Cg, p.P, p.Q, p.R, p.S)
    wg = w.astype(accumulate, copy=False).reshape(G, Kg, Cg, p.R, p.S)
    y = np.einsum("ngcpqrs,gkcrs->ngkpq", v, wg, optimize=True)
    return y.reshape(p.out_shape).astype(x.dtype)


def im2col(x, kernel_hw, stride=1, padding=0, dilation=1) -> np.ndarray:
    """Unroll every receptive field into a column.

    x (N, C, H, W) -> cols (C·R·S, N·P·Q): row index (c, r, s), column index (n, p, q).
    One copy serves every filter and the whole batch; it is R·S times larger than x
    (for stride 1): memory traded for one big GEMM.
    """
    if not isinstance(x, np.ndarray) or x.ndim != 4:
        raise ValueError(f"x must be a 4-D NCHW NumPy array, got {getattr(x, 'shape', x)!r}")
    R, S = pair(kernel_hw, "kernel size")
    P, Q = conv2d_output_shape(x.shape[2:], (R, S), stride, padding, dilation)
    if P < 1 or Q < 1:
        raise ValueError(f"filter {R}x{S} does not fit input {x.shape[2:]} with this padding")
    v = windows(x, (R, S), stride, padding, dilation)[:, :, :P, :Q]  # N C P Q R S
    N, C = x.shape[:2]
    return np.ascontiguousarray(v.transpose(1, 4, 5, 0, 2, 3)).reshape(C * R * S, N * P * Q)


def col2im(cols, x_shape, kernel_hw, stride=1, padding=0, dilation=1) -> np.ndarray:
    """The adjoint of `im2col`: scatter-add columns back into an (N, C, H, W) image.

    Pixels covered by several windows receive the sum of their copies, so
    ``col2im(im2col(x))`` is x times the number of windows covering each pixel.
    """
    N, C, H, W = x_shape
    (R, S), (sh, sw), (ph, pw), (dh, dw) = (pair(kernel_hw), pair(stride), pair(padding),
                                            pair(dilation))
    P, Q = conv2d_output_shape((H, W), (R, S), stride, padding, dilation)
    if cols.shape != (C * R * S, N * P * Q):
        raise ValueError(f"cols must have shape {(C * R * S, N * P * Q)}, got {cols.shape}")
    c6 = cols.reshape(C, R, S, N, P, Q)
    xp = np.zeros((N, C, H + 2 * ph, W + 2 * pw), dtype=cols.dtype)
    for r in range(R):
        for s in range(S):
            h0, w0 = r * dh, s * dw
            xp[:, :, h0:h0 + sh * P:sh, w0:w0 + sw * Q:sw] += c6[:, r, s].transpose(1, 0, 2, 3)
    return xp[:, :, ph:ph + H, pw:pw + W]


def conv2d_im2col(x, w, stride=1, padding=0, dilation=1, groups=1) -> np.ndarray:
    """Convolution as im2col + one GEMM per group (through BLAS), in x.dtype."""
    _check_arrays(x, w)
    p = conv_params(x.shape, w.shape, stride, padding, dilation, groups)
    G, Cg, Kg = p.groups, p.C // p.groups, p.K // p.groups
    out = np.empty((p.K, p.N * p.P * p.Q), dtype=np.result_type(x, w))
    for g in range(G):
        cols = im2col(x[:, g * Cg:(g + 1) * Cg], (p.R, p.S), p.stride, p.padding, p.dilation)
        out[g * Kg:(g + 1) * Kg] = w[g * Kg:(g + 1) * Kg].reshape(Kg, -1) @ cols
    return out.reshape(p.K, p.N, p.P, p.Q).transpose(1, 0, 2, 3).copy()


def depthwise_conv2d(x, w, stride=1, padding=0, dilation=1) -> np.ndarray:
    """One filter per channel: w (C, 1, R, S); conv2d with groups = C."""
    return conv2d(x, w, stride, padding, dilation, groups=x.shape[1])


def separable_conv2d(x, w_depthwise, w_pointwise, stride=1, padding=0, dilation=1):
    """Depthwise (C, 1, R, S) then pointwise 1x1 (K, C, 1, 1): MobileNet's block."""
    return conv2d(depthwise_conv2d(x, w_depthwise, stride, padding, dilation), w_pointwise)


def filter2d(image, kernel, padding="same") -> np.ndarray:
    """Cross-correlate one 2-D image with one 2-D filter (zero padding).

    padding='same' keeps the size (odd filters); an int pads that many pixels.
    """
    image, kernel = np.asarray(image), np.asarray(kernel)
    if image.ndim != 2 or kernel.ndim != 2:
        raise ValueError(f"filter2d needs a 2-D image and a 2-D kernel, got {image.shape} "
                         f"and {kernel.shape}")
    if padding == "same":
        if kernel.shape[0] % 2 == 0 or kernel.shape[1] % 2 == 0:
            raise ValueError("padding='same' needs an odd-sized kernel")
        padding = (kernel.shape[0] // 2, kernel.shape[1] // 2)
    dtype = image.dtype if image.dtype.kind == "f" else np.float32
    y = conv2d(image[None, None].astype(dtype), kernel[None, None].astype(dtype),
               padding=padding)
    return y[0, 0]


# ----------------------------------------------------------------------------------------
# Counting


def conv2d_flops(x_shape, w_shape, stride=1, padding=0, dilation=1, groups=1) -> int:
    """Floating-point operations: 2 (multiply + add) per product, N·K·P·Q·(C/g)·R·S products."""
    p = conv_params(x_shape, w_shape, stride, padding, dilation, groups)
    return 2 * p.N * p.K * p.P * p.Q * p.reduction


def conv2d_bytes(x_shape, w_shape, stride=1, padding=0, dilation=1, groups=1,
                 itemsize=4) -> int:
    """The fewest bytes any implementation moves: read x and w once, write y once."""
    p = conv_params(x_shape, w_shape, stride, padding, dilation, groups)
    n = np.prod(x_shape) + np.prod(w_shape) + np.prod(p.out_shape)
    return int(n) * itemsize


def arithmetic_intensity(x_shape, w_shape, **kw) -> float:
    """FLOP per byte of compulsory traffic (the roofline's x axis)."""
    return conv2d_flops(x_shape, w_shape, **kw) / conv2d_bytes(x_shape, w_shape, **kw)


def im2col_bytes(x_shape, kernel_hw, stride=1, padding=0, dilation=1, itemsize=4) -> int:
    """Size of the im2col matrix, to compare with the input's N·C·H·W·itemsize."""
    N, C, H, W = x_shape
    R, S = pair(kernel_hw)
    P, Q = conv2d_output_shape((H, W), (R, S), stride, padding, dilation)
    return C * R * S * N * P * Q * itemsize


def gemm_flops(M: int, N: int, K: int) -> int:
    return 2 * M * N * K


def conv2d_params_count(C: int, K: int, R: int, S: int, groups: int = 1, bias=False) -> int:
    """Weights of a conv layer: K·(C/groups)·R·S (+K biases)."""
    return K * (C // groups) * R * S + (K if bias else 0)
