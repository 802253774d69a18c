"""Checkers of precision and tensor-core numerics (lesson 12): rounding to bf16 / tf32,
a scaled fp16 GEMM, a conv with fp16 inputs and fp32 sums.

The references come from `convlab.formats` (round to nearest even, bit by bit); the
inputs include ties, NaN payloads, subnormals and values past fp16's range.
"""

from __future__ import annotations

import numpy as np

from .. import reference as ref
from ..errors import CheckError
from ..formats import FORMATS, round_mantissa, round_to
from .conv import conv2d_cases
from .core import _fail, _pass, _run_cases, _value_call, call, compare


def _rounding_inputs(rng, fmt: str) -> np.ndarray:
    """float32 values that test a rounding to `fmt`: a wide range of magnitudes, exact
    ties with an even and an odd kept part, the neighbours of ties, zeros, fp32
    subnormals, values near the top of the range, infinities and NaN."""
    drop = 23 - FORMATS[fmt].mantissa
    wide = (rng.standard_normal(400) * np.exp(rng.uniform(-60, 60, 400))).astype(np.float32)
    kept = rng.integers(0x00800000 >> drop, 0x7F000000 >> drop, 60, dtype=np.uint32) << drop
    tie = np.uint32(1 << (drop - 1))
    bits = np.concatenate([kept | tie, (kept | tie) + 1, (kept | tie) - 1])
    ties = bits.astype(np.uint32).view(np.float32)
    sub = (rng.integers(1, 0x007FFFFF, 20, dtype=np.uint32)).view(np.float32)
    special = np.array([0.0, -0.0, 1.0, -1.0, 3.4e38, -3.39e38, 3.3e38, np.inf, -np.inf,
                        np.nan], np.float32)
    # NaNs whose payload would round into Inf, or carry into the sign bit
    nans = np.array([0x7F800001, 0xFF800001, 0x7FFFFFFF, 0x7FBFFFFF, 0xFFFFFFFF],
                    np.uint32).view(np.float32)
    x = np.concatenate([wide, ties, -ties, sub, -sub, special, nans])
    return x[rng.permutation(x.size)].reshape(-1, 5)  # 2-D on purpose


def check_rounding(fn, fmt: str = "bf16", *, seed=None, quiet=False) -> str:
    """Check fn(x float32 array) -> the values rounded to `fmt` ('bf16' or 'tf32'),
    round to nearest with ties to even, returned as float32 (same shape); infinities stay,
    NaN stays NaN, values that round past the largest finite value become infinite."""
    task = f"round to {fmt}"
    rng = np.random.default_rng(seed)
    x = _rounding_inputs(rng, fmt)
    want = round_to(x, fmt)
    got = _value_call(task, fn, (x.copy(),), {}, f"{x.size} values")
    if got is None:
        raise CheckError(f"{task} returned None: not implemented yet?")
    got = np.asarray(got)
    if got.shape != x.shape:
        raise CheckError(f"{task} FAILED: output shape {got.shape}, expected {x.shape}")
    if got.dtype.kind in "iu":
        raise CheckError(f"{task} FAILED: returned {got.dtype} (the rounded bits?), expected "
                         "float32 values\n  hint: reinterpret the bits as floats: "
                         "bits.view(np.float32)")
    got = got.astype(np.float32)
    nan_ok = np.isnan(want) == np.isnan(got)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(want) & np.isnan(got))
    bad = ~(same & nan_ok)
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        xi, gi, wi = x[i], got[i], want[i]
        hints = []
        trunc = (x.view(np.uint32) >> np.uint32(23 - _fmt_mant(fmt))) << np.uint32(
            23 - _fmt_mant(fmt))
        if np.array_equal(got.view(np.uint32)[np.isfinite(x)], trunc[np.isfinite(x)]):
            hints.append("the low bits were cut off (round toward zero): add half of the "
                         "dropped part first, then cut")
        elif np.isnan(xi):
            hints.append("NaN must stay NaN (adding the rounding increment can turn a NaN's "
                         "bits into Inf): pass non-finite values through")
        elif np.isinf(xi):
            hints.append("infinities must stay infinite")
        elif abs(float(gi) - float(xi)) == abs(float(wi) - float(xi)):
            hints.append("a tie (exactly half-way) went the wrong way: ties go to the "
                         "neighbour whose last kept bit is 0 (even)")
        raise CheckError(
            f"{task} FAILED on {int(bad.sum())} of {x.size} values; first at {i}: x = "
            f"{float(xi)!r} (bits {int(x.view(np.uint32)[i]):#010x}): got {float(gi)!r} "
            f"(bits {int(got.view(np.uint32)[i]):#010x}), expected {float(wi)!r} (bits "
            f"{int(want.view(np.uint32)[i]):#010x})" + "".join(f"\n  hint: {h}" for h in hints))
    return _pass(task, x.size, quiet, "values")


def _fmt_mant(fmt: str) -> int:
    return FORMATS[fmt].mantissa


def _magnitudes(rng, shape, center: float, decades: float = 1.5) -> np.ndarray:
    """Random signs, magnitudes log-uniform within center * 10^(+-decades)."""
    mag = center * 10.0 ** rng.uniform(-decades, decades, shape)
    return (mag * rng.choice([-1.0, 1.0], shape)).astype(np.float32)


