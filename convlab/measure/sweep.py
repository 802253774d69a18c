"""The tile sweep of lessons 07 and 09, and the per-layer table conv08 / conv09 use.

Every candidate tile shape of the two fastest conv families (conv07 warp-tiled Numba,
compiled in parallel worker processes by ``autotune.tune(..., workers=n)``; conv09 CUDA C,
one NVRTC module) is checked on the three ResNet layers at batch 32 and timed beside cuDNN
fp32 (TF32 off), and the double-buffered GEMM's tiles beside cuBLAS at 4096^3; the
libraries are timed before and after the variants (drift). "tuned" keeps the fastest
correct shape per layer and family; it is also written as ``tuned.json`` next to the
results (point CONVLAB_TUNED at it to use it before it is committed).

Stored flat in the main results file (with `convlab bench`'s ladder): "sweep" (libraries
and variants: per layer ms, TFLOP/s, % of cuDNN, registers, Python µs per call), "tuned",
"tuned_choice".
"""

from __future__ import annotations

import functools
import json
import math

import numpy as np

from .. import autotune, baselines, check, problems
from .. import reference as ref
from .harness import Group

GROUP = Group("sweep", layout="flat", file="bench")
section = GROUP.section
LAYERS = problems.RESNET


def c7_name(cfg) -> str:
    mb = f", min_blocks={cfg.min_blocks}" if cfg.min_blocks else ""
    return f"conv07 {cfg.BM}, {cfg.BN}, {cfg.BK}{mb}"


GEMM_TILES = (dict(BN=64), dict(BN=64, BK=16), dict(BM=64), dict(BN=64, min_blocks=3))


def gemm_name(t: dict) -> str:
    BM, BN, BK = t.get("BM", 128), t.get("BN", 128), t.get("BK", 8)
    return f"gemm04 db {BM}x{BN}x{BK}" + (f" b{t['min_blocks']}" if t.get("min_blocks") else "")


def time_libraries(ctx, layers, n: int) -> dict:
    """cuDNN fp32 / tf32 per layer, cuBLAS SGEMM n^3 (TF32 off); what is installed."""
    out = {}
    clock = ctx.clock
    if baselines.torch_available():
        torch = baselines.set_torch_precision("fp32")
        F = torch.nn.functional
        rng = np.random.default_rng(2026)
        for name in layers:
            prob = problems.conv_layer(name)
            x = torch.from_numpy(check.random_array(prob.x_shape, rng)).cuda()
            w = torch.from_numpy(check.random_array(prob.w_shape, rng)).cuda()
            for prec in ("fp32", "tf32"):
                baselines.set_torch_precision(prec)
                torch.backends.cudnn.benchmark = True
                t = clock.time_gpu(functools.partial(F.conv2d, x, w, **prob.kwargs), warmup=5,
                                   repeat=15)
                out[f"cuDNN {prec} {name}"] = dict(ms=t.median_ms, spread=t.spread,
                                                   tflops=t.tflops(prob.flops))
        baselines.set_torch_precision("fp32")
    if baselines.cupy_available():
        import cupy as cp

        rng = np.random.default_rng(7)
        a = check.random_array((n, n), rng)
        b = check.random_array((n, n), rng)
        ca, cb = cp.asarray(a), cp.asarray(b)
        cc = cp.empty_like(ca)
        t = clock.time_gpu(functools.partial(cp.matmul, ca, cb, out=cc), warmup=3, repeat=15)
        out[f"cuBLAS sgemm {n}"] = dict(ms=t.median_ms, spread=t.spread, tflops=t.tflops(2 * n**3))
    ctx.log("libraries: " + ", ".join(f"{k} {v['ms']:.4f} ms" for k, v in out.items()))
    return out


def _conv_variants(results: list, names: list, layers, kind_group: int, extra=None) -> dict:
    """{variant name: row} from autotune Results (one per layer), configs in `names` order."""
    out = {}
    for i, name in enumerate(names):
        row = dict(group=kind_group, kind="conv", **(extra(i) if extra else {}))
        for layer, res in zip(layers, results, strict=True):
            t = res.trials[i]
            row["regs"] = row.get("regs") or t.regs
            if t.max_rel_err is not None:
                row[f"{layer}_max_rel"] = t.max_rel_err
            if not t.ok:
                row["error"] = f"{layer}: {t.error}"[:600]
                continue
            if t.ms is not None:
                row.update({f"{layer}_ms": t.ms, f"{layer}_spread": t.spread,
                            f"{layer}_tflops": t.tflops})
                if t.host_us is not None:
                    row[f"{layer}_host_us"] = t.host_us
        out[name] = row
    return out


