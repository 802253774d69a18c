"""The fast kernels of lessons 07-09: register-blocked GEMMs, implicit-GEMM convolutions
(Numba and CUDA C), the unroller, launch plans, the autotuner and `convlab bench`'s tables.

Under the simulator (CI): every new GEMM passes check_gemm on odd shapes; small tile
shapes of the conv factories pass check_conv2d with stride / padding / dilation (the
module launchers are checked by tests/test_kernels.py through CONV_LADDER); refusals are
clear; the PTX has the instructions the lessons promise (compiled without a GPU); the CUDA
C source compiles with NVRTC (no GPU). The `gpu` tests check real sizes against cuDNN.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from convlab import check
from convlab.kernels import (
    GEMM_LADDER,
    Unsupported,
    conv04_register_blocked,
    conv07_implicit_gemm_warp_tiled,
    conv08_implicit_gemm_tuned,
    conv09_implicit_gemm_cuda,
    gemm03_vectorized,
    gemm04_double_buffered,
    gemm05_wide_loads,
)
from convlab.kernels import _blocking as blk
from convlab.runtime import cuda, is_simulator

from ._nvrtc import nvrtc_available

C7, C9 = conv07_implicit_gemm_warp_tiled, conv09_implicit_gemm_cuda
NEW_GEMMS = ["register_blocked", "vectorized", "double_buffered", "wide_loads"]

# ---------------------------------------------------------------------------------------
# GEMM ladder


@pytest.mark.parametrize("name", NEW_GEMMS)
def test_gemm_passes_checker(name):
    check.check_gemm(GEMM_LADDER[name], quiet=True)


@pytest.mark.parametrize("make", [
    lambda: gemm03_vectorized.make_launcher(gemm03_vectorized.make_kernel(64, 32, 8, 4, 4)),
    lambda: gemm04_double_buffered.make_launcher(
        gemm04_double_buffered.make_kernel(32, 32, 16, 4, 4)),
])
def test_gemm_factories_other_tiles(make):
    check.check_gemm(make(), quiet=True)


@pytest.mark.parametrize("name", NEW_GEMMS)
def test_gemm_refusals(name):
    c = cuda()
    fn = GEMM_LADDER[name]
    a = c.to_device(np.ones((5, 7), np.float32))
    b = c.to_device(np.ones((6, 3), np.float32))
    with pytest.raises(ValueError, match="inner sizes differ"):
        fn(a, b, c.to_device(np.zeros((5, 3), np.float32)))
    with pytest.raises(TypeError, match="float32"):
        fn(c.to_device(np.ones((5, 7))), c.to_device(np.ones((7, 3), np.float32)),
           c.to_device(np.zeros((5, 3), np.float32)))
    with pytest.raises(ValueError, match="expected"):
        fn(a, c.to_device(np.ones((7, 3), np.float32)), c.to_device(np.zeros((3, 5),
                                                                              np.float32)))


@pytest.mark.parametrize("name", list(GEMM_LADDER))
def test_gemm_empty_products(name):
    """K = 0 gives zeros (the output is NaN-poisoned first); M = 0 or N = 0 launch nothing
    (a grid of zero blocks is an error on a GPU)."""
    c, fn = cuda(), GEMM_LADDER[name]
    for M, N, K in ((5, 6, 0), (8, 12, 0), (0, 6, 4), (5, 0, 4), (0, 0, 0)):
        out = c.to_device(np.full((M, N), np.nan, np.float32))
        fn(c.to_device(np.ones((M, K), np.float32)), c.to_device(np.ones((K, N), np.float32)),
           out)
        assert np.array_equal(out.copy_to_host(), np.zeros((M, N), np.float32)), (M, N, K)


def _gemm_error(fn, M, N, K, seed):
    """Max |out - A@B| / (|A|@|B|) of one call, out poisoned with NaN first; and whether the
    16-byte build ran."""
    c, rng = cuda(), np.random.default_rng(seed)
    a, b = check.random_array((M, K), rng), check.random_array((K, N), rng)
    ad, bd = c.to_device(a), c.to_device(b)
    out = c.to_device(np.full((M, N), np.nan, np.float32))
    fn(ad, bd, out)
    got = out.copy_to_host() if hasattr(out, "copy_to_host") else np.asarray(out)
    assert not np.isnan(got).any(), f"{M}x{N}x{K}: {int(np.isnan(got).sum())} not written"
    ref = a.astype(np.float64) @ b
    scale = np.abs(a).astype(np.float64) @ np.abs(b)
    return float(np.max(np.abs(got - ref) / scale)), gemm05_wide_loads.takes_wide_loads(ad, bd)


def test_gemm05_wide_build_whole_ragged_and_short_k():
    """16-byte loads (K and N multiples of 4): K a multiple of BK, a ragged first slab,
    K < BK (one slab, all of it ragged), M and N past the last whole tile."""
    fn = gemm05_wide_loads.make(32, 32, 16, 4, 4)
    for i, (M, N, K) in enumerate([(64, 32, 48), (70, 96, 36), (33, 64, 4), (40, 36, 20)]):
        err, wide = _gemm_error(fn, M, N, K, i)
        assert wide, (M, N, K)
        assert err < 1e-5, f"{M}x{N}x{K}: error {err:.2e}"


def test_gemm05_narrow_build_where_rows_are_not_16_bytes():
    fn = gemm05_wide_loads.make(32, 32, 16, 4, 4)
    for i, (M, N, K) in enumerate([(37, 32, 22), (32, 35, 48), (9, 7, 3)]):
        err, wide = _gemm_error(fn, M, N, K, 10 + i)
        assert not wide, (M, N, K)
        assert err < 1e-5, f"{M}x{N}x{K}: error {err:.2e}"


def test_gemm05_refuses_what_32_bit_offsets_cannot_address():
    from types import SimpleNamespace

    big = SimpleNamespace(shape=(65536, 65537), dtype=np.float32)
    with pytest.raises(Unsupported, match="2\\^32"):
        gemm05_wide_loads.gemm_wide_loads(big, SimpleNamespace(shape=(65537, 4),
                                                                 dtype=np.float32),
                                          SimpleNamespace(shape=(65536, 4), dtype=np.float32))


def test_gemm_factory_refuses_bad_tiles():
    with pytest.raises(ValueError, match="power of two"):
        gemm03_vectorized.make_kernel(96, 64)
    with pytest.raises(ValueError, match="warp tiling"):
        gemm04_double_buffered.make_kernel(16, 16, 8, 4, 4)


# ---------------------------------------------------------------------------------------
# Convolutions


def test_conv07_small_tiles_pass_checker():
    """The pipelined kernel's code on tiles small enough for the simulator."""
    check.check_conv2d(C7.launcher_for(C7.Config(32, 32, 8, 4, 4)), dilation=True, quiet=True)


