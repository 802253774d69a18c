"""convlab.census: ResNet-18's FLOP count against convlab.reference's per-layer count, the
time census by kind of layer (CPU; PyTorch needed), and the GPU-time census's arithmetic
on planted profiler data: kernels attributed to the layer that launched them, shares of
GPU kernel time (never of an eager call's wall time), graph replay and eager timing with
fake clocks; the real thing on a GPU.
"""

from __future__ import annotations

from collections import namedtuple
from types import SimpleNamespace

import numpy as np
import pytest

from convlab import census
from convlab import reference as ref
from convlab.measure import FakeClock

Kernel = namedtuple("Kernel", ["name", "device", "duration"])  # as torch's profiler has it


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


# ----------------------------------------------------------------------------------------
# The GPU-time census on planted data


def _event(name, parent=None, kernels=()):
    return SimpleNamespace(name=name, cpu_parent=parent,
                           kernels=[Kernel(n, 0, us) for n, us in kernels])


def test_kernels_count_for_the_layer_that_launched_them():
    conv = _event("census:convolution", kernels=[("census:convolution", 999.0)])  # its span
    fc = _event("census:fully connected")
    evs = [conv, fc,
           _event("aten::cudnn_convolution", _event("aten::convolution", conv), [
               ("sm90_xmma_fprop_implicit_gemm_f32f32_tf32", 120.5), ("fft2d_r2c_32x32", 7.25),
               ("volta_cgemm_32x32_tn", 33.0)]),  # FFT's complex GEMM: a conv by launcher
           _event("aten::addmm", fc, [("sm90_xmma_gemm_f32f32_f32_tn_n", 4.5)]),
           _event("aten::to", None, [("winograd_nonfused_fwd_data", 2.0),
                                     ("elementwise_kernel<float>", 3.0)]),  # no layer
           _event("aten::view", conv)]
    rows = census.kernel_table(evs)
    assert [(k, us) for _, k, us in rows] == [
        ("convolution", 120.5), ("convolution", 7.25), ("convolution", 33.0),
        ("fully connected", 4.5), ("convolution", 2.0), (census.OTHER, 3.0)]
    assert census.kernel_kind("sm90_xmma_gemm_f32f32", "fully connected") == "fully connected"
    assert census.kernel_kind("sm90_xmma_gemm_f32f32", None) == census.OTHER


def _planted(rng, conv_ms, other_ms):
    """Kernel rows for one pass: 20 conv kernels summing to conv_ms, the rest spread over
    the other kinds (random, non-uniform durations)."""
    def split(total, n):
        w = rng.uniform(0.2, 3.0, n)
        return list(1e3 * total * w / w.sum())
    rows = [(f"conv_kernel_{i}", "convolution", us) for i, us in enumerate(split(conv_ms, 20))]
    kinds = ["batch norm", "ReLU", "residual add", "pooling", "fully connected"]
    for i, us in enumerate(split(other_ms, 40)):
        rows.append((f"elementwise_{i % 7}", kinds[i % len(kinds)], us))
    rng.shuffle(rows)
    return rows


def test_share_is_of_gpu_kernel_time_not_of_the_eager_wall_time():
    """A launch-bound pass: Python needs 4.2 ms to issue what the GPU runs in 3.1 ms. The
    convolutions' 2.5 ms are 83% of the GPU's 3.0 ms of kernels, 60% of the eager time:
    a share taken from the eager time would turn the verdict around."""
    rng = np.random.default_rng(7)
    rows = _planted(rng, conv_ms=2.5, other_ms=0.5)
    eager = dict(eager_ms=4.2, issue_ms=4.05)
    r = census.summarize(rows, graph_ms=3.1, eager=eager)
    assert r["conv_share_pct"] == pytest.approx(100 * 2.5 / 3.0)
    assert r["holds"] is True and r["kernel_ms"] == pytest.approx(3.0)
    assert abs(r["conv_share_pct"] - 100 * 2.5 / eager["eager_ms"]) > 20
    assert r["coverage"] == pytest.approx(3.0 / 3.1) and r["kernels"] == 60
    assert sum(r[k] for k in (*census.KINDS, census.OTHER)) == pytest.approx(r["kernel_ms"])
    slower_python = census.summarize(rows, graph_ms=3.1, eager=dict(eager_ms=42, issue_ms=41))
    assert slower_python["conv_share_pct"] == r["conv_share_pct"]  # Python's speed is no factor
    top = r["top_kernels"]
    assert len(top) == 8 and top == sorted(top, key=lambda t: -t["us"])
    assert top[0]["name"].startswith("conv_kernel_")


