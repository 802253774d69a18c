"""Lessons 04-06 kernels: tiled conv, image filters, tiled GEMM, layout changes.

Under the simulator (CI): the checkers on odd shapes with stride, padding and dilation,
small tiles so that channel and filter blocks have tails, refusals, a broken kernel the
race check must catch, and PTX facts the lessons state (compiled without a GPU). On a
GPU the `gpu` tests run the real tile shapes on larger odd problems.
"""

import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from convlab import check
from convlab import reference as ref
from convlab.kernels import (
    FILTER_LADDER,
    GEMM_LADDER,
    Unsupported,
    conv03_tiled,
    filter01_naive,
    filter02_tiled,
    gemm01_tiled,
    layout,
)
from convlab.runtime import cuda, is_simulator


def conv_with(**tile):
    def conv2d_tiled_variant(x, w, out, stride=1, padding=0, dilation=1, groups=1):
        return conv03_tiled.launch(x, w, out, stride, padding, dilation, groups, **tile)
    conv2d_tiled_variant.device = True
    return conv2d_tiled_variant


def filter_with(**tile):
    def filter2d_variant(image, kernel, out):
        return filter02_tiled.launch(image, kernel, out, **tile)
    filter2d_variant.device = True
    return filter2d_variant


# ---------------------------------------------------------------------------------------
# conv03_tiled


def test_tiled_conv_passes_checker_with_small_tiles():
    # 8x4 threads, 4 filters per thread, 2 channels per stage: every case has tails in
    # channels (C = 3 or 2), filters (K = 2..5) and both tile directions
    check.check_conv2d(conv_with(tx=8, ty=4, kpt=4, cb=2), dilation=True, quiet=True)


def test_tiled_conv_default_launcher_passes_checker():
    from convlab.kernels import CONV_LADDER

    assert CONV_LADDER["tiled"] is conv03_tiled.conv2d_tiled
    check.check_conv2d(conv03_tiled.conv2d_tiled, quiet=True)


def test_fit_tile_wastes_no_threads_on_resnet_shapes():
    assert conv03_tiled.fit_tile(28, 28) == (28, 7)
    assert conv03_tiled.fit_tile(56, 56) == (28, 7)
    assert conv03_tiled.fit_tile(14, 14) == (14, 14)
    tx, ty = conv03_tiled.fit_tile(7, 9)
    assert 128 <= tx * ty <= 256


def _dev(*shapes):
    c = cuda()
    return [c.to_device(np.ones(s, np.float32)) for s in shapes]


def test_tiled_conv_refusals():
    x, w, out = _dev((1, 4, 5, 5), (4, 2, 3, 3), (1, 4, 3, 3))
    with pytest.raises(Unsupported, match="groups=2"):
        conv03_tiled.conv2d_tiled(x, w, out, groups=2)
    # a receptive field too large for 48 KiB of shared memory even one channel at a time
    x, w, out = _dev((1, 1, 130, 130), (1, 1, 3, 3), (1, 1, 10, 10))
    with pytest.raises(Unsupported, match="shared memory"):
        conv03_tiled.conv2d_tiled(x, w, out, dilation=60)
    x, w = _dev((1, 2, 5, 5), (3, 2, 3, 3))
    with pytest.raises(ValueError, match="expected"):
        conv03_tiled.conv2d_tiled(x, w, *_dev((1, 3, 5, 5)))
    c = cuda()
    with pytest.raises(TypeError, match="float32"):
        conv03_tiled.conv2d_tiled(c.to_device(np.ones((1, 2, 5, 5))), w, *_dev((1, 3, 3, 3)))


def test_tiled_conv_stage_count_adapts_to_big_receptive_fields():
    # stride 4, 7x7: one channel of a 28x7 tile is large; cb shrinks instead of failing
    rng = np.random.default_rng(11)
    x = check.random_array((1, 3, 23, 121), rng)
    w = check.random_array((2, 3, 7, 7), rng)
    expected = ref.conv2d(x.astype(np.float64), w.astype(np.float64), stride=4, padding=3)
    c = cuda()
    out = c.to_device(check.poisoned(expected.shape))
    conv03_tiled.launch(c.to_device(x), c.to_device(w), out, stride=4, padding=3, tx=28, ty=7,
                        kpt=2, cb=64)
    absref = ref.conv2d(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), stride=4,
                        padding=3)
    comp = check.compare(out.copy_to_host(), expected, absref, 3 * 49)
    assert comp.ok, comp.summary()