def test_conv07_channels_not_a_multiple_of_the_slab():
    """BK = 16 with C = 3, 5, 7, 13: the zero-padded channels must not leak in."""
    check.check_conv2d(C7.launcher_for(C7.Config(32, 64, 16, 4, 4)), quiet=True, runs=1)


def test_conv07_refuses_tiles_it_cannot_load():
    with pytest.raises(ValueError, match="threads"):
        C7.make_kernel(BM=128, BN=128, TM=16, TN=16)
    with pytest.raises(ValueError, match="power of two"):
        C7.make_kernel(BM=96)


def test_conv04_refuses_tiles_beyond_shared_memory_clearly():
    """Any filter whose tile fits runs (7x5 here, not square); a receptive field too wide
    for shared memory is refused with the bytes it would need."""
    check.check_conv2d_case(conv04_register_blocked.conv2d_register_blocked, (1, 1, 11, 9),
                            (3, 1, 7, 5), padding=2, quiet=True, runs=1)
    c = cuda()
    x = c.to_device(np.ones((1, 1, 130, 130), np.float32))
    w = c.to_device(np.ones((1, 1, 31, 31), np.float32))
    out = c.to_device(np.zeros((1, 1, 10, 10), np.float32))
    with pytest.raises(Unsupported, match=r"needs \d+ bytes of shared memory \(limit 49152\)"):
        conv04_register_blocked.conv2d_register_blocked(x, w, out, dilation=4)