def test_share_below_the_claim_and_without_kernels():
    rng = np.random.default_rng(11)
    r = census.summarize(_planted(rng, conv_ms=0.9, other_ms=1.1), 2.2,
                         dict(eager_ms=4.0, issue_ms=3.9))
    assert r["conv_share_pct"] == pytest.approx(45.0) and r["holds"] is False
    with pytest.raises(ValueError, match="no GPU kernel time"):
        census.conv_share(dict.fromkeys(census.KINDS, 0.0))


def test_graph_time_times_the_replay_not_the_eager_call():
    calls = dict(fn=0, replay=0)

    def fn():
        calls["fn"] += 1

    def capture(f):
        f()  # recording runs it once

        def replay():
            calls["replay"] += 1
        return replay

    t = census.graph_time(fn, runs=5, timer=FakeClock(ms=0.375).time_gpu, capture=capture)
    assert t.median_ms == 0.375 and calls == dict(fn=1, replay=1)

    seen = {}

    def timer(f, warmup, repeat):
        seen.update(f=f, repeat=repeat)
        from convlab.bench import Timing
        return Timing([9.0, 1.0, 2.5, 3.0, 0.5][:repeat], "planted")
    t = census.graph_time(fn, runs=5, timer=timer, capture=capture)
    assert t.median_ms == 2.5 and seen["f"] is not fn and seen["repeat"] == 5


def test_eager_time_reports_issue_and_wall_medians():
    # per run: t0, t1 (call returned), t2 (GPU done): issue 1, 5, 2 ms; wall 3, 9, 4 ms
    ticks = iter([10.000, 10.001, 10.003,
                  20.000, 20.005, 20.009,
                  30.000, 30.002, 30.004])
    syncs = []
    r = census.eager_time(lambda: None, lambda: syncs.append(1), runs=3,
                          now=lambda: next(ticks))
    assert r["issue_ms"] == pytest.approx(2.0) and r["eager_ms"] == pytest.approx(4.0)
    assert len(syncs) == 1 + 2 * 3


def test_report_states_what_the_numbers_say():
    rng = np.random.default_rng(3)
    c = {"fp32": census.summarize(_planted(rng, 2.5, 0.5), 3.1, dict(eager_ms=4.2, issue_ms=4.1)),
         "tf32": census.summarize(_planted(rng, 0.6, 0.9), 1.6, dict(eager_ms=4.3, issue_ms=4.2)),
         "fp16 NHWC": {"convolution": 1.0, "total": 4.4}}  # a run without GPU-time fields
    lines = census.report(c)
    assert "83% of GPU time (over 70%)" in lines[0] and "3.10 ms" in lines[0]
    assert "4.10 ms" in lines[0] and "not over 70%" in lines[1]
    assert "no GPU-time census" in lines[2]
    assert "holds at 1 of 2 precision(s)" in lines[3]
    assert "works 37-74% of the wall time (fp32, tf32 under 80%)" in lines[4]
    fast = {"fp32": census.summarize(_planted(rng, 2.5, 0.5), 3.1,
                                     dict(eager_ms=3.2, issue_ms=1.0))}
    assert "close to GPU time" in census.report(fast)[-1]


def test_stored_census_by_batch():
    c = {"batch": 32, "fp32": {}, "by_batch": {"8": {"batch": 8, "fp32": {}}}}
    assert census.at_batch(c, 32) is c and census.at_batch(c, 8)["batch"] == 8
    with pytest.raises(KeyError, match=r"no stored census at batch 4 \(stored: \[32, 8\]\)"):
        census.at_batch(c, 4)
    s = census.stored()
    assert s is not None and s["batch"] == 32 and s["device"]
    assert census.stored(batch=5) is None


