"""Merge a GPU run's output into the committed results (run here, after fetching $OUT).

    python3 tools/gpu/collect_results.py RUN_DIR [--sweep SWEEP_DIR] [--run1 RUN1_DIR]
        [--commit HASH] [--command "..."]

RUN_DIR holds ``bench/ladder.json`` and its pictures (``python -m convlab bench --out``);
SWEEP_DIR (default RUN_DIR) holds ``fast_kernels.json`` and ``tuned.json`` from
tools/gpu/fast_kernels.py. Writes convlab/results/h200.json (what `convlab.bench.stored_results`
and the lessons read) and copies the pictures to convlab/results/h200_*.png.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "convlab" / "results"
LAYERS = ("resnet64", "resnet128", "resnet256")


def sweep_summary(fk: dict) -> dict:
    """The tile sweep, compact: per variant ms / % of cuDNN per layer, regs, host us."""
    out = {}
    for name, v in fk.get("variants", {}).items():
        row = {k: v[k] for k in ("kind", "regs", "error") if v.get(k) is not None}
        if "config" in v:
            row["config"] = v["config"]
        if v.get("kind") == "conv":
            for n in LAYERS:
                for f in ("ms", "tflops", "host_us", "max_rel"):
                    if f"{n}_{f}" in v:
                        row[f"{n}_{f}"] = v[f"{n}_{f}"]
            if "pct_cudnn" in v:
                row["pct_cudnn"] = v["pct_cudnn"]
                row["geomean_pct"] = v["geomean_pct"]
        else:
            for f in ("gemm4096_ms", "gemm4096_tflops", "pct_cublas", "gemm4096_host_us"):
                if f in v:
                    row[f] = v[f]
        out[name] = row
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--sweep", default=None)
    ap.add_argument("--run1", default=None, help="run 1's fast_kernels.json folder (CPU-bound)")
    ap.add_argument("--previous", default=None,
                    help="an earlier bench run's folder: its rows are kept (run-to-run spread)")
    ap.add_argument("--commit", default="")
    ap.add_argument("--command", default="")
    args = ap.parse_args()
    run, sweep = Path(args.run), Path(args.sweep or args.run)
    result = json.loads((run / "bench" / "ladder.json").read_text())
    result["commit"] = args.commit
    result["command"] = args.command
    fk = json.loads((sweep / "fast_kernels.json").read_text())
    tuned = json.loads((sweep / "tuned.json").read_text())
    result["tuned"] = tuned["tuned"]
    result["tuned_choice"] = tuned["choice"]
    result["sweep"] = dict(date=fk["env"].get("date"), libraries=fk.get("libraries_before"),
                           libraries_after=fk.get("libraries_after"),
                           variants=sweep_summary(fk))
    if args.run1:
        r1 = json.loads((Path(args.run1) / "fast_kernels.json").read_text())
        result["sweep_run1_cpu_bound"] = dict(
            note="run 1: the Numba implicit-GEMM launchers allocated the filter matrix and "
                 "built views on every call; back-to-back calls were limited by Python "
                 "(about 0.4 ms per call), not by the GPU",
            variants=sweep_summary(r1))
    if args.previous:
        prev = json.loads((Path(args.previous) / "bench" / "ladder.json").read_text())
        result["previous_run"] = dict(
            note="the same bench on another H200 machine earlier the same day (before the "
                 "last kernel edits: the CUDA C epilogue's explicit 128-bit stores, new "
                 "fallback tile rules, the 128x64x16 GEMM default); rows differ by up to "
                 "~10% between machines (some older steps more)",
            date=prev.get("date"), ceilings=prev.get("ceilings"),
            ladders=[dict(problem=lad["problem"], rows={r["name"]: dict(
                ms=r["ms"], pct_of_baseline=r["pct_of_baseline"]) for r in lad["rows"]})
                for lad in prev["ladders"]],
            gemm_ladder=prev.get("gemm_ladder"), batch_sweep=prev.get("batch_sweep"))
    # the must-show numbers, recomputed from the ladder
    summary = {}
    for fam in ("implicit_gemm_tuned", "implicit_gemm_cuda"):
        pct = []
        for lad in result["ladders"]:
            row = next((r for r in lad["rows"] if r["name"] == fam), None)
            if row is not None:
                pct.append(row["pct_of_baseline"])
        if len(pct) == len(result["ladders"]) and pct:
            summary[fam] = dict(pct_cudnn=pct, geomean=math.prod(pct) ** (1 / len(pct)),
                                min=min(pct))
    g = result.get("gemm_ladder", {})
    best = max((r for r in g.get("rows", []) if r["name"] != "cuBLAS"),
               key=lambda r: r["tflops"], default=None)
    if best:
        summary["gemm_best_numba"] = dict(name=best["name"], pct_cublas=best["pct_cublas"],
                                          tflops=best["tflops"])
    result["summary"] = summary
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "h200.json").write_text(json.dumps(result, indent=1) + "\n")
    # the pictures, drawn again from the JSON with the current plotting code
    import sys

    sys.path.insert(0, str(ROOT))
    import convlab

    convlab.setup("sim")  # plotting only: no GPU needed
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from convlab import ladder

    for png, fn in (("ladder", ladder.plot_ladder), ("roofline", ladder.plot_roofline),
                    ("gemm_ladder", ladder.plot_gemm_ladder),
                    ("batch_sweep", ladder.plot_batch_sweep)):
        try:
            fig = fn(result, RESULTS / f"h200_{png}.png")
            plt.close(fig)
        except KeyError:
            src = run / "bench" / f"{png}.png"
            if src.exists():
                shutil.copyfile(src, RESULTS / f"h200_{png}.png")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
