"""The GPU measurements behind the lessons: run live, or stored from a real GPU.

Each lesson's measurements are one call (``measure.lesson("06")``) that a notebook can
run live on a GPU and that ``python -m convlab measure 06 --out DIR`` runs and stores in
the results files the lessons read under the simulator (convlab/results/h200_*.json):

==================  =========================  ======================================
group (file)        lessons                    what
==================  =========================  ======================================
lessons04_06        04 05 06 11                transfers, launch overhead, conv and
                                               filter ladders, bank conflicts, GEMM
trace_vs_measured   05                         the tracer's coalescing prediction vs
                                               the measured speed-up
sweep               07 09                      the tile sweep (autotune, parallel
                                               compile) and the tuned table
bench               08 13                      `convlab bench`: the ladder race
lessons10_11        10 11                      streams, pipeline, multi-GPU,
                                               depthwise, separable, FFT, Winograd
lessons12_13        12 13                      tensor cores, precisions, the census
tensor_cores        12                         the mma.sync / wgmma ladder beside
                                               cuBLAS and cuDNN
call_time           (by name)                  GPU time and call time from Python of
                                               the depthwise, filter and conv tops
==================  =========================  ======================================

``measure.lesson(name, clock=FakeClock(), dry=True)`` runs the same code on tiny sizes
under the simulator with a fake clock (what ``--dry`` does): a test of the harness and of
each measurement's Python, whose numbers mean nothing. `stored` reads the committed run.

Timing helpers for short kernels (`time_gpu_queued`, `transfer_table`, ...) live in
`convlab.measure.timing` and are re-exported here.
"""

from __future__ import annotations

from pathlib import Path

from .. import results
from . import (
    bench_group,
    call_time,
    lessons04_06,
    lessons10_11,
    lessons12_13,
    sweep,
    tensor_cores,
    trace_vs_measured,
)
from .clock import FakeClock, GpuClock
from .harness import Context, Group, Skip, run_group
from .timing import (
    launch_cost_us,
    launch_overhead,
    time_gpu_queued,
    transfer_table,
    wall_vs_events,
)

__all__ = ["GROUPS", "Context", "FakeClock", "GpuClock", "Group", "Skip", "launch_cost_us",
           "launch_overhead", "lesson", "plan", "stored", "time_gpu_queued", "transfer_table",
           "wall_vs_events"]

# in the order `measure all` runs them (the bench file's sweep first: bench uses its table)
GROUPS = {g.name: g for g in (lessons04_06.GROUP, trace_vs_measured.GROUP, sweep.GROUP,
                              bench_group.GROUP, lessons10_11.GROUP, lessons12_13.GROUP,
                              tensor_cores.GROUP, call_time.GROUP)}
STORED = "h200_lessons04_06"  # what `stored` reads by default


def stored(section: str | None = None, path=None):
    """The H200 measurements behind lessons 04-06 (one section of them, or all)."""
    return results.section(STORED, section, path)


def lessons() -> list:
    """Every lesson name that has measurements, sorted ('04', '05', ...)."""
    return sorted({x for g in GROUPS.values() for x in g.lessons})


def plan(names) -> list:
    """[(group, section names)] that the lesson / group names ask for, in run order.

    A name is a lesson ('06' or '6'), a group ('lessons04_06'), or 'all'.
    """
    want: dict = {}
    for raw in names:
        name = str(raw)
        if name == "all":
            for g in GROUPS.values():
                want.setdefault(g.name, set()).update(s.name for s in g.sections)
        elif name in GROUPS:
            want.setdefault(name, set()).update(s.name for s in GROUPS[name].sections)
        elif name.isdigit() and name.zfill(2) in lessons():
            for g in GROUPS.values():
                picked = {s.name for s in g.sections if name.zfill(2) in s.lessons}
                if picked:
                    want.setdefault(g.name, set()).update(picked)
        else:
            raise ValueError(f"no measurements named {name!r}: lessons {lessons()}, groups "
                             f"{list(GROUPS)}, or 'all'")
    return [(g, [s.name for s in g.sections if s.name in want[g.name]])
            for g in GROUPS.values() if g.name in want]