def test_stored_census_shares_follow_their_kernel_times():
    """Every stored GPU-time record: the share is conv / kernel time, the verdict its."""
    s = census.stored()
    recs = [s] + [census.stored(batch=int(b)) for b in s.get("by_batch", {})]
    for c in recs:
        for label, *_ in census.PRECISIONS:
            t = c.get(label)
            if not census.measured(t):
                continue
            kinds = sum(t[k] for k in (*census.KINDS, census.OTHER))
            assert t["kernel_ms"] == pytest.approx(kinds)
            assert t["conv_share_pct"] == pytest.approx(100 * t["convolution"] / kinds)
            assert t["holds"] == (t["conv_share_pct"] > census.CLAIM_PCT)
            assert 0.3 < t["coverage"] < 1.3 and t["issue_ms"] <= t["eager_ms"]


def _planted_profile(model, x):
    """Real profiler events of a CPU pass, a planted 'kernel' (1-3 us) on every leaf op."""
    evs = census.profile_events(model, x)
    leaves = [e for e in evs if e.device_type.name == "CPU" and not e.cpu_children]
    for i, e in enumerate(leaves):
        e.append_kernel(f"planted_{i}", 0, 1.0 + i % 3)
    return evs, leaves


def test_profiled_cpu_pass_attributes_every_op_to_its_layer():
    """Each planted kernel lands in the kind of the layer around its op."""
    torch = _torch()
    evs, leaves = _planted_profile(census.resnet18(classes=10), torch.randn(1, 3, 32, 32))
    rows = census.kernel_table(evs)
    kinds = {k for _, k, _ in rows}
    assert set(census.KINDS) <= kinds
    by = {}
    for _, k, us in rows:
        by[k] = by.get(k, 0.0) + us
    conv_leaves = [e for e in leaves if census._launcher_kind(e) == "convolution"]
    assert len(conv_leaves) >= 20 and by["convolution"] == pytest.approx(
        sum(1.0 + leaves.index(e) % 3 for e in conv_leaves))


def test_census_precisions_runs_its_steps_on_the_cpu(monkeypatch):
    """The whole census on the CPU: CUDA's parts replaced (graph capture: the call itself;
    synchronise: nothing; kernels: planted on the profiled ops), the rest as on a GPU."""
    torch = _torch()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(census, "cuda_graph", lambda fn: fn)
    monkeypatch.setattr(census, "time_events", FakeClock(ms=0.5).time_gpu)
    monkeypatch.setattr(census, "profile_kernels",
                        lambda m, x: census.kernel_table(_planted_profile(m, x)[0]))
    c = census.census_precisions(2, 32, runs=3, precisions=census.PRECISIONS[:2],
                                 device="cpu")
    assert c["batch"] == 2 and c["flops"]["convolution"] > 0 and "fp16 NHWC" not in c
    for label in ("fp32", "tf32"):
        t = c[label]
        assert t["graph_ms"] == 0.5 and 0 < t["issue_ms"] <= t["eager_ms"]
        assert t["kernels"] > 40 and 0 < t["conv_share_pct"] < 100
    assert torch.backends.cudnn.allow_tf32 is False  # left at fp32
    assert "convolutions" in census.report(c)[0]


@pytest.mark.gpu
def test_gpu_census_on_this_gpu():
    torch = _torch()
    if not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA")
    c = census.census_precisions(4, 64, runs=3)
    for label, *_ in census.PRECISIONS:
        t = c[label]
        assert t["kernels"] > 40 and t["convolution"] > 0 and t["batch norm"] > 0
        assert 0 < t["conv_share_pct"] < 100 and t["graph_ms"] > 0
        assert 0.3 < t["coverage"] < 1.3, t
        assert 0 < t["issue_ms"] <= t["eager_ms"]
    assert torch.backends.cudnn.allow_tf32 is False
    assert any("GPU time" in line for line in census.report(c))