# ---------------------------------------------------------------------------------------
# Image filters


@pytest.mark.parametrize("name", list(FILTER_LADDER))
def test_filter_ladder_passes_checker(name):
    check.check_filter2d(FILTER_LADDER[name], quiet=True)


def test_uncoalesced_twin_and_padded_tile_pass_checker():
    check.check_filter2d(filter01_naive.filter2d_naive_rows, quiet=True)
    check.check_filter2d(filter_with(tx=16, ty=8, v=2, pad=2), quiet=True)


def _filter_against_reference(launch, shape, taps, seed=0):
    rng = np.random.default_rng(seed)
    img = check.random_array(shape, rng)
    expected = ref.filter2d(img.astype(np.float64), taps.astype(np.float64))
    absref = ref.filter2d(np.abs(img).astype(np.float64), np.abs(taps).astype(np.float64))
    c = cuda()
    out = c.to_device(check.poisoned(shape))
    launch(c.to_device(img), c.to_device(taps), out)
    comp = check.compare(out.copy_to_host(), expected, absref, taps.size)
    assert comp.ok, comp.summary()


@pytest.mark.parametrize("tile", [dict(tx=32, ty=2, v=4), dict(tx=16, ty=4, v=3, pad=1),
                                  dict(tx=32, ty=2, v=4, chunks=3),
                                  dict(tx=16, ty=2, v=5, chunks=2, pad=2)])
def test_tiled_filter_many_tiles(tile):
    # several tiles in both directions (and chunk boundaries), a 5x3 filter
    taps = check.random_array((5, 3), np.random.default_rng(1))
    _filter_against_reference(filter_with(**tile), (41, 37), taps)


def test_filter_refusals():
    img, k2, out = _dev((9, 9), (2, 3), (9, 9))
    for fn in (filter01_naive.filter2d_naive, filter02_tiled.filter2d_tiled):
        with pytest.raises(Unsupported, match="odd"):
            fn(img, k2, out)
        with pytest.raises(ValueError, match="expected"):
            fn(img, *_dev((3, 3), (9, 8)))
    with pytest.raises(Unsupported, match="shared memory"):
        filter02_tiled.launch(img, *_dev((3, 3)), out, tx=32, ty=32, v=16,
                              taps=np.ones((3, 3), np.float32))


def test_missing_syncthreads_is_reported_as_a_race():
    if not is_simulator():
        pytest.skip("the race check traces kernels under the simulator")
    broken = filter_with(tx=32, ty=2, v=2, sync=False)
    with pytest.raises(check.CheckError, match="race"):
        check.check_filter2d(broken, quiet=True)


# ---------------------------------------------------------------------------------------
# GEMM and layouts


def test_gemm_ladder_registers_tiled():
    assert GEMM_LADDER["tiled"] is gemm01_tiled.gemm_tiled


@pytest.mark.parametrize("tile", [8, 16])
def test_tiled_gemm_passes_checker(tile):
    def gemm(a, b, out):
        return gemm01_tiled.launch(a, b, out, tile)
    gemm.device = True
    check.check_gemm(gemm, quiet=True)


def test_tiled_gemm_refusals():
    a, b, out = _dev((5, 7), (6, 3), (5, 3))
    with pytest.raises(ValueError, match="inner"):
        gemm01_tiled.gemm_tiled(a, b, out)
    with pytest.raises(Unsupported, match="tile"):
        gemm01_tiled.launch(*_dev((5, 7), (7, 3), (5, 3)), tile=12)


