"""depthwise02_smem (shared-memory tile, shape-specialised) under the simulator: both
tilings (whole planes, bands), stride 1 and 2, padding 0-2, 3x3 and 5x5; refusals; PTX."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import convlab
from convlab import check
from convlab import reference as ref

convlab.setup()
from numba import cuda  # noqa: E402

from convlab.kernels import DEPTHWISE_LADDER, Unsupported  # noqa: E402
from convlab.kernels import depthwise02_smem as dws  # noqa: E402


def _check(shape, stride, padding, R, S, **tiling):
    rng = np.random.default_rng(sum(shape) * 7 + stride * 3 + padding + R * S)
    x = check.random_array(shape, rng)
    w = check.random_array((shape[1], 1, R, S), rng)
    kw = dict(stride=stride, padding=padding, groups=shape[1])
    exp = ref.conv2d(x.astype(np.float64), w.astype(np.float64), **kw)
    absref = ref.conv2d(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), **kw)
    out = cuda.to_device(check.poisoned(exp.shape))
    dws.launch(cuda.to_device(x), cuda.to_device(w), out, stride, padding, **tiling)
    comp = check.compare(out.copy_to_host(), exp, absref, reduction=R * S)
    assert comp.ok, comp.summary()


@pytest.mark.parametrize("shape,stride,padding,R,S,tiling", [
    # whole planes: several planes per block, a ragged last group (5 planes, g=2)
    ((1, 5, 7, 9), 1, 1, 3, 3, dict(g=2, v=7, threads=64)),
    ((2, 3, 9, 7), 2, 1, 3, 3, dict(g=4, threads=96)),          # 6 planes, g=4: ragged
    ((1, 3, 8, 11), 1, 2, 5, 5, dict(g=3, v=4, threads=128)),   # pass = whole planes
    ((1, 2, 9, 8), 1, 0, 3, 5, dict(g=2, v=7, threads=32)),     # no padding, 3x5
    # bands of tp output rows of one plane, a partial last band
    ((1, 2, 13, 10), 1, 1, 3, 3, dict(tp=4, v=2, threads=32)),
    ((1, 2, 13, 11), 2, 2, 5, 5, dict(tp=3, v=3, threads=32)),
    ((1, 1, 17, 12), 2, 0, 3, 3, dict(tp=2, v=1, threads=32)),
    ((1, 2, 11, 9), 1, 1, 3, 3, dict(g=2, tp=5, v=5, threads=64)),  # bands of 2 planes
])
def test_smem_matches_reference(shape, stride, padding, R, S, tiling):
    _check(shape, stride, padding, R, S, **tiling)


def test_smem_default_tiling_and_checker():
    _check((1, 6, 7, 7), 1, 1, 3, 3)  # the defaults (whole planes)
    check.check_depthwise(DEPTHWISE_LADDER["smem"], runs=1, seed=5, quiet=True)


def test_default_tiling_of_the_real_layers():
    t = dws.default_tiling(32, 512, 14, 14, 14, 14)
    assert t == dict(g=8, tp=14, v=7, threads=256)  # 8 planes of a 16x16 tile: 8 KB
    t = dws.default_tiling(32, 32, 112, 112, 112, 112)
    assert t["g"] == 1 and t["tp"] == 16 and t["tp"] % t["v"] == 0  # bands
    t = dws.default_tiling(32, 512, 14, 14, 7, 7, 3, 3, 2)
    assert (t["g"], t["v"], t["threads"]) == (8, 7, 256)  # the sweep's best at stride 2
    for shape, s in (((32, 512, 14, 14), 2), ((32, 32, 112, 112), 2), ((1, 1, 300, 300), 1)):
        N, C, H, W = shape
        P = Q = (H + 2 - 3) // s + 1
        t = dws.default_tiling(N, C, H, W, P, Q, 3, 3, s)
        TR, TC = dws.tile_shape(P, Q, 3, 3, s, t["tp"])
        assert t["g"] * TR * TC * 4 <= dws.SMEM_LIMIT and t["threads"] % 32 == 0
        assert t["tp"] % t["v"] == 0 and t["threads"] >= TC


@pytest.mark.parametrize("kw,w_shape,tiling", [
    (dict(groups=1), (3, 3, 3, 3), {}),           # not depthwise
    (dict(stride=3), (3, 1, 3, 3), {}),
    (dict(dilation=2, padding=2), (3, 1, 3, 3), {}),
    (dict(), (3, 1, 9, 9), {}),                   # 81 taps > MAX_TAPS
    (dict(padding=1), (3, 1, 3, 3), dict(tp=4, v=3)),   # v must divide tp
    (dict(padding=1), (3, 1, 3, 3), dict(threads=48)),  # not a multiple of 32
])
def test_smem_refuses(kw, w_shape, tiling):
    x = cuda.to_device(np.zeros((1, 3, 12, 12), np.float32))
    w = cuda.to_device(np.zeros(w_shape, np.float32))
    R = w_shape[2]
    p = kw.get("padding", 0)
    P = (12 + 2 * p - R) // kw.get("stride", 1) + 1
    out = cuda.device_array((1, w_shape[0], max(P, 1), max(P, 1)), np.float32)
    with pytest.raises((Unsupported, ValueError)):
        dws.launch(x, w, out, **kw, **tiling)


def test_smem_refuses_a_tile_too_large():
    with pytest.raises(Unsupported, match="shared memory"):
        dws.make_kernel(200, 200, 200, 200, 3, 3, 1, 1, 1, 1, 1, 200, 8, 256)


def test_ptx_no_local_memory_and_fewer_instructions():
    code = """
        import convlab; convlab.setup('gpu')
        from numba import cuda
        from convlab.kernels import depthwise01_direct as dw, depthwise02_smem as m
        old, _ = cuda.compile_ptx(dw.make_kernel(7, 1).py_func, dw.SIGNATURE, cc=(9, 0))
        t = m.TILING_DW512
        new, _ = cuda.compile_ptx(m.KERNEL.py_func, m.SIGNATURE, cc=(9, 0))
        assert ".target sm_90" in new and "ld.shared" in new and "bar.sync" in new
        print("local", "ld.local" in new or "st.local" in new)
        per = m.ptx_instructions(new) / m.outputs_per_thread(14, 14, t["g"], t["tp"], t["v"],
                                                             t["threads"])
        print("per_output", per, m.ptx_instructions(old) / 7)
    """
    e = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", "CONVLAB_MODE")}
    e["CONVLAB_MODE"] = "gpu"
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, env=e, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    assert lines["local"] == "False"
    new, old = map(float, lines["per_output"].split())
    assert new < 0.6 * old, (new, old)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["dw512", "dw32"])
@pytest.mark.parametrize("stride", [1, 2])
def test_smem_real_layers_on_gpu(name, stride):
    from convlab import problems

    prob = problems.depthwise_layer(name)
    _check(prob.x_shape, stride, 1, 3, 3)
