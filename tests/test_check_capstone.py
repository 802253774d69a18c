"""convlab.check.capstone: the capstone's ladder check accepts a real run and refuses
edited ones.
"""

from __future__ import annotations

import pytest

from convlab import check


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