@pytest.mark.parametrize("pad", [0, 1])
def test_transposes_are_exact(pad):
    x = check.random_array((2, 5, 7, 9), np.random.default_rng(2))
    c = cuda()
    y = c.to_device(check.poisoned((2, 7, 9, 5)))
    layout.nchw_to_nhwc(c.to_device(x), y, pad=pad)
    assert np.array_equal(y.copy_to_host(), x.transpose(0, 2, 3, 1))
    back = c.to_device(check.poisoned(x.shape))
    layout.nhwc_to_nchw(y, back, pad=pad)
    assert np.array_equal(back.copy_to_host(), x)


def test_nhwc_counter_example_is_correct():
    rng = np.random.default_rng(3)
    x, w = check.random_array((2, 3, 9, 8), rng), check.random_array((4, 3, 3, 3), rng)
    xh, wh = layout.nhwc_inputs(x, w)
    expected = ref.conv2d(x.astype(np.float64), w.astype(np.float64), stride=2, padding=1)
    c = cuda()
    N, K, P, Q = expected.shape
    out = c.to_device(check.poisoned((N, P, Q, K)))
    layout.conv2d_nhwc_pixels(c.to_device(xh), c.to_device(wh), out, stride=2, padding=1)
    np.testing.assert_allclose(out.copy_to_host().transpose(0, 3, 1, 2), expected, rtol=1e-5,
                               atol=1e-5)


# ---------------------------------------------------------------------------------------
# PTX facts the lessons state (compiled without a GPU)

PTX = r"""
    import re
    import numpy as np
    import convlab; convlab.setup('gpu')
    from numba import cuda
    from convlab.kernels import conv03_tiled, filter02_tiled, gemm01_tiled, layout

    def ptx(k, sig, **kw):
        return cuda.compile_ptx(k.py_func, sig, cc=(9, 0), **kw)[0]

    c = ptx(conv03_tiled.make_kernel(3, 3, 1, 1, 1, 1, 28, 7, 8, 8), conv03_tiled.SIGNATURE)
    assert "ld.shared.v4.f32" in c, "filter taps not read 128 bits at a time"
    assert "ld.local" not in c and "st.local" not in c, "accumulators spilled to local memory"
    c2 = ptx(conv03_tiled.make_kernel(5, 3, 2, 1, 2, 1, 16, 8, 4, 4), conv03_tiled.SIGNATURE)
    assert "bar.sync" in c2
    g = filter02_tiled.GAUSS3
    f = ptx(filter02_tiled.make_kernel(g, 32, 8, 8), filter02_tiled.SIGNATURE)
    assert re.search(r"fma.rn.f32\s+%f\d+, %f\d+, 0f3E800000", f), "taps not immediates"
    assert "ld.const" not in f and "ld.local" not in f
    assert f.count("ld.global") == 9 and f.count("st.global") == 8
    # no 64-bit multiply by a run-time value (Numba's int64 strides), no wrap-around selects
    assert not re.search(r"mul.lo.s64\s+%rd\d+, %rd\d+, %rd\d+", f), "64-bit index math"
    assert "selp.b64" not in f, "negative-index wrap-around checks are back"
    p = ptx(filter02_tiled.make_pipelined_kernel(g, 32, 8, 4, chunks=4, min_blocks=8),
            filter02_tiled.SIGNATURE, launch_bounds=(256, 8))
    assert ".maxntid 256" in p and "ld.local" not in p
    assert "bar.sync" in ptx(gemm01_tiled.make_kernel(16), gemm01_tiled.SIGNATURE)
    assert "bar.sync" in ptx(layout.make_transpose(0), layout.SIGNATURE)
    print("ptx ok")
"""


def test_ptx_facts():
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(PTX)], capture_output=True,
                       text=True, timeout=600, env={**__import__("os").environ,
                                                    "CONVLAB_MODE": "gpu"})
    assert r.returncode == 0 and "ptx ok" in r.stdout, r.stdout + r.stderr[-3000:]


# ---------------------------------------------------------------------------------------
# Real tile shapes on a GPU


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [dict(tx=28, ty=7, kpt=8, cb=8), dict(tx=32, ty=8, kpt=8, cb=8),
                                  dict(tx=16, ty=16, kpt=16, cb=16), dict(tx=32, ty=4, kpt=1,
                                                                          cb=8)])
