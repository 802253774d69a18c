"""convlab.ladder without a GPU: the tables, % of the roofline, the summary, the files a
run writes, and the ladder itself under the simulator with a fake clock."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from convlab import ladder, problems
from convlab.measure import FakeClock


def _result():
    """A small made-up run: two layers, a not-timed row, a GEMM ladder, a batch sweep."""
    def row(name, ms, tflops, pct):
        return dict(name=name, kind="course", ms=ms, spread=0.01, tflops=tflops, gbps=10.0,
                    max_rel_err=1e-7, pct_of_baseline=pct)

    lads = [dict(problem="64ch 56x56: x (32, 64, 56, 56)", flops=7_400_000_000,
                 bytes=52_000_000, baseline="cuDNN fp32",
                 rows=[row("implicit_gemm_tuned", 0.25, 29.6, 96.0),
                       row("implicit_gemm_cuda", 0.2, 37.0, 120.0),
                       row("cuDNN fp32", 0.24, 30.8, 100.0), row("cuDNN fp16", 0.05, 148.0, None)],
                 not_timed=[dict(name="mine", stage="check", error="CheckError: wrong at 0")]),
            dict(problem="128ch 28x28: x (32, 128, 28, 28)", flops=7_400_000_000,
                 bytes=26_000_000, baseline="cuDNN fp32",
                 rows=[row("implicit_gemm_tuned", 0.27, 27.4, 50.0),
                       row("implicit_gemm_cuda", 0.19, 38.9, 71.0),
                       row("cuDNN fp32", 0.134, 55.2, 100.0)],
                 not_timed=["old: NOT TIMED: a line from an older stored run"])]
    return dict(device="Made-up GPU", date="2026-01-01", ceilings=dict(copy_gbps=4000.0,
                                                                       fma_tflops=45.0),
                ladders=lads,
                gemm_ladder=dict(n=64, rows=[dict(name="tiled", ms=2.0, spread=0.0, tflops=1.0,
                                                  max_rel_err=1e-7, pct_cublas=25.0),
                                             dict(name="double_buffered", ms=0.7, spread=0.0,
                                                  tflops=3.9, max_rel_err=1e-7, pct_cublas=71.0),
                                             dict(name="cuBLAS", ms=0.5, spread=0.0, tflops=5.5,
                                                  max_rel_err=1e-7, pct_cublas=100.0)],
                                 errors={"broken": "CheckError: wrong"}),
                batch_sweep=dict(batches=[32, 64], rows=[
                    dict(layer="64ch 56x56", batch=b, ms={"cuDNN fp32": 0.24 * b / 32,
                                                          "implicit_gemm_cuda": 0.2 * b / 32},
                         pct_cudnn={"cuDNN fp32": 100.0, "implicit_gemm_cuda": 120.0},
                         errors={}) for b in (32, 64)]))


def test_roofline_pct_uses_the_best_fp32_rate_when_a_library_beats_the_ceiling():
    res = _result()
    ladder.add_roofline_pct(res)
    assert res["roofline_fp32_tflops"] == 55.2  # cuDNN fp32 beat the 45 TFLOP/s ceiling
    lad = res["ladders"][1]
    bound = min(55.2, lad["flops"] / lad["bytes"] * 4000 / 1e3)
    assert lad["roofline_tflops"] == pytest.approx(bound)
    r = lad["rows"][0]
    assert r["pct_roofline"] == pytest.approx(100 * r["tflops"] / bound)


def test_print_results_shows_every_table_and_the_not_timed_rows(capsys):
    res = _result()
    ladder.add_roofline_pct(res)
    ladder.print_results(res)
    out = capsys.readouterr().out
    assert "mine: not timed (check): CheckError: wrong at 0" in out
    assert "old: NOT TIMED: a line from an older stored run" in out
    assert "GEMM 64^3" in out and "broken" in out and "NOT TIMED" in out
    assert "batch sweep" in out and "0.2000 (120.0%)" in out
    for lad in res["ladders"]:
        for r in lad["rows"]:
            assert r["name"] in out


def test_summary_keeps_the_headline_numbers():
    s = ladder.summary(_result())
    assert s["implicit_gemm_cuda"]["pct_cudnn"] == [120.0, 71.0]
    assert s["implicit_gemm_cuda"]["geomean"] == pytest.approx(math.sqrt(120 * 71))
    assert s["implicit_gemm_tuned"]["min"] == 50.0
    assert s["gemm_best_numba"] == dict(name="double_buffered", pct_cublas=71.0, tflops=3.9)
    res = _result()
    res["ladders"][1]["rows"] = res["ladders"][1]["rows"][1:]  # tuned missing on one layer
    assert "implicit_gemm_tuned" not in ladder.summary(res)


def test_save_results_writes_the_json_and_the_pictures(tmp_path):
    res = _result()
    ladder.add_roofline_pct(res)
    paths = ladder.save_results(res, tmp_path / "run")
    names = sorted(p.name for p in paths)
    assert names == ["batch_sweep.png", "gemm_ladder.png", "ladder.json", "ladder.png",
                     "roofline.png"]
    assert json.loads((tmp_path / "run" / "ladder.json").read_text()) == res
    del res["batch_sweep"], res["gemm_ladder"]  # a run without them: fewer pictures
    paths = ladder.save_results(res, tmp_path / "short")
    assert sorted(p.name for p in paths) == ["ladder.json", "ladder.png", "roofline.png"]


def test_environment_says_simulator():
    env = ladder.environment()
    assert env["device"] == "simulator" and env["versions"]["numpy"]


def test_run_ladder_under_the_simulator_with_a_fake_clock(tmp_path, capsys):
    from convlab.kernels import CONV_LADDER, GEMM_LADDER

    def refuses(x, w, out, **kw):
        raise ValueError("this kernel refuses the layer")

    kernels = {"coalesced": CONV_LADDER["coalesced"], "refuses": refuses}
    res = ladder.run_ladder(("resnet256",), out_dir=tmp_path, repeat=2, kernels=kernels,
                            batches=(1,), sweep_kernels={"refuses": refuses},
                            gemm_kernels={"tiled": GEMM_LADDER["tiled"]}, gemm_n=16,
                            clock=FakeClock(ms=2.0))
    (lad,) = res["ladders"]
    assert lad["problem"] == str(problems.conv_layer("resnet256"))
    assert [r["name"] for r in lad["rows"]] == ["coalesced"] and lad["rows"][0]["ms"] == 2.0
    assert lad["not_timed"] == [dict(name="refuses", stage="check",
                                     error="ValueError: this kernel refuses the layer")]
    assert res["gemm_ladder"]["rows"][0]["name"] == "tiled"
    assert "refuses" in res["batch_sweep"]["rows"][0]["errors"]
    assert json.loads((tmp_path / "ladder.json").read_text())["ladders"][0]["not_timed"]
    assert "refuses: not timed (check)" in capsys.readouterr().out


def test_climb_names_the_rungs_that_do_not_climb():
    def lad(name, times):
        return dict(problem=f"{name}: x", rows=[dict(name=n, ms=t) for n, t in times.items()])

    good = {"naive": 5.0, "coalesced": 3.0, "tiled": 2.0, "register_blocked": 1.2,
            "implicit_gemm": 0.5, "implicit_gemm_double_buffered": 0.51}  # +2%: within 3%
    bad = dict(good, implicit_gemm_double_buffered=0.55, register_blocked=1.8)  # +10%, 1.11x
    gemm = {"rows": [dict(name="tiled", ms=9.0), dict(name="register_blocked", ms=9.5),
                     dict(name="vectorized", ms=3.0), dict(name="cuBLAS", ms=1.0)]}
    res = ladder.climb({"ladders": [lad("a", good), lad("b", bad)], "gemm_ladder": gemm})
    assert res["layers"]["a"]["slower"] == []
    assert res["layers"]["a"]["register_gain"] == pytest.approx(2.0 / 1.2)
    assert [n for n, _ in res["layers"]["b"]["slower"]] == ["implicit_gemm_double_buffered"]
    assert res["layers"]["b"]["slower"][0][1] == pytest.approx(1.1)
    assert [n for n, _ in res["gemm_not_faster"]] == ["register_blocked"]
    assert not res["ok"]
    text = ladder.climb_report({"ladders": [lad("a", good)], "gemm_ladder": {"rows": []}})
    assert "the ladder climbs" in text and "1.67x over tiling" in text


def test_resnet50_has_every_distinct_layer_once():
    layers = problems.RESNET50
    kinds = [p.name.split()[0] for p in layers]
    assert kinds.count("stem") == 1 and kinds.count("3x3") == 7 and kinds.count("1x1") == 15
    shapes = {(p.C, p.H, p.K, p.R, p.stride) for p in layers}
    assert len(shapes) == len(layers)  # no layer twice
    assert (3, 224, 64, 7, 2) in shapes and (128, 56, 128, 3, 2) in shapes  # stem, v1.5 stride
    assert all(p.out_shape[2] == p.H // p.stride for p in layers)  # 'same' sizes, halved at /2


def _sweep_row(layer, batch, pct):
    return dict(layer=layer, batch=batch, ms={}, errors={},
                pct_cudnn={"cuDNN fp32": 100.0, **pct})


def test_sweep_summary_takes_the_best_kernel_per_layer_and_the_geomean_over_layers():
    sweep = dict(rows=[
        _sweep_row("3x3 64ch 56x56", 32, {"implicit_gemm_tuned": 80.0, "implicit_gemm_cuda": 125.0,
                                         "triton": 60.0}),
        _sweep_row("3x3 512ch 7x7", 32, {"implicit_gemm_tuned": 45.0, "implicit_gemm": 50.0}),
        _sweep_row("1x1 64->64 56x56", 32, {"implicit_gemm_tuned": 90.0}),
        _sweep_row("stem 7x7/2", 1, {"implicit_gemm_cuda": 30.0})])
    s = ladder.sweep_summary(sweep)
    g = s["batch 32 3x3"]
    assert g["best"]["min"] == 50.0 and g["best"]["n"] == 2  # best of each layer: 125, 50
    assert g["best"]["geomean"] == pytest.approx(math.sqrt(125.0 * 50.0))
    assert g["best_numba"]["min"] == 50.0 and g["best_numba"]["geomean"] == pytest.approx(
        math.sqrt(80.0 * 50.0))  # CUDA C is not Numba
    assert g["triton"] == dict(min=60.0, geomean=60.0, n=1)  # Triton is never "best course"
    assert s["batch 32 all"]["best"]["n"] == 3 and s["batch 1 stem"]["best"]["min"] == 30.0
    assert "batch 32 3x3" in ladder.sweep_summary_table(s)


TINY_LAYERS = [problems.ConvProblem("tiny", 1, 2, 5, 5, 3),
               problems.ConvProblem("tiny2", 1, 3, 4, 6, 2)]


def test_batch_sweep_stops_starting_rows_after_its_budget():
    from convlab.kernels import CONV_LADDER

    res = ladder.run_batch_sweep(TINY_LAYERS, (1, 2), {"coalesced": CONV_LADDER["coalesced"]},
                                 repeat=1, clock=FakeClock(ms=1.0), budget_s=1e-9)
    assert len(res["rows"]) == 1  # the first row always runs; then the budget is spent
    assert res["rows"][0]["errors"] == {} and res["rows"][0]["ms"]["coalesced"] == 1.0
    assert res["skipped"] == ["tiny2 batch 1", "tiny batch 2", "tiny2 batch 2"]


def test_batch_sweep_keeps_each_kernels_error_against_conv_of_absolutes():
    """Each row stores every checked kernel's largest error as a fraction of conv(|x|, |w|)
    (the measure of Winograd's accuracy cost): an output scaled by 1 + 1.2e-6 (inside the
    tolerance of these 18-term sums) reads as about 1e-6, the exact kernel below it; a
    kernel that fails its check stores none."""
    from convlab.kernels import CONV_LADDER

    exact = CONV_LADDER["coalesced"]

    def scaled(x, w, out, **kw):   # within the fp32 tolerance, but measurably off
        exact(x, w, out, **kw)
        out.copy_to_device((out.copy_to_host() * np.float32(1 + 1.2e-6)).astype(np.float32))

    def wrong(x, w, out, **kw):
        exact(x, w, out, **kw)
        out.copy_to_device(out.copy_to_host() * np.float32(1.01))

    res = ladder.run_batch_sweep(TINY_LAYERS, (1,), {"coalesced": exact, "scaled": scaled,
                                                    "wrong": wrong},
                                 repeat=1, clock=FakeClock(ms=1.0))
    for row in res["rows"]:
        err = row["max_rel_error"]
        assert set(err) == {"coalesced", "scaled"} and "wrong" in row["errors"], row
        assert err["coalesced"] < 3e-7 and 5e-7 < err["scaled"] < 1.5e-6, err


def test_resnet50_run_checkpoints_every_row_and_keeps_its_seconds(tmp_path, monkeypatch,
                                                                     capsys):
    """run_resnet50 writes the rows so far after each row (a run cut off keeps them), then
    the whole file; every row says where its seconds went, and the run prints each kernel's
    largest error against conv(|x|,|w|) and where it was."""
    from convlab.kernels import CONV_LADDER

    seen, sweep = [], ladder.run_batch_sweep

    def watched(*args, on_row, **kwargs):   # what the checkpoint file holds after each row
        def after_row(partial):
            on_row(partial)
            seen.append(json.loads((tmp_path / "resnet50.partial.json").read_text()))
        return sweep(*args, on_row=after_row, **kwargs)

    monkeypatch.setattr(ladder, "run_batch_sweep", watched)
    res = ladder.run_resnet50((1, 2), tmp_path, {"coalesced": CONV_LADDER["coalesced"]},
                              repeat=1, clock=FakeClock(ms=1.0), layers=TINY_LAYERS)
    assert [len(part["resnet50"]["rows"]) for part in seen] == [1, 2, 3, 4]
    assert [(r["layer"], r["batch"]) for r in seen[1]["resnet50"]["rows"]] == [("tiny", 1),
                                                                          ("tiny", 2)]
    assert not (tmp_path / "resnet50.partial.json").exists()
    assert json.loads((tmp_path / "resnet50.json").read_text())["resnet50"]["rows"] == \
        res["resnet50"]["rows"]
    for row in res["resnet50"]["rows"]:
        assert set(row["seconds"]) == {"inputs, reference, cuDNN", "coalesced"}
        assert all(v > 0 for v in row["seconds"].values())
    worst = max(res["resnet50"]["rows"], key=lambda r: r["max_rel_error"]["coalesced"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("largest error"))
    assert line == ("largest error / conv(|x|,|w|): coalesced "
                    f"{worst['max_rel_error']['coalesced']:.1e} ({worst['layer']} batch "
                    f"{worst['batch']})"), line


def test_resnet50_run_cut_by_its_budget_saves_and_draws_only_the_batches_it_ran(tmp_path):
    from convlab.kernels import CONV_LADDER

    res = ladder.run_resnet50((1, 2), tmp_path, {"coalesced": CONV_LADDER["coalesced"]},
                              repeat=1, clock=FakeClock(ms=1.0), layers=TINY_LAYERS, budget_s=1e-9)
    assert len(res["resnet50"]["rows"]) == 1 and len(res["resnet50"]["skipped"]) == 3
    assert json.loads((tmp_path / "resnet50.json").read_text())["resnet50"]["skipped"]
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["resnet50_batch1.png"]
    with pytest.raises(ValueError, match=r"no rows at batch 2 \(batches with rows: \[1\]\)"):
        ladder.plot_layer_sweep(res["resnet50"], 2)


def test_plot_layer_sweep_draws_one_bar_per_kernel_and_layer(tmp_path):
    sweep = dict(rows=[
        _sweep_row("3x3 64ch 56x56", 32, {"implicit_gemm_tuned": 80.0, "triton": 60.0}),
        _sweep_row("1x1 64->64 56x56", 32, {"implicit_gemm_tuned": 90.0, "triton": 40.0}),
        _sweep_row("1x1 64->64 56x56", 1, {"implicit_gemm_tuned": 20.0})])
    fig = ladder.plot_layer_sweep(sweep, 32, path=tmp_path / "r.png")
    heights = sorted(p.get_height() for p in fig.axes[0].patches)
    assert heights == [40.0, 60.0, 80.0, 90.0]  # batch 1's row is not drawn
    assert (tmp_path / "r.png").stat().st_size > 0
