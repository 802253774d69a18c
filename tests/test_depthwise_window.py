"""The window kernel in pure Numba (convlab/kernels/depthwise06_window.py).

Under the simulator: the launcher on several images and channels (each plane its own
taps), runs of 4 outputs that cross 14-float rows, 8, 2 and 1 outputs per thread (the
16-byte build and the 4-byte one), 3x3, 5x5 and 3x5 filters, a last block past the end,
NaN-poisoned outputs, against float64 `reference.conv2d` with groups = C; refusals. In a
process compiling for the GPU (no GPU needed): the PTX loads the window in the 16-byte
vectors `window_runs` counts, stores 16 bytes per four outputs, keeps the window in
registers (no local memory) and its indices in 32 bits (no 64-bit compare or select).
On a GPU (marked gpu): the launcher against the reference.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import convlab
from convlab import check

convlab.setup()
from numba import cuda  # noqa: E402

from convlab.kernels import depthwise06_window as D  # noqa: E402

from ._depthwise import (  # noqa: E402
    GPU_SHAPES,
    SAME_PADDING_REFUSALS,
    assert_launcher_on_gpu,
    assert_refused,
)
from ._emulate import assert_close_to_reference  # noqa: E402


@pytest.mark.parametrize("shape, R, S, tiling, built", [
    ((2, 3, 14, 14), 3, 3, {}, dict(v=4, wide=True)),          # runs cross rows of 14
    ((1, 3, 8, 12), 3, 3, dict(v=8), dict(v=8, wide=True)),    # two 16-byte stores a thread
    ((1, 3, 7, 8), 5, 5, {}, dict(v=4, wide=True)),            # 5x5
    ((1, 4, 6, 6), 3, 5, dict(v=2), dict(v=2, wide=False)),    # 3x5, 4-byte build
    ((2, 2, 5, 7), 3, 3, {}, dict(v=1, wide=False)),           # 35-float planes: one output
    ((1, 2, 14, 14), 3, 3, dict(v=8, threads=64), dict(v=4, wide=True)),  # 196 = 4 x 49
])
def test_launcher_matches_float64(shape, R, S, tiling, built):
    rng = np.random.default_rng(shape[3] + R + S)
    x = check.random_array(shape, rng)
    w = check.random_array((shape[1], 1, R, S), rng)
    dx, dw = cuda.to_device(x), cuda.to_device(w)
    out = cuda.to_device(check.poisoned(shape))
    D.launch(dx, dw, out, 1, (R // 2, S // 2), **tiling)
    assert_close_to_reference(out.copy_to_host(), x, w, padding=(R // 2, S // 2),
                              groups=shape[1])
    t = D.plan(dx, dw, out, 1, (R // 2, S // 2), **{**D.DEFAULT, **tiling})[-1]
    assert {k: t[k] for k in built} == built


@pytest.mark.parametrize("kw, match", SAME_PADDING_REFUSALS + [
    (dict(v=16), "bad tiling"),
    (dict(threads=48), "bad tiling"),
    (dict(threads=1024, min_blocks=4), "bad tiling")])
def test_refusals(kw, match):
    assert_refused(D.launch, kw, match)


PTX = """
import convlab
convlab.setup("gpu")
from numba import cuda
from convlab.kernels import depthwise06_window as D
from convlab.kernels.depthwise05_window_cuda import window_runs

for H, v, wide in ((14, 4, True), (112, 4, True), (112, 8, True), (14, 4, False)):
    k = D.make_kernel(H, H, 3, 3, 32, v, wide, 256)
    ptx, _ = cuda.compile_ptx(k.py_func, D.SIGNATURE, cc=(9, 0))
    lines = [ln.strip() for ln in ptx.splitlines()]
    loads = [ln for ln in lines if ln.startswith("ld.global")]
    stores = [ln for ln in lines if ln.startswith("st.global")]
    vectors = sum(n for _, n in window_runs(H, 3, 3, v, 4 if wide else 1))
    if wide:
        assert sum(".v4.f32" in ln for ln in loads) == vectors, (H, v, loads)
        assert [ln.split()[0] for ln in stores] == ["st.global.v4.f32"] * (v // 4), stores
    else:
        assert not any(".v4" in ln for ln in loads + stores)
        assert len(loads) == vectors + 9 and len(stores) == v, (len(loads), len(stores))
    assert not any(".local" in ln for ln in lines), f"window in local memory: {H} {v} {wide}"
    # indices stay 32-bit: Numba widens int32 arithmetic to 64 bits unless cast back (each
    # 64-bit compare or select is two SASS instructions; this kernel's count doubled so)
    wide_ops = [ln for ln in lines if ln.startswith(("setp.", "selp.")) and "64" in ln.split()[0]]
    assert not wide_ops, (H, v, wide, len(wide_ops), wide_ops[:3])
print("ptx ok")
"""


def test_ptx_loads_the_window_in_vectors_and_keeps_it_in_registers():
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(PTX)], capture_output=True,
                       text=True, timeout=600, env={**os.environ, "CONVLAB_MODE": "gpu"})
    assert r.returncode == 0 and "ptx ok" in r.stdout, r.stdout + r.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_launcher_on_gpu(shape):
    assert_launcher_on_gpu(D.launch, shape,
                           ({}, dict(v=8, threads=128), dict(v=2), dict(min_blocks=None)))