def test_tiled_conv_on_gpu(tile):
    rng = np.random.default_rng(9)
    x = check.random_array((3, 37, 45, 29), rng)
    w = check.random_array((21, 37, 3, 3), rng)
    c = cuda()
    for kw in (dict(padding=1), dict(stride=2, padding=1), dict(stride=1, padding=2,
                                                                 dilation=2)):
        expected = ref.conv2d_im2col(x.astype(np.float64), w.astype(np.float64), **kw)
        absref = ref.conv2d_im2col(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64),
                                   **kw)
        out = c.to_device(check.poisoned(expected.shape))
        conv03_tiled.launch(c.to_device(x), c.to_device(w), out, **kw, **tile)
        comp = check.compare(out.copy_to_host(), expected, absref, 37 * 9)
        assert comp.ok, (kw, comp.summary())


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [dict(tx=32, ty=8, v=8), dict(tx=16, ty=16, v=4, pad=2),
                                  dict(tx=32, ty=8, v=4, chunks=8, min_blocks=8),
                                  dict(tx=32, ty=16, v=4, chunks=4, min_blocks=4)])
def test_tiled_filter_on_gpu(tile):
    taps = check.random_array((3, 5), np.random.default_rng(4))
    _filter_against_reference(filter_with(**tile), (1001, 777), taps)


@pytest.mark.gpu
def test_tiled_gemm_32_on_gpu():
    check.check_gemm(gemm01_tiled.gemm_tiled, quiet=True)


def test_nhwc_checker_accepts_a_correct_nhwc_kernel_and_rejects_nchw_weights():
    def good(x, w, out, stride=1, padding=0):
        return layout.conv2d_nhwc_pixels(x, w, out, stride=stride, padding=padding)

    check.check_conv2d_nhwc(good, quiet=True)

    def wrong_weight_layout(x, w, out, stride=1, padding=0):
        # reads w as if it were (R, S, K, C) reshaped: channels and filters mixed up
        R, S, C, K = w.shape
        wt = cuda().to_device(np.ascontiguousarray(
            w.copy_to_host().reshape(R, S, K, C).transpose(0, 1, 3, 2)))
        return layout.conv2d_nhwc_pixels(x, wt, out, stride=stride, padding=padding)

    with pytest.raises(check.CheckError, match="wrong"):
        check.check_conv2d_nhwc(wrong_weight_layout, quiet=True)

    def filter_zero_everywhere(x, w, out, stride=1, padding=0):
        # every filter k computes filter 0's output: out[n, p, q, k] wrong for k > 0
        layout.conv2d_nhwc_pixels(x, w, out, stride=stride, padding=padding)
        y = out.copy_to_host()
        y[..., 1:] = y[..., :1]
        out.copy_to_device(y)

    with pytest.raises(check.CheckError) as e:
        check.check_conv2d_nhwc(filter_zero_everywhere, quiet=True)
    # in the launcher's own layouts: NHWC shapes, (n, p, q, k) indices
    msg = str(e.value)
    assert re.search(r"conv2d \(NHWC\) FAILED on x\(\d+, \d+, \d+, \d+\) \(N, H, W, C\), "
                     r"w\(\d+, \d+, \d+, \d+\) \(R, S, C, K\), out\(.*\) \(N, P, Q, K\)", msg), msg
    assert "first at index (0, 0, 0, 1)" in msg, msg


def test_coalescing_checker():
    rng = np.random.default_rng(5)
    c = cuda()
    img = c.to_device(check.random_array((32, 64), rng))
    taps = c.to_device(check.random_array((3, 3), rng))
    out = c.device_array((32, 64), np.float32)
    assert "loads" in check.check_coalesced(filter01_naive.filter2d_naive, img, taps, out,
                                            quiet=True)
    with pytest.raises(check.CheckError, match="sectors per warp"):
        check.check_coalesced(filter01_naive.filter2d_naive_rows, img, taps, out)
    with pytest.raises(check.CheckError, match="not implemented"):
        check.check_coalesced(lambda a, k, o: None, img, taps, out)
