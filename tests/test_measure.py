"""convlab.measure: the harness, the dry run of every lesson's measurements, the layouts
the notebooks read, and bench_conv's not-timed rows.

One dry run (`measure 04 05 ... 13 --dry`: simulator, tiny sizes, fake clock) serves the
layout tests; it is what CI can run of the GPU measurements.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from convlab import bench, measure, problems, results
from convlab.measure import FakeClock, harness

LESSONS = ("04", "05", "06", "07", "08", "09", "10", "11", "12", "13")


@pytest.fixture(scope="session")  # session: xdist may interleave other files
def dry(tmp_path_factory):
    """Every lesson's measurements, dry, in one run (no section runs twice)."""
    out = tmp_path_factory.mktemp("measure")
    rc = measure.main([*LESSONS, "--dry", "--workers", "2", "--out", str(out)])
    files = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    return rc, out, files


def test_every_lesson_name_plans_sections():
    assert measure.lessons() == list(LESSONS)
    for name in LESSONS:
        picked = measure.plan([name])
        assert picked and all(secs for _, secs in picked), name
        for group, secs in picked:
            assert all(name in s.lessons for s in group.sections if s.name in secs)
    assert [g.name for g, _ in measure.plan(["6"])] == ["lessons04_06"]
    with pytest.raises(ValueError, match="no measurements named '03'"):
        measure.plan(["03"])


def test_dry_run_writes_every_group(dry):
    _, out, files = dry
    assert set(files) == {"lessons04_06", "trace_vs_measured", "bench", "lessons10_11",
                          "lessons12_13", "tensor_cores", "tuned"}  # tuned.json: CONVLAB_TUNED
    for name in LESSONS:  # every section a lesson asks for is in its file
        for group, secs in measure.plan([name]):
            data = files[group.filename().removesuffix(".json")]
            where = data["sections"] if group.layout == "sections" else data
            failed = data.get("errors" if group.layout == "sections" else "failed", {})
            for s in secs:
                spread = next(x for x in group.sections if x.name == s).spread
                assert spread or s in where or s in failed, (name, s)
            assert data["runs"][-1]["clock"] == FakeClock.method


def test_dry_sections_all_succeed(dry):
    rc, _, files = dry
    failed = {k: d.get("errors") or d.get("failed") for k, d in files.items()
              if d.get("errors") or d.get("failed")}
    assert not failed and rc == 0


def _same_layout(fresh, stored, path=""):
    """Every key the stored file has at this level (and below, for dicts of dicts) that
    the fresh run also measured has the same type (sections skipped on either side aside)."""
    if isinstance(stored, dict) and isinstance(fresh, dict):
        for k in stored.keys() & fresh.keys():
            _same_layout(fresh[k], stored[k], f"{path}/{k}")
    elif isinstance(stored, list) and isinstance(fresh, list) and stored and fresh:
        _same_layout(fresh[0], stored[0], path + "[0]")
    elif not any(isinstance(v, dict) and "skipped" in v for v in (fresh, stored)):
        # a section skipped (time budget) on either side has no layout to compare
        num = (int, float)
        same = isinstance(fresh, num) and isinstance(stored, num) or type(fresh) is type(stored)
        assert same or fresh is None or stored is None, (path, type(fresh), type(stored))


@pytest.mark.parametrize("fresh,stored", [("lessons04_06", "h200_lessons04_06"),
                                          ("lessons10_11", "h200_lessons10_11"),
                                          ("lessons12_13", "h200_lessons12_13"),
                                          ("trace_vs_measured", "h200_trace_vs_measured"),
                                          ("bench", "h200")])
def test_dry_results_have_the_stored_layout(dry, fresh, stored):
    """What the notebooks read from the stored files is where a fresh run puts it."""
    _, out, files = dry
    new, old = files[fresh], results.load(stored)
    if "sections" in old:  # the per-lesson files: environment + sections
        assert set(new) >= {"environment", "sections", "errors", "runs"}
        assert set(old["environment"]) - {"ceilings", "copy_gbps", "cpu_count",
                                          "gpus_visible"} <= set(new["environment"])
        measured = {s.name for s in measure.GROUPS[fresh].sections}
        assert measured <= set(old["sections"]) | {"l10_multi_gpu_2gpu"}
    else:
        assert {"device", "date", "versions"} <= set(new)
    _same_layout(new, old)
    # and the readers the lessons use take the fresh file
    if fresh == "lessons04_06":
        rows = measure.stored("l06_filter_4096", path=out / "lessons04_06.json")["rows"]
        assert {r["filter"] for r in rows} == {"gauss3", "sobel_x"}


def test_dry_bench_reports_a_not_timed_row_as_data(dry):
    lad = dry[2]["bench"]["ladders"][0]
    assert {r["name"] for r in lad["rows"]} == {"naive", "coalesced"}
    (nt,) = lad["not_timed"]
    assert nt["name"] == "implicit_gemm_cuda" and nt["stage"] == "check" and nt["error"]


