"""convlab.census: ResNet-18's FLOP count against convlab.reference's per-layer count, and
the time census by kind of layer (CPU; PyTorch needed).
"""

from __future__ import annotations

import pytest

from convlab import census
from convlab import reference as ref


def _torch():
    return pytest.importorskip("torch")


def test_resnet18_flops_match_the_reference_count():
    _torch()
    side = 64
    flops = census.census_flops(census.resnet18(), (1, 3, side, side))
    conv = 0
    hw = ref.conv2d_output_shape((side, side), (7, 7), 2, 3)[0]
    conv += ref.conv2d_flops((1, 3, side, side), (64, 3, 7, 7), stride=2, padding=3)
    hw = ref.conv2d_output_shape((hw, hw), (3, 3), 2, 1)[0]
    c = 64
    for k, s in [(64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)]:
        conv += ref.conv2d_flops((1, c, hw, hw), (k, c, 3, 3), stride=s, padding=1)
        p = ref.conv2d_output_shape((hw, hw), (3, 3), s, 1)[0]
        conv += ref.conv2d_flops((1, k, p, p), (k, k, 3, 3), stride=1, padding=1)
        if s != 1 or c != k:
            conv += ref.conv2d_flops((1, c, hw, hw), (k, c, 1, 1), stride=s, padding=0)
        hw, c = p, k
    assert flops["convolution"] == conv
    assert flops["fully connected"] == 2 * 512 * 1000
    assert flops["convolution"] / sum(flops.values()) > 0.98


def test_census_time_reports_every_kind():
    torch = _torch()
    t = census.census_time(census.resnet18(), torch.randn(1, 3, 32, 32), runs=1)
    assert set(census.KINDS) <= set(t) and t["total"] > 0 and t["unhooked"] > 0
    assert all(t[k] >= 0 for k in census.KINDS) and t["convolution"] > 0


def test_conv_share_isolated_counts_every_convolution():
    torch = _torch()
    r = census.conv_share_isolated(census.resnet18(), torch.randn(1, 3, 32, 32), runs=1)
    assert r["convs"] == 20 and r["conv_ms"] > 0 and r["total_ms"] > 0
