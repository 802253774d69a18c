"""Winograd's minimal filtering F(m, r) and the 2-D F(2x2, 3x3) convolution.

Where the matrices come from (Toom-Cook). A linear convolution y = g * h of an r-tap
filter g with an m-tap signal h has n = m + r - 1 outputs; its coefficients are those of
the product polynomial y(x) = g(x) h(x), of degree n - 1. A polynomial of degree n - 1 is
fixed by its values at n points, so

    y = Ainv [ (Vg g) ⊙ (Vh h) ]

where Vg (n x r) and Vh (n x m) evaluate g and h at the points, the ⊙ is n products
(instead of m*r), and Ainv (n x n) interpolates: it is the inverse of the n x n
evaluation matrix. The "point at infinity" stands for the leading coefficient (row
[0 ... 0 1]); it saves one finite point, keeping the numbers small.

The filter that deep learning calls convolution is a correlation: m outputs
out_i = sum_k g_k d_{i+k} from n inputs d. Written as a matrix, that is the *transpose*
of the convolution above (y = C(g) h with C(g)[j, i] = g_{j-i}; out = C(g)^T d), so

    out = Vh^T [ (Vg g) ⊙ (Ainv^T d) ] = AT [ (G g) ⊙ (BT d) ]

with AT = Vh^T (m x n), G = Vg (n x r), BT = Ainv^T (n x n). Any diagonal scaling D can
move between G and BT ((D G g) ⊙ (D^-1 BT d) is the same), so `winograd_matrices` moves
the fractions of BT into G and gets the integer BT of Lavin & Gray (2016). With the points
0, 1, -1, inf and m = 2, r = 3 this gives F(2, 3): 4 multiplications for 2 outputs of a
3-tap filter instead of 6. Nested in 2-D, F(2x2, 3x3) = AT [ (G g G^T) ⊙ (BT d B) ] A
makes a 2x2 output tile from a 4x4 input tile with 16 multiplications instead of 36.

Everything here is exact (fractions) until it is turned into float arrays; the 2-D
convolution is written once for any array module (NumPy on the CPU, CuPy on a GPU).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from . import reference as ref

INF = "inf"
POINTS_F23 = (0, 1, -1, INF)
# the finite interpolation points of F(m, 3) used throughout (with infinity)
POINTS = {2: (0, 1, -1), 4: (0, 1, -1, 2, -2), 6: (0, 1, -1, 2, -2, 0.5, -0.5)}


def _eval_row(a, k: int) -> list:
    """[1, a, a^2, ..., a^(k-1)]; for the point at infinity, [0, ..., 0, 1]."""
    if a == INF:
        return [Fraction(0)] * (k - 1) + [Fraction(1)]
    a = Fraction(a)
    return [a**i for i in range(k)]


def _inverse(M: list) -> list:
    """Exact inverse of a square matrix of Fractions (Gauss-Jordan)."""
    n = len(M)
    A = [list(row) + [Fraction(int(i == j)) for j in range(n)] for i, row in enumerate(M)]
    for col in range(n):
        piv = next((r for r in range(col, n) if A[r][col] != 0), None)
        if piv is None:
            raise ValueError("the evaluation matrix is singular: are the points distinct?")
        A[col], A[piv] = A[piv], A[col]
        p = A[col][col]
        A[col] = [v / p for v in A[col]]
        for r in range(n):
            if r != col and A[r][col] != 0:
                f = A[r][col]
                A[r] = [a - f * b for a, b in zip(A[r], A[col], strict=True)]
    return [row[n:] for row in A]


def _transpose(M: list) -> list:
    return [list(col) for col in zip(*M, strict=True)]


def winograd_matrices(m: int = 2, r: int = 3, points=(0, 1, -1), infinity: bool = True,
                      integer_bt: bool = True) -> dict:
    """AT (m x n), G (n x r), BT (n x n) of F(m, r) from interpolation points, exactly.

    points: the n - 1 finite points (n = m + r - 1) when infinity is True, else n points.
    Returns Fraction matrices (lists of lists) plus 'points', 'm', 'r', 'n'.
    integer_bt: move the fractions of BT into G (a diagonal rescaling, same result).
    """
    n = m + r - 1
    pts = list(points) + ([INF] if infinity else [])
    if len(pts) != n:
        raise ValueError(f"F({m}, {r}) needs {n} points (with infinity: {n - 1} finite), "
                         f"got {pts}")
    if len({str(p) for p in pts}) != n:
        raise ValueError(f"points must be distinct, got {pts}")
    Vg = [_eval_row(a, r) for a in pts]  # n x r: evaluate the filter
    Vh = [_eval_row(a, m) for a in pts]  # n x m: evaluate the signal
    Ainv = _inverse([_eval_row(a, n) for a in pts])  # n x n: interpolate the product
    AT, G, BT = _transpose(Vh), Vg, _transpose(Ainv)
    if integer_bt:
        for i, row in enumerate(BT):
            nz = [abs(v) for v in row if v != 0]
            # scale row i of BT by d and row i of G by 1/d so that BT's row is integral
            # with the smallest entries +-1
            d = Fraction(1, 1)
            for v in nz:
                d = max(d, Fraction(v.denominator))
            g = min(abs(v * d) for v in nz)
            d = d / g
            BT[i] = [v * d for v in row]
            G[i] = [v / d for v in G[i]]
    return dict(AT=AT, G=G, BT=BT, points=pts, m=m, r=r, n=n)


def as_float(mats: dict, dtype=np.float32) -> tuple:
    """(AT, G, BT) as float arrays."""
    return tuple(np.array([[float(v) for v in row] for row in mats[k]], dtype=dtype)
                 for k in ("AT", "G", "BT"))


def show(M: list) -> str:
    """A Fraction matrix as aligned text."""
    cells = [[str(v) for v in row] for row in M]
    width = max(len(c) for row in cells for c in row)
    return "\n".join("[" + " ".join(c.rjust(width) for c in row) + "]" for row in cells)


def f23_matrices(dtype=np.float32) -> tuple:
    """F(2, 3) from the points 0, 1, -1 and infinity, as float arrays (AT, G, BT)."""
    return as_float(winograd_matrices(2, 3, (0, 1, -1)), dtype)


def filter_1d(d, g, mats: dict | None = None) -> np.ndarray:
    """F(m, r) on one input tile: m outputs of the correlation of d (n values) with g."""
    AT, G, BT = as_float(mats or winograd_matrices(), np.float64)
    return AT @ ((G @ np.asarray(g, np.float64)) * (BT @ np.asarray(d, np.float64)))


# ----------------------------------------------------------------------------------------
# The 2-D convolution F(m x m, 3 x 3), NCHW, stride 1


def transform_filters(w, G, xp=np):
    """U = G g G^T for every (k, c): (K, C, n, n)."""
    return xp.einsum("ir,kcrs,js->kcij", G, w, G)


def input_tiles(x, m: int, r: int, padding: int = 0, xp=np):
    """Overlapping n x n input tiles with step m: (N, C, TH, TW, n, n), and (P, Q).

    The padded input is padded further (with zeros) on the bottom and right so that the
    tiles cover every output; the extra outputs are cropped at the end.
    """
    N, C, H, W = x.shape
    n = m + r - 1
    P, Q = H + 2 * padding - r + 1, W + 2 * padding - r + 1
    TH, TW = -(-P // m), -(-Q // m)
    Hp, Wp = (TH - 1) * m + n, (TW - 1) * m + n
    xp_ = xp.zeros((N, C, Hp, Wp), dtype=x.dtype)
    xp_[:, :, padding:padding + H, padding:padding + W] = x
    tiles = xp.empty((N, C, TH, TW, n, n), dtype=x.dtype)
    for i in range(n):
        for j in range(n):
            tiles[..., i, j] = xp_[:, :, i:i + m * TH:m, j:j + m * TW:m]
    return tiles, (P, Q)


def conv2d_winograd(x, w, padding: int = 0, m: int = 2, points=None, xp=np, mats=None):
    """NCHW 3x3 convolution (cross-correlation), stride 1, by Winograd F(m x m, 3 x 3).

    The four steps: filters U = G g G^T; input tiles V = BT d B; for each of the n*n
    positions (i, j) of a tile, one GEMM M[i, j] = U[:, :, i, j] (K x C) @ V[:, i, j]
    (C x tiles) (the sum over input channels); outputs Y = AT M A. Arithmetic in x.dtype.
    xp: numpy or cupy. mats: Fraction matrices from `winograd_matrices` (default: F(m, 3)
    with the points 0, 1, -1 (m = 2) or 0, 1, -1, 2, -2 (m = 4), and infinity).
    """
    x, w = xp.asarray(x), xp.asarray(w)
    N, C, H, W = x.shape
    K, Cw, r, s = w.shape
    if (r, s) != (3, 3) or Cw != C:
        raise ValueError(f"conv2d_winograd: 3x3 filters over all {C} channels only, got w "
                         f"{tuple(w.shape)}")
    if mats is None:
        if points is None:
            points = POINTS[m]
        pts = [Fraction(p).limit_denominator(64) for p in points]
        mats = winograd_matrices(m, 3, pts)
    AT, G, BT = (xp.asarray(a) for a in as_float(mats, x.dtype))
    n = mats["n"]
    U = transform_filters(w, G, xp)  # K C n n
    tiles, (P, Q) = input_tiles(x, mats["m"], 3, padding, xp)  # N C TH TW n n
    TH, TW = tiles.shape[2:4]
    V = xp.einsum("ia,nctwab,jb->ijcntw", BT, tiles, BT)  # n n C N TH TW
    V = V.reshape(n * n, C, N * TH * TW)
    Uf = U.transpose(2, 3, 0, 1).reshape(n * n, K, C)
    M = xp.matmul(Uf, V).reshape(n, n, K, N, TH, TW)  # n*n GEMMs (K x C) @ (C x tiles)
    Y = xp.einsum("ai,ijkntw,bj->kntawb", AT, M, AT)  # K N TH m TW m
    mm = mats["m"]
    Y = Y.reshape(K, N, TH * mm, TW * mm)[:, :, :P, :Q]
    return xp.ascontiguousarray(Y.transpose(1, 0, 2, 3))


def multiplications(m: int, r: int = 3, dims: int = 2) -> tuple:
    """(direct, Winograd) multiplications per output tile of F(m^dims, r^dims)."""
    return (m * r) ** dims, (m + r - 1) ** dims


def accuracy(x, w, padding: int = 1, m: int = 2, dtype=np.float32) -> dict:
    """Errors of F(m x m, 3 x 3) and of a direct float conv, against float64, relative to
    conv(|x|, |w|) (the scale of each output's rounding): max and median."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    exact = ref.conv2d(x64, w64, padding=padding)
    scale = ref.conv2d(np.abs(x64), np.abs(w64), padding=padding)
    wino = conv2d_winograd(x.astype(dtype), w.astype(dtype), padding, m=m)
    direct = ref.conv2d_im2col(x.astype(dtype), w.astype(dtype), padding=padding)
    out = {}
    for name, y in (("winograd", wino), ("direct", direct)):
        e = np.abs(y.astype(np.float64) - exact) / scale
        out[name] = dict(max=float(e.max()), median=float(np.median(e)))
    return out
