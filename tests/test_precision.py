"""convlab.precision (lesson 12-13) and the lesson 12 checkers.

Rounding is cross-checked against PyTorch's own conversions (bf16, fp8) where PyTorch is
installed, and against bit-level facts (ties to even, NaN payloads) everywhere; the
emulated MMA against float64 of its rounded inputs; the checkers on right and planted
wrong answers; the ResNet-18 FLOP count against convlab.reference's per-layer count.
"""

from __future__ import annotations

import numpy as np
import pytest

from convlab import check
from convlab import precision as P
from convlab import reference as ref


def _torch():
    return pytest.importorskip("torch")


def _wide(n=20000, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * np.exp(rng.uniform(-40, 40, n))).astype(np.float32)


def test_bf16_matches_torch_on_ties_nans_and_extremes():
    torch = _torch()
    x = np.concatenate([_wide(), check._rounding_inputs(np.random.default_rng(1), "bf16")
                        .ravel()])
    mine = P.round_to(x, "bf16")
    theirs = torch.from_numpy(x.copy()).bfloat16().float().numpy()
    assert np.array_equal(np.isnan(mine), np.isnan(theirs))
    ok = ~np.isnan(mine)
    assert np.array_equal(mine[ok].view(np.uint32), theirs[ok].view(np.uint32))


@pytest.mark.parametrize("fmt,dtype", [("fp8 e4m3", "float8_e4m3fn"), ("fp8 e5m2", "float8_e5m2")])
def test_fp8_matches_torch(fmt, dtype):
    torch = _torch()
    if not hasattr(torch, dtype):
        pytest.skip(f"this PyTorch has no {dtype}")
    x = np.clip(_wide(5000, 3), -P.FORMATS[fmt].max, P.FORMATS[fmt].max)
    assert np.array_equal(P.round_to(x, fmt),
                          torch.from_numpy(x.copy()).to(getattr(torch, dtype)).float().numpy())


def test_tf32_and_fp16_rounding_facts():
    x = _wide()
    x = x[np.isfinite(x) & (np.abs(x) > 1e-30) & (np.abs(x) < 1e30)]
    t = P.round_to(x, "tf32")
    assert not (t.view(np.uint32) & np.uint32(0x1FFF)).any()  # 13 low bits dropped
    assert np.all(np.abs(t - x) <= 2.0**-11 * np.abs(x))     # within half an ulp of 10 bits
    # ties to even: 1 + 2^-11 lies half-way between 1 and 1 + 2^-10 -> 1 (even)
    assert P.round_to(np.float32(1 + 2.0**-11), "tf32") == 1.0
    assert P.round_to(np.float32(1 + 3 * 2.0**-11), "tf32") == np.float32(1 + 2.0**-9)
    assert np.isinf(P.round_to(np.float32(70000), "fp16"))
    assert P.round_to(np.float32(65504), "fp16") == 65504
    assert P.bits(1.0, "bf16") == dict(value=1.0, sign="0", exponent="01111111",
                                       mantissa="0000000")
    assert P.bits(-2.0, "fp16")["exponent"] == "10000" and P.bits(-2.0, "fp16")["sign"] == "1"


def test_format_constants():
    f = P.FORMATS
    assert f["fp16"].max == 65504 and f["bf16"].bits == 16 and f["tf32"].bits == 19
    assert f["fp16"].min_normal == 2.0**-14 and f["fp8 e4m3"].max == 448
    assert f["bf16"].unit_roundoff == 2.0**-8 and f["fp32"].unit_roundoff == 2.0**-24
    assert "65504" in P.format_table().replace("6.55e+04", "65504")


def test_emulated_mma_is_exact_products_with_fp32_sums():
    rng = np.random.default_rng(4)
    a = check.random_array((24, 70), rng)
    b = check.random_array((70, 31), rng)
    ar = a.astype(np.float16).astype(np.float64)
    br = b.astype(np.float16).astype(np.float64)
    exp, absref = ar @ br, np.abs(ar) @ np.abs(br)
    out = P.mma(a, b, "fp16", "fp32")
    assert check.compare(out, exp, absref, 70, "fp32").ok
    # fp16 accumulators lose much more than fp32 ones
    e32 = np.max(np.abs(out - exp) / absref)
    e16 = np.max(np.abs(P.mma(a, b, "fp16", "fp16") - exp) / absref)
    assert e16 > 20 * e32


