"""The one-launch implicit GEMM for small convs (convlab/kernels/flat_igemm_cuda.py).

Without a GPU: the CUDA C runs on the CPU (tests/_emulate.py) for every tile and both
modes (1x1 rows of x, gathered (c, r, s) columns), on shapes that are not multiples of
any tile (C, K, P*Q odd; several filter tiles; several split parts; stride 2), outputs
and split workspace poisoned with NaN, against float64; the split-K sum is the same bit
for bit whichever part finishes last (blocks also run in reverse order), and leaves its
counters at zero for the next launch; the float4 paths and their scalar fallbacks agree;
the reduction sliced among 2 or 4 thread groups per block (KS) agrees with KS = 1 within
fp32 rounding and with itself bit for bit.
The tile rule and `conv_cuda.choose_algorithm` are pinned on ResNet-50's layers. On a GPU
(marked gpu): the launcher and `conv_cuda.conv2d_cuda` against the reference.
"""

from __future__ import annotations

import ctypes
import re
import shutil

import numpy as np
import pytest

from convlab import check, problems
from convlab import reference as ref
from convlab.kernels import Unsupported, conv_cuda
from convlab.kernels import flat_igemm_cuda as F

from ._emulate import assert_close_to_reference, build_cpu_library
from ._nvrtc import nvrtc_available

WRAPPER = r"""
template <typename Body>
void run_grid_reversed(unsigned gx, unsigned gy, unsigned gz, unsigned nt, Body body) {
    gridDim = {gx, gy, gz}; blockDim = {nt, 1, 1};
    for (int bz = gz - 1; bz >= 0; --bz) for (int by = gy - 1; by >= 0; --by)
    for (int bx = gx - 1; bx >= 0; --bx) {
        std::barrier<> bar(nt); g_block_bar = &bar;
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < nt; ++t) ts.emplace_back([=] {
            threadIdx = {t, 0, 0}; blockIdx = {(unsigned)bx, (unsigned)by, (unsigned)bz};
            body(); });
        for (auto& t : ts) t.join();
    }
}
#define RUN(BM_, BN_, MODE_, KS_) if (bm == BM_ && bn == BN_ && mode == MODE_ && ks == KS_) { \
    auto body = [=] { flat_igemm<BM_, BN_, MODE_, KS_>(x, w, y, ws, cnt, a[0], a[1], a[2], \
        a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], \
        a[16]); }; \
    if (reversed) run_grid_reversed(gx, gy, gz, nt, body); else run_grid(gx, gy, gz, nt, body); \
    return 0; }
#define RUN_KS(BM_, BN_, MODE_) RUN(BM_, BN_, MODE_, 1) RUN(BM_, BN_, MODE_, 2) \
    RUN(BM_, BN_, MODE_, 4)
extern "C" void run_subsample(unsigned gx, unsigned nt, const float* x, float* xs,
                              const int* a) {
    run_grid(gx, 1, 1, nt, [=] { flat_subsample(x, xs, a[0], a[1], a[2], a[3], a[4], a[5],
                                                a[6]); });
}
extern "C" int run_flat(int bm, int bn, int mode, int ks, int reversed, unsigned gx,
                        unsigned gy, unsigned gz, unsigned nt, const float* x, const float* w,
                        float* y, float* ws, int* cnt, const int* a) {
    RUN_KS(64, 64, 0) RUN_KS(64, 64, 1) RUN_KS(32, 64, 0) RUN_KS(32, 64, 1)
    RUN_KS(32, 32, 0) RUN_KS(32, 32, 1)
    return 1;
}
"""


@pytest.fixture(scope="module")
def lib():
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    return build_cpu_library(F.SOURCE_PATH.read_text() + WRAPPER)


