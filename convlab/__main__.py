"""Command line: ``python -m convlab doctor | bench``."""

from __future__ import annotations

import argparse
import sys


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
        for lad in stored.get("ladders", []):
            print(bench.Ladder(**{k: lad[k] for k in ("problem", "flops", "bytes", "baseline")},
                               rows=[bench.Row(**r) for r in lad["rows"]]).table())
            print()
        return 0
    from .ladder import run_ladder

    run_ladder(args.layers, out_dir=args.out, repeat=args.repeat)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="convlab", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("doctor", help="what this machine has, and what is wrong with the fix")
    d.add_argument("--sim", action="store_true", help="diagnose the simulator path")
    d.set_defaults(func=_doctor)
    b = sub.add_parser("bench", help="check then time the kernel ladder against cuDNN/cuBLAS")
    b.add_argument("layers", nargs="*", default=["resnet64", "resnet128", "resnet256"])
    b.add_argument("--out", default=None, help="folder for JSON and pictures")
    b.add_argument("--repeat", type=int, default=15)
    b.add_argument("--sim", action="store_true", help="force the simulator")
    b.set_defaults(func=_bench)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
