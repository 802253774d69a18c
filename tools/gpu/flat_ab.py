"""The one-launch GEMM beside a changed copy of itself, on ResNet-50's layers, in one process.

    git show BRANCH:convlab/kernels/flat_igemm_cuda.py > ALT/flat_igemm_cuda.py
    git show BRANCH:convlab/kernels/csrc/flat_igemm.cu > ALT/csrc/flat_igemm.cu
    ALT=ALT[,ALT2...] BATCHES=1,32 python3 tools/gpu/flat_ab.py [all | all1x1 | LAYER ...]

A is the checkout's `flat_igemm_cuda`; B, C, ... the modules loaded from the ALT folders
(each with its own source and tile rule). Per layer and batch: cuDNN fp32 (TF32 off), then
every module at its rule's tile, each output poisoned, checked against float64, then timed
(`bench.time_gpu_queued`) in ROUNDS (default 3) rounds of all of them, medians. A table
last (% of cuDNN, and each alternative's speed-up over A); $OUT/flat_ab.json.
"""

import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path

import convlab

convlab.setup("gpu")
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

from convlab import check, problems  # noqa: E402
from convlab.kernels import flat_igemm_cuda as A  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from flat_ks import layer_inputs, time_us  # noqa: E402  (the same inputs and clock)


def load_alt(folder: str, tag: str):
    """The module in folder/flat_igemm_cuda.py, a sibling of convlab.kernels' modules (its
    relative imports resolve there; its source is folder/csrc/flat_igemm.cu)."""
    spec = importlib.util.spec_from_file_location(
        f"convlab.kernels.flat_igemm_cuda_{tag}", Path(folder) / "flat_igemm_cuda.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclasses look their module up while it runs
    spec.loader.exec_module(mod)
    return mod


def run_layer(layer, batch, mods, rng, rounds):
    torch, prob, p, x, w, case, tx, tw = layer_inputs(layer, batch, rng)
    kw = prob.kwargs
    fns = {"cudnn": lambda: torch.nn.functional.conv2d(tx, tw, **kw)}
    row = dict(layer=layer.name, batch=batch, ok={}, tile={})
    for name, mod in mods.items():
        out = cp.asarray(check.poisoned(p.out_shape))
        mod.conv2d_flat_igemm_cuda(x, w, out, **kw)
        comp = check.compare(cp.asnumpy(out), case["expected"], case["absref"],
                             reduction=case["reduction"])
        row["ok"][name], row["tile"][name] = bool(comp.ok), str(mod.choose(p))
        if comp.ok:
            fns[name] = lambda mod=mod, out=out: mod.conv2d_flat_igemm_cuda(x, w, out, **kw)
        else:
            row.setdefault("error", {})[name] = comp.summary()
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(time_us(fn))
    row["us"] = {name: statistics.median(v) for name, v in samples.items()}
    return row


def main(argv) -> int:
    layers = {lay.name: lay for lay in problems.RESNET50}
    names = ([n for n in layers if n.startswith("1x1")] if argv == ["all1x1"] else
             list(layers) if argv in ([], ["all"]) else argv)
    missing = [n for n in names if n not in layers]
    if missing:
        print(f"unknown layers: {missing}; known: {sorted(layers)}")
        return 2
    mods = {"A": A}
    for i, folder in enumerate(os.environ["ALT"].split(",")):
        tag = "BCDEFG"[i]
        mods[tag] = load_alt(folder, tag)
        print(f"{tag}: {folder}")
    batches = [int(b) for b in os.environ.get("BATCHES", "1").split(",")]
    rounds = int(os.environ.get("ROUNDS", 3))
    rng = np.random.default_rng(1)
    rows = []
    print(f"{'layer':<26}{'batch':>5}  {'cuDNN us':>9}"
          + "".join(f"  {m + ' us':>8} {m + ' %':>5}" for m in mods)
          + "".join(f"  {m + '/A':>6}" for m in list(mods)[1:]))
    for batch in batches:
        for n in names:
            row = run_layer(layers[n], batch, mods, rng, rounds)
            rows.append(row)
            us = row["us"]
            cells = []
            for m in mods:
                cells.append(f"{us[m]:8.1f} {100 * us['cudnn'] / us[m]:5.0f}" if m in us
                             else f"{'WRONG':>8} {'':>5}")
            ratios = [f"{us['A'] / us[m]:5.2f}x" if "A" in us and m in us else f"{'-':>6}"
                      for m in list(mods)[1:]]
            print(f"{n:<26}{batch:>5}  {us['cudnn']:9.1f}  " + "  ".join(cells)
                  + "  " + "  ".join(ratios), flush=True)
            for m, err in row.get("error", {}).items():
                print(f"   {m} WRONG: {err[:100]}")
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "flat_ab.json").write_text(json.dumps(dict(rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
