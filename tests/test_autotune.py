"""convlab.autotune.tune under the simulator: every candidate checked, wrong ones reported
and never timed, the same answers from one process and from two (parallel compile)."""

from __future__ import annotations

import pytest

from convlab import autotune, problems
from convlab.measure import FakeClock

PROB = problems.ConvProblem("odd 3ch 7x5", 1, 3, 7, 5, 4)
OTHER = problems.ConvProblem("odd 2ch 6x9 stride 2", 1, 2, 6, 9, 3, stride=2)


def make(cfg):
    """A launcher per config: 'coalesced' and 'naive' are right, 'wrong' writes one bad
    output, 'refuses' raises while building (module level: workers unpickle it)."""
    from convlab.kernels import CONV_LADDER

    if cfg == "refuses":
        raise ValueError("no such tile")
    base = CONV_LADDER["naive" if cfg == "naive" else "coalesced"]
    if cfg != "wrong":
        return base

    def wrong(x, w, out, **kw):
        base(x, w, out, **kw)
        out[0, 0, 0, 0] = out[0, 0, 0, 0] + 1.0
    return wrong


CONFIGS = ["coalesced", "wrong", "naive", "refuses"]


def summary(res):
    return [(t.config, t.ok, t.ms, (t.error or "").split(":")[0]) for t in res.trials]


@pytest.mark.parametrize("workers", [1, 2])
def test_tune_checks_times_the_right_ones_and_reports_the_rest(workers):
    res = autotune.tune(make, CONFIGS, PROB, clock=FakeClock(ms=1.5), workers=workers)
    assert summary(res) == [("coalesced", True, 1.5, ""), ("wrong", False, None, "wrong"),
                            ("naive", True, 1.5, ""), ("refuses", False, None, "ValueError")]
    assert res.timed and res.best in ("coalesced", "naive")
    assert res.trials[1].max_rel_err > 0 and "no such tile" in res.trials[3].error
    assert "no such tile" in res.table()


def test_tune_without_a_clock_checks_but_does_not_time_under_the_simulator():
    res = autotune.tune(make, ["naive", "wrong"], PROB)
    assert [t.ok for t in res.trials] == [True, False] and res.trials[0].ms is None
    assert not res.timed and res.best is None and "not timed" in res.table()


def test_tune_on_several_problems_in_two_workers_matches_one():
    one = autotune.tune(make, CONFIGS[:3], [PROB, OTHER], clock=FakeClock())
    two = autotune.tune(make, CONFIGS[:3], [PROB, OTHER], clock=FakeClock(), workers=2)
    assert [r.problem for r in two] == [str(PROB), str(OTHER)]
    for a, b in zip(one, two, strict=True):
        assert summary(a) == summary(b)
        assert [t.max_rel_err for t in a.trials] == [t.max_rel_err for t in b.trials]