def test_conv08_choice_small_under_simulator_and_table_on_gpu():
    from convlab import reference as ref

    p = ref.conv_params((32, 128, 28, 28), (128, 128, 3, 3), padding=1)
    cfg = conv08_implicit_gemm_tuned.choose(p)
    if is_simulator():
        assert (cfg.BM, cfg.BN) == (32, 32)
    else:
        assert cfg.BM * cfg.BN >= 64 * 64


def test_conv_plan_is_cached_and_revalidated():
    c = cuda()
    x = c.to_device(check.random_array((1, 3, 9, 9), np.random.default_rng(0)))
    w = c.to_device(check.random_array((4, 3, 3, 3), np.random.default_rng(1)))
    out = c.to_device(np.zeros((1, 4, 9, 9), np.float32))
    args = ("t", x, w, out, 1, 1, 1, 1, 32, 32, 8)
    p1 = blk.conv_plan(*args)
    assert blk.conv_plan(*args) is p1 and p1.Cp == 8
    x64 = c.to_device(np.ones((1, 3, 9, 9)))
    with pytest.raises(TypeError, match="float32"):
        blk.conv_plan("t", x64, w, out, 1, 1, 1, 1, 32, 32, 8)
    v = blk.flat(x)
    assert blk.flat(x) is v and v.shape == (243,)


def test_unroller_writes_the_loop_out():
    K = 3

    def f(a):
        s = 0
        for k in blk.unroll(K):
            for j in range(2):
                s += a[k] * (j + 1)
        return s

    g = blk.unrolled(f)
    assert "unroll" not in g.unrolled_source and g.unrolled_source.count("a[2]") == 1
    assert g([1, 10, 100]) == f([1, 10, 100]) == 333


def test_gemm04_source_is_unrolled():
    src = gemm04_double_buffered.KERNEL.py_func.unrolled_source
    bk = gemm04_double_buffered.KERNEL.tile["BK"]
    assert f"As[buf, {bk - 1}, am + i]" in src and "unroll(" not in src


# ---------------------------------------------------------------------------------------
# CUDA C (RawKernel): configurations, choice, NVRTC without a GPU


def test_cuda_config_validation():
    assert C9.Config(128, 64, 16, 3, 2, SPLIT_K=2).validate()
    assert C9.Config(SPLIT_K=8).validate()  # 3+ parts: a workspace, summed in order
    for bad in (0, C9.MAX_SPLIT_K + 1):
        with pytest.raises(ValueError, match="SPLIT_K"):
            C9.Config(SPLIT_K=bad).validate()
    with pytest.raises(ValueError, match="48 KB"):
        C9.Config(128, 128, 16, 4).validate()
    with pytest.raises(ValueError, match="BN >= 64"):
        C9.Config(128, 32).validate()
    assert all(c.validate() for c in C9.CANDIDATES)


def test_cuda_choice_rule_and_table(tmp_path, monkeypatch):
    from convlab import autotune
    from convlab import reference as ref

    monkeypatch.setenv("CONVLAB_TUNED", str(tmp_path / "none.json"))
    l64 = ref.conv_params((32, 64, 56, 56), (64, 64, 3, 3), padding=1)
    l256 = ref.conv_params((32, 256, 14, 14), (256, 256, 3, 3), padding=1)
    assert C9.choose(l64).BM == 64
    assert C9.choose(l256).SPLIT_K == 2  # 196 tiles of 128x64: under 2 per SM, two parts
    # batch 1: 49 tiles of 64x64 for 132 SMs; the reduction (9 taps x 4 slabs) in 6 parts
    b1 = ref.conv_params((1, 64, 56, 56), (64, 64, 3, 3), padding=1)
    assert C9.choose(b1).SPLIT_K == 6 and C9.choose(b1).BM == 64
    late = ref.conv_params((1, 2048, 7, 7), (512, 2048, 1, 1))  # 4 tiles, 128 slabs
    assert C9.choose(late).SPLIT_K == C9.MAX_SPLIT_K
    few = ref.conv_params((1, 16, 8, 8), (128, 16, 1, 1))  # 1 slab: nothing to split
    assert C9.choose(few).SPLIT_K == 1
    big = ref.conv_params((32, 1024, 28, 28), (256, 1024, 1, 1))  # 392 x 2 tiles: no split
    assert C9.choose(big).SPLIT_K == 1
    table = {"tuned": {"cuda": {autotune.problem_key(l64): dict(
        BM=128, BN=128, BK=8, STAGES=4, MINB=2, SPLIT_K=1)}}}
    (tmp_path / "t.json").write_text(json.dumps(table))
    monkeypatch.setenv("CONVLAB_TUNED", str(tmp_path / "t.json"))
    assert C9.choose(l64) == C9.Config(128, 128, 8, 4, 2)


