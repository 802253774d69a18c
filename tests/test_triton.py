"""convlab.kernels.triton01_implicit_gemm: refused clearly without Triton or a GPU, left out
of the race there; on a GPU, checked against the float64 reference on odd shapes that reach
every masked edge (several reduction slabs, several filter tiles, strides, 1x1, 7x7)."""

from __future__ import annotations

import numpy as np
import pytest

from convlab import check, ladder
from convlab import reference as ref
from convlab.errors import Unsupported
from convlab.kernels import triton01_implicit_gemm as tri
from convlab.runtime import is_simulator


@pytest.mark.skipif(not is_simulator(), reason="the refusal is for machines without a GPU")
def test_refused_without_a_gpu_and_not_raced():
    assert not tri.available()
    x, w = np.zeros((1, 2, 5, 5), np.float32), np.zeros((3, 2, 3, 3), np.float32)
    with pytest.raises(Unsupported, match="needs Triton, PyTorch and a GPU"):
        tri.conv2d_triton(x, w, np.zeros((1, 3, 3, 3), np.float32))
    assert ladder.beside_kernels() == {}
    assert "triton" not in ladder.sweep_kernels()


def test_wrong_output_shape_is_refused_first():
    x, w = np.zeros((1, 2, 5, 5), np.float32), np.zeros((3, 2, 3, 3), np.float32)
    with pytest.raises(Unsupported, match=r"out must have shape \(1, 3, 5, 5\)"):
        tri.conv2d_triton(x, w, np.zeros((1, 3, 3, 3), np.float32), padding=1)


CASES = [  # (N, C, H, W, K, R, S, stride, padding, dilation)
    (2, 37, 11, 13, 70, 3, 3, 1, 1, 1),    # C*R*S = 333: many BLOCK_K slabs, K > BLOCK_N
    (3, 19, 17, 9, 131, 3, 3, 2, 1, 1),    # stride 2, K not a multiple of any tile
    (1, 3, 29, 31, 64, 7, 7, 2, 3, 1),     # the stem's shape: few channels, 7x7/2
    (2, 65, 7, 7, 33, 1, 1, 1, 0, 1),      # 1x1
    (1, 8, 12, 10, 16, 3, 3, 1, 2, 2),     # dilation 2
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:7])))
def test_triton_conv_matches_the_reference(case):
    import torch

    if not tri.available():
        pytest.skip("Triton is not installed here")
    N, C, H, W, K, R, S, st, pad, dil = case
    rng = np.random.default_rng(sum(case))
    x, w = check.random_array((N, C, H, W), rng), check.random_array((K, C, R, S), rng)
    kw = dict(stride=st, padding=pad, dilation=dil)
    c = check.reference_case(x, w, op=ref.conv2d_im2col, **kw)
    out = torch.full(c["expected"].shape, float("nan"), device="cuda")
    tri.conv2d_triton(torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda(), out, **kw)
    comp = check.compare(out.cpu().numpy(), c["expected"], c["absref"], c["reduction"])
    assert comp.ok, comp.summary()
    assert tri.best_config()["BLOCK_M"] in (32, 64, 128)


def test_an_unknown_precision_is_refused():
    x, w = np.zeros((1, 2, 5, 5), np.float32), np.zeros((3, 2, 3, 3), np.float32)
    with pytest.raises(Unsupported, match="precision must be 'fp32' or 'tf32'"):
        tri.conv2d_triton(x, w, np.zeros((1, 3, 5, 5), np.float32), padding=1,
                          precision="fp16")


@pytest.mark.gpu
def test_triton_tf32_is_within_tf32_tolerance_and_not_fp32():
    import torch

    if not tri.available():
        pytest.skip("Triton is not installed here")
    rng = np.random.default_rng(7)
    x, w = check.random_array((2, 37, 11, 13), rng), check.random_array((70, 37, 3, 3), rng)
    c = check.reference_case(x, w, op=ref.conv2d_im2col, padding=1)
    out = torch.full(c["expected"].shape, float("nan"), device="cuda")
    tri.conv2d_triton(torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda(), out, padding=1,
                      precision="tf32")
    got = out.cpu().numpy()
    assert check.compare(got, c["expected"], c["absref"], c["reduction"], "tf32").ok
    assert not check.compare(got, c["expected"], c["absref"], c["reduction"], "fp32").ok


@pytest.mark.gpu
def test_a_channels_last_or_half_tensor_is_refused():
    import torch

    if not tri.available():
        pytest.skip("Triton is not installed here")
    x = torch.zeros((1, 4, 6, 6), device="cuda").to(memory_format=torch.channels_last)
    w = torch.zeros((3, 4, 3, 3), device="cuda")
    out = torch.zeros((1, 3, 6, 6), device="cuda")
    with pytest.raises(Unsupported, match="x must be a contiguous float32"):
        tri.conv2d_triton(x, w, out, padding=1)
    with pytest.raises(Unsupported, match="w must be a contiguous float32"):
        tri.conv2d_triton(x.contiguous(), w.half(), out, padding=1)
