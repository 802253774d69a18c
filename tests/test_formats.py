"""convlab.formats: rounding cross-checked against PyTorch's own conversions (bf16, fp8)
where PyTorch is installed, and against bit-level facts (ties to even, NaN payloads).
"""

from __future__ import annotations

import numpy as np
import pytest

from convlab import formats
from convlab.check.numerics import _rounding_inputs


def _torch():
    return pytest.importorskip("torch")


def _wide(n=20000, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * np.exp(rng.uniform(-40, 40, n))).astype(np.float32)


def test_bf16_matches_torch_on_ties_nans_and_extremes():
    torch = _torch()
    x = np.concatenate([_wide(), _rounding_inputs(np.random.default_rng(1), "bf16")
                        .ravel()])
    mine = formats.round_to(x, "bf16")
    theirs = torch.from_numpy(x.copy()).bfloat16().float().numpy()
    assert np.array_equal(np.isnan(mine), np.isnan(theirs))
    ok = ~np.isnan(mine)
    assert np.array_equal(mine[ok].view(np.uint32), theirs[ok].view(np.uint32))


@pytest.mark.parametrize("fmt,dtype", [("fp8 e4m3", "float8_e4m3fn"), ("fp8 e5m2", "float8_e5m2")])
def test_fp8_matches_torch(fmt, dtype):
    torch = _torch()
    if not hasattr(torch, dtype):
        pytest.skip(f"this PyTorch has no {dtype}")
    x = np.clip(_wide(5000, 3), -formats.FORMATS[fmt].max, formats.FORMATS[fmt].max)
    assert np.array_equal(formats.round_to(x, fmt),
                          torch.from_numpy(x.copy()).to(getattr(torch, dtype)).float().numpy())


def test_tf32_and_fp16_rounding_facts():
    x = _wide()
    x = x[np.isfinite(x) & (np.abs(x) > 1e-30) & (np.abs(x) < 1e30)]
    t = formats.round_to(x, "tf32")
    assert not (t.view(np.uint32) & np.uint32(0x1FFF)).any()  # 13 low bits dropped
    assert np.all(np.abs(t - x) <= 2.0**-11 * np.abs(x))     # within half an ulp of 10 bits
    # ties to even: 1 + 2^-11 lies half-way between 1 and 1 + 2^-10 -> 1 (even)
    assert formats.round_to(np.float32(1 + 2.0**-11), "tf32") == 1.0
    assert formats.round_to(np.float32(1 + 3 * 2.0**-11), "tf32") == np.float32(1 + 2.0**-9)
    assert np.isinf(formats.round_to(np.float32(70000), "fp16"))
    assert formats.round_to(np.float32(65504), "fp16") == 65504
    assert formats.bits(1.0, "bf16") == dict(value=1.0, sign="0", exponent="01111111",
                                       mantissa="0000000")
    assert formats.bits(-2.0, "fp16")["exponent"] == "10000"
    assert formats.bits(-2.0, "fp16")["sign"] == "1"


def test_format_constants():
    f = formats.FORMATS
    assert f["fp16"].max == 65504 and f["bf16"].bits == 16 and f["tf32"].bits == 19
    assert f["fp16"].min_normal == 2.0**-14 and f["fp8 e4m3"].max == 448
    assert f["bf16"].unit_roundoff == 2.0**-8 and f["fp32"].unit_roundoff == 2.0**-24
    assert "65504" in formats.format_table().replace("6.55e+04", "65504")
