"""convlab.check.values: the checkers of number and split answers (lessons 00, 03)
pass right answers and fail planted mistakes.
"""

import numpy as np
import pytest

from convlab import check


def _fails(checker, fn, *words):
    with pytest.raises(check.CheckError) as e:
        checker(fn, quiet=True)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_roofline():
    assert "10 cases" in check.check_roofline(lambda ai, p, b: min(p, ai * b), quiet=True)
    _fails(check.check_roofline, lambda ai, p, b: ai * b, "intensity × bandwidth")
    _fails(check.check_roofline, lambda ai, p, b: p, "below the ridge")
    _fails(check.check_roofline, lambda ai, p, b: None, "not implemented")
    _fails(check.check_roofline, lambda ai, p, b: float("nan"), "returned nan")
    _fails(check.check_roofline, lambda ai, p, b: 1 / 0, "ZeroDivisionError")


def test_gemm_intensity():
    def right(M, N, K, itemsize=4):
        return 2 * M * N * K / ((M * K + K * N + M * N) * itemsize)

    check.check_gemm_intensity(right, quiet=True)
    _fails(check.check_gemm_intensity, lambda M, N, K, itemsize=4: right(M, N, K, 4), "itemsize=2")
    _fails(check.check_gemm_intensity,
           lambda M, N, K, itemsize=4: 2 * M * N * K / ((M * K + K * N) * itemsize), "expected")


def test_crossover():
    def stays(b, c, g):
        res = None
        for bb, cc, gg in zip(b[::-1], c[::-1], g[::-1], strict=True):
            if gg < cc:
                res = int(bb)
            else:
                break
        return res

    def first_win(b, c, g):
        return next((int(bb) for bb, cc, gg in zip(b, c, g, strict=True) if gg < cc), None)

    check.check_crossover(stays, quiet=True)
    _fails(check.check_crossover, first_win, "stays faster")
    _fails(check.check_crossover, lambda b, c, g: int(b[0]), "expected")


def test_partition():
    def fair(n, w):
        return [(int(a[0]), int(a[-1]) + 1) for a in np.array_split(np.arange(n), min(n, w))]

    check.check_partition(fair, quiet=True)
    check.check_partition(lambda n, w: [slice(a, b) for a, b in fair(n, w)], quiet=True)
    check.check_partition(lambda n, w: [range(a, b) for a, b in fair(n, w)], quiet=True)
    _fails(check.check_partition, lambda n, w: [(0, n)] * w, "more than once")
    _fails(check.check_partition, lambda n, w: [(i * (n // w), (i + 1) * (n // w))
                                                for i in range(w)], "never be done")
    _fails(check.check_partition, lambda n, w: [(0, n - (w - 1))] + [
        (n - (w - 1) + i, n - (w - 1) + i + 1) for i in range(w - 1)], "differ by more")
    _fails(check.check_partition, lambda n, w: fair(n, w)[::-1], "not in order")
    # float bounds: a slice would refuse them, so does the checker (int() truncated them)
    _fails(check.check_partition, lambda n, w: [(i * n / min(n, w), (i + 1) * n / min(n, w))
                                                for i in range(min(n, w))],
           "cannot be interpreted as an integer")
    _fails(check.check_partition, lambda n, w: [(0, n)], "non-empty parts")
