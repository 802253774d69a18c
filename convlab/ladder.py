"""The race: every kernel of the ladder against cuDNN and cuBLAS, checked then timed.

``python -m convlab bench [layers...] --out DIR`` runs this on the current GPU and writes
``ladder.json``, a bar chart (% of cuDNN) and a roofline picture.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
from pathlib import Path

from . import bench, problems
from .runtime import cuda


def ladder_impls(problem, kernels: dict | None = None, libraries: bool = True) -> list:
    """Impls for every course kernel (ladder order) plus the library baselines."""
    from . import baselines
    from .kernels import CONV_LADDER

    impls = [bench.launcher_impl(name, fn, problem)
             for name, fn in (kernels or CONV_LADDER).items()]
    if libraries and baselines.torch_available():
        impls += [baselines.cudnn_conv_impl(problem, "fp32"),
                  baselines.cudnn_conv_impl(problem, "tf32"),
                  baselines.cudnn_conv_impl(problem, "fp16")]
    if libraries and baselines.cupy_available():
        impls.append(baselines.cublas_im2col_impl(problem))
    return impls


def environment() -> dict:
    """Device, versions and date for a results file."""
    import importlib.metadata as md

    c = cuda()
    dev = c.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
    versions = {}
    for dist in ("numpy", "numba", "numba-cuda", "cupy-cuda12x", "cupy-cuda13x", "torch"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return dict(device=name, compute_capability=".".join(map(str, dev.compute_capability)),
                date=_dt.date.today().isoformat(), python=platform.python_version(),
                versions=versions)


def run_ladder(layers=problems.RESNET, out_dir=None, repeat: int = 15, kernels=None) -> dict:
    """Check and time the ladder on each named layer; optionally save JSON + pictures."""
    result = environment()
    result["ceilings"] = bench.measure_ceilings()
    print(f"{result['device']}: copy {result['ceilings']['copy_gbps']:.0f} GB/s, fp32 FMA "
          f"{result['ceilings']['fma_tflops']:.1f} TFLOP/s")
    ladders = []
    for name in layers:
        prob = problems.conv_layer(name)
        lad = bench.bench_conv(ladder_impls(prob, kernels), prob, baseline="cuDNN fp32",
                               repeat=repeat, precision={"cuDNN tf32": "tf32",
                                                         "cuDNN fp16": "fp16"})
        ladders.append(lad.to_dict())
        print()
    result["ladders"] = ladders
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "ladder.json").write_text(json.dumps(result, indent=1))
        plot_ladder(result, out / "ladder.png")
        plot_roofline(result, out / "roofline.png")
        print(f"wrote {out}/ladder.json, ladder.png, roofline.png")
    return result


def plot_ladder(result: dict, path=None):
    """Grouped bars: % of cuDNN fp32 for every version on every layer."""
    import matplotlib

    matplotlib.use("Agg") if path else None
    import matplotlib.pyplot as plt
    import numpy as np

    lads = result["ladders"]
    names = []
    for lad in lads:
        for r in lad["rows"]:
            if r["name"] not in names:
                names.append(r["name"])
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(names)), 3.8))
    width = 0.8 / max(1, len(lads))
    for i, lad in enumerate(lads):
        pct = {r["name"]: r["pct_of_baseline"] or 0 for r in lad["rows"]}
        ax.bar(np.arange(len(names)) + i * width, [pct.get(n, 0) for n in names], width,
               label=lad["problem"].split(":")[0])
    ax.axhline(100, color="k", lw=0.8, ls="--")
    ax.set_xticks(np.arange(len(names)) + width * (len(lads) - 1) / 2, names, rotation=30,
                  ha="right")
    ax.set_ylabel("% of cuDNN fp32 speed")
    ax.set_title(f"{result['device']}: the ladder ({result['date']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    return fig


def plot_roofline(result: dict, path=None):
    """Every timed version of every layer on this device's measured roofline."""
    import matplotlib.pyplot as plt

    pts = []
    for lad in result["ladders"]:
        ai = lad["flops"] / lad["bytes"]
        short = lad["problem"].split(":")[0]
        pts += [(f"{r['name']} ({short})", ai, r["tflops"]) for r in lad["rows"]]
    ce = result["ceilings"]
    ax = bench.roofline(pts, ce["copy_gbps"], ce["fma_tflops"],
                        title=f"{result['device']}: roofline")
    fig = ax.figure
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig
