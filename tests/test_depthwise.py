"""Depthwise 3x3 kernel and the separable two-pass filter (lesson 11), under the simulator;
the real layer sizes against PyTorch on a GPU."""

import numpy as np
import pytest

import convlab
from convlab import check, problems
from convlab import reference as ref

convlab.setup()
from numba import cuda  # noqa: E402

from convlab.kernels import DEPTHWISE_LADDER, SEPARABLE_LADDER, Unsupported  # noqa: E402
from convlab.kernels import depthwise01_direct as dw  # noqa: E402
from convlab.kernels import separable01_rows_cols as sep  # noqa: E402


def _run(x, w, stride, padding, v):
    kw = dict(stride=stride, padding=padding, groups=x.shape[1])
    exp = ref.conv2d(x.astype(np.float64), w.astype(np.float64), **kw)
    absref = ref.conv2d(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), **kw)
    out = cuda.to_device(check.poisoned(exp.shape))
    dw.launch(cuda.to_device(x), cuda.to_device(w), out, stride, padding, v=v, threads=64)
    return out.copy_to_host(), exp, absref


@pytest.mark.parametrize("shape,stride,padding,v", [
    ((1, 3, 7, 9), 1, 1, 4),   # strips of 4 over 7 rows: a partial last strip
    ((2, 2, 9, 8), 2, 1, 2),
    ((1, 2, 6, 5), 1, 0, 3),
    ((1, 2, 11, 7), 2, 2, 1),
])
def test_depthwise_matches_reference(shape, stride, padding, v):
    rng = np.random.default_rng(sum(shape) + stride + v)
    x = check.random_array(shape, rng)
    w = check.random_array((shape[1], 1, 3, 3), rng)
    got, exp, absref = _run(x, w, stride, padding, v)
    comp = check.compare(got, exp, absref, reduction=9)
    assert comp.ok, comp.summary()


def test_depthwise_launcher_passes_the_checker():
    check.check_depthwise(DEPTHWISE_LADDER["direct"], runs=1, seed=3, quiet=True)


def test_depthwise_checker_catches_a_channel_mixup():
    def wrong(x, w, out, stride=1, padding=0):
        # uses channel 0's filter for every channel
        w0 = np.repeat(w.copy_to_host()[:1], w.shape[0], axis=0)
        return dw.launch(x, cuda.to_device(np.ascontiguousarray(w0)), out, stride, padding)

    wrong.device = True
    with pytest.raises(check.CheckError):
        check.check_depthwise(wrong, runs=1, seed=4, quiet=True)


@pytest.mark.parametrize("kw,w_shape", [
    (dict(groups=1), (3, 3, 3, 3)),      # not depthwise
    (dict(stride=3), (3, 1, 3, 3)),
    (dict(dilation=2, padding=2), (3, 1, 3, 3)),
    (dict(), (6, 1, 3, 3)),              # a channel multiplier: not this kernel
])
def test_depthwise_refuses(kw, w_shape):
    x = cuda.to_device(np.zeros((1, 3, 8, 8), np.float32))
    w = cuda.to_device(np.zeros(w_shape, np.float32))
    out = cuda.device_array((1, w_shape[0], 8, 8), np.float32)
    with pytest.raises((Unsupported, ValueError)):
        dw.conv2d_depthwise(x, w, out, **kw)


def test_depthwise_arithmetic():
    assert dw.loads_per_output(1) == 9
    assert dw.loads_per_output(4) == 4.5
    assert dw.loads_per_output(2, stride=2) == 7.5
    assert dw.thread_count((2, 3, 14, 14), 7) == 2 * 3 * 2 * 14
    assert dw.thread_count((1, 1, 14, 14), 4, stride=2) == 2 * 7
    assert dw.default_tile(14, 1) == dict(v=7, threads=128)
    assert dw.default_tile(112, 1)["v"] == 8 and dw.default_tile(13, 1)["v"] == 1
    assert dw.default_tile(7, 2)["v"] == 4


@pytest.mark.parametrize("H,W,R,S", [(13, 21, 3, 5), (9, 6, 5, 1), (11, 17, 7, 3)])
def test_separable_matches_the_2d_filter(H, W, R, S):
    rng = np.random.default_rng(H * W)
    img = check.random_array((H, W), rng)
    col, row = check.random_array((R,), rng), check.random_array((S,), rng)
    k = np.outer(col, row).astype(np.float64)
    exp = ref.filter2d(img.astype(np.float64), k)
    absref = ref.filter2d(np.abs(img).astype(np.float64), np.abs(k))
    out = cuda.to_device(check.poisoned((H, W)))
    SEPARABLE_LADDER["rows_cols"](cuda.to_device(img), cuda.to_device(col),
                                  cuda.to_device(row), out)
    comp = check.compare(out.copy_to_host(), exp, absref, reduction=R * S)
    assert comp.ok, comp.summary()


