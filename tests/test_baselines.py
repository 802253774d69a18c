"""convlab.baselines: the library rows of the ladder and of lesson 12.

The im2col + GEMM steps run with NumPy in place of CuPy, and the cuDNN row with PyTorch's
CPU convolution, so their arithmetic is checked without a GPU; the precision sweeps need
one (marked gpu).
"""

import numpy as np
import pytest

from convlab import baselines, check, problems


@pytest.mark.parametrize("kw", [dict(stride=1, padding=1), dict(stride=(2, 1), padding=(0, 2),
                                                                dilation=(1, 2))])
def test_im2col_gemm_steps_match_the_reference(kw):
    prob = problems.ConvProblem("odd", 2, 3, 11, 9, 5, 3, 2, **kw)
    impl = baselines.cublas_im2col_impl(prob, xp=np)
    assert impl.kind == "library"
    case = check.reference_case(check.random_array(prob.x_shape, np.random.default_rng(0)),
                                check.random_array(prob.w_shape, np.random.default_rng(1)),
                                **prob.kwargs)
    state = impl.prepare(*case["inputs"])
    impl.run(state)
    comp = check.compare(impl.fetch(state), case["expected"], case["absref"], case["reduction"])
    assert comp.ok, comp.summary()


def test_cudnn_row_on_the_cpu_matches_the_reference():
    torch = pytest.importorskip("torch")
    prob = problems.ConvProblem("odd", 1, 4, 9, 7, 6, 3, 3, stride=2, padding=1)
    impl = baselines.cudnn_conv_impl(prob, device="cpu")
    assert impl.name == "cuDNN fp32" and impl.kind == "library"
    rng = np.random.default_rng(2)
    case = check.reference_case(check.random_array(prob.x_shape, rng),
                                check.random_array(prob.w_shape, rng), **prob.kwargs)
    state = impl.prepare(*case["inputs"])
    impl.run(state)
    assert check.compare(impl.fetch(state), case["expected"], case["absref"],
                         case["reduction"]).ok
    assert not torch.backends.cudnn.allow_tf32  # fp32 means TF32 off


@pytest.mark.gpu
def test_gemm_and_conv_precisions_check_then_time():
    if not baselines.torch_available():
        pytest.skip("needs PyTorch with CUDA")
    rows = baselines.gemm_precisions(n=1024, repeat=3)
    by = {r["precision"]: r for r in rows}
    assert set(by) == {"fp32", "tf32", "bf16", "fp16"}
    assert by["fp32"]["speedup_vs_fp32"] == 1 and by["fp32"]["max_rel"] < 1e-5
    assert by["fp32"]["max_rel"] < by["tf32"]["max_rel"] < by["bf16"]["max_rel"]
    conv = baselines.conv_precisions(problems.conv_layer("resnet64"), repeat=3)
    names = [r["name"] for r in conv]
    assert names[0] == "cuDNN fp32" and "cuDNN fp16 NHWC" in names
    assert all(r["ms"] > 0 and r["rel_l2"] < 1e-2 for r in conv)


def _event(name, start, device="CUDA"):
    from types import SimpleNamespace as NS

    return NS(name=name, device_type=NS(name=device), time_range=NS(start=start))


def test_kernel_names_are_in_launch_order_without_memsets_and_copies():
    events = [_event("fft2d_c2r_32x32", 30), _event("Memset (Device)", 5),
              _event("fft2d_r2c_32x32", 10), _event("Memcpy DtoD (Device -> Device)", 20),
              _event("aten::conv2d", 1, device="CPU"), _event("cgemm_sm90", 15)]
    names = baselines.kernel_names(events)
    assert names == ["fft2d_r2c_32x32", "cgemm_sm90", "fft2d_c2r_32x32"]
    assert baselines.algorithm_of(names) == "FFT"


@pytest.mark.parametrize("kernels, algorithm", [
    (["nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_TNT"], "GEMM (nvJet)"),
    (["sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc"], "implicit GEMM"),
    (["sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8"], "GEMM"),
    (["winograd_4x4_nchw"], "Winograd"),
])
def test_algorithm_of_names_what_the_library_ran(kernels, algorithm):
    assert baselines.algorithm_of(kernels) == algorithm