def test_accuracy_table_orders_the_formats():
    rows = {r["mode"]: r for r in P.accuracy_table(64, 48, 512)}
    err = {k: v["rel_l2"] for k, v in rows.items()}
    assert err["fp32"] < 1e-6 < err["tf32 (fp32 acc)"] < err["bf16 (fp32 acc)"]
    assert err["fp16 (fp32 acc)"] < err["fp16 (fp16 acc)"]
    for r in rows.values():  # every error within two rounding units of its inputs
        assert r["max_rel"] < 2.5 * r["unit_roundoff"] + 1e-5 or r["mode"] == "fp16 (fp16 acc)"


def test_capability_table_covers_the_course_gpus():
    t = P.capability_table()
    for name in ("T4", "P100", "L4", "A100", "H200", "Jetson TX1 / Nano", "Jetson TX2",
                 "Xavier", "Orin"):
        assert name in t
    assert P.features(7.5)["fp16 tensor cores (WMMA)"] and not P.features(7.5)["bf16 tensor cores"]
    assert not P.features(6.0)["fp16 tensor cores (WMMA)"] and not P.features(6.0)["CUDA 13 builds"]
    assert P.features(8.0)["tf32 tensor cores"] and not P.features(8.0)["fp8 tensor cores"]
    assert P.features(8.9)["fp8 tensor cores"] and P.features(9.0)["wgmma + TMA (Hopper)"]
    assert not P.features(5.3)["fp16 tensor cores (WMMA)"] and P.features(7.2)["int8 tensor cores"]


# ---------------------------------------------------------------------------------------
# The checkers of exercise 12


def _to_bf16(x):
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(x), r, x)


def test_check_rounding_passes_right_and_fails_planted_answers():
    check.check_rounding(_to_bf16, quiet=True)
    check.check_rounding(_to_bf16, seed=11, quiet=True)

    def truncate(x):
        return (np.asarray(x, np.float32).view(np.uint32) >> 16 << 16).view(np.float32)

    def ties_away(x):
        x = np.asarray(x, dtype=np.float32)
        u = x.view(np.uint32).astype(np.uint64)
        r = (((u + 0x8000) >> 16) << 16).astype(np.uint32).view(np.float32)
        return np.where(np.isfinite(x), r, x)

    def nan_into_inf(x):
        x = np.asarray(x, dtype=np.float32)
        u = x.view(np.uint32).astype(np.uint64)
        return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(
            np.float32)

    for bad, why in ((truncate, "round toward zero"), (ties_away, "tie"),
                     (nan_into_inf, "NaN must stay NaN"), (lambda x: x, "FAILED"),
                     (lambda x: np.asarray(x)[:-1], "shape"), (lambda x: None, "None")):
        with pytest.raises(check.CheckError, match=why):
            check.check_rounding(bad, quiet=True)


def test_check_rounding_tf32():
    def to_tf32(x):
        x = np.asarray(x, dtype=np.float32)
        u = x.view(np.uint32).astype(np.uint64)
        r = (((u + 0xFFF + ((u >> 13) & 1)) >> 13) << 13).astype(np.uint32).view(np.float32)
        return np.where(np.isfinite(x), r, x)

    check.check_rounding(to_tf32, "tf32", quiet=True)
    with pytest.raises(check.CheckError):
        check.check_rounding(_to_bf16, "tf32", quiet=True)


def _scaled(a, b):
    def e(m):
        top = float(np.max(np.abs(m)))
        return 0 if top == 0 else 14 - int(np.floor(np.log2(top)))
    sa, sb = e(a), e(b)
    c = (np.ldexp(a, sa).astype(np.float16).astype(np.float32)
         @ np.ldexp(b, sb).astype(np.float16).astype(np.float32))
    return np.ldexp(c, -(sa + sb))