def run_on_cpu(lib, x, w, kw, tile, flags=None, reversed=False, ws_fill=np.nan):
    """One launch of the kernel on the CPU: (out, workspace, counters) after it."""
    p = ref.conv_params(x.shape, w.shape, **kw)
    a = F.plan_args(p, tile)
    if flags is None:
        flags = 1 * a["a_vec"] | 2 * a["b_vec"] | 4 * a["y_vec"]
    out = check.poisoned(p.out_shape)
    ws = np.full(max(1, a["parts"] * a["n_out"]), ws_fill, np.float32)
    cnt = np.zeros(a["tiles"], np.int32)
    args = np.array([*a["ints"], flags], np.int32)
    ptr = [ctypes.c_void_p(v.ctypes.data) for v in (x, w, out, ws, cnt, args)]
    assert a["block"] == (tile.threads,)
    rc = lib.run_flat(tile.BM, tile.BN, a["mode"], tile.KS, int(reversed), *a["grid"],
                      tile.threads, *ptr)
    assert rc == 0
    return out, ws, cnt


SHAPES = [  # x, w, kwargs: nothing a multiple of a tile
    ((2, 37, 7, 7), (70, 37, 1, 1), {}),               # P*Q = 49, C*R*S % 4 != 0: scalar
    ((1, 40, 6, 10), (33, 40, 1, 1), {}),              # P*Q % 4 == 0, C % 4 == 0: float4
    ((2, 24, 9, 11), (20, 24, 1, 1), dict(stride=2)),  # strided rows of x
    ((1, 3, 13, 11), (10, 3, 7, 7), dict(stride=2, padding=3)),  # the stem's kind
    ((1, 5, 9, 8), (9, 5, 3, 2), dict(stride=(1, 2), padding=(1, 0), dilation=(2, 1))),
    ((2, 4, 9, 8), (6, 4, 3, 3), dict(padding=1)),     # gathered, filter rows as float4
]


@pytest.mark.parametrize("tile", F.TILES, ids=str)
@pytest.mark.parametrize("shape, wshape, kw", SHAPES)
def test_kernel_on_the_cpu(lib, tile, shape, wshape, kw):
    rng = np.random.default_rng(sum(shape) + tile.BM + tile.BN)
    x, w = check.random_array(shape, rng), check.random_array(wshape, rng)
    out, _, _ = run_on_cpu(lib, x, w, kw, tile)
    assert_close_to_reference(out, x, w, **kw)


SPLIT_SHAPES = [
    ((2, 75, 7, 7), (70, 75, 1, 1), {}),                # 5 slabs, the last partial
    ((1, 80, 6, 10), (33, 80, 1, 1), {}),               # float4 loads and sums
    ((2, 72, 9, 11), (20, 72, 1, 1), dict(stride=2)),
    ((1, 3, 13, 11), (10, 3, 7, 7), dict(stride=2, padding=3)),  # 10 slabs of (c, r, s)
]


@pytest.mark.parametrize("tile", [F.Tile(32, 32, 3), F.Tile(64, 64, 2), F.Tile(32, 64, 5)],
                         ids=str)
@pytest.mark.parametrize("shape, wshape, kw", SPLIT_SHAPES)
def test_split_reduction_is_reproducible(lib, tile, shape, wshape, kw):
    rng = np.random.default_rng(7 + tile.SPLIT)
    x, w = check.random_array(shape, rng), check.random_array(wshape, rng)
    p = ref.conv_params(x.shape, w.shape, **kw)
    assert F.plan_args(p, tile)["parts"] > 1
    out, ws, cnt = run_on_cpu(lib, x, w, kw, tile)
    assert_close_to_reference(out, x, w, **kw)
    assert not cnt.any()  # every tile's counter is back at zero for the next launch
    again, _, cnt2 = run_on_cpu(lib, x, w, kw, tile, reversed=True)  # other parts last
    assert np.array_equal(out, again) and not cnt2.any()
    parts = F.plan_args(p, tile)["parts"]
    want = ws.reshape(parts, -1)[0].copy()
    for z in range(1, parts):
        want += ws.reshape(parts, -1)[z]
    assert np.array_equal(out.ravel(), want)  # the slices added in the order 0, 1, 2...


@pytest.mark.parametrize("tile", [F.Tile(64, 64), F.Tile(32, 32, 2)], ids=str)
def test_float4_paths_match_the_scalar_ones(lib, tile):
    x, w, kw = SHAPES[1]
    rng = np.random.default_rng(11)
    x, w = check.random_array(x, rng), check.random_array(w, rng)
    fast, _, _ = run_on_cpu(lib, x, w, kw, tile)
    slow, _, _ = run_on_cpu(lib, x, w, kw, tile, flags=0)
    assert_close_to_reference(slow, x, w)
    assert np.array_equal(fast, slow)