def test_dry_tuned_table_is_what_kernels_read(dry, monkeypatch):
    _, out, files = dry
    monkeypatch.setenv(results.TUNED_ENV, str(out / "tuned.json"))
    table = results.tuned("numba")
    assert table == files["bench"]["tuned"]["numba"] and len(table) == 1
    (cfg,) = table.values()
    assert {"BM", "BN", "BK"} <= set(cfg)


# ---------------------------------------------------------------------------------------
# bench_conv: rows it could not time are data


def test_bench_conv_returns_not_timed_rows_with_their_stage():
    from convlab.kernels import CONV_LADDER

    prob = problems.ConvProblem("odd", 1, 3, 7, 5, 2)
    good = bench.launcher_impl("coalesced", CONV_LADDER["coalesced"], prob)

    def wrong(x, w, out, **kw):
        CONV_LADDER["coalesced"](x, w, out, **kw)
        out[0, 0, 0, 0] = out[0, 0, 0, 0] + 1.0

    def cannot_prepare(x, w):
        raise MemoryError("no room")

    bad = bench.launcher_impl("wrong", wrong, prob)
    unprepared = bench.Impl("unprepared", cannot_prepare, None, None)
    clock = FakeClock(ms=2.0)
    lad = bench.bench_conv([good, bad, unprepared], prob, baseline="coalesced",
                           verbose=False, clock=clock)
    assert [r.name for r in lad.rows] == ["coalesced"] and lad.rows[0].ms == 2.0
    # only the correct one was timed: once per round, then once for its call time
    assert clock.calls == 4 and lad.rows[0].call_ms == 2.0
    stages = {d["name"]: d["stage"] for d in lad.not_timed}
    assert stages == {"wrong": "check", "unprepared": "prepare"}
    assert lad.not_timed[0]["error"].startswith("CheckError")
    assert lad.to_dict()["not_timed"] == lad.not_timed
    assert "not timed (prepare): MemoryError: no room" in lad.table()


def test_bench_conv_times_in_interleaved_rounds():
    """Rows are timed A B A B (so a clock drift touches every row alike), each row's samples
    pooled over the rounds; the row order stays the order given."""
    from convlab.kernels import CONV_LADDER

    prob = problems.ConvProblem("odd", 1, 3, 7, 5, 2)
    impls = [bench.launcher_impl(n, CONV_LADDER[n], prob) for n in ("naive", "coalesced")]
    names = {impl.run: impl.name for impl in impls}
    order = []

    def time_gpu(fn, *args, repeat=None, **kwargs):  # sample value: the call's position
        order.append(names[fn])
        return bench.Timing([float(len(order))] * repeat, "recorded")

    clock = FakeClock()
    clock.time_gpu = time_gpu
    lad = bench.bench_conv(impls, prob, verbose=False, clock=clock, repeat=4, rounds=2)
    assert order == ["naive", "coalesced", "naive", "coalesced"]
    ms = {r.name: r.ms for r in lad.rows}
    assert [r.name for r in lad.rows] == ["naive", "coalesced"]
    assert ms == {"naive": 2.0, "coalesced": 3.0}  # medians of [1, 1, 3, 3] and [2, 2, 4, 4]


def test_bench_conv_without_a_clock_refuses_under_the_simulator():
    prob = problems.ConvProblem("odd", 1, 3, 7, 5, 2)
    with pytest.raises(bench.SimulatorTimingError):
        bench.bench_conv([], prob)


# ---------------------------------------------------------------------------------------
# The harness itself


def _group():
    g = harness.Group("demo")

    @g.section("first", lessons=("01",))
    def first(ctx):
        return {"n": ctx.pick(100, 3), "copy": ctx.clock.copy_bandwidth()}

    @g.section("broken", lessons=("01",))
    def broken(ctx):
        raise ZeroDivisionError("on purpose")

    @g.section("reads_first", lessons=("01",))
    def reads_first(ctx):
        return ctx.result("first")["n"] * 2

    @g.section("needs", lessons=("01",))
    def needs(ctx):
        ctx.need("a_module_that_is_not_there")

    @g.section("late", lessons=("01",), optional=True)
    def late(ctx):
        return "ran"

    return g


def test_harness_records_sections_errors_skips_and_updates_the_file(tmp_path, capsys):
    path = tmp_path / "demo.json"
    ctx = harness.Context(clock=FakeClock(gbps=7.0), dry=True, budget_s=-1)
    data = harness.run_group(_group(), ctx, None, path, command="demo")
    stored = json.loads(path.read_text())
    assert stored == json.loads(json.dumps(data))
    assert stored["sections"]["first"] == {"n": 3, "copy": 7.0}
    assert stored["sections"]["reads_first"] == 6
    assert stored["errors"] == {"broken": "ZeroDivisionError: on purpose"}
    assert stored["sections"]["needs"] == {"skipped": "needs a_module_that_is_not_there"}
    assert "skipped" in stored["sections"]["late"]  # the budget was spent
    assert stored["runs"][-1]["failed"] == ["broken"] and stored["runs"][-1]["command"] == "demo"
    assert "ZeroDivisionError" in capsys.readouterr().out  # the traceback is shown
    # a second run of one section replaces its entry and keeps the others
    g = _group()
    g.sections[1].fn = lambda ctx: "fixed"
    again = harness.run_group(g, harness.Context(clock=FakeClock(), dry=True), ["broken"], path)
    assert again["sections"]["broken"] == "fixed" and again["errors"] == {}
    assert again["sections"]["first"] == {"n": 3, "copy": 7.0} and len(again["runs"]) == 2


