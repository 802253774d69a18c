"""tools/gpu/sgemm_profile.py: the readers behind lesson 09's "Where the Numba SGEMM stops",
and the stored run's numbers that the lesson's verdict rests on."""

import importlib.util
from pathlib import Path

import pytest

from convlab import results

ROOT = Path(__file__).resolve().parents[1]
RAW = ROOT / "results" / "h200_sgemm_ncu_2026-12-03.txt"


@pytest.fixture(scope="module")
def tool():
    import sys

    sys.path.insert(0, str(ROOT / "tools" / "gpu"))
    spec = importlib.util.spec_from_file_location("sgemm_profile",
                                                  ROOT / "tools" / "gpu" / "sgemm_profile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sass(label_targets: bool) -> str:
    """A listing with an outer loop of 6 instructions (4 FFMA) around an inner one of 3."""
    ops = ["MOV R1, c[0x0][0x28]", "FFMA R2, R3, R4, R2", "FFMA R5, R3, R4, R5",
           "LDS.128 R8, [R9]", "FFMA R6, R3, R4, R6", "@P0 BRA {inner}", "FFMA R7, R3, R4, R7",
           "@!P1 BRA {outer}", "EXIT"]
    lines = []
    for i, op in enumerate(ops):
        at = 0x10 * i
        if label_targets and at in (0x10, 0x30):
            lines.append(f".L_x_{at}:")
        spell = (lambda v: f"`(.L_x_{v})") if label_targets else hex
        op = op.format(inner=spell(0x30), outer=spell(0x10))
        lines.append(f"        /*{at:04x}*/                   {op} ;   /* 0x000 */")
    return "\n".join(lines)


@pytest.mark.parametrize("labels", [False, True], ids=["cuobjdump", "nvdisasm"])
def test_loop_mix_counts_the_longest_loop(tool, labels):
    mix = tool.loop_mix(_sass(labels))
    assert mix["instructions"] == 7   # 0x10 .. 0x70: the outer loop, not the inner one
    assert mix["FFMA"] == 4 and mix["LDS"] == 1 and mix["BRA"] == 2
    assert "MOV" not in mix and "EXIT" not in mix


def test_parse_report_reads_the_stored_raw_report(tool):
    main_part = RAW.read_text().split("# ===== branch")[0]
    ours, cublas = tool.parse_report(main_part)
    stored = results.load("h200_sgemm_profile")["main"]
    for got, want in ((ours, stored["ours"]), (cublas, stored["cublas"])):
        for key in ("issue_slots_busy_pct", "fma_pipe_active_pct", "ffma_share_pct",
                    "duration_ms", "registers_per_thread", "warp_instructions"):
            assert got[key] == pytest.approx(want[key]), key
        assert set(got["stalls"]) == set(want["stalls"]) and got["stalls"]
    assert "xmma" in cublas["kernel"] and "ffma" in cublas["kernel"]   # no tensor cores
    assert 75 < ours["ffma_share_pct"] < 77 and 88 < cublas["ffma_share_pct"] < 89


def test_the_lessons_decomposition_holds_in_the_stored_run():
    """Issue slots used x FFMA share = FMA pipe ratio = speed ratio (lesson 09), within 3%;
    and the branch removes instructions without moving the FMA pipe."""
    sg = results.load("h200_sgemm_profile")
    ours, lib = sg["main"]["ours"], sg["main"]["cublas"]
    product = (ours["issue_slots_busy_pct"] / lib["issue_slots_busy_pct"]
               * ours["ffma_share_pct"] / lib["ffma_share_pct"])
    pipe = ours["fma_pipe_active_pct"] / lib["fma_pipe_active_pct"]
    speed = lib["duration_ms"] / ours["duration_ms"]
    assert product == pytest.approx(pipe, rel=0.03) and pipe == pytest.approx(speed, rel=0.03)
    br = sg["branch"]["ours"]
    assert sg["sass"]["branch"]["loop"]["instructions"] < sg["sass"]["main"]["loop"]["instructions"]
    assert br["ffma_share_pct"] > ours["ffma_share_pct"]
    assert br["fma_pipe_active_pct"] == pytest.approx(ours["fma_pipe_active_pct"], abs=2)
    timing = sg["timing"]["pct_cublas_4096"]
    assert abs(timing["branch 128x64x16"] - timing["main 128x64x16"]) < 1


def test_issue_times_ffma_share_predicts_each_tiles_time():
    """Lesson 09: for the 128-output tiles too, (issue busy x FFMA share) relative to the 8x8
    block is its speed relative to the 8x8 block, within 1%; and none of them is faster."""
    sg = results.load("h200_sgemm_profile")
    ours = sg["main"]["ours"]
    rate = ours["issue_slots_busy_pct"] * ours["ffma_share_pct"]
    profiles = sg["outputs_per_thread"]["profile"]
    assert len(profiles) == 2
    for p in profiles.values():
        k = p["ours"]
        predicted = k["issue_slots_busy_pct"] * k["ffma_share_pct"] / rate
        assert predicted == pytest.approx(ours["duration_ms"] / k["duration_ms"], rel=0.01)
    pct = sg["outputs_per_thread"]["pct_cublas_4096"]
    wide = [v for n, v in pct.items() if " 8x16 " in n or " 16x8 " in n]
    assert len(wide) == 6 and max(wide) < pct["128x64x16 mb-"]


def test_tile_spec_spells_every_part(tool):
    assert tool.tile_spec("128x64x16") == (128, 64, 16, 8, 8, None)
    assert tool.tile_spec("128x256x8/16x8:1") == (128, 256, 8, 16, 8, 1)
    assert tool.tile_spec("256x128x8:2") == (256, 128, 8, 8, 8, 2)
