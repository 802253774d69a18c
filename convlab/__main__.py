"""Command line: ``python -m convlab doctor | bench | measure | profile | exercises | grade |
grade-batch | autograder | publish | pack``."""

from __future__ import annotations

import argparse
import sys

# nbformat's jsonschema compiles rfc3987-syntax's IRI grammar when it is imported, about a
# second of every command (each grading is one); notebook schemas use no IRI formats
sys.modules.setdefault("rfc3987_syntax", None)


def _doctor(args) -> int:
    from . import runtime

    if args.sim:
        runtime.setup("sim")
    rep = runtime.doctor()
    return 0 if rep.ok else 1


def _bench(args) -> int:
    from . import runtime

    runtime.setup("sim" if args.sim else None)
    from . import bench

    if runtime.is_simulator():
        print("convlab bench: this is the Numba CUDA simulator, which cannot time GPU code.")
        try:
            stored = bench.stored_results()
        except FileNotFoundError as e:
            print(e)
            return 0
        print(f"Stored results from {stored.get('device')} ({stored.get('date')}):")
        from .ladder import print_results

        print_results(stored)
        return 0
    batches = tuple(int(b) for b in args.batches.split(",")) if args.batches else None
    if args.layer_set == "resnet50":
        from .ladder import run_resnet50

        run_resnet50(batches or (32, 1, 128), out_dir=args.out, repeat=args.repeat,
                     budget_s=args.budget)
        return 0
    from .ladder import run_ladder

    run_ladder(args.layers, out_dir=args.out, repeat=args.repeat, gemm=not args.no_gemm,
               batches=() if args.no_batch else (batches or (32, 64, 128)))
    return 0


def _exercises(args) -> int:
    from .grading.build import build

    rep = build(args.root, check=args.check)
    print(rep.text(args.check))
    return 0 if rep.ok else 1


def _grade_options(p):
    p.add_argument("--instructor", default=None,
                   help="the solution notebook, or a folder of them (default: solutions/)")
    p.add_argument("--private-tests", default=None, help="a folder of extra instructor tests")
    p.add_argument("--cell-timeout", type=float, default=None, help="seconds per cell (120)")
    p.add_argument("--total-timeout", type=float, default=None, help="seconds in all (900)")
    p.add_argument("--mode", default="sim", choices=("sim", "gpu"),
                   help="run kernels under the simulator (default) or on the GPU")
    p.add_argument("--gpu", action="store_true",
                   help="run kernels on the GPU and grade the speed tasks against the course "
                        "kernels (without a GPU: reported as not graded)")
    p.add_argument("--assignment", default=None,
                   help="grade against this notebook of --instructor (e.g. 06); a "
                        "submission without its tasks is an error")


def _speed_mode(args) -> str | None:
    """With --gpu: mode 'gpu' where a CUDA GPU answers; else why speed is not graded."""
    if not args.gpu:
        return None
    from .runtime import driver_info, gpu_available

    if gpu_available():
        args.mode = "gpu"
        return None
    why = driver_info().get("error") or "no CUDA driver or device found"
    print(f"convlab: --gpu, but no CUDA GPU here ({why}): speed tasks not graded",
          file=sys.stderr)
    return f"not graded here: no CUDA GPU ({why})"


def _grade(args) -> int:
    from pathlib import Path

    from .grading.grade import GradingError, grade
    from .grading.gradescope import error_results, results_json, write_results

    # the kernel may not write where results go (its folder: the gradebook, other results)
    deny = [str(Path(args.out).resolve().parent)] if args.out else []
    reason = _speed_mode(args)
    try:
        res = grade(args.notebook, args.instructor, args.private_tests,
                    cell_timeout=args.cell_timeout, total_timeout=args.total_timeout,
                    mode=args.mode, deny_write=deny, hide=args.hide,
                    assignment=args.assignment, speed=args.gpu, speed_reason=reason)
    except GradingError as e:
        print(f"convlab grade: {e}", file=sys.stderr)
        if args.out:
            write_results(error_results(f"could not grade this submission: {e}"), args.out)
        return 1
    if args.out:
        write_results(results_json(res), args.out)
    if not args.quiet or res.error:
        print(res.summary())
    return 2 if res.error else 0


def _grade_batch(args) -> int:
    from .grading.batch import grade_batch

    _speed_mode(args)
    rows = grade_batch(args.folder, args.out, jobs=args.jobs, instructor=args.instructor,
                       private_tests=args.private_tests, cell_timeout=args.cell_timeout,
                       total_timeout=args.total_timeout, mode=args.mode,
                       assignment=args.assignment, gpu=args.gpu)
    for r in rows:
        print(f"{r['submission']:<40} {r['score']:>6g} / {r['max_score'] or '?'} "
              f"{r['status']} {r['error']}")
    return 0


def _autograder(args) -> int:
    from .grading.gradescope import write_autograder

    try:
        names = write_autograder(args.out, args.root, args.private_tests, args.notebooks,
                                 args.cell_timeout, args.total_timeout, gpu=args.gpu)
    except (ValueError, FileNotFoundError) as e:
        print(f"convlab autograder: {e}", file=sys.stderr)
        return 1
    graders = [n for n in names if n.startswith("graders/")]
    print(f"wrote {args.out}: setup.sh, run_autograder, the convlab package and "
          f"{len(graders)} grading notebook(s) ({', '.join(g[8:] for g in graders)})")
    return 0


