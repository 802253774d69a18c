"""The one-launch GEMM's sliced reduction (KS) on ResNet-50's batch-1 1x1 layers, beside cuDNN.

    python3 tools/gpu/flat_ks.py                 # table; $OUT/flat_ks.json (about a minute)
    python3 tools/gpu/flat_ks.py "1x1 512->2048 7x7"   # only the layers named
    python3 tools/gpu/flat_ks.py all1x1                # every 1x1 layer of ResNet-50
    TILES=all python3 tools/gpu/flat_ks.py ...         # 32x64 and 64x64 tiles as well
    PREFETCH=1,2,3,4 python3 tools/gpu/flat_ks.py all  # the rule's tile at each prefetch
                                                       # depth instead (all: + the stem)
    SUBSAMPLE=0,1 python3 tools/gpu/flat_ks.py "1x1 256->512 56x56/2"   # strided 1x1 layers
                 # with the input subsampled first or not (with PREFETCH: at each depth)
    BATCH=32 ...                                       # another batch size than 1
    SRC=path ...            # the rule's tile from another copy of flat_igemm.cu beside the
                            # tree's, twice each in the order tree, SRC, tree, SRC

Per layer: cuDNN fp32 (TF32 off), the rule (`flat_igemm_cuda.choose`), and the 32x32 tile
forced to KS = 1, 2, 4 groups of 64 threads, each with the reduction split towards 4, 2 or
1 blocks per SM (`split_parts`: more threads per block may want fewer parts). Every output
is checked against float64 (poisoned first) before it is timed with
`bench.time_gpu_queued`.
"""

import json
import os
import sys
from pathlib import Path

import convlab

convlab.setup("gpu")
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

from convlab import baselines, check, problems  # noqa: E402
from convlab import bench as timing  # noqa: E402
from convlab import reference as ref  # noqa: E402
from convlab.kernels import flat_igemm_cuda as F  # noqa: E402
from convlab.kernels._launch import ceil_div  # noqa: E402

LAYERS = ("1x1 512->2048 7x7", "1x1 256->1024 14x14", "1x1 512->1024 28x28/2",
          "1x1 256->512 56x56/2", "1x1 128->512 28x28", "1x1 512->256 28x28",
          "1x1 256->128 56x56", "1x1 64->64 56x56")
