"""The shape rules of convlab/kernels/conv_cuda.py against the stored H200 measurements.

Without a GPU: on every row of the stored runs of every ResNet-50 conv at batch 32, 1 and
128 (results/h200_resnet50_cuda.json and h200_resnet50_all.json: the candidate kernels and
cuDNN timed in one call each), the algorithm `choose_algorithm` names was timed on that row
and is within 1.25x of the fastest CUDA C candidate there; the rules hold on shapes outside
ResNet-50. On a GPU (marked gpu): the launcher against the reference on one shape of each
rule.
"""

from __future__ import annotations

import numpy as np
import pytest

from convlab import check, problems, results
from convlab import reference as ref
from convlab.kernels import conv_cuda

from ._emulate import assert_close_to_reference

KERNEL = {"im2col_fused": "im2col_fused_cuda", "winograd_f4": "winograd_f4_cuda",
          "implicit_gemm": "implicit_gemm_cuda", "flat_igemm": "flat_igemm_cuda"}


@pytest.mark.parametrize("stored", ["h200_resnet50_cuda", "h200_resnet50_all"])
def test_picks_on_every_stored_resnet50_row_are_near_the_fastest(stored):
    run = results.load(stored)["resnet50"]
    layers = {lay.name: lay for lay in problems.RESNET50}
    assert len(run["rows"]) == 3 * len(layers)
    picked = set()
    for row in run["rows"]:
        prob = layers[row["layer"]].with_batch(row["batch"])
        p = ref.conv_params(prob.x_shape, prob.w_shape, **prob.kwargs)
        name = KERNEL[conv_cuda.choose_algorithm(p)]
        picked.add(name)
        times = {k: v for k, v in row["ms"].items() if k in KERNEL.values() and v}
        assert name in times, (row["layer"], row["batch"], name, row["errors"])
        assert times[name] <= 1.25 * min(times.values()), (row["layer"], row["batch"], name)
    assert picked == set(KERNEL.values())  # every rule decides somewhere


@pytest.mark.parametrize("x, w, kw, want", [
    ((64, 1, 128, 128), (16, 1, 5, 5), dict(padding=2), "im2col_fused"),  # grayscale input
    ((16, 96, 40, 40), (96, 96, 3, 3), dict(padding=1), "winograd_f4"),
    ((16, 96, 40, 40), (96, 96, 3, 3), dict(padding=1, stride=2), "implicit_gemm"),
    ((16, 96, 40, 40), (96, 96, 3, 3), dict(padding=2, dilation=2), "implicit_gemm"),
    ((1, 96, 10, 10), (96, 96, 3, 3), dict(padding=1), "implicit_gemm"),  # too little work
    ((32, 96, 40, 40), (96, 96, 1, 1), {}, "implicit_gemm"),
    ((1, 96, 40, 40), (96, 96, 1, 1), {}, "flat_igemm")])
def test_rules_on_other_shapes(x, w, kw, want):
    assert conv_cuda.choose_algorithm(ref.conv_params(x, w, **kw)) == want


@pytest.mark.gpu
@pytest.mark.parametrize("x, w, kw", [((2, 3, 23, 19), (8, 3, 7, 7), dict(stride=2, padding=3)),
                                      ((32, 64, 16, 16), (64, 64, 3, 3), dict(padding=1)),
                                      ((3, 24, 9, 11), (10, 24, 3, 3), dict(stride=2))])
def test_launcher_on_gpu(x, w, kw):
    from numba import cuda

    rng = np.random.default_rng(5)
    xs, ws = check.random_array(x, rng), check.random_array(w, rng)
    p = ref.conv_params(x, w, **kw)
    out = cuda.to_device(check.poisoned(p.out_shape))
    conv_cuda.conv2d_cuda(cuda.to_device(xs), cuda.to_device(ws), out, **kw)
    assert_close_to_reference(out.copy_to_host(), xs, ws, **kw)
