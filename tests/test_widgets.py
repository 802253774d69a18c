"""convlab.widgets: what the explorers compute, without the widgets.
"""

from __future__ import annotations


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
