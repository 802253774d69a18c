"""ResNet-50's 1x1 layers and stem at batch 1 (and 32), the course's CUDA C against cuDNN fp32.

    python3 tools/gpu/batch1.py            # table last; $OUT/batch1.json (about 90 s)

Kernels, each checked against float64 (poisoned output) before it is timed with
`bench.time_gpu_queued` beside cuDNN fp32 (TF32 off) in the same run (`ladder.run_batch_sweep`):
"cuda" is the course's entry point (`conv_cuda.conv2d_cuda`: the algorithm
`choose_algorithm` picks), "flat_igemm_cuda" the one-launch kernel with the tile its rule
picks, "flat ..." the same kernel forced to one tile (its split rule kept), to no split, or
to a split towards 2 or 8 blocks per SM instead of 4 (what the rule's constants cost),
"implicit_gemm_cuda" (conv09) and "im2col_fused_cuda" the paths these layers took before.
Batch 32 runs only the entry point, the one-launch kernel and conv09 (the rule keeps conv09
and im2col_fused there: the row shows whether it should).
"""

import json
import os
import time
from pathlib import Path

import convlab

convlab.setup()
from convlab import baselines, ladder, problems  # noqa: E402
from convlab import reference as ref  # noqa: E402
from convlab.kernels import conv09_implicit_gemm_cuda as conv09  # noqa: E402
from convlab.kernels import conv_cuda  # noqa: E402
from convlab.kernels import flat_igemm_cuda as F  # noqa: E402
from convlab.kernels._launch import ceil_div, launcher  # noqa: E402
from convlab.kernels.im2col01_cuda import conv2d_im2col_fused_cuda  # noqa: E402


def forced(bm=None, bn=None, target=F.TARGET_BLOCKS):
    """The flat kernel with tile bm x bn (None: the rule's tile) and the reduction split
    towards `target` blocks (`F.split_parts`; 0: no split)."""
    chosen: dict = {}

    @launcher
    def conv(x, w, out, **kw):
        key = (x.shape, w.shape, tuple(sorted(kw.items())))
        if key not in chosen:
            p = ref.conv_params(x.shape, w.shape, **kw)
            t = F.choose(p)
            tm, tn = bm or t.BM, bn or t.BN
            blocks = ceil_div(p.K, tm) * ceil_div(p.N * p.P * p.Q, tn)
            parts = F.split_parts(blocks, ceil_div(p.C * p.R * p.S, F.BK), target) if (
                target and blocks < target) else 1
            chosen[key] = F.make_launcher(F.Tile(tm, tn, parts))
        return chosen[key](x, w, out, **kw)

    return conv


MAIN = {"cuda": conv_cuda.conv2d_cuda, "flat_igemm_cuda": F.conv2d_flat_igemm_cuda,
        "implicit_gemm_cuda": conv09.conv2d_implicit_gemm_cuda}
VARIANTS = {"im2col_fused_cuda": conv2d_im2col_fused_cuda, "flat 64x64": forced(64, 64),
            "flat 32x64": forced(32, 64), "flat no split": forced(target=0),
            "flat split to 2/SM": forced(target=2 * conv09.SMS),
            "flat split to 8/SM": forced(target=8 * conv09.SMS)}


def macs(prob) -> int:
    p = ref.conv_params(prob.x_shape, prob.w_shape, **prob.kwargs)
    return p.N * p.K * p.P * p.Q * p.C * p.R * p.S


def pick(layer, batch) -> str:
    prob = layer.with_batch(batch)
    p = ref.conv_params(prob.x_shape, prob.w_shape, **prob.kwargs)
    algo = conv_cuda.choose_algorithm(p)
    return algo + (f" {F.choose(p)}" if algo == "flat_igemm" else "")


def main():
    t0 = time.perf_counter()
    baselines.set_torch_precision("fp32")
    layers = [lay for lay in problems.RESNET50 if not lay.name.startswith("3x3")]
    result = ladder.environment()
    b1 = ladder.run_batch_sweep(layers, (1,), {**MAIN, **VARIANTS}, repeat=8, progress=True)
    # batch 32, least work first (the layers nearest the rule's threshold), what time is left
    by_work = sorted(layers, key=lambda lay: macs(lay.with_batch(32)))
    left = max(10.0, 100 - (time.perf_counter() - t0))
    b32 = ladder.run_batch_sweep(by_work, (32,), MAIN, repeat=8, progress=True, budget_s=left)
    rows = b1["rows"] + b32["rows"]
    for row in rows:
        row["rule"] = pick(next(lay for lay in layers if lay.name == row["layer"]),
                           row["batch"])
    sweep = dict(batches=[1, 32], rows=rows, skipped=b32["skipped"])
    sweep["summary"] = ladder.sweep_summary(sweep)
    result["batch1"] = sweep
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "batch1.json").write_text(json.dumps(result, indent=1))
    print_table(rows, sweep["skipped"])
    print(f"{time.perf_counter() - t0:.0f} s")


def print_table(rows, skipped=()):
    """One line per layer and batch: cuDNN, the entry point (% of cuDNN), conv09, the best
    variant of the flat kernel (us), after the first errors; then the batch-1 rows below 80%."""
    errors = [f"error: {row['layer']} batch {row['batch']} {k}: {e[:160]}"
              for row in rows for k, e in row["errors"].items()]
    print("\n".join(errors[:12] + ([f"... {len(errors) - 12} more errors"]
                                    if len(errors) > 12 else [])))
    print(f"\n{'layer':<24}{'b':>3}{'cuDNN us':>10}  {'rule':<24}{'cuda us':>9}{'% cuDNN':>9}"
          f"{'conv09 us':>10}{'best flat':>26}  errors")
    misses = []
    for row in rows:
        ms, pct = row["ms"], row["pct_cudnn"]
        flat = {k: v for k, v in ms.items() if k.startswith("flat")}
        best = min(flat, key=flat.get) if flat else None
        us = {k: 1e3 * v for k, v in ms.items()}
        cell = (f"{best} {us[best]:.1f}" if best else "-")
        got = pct.get("cuda")
        print(f"{row['layer']:<24}{row['batch']:>3}{us.get('cuDNN fp32', float('nan')):>10.1f}  "
              f"{row['rule']:<24}{us.get('cuda', float('nan')):>9.1f}"
              f"{got if got else float('nan'):>9.0f}"
              f"{us.get('implicit_gemm_cuda', float('nan')):>10.1f}{cell:>26}  "
              f"{', '.join(row['errors'])}")
        if row["batch"] == 1 and (got is None or got < 80):
            misses.append(row["layer"])
    for s in skipped:
        print(f"not run (time budget): {s}")
    print(f"batch 1 below 80% of cuDNN fp32: {', '.join(misses) or 'none'}")


if __name__ == "__main__":
    main()