def test_separable_refuses_even_sizes_and_counts_flops():
    z = cuda.to_device(np.zeros((8, 8), np.float32))
    with pytest.raises(Unsupported):
        sep.filter2d_separable(z, cuda.to_device(np.ones(4, np.float32)),
                               cuda.to_device(np.ones(3, np.float32)), z)
    assert sep.flops_per_pixel(15, 15, True) == 60
    assert sep.flops_per_pixel(15, 15, False) == 450
    assert sep.bytes_per_pixel(True) == 2 * sep.bytes_per_pixel(False)


def test_depthwise_problems():
    for name in ("dw512", "dw32"):
        for real in (True, False):
            p = problems.depthwise_layer(name, real=real)
            assert p.w_shape == (p.C, 1, 3, 3) and p.kwargs["groups"] == p.C
            assert p.out_shape == p.x_shape
    assert problems.depthwise_layer("dw512", real=True).x_shape == (32, 512, 14, 14)
    assert problems.depthwise_layer("dw32", real=True).x_shape == (32, 32, 112, 112)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["dw512", "dw32"])
@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_real_layers_on_gpu(name, stride):
    prob = problems.depthwise_layer(name)
    rng = np.random.default_rng(7)
    x = check.random_array(prob.x_shape, rng)
    w = check.random_array(prob.w_shape, rng)
    for v in (1, 4, 7):
        got, exp, absref = _run(x, w, stride, 1, v)
        comp = check.compare(got, exp, absref, reduction=9)
        assert comp.ok, (v, comp.summary())


def test_separable_factors_checker():
    def svd_factors(k):
        u, s, vt = np.linalg.svd(np.asarray(k, np.float64))
        return None if s[0] == 0 or (len(s) > 1 and s[1] > 1e-8 * s[0]) else (u[:, 0] * s[0], vt[0])

    check.check_separable_factors(svd_factors, quiet=True)
    with pytest.raises(check.CheckError, match="separable"):
        check.check_separable_factors(lambda k: None, quiet=True)
    with pytest.raises(check.CheckError):  # first row and column: right only for some kernels
        check.check_separable_factors(lambda k: (k[:, 0], k[0] / k[0, 0]), quiet=True)

    def no_sigma(k):  # the singular value forgotten: 1/s times the kernel
        f = svd_factors(k)
        return f and (f[0] / np.linalg.svd(k, compute_uv=False)[0], f[1])

    with pytest.raises(check.CheckError, match=r"hint: outer\(col, row\) is \S+ x the kernel "
                                               r"\(the largest singular value is"):
        check.check_separable_factors(no_sigma, quiet=True)
    with pytest.raises(check.CheckError, match=r"is -1 x the kernel \(a sign"):
        check.check_separable_factors(lambda k: (f := svd_factors(k)) and (-f[0], f[1]),
                                      quiet=True)
    with pytest.raises(check.CheckError, match=r"is \|kernel\|: the factors' signs"):
        check.check_separable_factors(lambda k: (f := svd_factors(k)) and (np.abs(f[0]),
                                                                           np.abs(f[1])),
                                      quiet=True)


def test_depthwise_checker_with_a_multiplier():
    def mult_ref(x, w, stride=1, padding=0):
        return ref.conv2d(x.astype(np.float64), w.astype(np.float64), stride=stride,
                          padding=padding, groups=x.shape[1]).astype(np.float32)

    check.check_depthwise(mult_ref, multiplier=2, device=False, quiet=True, runs=1)

    def wrong_channel(x, w, stride=1, padding=0):  # output k reads channel k % C, not k // M
        C = x.shape[1]
        xs = np.concatenate([x] * (w.shape[0] // C), axis=1)
        return ref.conv2d(xs.astype(np.float64), w.astype(np.float64), stride=stride,
                          padding=padding, groups=w.shape[0]).astype(np.float32)

    with pytest.raises(check.CheckError):
        check.check_depthwise(wrong_channel, multiplier=2, device=False, quiet=True, runs=1)


@pytest.mark.parametrize("shape,stride,padding,v,block", [
    ((1, 3, 7, 9), 1, 1, 4, None),          # border path everywhere
    ((2, 3, 12, 11), 1, 1, 3, (8, 2, 2)),   # interior strips, several planes per block
    ((1, 2, 13, 10), 2, 1, 2, (4, 2, 3)),   # stride 2, a partial block of planes
    ((1, 2, 9, 8), 1, 0, 7, (8, 1, 1)),     # no padding: interior loads only
])
def test_depthwise_3d_variant(shape, stride, padding, v, block):
    rng = np.random.default_rng(sum(shape) * 3 + v)
    x = check.random_array(shape, rng)
    w = check.random_array((shape[1], 1, 3, 3), rng)
    kw = dict(stride=stride, padding=padding, groups=shape[1])
    exp = ref.conv2d(x.astype(np.float64), w.astype(np.float64), **kw)
    absref = ref.conv2d(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), **kw)
    out = cuda.to_device(check.poisoned(exp.shape))
    dw.launch_3d(cuda.to_device(x), cuda.to_device(w), out, stride, padding, v=v, threads=32,
                 block=block)
    comp = check.compare(out.copy_to_host(), exp, absref, reduction=9)
    assert comp.ok, comp.summary()
    assert dw.block_3d(14, 14, 7) == (16, 2, 4) and dw.block_3d(112, 112, 8) == (32, 4, 1)