TARGETS = {"4/SM": F.TARGET_BLOCKS, "2/SM": F.TARGET_BLOCKS // 2, "1/SM": F.TARGET_BLOCKS // 4}


def tiles_for(p):
    """name -> Tile: 32x32 (every built tile with TILES=all) with each KS and each split
    target (duplicates dropped)."""
    shapes = [(t.BM, t.BN) for t in F.TILES] if os.environ.get("TILES") == "all" else [(32, 32)]
    slabs = ceil_div(p.C * p.R * p.S, F.BK)
    out, seen = {}, set()
    for bm, bn in shapes:
        blocks = ceil_div(p.K, bm) * ceil_div(p.N * p.P * p.Q, bn)
        for ks in F.KS_CHOICES:
            if F.Tile(bm, bn, 1, ks) not in F.KERNELS:
                continue
            for tname, target in TARGETS.items():
                parts = F.split_parts(blocks, slabs, target) if blocks < target else 1
                t = F.Tile(bm, bn, parts, ks)
                if t not in seen:
                    seen.add(t)
                    label = f"{bm}x{bn} " if len(shapes) > 1 else ""
                    out[f"{label}ks{ks} split to {tname}"] = t
    return out


def with_source(src: str, fn):
    """fn, run with flat_igemm_cuda compiling the file `src` (its own module and plan
    caches) instead of the package's flat_igemm.cu."""
    own = dict(SOURCE_PATH=Path(src), _MODULES={}, _PLANS={})

    def run(*args, **kw):
        saved = {name: getattr(F, name) for name in own}
        for name, v in own.items():
            setattr(F, name, v)
        try:
            return fn(*args, **kw)
        finally:
            for name, v in saved.items():
                setattr(F, name, v)

    return run


def time_us(fn):
    return 1e3 * timing.time_gpu_queued(fn, calls=50, repeat=7).median_ms


def layer_inputs(layer, batch, rng):
    """One layer at a batch size, ready to check and time: (torch with TF32 off, the
    problem, its conv params, x and w on the GPU, the float64 reference case, x and w as
    torch tensors)."""
    torch = baselines.set_torch_precision("fp32")
    prob = layer.with_batch(batch)
    p = ref.conv_params(prob.x_shape, prob.w_shape, **prob.kwargs)
    xh, wh = check.random_array(prob.x_shape, rng), check.random_array(prob.w_shape, rng)
    case = check.reference_case(xh, wh, **prob.kwargs)
    x, w = cp.asarray(xh), cp.asarray(wh)
    tx, tw = torch.as_tensor(x, device="cuda"), torch.as_tensor(w, device="cuda")
    return torch, prob, p, x, w, case, tx, tw


def run_layer(layer, rng):
    torch, prob, p, x, w, case, tx, tw = layer_inputs(layer, int(os.environ.get("BATCH", 1)),
                                                      rng)
    kw = prob.kwargs
    cudnn = time_us(lambda: torch.nn.functional.conv2d(tx, tw, **kw))
    row = dict(layer=layer.name, cudnn_us=cudnn, rule=str(F.choose(p)), configs=[])
    runs = {"rule": (F.choose(p), F.conv2d_flat_igemm_cuda)}
    depths, subs = os.environ.get("PREFETCH"), os.environ.get("SUBSAMPLE")
    if src := os.environ.get("SRC"):
        other = with_source(src, F.make_launcher())
        runs.update({"rule SRC": (F.choose(p), other),
                     "rule again": (F.choose(p), F.make_launcher()),
                     "rule SRC again": (F.choose(p), other)})
    elif depths or subs:   # the rule's tile: slabs in flight 1, 2, ...; subsampled or not
        strided_1x1 = F.mode_of(p) == 0 and p.stride != (1, 1)
        for d in depths.split(",") if depths else [None]:
            for sub in [bool(int(v)) for v in subs.split(",")] if subs else [None]:
                if sub and not strided_1x1:
                    continue   # nothing to subsample
                name = ("rule" + (f" prefetch {d}" if d else "")
                        + (f" subsample {int(sub)}" if sub is not None else ""))
                runs[name] = (F.choose(p), F.make_launcher(
                    prefetch=int(d) if d else None, subsample=sub))
    else:
        runs.update({name: (t, F.make_launcher(t)) for name, t in tiles_for(p).items()})
    for name, (tile, fn) in runs.items():
        out = cp.asarray(check.poisoned(p.out_shape))
        fn(x, w, out, **kw)
        comp = check.compare(cp.asnumpy(out), case["expected"], case["absref"],
                             reduction=case["reduction"])
        entry = dict(name=name, tile=str(tile), threads=tile.threads,
                     grid=list(F.plan_args(p, tile)["grid"]), ok=bool(comp.ok))
        if comp.ok:
            us = time_us(lambda fn=fn, out=out: fn(x, w, out, **kw))
            entry.update(us=us, pct_cudnn=100 * cudnn / us)
        else:
            entry["error"] = comp.summary()
        row["configs"].append(entry)
    row["cudnn_us_after"] = time_us(lambda: torch.nn.functional.conv2d(tx, tw, **kw))
    return row


def print_row(row):
    print(f"\n{row['layer']}: cuDNN {row['cudnn_us']:.1f} us (after: "
          f"{row['cudnn_us_after']:.1f}), rule {row['rule']}")
    for c in row["configs"]:
        grid = "x".join(map(str, c["grid"]))
        cell = (f"{c['us']:7.1f} us {c['pct_cudnn']:5.0f}%" if c["ok"] else
                f"WRONG: {c['error'][:80]}")
        print(f"  {c['name']:<18} {c['tile']:<20} grid {grid:<10} x{c['threads']:<4} {cell}")
    ok = [c for c in row["configs"] if c["ok"]]
    if ok:
        best = min(ok, key=lambda c: c["us"])
        print(f"  best: {best['tile']} {best['us']:.1f} us, {best['pct_cudnn']:.0f}% of cuDNN")


def main(argv) -> int:
    layers = {lay.name: lay for lay in problems.RESNET50}
    names = ([n for n in layers if n.startswith("1x1")] if argv == ["all1x1"] else
             [n for n in layers if n[:3] != "3x3"] if argv == ["all"] else argv or LAYERS)
    missing = [n for n in names if n not in layers]
    if missing:
        print(f"unknown layers: {missing}; known: {sorted(layers)}")
        return 2
    rng = np.random.default_rng(1)
    rows = []
    for n in names:
        rows.append(run_layer(layers[n], rng))
        print_row(rows[-1])
    print("\nlayer                     rule                    rule %   best (tile: %)")
    for row in rows:
        ok = [c for c in row["configs"] if c["ok"]]
        rule = next(c for c in row["configs"] if c["name"] == "rule")
        best = min(ok, key=lambda c: c["us"]) if ok else None
        print(f"{row['layer']:<26}{row['rule']:<24}{rule.get('pct_cudnn', float('nan')):6.0f}"
              f"   {best['tile'] + ': ' + format(best['pct_cudnn'], '.0f') if best else '-'}")
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "flat_ks.json").write_text(json.dumps(dict(rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