def check_scaled_gemm(fn, *, seed=None, quiet=False) -> str:
    """Check fn(A (M, K), B (K, N) float32) -> C (M, N): a GEMM with fp16 tensor-core
    numerics on data outside fp16's range. Each input is multiplied by a power of two
    that brings it into range, rounded to fp16, multiplied with fp32 sums, and the result
    scaled back. Expected: the float64 product of the inputs rounded to 11 significant bits
    (fp16's precision, without its range limits), within fp32 summation error."""
    task = "scaled fp16 gemm"
    rng = np.random.default_rng(seed)
    specs = [((17, 23, 33), 3e5, 2e4, "large values (fp16 overflows)"),
             ((9, 40, 21), 2e-6, 5e-7, "tiny values (fp16 underflows)"),
             ((31, 7, 50), 4e5, 3e-6, "A large, B tiny"),
             ((12, 19, 16), 0.5, 2.0, "values in fp16's range")]
    for (M, N, K), ca, cb, what in specs:
        a, b = _magnitudes(rng, (M, K), ca), _magnitudes(rng, (K, N), cb)
        ar = round_mantissa(a, 10).astype(np.float64)
        br = round_mantissa(b, 10).astype(np.float64)
        exp, absref = ar @ br, np.abs(ar) @ np.abs(br)
        label = f"A {M}x{K} @ B {K}x{N}, {what}"
        out = _value_call(task, fn, (a.copy(), b.copy()), {}, label)
        if out is None:
            raise CheckError(f"{task} returned None on {label}: not implemented yet?")
        out = np.asarray(out)
        comp = compare(out, exp, absref, K, "fp32")
        if not comp.ok:
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            with np.errstate(all="ignore"):  # Inf and NaN outputs are judged below
                ratio = out.astype(np.float64) / np.where(exp == 0, np.nan, exp)
                fin = ratio[np.isfinite(ratio)]
                r = float(np.median(fin)) if fin.size else np.nan
            if not np.isfinite(out).all() and out.dtype == np.float16:
                comp.messages.append("hint: the result is fp16, which overflows: sum in "
                                     "float32 (a tensor core's accumulator) and return float32")
            elif not np.isfinite(out).all():
                comp.messages.append("hint: fp16 holds at most 65504 and loses values below "
                                     "6e-5 (0 below 6e-8): scale each input by a power of "
                                     "two before converting, and sum the scaled fp16 values "
                                     "in float32 (their products overflow fp16 too)")
            elif np.isfinite(r) and r > 0 and abs(np.log2(r) - round(np.log2(r))) < 1e-3 and \
                    round(np.log2(r)) != 0 and np.allclose(out, r * exp, rtol=1e-3,
                                                           atol=1e-30):
                comp.messages.append(f"hint: the result is 2^{round(np.log2(r))} times the "
                                     "product: undo each input's scale once (C / (sa * sb))")
            elif compare(out, a64 @ b64, np.abs(a64) @ np.abs(b64), K, "fp32").ok:
                comp.messages.append("hint: this is the exact fp32 product: round the scaled "
                                     "inputs to fp16 (np.float16) as a tensor core would")
            else:
                comp.messages.append("hint: use powers of two as scales (2**k changes only "
                                     "the exponent, so the rounding is the same as fp16's "
                                     "at any size), and sum in float32")
            _fail(task, label, comp)
    return _pass(task, len(specs), quiet)


def check_conv2d_fp16(fn, *, stride=True, padding=True, seed=None, quiet=False) -> str:
    """Check fn(x, w, stride=, padding=) -> y: a conv2d with tensor-core numerics: x and w
    rounded to fp16, products summed in fp32 (as the lesson's WMMA conv does). Expected:
    the float64 conv of the fp16-rounded inputs, within fp32 summation error."""
    rng = np.random.default_rng(seed)
    cases = conv2d_cases(rng, stride=stride, padding=padding, small=True)
    exact = []
    for c in cases:
        x, w = c["inputs"]
        xr = x.astype(np.float16).astype(np.float64)
        wr = w.astype(np.float16).astype(np.float64)
        exact.append(c["expected"])
        c["expected"] = ref.conv2d(xr, wr, **c["kwargs"])
        c["absref"] = ref.conv2d(np.abs(xr), np.abs(wr), **c["kwargs"])
    try:
        return _run_cases("conv2d (fp16 inputs, fp32 sums)", fn, cases, False, 1, quiet,
                          "fp32")
    except CheckError as e:
        for c, ex in zip(cases, exact, strict=True):
            if c["label"] in str(e) and " raised on " not in str(e):
                try:  # the hint's second call: the report above stands if it fails
                    out = call(fn, c["inputs"], c["expected"].shape, c["kwargs"], False)
                except Exception:  # noqa: BLE001
                    break
                if compare(out, ex, c["absref"], c["reduction"]).ok:
                    raise CheckError(str(e) + "\n  hint: this is the fp32 conv of the "
                                     "unrounded inputs: round x and w to fp16 first") from None
        raise