def test_flat_layout_puts_sections_at_the_top(tmp_path):
    g = harness.Group("flat", layout="flat")
    g.section("table")(lambda ctx: [1, 2])
    g.section("whole", spread=True)(lambda ctx: {"ladders": [], "ceilings": {"x": 1}})
    g.section("bad")(lambda ctx: 1 / 0)
    data = harness.run_group(g, harness.Context(clock=FakeClock(), dry=True), None,
                             tmp_path / "f.json")
    assert data["table"] == [1, 2] and data["ladders"] == [] and "whole" not in data
    assert data["device"].startswith("simulator") and "ZeroDivisionError" in data["failed"]["bad"]


def test_fake_clock_runs_each_timed_function_once():
    clock = FakeClock(ms=3.0)
    seen = []
    t = clock.time_gpu(seen.append, 1, repeat=50, warmup=9)
    q = clock.queued(seen.append, 2, calls=20)
    assert seen == [1, 2] and t.median_ms == q.median_ms == 3.0 and clock.calls == 2
    assert clock.launch_cost_us(seen.append, 3, calls=200) == 3000.0 and seen[-1] == 3
    rows = clock.transfer_table((4096, 65536))
    assert [r["bytes"] for r in rows] == [4096, 65536] and "h2d_pinned" in rows[0]


def test_fake_clock_runs_a_closure_timed_twice_only_once():
    clock = FakeClock(ms=2.0)
    ran = []

    def step():
        ran.append(len(ran))

    for timer in (clock.time_gpu, clock.queued, clock.time_call, clock.seconds):
        timer(step)
    other = FakeClock()
    other.queued(step)  # another clock (another dry run) runs it again
    assert ran == [0, 1] and clock.calls == 4 and other.calls == 1


def test_lesson_refuses_a_real_clock_under_the_simulator():
    with pytest.raises(bench.SimulatorTimingError, match="convlab.measure"):
        measure.lesson("06")


def test_cli_needs_an_output_folder(capsys):
    with pytest.raises(SystemExit):
        measure.main(["06"])
    assert "--out DIR is required" in capsys.readouterr().err


def test_filter_section_reports_wrong_variants_not_timed(tmp_path, monkeypatch):
    """A filter variant that writes a wrong answer is listed as not timed, never timed."""
    from convlab.kernels import filter02_tiled
    from convlab.measure import lessons04_06 as L

    real = filter02_tiled.launch

    def off_by_one(image, kernel, out, *a, **kw):
        real(image, kernel, out, *a, **kw)
        out[0, 0] = np.float32(out[0, 0] + 1)

    monkeypatch.setattr(filter02_tiled, "launch", off_by_one)
    clock = FakeClock()
    ctx = harness.Context(clock=clock, dry=True, data={"environment": {}})
    res = L.filter_4096(ctx)
    names = {"naive", "naive rows (uncoalesced)"}
    assert {(r["filter"], r["name"]) for r in res["rows"]} == {
        (f, n) for f in ("gauss3", "sobel_x") for n in names}
    assert {d["name"] for d in res["not_timed"]} == {"tiled 32x8 v8",
                                                     "pipelined 32x8 v4 ch8 mb8"}
    assert all(d["error"].startswith("CheckError") for d in res["not_timed"])
    assert clock.calls == 2 * len(res["rows"])  # per-call and queued time of each timed row


def test_results_are_named_after_the_card_that_measured_them():
    """A run on an H100 lands in h100_* files, never in the h200_* ones the lessons read as
    the H200's (the GPU call script and the stand-alone tools once wrote h200_* on any card)."""
    import re
    from pathlib import Path

    names = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100", b"NVIDIA H200 NVL": "h200",
             "NVIDIA A100-SXM4-80GB": "a100", "Tesla T4": "t4", "NVIDIA L4": "l4",
             "NVIDIA GeForce RTX 4090": "rtx4090", "cpu only": "gpu"}
    assert {n: harness.card_prefix(n) for n in names} == names
    root = Path(__file__).resolve().parent.parent / "tools" / "gpu"
    call = (root / "h200_call.sh").read_text()
    assert "--prefix h200" not in call and "results/h200_" not in call
    assert "from convlab.measure.harness import card_prefix" in call  # one rule, not two
    for tool in ("memory_bound.py", "sgemm_wide_loads.py"):
        src = (root / tool).read_text()
        assert "harness.card_prefix(" in src and not re.search(r'join\(out, "h200_', src,
                                                                re.I), tool