SLICED_SHAPES = [  # x, w, kwargs: L not a multiple of BK * KS
    ((2, 37, 7, 7), (70, 37, 1, 1), {}),               # P*Q = 49, L = 37: scalar loads
    ((1, 40, 6, 10), (33, 40, 1, 1), {}),              # float4 loads and stores
    ((1, 3, 5, 7), (9, 3, 1, 1), {}),                  # L = 3: groups 1.. get no rows
    ((2, 24, 9, 11), (20, 24, 1, 1), dict(stride=2)),  # strided rows of x
    ((2, 4, 9, 8), (6, 4, 3, 3), dict(padding=1)),     # 3x3 padded: gathered (MODE 1)
    ((1, 3, 13, 11), (10, 3, 7, 7), dict(stride=2, padding=3)),  # 10 slabs of (c, r, s)
]


def _sliced_case(shape, wshape, kw, seed):
    rng = np.random.default_rng(seed)
    x, w = check.random_array(shape, rng), check.random_array(wshape, rng)
    return x, w, check.reference_case(x, w, **kw)


def _assert_like_one_group(lib, x, w, kw, case, tile, out):
    """out (tile's KS) is within fp32 rounding of the same tile with KS = 1, and the same
    bit for bit when the blocks run in the other order."""
    one, _, _ = run_on_cpu(lib, x, w, kw, F.Tile(tile.BM, tile.BN, tile.SPLIT))
    comp = check.compare(out, one, case["absref"], rtol=1e-5)
    assert comp.ok, comp.summary()
    again, _, _ = run_on_cpu(lib, x, w, kw, tile, reversed=True)
    assert np.array_equal(out, again)


@pytest.mark.parametrize("bm, bn, ks", [(t.BM, t.BN, t.KS) for t in F.KERNELS if t.KS > 1])
@pytest.mark.parametrize("shape, wshape, kw", SLICED_SHAPES)
def test_sliced_reduction_on_the_cpu(lib, ks, bm, bn, shape, wshape, kw):
    x, w, case = _sliced_case(shape, wshape, kw, sum(shape) + ks + bm + bn)
    tile = F.Tile(bm, bn, 1, ks)
    out, _, _ = run_on_cpu(lib, x, w, kw, tile)
    assert_close_to_reference(out, x, w, **kw)
    _assert_like_one_group(lib, x, w, kw, case, tile, out)


@pytest.mark.parametrize("tile", [F.Tile(32, 32, 3, 2), F.Tile(32, 32, 2, 4),
                                  F.Tile(64, 64, 2, 2), F.Tile(32, 64, 2, 4)], ids=str)
@pytest.mark.parametrize("shape, wshape, kw", [SPLIT_SHAPES[0], SPLIT_SHAPES[1],
                                               SPLIT_SHAPES[3]])
def test_sliced_and_split_reduction(lib, tile, shape, wshape, kw):
    x, w, case = _sliced_case(shape, wshape, kw, 13 + tile.KS)
    p = ref.conv_params(x.shape, w.shape, **kw)
    parts = F.plan_args(p, tile)["parts"]
    assert parts > 1
    out, ws, cnt = run_on_cpu(lib, x, w, kw, tile)
    assert_close_to_reference(out, x, w, **kw)
    assert not cnt.any()
    want = ws.reshape(parts, -1)[0].copy()
    for z in range(1, parts):
        want += ws.reshape(parts, -1)[z]
    assert np.array_equal(out.ravel(), want)  # each part's slice written by group 0
    _assert_like_one_group(lib, x, w, kw, case, tile, out)


def test_sliced_float4_paths_match_the_scalar_ones(lib):
    x, w, kw = SHAPES[1]
    rng = np.random.default_rng(17)
    x, w = check.random_array(x, rng), check.random_array(w, rng)
    for tile in (F.Tile(32, 32, 1, 4), F.Tile(64, 64, 2, 2)):
        fast, _, _ = run_on_cpu(lib, x, w, kw, tile)
        slow, _, _ = run_on_cpu(lib, x, w, kw, tile, flags=0)
        assert np.array_equal(fast, slow), tile