def test_cuda_refuses_groups_before_needing_cupy():
    c = cuda()
    x = c.to_device(np.ones((1, 4, 5, 5), np.float32))
    w = c.to_device(np.ones((4, 2, 3, 3), np.float32))
    out = c.to_device(np.zeros((1, 4, 3, 3), np.float32))
    with pytest.raises(Unsupported, match="groups=2"):
        C9.conv2d_implicit_gemm_cuda(x, w, out, groups=2)


_nvrtc_available = nvrtc_available


@pytest.mark.skipif(not _nvrtc_available(), reason="cuda-python's NVRTC not installed")
def test_cuda_source_compiles_with_nvrtc_without_gpu():
    ptx = C9.compile_ptx([C9.DEFAULT, C9.Config(64, 64, 16, 3, 4)])
    assert ptx.count(".entry") == 4  # two tile shapes, the filter transform, the split sum
    assert "cp.async.cg.shared.global" in ptx and "cp.async.ca.shared.global" in ptx
    assert "ld.shared.v4.f32" in ptx and "st.global.v4.f32" in ptx
    assert "fma.rn.f32" in ptx and "ld.local" not in ptx


@pytest.mark.skipif(not _nvrtc_available(), reason="cuda-python's NVRTC not installed")
def test_nvrtc_errors_are_reported(monkeypatch):
    monkeypatch.setattr(C9, "CUDA_SOURCE", C9.CUDA_SOURCE + "\nthis is not C++;\n")
    with pytest.raises(RuntimeError, match="NVRTC compile failed"):
        C9.compile_ptx([C9.DEFAULT])


# ---------------------------------------------------------------------------------------
# PTX facts (every ladder kernel compiled for sm_90 without a GPU, in a fresh process in
# GPU mode; the fast kernels' facts checked)

PTX = r"""
    import convlab; convlab.setup('gpu')
    from convlab.kernels import MODULES, ptx_report

    report = ptx_report(cc=(9, 0))  # every ladder kernel: a broken numba-cuda fails here
    assert set(report) == set(MODULES), sorted(set(MODULES) - set(report))
    for name in ("gemm_register_blocked", "gemm_vectorized", "gemm_double_buffered",
                 "gemm_wide_loads", "implicit_gemm", "implicit_gemm_double_buffered",
                 "implicit_gemm_warp_tiled"):
        p = report[name]["ptx"]
        assert "ld.local" not in p and "st.local" not in p, name + ": local memory"
        assert "fma.rn.f32" in p, name + ": no fma"
        v4 = p.count("ld.shared.v4.f32")
        if name == "gemm_register_blocked":
            assert v4 == 0, name + ": the plain step should read 32 bits at a time"
        else:
            assert v4 >= 4, name + ": no 128-bit shared-memory reads"
        print(name, v4, p.count("fma.rn.f32"))
    # gemm05: a slab's A and B in 16-byte loads, (BM + BN) * BK / 4 per block, in each of
    # the slab loop, the prologue's first whole slab and the ragged slab 0; gemm04 and the
    # narrow build: none
    from numba import cuda
    from convlab.kernels import gemm05_wide_loads as W

    t = W.KERNEL.tile
    per_thread = (t["BM"] + t["BN"]) * t["BK"] // 4 // t["threads"]
    assert report["gemm_wide_loads"]["ptx"].count("ld.global.v4.f32") == 3 * per_thread
    assert "ld.global.v4.f32" not in report["gemm_double_buffered"]["ptx"]
    narrow = W.make_kernel(wide=False)
    ptx, _ = cuda.compile_ptx(narrow.py_func, W.SIGNATURE, cc=(9, 0),
                              launch_bounds=narrow.targetoptions.get("launch_bounds"))
    assert "ld.global.v4.f32" not in ptx and ptx.count("ld.global.f32") >= 24
    print("ptx ok")
"""


