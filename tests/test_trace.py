"""convlab.trace: warp requests, sectors, bank conflicts, races, each against a hand count.

Every expected number below is derived in the comment next to it from the access pattern,
not read off the tracer.
"""

import os
import subprocess
import sys
import textwrap

import matplotlib
import numpy as np
import pytest
from numba import cuda, float32

import convlab
from convlab import check, kernels, trace
from convlab import reference as ref
from convlab.kernels._launch import launcher
from convlab.trace import TraceError

matplotlib.use("Agg")
RNG = np.random.default_rng(2024)


def rand(*shape):
    return check.random_array(shape, RNG)


# ----------------------------------------------------------------------------------------
# global memory: coalescing


@cuda.jit
def copy_kernel(a, b):
    i = cuda.grid(1)
    if i < a.size:
        b[i] = a[i]


@cuda.jit
def strided_kernel(a, b, stride):
    i = cuda.grid(1)
    if i < b.size:
        b[i] = a[i * stride]


def test_coalesced_copy_is_4_sectors_per_request():
    n = 1000  # 31 full warps and one warp with 1000 - 992 = 8 threads
    a, b = rand(n), np.full(n, np.nan, np.float32)
    t = trace.trace_launch(copy_kernel, a, b, grid=8, block=128)
    np.testing.assert_array_equal(b, a)  # the traced launch really ran the kernel
    # 32 threads x 4 bytes, consecutive and 128-byte aligned: 4 sectors of 32 bytes.
    full = t.site("a[i]")
    q = t._requests()
    lanes = q["lanes"][q["site"] == full["id"]]
    assert sorted(set(lanes.tolist())) == [8, 32]
    # last warp: 8 threads x 4 bytes = 32 bytes = 1 sector -> mean (31*4 + 1) / 32
    assert t.sectors_per_request("load") == pytest.approx((31 * 4 + 1) / 32)
    assert t.sectors_per_request("store") == pytest.approx((31 * 4 + 1) / 32)
    assert t.ideal_sectors_per_request("load") == pytest.approx((31 * 4 + 1) / 32)
    assert t.efficiency("load") == 1.0
    rows = {r["kind"]: r for r in t.global_stats()}
    assert rows["load"]["requests"] == 32 and rows["load"]["bytes_used"] == 4 * n
    assert rows["load"]["bytes_moved"] == 32 * (31 * 4 + 1)
    assert t.loads_per_output("b") == 1.0


def test_strided_read_is_32_sectors_per_request():
    n, stride = 256, 33  # every thread of a warp reads its own sector; odd stride on purpose
    a, b = rand(n * stride), np.zeros(n, np.float32)
    t = trace.trace_launch(strided_kernel, a, b, stride, grid=2, block=128)
    np.testing.assert_array_equal(b, a[::stride])
    # addresses 132 bytes apart: 32 threads -> 32 different sectors; ideal is still
    # 128 bytes used -> 4 sectors, so 1/8 of the bytes moved are used
    assert t.sectors_per_request("load", array="a") == 32.0
    assert t.ideal_sectors_per_request("load", array="a") == 4.0
    assert t.efficiency("load") == pytest.approx(4 / 32)
    assert t.sectors_per_request("store") == 4.0


def test_misaligned_view_costs_one_more_sector():
    a = rand(300)
    b = np.zeros(256, np.float32)
    # a[1:] starts 4 bytes into the allocation: each 128-byte warp read spans 5 sectors
    t = trace.trace_launch(copy_kernel, a[1:257], b, grid=2, block=128)
    assert t.sectors_per_request("load") == 5.0
    assert t.sectors_per_request("store") == 4.0


@cuda.jit
def reread_kernel(a, b, reps):
    lane = cuda.threadIdx.x % 32
    acc = float32(0.0)
    for _ in range(reps):
        acc += a[lane * 8]  # lanes 32 bytes apart; every warp, every iteration: same sectors
    b[cuda.grid(1)] = acc