def test_check_scaled_gemm():
    check.check_scaled_gemm(_scaled, quiet=True)

    def cast(a, b):
        with np.errstate(over="ignore", invalid="ignore"):
            return a.astype(np.float16).astype(np.float32) @ b.astype(np.float16).astype(
                np.float32)

    def by_max(a, b):  # scales that are not powers of two round differently
        sa, sb = 60000 / np.abs(a).max(), 60000 / np.abs(b).max()
        return ((a * sa).astype(np.float16).astype(np.float32)
                @ (b * sb).astype(np.float16).astype(np.float32)) / (sa * sb)

    for bad, why in ((cast, "scale each input"), (lambda a, b: a @ b, "round the scaled"),
                     (by_max, "powers of two")):
        with pytest.raises(check.CheckError, match=why):
            check.check_scaled_gemm(bad, quiet=True)


def test_check_conv2d_fp16():
    def conv16(x, w, stride=1, padding=0):
        r16 = np.float16
        return ref.conv2d(x.astype(r16).astype(np.float64), w.astype(r16).astype(np.float64),
                          stride=stride, padding=padding).astype(np.float32)

    check.check_conv2d_fp16(conv16, quiet=True)
    with pytest.raises(check.CheckError, match="round x and w to fp16"):
        check.check_conv2d_fp16(lambda x, w, stride=1, padding=0: ref.conv2d(
            x, w, stride=stride, padding=padding), quiet=True)


# ---------------------------------------------------------------------------------------
# The CNN census


def test_resnet18_flops_match_the_reference_count():
    _torch()
    side = 64
    flops = P.census_flops(P.resnet18(), (1, 3, side, side))
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
    t = P.census_time(P.resnet18(), torch.randn(1, 3, 32, 32), runs=1)
    assert set(P.KINDS) <= set(t) and t["total"] > 0 and t["unhooked"] > 0
    assert all(t[k] >= 0 for k in P.KINDS) and t["convolution"] > 0


# ---------------------------------------------------------------------------------------
# The stored H200 run


def test_stored_h200_results_are_complete_and_verified():
    d = P.stored()
    assert d["device"] == "NVIDIA H200" and d["date"] and d["versions"]["torch"]
    assert not d.get("failed")
    g = d["wmma_gemm"]
    for r in g["verified"] + g["sweep"]:
        assert r["vs_fp32_inputs"]["ok"] and r["vs_rounded_inputs"]["ok"] and r["reproducible"]
        assert r["vs_fp32_inputs"]["rtol"] == pytest.approx(g["tol_fp16"])
    names = {r["name"] for r in g["table"]}
    assert {"cuBLAS fp32", "cuBLAS fp16", "WMMA tiled (default)"} <= names
    for lay in d["wmma_conv"]:
        assert {"cuDNN fp16", "cuDNN fp32", "WMMA conv"} <= {r["name"] for r in lay["table"]}
        assert all(s["vs_rounded_inputs"]["ok"] and s["vs_fp32_inputs"]["ok"]
                   for s in lay["sweep"])
    assert d["throughput_ratio"]["ratio_vs_sgemm"] > 1
    assert d["census"]["fp32"]["convolution"] > 0


def test_tuner_checks_under_the_simulator_and_shows_stored_times():
    from convlab import widgets
    from convlab.runtime import is_simulator

    t = widgets.Tuner()
    bad = t.try_config("wmma", dict(BM=96, BN=64, BK=32, WM=32, WN=32), "resnet128")
    assert bad["note"].startswith("refused") and not bad["ok"]
    w = t.try_config("wmma", dict(BM=128, BN=64, BK=32, WM=32, WN=32), "resnet128")
    assert w["stored_ms"] and w["baseline"] == "cuDNN fp16"
    if is_simulator():
        r = t.try_config("numba", dict(BM=64, BN=128, BK=16, min_blocks=0), "resnet256")
        assert r["ok"] and r["stored_ms"] and r["ms"] is None
    assert "resnet128" in t.table()
    fig = widgets.render_tuner("cuda", "resnet64", t.rows)
    assert fig.axes[0].patches


