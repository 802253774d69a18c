"""convlab.precision (lessons 12-13): the emulated MMA against float64 of its rounded
inputs, the accuracy and capability tables, the stored H200 runs and the capstone's
summaries.
"""

from __future__ import annotations

import numpy as np
import pytest

from convlab import check
from convlab import precision as P


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
    fig = P.plot_capstone_ladder(rows)
    assert sum(len(ax.patches) for ax in fig.axes) == len({(r["group"], r["layer"], r["name"])
                                                            for r in rows})
    ax = P.plot_capstone_roofline(pts, 3000, 50, 700).axes[0]
    from matplotlib.colors import to_rgb

    roofs = [ln for ln in ax.lines if to_rgb(ln.get_color()) == (0, 0, 0)]
    assert [max(ln.get_ydata()) for ln in roofs] == [50, 700]  # fp32 and fp16 roofs
    marks = {ln.get_label(): len(ln.get_xdata()) for ln in ax.lines if ln not in roofs}
    assert marks == {f: sum(p["family"] == f for p in pts) for f in fams}
    texts = [t.get_text() for t in P.plot_census(tc["census"]).axes[0].texts]
    shares = [t for t in texts if t != "70% (source 000)"]  # the source's claim, drawn once
    assert len(shares) < len(texts) and shares and all(t.endswith("%") for t in shares)