def test_after_l1_counts_each_sector_once_per_block():
    a, b = rand(256), np.full(256, np.nan, np.float32)
    t = trace.trace_launch(reread_kernel, a, b, 3, grid=2, block=128)
    np.testing.assert_allclose(b, np.tile(3 * a[::8], 8), rtol=1e-6)
    # each request: 32 lanes, 32 bytes apart -> 32 sectors (the L1 sees 32 per request)
    assert t.sectors_per_request("load", array="a") == 32.0
    # requests: 2 blocks x 4 warps x 3 iterations = 24; distinct sectors per block: the
    # same 32 in every warp and iteration -> 2 x 32 = 64 leave the SMs: 64 / 24 = 8 / 3
    fp = t.cache_footprint(array="a")
    assert (fp["requests"], fp["requested"], fp["per_block"], fp["per_launch"]) == (
        24, 24 * 32, 64, 32)
    assert t.l2_sectors_per_request("load", array="a") == pytest.approx(8 / 3)
    # stores are written through: 8 warps x 4 sectors, all of them go to L2
    assert t.l2_sectors_per_request("store") == t.sectors_per_request("store") == 4.0
    assert t.l2_bytes() == (64 + 8 * 4) * 32
    assert t.conv_flops() is None  # not a conv: compare() then reports no intensity


def test_after_l1_copy_and_strided_read():
    n = 1024
    a, b = rand(n), np.zeros(n, np.float32)
    t = trace.trace_launch(copy_kernel, a, b, grid=8, block=128)
    # per block 128 floats = 512 bytes = 16 sectors, 4 requests: 4 raw and 4 after L1
    assert t.sectors_per_request("load") == 4.0
    assert t.l2_sectors_per_request("load") == 4.0
    n, stride = 256, 33
    a, b = rand(n * stride), np.zeros(n, np.float32)
    t = trace.trace_launch(strided_kernel, a, b, stride, grid=2, block=128)
    # 132 bytes apart: every thread its own sector, nobody else's: 32 raw, 32 after L1
    assert t.sectors_per_request("load", array="a") == 32.0
    assert t.l2_sectors_per_request("load", array="a") == 32.0


# ----------------------------------------------------------------------------------------
# shared memory: bank conflicts


