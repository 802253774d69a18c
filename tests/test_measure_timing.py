"""convlab.measure.timing's sustained timer: nvidia-smi's samples read right, the slowing
reasons named, and tensor_cores' back-to-back race averaged and compared right; the cuDNN
anchor of tensor_cores' races is the fastest of several autotunes."""

from __future__ import annotations

import time

import numpy as np
import pytest

from convlab.measure import FakeClock, timing
from convlab.measure import tensor_cores as TC


def _stamp(t: float) -> str:
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


def test_smi_samples_inside_the_window_only():
    t0 = 1_800_000_000.25
    text = "\n".join([
        "timestamp, clocks.current.sm [MHz], power.draw [W]",         # a header
        f"{_stamp(t0 - 0.5)}, 1980, 120.5, 40, 0x0000000000000000",   # before the run
        f"{_stamp(t0 + 0.1)}, 1755, 669.8, 58, 0x0000000000000004",
        f"{_stamp(t0 + 0.3)}, [N/A], 650.0, 58, 0x0000000000000004",  # unreadable
        f"{_stamp(t0 + 0.4)}, 1485, 691.2, 59, 0x0000000000000084",
        f"{_stamp(t0 + 2.0)}, 345, 80.0, 50, 0x0000000000000001",     # after it
        f"{_stamp(t0 + 0.6)}, 1500",                                   # cut short
    ])
    rows = timing.parse_smi_samples(text, t0, t0 + 1.0)
    assert rows == [(1755.0, 669.8, 58.0, 0x4), (1485.0, 691.2, 59.0, 0x84)]


def test_clock_reasons_name_the_bits_that_slow_the_clock():
    assert timing.clock_reasons(0x4) == ["software power cap"]
    assert timing.clock_reasons(0x84) == ["software power cap", "hardware power brake"]
    assert timing.clock_reasons(0x1) == []   # idle: not a slowdown


class _ScriptedClock:
    """clock.sustained returning the next scripted result of each function's name."""

    def __init__(self, script):
        self.script = {k: list(v) for k, v in script.items()}

    def sustained(self, fn):
        return dict(self.script[fn()].pop(0), calls=100, method="scripted")


class _Ctx:
    def __init__(self, clock):
        self.clock = clock

    def log(self, msg):
        pass


def _result(ms, mhz, watts, reasons=()):
    return dict(ms=ms, sm_mhz=mhz, power_w=watts, reasons=list(reasons))


def test_sustained_race_averages_rounds_and_compares_with_the_library():
    clock = _ScriptedClock({
        "lib": [_result(1.0, 1480, 690, ["software power cap"]), _result(1.2, 1460, 700)],
        "ours": [_result(2.0, 1750, 660), _result(1.4, 1760, 670, ["hardware power brake"])],
    })
    race = TC._sustained_race(_Ctx(clock), [("lib", lambda: "lib"), ("ours", lambda: "ours")],
                              flops=2e12, rounds=2)
    lib, ours = race["rows"]
    assert race["library"] == "lib" and race["rounds"] == 2
    assert lib["ms"] == pytest.approx(1.1) and ours["ms"] == pytest.approx(1.7)
    assert ours["pct_library"] == pytest.approx(100 * 1.1 / 1.7)
    assert lib["pct_library"] == pytest.approx(100.0)
    assert ours["tflops"] == pytest.approx(2e12 / 1.7 / 1e9)
    assert lib["sm_mhz"] == pytest.approx(1470) and ours["power_w"] == pytest.approx(665)
    assert lib["reasons"] == ["software power cap"]
    assert ours["reasons"] == ["hardware power brake"]
    assert not clock.script["lib"] and not clock.script["ours"]   # every round ran


def test_sustained_race_runs_under_the_fake_clock():
    ran = []
    race = TC._sustained_race(_Ctx(FakeClock(ms=2.0)), [("lib", lambda: ran.append("lib")),
                                                        ("ours", lambda: ran.append("ours"))],
                              flops=4e9, rounds=1)
    assert sorted(ran) == ["lib", "ours"]
    assert [r["ms"] for r in race["rows"]] == [2.0, 2.0]
    assert race["rows"][1]["sm_mhz"] is None and race["rows"][1]["reasons"] == []