@pytest.fixture(scope="module", params=[1, 3, 5], ids=lambda d: f"prefetch{d}")
def lib_prefetch(request):
    """The kernels with PREFETCH = 1, 3 or 5 slabs' loads in flight (the default is 2; 5
    is the rule's for long parts)."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    return build_cpu_library(f"#define PREFETCH {request.param}\n"
                             + F.SOURCE_PATH.read_text() + WRAPPER)


def test_prefetch_rule():
    """Deep (5 slabs) only for parts of 16 slabs or more; on ResNet-50's batch-1 1x1 layers
    that is every part of 256 input channels or more (16 slabs of 16). Fewer where the sums
    and the loads in flight would pass 96 registers: the 64x64 tile of batch 32 keeps 1."""
    ks2 = F.Tile(32, 32, 1, 2)
    assert [F.prefetch_for(ks2, n) for n in (1, 4, 15, 16, 40)] == [2, 2, 2, 5, 5]
    floats = {str(t): t.slab_floats for t in F.KERNELS}
    assert floats == {"64x64": 32, "64x64 ks2": 16, "32x64": 24, "32x64 ks2": 12,
                      "32x64 ks4": 8, "32x32": 16, "32x32 ks2": 8, "32x32 ks4": 8}
    assert [t.sums for t in F.KERNELS] == [64, 64, 32, 32, 32, 16, 16, 16]
    assert [F.prefetch_for(t, 40) for t in F.KERNELS] == [1, 2, 2, 5, 5, 5, 5, 5]
    for lay in problems.RESNET50:
        p = _params(lay, 1)
        if lay.name.startswith("1x1"):
            t = F.choose(p)
            per = F.plan_args(p, t)["slabs_per_part"]
            assert F.prefetch_for(t, per) == (5 if p.C >= 256 else 2), lay.name
        for b in (32, 128):   # the large tiles, as before the deeper pipeline: 1
            t = F.choose(_params(lay, b))
            if (t.BM, t.BN) == (64, 64):
                assert F.prefetch_for(t, 40) == 1, lay.name


@pytest.mark.parametrize("tile", [F.Tile(32, 32), F.Tile(32, 32, 3, 2), F.Tile(64, 64, 1, 2)],
                         ids=str)
@pytest.mark.parametrize("shape, wshape, kw", [SPLIT_SHAPES[0], SPLIT_SHAPES[2],
                                               SPLIT_SHAPES[3]])
def test_prefetch_depth_changes_no_bit(lib, lib_prefetch, tile, shape, wshape, kw):
    """5, 5 and 10 slabs (split in 3: 2, 2, 1 and 4, 4, 2): whole and partial rounds of 1, 2,
    3 and 5 slabs in flight; the same sums in the same order, so the same bits."""
    rng = np.random.default_rng(23 + tile.SPLIT)
    x, w = check.random_array(shape, rng), check.random_array(wshape, rng)
    want, _, _ = run_on_cpu(lib, x, w, kw, tile)
    got, _, cnt = run_on_cpu(lib_prefetch, x, w, kw, tile)
    assert_close_to_reference(got, x, w, **kw)
    assert np.array_equal(got, want) and not cnt.any()


# The rule, pinned: tile and split at batch 1; at batch 32 and 128
# every one of these layers keeps the algorithm it had before ('implicit_gemm', the stem
# 'im2col_fused').
# The few-tile grids (choose's fallback) slice each slab among SMALL_GRID_KS = 2 groups and
# split the reduction towards one block per SM (132 on the H200 the rule was timed on).
BATCH1 = {
    "stem 7x7/2": "32x32", "1x1 64->64 56x56": "32x32 ks2", "1x1 64->256 56x56": "32x32",
    "1x1 256->64 56x56": "32x32 ks2", "1x1 256->128 56x56": "32x32 ks2",
    "1x1 256->512 56x56/2": "32x32 ks2", "1x1 128->512 28x28": "32x32 ks2",
    "1x1 512->128 28x28": "32x32 split2 ks2", "1x1 512->256 28x28": "32x32 ks2",
    "1x1 512->1024 28x28/2": "32x32 ks2", "1x1 256->1024 14x14": "32x32 ks2",
    "1x1 1024->256 14x14": "32x32 split3 ks2", "1x1 1024->512 14x14": "32x32 split2 ks2",
    "1x1 1024->2048 14x14/2": "32x32 split2 ks2", "1x1 512->2048 7x7": "32x32 split2 ks2",
    "1x1 2048->512 7x7": "32x32 split5 ks2"}


def _params(layer, batch):
    prob = layer.with_batch(batch)
    return ref.conv_params(prob.x_shape, prob.w_shape, **prob.kwargs)


def test_rule_on_resnet50():
    layers = [lay for lay in problems.RESNET50 if not lay.name.startswith("3x3")]
    assert {lay.name for lay in layers} == set(BATCH1)
    for lay in layers:
        p = _params(lay, 1)
        assert conv_cuda.choose_algorithm(p) == "flat_igemm", lay.name
        assert str(F.choose(p)) == BATCH1[lay.name], lay.name
        for b in (32, 128):
            want = "im2col_fused" if lay.name.startswith("stem") else "implicit_gemm"
            assert conv_cuda.choose_algorithm(_params(lay, b)) == want, (lay.name, b)
    for lay in problems.RESNET50:  # the 3x3 layers never take this path
        if lay.name.startswith("3x3"):
            assert conv_cuda.choose_algorithm(_params(lay, 1)) != "flat_igemm", lay.name


@pytest.mark.parametrize("x, w, kw, want", [
    ((1, 64, 56, 56), (64, 64, 1, 1), dict(padding=1), "implicit_gemm"),  # padded 1x1
    ((1, 96, 40, 40), (96, 96, 1, 1), {}, "flat_igemm"),
    ((128, 96, 40, 40), (96, 96, 1, 1), {}, "implicit_gemm"),   # 2^30.8 multiply-adds
    ((2, 1, 64, 64), (16, 1, 5, 5), dict(padding=2), "flat_igemm"),
    ((1, 96, 10, 10), (96, 96, 3, 3), dict(padding=1), "implicit_gemm")])
def test_algorithm_on_other_shapes(x, w, kw, want):
    assert conv_cuda.choose_algorithm(ref.conv_params(x, w, **kw)) == want


def test_tile_rule_edges():
    def tile(x, w, **kw):
        return str(F.choose(ref.conv_params(x, w, **kw)))

    assert tile((1, 8, 4, 4), (8, 8, 1, 1)) == "32x32 ks2"  # tiny: no split below 4 slabs
    assert tile((1, 4096, 2, 2), (40, 4096, 1, 1)) == "32x32 split16 ks2"  # split capped
    late = ref.conv_params((1, 512, 7, 7), (2048, 512, 1, 1))   # 128 tiles of 32x32
    assert F.choose(late, ks=4) == F.Tile(32, 32, 2, 4)   # towards 132 blocks (one per SM)
    assert F.choose(late, ks=1) == F.Tile(32, 32, 5, 1)   # towards 4 x 132 of 64 threads
    assert tile((8, 64, 56, 56), (256, 64, 1, 1)) == "64x64"  # enough tiles: the largest
    assert tile((1, 64, 150, 150), (64, 64, 1, 1)) == "32x64"  # 352 tiles of 64x64, 704
    assert tile((1, 64, 30, 30), (48, 64, 1, 1)) == "32x32 ks2"  # 64-row tiles > K


def test_refusals():
    p = ref.conv_params((1, 8, 5, 5), (4, 8, 1, 1))
    with pytest.raises(ValueError, match="no kernel for tile"):
        F.plan_args(p, F.Tile(128, 64))
    with pytest.raises(ValueError, match="no kernel for tile 32x32 ks3"):
        F.plan_args(p, F.Tile(32, 32, 1, 3))
    big = ref.conv_params((1, 2**16, 2**8, 2**8), (4, 2**16, 1, 1))
    with pytest.raises(Unsupported, match="32-bit"):
        F.plan_args(big, F.Tile())
    with pytest.raises(Unsupported, match="groups"):
        F.conv2d_flat_igemm_cuda(np.zeros((1, 4, 5, 5), np.float32),
                                 np.zeros((4, 2, 1, 1), np.float32),
                                 np.zeros((1, 4, 5, 5), np.float32), groups=2)


class _HostArray:
    """A NumPy array that passes for a device array (its address as the CUDA array
    interface's): the launcher's Python runs unchanged, the kernel on the CPU."""

    def __init__(self, a):
        self.a = a
        self.shape, self.dtype = a.shape, a.dtype
        self.__cuda_array_interface__ = dict(data=(a.ctypes.data, False), shape=a.shape,
                                             typestr=a.dtype.str, version=3)


@pytest.mark.parametrize("shape, stride", [((2, 3, 9, 11), 2), ((1, 5, 8, 13), (2, 3)),
                                           ((1, 2, 7, 7), 3)])
def test_subsample_on_the_cpu(lib, shape, stride):
    """flat_subsample copies x[:, :, ::sh, ::sw] out densely, every element, exactly."""
    x = check.random_array(shape, np.random.default_rng(5))
    p = ref.conv_params(shape, (4, shape[1], 1, 1), stride=stride)
    a = F.subsample_args(p)
    xs = check.poisoned(a["shape"])
    ints = np.array(a["ints"], np.int32)
    lib.run_subsample(*a["grid"], *a["block"], *(ctypes.c_void_p(v.ctypes.data)
                                                   for v in (x, xs, ints)))
    sh, sw = p.stride
    assert np.array_equal(xs, x[:, :, ::sh, ::sw][:, :, :p.P, :p.Q])


def test_subsample_rule_on_resnet50():
    """At batch 1 only 256->512 56x56/2 is copied out first; at batch 32 all three strided
    1x1 layers are (where the launcher is called on them: conv2d_cuda takes another path)."""
    for b, want in ((1, {"1x1 256->512 56x56/2"}),
                    (32, {"1x1 256->512 56x56/2", "1x1 512->1024 28x28/2"})):
        got = {lay.name for lay in problems.RESNET50 if F.subsample_first(_params(lay, b))}
        assert got == want, b
    p = _params(next(lay for lay in problems.RESNET50 if lay.name == "1x1 256->512 56x56/2"), 1)
    d = F.dense_params(p)
    assert (d.H, d.W, d.stride, d.P, d.Q) == (28, 28, (1, 1), 28, 28)


class _Buf(np.ndarray):
    """A NumPy array with a device address, for the launcher's workspace and counters."""

    @property
    def __cuda_array_interface__(self):
        return dict(data=(self.ctypes.data, False), shape=self.shape, typestr=self.dtype.str,
                    version=3)


class _FakeModule:
    """Stands in for CuPy's RawModule of one tile (the -D switches of its options): a
    launch runs that tile of the CPU library."""

    def __init__(self, lib, options):
        self.lib = lib
        self.defines = dict(o[2:].split("=") for o in options if o.startswith("-D"))

    def get_function(self, name):
        if name == "flat_subsample":
            def subsample(grid, block, args):
                ptr = [ctypes.c_void_p(a.ctypes.data if isinstance(a, np.ndarray) else int(a))
                       for a in args[:2]]
                ints = np.array([int(v) for v in args[2:]], np.int32)
                assert len(ints) == 7
                self.lib.run_subsample(grid[0], block[0], *ptr,
                                       ctypes.c_void_p(ints.ctypes.data))
            return subsample
        assert name == "flat_igemm_tile", name
        bm, bn, mode, ks = (int(self.defines[f"FLAT_{k}"]) for k in ("BM", "BN", "MODE", "KS"))

        def launch(grid, block, args):
            x, w, y, ws, cnt = (a.ctypes.data if isinstance(a, np.ndarray) else int(a)
                                for a in args[:5])
            ints = np.array([int(v) for v in args[5:]], np.int32)
            assert len(ints) == 17 and args[-1] in range(8)  # the flags last
            assert block[0] == ks * 64
            assert self.lib.run_flat(bm, bn, mode, ks, 0, *grid, block[0],
                                     *(ctypes.c_void_p(v) for v in (x, w, y, ws, cnt)),
                                     ctypes.c_void_p(ints.ctypes.data)) == 0
        return launch


SUBSAMPLED = ((1, 24, 8, 15), (20, 24, 1, 1), dict(stride=2))  # P*Q = 32: copied out first


@pytest.mark.parametrize("tile", [None, F.Tile(32, 64, 3), F.Tile(32, 32, 2, 4)], ids=str)
@pytest.mark.parametrize("shape, wshape, kw", [SHAPES[1], SPLIT_SHAPES[0], SHAPES[3],
                                               SUBSAMPLED])
def test_launcher_drives_the_kernel_on_the_cpu(lib, monkeypatch, tile, shape, wshape, kw):
    import sys
    import types

    monkeypatch.setattr(F, "SUBSAMPLE_MIN", 100)   # the tiny strided case takes that path

    cp = types.SimpleNamespace(float32=np.float32, int32=np.int32,
                               empty=lambda n, t: np.full(n, np.nan, t).view(_Buf),
                               zeros=lambda n, t: np.zeros(n, t).view(_Buf))
    monkeypatch.setitem(sys.modules, "cupy", cp)
    depths = []
    monkeypatch.setattr(F, "_module", lambda d, t, m: depths.append(d) or _FakeModule(
        lib, F.module_options(t, m, d)))
    monkeypatch.setattr(F, "_PLANS", {})
    rng = np.random.default_rng(3)
    x, w = check.random_array(shape, rng), check.random_array(wshape, rng)
    p = ref.conv_params(shape, wshape, **kw)
    fn = F.make_launcher(tile)
    for _ in range(2):  # the second call reuses the plan, its workspace and counters
        out = check.poisoned(p.out_shape)
        fn(_HostArray(x), _HostArray(w), _HostArray(out), **kw)
        assert_close_to_reference(out, x, w, **kw)
    plan = next(iter(F._PLANS.values()))
    assert plan["tile"] == (tile or F.choose(p))
    assert depths == [F.prefetch_for(plan["tile"], plan["slabs_per_part"])]  # built once
    assert (plan["subsample"] is not None) == (shape == SUBSAMPLED[0]), plan["subsample"]
    if plan["parts"] > 1:
        assert not plan["counters"].any()


def test_subsample_switch_on_the_cpu(lib, monkeypatch):
    """Forced either way on a strided 1x1 layer: the same sums in the same order, so the
    same bits; refused where there is nothing to subsample."""
    import sys
    import types

    cp = types.SimpleNamespace(float32=np.float32, int32=np.int32,
                               empty=lambda n, t: np.full(n, np.nan, t).view(_Buf),
                               zeros=lambda n, t: np.zeros(n, t).view(_Buf))
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(F, "_module", lambda d, t, m: _FakeModule(lib, F.module_options(t, m, d)))
    monkeypatch.setattr(F, "_PLANS", {})
    shape, wshape, kw = SUBSAMPLED
    rng = np.random.default_rng(9)
    x, w = check.random_array(shape, rng), check.random_array(wshape, rng)
    p = ref.conv_params(shape, wshape, **kw)
    outs = []
    for sub in (True, False):
        out = check.poisoned(p.out_shape)
        F.make_launcher(subsample=sub)(_HostArray(x), _HostArray(w), _HostArray(out), **kw)
        assert_close_to_reference(out, x, w, **kw)
        outs.append(out)
    assert np.array_equal(*outs)
    assert [pl["subsample"] is not None for pl in F._PLANS.values()] == [True, False]
    x1, w1, kw1 = SHAPES[1]   # stride 1: nothing to subsample
    with pytest.raises(ValueError, match="subsampled"):
        F.make_launcher(subsample=True)(_HostArray(np.zeros(x1, np.float32)),
                                        _HostArray(np.zeros(w1, np.float32)),
                                        _HostArray(np.zeros((1, 33, 6, 10), np.float32)))


@pytest.fixture(scope="module")
def all_ptx():
    if not nvrtc_available():
        pytest.skip("cuda-python's NVRTC missing")
    return F.compile_ptx()


def _entries(ptx: str) -> dict:
    """Each .entry's code by name, its own name and the file's label numbering taken out."""
    out = {}
    for body in re.split(r"\.(?:visible|weak) \.entry ", ptx)[1:]:
        name = body.split("(")[0]
        body = body[:body.rindex("\n}") + 2].replace(name, "ENTRY")
        out[name] = re.sub(r"\$L__BB\d+_", "$L__BB_", body)
    return out


def test_source_compiles(all_ptx):
    ptx = all_ptx
    for t in F.KERNELS:  # each kernel's block size, as its launches use it
        assert f".maxntid {t.threads}, 1, 1" in ptx
    # static shared memory of every entry, as declared in its PTX, within the 48 KiB that
    # a kernel may declare statically (ptxas refuses more at load time, not NVRTC here)
    bodies = ptx.split(".entry")[1:]
    gemms = [b for b in bodies if "flat_subsample" not in b.split("(")[0]]
    for body in gemms:
        decl = re.findall(r"\.shared \.align \d+ \.(?:b8|u32|b32) \S+?(?:\[(\d+)\])?;", body)
        total = sum(int(n) if n else 4 for n in decl)
        assert 0 < total <= F.STATIC_SMEM, (body[:80], total)
    assert len(gemms) == len(F.KERNELS) * len(F.MODES) and len(bodies) == len(gemms) + 1
    assert len(F.KERNELS) == len(F.TILES) * len(F.KS_CHOICES) - 1  # 64x64 ks4 does not fit


@pytest.mark.parametrize("mode", F.MODES)
def test_one_tile_module_is_the_same_code(all_ptx, mode):
    """`_module` builds one kernel per module (``flat_igemm_tile`` under -D switches, which
    a first use compiles alone): for every tile its PTX is the template instantiation's,
    instruction for instruction, and it is the module's only GEMM entry."""
    full = _entries(all_ptx)
    for t in F.KERNELS:
        one = _entries(F.compile_tile_ptx(t, mode))
        assert sorted(one) == ["flat_igemm_tile", "flat_subsample"]
        twins = [n for n, body in full.items() if body == one["flat_igemm_tile"]]
        assert len(twins) == 1 and f"ILi{t.BM}ELi{t.BN}ELi{mode}ELi{t.KS}E" in twins[0], (
            t, twins)


@pytest.mark.gpu
@pytest.mark.parametrize("x, w, kw", [*SHAPES, SPLIT_SHAPES[1],
                                      ((1, 256, 14, 14), (1024, 256, 1, 1), {}),
                                      ((1, 1024, 14, 14), (2048, 1024, 1, 1), dict(stride=2)),
                                      ((1, 256, 56, 56), (512, 256, 1, 1), dict(stride=2)),
                                      ((1, 3, 224, 224), (64, 3, 7, 7), dict(stride=2, padding=3))])
def test_launcher_on_gpu(x, w, kw):
    from numba import cuda

    rng = np.random.default_rng(5)
    xs, ws = check.random_array(x, rng), check.random_array(w, rng)
    p = ref.conv_params(x, w, **kw)
    xd, wd = cuda.to_device(xs), cuda.to_device(ws)
    results = []
    for fn in (F.conv2d_flat_igemm_cuda, F.make_launcher(F.Tile(32, 32, 3)),
               F.make_launcher(F.Tile(32, 32, 3, 4)), F.make_launcher(F.Tile(64, 64, 1, 2)),
               F.make_launcher(subsample=False), F.make_launcher(prefetch=1),
               conv_cuda.conv2d_cuda):
        for _ in range(2):
            out = cuda.to_device(check.poisoned(p.out_shape))
            fn(xd, wd, out, **kw)
            results.append(out.copy_to_host())
            assert_close_to_reference(results[-1], xs, ws, **kw)
        assert np.array_equal(results[-1], results[-2])  # reproducible, split or not
    for plan in F._PLANS.values():  # every split launch left its counters at zero
        if plan["counters"] is not None:
            assert not plan["counters"].get().any()