@cuda.jit
def transpose_tile(a, b):
    tile = cuda.shared.array((32, 32), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    tile[ty, tx] = a[ty, tx]
    cuda.syncthreads()
    b[ty, tx] = tile[tx, ty]


@cuda.jit
def transpose_padded(a, b):
    tile = cuda.shared.array((32, 33), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    tile[ty, tx] = a[ty, tx]
    cuda.syncthreads()
    b[ty, tx] = tile[tx, ty]


@cuda.jit
def broadcast_kernel(a, b):
    buf = cuda.shared.array(64, float32)
    tx = cuda.threadIdx.x
    buf[tx] = a[tx]
    cuda.syncthreads()
    one = buf[5]              # every thread the same word: broadcast
    two = buf[(tx % 2) * 32]  # words 0 and 32: both in bank 0
    b[tx] = one + two


def test_transposed_tile_read_is_32_way():
    a = rand(32, 32)
    b = np.zeros_like(a)
    t = trace.trace_launch(transpose_tile, a, b, grid=1, block=(32, 32))
    np.testing.assert_array_equal(b, a.T)
    # warp = one row ty; reading tile[tx, ty] walks a column: word 32*tx + ty, all in bank
    # ty -> 32 distinct words in one bank: 32-way. Writing tile[ty, tx] is a row: 1-way.
    assert t.bank_conflicts(kind="load") == 32.0
    assert t.bank_conflicts(kind="store") == 1.0
    rows = {r["kind"]: r for r in t.shared_stats()}
    assert rows["load"]["max_ways"] == 32 and rows["load"]["wavefronts"] == 32 * 32
    kern = t.shared_stats(by="kernel")[0]
    assert kern["wavefronts"] == 32 * 32 + 32 and kern["ideal"] == 64
    assert t.races() == []


def test_padded_tile_fixes_the_conflict():
    a = rand(32, 32)
    b = np.zeros_like(a)
    t = trace.trace_launch(transpose_padded, a, b, grid=1, block=(32, 32))
    np.testing.assert_array_equal(b, a.T)
    # row length 33: word 33*tx + ty -> bank (tx + ty) % 32, all different: 1-way
    assert t.bank_conflicts(kind="load") == 1.0
    assert t.bank_conflicts() == 1.0


def test_broadcast_is_not_a_conflict_but_two_words_in_a_bank_are():
    a = rand(64)
    b = np.zeros(64, np.float32)
    t = trace.trace_launch(broadcast_kernel, a, b, grid=1, block=64)
    np.testing.assert_allclose(b, a[5] + a[(np.arange(64) % 2) * 32], rtol=1e-6)
    assert t.bank_conflicts(site="buf[5]") == 1.0
    assert t.bank_conflicts(site="buf[(tx % 2) * 32]") == 2.0
    assert t.bank_conflicts(site="buf[tx]") == 1.0


# ----------------------------------------------------------------------------------------
# races


T = 8  # tile width of the filter kernels below (blocks of T x T threads)


@cuda.jit
def tiled_filter_kernel(img, k, out, with_sync):
    tile = cuda.shared.array((T + 4, T + 4), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row0, col0 = cuda.blockIdx.y * T, cuda.blockIdx.x * T
    H, W = img.shape
    R, S = k.shape
    for i in range(ty, T + R - 1, T):
        for j in range(tx, T + S - 1, T):
            r, c = row0 + i - R // 2, col0 + j - S // 2
            tile[i, j] = img[r, c] if 0 <= r < H and 0 <= c < W else float32(0)
    if with_sync:
        cuda.syncthreads()
    row, col = row0 + ty, col0 + tx
    if row < H and col < W:
        acc = float32(0)
        for a in range(R):
            for b in range(S):
                acc += tile[ty + a, tx + b] * k[a, b]
        out[row, col] = acc


def tiled_filter(with_sync):
    @launcher
    def filter2d_tiled(img, k, out):
        H, W = img.shape
        grid = ((W + T - 1) // T, (H + T - 1) // T)
        tiled_filter_kernel[grid, (T, T)](img, k, out, with_sync)

    return filter2d_tiled


def test_missing_syncthreads_is_a_race_and_syncthreads_fixes_it():
    img, k = rand(11, 13), rand(3, 3)
    out = np.full(img.shape, np.nan, np.float32)
    t = trace.trace_launch(tiled_filter(1), img, k, out)
    assert t.races() == []
    np.testing.assert_allclose(out, ref.filter2d(img, k), rtol=1e-5, atol=1e-5)

    t = trace.trace_launch(tiled_filter(0), img, k, np.zeros_like(img))
    races = t.races()
    assert len(races) == 1
    rc = races[0]
    # thread (tx, ty) reads tile[ty + a, tx + b], written by another thread, same interval
    assert rc.hazard == "RAW" and rc.array == "tile" and rc.interval == 0
    assert "tile[i, j]" in rc.first and "tile[ty + a, tx + b]" in rc.second
    assert rc.threads[0] != rc.threads[1]
    assert "shared-memory race (RAW) on tile" in str(rc)
    # every tile element but the one each reader wrote itself is read by another thread
    assert rc.addresses > 50


@pytest.mark.skipif(not convlab.is_simulator(),
                    reason="the checkers trace for races under the simulator only")
def test_check_filter2d_rejects_the_racy_kernel():
    with pytest.raises(check.CheckError, match="(?s)shared-memory race.*missing cuda.syncthreads"):
        check.check_filter2d(tiled_filter(0), quiet=True)
    assert "cases passed" in check.check_filter2d(tiled_filter(1), quiet=True)


@cuda.jit
def every_thread_copies_the_taps(img, k, out):
    taps = cuda.shared.array((5, 5), float32)
    R, S = k.shape
    for a in range(R):  # every thread writes every tap: one line, many writers
        for b in range(S):
            taps[a, b] = k[a, b]
    cuda.syncthreads()
    row = cuda.blockIdx.y * T + cuda.threadIdx.y
    col = cuda.blockIdx.x * T + cuda.threadIdx.x
    H, W = img.shape
    if row < H and col < W:
        acc = float32(0)
        for a in range(R):
            for b in range(S):
                r, c = row + a - R // 2, col + b - S // 2
                if 0 <= r < H and 0 <= c < W:
                    acc += img[r, c] * taps[a, b]
        out[row, col] = acc


@pytest.mark.skipif(not convlab.is_simulator(),
                    reason="the checkers trace for races under the simulator only")
def test_many_writers_of_one_element_get_a_hint_a_barrier_cannot_fix():
    """Right outputs (every writer writes the same value), but a write-write race at one
    line: the hint says one writer per element, not 'missing cuda.syncthreads()'."""
    @launcher
    def filter2d_taps(img, k, out):
        H, W = img.shape
        every_thread_copies_the_taps[((W + T - 1) // T, (H + T - 1) // T), (T, T)](img, k, out)

    with pytest.raises(check.CheckError, match=r"(?s)race \(WAW\) on taps.*hint: several "
                       r"threads write the same element at the same line: a barrier cannot"):
        check.check_filter2d(filter2d_taps, quiet=True)
    with pytest.raises(check.CheckError) as e:  # a race at two different lines: as before
        check.check_filter2d(tiled_filter(0), quiet=True)
    assert "hint: missing cuda.syncthreads()?" in str(e.value)
    assert "several threads write" not in str(e.value)


@cuda.jit
def shared_hist(vals, hist, use_atomic):
    bins = cuda.shared.array(4, float32)
    tx = cuda.threadIdx.x
    if tx < 4:
        bins[tx] = 0
    cuda.syncthreads()
    v = vals[tx]
    if use_atomic:
        cuda.atomic.add(bins, v, 1)
    else:
        bins[v] += 1
    cuda.syncthreads()
    if tx < 4:
        cuda.atomic.add(hist, tx, bins[tx])


def test_atomics_do_not_race_plain_read_modify_write_does():
    vals = RNG.integers(0, 4, 64).astype(np.int64)
    hist = np.zeros(4, np.float32)
    t = trace.trace_launch(shared_hist, vals, hist, 1, grid=1, block=64)
    np.testing.assert_array_equal(hist, np.bincount(vals, minlength=4))
    assert t.races() == []
    assert {r["kind"] for r in t.global_stats()} == {"load", "atomic"}
    t = trace.trace_launch(shared_hist, vals, np.zeros(4, np.float32), 0, grid=1, block=64)
    hazards = {r.hazard for r in t.races()}
    assert hazards and hazards <= {"RAW", "WAR", "WAW"} and "WAW" in hazards


# ----------------------------------------------------------------------------------------
# divergence, device functions, loops, refusals


@cuda.jit
def divergent_kernel(a, b):
    i = cuda.grid(1)
    acc = float32(0)
    for k in range(4):
        if (i + k) % 2 == 0:
            acc += a[k, i]
    b[i] = acc


def test_divergent_threads_are_inactive_not_shifted():
    a, b = rand(4, 64), np.zeros(64, np.float32)
    t = trace.trace_launch(divergent_kernel, a, b, grid=1, block=64)
    np.testing.assert_allclose(b, [sum(a[k, i] for k in range(4) if (i + k) % 2 == 0)
                                   for i in range(64)], rtol=1e-6)
    # per warp and k, the 16 threads with (i + k) even read every other float of a 128-byte
    # row: 16 lanes, 4 sectors, 64 bytes used -> ideal 2; 4 requests per warp, 2 warps.
    # (Grouping by "n-th execution per thread" would give 2 requests of 32 lanes instead.)
    row = t.global_stats()[0]
    assert row["array"] == "a" and row["requests"] == 8
    assert row["threads_per_req"] == 16.0
    assert row["sectors_per_req"] == 4.0 and row["ideal_per_req"] == 2.0


@cuda.jit(device=True)
def fetch(a, i):
    return a[i]


@cuda.jit
def grid_stride_kernel(a, b):
    i = cuda.grid(1)
    while i < a.size:
        if i % 64 == 5:
            i += cuda.gridsize(1)
            continue
        b[i] = fetch(a, i) + fetch(a, i)
        i += cuda.gridsize(1)


def test_device_function_and_while_loop_with_continue():
    n = 1000
    a, b = rand(n), np.zeros(n, np.float32)
    t = trace.trace_launch(grid_stride_kernel, a, b, grid=2, block=64)
    keep = np.arange(n) % 64 != 5
    np.testing.assert_allclose(b[keep], 2 * a[keep], rtol=1e-6)
    # 128 threads, iteration it covers i = 128*it + tid: 8 iterations (the 8th partly).
    # A warp covers 32 consecutive i; the one with i % 64 == 5 skips (continue).
    load = t.site("a[i]")
    assert load["func"] == "fetch"
    q = t._requests()
    m = q["site"] == load["id"]
    # 4 warps x 8 iterations x 2 call sites, minus warp-iterations past the end:
    # iteration 7 covers i = 896..1023: warps with i < 1000 are 896, 928, 960, 992 (all 4)
    assert m.sum() == 4 * 8 * 2
    # lanes: full warps lose the thread with i % 64 == 5 when their range holds one
    expect = []
    for it in range(8):
        for w in range(4):
            idx = [128 * it + 32 * w + L for L in range(32)]
            expect.append(sum(1 for i in idx if i < n and i % 64 != 5))
    assert sorted(q["lanes"][m].tolist()) == sorted(expect * 2)
    assert t.loads_per_output("b") == 2.0


@cuda.jit
def one_line_loop(a, b):
    i = cuda.grid(1)
    s = float32(0)
    for k in range(3): s += a[k, i]  # noqa: E701  (body on the loop's line on purpose)
    b[i] = s


def test_loop_body_on_the_loop_line_is_still_grouped_per_iteration():
    a, b = rand(3, 32), np.zeros(32, np.float32)
    t = trace.trace_launch(one_line_loop, a, b, grid=1, block=32)
    np.testing.assert_allclose(b, a.sum(axis=0), rtol=1e-6)
    assert t.global_stats()[0]["requests"] == 3


@cuda.jit
def divergent_barrier(a):
    tx = cuda.threadIdx.x
    if tx < 16:
        cuda.syncthreads()
    else:
        cuda.syncthreads()
    a[tx] = tx


@cuda.jit
def shuffle_kernel(a):
    a[cuda.threadIdx.x] = cuda.shfl_down_sync(0xFFFFFFFF, a[cuda.threadIdx.x], 1)


def test_refusals_are_loud():
    with pytest.raises(TraceError, match="different cuda.syncthreads"):
        trace.trace_launch(divergent_barrier, np.zeros(32, np.float32), grid=1, block=32)
    with pytest.raises(TraceError, match="shfl_down_sync is not supported"):
        trace.trace_launch(shuffle_kernel, np.zeros(32, np.float32), grid=1, block=32)
    with pytest.raises(TraceError, match="too big to trace"):
        trace.trace_launch(copy_kernel, np.zeros(10, np.float32), np.zeros(10, np.float32),
                           grid=1024, block=1024)
    with pytest.raises(TraceError, match="launched no CUDA kernel"):
        trace.trace_launch(lambda x: x, np.zeros(3))
    t = trace.trace_launch(copy_kernel, rand(64), np.zeros(64, np.float32), grid=1, block=64)
    with pytest.raises(TraceError, match="no array called 'z'.*a, b"):
        t.sectors_per_request(array="z")
    with pytest.raises(TraceError, match="no shared-memory requests"):
        t.bank_conflicts()


def test_kernel_errors_name_the_thread():
    with pytest.raises(IndexError, match=r"tid=\[\d+, 0, 0\] ctaid=\[\d+, 0, 0\]"):
        trace.trace_launch(copy_kernel, np.zeros(100, np.float32), np.zeros(50, np.float32),
                           grid=1, block=128)


# ----------------------------------------------------------------------------------------
# the course's conv kernels


def _conv_trace(launcher_fn, x, w, padding):
    p = ref.conv_params(x.shape, w.shape, padding=padding)
    out = check.poisoned(p.out_shape)
    t = trace.trace_launch(launcher_fn, x, w, out, padding=padding)
    np.testing.assert_allclose(out, ref.conv2d(x, w, padding=padding), rtol=1e-5, atol=1e-5)
    return t


def test_naive_vs_coalesced_conv_sectors_match_the_hand_count():
    x, w = rand(1, 1, 32, 64), rand(1, 1, 3, 3)
    naive = _conv_trace(kernels.conv2d_naive, x, w, 1)
    coal = _conv_trace(kernels.conv2d_coalesced, x, w, 1)
    # naive: a warp is 32 output rows p of one column q; each (r, s) tap reads one float
    # from 32 different rows (256 bytes apart) -> one sector per active thread. Rows
    # h = p - 1 + r: r = 0 loses p = 0, r = 2 loses p = 31 -> (31 + 32 + 31) / 3 sectors.
    assert naive.sectors_per_request("load", array="x") == pytest.approx(94 / 3)
    assert naive.ideal_sectors_per_request("load", array="x") == 4.0  # 124 or 128 bytes
    # coalesced: a warp is 32 neighbouring columns q = 32j..32j+31 of one row; tap s reads
    # columns q - 1 + s. s=0: j=0 -> cols 0..30 (bytes 0..123, 4 sectors), j=1 -> cols
    # 31..62 (bytes 124..251, 5 sectors); s=1: 4 and 4; s=2: j=0 -> cols 1..32 (5),
    # j=1 -> cols 33..63 (4). Every (j, r, s) occurs equally often -> 26 / 6 = 13 / 3.
    assert coal.sectors_per_request("load", array="x") == pytest.approx(13 / 3)
    # the filter weight is the same address for the whole warp: 1 sector
    assert naive.sectors_per_request("load", array="w") == 1.0
    assert coal.sectors_per_request("load", array="w") == 1.0
    # stores: 32 rows -> 32 sectors, vs 32 consecutive floats -> 4
    assert naive.sectors_per_request("store", array="out") == 32.0
    assert coal.sectors_per_request("store", array="y") == 4.0
    ratio = naive.sectors_per_request("load", array="x") / coal.sectors_per_request(
        "load", array="x")
    assert ratio == pytest.approx(94 / 13)
    # cache footprints of x: the whole launch touches all 32 rows x 256 bytes = 256 sectors
    # either way. Blocks are 128 threads along the flat pixel index, 16 blocks. Coalesced:
    # block b is rows 2b, 2b+1 (64 columns each); it reads rows 2b-1..2b+2 clipped (3 at
    # the two edges, 4 in between) of 8 sectors each: 8 * (2*3 + 14*4) = 496. Naive: block
    # b is columns 4b..4b+3 (32 rows each); it reads columns 4b-1..4b+4 clipped of all 32
    # rows: 1 sector a row at the two edges, 2 in between: 32 * (2*1 + 14*2) = 960.
    fc, fn = coal.cache_footprint(array="x"), naive.cache_footprint(array="x")
    assert fc["per_launch"] == fn["per_launch"] == 256
    assert fc["per_block"] == 496 and fn["per_block"] == 960
    assert fn["requested"] == pytest.approx(fn["requests"] * 94 / 3)
    # loads per output: taps inside the image, summed: rows (3*32 - 2) x cols (3*64 - 2)
    for t in (naive, coal):
        assert t.loads_per_output("out", array="x") == pytest.approx(94 * 190 / (32 * 64))
        assert t.reuse("x") == pytest.approx(94 * 190 / (32 * 64))
        # element (h, c) is read by (valid r) x (valid s) outputs: 3 inside, 2 on an edge
        cr = np.r_[2, np.full(30, 3), 2]
        cc = np.r_[2, np.full(62, 3), 2]
        np.testing.assert_array_equal(t.load_counts("x")[0, 0], np.outer(cr, cc))


def test_compare_naive_vs_coalesced_conv_after_l1():
    x, w = rand(1, 1, 32, 64), rand(1, 1, 3, 3)
    naive = _conv_trace(kernels.conv2d_naive, x, w, 1)
    coal = _conv_trace(kernels.conv2d_coalesced, x, w, 1)
    # x load requests. Naive: 64 warps, one per column q (32 rows each); a tap (r, s)
    # with no valid thread is no request: r always has valid rows, s = 0 is outside for
    # q = 0 and s = 2 for q = 63 -> 62 * 9 + 2 * 6 = 570. Coalesced: 64 warps (32 rows x
    # 2 halves of 32 columns); r = 0 is outside for row 0, r = 2 for row 31 -> 564.
    # Per-block distinct sectors (hand count in the test above): 960 and 496.
    assert naive.cache_footprint(array="x")["requests"] == 570
    assert coal.cache_footprint(array="x")["requests"] == 564
    assert naive.l2_sectors_per_request("load", array="x") == pytest.approx(960 / 570)
    assert coal.l2_sectors_per_request("load", array="x") == pytest.approx(496 / 564)
    # after-L1 bytes, all arrays: x as above; w is 36 bytes = 2 sectors, every one of the
    # 16 blocks uses all 9 taps -> 32; stores: 64 warps x 32 sectors (naive) or x 4
    assert naive.l2_bytes() == (960 + 32 + 64 * 32) * 32
    assert coal.l2_bytes() == (496 + 32 + 64 * 4) * 32
    flops = 2 * 32 * 64 * 9
    assert naive.conv_flops() == coal.conv_flops() == flops
    c = trace.compare(naive, coal, names=("naive", "coalesced"), array="x")
    assert c.raw_ratio == pytest.approx(94 / 13)
    assert c.l2_ratio == pytest.approx((960 / 570) / (496 / 564))
    assert c.raw_ratio > c.l2_ratio > 1  # naive worse on both, L1 absorbs most of it
    assert c.intensity == pytest.approx((flops / ((960 + 32 + 2048) * 32),
                                         flops / ((496 + 32 + 256) * 32)))
    text = str(c)
    assert "naive / coalesced: 7.23x" in text and "1.92x the sectors after L1" in text
    assert "memory-bound" in text and "<pre>" in c._repr_html_()
    assert c.as_dict()["rows"][0]["load_requests"] == 570
    # explicit FLOP counts override the conv formula; a non-conv trace has no intensity
    assert trace.compare(naive, coal, flops=(1, 2)).intensity == (
        1 / naive.l2_bytes(), 2 / coal.l2_bytes())


def test_pictures_and_text():
    x, w = rand(1, 2, 9, 40), rand(3, 2, 3, 3)
    t = _conv_trace(kernels.conv2d_coalesced, x, w, 1)
    fig = t.plot_warp(site="x[", warp=0)
    title = fig.axes[0].get_title()
    # first execution of warp 0 (row p = 0): tap r = 0 is outside the image, so the first
    # is r = 1, s = 0: columns -1..30, lane 0 inactive, 31 floats = 124 bytes in 4 sectors
    assert "4 sectors for 124 bytes used" in title
    assert len(fig.axes[0].collections[0].get_offsets()) == 31
    fig = t.heatmap("x", index=(0, 1))
    # an inner element is read by 9 taps of each of the K = 3 filters; a corner by 4 x 3
    assert "min 12, max 27" in fig.axes[0].get_title()
    a = rand(32, 32)
    ts = trace.trace_launch(transpose_tile, a, np.zeros_like(a), grid=1, block=(32, 32))
    fig = ts.plot_warp(site="tile[tx, ty]", warp=3)
    assert "32-way bank conflict" in fig.axes[0].get_title()
    text = str(t)
    assert "sectors per request" in text and "races: none" in text
    assert "<pre>" in t._repr_html_()
    assert "sectors_per_req" in str(t.global_stats())
    with pytest.raises(TraceError, match="matches several sites"):
        t.site("[")


def test_device_arrays_are_traced_and_written_back():
    c = kernels._runtime.cuda()
    x, w = rand(1, 2, 7, 9), rand(2, 2, 3, 3)
    out = c.to_device(check.poisoned((1, 2, 7, 9)))
    t = trace.trace_launch(kernels.conv2d_naive, c.to_device(x), c.to_device(w), out, padding=1)
    np.testing.assert_allclose(out.copy_to_host(), ref.conv2d(x, w, padding=1), rtol=1e-5,
                               atol=1e-5)
    assert {a.name for a in t.arrays} == {"x", "w", "y"}
    assert t.array("out").name == "y"


def test_tracing_a_64x64_conv_records_every_thread():
    x, w = rand(1, 1, 64, 64), rand(1, 1, 3, 3)
    t = _conv_trace(kernels.conv2d_coalesced, x, w, 1)
    assert t.launches[0]["threads"] == 64 * 64


# ----------------------------------------------------------------------------------------
# the GPU-mode path (numba's real CUDA target imported; no GPU needed to trace)


GPU_MODE_SCRIPT = textwrap.dedent("""
    import numpy as np, convlab
    assert convlab.setup() == "gpu"
    from numba import cuda, float32
    from numba.cuda.dispatcher import CUDADispatcher
    from convlab import kernels, trace

    @cuda.jit
    def transpose_tile(a, b):
        tile = cuda.shared.array((32, 32), float32)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        tile[ty, tx] = a[ty, tx]
        cuda.syncthreads()
        b[ty, tx] = tile[tx, ty]

    assert isinstance(transpose_tile, CUDADispatcher)
    a = np.arange(1024, dtype=np.float32).reshape(32, 32); b = np.zeros_like(a)
    t = trace.trace_launch(transpose_tile, a, b, grid=1, block=(32, 32))
    assert (b == a.T).all() and t.bank_conflicts(kind="load") == 32.0
    assert transpose_tile.py_func.__globals__["cuda"] is cuda  # globals restored
    x = np.ones((1, 1, 32, 64), np.float32); w = np.ones((1, 1, 3, 3), np.float32)
    out = np.zeros((1, 1, 32, 64), np.float32)
    n = trace.trace_launch(kernels.conv2d_naive, x, w, out, padding=1)
    c = trace.trace_launch(kernels.conv2d_coalesced, x, w, out, padding=1)
    print("RATIO", n.sectors_per_request(array="x") / c.sectors_per_request(array="x"))
""")


def test_tracer_runs_where_numba_chose_the_real_gpu():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["CONVLAB_MODE"] = "gpu"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", GPU_MODE_SCRIPT], env=env, cwd=root,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    ratio = float(r.stdout.split("RATIO")[1])
    assert ratio == pytest.approx(94 / 13)


# ----------------------------------------------------------------------------------------
# the loop-iteration counter itself, on plain Python (for, nested, one-line, while with
# continue, while True with break), with thread-dependent divergence


_PROBES: list = []


def _probe(*true_iteration):
    f = sys._getframe(1)
    st = f.f_trace.state
    enc = st.info.enclosing[f.f_lasti]
    _PROBES.append((f.f_lasti, tuple(st.counters[k] for k in enc), true_iteration))


def _loops(tid):
    for i in range(3):
        if (i + tid) % 2 == 0:
            _probe(0, i)
        for j in range(2):
            if (tid + j) % 3 != 0:
                _probe(1, i, j)
    for k in range(4): _probe(2, k)  # noqa: E701
    n, it = tid, 0
    while n < 10:
        if n % 3 == 1:
            n += 2
            it += 1
            continue
        _probe(3, it)
        n += 2
        it += 1
    m = 0
    while True:
        m += 1
        if m > 2 + tid % 2:
            break
        _probe(4, m)


def test_loop_counters_name_the_same_iteration_in_every_thread():
    from convlab.trace._engine import CodeInfo, FrameState

    info = CodeInfo(_loops.__code__, True)
    assert info.nloops == 5

    def start(frame, event, arg):
        return FrameState(info).start(frame) if frame.f_code is _loops.__code__ else None

    key_to_iteration: dict = {}
    for tid in range(6):  # each "thread" skips different iterations
        _PROBES.clear()
        old = sys.gettrace()
        sys.settrace(start)
        try:
            _loops(tid)
        finally:
            sys.settrace(old)
        keys = [(o, c) for o, c, _ in _PROBES]
        assert len(set(keys)) == len(keys)  # one key per dynamic instance
        for o, c, true in _PROBES:
            assert key_to_iteration.setdefault((o, c), true) == true
    assert len(key_to_iteration) == 3 + 6 + 4 + 5 + 3  # every (site, iteration) seen


def test_one_access_is_one_site_after_the_interpreter_specializes():
    """From Python 3.12 a specialized subscript reports f_lasti inside its inline caches:
    the first execution and the later ones must still be one site, one request stream."""
    from convlab.kernels import conv2d_naive

    rng = np.random.default_rng(3)
    x, w = check.random_array((1, 2, 16, 32), rng), check.random_array((2, 2, 3, 3), rng)
    t = trace.trace_launch(conv2d_naive, cuda.to_device(x), cuda.to_device(w),
                           cuda.to_device(np.zeros((1, 2, 16, 32), np.float32)), padding=1)
    labels = [s["label"] for s in t.sites]
    assert len(labels) == 3, labels  # x load, w load, y store
    assert labels[2].endswith("y[uint32(((n * K + k) * P + p) * Q + q)]")


def test_unrolled_kernels_keep_their_array_names():
    """`_blocking.unrolled` registers the rewritten source with linecache, so the tracer
    names conv05's shared arrays (As, Bs) instead of 'shared@<line>'."""
    from numba import cuda

    from convlab import check
    from convlab.kernels import conv05_implicit_gemm as c5

    rng = np.random.default_rng(3)
    xs = cuda.to_device(check.random_array((1, 5, 6, 7), rng))
    ws = cuda.to_device(check.random_array((9, 5, 3, 3), rng))
    ys = cuda.device_array((1, 9, 6, 7), np.float32)
    t = trace.trace_launch(c5.conv2d_implicit_gemm, xs, ws, ys, padding=1)
    names = {r["array"] for r in t.shared_stats()}
    assert {"As", "Bs"} <= names, names
    assert not any(n.startswith("shared@") for n in names)
