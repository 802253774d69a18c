"""Floating-point formats and rounding, the way a tensor core sees its inputs.

- `FORMATS` (fp32, tf32, bf16, fp16, fp8 e4m3 / e5m2): bits, range, unit roundoff;
  `format_table()` prints them.
- `round_to(x, fmt)` rounds float32 values to a format (round to nearest, ties to even)
  and keeps them in float32; `round_mantissa(x, m)` keeps m stored mantissa bits.
- `bits(x, fmt)` splits a value into sign / exponent / mantissa bit strings (pictures).

A leaf module: it imports nothing from convlab, so checkers and kernels can use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Functions here that only describe stay usable inside graded answers; the ones that
# compute an answer (round_to, round_mantissa, bits) do not (grading sandbox).
GRADING_ALLOWED = ("format_table",)


@dataclass(frozen=True)
class Format:
    """A floating-point format: 1 sign bit, `exponent` bits, `mantissa` stored bits."""

    name: str
    exponent: int
    mantissa: int
    note: str = ""

    @property
    def bits(self) -> int:
        return 1 + self.exponent + self.mantissa

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent - 1) - 1

    @property
    def unit_roundoff(self) -> float:
        """Largest relative error of one rounding to nearest: 2^-(mantissa+1)."""
        return 2.0 ** -(self.mantissa + 1)

    @property
    def max(self) -> float:
        if self.name == "fp8 e4m3":  # no infinities: the top exponent still holds numbers
            return 448.0
        return (2 - 2.0 ** -self.mantissa) * 2.0 ** self.bias

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)


FORMATS = {
    "fp32": Format("fp32", 8, 23, "IEEE single: the course's default"),
    "tf32": Format("tf32", 8, 10, "tensor-core input format (Ampere+): fp32 range, fp16 "
                                  "precision; stored as fp32"),
    "bf16": Format("bf16", 8, 7, "brain float: fp32 range, 8 significant bits"),
    "fp16": Format("fp16", 5, 10, "IEEE half: 11 significant bits, max 65504"),
    "fp8 e4m3": Format("fp8 e4m3", 4, 3, "Hopper / Ada: inference and training forward"),
    "fp8 e5m2": Format("fp8 e5m2", 5, 2, "Hopper / Ada: gradients"),
}


def format_table() -> str:
    rows = [f"{'format':<10}{'bits':>5}{'exp':>5}{'mant':>6}{'max':>12}{'min normal':>12}"
            f"{'unit roundoff':>15}  note"]
    for f in FORMATS.values():
        rows.append(f"{f.name:<10}{f.bits:>5}{f.exponent:>5}{f.mantissa:>6}{f.max:>12.4g}"
                    f"{f.min_normal:>12.3g}{f.unit_roundoff:>15.3g}  {f.note}")
    return "\n".join(rows)


def round_mantissa(x: np.ndarray, mantissa: int) -> np.ndarray:
    """float32 -> float32 with `mantissa` stored bits, round to nearest even (bits)."""
    x = np.asarray(x, dtype=np.float32)
    shape = x.shape
    x = np.ascontiguousarray(x.reshape(-1))
    u = x.view(np.uint32).astype(np.uint64)
    drop = 23 - mantissa
    half = np.uint64(1 << (drop - 1))
    lsb = (u >> np.uint64(drop)) & np.uint64(1)
    r = ((u + half - np.uint64(1) + lsb) >> np.uint64(drop)) << np.uint64(drop)
    r = (r & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(x), r, x).reshape(shape)  # NaN and Inf pass through


def round_to(x, fmt: str = "fp16") -> np.ndarray:
    """Round float32 values to `fmt` (nearest even); the result is float32.

    fp16 uses NumPy's float16 (its range: overflow gives Inf, tiny values lose bits);
    tf32 and bf16 keep fp32's exponent, so only the mantissa is rounded; fp8 formats
    are rounded in precision and clipped to their largest value (saturating).
    """
    x = np.asarray(x, dtype=np.float32)
    if fmt == "fp32":
        return x.copy()
    if fmt == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    if fmt in ("tf32", "bf16"):
        return round_mantissa(x, FORMATS[fmt].mantissa)
    if fmt in ("fp8 e4m3", "fp8 e5m2"):
        f = FORMATS[fmt]
        # below the smallest normal the spacing is fixed (subnormals): round there on a grid
        sub = 2.0 ** (1 - f.bias - f.mantissa)
        r = round_mantissa(x, f.mantissa)
        small = np.abs(x) < f.min_normal
        r = np.where(small, np.round(x / sub) * sub, r).astype(np.float32)
        return np.clip(r, -f.max, f.max).astype(np.float32)
    raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")


def bits(x: float, fmt: str = "fp16") -> dict:
    """Sign, exponent and mantissa bit strings of x rounded to fmt (for pictures)."""
    f = FORMATS[fmt]
    v = float(round_to(np.float32(x), fmt))
    u = int(np.float32(v).view(np.uint32))
    if fmt == "fp16":
        u = int(np.float16(v).view(np.uint16))
        e_bits, m_bits = (u >> 10) & 31, u & 1023
    else:
        e32, m32 = (u >> 23) & 255, u & 0x7FFFFF
        if f.exponent == 8:
            e_bits, m_bits = e32, m32 >> (23 - f.mantissa)
        else:  # fp8: re-bias the exponent
            e_bits = max(0, e32 - 127 + f.bias) if e32 else 0
            m_bits = m32 >> (23 - f.mantissa)
    sign = "1" if math.copysign(1.0, v) < 0 else "0"
    return dict(value=v, sign=sign, exponent=format(e_bits, f"0{f.exponent}b"),
                mantissa=format(m_bits, f"0{f.mantissa}b"))
