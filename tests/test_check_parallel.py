"""convlab.check.parallel: a store that every iteration of a prange loop shares is found in
the source, and the array checkers fail a CPU answer that has one, whatever its numbers."""

import numpy as np
import pytest
from numba import njit, prange

from convlab import check
from convlab.check.parallel import races_in_source


def test_stores_that_do_not_depend_on_the_prange_variable_are_races():
    rows = """
def f(A, B, C):
    for i in prange(M):
        for k in range(K):
            a = A[i, k]
            for j in range(N):
                C[i, j] += a * B[k, j]
"""
    assert races_in_source(rows) == []
    reduction = rows.replace("for i in prange(M):\n        for k in range(K):",
                             "for k in prange(K):\n        for i in range(M):")
    assert races_in_source(reduction) == [
        "line 7: `C[i, j] += a * B[k, j]` inside `for k in prange(...)`"]
    # names computed from the variable, ranges from them, and the body's own arrays: fine
    assert races_in_source("""
def f(x, out, bounds):
    for t in prange(T):
        lo, hi = bounds[t]
        tmp = np.zeros(3)
        for i in range(lo, hi):
            tmp[0] = x[i]
            out[i] = tmp[0]
""") == []
    # a scratch array shared by every iteration, and a scalar reduction (supported)
    assert races_in_source("""
def f(x, out):
    scratch = np.zeros(W)
    total = 0.0
    for i in prange(H):
        for j in range(W):
            scratch[j] = x[i, j]
        total += x[i, 0]
        out[i] = scratch.sum()
""") == ["line 7: `scratch[j] = x[i, j]` inside `for i in prange(...)`"]


@njit(parallel=True)
def _gemm_k_parallel(A, B, C):
    for k in prange(A.shape[1]):
        for i in range(A.shape[0]):
            for j in range(B.shape[1]):
                C[i, j] += A[i, k] * B[k, j]


@njit(parallel=True)
def _gemm_rows(A, B, C):
    for i in prange(A.shape[0]):
        for k in range(A.shape[1]):
            for j in range(B.shape[1]):
                C[i, j] += A[i, k] * B[k, j]


def test_the_checker_fails_a_racy_parallel_answer_through_its_wrapper():
    """The race rarely shows in the numbers on small cases; the source always shows it."""
    def racy(A, B):
        C = np.zeros((A.shape[0], B.shape[1]), np.float32)
        _gemm_k_parallel(A, B, C)
        return C

    def rows(A, B):
        C = np.zeros((A.shape[0], B.shape[1]), np.float32)
        _gemm_rows(A, B, C)
        return C

    with pytest.raises(check.CheckError, match=r"gemm FAILED: a race between the iterations of "
                       r"a prange loop: line \d+: `C\[i, j\] \+= A\[i, k\] \* B\[k, j\]` inside "
                       r"`for k in prange\(...\)`"):
        check.check_gemm(racy, device=False, quiet=True)
    assert "cases passed" in check.check_gemm(rows, device=False, quiet=True)


def test_check_uses_reads_the_function_and_what_it_calls():
    def fft_filter(img, k):
        return _via_fft(img, k)

    def direct_filter(img, k):
        return img * k.sum()

    assert "uses NumPy's FFT" in check.check_uses(fft_filter, r"\bfft\.", "NumPy's FFT",
                                                  quiet=True)
    with pytest.raises(check.CheckError, match=r"direct_filter \(and the functions it calls: "
                       r"direct_filter\) does not use NumPy's FFT, which the task asks for"):
        check.check_uses(direct_filter, r"\bfft\.", "NumPy's FFT", quiet=True)
    # a CPU GEMM with a prange loop in its Numba helper; A @ B has none
    assert "uses a prange loop" in check.check_uses(
        lambda A, B: _gemm_rows(A, B, None), r"\bprange\s*\(", "a prange loop", quiet=True)
    with pytest.raises(check.CheckError, match="does not use a prange loop"):
        check.check_uses(lambda A, B: A @ B, r"\bprange\s*\(", "a prange loop", quiet=True)


def _via_fft(img, k):
    return np.fft.irfft2(np.fft.rfft2(img) * np.fft.rfft2(k, img.shape), img.shape)


def test_a_graded_call_reads_the_source_the_learners_process_sent():
    """In grading the function is the grader's stand-in; its sources came from describe()."""
    from convlab.grading.remote import RemoteFunction

    racy = ("def g(A, B, C):\n    for k in prange(K):\n        for i in range(M):\n"
            "            C[i, 0] += A[i, k]\n")
    stand_in = RemoteFunction(None, "gemm_parallel", {"name": "gemm_parallel", "params": [
        ["A", 1, None], ["B", 1, None]], "sources": {"gemm_parallel": "def gemm_parallel(A, B):"
                                                     "\n    return g(A, B)\n", "g": racy}})
    assert check.prange_races(stand_in) == [
        "line 4: `C[i, 0] += A[i, k]` inside `for k in prange(...)`"]
    assert "uses a prange loop" in check.check_uses(stand_in, r"\bprange\s*\(", "a prange loop",
                                                    quiet=True)
    with pytest.raises(check.CheckError, match="a race between the iterations of a prange"):
        check.check_gemm(stand_in, device=False, quiet=True)