class _DriftClock:
    """time_gpu: the next scripted ms of each function's name, in call order."""

    def __init__(self, script):
        self.script = {k: list(v) for k, v in script.items()}
        self.order = []

    def time_gpu(self, fn, repeat=None):
        name = fn()
        self.order.append(name)
        return type("T", (), {"median_ms": self.script[name].pop(0)})()


def test_burst_rounds_take_the_median_of_per_round_ratios():
    """The card slows between rounds (both kernels' times double in round 2): the per-round
    ratio stays, the median over rounds is the ratio of neighbours, not of medians."""
    clock = _DriftClock({"lib": [1.0, 2.0, 1.1], "ours": [2.0, 4.0, 2.0]})
    race = TC._burst_rounds(_Ctx(clock), [("lib", lambda: "lib"), ("ours", lambda: "ours")],
                             flops=2e12, rounds=3)
    lib, ours = race["rows"]
    assert clock.order == ["lib", "ours", "ours", "lib", "lib", "ours"]   # reversed in turn
    assert ours["pct_library"] == pytest.approx(50.0)
    assert (ours["pct_low"], ours["pct_high"]) == pytest.approx((50.0, 55.0))
    assert ours["ms"] == pytest.approx(2.0) and lib["ms"] == pytest.approx(1.1)
    assert lib["pct_library"] == pytest.approx(100.0) and race["library"] == "lib"
    assert ours["tflops"] == pytest.approx(2e12 / 2.0 / 1e9)
    assert not any(clock.script.values())   # every round ran


@pytest.mark.gpu
def test_sustained_times_back_to_back_and_reads_the_clock():
    from convlab.runtime import cuda

    c = cuda()
    a = c.device_array(1 << 26, np.float32)
    b = c.device_array(1 << 26, np.float32)
    r = timing.sustained(lambda: b.copy_to_device(a), seconds=0.3)
    assert r["calls"] >= 10 and 0 < r["ms"] < 300 / r["calls"] * 2
    if timing._smi_fields():
        assert r["samples"] > 0 and 100 < r["sm_mhz"] < 4000 and r["power_w"] > 0


def test_cudnn_anchor_is_the_fastest_of_the_autotunes(monkeypatch):
    """Each cache key (allow_tf32, deterministic) autotunes once; the race takes the fastest
    pick, lists every pick, and leaves the flags as it found them."""
    from types import SimpleNamespace

    flags = SimpleNamespace(allow_tf32=False, deterministic=False, benchmark=True)
    # the kernel each key's autotune keeps, and its time: the third key's pick is fastest
    picks = {(True, False): ("k_256x64", 0.0252), (True, True): ("k_64x64", 0.0263),
             (False, False): ("k_128x64", 0.0240), (False, True): ("k_256x64", 0.0251)}
    calls = []

    def run():
        calls.append((flags.allow_tf32, flags.deterministic))

    def fake_row(ctx, name, fn, flops, prec, queued=False):
        fn()
        kernel, ms = picks[flags.allow_tf32, flags.deterministic]
        return dict(name=name, ms=ms, kernels=["Memset (Device)", kernel],
                    algorithm="implicit GEMM")

    monkeypatch.setattr(TC, "_library_row", fake_row)
    row = TC._cudnn_best_row(None, "cuDNN fp16 NHWC", run, 1e9, "fp16", flags)
    assert row["ms"] == 0.0240 and row["kernels"][-1] == "k_128x64"
    assert sorted((a["allow_tf32"], a["deterministic"]) for a in row["autotunes"]) == sorted(picks)
    assert {a["kernel"] for a in row["autotunes"]} == {"k_256x64", "k_64x64", "k_128x64"}
    assert set(calls) == set(picks)               # every key autotuned and timed
    assert (flags.allow_tf32, flags.deterministic) == (False, False)   # restored