def _publish(args) -> int:
    from .publish import PublishError, publish

    try:
        rep = publish(args.root, args.repo, args.branch, check=args.check)
    except PublishError as e:
        print(f"convlab publish: {e}", file=sys.stderr)
        return 1
    print(rep.text(args.check))
    return 0 if rep.ok else 1


def _pack(args) -> int:
    from .publish import PublishError, pack

    try:
        out = pack(args.root, args.out, deps=args.deps, python=args.python)
    except PublishError as e:
        print(f"convlab pack: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}: upload it to Colab or add it as a Kaggle dataset; "
          "the install cell installs from it")
    return 0


def _measure(argv) -> int:
    from .measure import main as measure_main

    return measure_main(argv)


def _profile(argv) -> int:
    from .measure.profile import main as profile_main

    return profile_main(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["measure"]:  # its own options (python -m convlab measure --help)
        return _measure(argv[1:])
    if argv[:1] == ["profile"]:  # its own options (python -m convlab profile --help)
        return _profile(argv[1:])
    ap = argparse.ArgumentParser(prog="convlab", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("measure", add_help=False,
                   help="run a lesson's GPU measurements and store them (measure --help)")
    sub.add_parser("profile", add_help=False,
                   help="Nsight Compute metrics of every conv ladder rung (profile --help)")
    d = sub.add_parser("doctor", help="what this machine has, and what is wrong with the fix")
    d.add_argument("--sim", action="store_true", help="diagnose the simulator path")
    d.set_defaults(func=_doctor)
    b = sub.add_parser("bench", help="check then time the kernel ladder against cuDNN/cuBLAS")
    b.add_argument("layers", nargs="*", default=["resnet64", "resnet128", "resnet256"])
    b.add_argument("--out", default=None, help="folder for JSON and pictures")
    b.add_argument("--repeat", type=int, default=15)
    b.add_argument("--sim", action="store_true", help="force the simulator")
    b.add_argument("--no-gemm", action="store_true", help="skip the GEMM ladder (4096^3)")
    b.add_argument("--no-batch", action="store_true", help="skip the batch-size sweep")
    b.add_argument("--layers", dest="layer_set", choices=("resnet50",), default=None,
                   help="resnet50: every distinct conv of ResNet-50 at each of --batches "
                        "(the best kernels and Triton against cuDNN fp32; resnet50.json)")
    b.add_argument("--batches", default=None,
                   help="comma-separated batch sizes (default 32,64,128; 32,1,128 with --layers)")
    b.add_argument("--budget", type=float, default=None,
                   help="seconds: start no new layer after this (with --layers)")
    b.set_defaults(func=_bench)
    e = sub.add_parser("exercises", help="exercises/ from solutions/ (build, or --check)")
    e.add_argument("action", choices=["build"])
    e.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 and name the stale exercise notebooks")
    e.add_argument("--root", default=None, help="the folder holding solutions/ (default: here)")
    e.set_defaults(func=_exercises)
    g = sub.add_parser("grade", help="grade one notebook (summary + Gradescope results.json)")
    g.add_argument("notebook")
    g.add_argument("--out", default=None, help="write Gradescope's results.json here")
    g.add_argument("--quiet", action="store_true", help="no summary on the terminal")
    g.add_argument("--hide", action="append", default=[],
                   help="a path the learner's code must not read (repeatable)")
    _grade_options(g)
    g.set_defaults(func=_grade)
    gb = sub.add_parser("grade-batch", help="grade a folder of notebooks into gradebook.csv")
    gb.add_argument("folder")
    gb.add_argument("--out", default=None, help="output folder (default: FOLDER/graded)")
    gb.add_argument("--jobs", type=int, default=2, help="notebooks graded at once")
    _grade_options(gb)
    gb.set_defaults(func=_grade_batch)
    a = sub.add_parser("autograder", help="write a Gradescope autograder zip")
    a.add_argument("--out", default="autograder.zip")
    a.add_argument("--root", default=None, help="the folder holding solutions/")
    a.add_argument("--private-tests", default=None, help="a folder of private tests to ship")
    a.add_argument("--notebooks", nargs="*", default=None,
                   help="the assignment's notebook (e.g. 06 or 06_tiling)")
    a.add_argument("--cell-timeout", type=float, default=None)
    a.add_argument("--total-timeout", type=float, default=None)
    a.add_argument("--gpu", action="store_true",
                   help="for a self-hosted GPU runner: GPU extras, grade with --gpu")
    a.set_defaults(func=_autograder)
    pu = sub.add_parser("publish", help="stamp the repository URL into notebooks and README")
    pu.add_argument("--repo", default=None, help="the course's repository URL (default: "
                    "pyproject.toml's [project.urls] Repository)")
    pu.add_argument("--branch", default=None, help="its branch (default: pyproject.toml's)")
    pu.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 naming every file whose stamp disagrees")
    pu.add_argument("--root", default=None, help="the course checkout (default: here)")
    pu.set_defaults(func=_publish)
    pk = sub.add_parser("pack", help="the offline zip: wheel + notebooks (Colab/Kaggle upload)")
    pk.add_argument("--out", default=None, help="zip path (default: dist/convlab-course-V.zip)")
    pk.add_argument("--deps", action="store_true",
                    help="also every dependency's wheel, to install with the internet off")
    pk.add_argument("--python", default=None, help="with --deps: the target Python, e.g. 312")
    pk.add_argument("--root", default=None, help="the course checkout (default: here)")
    pk.set_defaults(func=_pack)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