@section("sweep", lessons=("07", "09"))
def sweep(ctx):
    import datetime as dt

    from ..kernels import conv07_implicit_gemm_warp_tiled as c7

    layers = ctx.pick(LAYERS, ("resnet256",))
    probs = [problems.conv_layer(n) for n in layers]
    n = ctx.pick(problems.gemm_size(), 24)
    libs = time_libraries(ctx, layers, n)
    # conv07: every candidate, compiled in parallel processes
    cands = ctx.pick(c7.CANDIDATES, c7.CANDIDATES[:2])
    res7 = autotune.tune(c7.launcher_for, cands, probs, workers=ctx.workers, clock=ctx.clock,
                         repeat=10)
    variants = _conv_variants(res7, [c7_name(c) for c in cands], layers, 1)
    ctx.log("conv07: " + ", ".join(f"{k} {v.get(f'{layers[0]}_ms', v.get('error'))}"
                                   for k, v in variants.items()))
    # conv09 (CUDA C): one NVRTC module holds every candidate
    if baselines.cupy_available() and not ctx.dry:
        from ..kernels import conv09_implicit_gemm_cuda as c9

        c9.prepare(c9.CANDIDATES)
        res9 = autotune.tune(c9.make_launcher, c9.CANDIDATES, probs, clock=ctx.clock, repeat=10)
        def c9_extra(i):
            cfg = c9.CANDIDATES[i]
            try:  # registers per thread, from the compiled NVRTC function
                regs = int(c9._module([cfg]).get_function(cfg.name_expression).num_regs)
            except Exception:  # noqa: BLE001  (a config that did not compile has none)
                regs = None
            return dict(config=vars(cfg).copy(), regs=regs)

        variants.update(_conv_variants(res9, [f"conv09 cuda {c}" for c in c9.CANDIDATES],
                                       layers, 9, c9_extra))
    # gemm04 tiles on n^3 against cuBLAS
    from .. import ladder
    from ..kernels import gemm04_double_buffered as g4

    tiles = ctx.pick(GEMM_TILES, GEMM_TILES[:1])
    gemms = {gemm_name(t): g4.make_launcher(g4.make_kernel(**t)) for t in tiles}
    gl = ladder.run_gemm_ladder(n, gemms, repeat=10, clock=ctx.clock)
    for r in gl["rows"]:  # keys name the size, e.g. gemm4096_ms
        if r["name"] != "cuBLAS":
            variants[r["name"]] = {"group": 0, "kind": "gemm",
                                   "regs": autotune.registers(gemms[r["name"]]),
                                   f"gemm{n}_ms": r["ms"],
                                   f"gemm{n}_tflops": r["tflops"], "pct_cublas": r["pct_cublas"],
                                   f"gemm{n}_max_rel": r["max_rel_err"]}
    for name, err in gl["errors"].items():
        variants[name] = dict(group=0, kind="gemm", error=err)
    after = time_libraries(ctx, layers, n)
    base = {k: min(libs[f"cuDNN fp32 {k}"]["ms"], after[f"cuDNN fp32 {k}"]["ms"])
            for k in layers if f"cuDNN fp32 {k}" in libs}
    for v in variants.values():
        if v["kind"] == "conv" and base and all(f"{k}_ms" in v for k in layers):
            pct = [100 * base[k] / v[f"{k}_ms"] for k in layers]
            v["pct_cudnn"], v["geomean_pct"] = pct, math.prod(pct) ** (1 / len(pct))
    return dict(date=dt.date.today().isoformat(), layers=list(layers), libraries=libs,
                libraries_after=after, variants=variants)


@section("tuned", lessons=("09",), spread=True)
def tuned(ctx):
    """The fastest correct tile per layer and family (-> "tuned", "tuned_choice")."""
    sw = ctx.result("sweep")
    if not sw or "variants" not in sw:
        raise ValueError("no sweep in this results file: run the sweep section first")
    variants, table, choice = sw["variants"], {"numba": {}, "cuda": {}}, {}
    from ..kernels import conv07_implicit_gemm_warp_tiled as c7

    by_name = {c7_name(c): c for c in c7.CANDIDATES}
    for layer in sw["layers"]:
        prob = problems.conv_layer(layer)
        key = autotune.problem_key(ref.conv_params(prob.x_shape, prob.w_shape, **prob.kwargs))
        for fam, prefix in (("numba", "conv07 "), ("cuda", "conv09 cuda ")):
            cands = [(v[f"{layer}_ms"], k) for k, v in variants.items()
                     if k.startswith(prefix) and f"{layer}_ms" in v and "error" not in v]
            if not cands:
                continue
            ms, k = min(cands)
            if fam == "cuda":
                cfg = dict(variants[k]["config"])
            else:
                c = by_name[k]
                cfg = dict(BM=c.BM, BN=c.BN, BK=c.BK, TM=c.TM, TN=c.TN, min_blocks=c.min_blocks)
            table[fam][key] = cfg
            choice[f"{fam} {layer}"] = dict(variant=k, ms=ms)
            if "pct_cudnn" in variants[k]:
                choice[f"{fam} {layer}"]["pct_cudnn"] = variants[k]["pct_cudnn"][
                    sw["layers"].index(layer)]
    if ctx.out is not None:
        ctx.out.mkdir(parents=True, exist_ok=True)
        (ctx.out / "tuned.json").write_text(json.dumps({"tuned": table, "choice": choice},
                                                       indent=1) + "\n")
    ctx.log(f"tuned: {choice}")
    return dict(tuned=table, tuned_choice=choice)
