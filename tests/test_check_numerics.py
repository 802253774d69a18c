"""convlab.check.numerics: the lesson 12 checkers pass right answers and fail planted
wrong ones with the hint that names the mistake.
"""

from __future__ import annotations

import numpy as np
import pytest

from convlab import check
from convlab import reference as ref


def _to_bf16(x):
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(x), r, x)


def test_check_rounding_passes_right_and_fails_planted_answers():
    check.check_rounding(_to_bf16, quiet=True)
    check.check_rounding(_to_bf16, seed=11, quiet=True)

    def truncate(x):
        return (np.asarray(x, np.float32).view(np.uint32) >> 16 << 16).view(np.float32)

    def ties_away(x):
        x = np.asarray(x, dtype=np.float32)
        u = x.view(np.uint32).astype(np.uint64)
        r = (((u + 0x8000) >> 16) << 16).astype(np.uint32).view(np.float32)
        return np.where(np.isfinite(x), r, x)

    def nan_into_inf(x):
        x = np.asarray(x, dtype=np.float32)
        u = x.view(np.uint32).astype(np.uint64)
        return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(
            np.float32)

    for bad, why in ((truncate, "round toward zero"), (ties_away, "tie"),
                     (nan_into_inf, "NaN must stay NaN"), (lambda x: x, "FAILED"),
                     (lambda x: np.asarray(x)[:-1], "shape"), (lambda x: None, "None"),
                     (lambda x: _to_bf16(x).view(np.uint32), r"(?s)returned uint32 .*\.view\(np")):
        with pytest.raises(check.CheckError, match=why):
            check.check_rounding(bad, quiet=True)


def test_check_rounding_tf32():
    def to_tf32(x):
        x = np.asarray(x, dtype=np.float32)
        u = x.view(np.uint32).astype(np.uint64)
        r = (((u + 0xFFF + ((u >> 13) & 1)) >> 13) << 13).astype(np.uint32).view(np.float32)
        return np.where(np.isfinite(x), r, x)

    check.check_rounding(to_tf32, "tf32", quiet=True)
    with pytest.raises(check.CheckError):
        check.check_rounding(_to_bf16, "tf32", quiet=True)


def _scaled(a, b):
    def e(m):
        top = float(np.max(np.abs(m)))
        return 0 if top == 0 else 14 - int(np.floor(np.log2(top)))
    sa, sb = e(a), e(b)
    c = (np.ldexp(a, sa).astype(np.float16).astype(np.float32)
         @ np.ldexp(b, sb).astype(np.float16).astype(np.float32))
    return np.ldexp(c, -(sa + sb))


def test_check_scaled_gemm():
    check.check_scaled_gemm(_scaled, quiet=True)

    def cast(a, b):
        with np.errstate(over="ignore", invalid="ignore"):
            return a.astype(np.float16).astype(np.float32) @ b.astype(np.float16).astype(
                np.float32)

    def by_max(a, b):  # scales that are not powers of two round differently
        sa, sb = 60000 / np.abs(a).max(), 60000 / np.abs(b).max()
        return ((a * sa).astype(np.float16).astype(np.float32)
                @ (b * sb).astype(np.float16).astype(np.float32)) / (sa * sb)

    def fp16_sums(a, b):  # scaled right, but the product summed (and kept) in fp16
        def e(m):
            return 14 - int(np.floor(np.log2(float(np.max(np.abs(m))))))
        sa, sb = e(a), e(b)
        with np.errstate(over="ignore", invalid="ignore"):
            c = np.ldexp(a, sa).astype(np.float16) @ np.ldexp(b, sb).astype(np.float16)
            return np.ldexp(c, -(sa + sb)).astype(np.float16)

    def undone_twice(a, b):  # one input's scale removed twice, the other's not at all
        return _scaled(a, b) * 2.0 ** 3

    for bad, why in ((cast, "scale each input"), (lambda a, b: a @ b, "round the scaled"),
                     (by_max, "powers of two"), (fp16_sums, "the result is fp16, which "
                                                           "overflows: sum in float32"),
                     (undone_twice, r"the result is 2\^3 times the product: undo each")):
        with pytest.raises(check.CheckError, match=why):
            check.check_scaled_gemm(bad, quiet=True)


def test_check_conv2d_fp16():
    def conv16(x, w, stride=1, padding=0):
        r16 = np.float16
        return ref.conv2d(x.astype(r16).astype(np.float64), w.astype(r16).astype(np.float64),
                          stride=stride, padding=padding).astype(np.float32)

    check.check_conv2d_fp16(conv16, quiet=True)
    with pytest.raises(check.CheckError, match="round x and w to fp16"):
        check.check_conv2d_fp16(lambda x, w, stride=1, padding=0: ref.conv2d(
            x, w, stride=stride, padding=padding), quiet=True)

    def int_stride(x, w, stride=1, padding=0):  # fine until a (rows, columns) stride
        return conv16(x, w, stride=int(stride), padding=padding)

    # the learner's exception is the report (the hint's second call used to replace it)
    with pytest.raises(check.CheckError, match=r"raised on x\(.*stride=\(2, 3\).*TypeError"):
        check.check_conv2d_fp16(int_stride, quiet=True)
