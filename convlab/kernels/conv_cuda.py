"""The course's CUDA C convolution: one launcher that picks the algorithm from the shape.

- small 1x1 or few-channel convs (fewer than 2^28 multiply-adds, e.g. every 1x1 layer
  and the stem of ResNet-50 at batch 1): the one-launch implicit GEMM over the flat
  (c, r, s) index with the filters read in place (`flat_igemm_cuda`), whose tiles shrink
  and whose reduction splits until the GPU is full; at this size a weight transform or a
  second launch costs as much as the arithmetic (ResNet-50's 1x1 layers at batch 32 have
  2^28.6 multiply-adds or more and keep the paths below);
- few input channels (C < 16 and C*R*S <= 1024, e.g. ResNet's stem): im2col fused into
  the batched GEMM (`im2col01_cuda.conv2d_im2col_fused_cuda`), whose reduction is exactly
  C*R*S instead of channel slabs padded to 16 or more;
- 3x3, stride 1, dilation 1, when each Winograd-domain GEMM has at least 2^22
  multiply-adds (K * C * number of 4x4 output tiles): Winograd F(4x4, 3x3)
  (`winograd01_cuda`), which does 2.25 multiplications per output instead of 9;
- everything else: the implicit GEMM in CUDA C (`conv09_implicit_gemm_cuda`), with its own
  tile and split-K rules.

Rules on the shape, not a table of layers, so a layer the course never saw gets an
algorithm too (`choose_algorithm`); the stored H200 run of every ResNet-50 layer
(results/h200_resnet50_cuda.json) is what the thresholds are checked against.
"""

from __future__ import annotations

import math

from ._launch import conv_launch_params, launcher

WINOGRAD_MIN_MACS = 2**22
SMALL_MACS = 2**28


def few_channels(p) -> bool:
    """Few input channels and a short reduction (the stem's C = 3, 7x7)."""
    return p.C < 16 and p.C * p.R * p.S <= 1024


def choose_algorithm(p) -> str:
    """'flat_igemm', 'im2col_fused', 'winograd_f4' or 'implicit_gemm' for the `ConvParams` p."""
    one_by_one = (p.R, p.S) == (1, 1) and p.padding == (0, 0)
    macs = p.N * p.K * p.P * p.Q * p.C * p.R * p.S
    if (one_by_one or few_channels(p)) and macs < SMALL_MACS:
        return "flat_igemm"
    if few_channels(p):
        return "im2col_fused"
    if (p.R, p.S) == (3, 3) and p.stride == (1, 1) and p.dilation == (1, 1) and (
            p.padding[0] == p.padding[1]):
        tiles = p.N * math.ceil(p.P / 4) * math.ceil(p.Q / 4)
        if p.K * p.C * tiles >= WINOGRAD_MIN_MACS:
            return "winograd_f4"
    return "implicit_gemm"


@launcher
def conv2d_cuda(x, w, out, stride=1, padding=0, dilation=1, groups=1):
    """NCHW fp32 device arrays, any stride / padding / dilation, groups 1: the algorithm
    `choose_algorithm` names, checked by that kernel's own launcher."""
    p = conv_launch_params("conv2d_cuda", x, w, out, stride, padding, dilation, groups)
    algo = choose_algorithm(p)
    if algo == "flat_igemm":
        from .flat_igemm_cuda import conv2d_flat_igemm_cuda as fn
    elif algo == "im2col_fused":
        from .im2col01_cuda import conv2d_im2col_fused_cuda as fn
    elif algo == "winograd_f4":
        from .winograd01_cuda import conv2d_winograd_f4_cuda as fn
    else:
        from .conv09_implicit_gemm_cuda import conv2d_implicit_gemm_cuda as fn
    return fn(x, w, out, stride, padding, dilation, groups)
