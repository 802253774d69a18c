"""convlab.bench: refuses to time the simulator, times CPU code, and (GPU) times honestly."""

import time

import numpy as np
import pytest

from convlab import bench, problems
from convlab.runtime import is_simulator


@pytest.mark.skipif(not is_simulator(), reason="simulator behaviour")
def test_gpu_timing_refused_under_simulator():
    with pytest.raises(bench.SimulatorTimingError, match="needs a real GPU"):
        bench.time_gpu(lambda: None)


def test_time_cpu_measures_sleep():
    t = bench.time_cpu(time.sleep, 0.01, repeat=3)
    assert 9 <= t.median_ms < 60
    assert len(t.samples_ms) == 3 and "perf_counter" in t.method


def test_timing_statistics():
    t = bench.Timing([1.0, 2.0, 3.0, 100.0, 2.0])
    assert t.median_ms == 2.0
    assert t.tflops(2e9) == pytest.approx(1.0)
    assert t.gbps(2e6) == pytest.approx(1.0)
    assert t.spread > 1


def test_problem_sizes_scale_with_runtime():
    real = problems.conv_layer("resnet128", real=True)
    assert real.x_shape == (32, 128, 28, 28) and real.flops == 2 * 32 * 128 * 784 * 128 * 9
    tiny = problems.conv_layer("resnet128", real=False)
    assert np.prod(tiny.out_shape) < 2000  # seconds under the simulator
    with pytest.raises(KeyError, match="known"):
        problems.conv_layer("vgg")


def test_bench_cli_under_simulator_says_it_cannot_time(capsys):
    from convlab.__main__ import main

    if not is_simulator():
        pytest.skip("simulator behaviour")
    assert main(["bench"]) == 0
    assert "cannot time" in capsys.readouterr().out


@pytest.mark.gpu
def test_time_gpu_scales_with_work():
    from convlab.runtime import cuda

    c = cuda()
    a = c.device_array(1 << 28, np.float32)
    b = c.device_array(1 << 28, np.float32)
    a_part, b_part = a[: 1 << 26], b[: 1 << 26]  # slicing outside: it costs host time
    small = bench.time_gpu(lambda: b_part.copy_to_device(a_part))
    big = bench.time_gpu(lambda: b.copy_to_device(a))
    assert 2 < big.median_ms / small.median_ms < 8  # 4x the bytes, both far above launch cost


@pytest.mark.gpu
def test_bench_conv_checks_before_timing():
    from convlab.kernels import CONV_LADDER

    prob = problems.ConvProblem("small", 2, 8, 20, 17, 8)
    good = bench.launcher_impl("coalesced", CONV_LADDER["coalesced"], prob)

    def broken(x, w, out, **kw):
        CONV_LADDER["coalesced"](x, w, out, **kw)
        out[0, 0, 0, 0] = 0.0  # wrong on purpose  # noqa: B018

    bad = bench.launcher_impl("broken", broken, prob)
    lad = bench.bench_conv([good, bad], prob, baseline="coalesced", verbose=False)
    assert [r.name for r in lad.rows] == ["coalesced"]  # the broken one is not timed
    assert lad.rows[0].ms > 0 and lad.rows[0].pct_of_baseline == pytest.approx(100)


@pytest.mark.gpu
def test_ceilings_are_plausible():
    ce = bench.measure_ceilings()
    assert 100 < ce["copy_gbps"] < 20000
    assert 1 < ce["fma_tflops"] < 500


class _Device:
    """The device properties theoretical_peak reads."""

    def __init__(self, cc, sms, clock_khz):
        self.compute_capability, self.MULTIPROCESSOR_COUNT, self.CLOCK_RATE = cc, sms, clock_khz


def test_theoretical_peak_matches_datasheets():
    # H200 SXM: 66.9 TFLOP/s fp32; T4: 8.1 TFLOP/s (40 SMs x 64 lanes at 1.59 GHz)
    assert bench.theoretical_peak(_Device((9, 0), 132, 1_980_000))["tflops"] == \
        pytest.approx(66.9, abs=0.05)
    assert bench.theoretical_peak(_Device((7, 5), 40, 1_590_000))["tflops"] == \
        pytest.approx(8.1, abs=0.05)
    with pytest.raises(KeyError, match="FP32_LANES"):
        bench.theoretical_peak(_Device((5, 2), 16, 1_000_000))
