"""`convlab profile`: ncu's raw CSV parsed, its rows cut into rungs, the table, the refusals.

The fixture tests/data/ncu_raw_ladder.csv has the layout of
``ncu --csv --page raw --print-units base --log-file``: ncu's own messages, a quoted header,
the units row, one row per profiled kernel (names with commas inside quotes, thousands
separators, an "n/a"). Two rungs: naive (one kernel) and implicit_gemm (a filter
rearrangement before the main kernel), each window opened by the child's marker kernel.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from convlab.errors import Unsupported
from convlab.measure import profile as P

DATA = Path(__file__).parent / "data" / "ncu_raw_ladder.csv"
CHILD = [{"environment": {"device": "NVIDIA H200", "date": "2026-12-01"}},
         {"rung": "naive", "profiled": True, "problem": "128ch 28x28"},
         {"rung": "coalesced", "error": "Unsupported: planted refusal"},
         {"rung": "implicit_gemm", "profiled": True, "problem": "128ch 28x28"}]


@pytest.fixture(scope="module")
def rows():
    return P.parse_csv(DATA.read_text())


@pytest.fixture(scope="module")
def result():
    return P.build_result(DATA.read_text(), CHILD, "resnet128", {"ncu": "2025.3.1.0"})


def test_parse_reads_every_kernel_row_and_skips_the_units_row(rows):
    assert [r["id"] for r in rows] == [0, 1, 2, 3, 4]
    assert [P.short_name(r["kernel"]) for r in rows] == [
        "convlab_profile_marker", "conv2d_naive_kernel", "convlab_profile_marker",
        "rsck_weights_kernel", "conv2d_implicit_gemm_kernel"]
    naive = rows[1]
    assert naive["block"] == "(32, 8, 1)" and naive["grid"] == "(1, 4, 4096)"
    m = naive["metrics"]
    assert m[P.TIME] == 1_843_200.0  # "1,843,200" nsecond
    assert m["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"] == 1.2e9
    assert m["launch__registers_per_thread"] == 38.0
    assert m[P.stall_metric("tex_throttle")] is None  # "n/a"
    assert set(P.METRICS) <= set(m)  # every requested metric is a column, none lost


def test_parse_converts_scaled_units_and_orders_by_id():
    text = ('==PROF== Connected to process 1\n'
            '"ID","Process ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum",'
            '"sm__warps_active.avg.pct_of_peak_sustained_active"\n'
            '"","","","usecond","Mbyte","%"\n'
            '"1","7","k2(float*, int)","2.50","1.5","10"\n'
            '"0","7","k1(float*, int)","1,000.25","0.25","n/a"\n')
    rs = P.parse_csv(text)
    assert [r["kernel"] for r in rs] == ["k1(float*, int)", "k2(float*, int)"]
    assert rs[0]["metrics"][P.TIME] == pytest.approx(1_000_250.0)  # us -> ns
    assert rs[1]["metrics"]["dram__bytes_read.sum"] == pytest.approx(1.5e6)  # MB -> bytes
    assert rs[0]["metrics"]["sm__warps_active.avg.pct_of_peak_sustained_active"] is None


def test_parse_without_a_table_says_so():
    with pytest.raises(ValueError, match="no ncu CSV header"):
        P.parse_csv("==ERROR== ERR_NVGPUCTRPERM - no permission to access GPU counters\n")


def test_short_name_strips_namespaces_abi_parameters_and_return_type():
    assert P.short_name("void conv_igemm<128, 64, 16>(const float *, float *, int)") == \
        "conv_igemm<128, 64, 16>"
    assert P.short_name("ns::a::k[abi:v1,cw51](Array<float, 1, C>, int)") == "k"
    assert P.short_name("rsck_weights") == "rsck_weights"


def test_markers_cut_rows_into_rungs_with_the_helper_kernel(rows):
    per = P.attribute(rows, CHILD[1:])
    assert list(per) == ["naive", "implicit_gemm"]
    assert [P.short_name(r["kernel"]) for r in per["naive"]] == ["conv2d_naive_kernel"]
    assert [P.short_name(r["kernel"]) for r in per["implicit_gemm"]] == [
        "rsck_weights_kernel", "conv2d_implicit_gemm_kernel"]


def test_attribution_refuses_rows_that_do_not_match_the_child(rows):
    with pytest.raises(ValueError, match="2 marker kernels for 1 profiled"):
        P.attribute(rows, CHILD[1:2])
    with pytest.raises(ValueError, match="launched 1 kernel"):
        P.attribute(rows, [dict(CHILD[1], kernels=1), dict(CHILD[3], kernels=1)])
    with pytest.raises(ValueError, match="before the first marker"):
        P.attribute(rows[1:], [CHILD[3]])


def test_counts_cut_rows_when_there_are_no_markers(rows):
    plain = [r for r in rows if P.MARKER not in r["kernel"]]
    per = P.attribute(plain, [dict(CHILD[1], kernels=1), dict(CHILD[3], kernels=2)])
    assert [len(v) for v in per.values()] == [1, 2]
    assert P.short_name(per["implicit_gemm"][0]["kernel"]) == "rsck_weights_kernel"
    with pytest.raises(ValueError, match="launched 4 kernels, ncu profiled 3"):
        P.attribute(plain, [dict(CHILD[1], kernels=2), dict(CHILD[3], kernels=2)])
    with pytest.raises(ValueError, match="no kernel counts"):
        P.attribute(plain, CHILD[1:])


def test_summary_keeps_the_longest_kernel_and_derives_the_ratios(result):
    ig = result["rungs"]["implicit_gemm"]
    assert ig["kernel"] == "conv2d_implicit_gemm_kernel"  # not the helper before it
    assert [k for k, _ in ig["kernels"]] == ["rsck_weights_kernel", "conv2d_implicit_gemm_kernel"]
    assert ig["regs"] == 128 and ig["time_ns"] == 412_672
    assert ig["sectors_per_request"] == pytest.approx(4.0)
    assert ig["l2_sectors_per_request"] == pytest.approx(2.0)
    assert ig["shared_ld_conflicts_per_request"] == pytest.approx(3.0)
    assert ig["shared_st_conflicts_per_request"] == pytest.approx(0.5)
    assert ig["shared_ld_wavefronts_per_request"] == pytest.approx(4.0)
    assert ig["dram_bytes"] == 14_680_064 + 12_845_056
    # "selected" (3.0) is larger but is no stall: mio_throttle 2.5 of 5.0 stalled
    assert ig["top_stall"] == "mio_throttle"
    assert ig["top_stall_share"] == pytest.approx(2.5 / 5.0)
    naive = result["rungs"]["naive"]
    assert naive["sectors_per_request"] == pytest.approx(16.0)
    assert naive["shared_ld_conflicts_per_request"] is None  # no shared loads at all
    assert naive["top_stall"] == "lg_throttle"
    assert naive["top_stall_share"] == pytest.approx(5.2 / (3.1 + 5.2 + 0.9 + 0.5 + 0.3))
    assert result["errors"] == {"coalesced": "Unsupported: planted refusal"}
    assert result["device"] == "NVIDIA H200" and result["ncu"] == "2025.3.1.0"
    assert result["order"] == ["naive", "coalesced", "implicit_gemm"]


def test_table_shows_each_rung_in_ladder_order(result):
    text = P.table(result)
    lines = text.splitlines()
    assert "NVIDIA H200" in lines[0] and "resnet128" in lines[0]
    body = lines[2:]
    assert [line.split()[0] for line in body] == ["naive", "implicit_gemm"]
    ig = body[1].split()
    assert ig[1] == "conv2d_implicit_gemm_kernel" and ig[2] == "128"
    assert "23.4" in ig and "4.00" in ig and "3.00" in ig and "0.50" in ig
    assert body[1].endswith("mio_throttle (50%)")
    assert "lg_throttle" in body[0] and "16.00" in body[0]
    one = P.table(result, rungs=["implicit_gemm", "coalesced", "tiled"]).splitlines()[2:]
    assert one[0].startswith("implicit_gemm")
    assert "planted refusal" in one[1] and one[2].split() == ["tiled", "not", "profiled"]


def test_no_stored_profile_is_a_message_not_a_crash(tmp_path):
    assert P.stored(tmp_path / "none.json") is None
    assert P.table(None) == P.MISSING
    assert "python -m convlab profile" in P.MISSING
    assert P.value(None, "naive", "regs") is None


def test_merge_writes_and_updates_the_results_file(tmp_path, result):
    first = P._merge(tmp_path / "h200_profile.json", result)
    assert first["rungs"]["naive"]["regs"] == 38 and len(first["runs"]) == 1
    again = dict(result, rungs={"coalesced": dict(result["rungs"]["naive"], regs=40)},
                 errors={}, order=["coalesced"])
    data = P._merge(tmp_path / "h200_profile.json", again)
    assert set(data["rungs"]) == {"naive", "coalesced", "implicit_gemm"}
    assert data["errors"] == {}  # coalesced now profiled
    assert len(data["runs"]) == 2
    back = P.stored(tmp_path / "h200_profile.json")
    assert back["rungs"]["coalesced"]["regs"] == 40
    assert P.value(back, "implicit_gemm", "sectors_per_request") == pytest.approx(4.0)
    json.dumps(back)  # plain JSON


def test_missing_ncu_is_refused_with_the_reason(tmp_path, capsys):
    missing = str(tmp_path / "no-ncu-here")
    with pytest.raises(Unsupported, match="Nsight Compute .* is not on PATH"):
        P.profile_ladder(["naive"], ncu=missing)
    from convlab.__main__ import main

    assert main(["profile", "--ncu", missing, "--rungs", "naive"]) != 0
    err = capsys.readouterr().err
    assert "cannot profile here" in err and "not on PATH" in err


def _fake_ncu(tmp_path: Path, rc: int = 0) -> str:
    """An executable that answers like ncu: the fixture CSV into --log-file, the child's
    JSON lines on stdout (what the real child prints), its version for --version."""
    lines = "".join(P.CHILD_TAG + json.dumps(r) + "\n" for r in CHILD)
    exe = tmp_path / "ncu"
    exe.write_text(
        f"#!{sys.executable}\nimport sys\n"
        "a = sys.argv[1:]\n"
        "if a == ['--version']:\n    print('NVIDIA (R) Nsight Compute\\nVersion 2025.3.1.0')\n"
        "    sys.exit(0)\n"
        f"open(a[a.index('--log-file') + 1], 'w').write(open({str(DATA)!r}).read())\n"
        f"sys.stdout.write({lines!r})\nsys.exit({rc})\n")
    exe.chmod(0o755)
    return str(exe)


def test_profile_ladder_runs_ncu_and_stores_the_result(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "require_device", lambda: {"driver": "13.0", "gpus": 1})
    res = P.profile_ladder(ncu=_fake_ncu(tmp_path), out=tmp_path, command="test")
    assert res["ncu"] == "Version 2025.3.1.0" and res["command"] == "test"
    assert res["rungs"]["implicit_gemm"]["kernel"] == "conv2d_implicit_gemm_kernel"
    assert P.stored(tmp_path / "h200_profile.json")["rungs"]["naive"]["regs"] == 38


def test_profile_ladder_reports_a_failing_ncu(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "require_device", lambda: {"driver": "13.0", "gpus": 1})
    with pytest.raises(RuntimeError, match="ncu exited with 3"):
        P.profile_ladder(ncu=_fake_ncu(tmp_path, rc=3))


def test_the_ncu_command_line():
    cmd = P.ncu_command("ncu", "/tmp/log.csv", P.METRICS, ["python", "-m", "x"])
    for flag in ("--clock-control none", "--profile-from-start off", "--page raw",
                 "--print-units base", "--log-file /tmp/log.csv"):
        assert flag in " ".join(cmd)
    assert cmd[cmd.index("--metrics") + 1].split(",") == list(P.METRICS)
    assert cmd[-3:] == ["python", "-m", "x"]


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("ncu") is None, reason="needs Nsight Compute (ncu)")
def test_profile_two_rungs_on_the_gpu(tmp_path):
    res = P.profile_ladder(rungs=["naive", "implicit_gemm"], out=tmp_path)
    assert set(res["rungs"]) == {"naive", "implicit_gemm"}, res.get("errors")
    ig = res["rungs"]["implicit_gemm"]
    assert len(ig["kernels"]) >= 2  # the filter rearrangement, then the GEMM
    assert ig["regs"] > 0 and 0 < ig["occupancy_pct"] <= 100
    assert res["rungs"]["naive"]["sectors_per_request"] > ig["sectors_per_request"] > 0
    assert (tmp_path / "h200_profile.json").exists()
