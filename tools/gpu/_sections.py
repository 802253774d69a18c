"""What the measurement scripts in tools/gpu share: named sections that run once each and
save the results file after every one (a device call cut short keeps what finished), and
the fake clock of their --dry runs under the Numba simulator.

    from _sections import Sections, fake_gpu_clocks   # the scripts' folder is on sys.path
"""

from __future__ import annotations

import json
import time
import traceback


class Sections:
    """Results of one run: res["sections"][name] is what a section returned,
    res["errors"][name] why it raised, res["section_s"][name] its seconds; the whole dict
    is written as JSON to `path` after every section.

    only: run just these sections (and "environment"); budget_s: sections marked optional
    are skipped once this many seconds have passed.
    """

    def __init__(self, path: str, res: dict | None = None, budget_s: float = float("inf"),
                 only: list | None = None):
        self.t0 = time.time()
        self.path = path
        self.res = {"sections": {}, "errors": {}, **(res or {})}
        self.budget_s = budget_s
        self.only = only

    def elapsed(self) -> float:
        return time.time() - self.t0

    def save(self):
        self.res["elapsed_s"] = round(self.elapsed(), 1)
        with open(self.path, "w") as f:
            json.dump(self.res, f, indent=1, default=float)

    def section(self, name: str, optional: bool = False):
        """Decorator: run the function now, as section `name`; one that raises is reported
        and recorded, and the run goes on."""
        def deco(fn):
            t = time.time()
            if self.only and name not in self.only and name != "environment":
                return fn
            print(f"\n=== {name} ({self.elapsed():.0f} s)", flush=True)
            if optional and self.elapsed() > self.budget_s:
                self.res["sections"][name] = {"skipped": f"time ({self.elapsed():.0f} s elapsed)"}
                print("  skipped: out of time")
                return fn
            try:
                self.res["sections"][name] = fn()
            except Exception as e:  # noqa: BLE001  (one broken section must not stop the rest)
                traceback.print_exc()
                self.res["errors"][name] = f"{type(e).__name__}: {e}"
            self.res.setdefault("section_s", {})[name] = round(time.time() - t, 1)
            self.save()
            return fn
        return deco


def fake_gpu_clocks(bench, measure):
    """--dry: every GPU timing calls the function once and reports 1 ms, the copy bandwidth
    1000 GB/s (the simulator has no clock; the dry run only finds mistakes)."""
    def fake(fn, *args, warmup=1, repeat=3, group_ms=2.0, calls=1, **kw):
        fn(*args, **kw)
        return bench.Timing([1.0, 1.0, 1.0], "dry run (fake)")

    bench.time_gpu = fake
    measure.time_gpu_queued = fake
    bench.copy_bandwidth = lambda *a, **k: 1000.0