def lesson(*names, clock=None, dry: bool = False, out=None, prefix: str = "",
           workers: int = 1, budget_s: float = float("inf"), only=None,
           command: str = "") -> dict:
    """Run the measurements of lessons / groups `names`; {group name: results}.

    clock: `GpuClock()` (default) or `FakeClock()` (default when dry). dry: tiny sizes
    (the simulator and a fake clock: tests the code, not the GPU). out: a folder to write
    ``<prefix>_<group>.json`` in (updated in place: sections run again replace theirs);
    None writes nothing. workers: processes compiling tile variants in parallel (sweep).
    budget_s: optional sections are skipped after this many seconds. only: run just
    these section names.
    """
    from ..bench import require_gpu

    if clock is None:
        clock = FakeClock() if dry else GpuClock()
    if not clock.fake:
        require_gpu("convlab.measure (use dry=True, or measure.stored())")
    ctx_out = Path(out) if out is not None else None
    done = {}
    for group, secs in plan(names or ("all",)):
        secs = [s for s in secs if not only or s in only]
        if not secs:
            continue
        ctx = Context(clock=clock, dry=dry, out=ctx_out, prefix=prefix, workers=workers,
                      budget_s=budget_s)
        path = ctx_out / group.filename(prefix) if ctx_out is not None else None
        done[group.name] = run_group(group, ctx, secs, path, command)
    return done


def main(argv) -> int:
    """``python -m convlab measure NAME... --out DIR`` (see ``--help``)."""
    import argparse

    ap = argparse.ArgumentParser(prog="convlab measure", description=(
        "Run the GPU measurements of lessons (04, 05, ...), groups (" + ", ".join(GROUPS)
        + ") or all, checked before timed, and store them as DIR/<group>.json. "
        "'measure list' shows what each name runs; 'measure notebooks [paths]' executes "
        "the lesson notebooks on this GPU and keeps their outputs."))
    ap.add_argument("names", nargs="+", help="lessons, groups, 'all', 'list' or 'notebooks'")
    ap.add_argument("--out", default=None, help="folder for the results files (required "
                    "unless --dry)")
    ap.add_argument("--prefix", default="", help="file name prefix, e.g. h200: writes "
                    "h200_lessons04_06.json (and h200.json for the bench group)")
    ap.add_argument("--dry", action="store_true", help="simulator, tiny sizes, fake clock: "
                    "tests the measurement code without a GPU")
    ap.add_argument("--only", default=None, help="comma-separated section names")
    ap.add_argument("--budget", type=float, default=float("inf"),
                    help="seconds after which optional sections are skipped")
    ap.add_argument("--workers", type=int, default=4,
                    help="processes compiling tile variants in parallel (sweep)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per notebook cell")
    args = ap.parse_args(argv)
    from .. import runtime

    if args.names[0] == "notebooks":
        from .notebooks import run_notebooks

        if not args.out:
            ap.error("measure notebooks needs --out")
        return run_notebooks(args.out, args.names[1:], timeout=args.timeout)
    if args.names == ["list"]:
        for g in GROUPS.values():
            print(f"{g.name} ({g.filename(args.prefix)}):")
            for s in g.sections:
                print(f"  {s.name:34s} lessons {' '.join(s.lessons)}"
                      + ("  (optional)" if s.optional else ""))
        return 0
    if not args.out and not args.dry:
        ap.error("--out DIR is required (or --dry)")
    runtime.setup("sim" if args.dry else None)
    try:
        plan(args.names)
    except ValueError as e:
        ap.error(str(e))
    only = args.only.split(",") if args.only else None
    done = lesson(*args.names, dry=args.dry, out=args.out, prefix=args.prefix,
                  workers=args.workers, budget_s=args.budget, only=only,
                  command="python -m convlab measure " + " ".join(argv))
    failed = {g: d["runs"][-1]["failed"] for g, d in done.items() if d["runs"][-1]["failed"]}
    if failed:
        print("failed sections:", failed)
    return 1 if failed else 0
