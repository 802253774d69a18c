"""Stage checks: a wrong staged tile is caught with the bad element named; right ones pass."""

from __future__ import annotations

import numpy as np
import pytest

import convlab

convlab.setup()

from numba import cuda, float32  # noqa: E402

from convlab import check  # noqa: E402
from convlab.check import CheckError  # noqa: E402

T, MAX_RS = 8, 5
TILE = T + MAX_RS - 1
SHIFT = [0]  # a learner's off-by-one in the halo's column, switched on by the tests


@cuda.jit
def tile_kernel(img, k, out):
    tile = cuda.shared.array((TILE, TILE), float32)
    H, W = img.shape
    R, S = k.shape
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    t = ty * T + tx
    x0 = cuda.blockIdx.x * T - S // 2 + SHIFT[0]
    y0 = cuda.blockIdx.y * T - R // 2
    hi, wi = T + R - 1, T + S - 1
    for i in range(t, hi * wi, T * T):
        r, c = i // wi, i % wi
        gy, gx = y0 + r, x0 + c
        v = float32(0.0)
        if 0 <= gy < H and 0 <= gx < W:
            v = img[gy, gx]
        if not (SHIFT[0] < 0 and r == 2 and c == 3):  # SHIFT -1: one element never staged
            tile[r, c] = v
    cuda.syncthreads()
    row, col = cuda.blockIdx.y * T + ty, cuda.blockIdx.x * T + tx
    if row < H and col < W:
        acc = float32(0.0)
        for r in range(R):
            for s in range(S):
                acc += tile[ty + r, tx + s] * k[r, s]
        out[row, col] = acc


@pytest.fixture
def problem():
    rng = np.random.default_rng(3)
    img = check.random_array((13, 19), rng)
    taps = check.random_array((3, 5), rng)
    expected = check.window(img, (1 * T - 1, 1 * T - 2), (T + 2, T + 4))
    SHIFT[0] = 0
    yield img, taps, np.zeros_like(img), expected
    SHIFT[0] = 0


def stage(img, taps, out, expected, **kw):
    return check.staged_tile(tile_kernel, img, taps, out, grid=(3, 2), block=(T, T),
                             block_idx=(1, 1), array="tile", expected=expected, quiet=True,
                             **kw)


def test_window_pads_with_zeros():
    a = np.arange(12.0).reshape(3, 4)
    w = check.window(a, (-1, 2), (3, 3))
    assert w.tolist() == [[0, 0, 0], [2, 3, 0], [6, 7, 0]]


def test_right_tile_passes(problem):
    assert "all 120 checked elements right" in stage(*problem)


def test_wrong_tile_names_the_bad_element(problem):
    img, taps, out, expected = problem
    SHIFT[0] = 1  # the halo starts one column too far right
    with pytest.raises(CheckError) as e:
        stage(img, taps, out, expected)
    msg = str(e.value)
    assert "shared array 'tile' of block (1, 1) at barrier 1" in msg
    first = [int(v) for v in np.argwhere(~np.isclose(check.window(img, (7, 7), (10, 12)),
                                                      expected))[0]]
    assert f"first bad element {list(first)}: expected {expected[first[0], first[1]]:.6g}, got " \
           f"{img[7 + first[0], 7 + first[1]]:.6g}" in msg
    assert "the value there belongs at" in msg and "map (" in msg


def test_unwritten_element_is_reported(problem):
    img, taps, out, _ = problem
    SHIFT[0] = -1  # one column further left (matched below), and tile[2, 3] never staged
    with pytest.raises(CheckError, match=r"1 of 120 elements wrong \(1 NaN: never written\)"
                                         r"\n  first bad element \[2, 3\]: expected \S+, NaN: "
                                         r"never written(?s:.*)\n      \.\.\.\?\.\.\."):
        stage(img, taps, out, check.window(img, (7, 5), (10, 12)))


def test_barrier_that_is_never_reached(problem):
    with pytest.raises(CheckError, match="reached only 1 cuda.syncthreads"):
        stage(*problem, barrier=2)