# ---------------------------------------------------------------------------------------
# Lesson 13: the capstone pictures and the ladder check


def test_mma_fragment_owners_follow_the_ptx_layout():
    owners = {}
    for r in range(16):
        for c in range(8):
            owners.setdefault(P.mma_m16n8_owner(r, c)[0], []).append((r, c))
    assert sorted(owners) == list(range(32)) and all(len(v) == 4 for v in owners.values())
    assert P.mma_m16n8_owner(0, 0) == (0, 0) and P.mma_m16n8_owner(0, 1) == (0, 1)
    assert P.mma_m16n8_owner(8, 0) == (0, 2) and P.mma_m16n8_owner(1, 0) == (4, 0)
    assert P.mma_m16n8_owner(0, 2) == (1, 0) and P.mma_m16n8_owner(15, 7) == (31, 3)


def test_capstone_points_and_ladder_from_the_stored_runs():
    from convlab import bench

    lad, tc = bench.stored_results("h200"), P.stored()
    pts = P.capstone_points(lad, tc, bench.stored_results("h200_lessons04_06"),
                            bench.stored_results("h200_lessons10_11"))
    fams = {p["family"] for p in pts}
    assert {"conv course", "conv library", "GEMM", "tensor cores", "image filter",
            "depthwise"} <= fams
    assert all(p["ai"] > 0 and p["tflops"] > 0 for p in pts)
    dws = [p["name"] for p in pts if p["family"] == "depthwise"]  # a kernel and PyTorch per layer
    assert len(dws) == 4 and not any(n.startswith("copy") for n in dws), dws
    conv = [p for p in pts if p["family"] == "conv course"]
    assert all(p["ai"] == pytest.approx(lad["ladders"][0]["flops"] / lad["ladders"][0]["bytes"])
               for p in conv if "64ch" in p["label"])
    rows = P.capstone_ladder(lad, tc)
    cud = [r for r in rows if r["name"] == "cuDNN fp32"]
    assert cud and all(r["pct"] == pytest.approx(100) for r in cud)
    wm = [r for r in rows if r["name"] == "WMMA conv"]
    assert len(wm) == 3 and all(0 < r["pct"] < 1000 for r in wm)
    for fig in (P.plot_capstone_ladder(rows), P.plot_capstone_roofline(
            pts, 3000, 50, 700), P.plot_census(tc["census"]), P.plot_mma_shapes(),
            P.plot_wmma_tiling(), P.plot_fragment_owners(), P.plot_formats()):
        assert fig.axes


def test_check_ladder_accepts_a_real_run_and_refuses_edits():
    import copy

    from convlab import bench

    lad = bench.stored_results("h200")
    assert "geometric mean" in check.check_ladder(lad, "implicit_gemm_cuda", quiet=True)
    for edit, why in (("device", "real GPU"), ("row", "no row"), ("pct", "does not match"),
                      ("err", "tolerance"), ("layer", "missing")):
        bad = copy.deepcopy(lad)
        rows = bad["ladders"][1]["rows"]
        mine = next(r for r in rows if r["name"] == "implicit_gemm_cuda")
        if edit == "device":
            bad["device"] = "simulator"
        elif edit == "row":
            rows.remove(mine)
        elif edit == "pct":
            mine["pct_of_baseline"] *= 1.3
        elif edit == "err":
            mine["max_rel_err"] = 1e-3
        else:
            bad["ladders"].pop()
        with pytest.raises(check.CheckError, match=why):
            check.check_ladder(bad, "implicit_gemm_cuda", quiet=True)


def test_conv_share_isolated_counts_every_convolution():
    torch = _torch()
    r = P.conv_share_isolated(P.resnet18(), torch.randn(1, 3, 32, 32), runs=1)
    assert r["convs"] == 20 and r["conv_ms"] > 0 and r["total_ms"] > 0