def test_ptx_facts_of_the_fast_kernels():
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(PTX)], capture_output=True,
                       text=True, timeout=600, env={**os.environ, "CONVLAB_MODE": "gpu"})
    assert r.returncode == 0 and "ptx ok" in r.stdout, r.stdout + r.stderr[-3000:]


# ---------------------------------------------------------------------------------------
# Autotuner and the bench tables


def test_autotune_checks_candidates_and_reports_a_wrong_one():
    from convlab import autotune, problems

    def make(cfg):
        if cfg == "broken":
            def wrong(x, w, out, **kw):
                C7.launcher_for(C7.Config(32, 32, 8, 4, 4))(x, w, out, **kw)
                out[0, 0, 0, 0] = 1e6  # (a device array in GPU mode, a host one in sim)
            wrong.device = True
            return wrong
        return C7.launcher_for(cfg)

    prob = problems.conv_layer("resnet256", real=False)
    res = autotune.tune(make, [C7.Config(32, 32, 8, 4, 4), "broken"], prob)
    ok = {str(t.config): t.ok for t in res.trials}
    assert ok == {"32x32x8 t4x4": True, "broken": False}
    assert "wrong" in res.trials[1].error
    if is_simulator():
        assert not res.timed and res.best is None and "not timed" in res.table()


def test_stored_results_print_and_plot(tmp_path, capsys):
    from convlab import bench, ladder

    stored = bench.stored_results()
    assert stored["device"] and stored["date"] and stored["versions"]
    names = {r["name"] for lad in stored["ladders"] for r in lad["rows"]}
    assert {"implicit_gemm_tuned", "implicit_gemm_cuda", "cuDNN fp32"} <= names
    for lad in stored["ladders"]:
        assert all(r["max_rel_err"] < 1e-3 for r in lad["rows"])  # every row was checked
    ladder.print_results(stored)
    text = capsys.readouterr().out
    assert "% roof" in text and "% cuBLAS" in text and "batch sweep" in text
    import matplotlib

    matplotlib.use("Agg")
    assert ladder.save_results(stored, tmp_path)[-1].name == "batch_sweep.png"


# ---------------------------------------------------------------------------------------
# On a GPU: real sizes against cuDNN


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["implicit_gemm_tuned", "implicit_gemm_cuda"])
def test_fast_conv_real_layer_vs_cudnn(name):
    torch = pytest.importorskip("torch")
    from convlab.kernels import CONV_LADDER

    if name not in CONV_LADDER:
        pytest.skip("CuPy missing")
    torch.backends.cudnn.allow_tf32 = False
    rng = np.random.default_rng(3)
    for shape, kw in (((8, 128, 28, 28), dict(padding=1)), ((4, 64, 57, 43), dict(
            stride=2, padding=2, dilation=2))):
        x = check.random_array(shape, rng)
        w = check.random_array((96, shape[1], 3, 3), rng)
        y = torch.nn.functional.conv2d(torch.from_numpy(x).cuda().double(),
                                       torch.from_numpy(w).cuda().double(), **kw)
        c = cuda()
        out = c.to_device(check.poisoned(tuple(y.shape)))
        CONV_LADDER[name](c.to_device(x), c.to_device(w), out, **kw)
        got = out.copy_to_host()
        ref = y.cpu().numpy()
        assert np.isfinite(got).all()
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.gpu
def test_cuda_split_k_is_reproducible():
    pytest.importorskip("cupy")
    launch = C9.make_launcher(C9.Config(128, 64, 8, 3, 2, SPLIT_K=2))
    check.check_conv2d(launch, dilation=True, quiet=True)