BM = BN = 8
BK = 4
TM = TN = 2
NT = (BM // TM) * (BN // TN)
LAST = [True]  # False: the slab loop stops before the last partial slab
TWICE = [False]  # True: two barriers after each slab's staging (one too many)
STAGE_B = [True]  # False: B's slab is never staged


@cuda.jit
def gemm_kernel(a, b, c):
    As = cuda.shared.array((BM, BK), float32)
    Bs = cuda.shared.array((BK, BN), float32)
    M, K = a.shape
    N = b.shape[1]
    tid = cuda.threadIdx.x
    tx, ty = tid % (BN // TN), tid // (BN // TN)
    m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
    acc = cuda.local.array((TM, TN), float32)
    for i in range(TM):
        for j in range(TN):
            acc[i, j] = float32(0.0)
    end = K if LAST[0] else K - K % BK
    for k0 in range(0, end, BK):
        for e in range(tid, BM * BK, NT):
            m, kk = e // BK, e % BK
            v = float32(0.0)
            if m0 + m < M and k0 + kk < K:
                v = a[m0 + m, k0 + kk]
            As[m, kk] = v
        for e in range(tid, BK * BN, NT):
            kk, n = e // BN, e % BN
            v = float32(0.0)
            if k0 + kk < K and n0 + n < N:
                v = b[k0 + kk, n0 + n]
            if STAGE_B[0]:
                Bs[kk, n] = v
        cuda.syncthreads()
        if TWICE[0]:
            cuda.syncthreads()
        for kk in range(BK):
            for i in range(TM):
                for j in range(TN):
                    acc[i, j] += As[ty * TM + i, kk] * Bs[kk, tx * TN + j]
        cuda.syncthreads()
    for i in range(TM):
        for j in range(TN):
            row, col = m0 + ty * TM + i, n0 + tx * TN + j
            if row < M and col < N:
                c[row, col] = acc[i, j]


@pytest.fixture
def gemm():
    rng = np.random.default_rng(5)
    a, b = check.random_array((11, 10), rng), check.random_array((10, 13), rng)
    LAST[0], TWICE[0], STAGE_B[0] = True, False, True
    yield a, b, np.zeros((11, 13), np.float32)
    LAST[0], TWICE[0], STAGE_B[0] = True, False, True


def test_gemm_slab_and_fragment(gemm):
    a, b, c = gemm
    grid = (2, 2)
    # block (1, 0), second slab: rows 0..7 of a, k = 4..7
    check.staged_tile(gemm_kernel, a, b, c, grid=grid, block=NT, block_idx=(1, 0),
                      array="As", expected=check.window(a, (0, 4), (BM, BK)), barrier=3,
                      quiet=True)
    with pytest.raises(CheckError, match=r"'Bs'(?s:.*)first bad element \[0, 0\]"):
        check.staged_tile(gemm_kernel, a, b, c, grid=grid, block=NT, block_idx=(1, 0),
                          array="Bs", expected=check.window(b, (0, 8), (BK, BN)), barrier=3,
                          quiet=True)
    ref = a.astype(np.float64) @ b
    t = 5  # tx 1, ty 1: rows 2..3, columns 8 + 2..3 of block (1, 0)
    check.register_fragment(gemm_kernel, a, b, c, grid=grid, block=NT, block_idx=(1, 0),
                            thread=t, expected=ref[2:4, 10:12], quiet=True)
    LAST[0] = False
    with pytest.raises(CheckError, match=r"local array 'acc' of thread 5 in block \(1, 0\)"):
        check.register_fragment(gemm_kernel, a, b, c, grid=grid, block=NT, block_idx=(1, 0),
                                thread=t, expected=ref[2:4, 10:12], quiet=True)


def test_a_barrier_too_many_is_named_with_the_wrong_slab(gemm):
    """Right staging, one barrier too many per slab: barrier 3 lands on slab 1's products,
    not on slab 2's staging; the report says to count the barriers."""
    a, b, c = gemm
    TWICE[0] = True
    with pytest.raises(CheckError, match=r"(?s)'As' of block \(1, 0\) at barrier 3: .*"
                       r"barrier 3 is the block's 3rd cuda.syncthreads\(\): if the staging looks "
                       r"right, count the barriers per slab"):
        check.staged_tile(gemm_kernel, a, b, c, grid=(2, 2), block=NT, block_idx=(1, 0),
                          array="As", expected=check.window(a, (0, 4), (BM, BK)), barrier=3,
                          quiet=True)


def test_a_fragment_summed_from_an_unstaged_tile_says_so(gemm):
    a, b, c = gemm
    STAGE_B[0] = False
    with pytest.raises(CheckError, match=r"NaN: never written, or summed from a shared element "
                                         r"nobody staged"):
        check.register_fragment(gemm_kernel, a, b, c, grid=(2, 2), block=NT, block_idx=(1, 0),
                                thread=5, expected=(a.astype(np.float64) @ b)[2:4, 10:12],
                                quiet=True)


def test_slab_bounds(gemm):
    a, b, c = gemm
    cfg = dict(grid=(2, 2), block=NT, array="a", expected_loads=2, quiet=True)
    assert "loaded 2 time(s)" in check.slab_bounds(gemm_kernel, a, b, c, **cfg)
    LAST[0] = False
    with pytest.raises(CheckError, match=r"first at \[0, 8\]: expected 2 load\(s\), got 0"
                                         r"(?s:.*)columns 8\.\.9 are never loaded"):
        check.slab_bounds(gemm_kernel, a, b, c, **cfg)


def test_self_check_scores_like_the_grader(capsys):
    ns = {}
    assert check.self_check("x.t", [(2, "y = 1"), (1, "assert y == 1")], ns) == 3
    out = capsys.readouterr().out
    assert "x.t: 3 / 3 points" in out
    # what the grader does differently: only answer cells; host copies only for GPU tasks
    assert "with only your answer cells ('# EXERCISE: ...') run in a fresh copy" in out
    assert "device-to-host" not in out  # a CPU task's tests
    check.self_check("x.g", [(1, "check_gemm(f, device=True) if False else None")], ns)
    assert "refuses device-to-host copies" in capsys.readouterr().out
    assert check.self_check("x.t", [(2, "y = 1"), (1, "assert y == 2, 'y is off'")], ns) == 0
    out = capsys.readouterr().out
    assert "0 / 3 points" in out and "✗ test 2 (1 point): AssertionError: y is off" in out
