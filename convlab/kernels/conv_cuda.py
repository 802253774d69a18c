"""The course's CUDA C convolution: one launcher that picks the algorithm from the shape.

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


def choose_algorithm(p) -> str:
    """'im2col_fused', 'winograd_f4' or 'implicit_gemm' for the `ConvParams` p."""
    if p.C < 16 and p.C * p.R * p.S <= 1024:
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
    if algo == "im2col_fused":
        from .im2col01_cuda import conv2d_im2col_fused_cuda as fn
    elif algo == "winograd_f4":
        from .winograd01_cuda import conv2d_winograd_f4_cuda as fn
    else:
        from .conv09_implicit_gemm_cuda import conv2d_implicit_gemm_cuda as fn
    return fn(x, w, out, stride, padding, dilation, groups)