@pytest.mark.gpu
@pytest.mark.parametrize("parts", [3, 7])
def test_cuda_workspace_split_k_is_right_and_bitwise_reproducible(parts):
    cp = pytest.importorskip("cupy")
    launch = C9.make_launcher(C9.Config(64, 64, 8, 4, 4, SPLIT_K=parts))
    check.check_conv2d(launch, dilation=True, quiet=True)
    rng = np.random.default_rng(parts)
    x = cp.asarray(check.random_array((1, 67, 13, 11), rng))  # 603 = 9 x 67: many slabs
    w = cp.asarray(check.random_array((93, 67, 3, 3), rng))
    outs = []
    for _ in range(3):
        out = cp.full((1, 93, 13, 11), np.nan, dtype=cp.float32)
        launch(x, w, out, padding=1)
        outs.append(cp.asnumpy(out))
    assert not np.isnan(outs[0]).any()
    assert all(np.array_equal(outs[0], o) for o in outs[1:])  # the same bits every run
    c = check.reference_case(cp.asnumpy(x), cp.asnumpy(w), padding=1)
    assert check.compare(outs[0], c["expected"], c["absref"], c["reduction"]).ok


class _StrictReshape:
    """A stand-in for Numba's device array where reshape refuses axes of length 1 whose
    stride is not the C stride (stride 0 from `x[None]`), as numba-cuda's dummy array does;
    indexing gives a view (tracked as `base`)."""

    def __init__(self, data, base=None):
        self.data, self.base = data, base

    shape = property(lambda self: self.data.shape)
    ndim = property(lambda self: self.data.ndim)

    def reshape(self, n):
        c_strides = np.cumprod((1,) + self.data.shape[:0:-1])[::-1] * self.data.itemsize
        if any(s == 1 and st != cs for s, st, cs in zip(self.data.shape, self.data.strides,
                                                       c_strides, strict=True)):
            raise NotImplementedError("operation requires copying")
        return _StrictReshape(self.data.reshape(n), base=self)

    def __getitem__(self, item):
        return _StrictReshape(self.data[item], base=self)


@pytest.mark.parametrize("index", [(None, None), (None,), (slice(None), None)])
def test_flat_views_arrays_with_zero_stride_unit_axes(index):
    rng = np.random.default_rng(5)
    w = check.random_array((3, 5), rng)[index]  # shapes (1, 1, 3, 5), (1, 3, 5), (3, 1, 5)
    a = _StrictReshape(w)
    with pytest.raises(NotImplementedError):
        a.reshape(15)
    v = blk.flat(a)
    assert v.shape == (15,) and np.array_equal(v.data, w.ravel())
    assert np.shares_memory(v.data, w), "a copy, not a view"


def test_flat_of_a_single_element():
    a = _StrictReshape(np.full((1, 1, 1), 2.5, np.float32)[None])
    assert blk.flat(a).shape == (1,) and blk.flat(a).data[0] == 2.5


@pytest.mark.gpu
def test_flat_of_a_device_array_made_from_x_none():
    import numba.cuda as nc

    w = check.random_array((3, 3), np.random.default_rng(6))
    d = nc.to_device(w[None, None])
    v = blk.flat(d)
    assert v.shape == (9,) and np.array_equal(v.copy_to_host(), w.ravel())


@pytest.mark.gpu
@pytest.mark.parametrize("ladder, name", [("conv", n) for n in ("naive", "coalesced", "tiled",
                                                                  "register_blocked")]
                         + [("depthwise", n) for n in ("direct", "smem")])
def test_launchers_take_device_arrays_with_zero_stride_unit_axes(ladder, name):
    """x and w made from `a[:, None]` (a unit axis of stride 0 on the device): numba-cuda's
    reshape refuses them, so a launcher that flattens with `reshape` raises."""
    import numba.cuda as nc

    from convlab import reference
    from convlab.kernels import CONV_LADDER, DEPTHWISE_LADDER

    rng = np.random.default_rng(7)
    x3 = check.random_array((2, 9, 11), rng)          # (N, H, W): C = 1 after [:, None]
    w3 = check.random_array((3, 3, 3), rng)           # (K or C, R, S)
    if ladder == "conv":
        x, w, fn, groups = x3[:, None], w3[:, None], CONV_LADDER[name], 1
    else:
        x = np.ascontiguousarray(np.repeat(x3[:, None], 3, axis=1))
        w, fn, groups = w3[:, None], DEPTHWISE_LADDER[name], 3
    want = reference.conv2d(x, w, padding=1, groups=groups)
    out = nc.to_device(np.full(want.shape, np.nan, np.float32))
    fn(nc.to_device(x), nc.to_device(w), out, padding=1)
    np.testing.assert_allclose(out.copy_to_host(), want, rtol=1e-5, atol=1e-5)
