"""The race: every kernel of the ladder against cuDNN and cuBLAS, checked then timed.

``python -m convlab bench [layers...] --out DIR`` runs this on the current GPU:

- the conv ladder on each layer (every kernel checked against a float64 reference, then
  timed beside cuDNN fp32 / tf32 / fp16 and im2col + cuBLAS in the same run), printed as
  a table with time, TFLOP/s, % of cuDNN fp32 and % of the roofline;
- the GEMM ladder at 4096^3 against cuBLAS SGEMM (TF32 off);
- a batch-size sweep (32 / 64 / 128) of the best kernels against cuDNN;

and writes ``ladder.json`` plus pictures: ``ladder.png`` (% of cuDNN), ``roofline.png``,
``gemm_ladder.png`` and ``batch_sweep.png``. Under the simulator it cannot time and
shows the stored H200 results instead (`print_results`).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
from collections import Counter
from pathlib import Path

import numpy as np

from . import baselines, bench, problems
from .runtime import cuda, is_simulator


def ladder_impls(problem, kernels: dict | None = None, libraries: bool = True) -> list:
    """Impls for every course kernel (ladder order) plus the library baselines."""
    from . import baselines
    from .kernels import CONV_LADDER

    impls = [bench.launcher_impl(name, fn, problem)
             for name, fn in (kernels or CONV_LADDER).items()]
    if kernels is None:
        impls += [bench.launcher_impl(name, fn, problem, kind="beside")
                  for name, fn in beside_kernels(tf32=True).items()]
    if libraries and baselines.torch_available():
        impls += [baselines.cudnn_conv_impl(problem, "fp32"),
                  baselines.cudnn_conv_impl(problem, "tf32"),
                  baselines.cudnn_conv_impl(problem, "fp16")]
    if libraries and baselines.cupy_available():
        impls.append(baselines.cublas_im2col_impl(problem))
    return impls


VERSIONED = ("numpy", "numba", "numba-cuda", "cupy-cuda12x", "cupy-cuda13x", "torch", "scipy",
             "pillow")


def environment() -> dict:
    """Device, compute capability, versions and date for a results file (the simulator
    says so: its "device" has no name)."""
    import importlib.metadata as md

    from .runtime import is_simulator

    versions = {}
    for dist in VERSIONED:
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    env = dict(date=_dt.date.today().isoformat(), python=platform.python_version(),
               versions=versions)
    if is_simulator():
        return dict(device="simulator", compute_capability="sim", **env)
    dev = cuda().get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
    return dict(device=name, compute_capability=".".join(map(str, dev.compute_capability)),
                **env)


def library_facts(prob) -> dict:
    """What cuDNN ran on this layer (its kernels and algorithm) and the time of cuBLAS on
    the same GEMM shape (N*P*Q x C*R*S times C*R*S x K), fp32 with TF32 off."""
    from . import baselines, check

    out = {}
    try:
        rng = np.random.default_rng(0)
        x, w = check.random_array(prob.x_shape, rng), check.random_array(prob.w_shape, rng)
        out["cudnn_fp32"] = baselines.cudnn_algorithm(baselines.cudnn_conv_impl(prob, "fp32"),
                                                      x, w)
        g = baselines.same_shape_gemm_impl(prob)
        state = g.prepare(x, w)
        t = bench.time_gpu_queued(g.run, state, repeat=15)
        out["same_gemm"] = dict(name=g.name, ms=t.median_ms, tflops=t.tflops(prob.flops))
    except Exception as e:  # noqa: BLE001  (no PyTorch: the ladder still stands)
        out["library_facts_error"] = f"{type(e).__name__}: {e}"
    return out


def add_peak_columns(lad: dict, ceilings: dict) -> None:
    """Per row: % of the measured fp32 peak and % of cuBLAS on the same GEMM shape."""
    peak = ceilings.get("fma_tflops")
    gemm_ms = (lad.get("same_gemm") or {}).get("ms")
    for r in lad["rows"]:
        r["pct_peak"] = 100 * r["tflops"] / peak if peak else None
        r["pct_same_gemm"] = 100 * gemm_ms / r["ms"] if gemm_ms and r.get("ms") else None


def run_ladder(layers=problems.RESNET, out_dir=None, repeat: int = 15, kernels=None,
               gemm: bool = True, batches=(32, 64, 128), sweep_kernels=None, clock=None,
               gemm_kernels=None, gemm_n: int | None = None) -> dict:
    """Check and time the ladder on each named layer, the GEMM ladder and the batch sweep;
    print the tables; optionally save JSON + pictures in out_dir.

    Rows that could not be timed come back in each ladder's "not_timed" (name, stage,
    error). clock: where the times come from (`convlab.measure.GpuClock` by default;
    `FakeClock` for a dry run under the simulator).
    """
    result = environment()
    result["ceilings"] = clock.ceilings() if clock is not None else bench.measure_ceilings()
    print(f"{result['device']}: copy {result['ceilings']['copy_gbps']:.0f} GB/s, fp32 FMA "
          f"{result['ceilings']['fma_tflops']:.1f} TFLOP/s")
    ladders = []
    for name in layers:
        prob = problems.conv_layer(name)
        lad = bench.bench_conv(ladder_impls(prob, kernels), prob, baseline="cuDNN fp32",
                               repeat=repeat, precision={"cuDNN tf32": "tf32",
                                                         "cuDNN fp16": "fp16",
                                                         "triton tf32": "tf32"},
                               verbose=False, clock=clock)
        d = lad.to_dict()
        if clock is None:
            d.update(library_facts(prob))
        add_peak_columns(d, result["ceilings"])
        ladders.append(d)
    result["ladders"] = ladders
    add_roofline_pct(result)
    if gemm:
        result["gemm_ladder"] = run_gemm_ladder(gemm_n, gemm_kernels, repeat=max(5, repeat // 2),
                                                clock=clock)
    if batches:
        result["batch_sweep"] = run_batch_sweep(layers, batches, sweep_kernels, clock=clock)
    print_results(result)
    if out_dir:
        save_results(result, out_dir)
    return result


def save_results(result: dict, out_dir) -> list:
    """ladder.json and the pictures of a run; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ladder.json").write_text(json.dumps(result, indent=1))
    paths = [out / "ladder.json"]
    for fn, name in ((plot_ladder, "ladder.png"), (plot_roofline, "roofline.png"),
                     (plot_gemm_ladder, "gemm_ladder.png"),
                     (plot_batch_sweep, "batch_sweep.png")):
        try:
            fig = fn(result, out / name)
        except KeyError:  # a part that was not run
            continue
        if fig is not None:
            import matplotlib.pyplot as plt

            plt.close(fig)
            paths.append(out / name)
    print("wrote " + ", ".join(str(p) for p in paths))
    return paths


# ----------------------------------------------------------------------------------------
# % of the roofline, the tables


def roofline_bound(flops: int, nbytes: int, ceilings: dict) -> float:
    """TFLOP/s the roofline allows at this arithmetic intensity (compulsory traffic)."""
    return min(ceilings["fma_tflops"], flops / nbytes * ceilings["copy_gbps"] / 1e3)


def add_roofline_pct(result: dict) -> None:
    """Every row of every ladder gets pct_roofline: its TFLOP/s over the roofline bound.

    The bound uses this run's measured ceilings; where a library beat the measured FMA
    ceiling (the ceiling kernel is simple), the best fp32 rate of the run is used.
    """
    ce = dict(result["ceilings"])
    fp32 = [r["tflops"] for lad in result["ladders"] for r in lad["rows"]
            if r["name"] not in ("cuDNN tf32", "cuDNN fp16")]
    ce["fma_tflops"] = max([ce["fma_tflops"]] + fp32)
    result["roofline_fp32_tflops"] = ce["fma_tflops"]
    for lad in result["ladders"]:
        bound = roofline_bound(lad["flops"], lad["bytes"], ce)
        lad["roofline_tflops"] = bound
        for r in lad["rows"]:
            r["pct_roofline"] = 100 * r["tflops"] / bound


def summary(result: dict) -> dict:
    """The headline numbers of a run: % of cuDNN fp32 of the two fastest conv families on
    every layer (with geometric mean and minimum), and the best Numba GEMM's % of cuBLAS."""
    out = {}
    for fam in ("implicit_gemm_tuned", "implicit_gemm_cuda", "triton"):
        pct = [r["pct_of_baseline"] for lad in result.get("ladders", []) for r in lad["rows"]
               if r["name"] == fam and r.get("pct_of_baseline")]
        if pct and len(pct) == len(result["ladders"]):
            out[fam] = dict(pct_cudnn=pct, geomean=math.prod(pct) ** (1 / len(pct)),
                            min=min(pct))
    rows = [r for r in result.get("gemm_ladder", {}).get("rows", []) if r["name"] != "cuBLAS"]
    best = max(rows, key=lambda r: r["tflops"], default=None)
    if best is not None:
        out["gemm_best_numba"] = dict(name=best["name"], pct_cublas=best.get("pct_cublas"),
                                      tflops=best["tflops"])
    return out


def ladder_table(lad: dict) -> str:
    """One layer: version, ms (GPU time), call ms (per call of a Python loop; '-' in runs
    stored before it was measured), TFLOP/s, % of cuDNN fp32, % of roofline, rel error."""
    head = f"{lad['problem']}  ({lad['flops'] / 1e9:.2f} GFLOP)"
    lines = [head, f"{'version':<26}{'ms':>9}{'call ms':>9}{'TFLOP/s':>9}{'% cuDNN':>9}"
                   f"{'% roof':>8}{'rel err':>9}"]
    for r in lad["rows"]:
        pct = r.get("pct_of_baseline")
        roof = r.get("pct_roofline")
        call = r.get("call_ms")
        lines.append(f"{r['name']:<26}{r['ms']:9.4f}"
                     f"{(f'{call:9.4f}') if call is not None else '        -'}"
                     f"{r['tflops']:9.2f}"
                     f"{(f'{pct:8.1f}%') if pct is not None else '        -'}"
                     f"{(f'{roof:7.1f}%') if roof is not None else '       -'}"
                     f"{r['max_rel_err']:9.1e}")
    return "\n".join(lines)


def print_results(result: dict) -> None:
    """All tables of a run (fresh or stored)."""
    for lad in result.get("ladders", []):
        print(ladder_table(lad))
        for d in lad.get("not_timed", []):
            line = d if isinstance(d, str) else f"{d['name']}: not timed ({d['stage']}): " \
                                                f"{d['error']}"
            print("  " + line[:160])
        print()
    g = result.get("gemm_ladder")
    if g:
        print(f"GEMM {g['n']}^3 fp32 ({2 * g['n'] ** 3 / 1e9:.0f} GFLOP)")
        print(f"{'version':<26}{'ms':>9}{'TFLOP/s':>9}{'% cuBLAS':>10}{'rel err':>9}")
        for r in g["rows"]:
            pct = f"{r['pct_cublas']:9.1f}%" if r.get("pct_cublas") is not None else "        -"
            print(f"{r['name']:<26}{r['ms']:9.3f}{r['tflops']:9.2f}{pct}"
                  f"{r['max_rel_err']:9.1e}")
        for name, err in g.get("errors", {}).items():
            print(f"{name:<26} NOT TIMED: {err[:70]}")
        print()
    sw = result.get("batch_sweep")
    if sw:
        print("batch sweep: ms (% of cuDNN fp32)")
        names = list(dict.fromkeys(k for row in sw["rows"] for k in row["ms"]))
        print(f"{'layer':<14}{'batch':>6}" + "".join(f"{n:>24}" for n in names))
        for row in sw["rows"]:
            cells = ""
            for n in names:
                ms, pct = row["ms"].get(n), row["pct_cudnn"].get(n)
                if ms is None:
                    cells += f"{'-':>24}"
                else:
                    cells += f"{ms:14.4f} ({pct:5.1f}%)" if pct is not None else f"{ms:24.4f}"
            print(f"{row['layer']:<14}{row['batch']:>6}{cells}")
        print()


# ----------------------------------------------------------------------------------------
# The GEMM ladder and the batch sweep


def run_gemm_ladder(n: int | None = None, kernels: dict | None = None, repeat: int = 8,
                    seed: int = 0, clock=None) -> dict:
    """Every GEMM of the ladder on n x n x n (4096 on a GPU) against cuBLAS, checked first.

    A kernel that fails its check (or raises) is not timed: its reason is in "errors".
    """
    timer = clock.time_gpu if clock is not None else bench.time_gpu_queued
    import numpy as np

    from . import baselines, check
    from .kernels import GEMM_LADDER

    n = n or problems.gemm_size()
    c = cuda()
    rng = np.random.default_rng(seed)
    a, b = check.random_array((n, n), rng), check.random_array((n, n), rng)
    expected, absref = _gemm_reference(a, b)
    ad, bd = c.to_device(a), c.to_device(b)
    rows, errors = [], {}
    flops = 2 * n**3
    impls = dict(kernels or GEMM_LADDER)
    for name, fn in impls.items():
        try:
            out = c.to_device(check.poisoned((n, n)))
            fn(ad, bd, out)
            c.synchronize()
            comp = check.compare(out.copy_to_host(), expected, absref, n)
            if not comp.ok:
                raise check.CheckError(comp.summary())
            t = timer(fn, ad, bd, out, repeat=repeat, warmup=1)
            rows.append(dict(name=name, ms=t.median_ms, spread=t.spread,
                             tflops=t.tflops(flops), max_rel_err=comp.max_rel))
        except Exception as e:  # noqa: BLE001  (one broken version must not stop the ladder)
            errors[name] = f"{type(e).__name__}: {e}"[:400]
    if baselines.cupy_available():
        import cupy as cp

        ac, bc = cp.asarray(a), cp.asarray(b)
        cc = cp.empty_like(ac)
        cp.matmul(ac, bc, out=cc)
        comp = check.compare(cp.asnumpy(cc), expected, absref, n)
        t = timer(lambda: cp.matmul(ac, bc, out=cc), repeat=repeat)
        rows.append(dict(name="cuBLAS", ms=t.median_ms, spread=t.spread, tflops=t.tflops(flops),
                         max_rel_err=comp.max_rel))
    base = next((r for r in rows if r["name"] == "cuBLAS"), None)
    for r in rows:
        r["pct_cublas"] = 100 * base["ms"] / r["ms"] if base else None
    return dict(n=n, rows=rows, errors=errors)


def _gemm_reference(a, b):
    """A @ B and |A| @ |B| in float64 (on the GPU through CuPy when it can)."""
    import numpy as np

    from . import baselines

    if baselines.cupy_available():
        import cupy as cp

        a64, b64 = cp.asarray(a, dtype=cp.float64), cp.asarray(b, dtype=cp.float64)
        return cp.asnumpy(a64 @ b64), cp.asnumpy(cp.abs(a64) @ cp.abs(b64))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return a64 @ b64, np.abs(a64) @ np.abs(b64)


def beside_kernels(tf32: bool = False) -> dict:
    """Kernels raced beside the ladder but not rungs of it: Triton at fp32 (and at tf32,
    checked at TF32's tolerance), where it runs; Winograd F(2x2, 3x3) and F(4x4, 3x3) where
    CuPy runs (the course's batched GEMM, and F(4x4) with cuBLAS's for comparison; F(2x2)
    also fused into one kernel),
    im2col + the course's batched GEMM, the one-launch GEMM for small convs (pure Numba
    on a GPU, CUDA C where CuPy runs), and
    `conv2d_cuda`, which picks one of them by a rule."""
    from functools import partial

    from .kernels import triton01_implicit_gemm as tri

    out = {}
    if not is_simulator():  # the one-launch GEMM for small convs in pure Numba
        from .kernels import conv10_flat_igemm

        out["flat_igemm"] = conv10_flat_igemm.conv2d_flat_igemm
    if baselines.cupy_available():
        from .kernels import winograd01_cuda as wino

        out["winograd_f2_cuda"] = wino.conv2d_winograd_f2_cuda
        out["winograd_f4_cuda"] = wino.conv2d_winograd_f4_cuda
        out["winograd_f4_cublas"] = wino.conv2d_winograd_f4_cublas
        from .kernels import winograd02_fused_cuda

        out["winograd_fused_cuda"] = winograd02_fused_cuda.conv2d_winograd_fused_cuda
        from .kernels import im2col01_cuda

        out["im2col_cuda"] = im2col01_cuda.conv2d_im2col_cuda
        out["im2col_fused_cuda"] = im2col01_cuda.conv2d_im2col_fused_cuda
        from .kernels import conv_cuda, flat_igemm_cuda

        out["flat_igemm_cuda"] = flat_igemm_cuda.conv2d_flat_igemm_cuda
        out["conv2d_cuda"] = conv_cuda.conv2d_cuda  # the entry point: its rule's pick
    if not tri.available():
        return out
    out["triton"] = tri.conv2d_triton
    if tf32:
        out["triton tf32"] = partial(tri.conv2d_triton, precision="tf32")
    return out


def sweep_kernels() -> dict:
    """The kernels of the batch sweep: the plain implicit GEMM (the baseline of source 001's
    claim), the best pure-Numba conv, the CUDA C one and Triton's."""
    from .kernels import CONV_LADDER

    names = ("implicit_gemm", "implicit_gemm_tuned", "implicit_gemm_cuda")
    return {**{n: CONV_LADDER[n] for n in names if n in CONV_LADDER}, **beside_kernels()}


def run_batch_sweep(layers=problems.RESNET, batches=(32, 64, 128), kernels=None,
                    repeat: int = 10, seed: int = 1, clock=None,
                    budget_s: float | None = None, progress: bool = False,
                    on_row=None) -> dict:
    """Time `kernels` and cuDNN fp32 on each layer (a name or a `ConvProblem`) at each batch
    size, every output checked against float64 first (on the GPU where CuPy is there).
    budget_s: stop starting new rows after that many seconds (the first always runs; the
    rows not run are listed in "skipped"), and run batch by batch, so the first batch size
    is complete first. Each row keeps the seconds it took, per kernel and for its setup, and
    each checked kernel's largest error as a fraction of conv(|x|, |w|) (`max_rel_error`).
    on_row(partial sweep) runs after every row (a checkpoint for runs that may be cut off)."""
    import time

    timer = clock.time_gpu if clock is not None else bench.time_gpu_queued
    import numpy as np

    from . import baselines, check

    kernels = kernels or sweep_kernels()
    c = cuda()
    rows, skipped = [], []
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    gpu_check = baselines.torch_available() and baselines.cupy_available()
    if gpu_check:   # outputs checked where they are: 10^8 elements per layer at batch 128
        import cupy
    layers = [problems.conv_layer(n) if isinstance(n, str) else n for n in layers]
    todo = ([(lay, nb) for nb in batches for lay in layers] if budget_s else
            [(lay, nb) for lay in layers for nb in batches])
    for i, (layer, nb) in enumerate(todo):
        if i and budget_s and time.perf_counter() - t0 > budget_s:
            skipped = [f"{lay.name} batch {b}" for lay, b in todo[i:]]
            break
        if progress:
            print(f"[{i + 1}/{len(todo)}] {layer.name} batch {nb}", flush=True)
        t_row = time.perf_counter()
        prob = layer.with_batch(nb)
        x = check.random_array(prob.x_shape, rng)
        w = check.random_array(prob.w_shape, rng)
        expected, absref = _conv_reference(x, w, prob.kwargs, on_gpu=gpu_check)
        row = dict(layer=layer.name, batch=nb, ms={}, pct_cudnn={}, errors={},
                   seconds={}, max_rel_error={})
        impls = dict(kernels)
        timings = {}
        if baselines.torch_available():
            impl = baselines.cudnn_conv_impl(prob, "fp32")
            st = impl.prepare(x, w)
            impl.run(st)
            timings["cuDNN fp32"] = timer(impl.run, st, repeat=repeat).median_ms
            if clock is None:  # which algorithm cuDNN picked at this batch
                try:
                    row["cudnn_algorithm"] = baselines.cudnn_algorithm(impl, x, w)["algorithm"]
                except Exception as e:  # noqa: BLE001  (the profiler is optional)
                    row["cudnn_algorithm"] = f"unknown ({type(e).__name__})"
        xd, wd = c.to_device(x), c.to_device(w)
        row["seconds"]["inputs, reference, cuDNN"] = time.perf_counter() - t_row
        for kname, fn in impls.items():
            t_k = time.perf_counter()
            try:
                out = c.to_device(check.poisoned(prob.out_shape))
                fn(xd, wd, out, **prob.kwargs)
                c.synchronize()
                comp = check.compare(cupy.asarray(out) if gpu_check else out.copy_to_host(),
                                     expected, absref, prob.C * prob.R * prob.S)
                if not comp.ok:
                    raise check.CheckError(comp.summary())
                row["max_rel_error"][kname] = float(comp.max_rel)
                timings[kname] = timer(fn, xd, wd, out, repeat=repeat,
                                       **prob.kwargs).median_ms
            except Exception as e:  # noqa: BLE001
                row["errors"][kname] = f"{type(e).__name__}: {e}"[:300]
            row["seconds"][kname] = time.perf_counter() - t_k   # first call: + compile
        base = timings.get("cuDNN fp32")
        for k, ms in timings.items():
            row["ms"][k] = ms
            row["pct_cudnn"][k] = 100 * base / ms if base else None
        rows.append(row)
        if on_row is not None:
            on_row(dict(batches=list(batches), rows=rows, skipped=[]))
    return dict(batches=list(batches), rows=rows, skipped=skipped)


def sweep_summary(sweep: dict, numba=("implicit_gemm", "implicit_gemm_tuned", "flat_igemm")
                  ) -> dict:
    """Per batch and kind of layer (stem, 3x3, 1x1): the best course kernel's (not Triton,
    not a row whose name ends in "_cublas") and the best pure-Numba kernel's % of cuDNN
    fp32, as minimum and geometric mean over the layers."""
    groups: dict = {}
    for row in sweep["rows"]:
        kind = row["layer"].split()[0] if row["layer"][:3] in ("3x3", "1x1") else "stem"
        pct = {k: v for k, v in row["pct_cudnn"].items() if k != "cuDNN fp32" and v}
        best = max((v for k, v in pct.items() if k != "triton" and not k.endswith("_cublas")),
                   default=None)  # Triton's and the cuBLAS-inside rows are not the course's
        best_numba = max((v for k, v in pct.items() if k in numba), default=None)
        for key in (f"batch {row['batch']} {kind}", f"batch {row['batch']} all"):
            g = groups.setdefault(key, dict(best=[], best_numba=[], triton=[]))
            for name, v in (("best", best), ("best_numba", best_numba),
                            ("triton", pct.get("triton"))):
                if v is not None:
                    g[name].append(v)
    out = {}
    for key, g in groups.items():
        out[key] = {name: dict(min=min(v), geomean=math.prod(v) ** (1 / len(v)), n=len(v))
                    for name, v in g.items() if v}
    return out


def sweep_summary_table(summary: dict) -> str:
    """`sweep_summary` as a table: % of cuDNN fp32, minimum / geometric mean."""
    lines = [f"{'layers':<18}{'best course':>22}{'best Numba':>22}{'Triton':>22}",
             f"{'':<18}" + f"{'min / geomean (n)':>22}" * 3]
    for key, g in summary.items():
        cells = "".join(f"{g[n]['min']:10.1f} /{g[n]['geomean']:6.1f} ({g[n]['n']:2d})"
                        if n in g else f"{'-':>22}" for n in ("best", "best_numba", "triton"))
        lines.append(f"{key:<18}{cells}")
    return "\n".join(lines)


def run_resnet50(batches=(32, 1, 128), out_dir=None, kernels=None, repeat: int = 10,
                 budget_s: float | None = None, clock=None, layers=problems.RESNET50) -> dict:
    """`run_batch_sweep` over every distinct conv of ResNet-50 (`problems.RESNET50`, or the
    `layers` given), with `sweep_summary`; saved as resnet50.json in out_dir (and, row by
    row while it runs, as resnet50.partial.json)."""
    result = environment()
    out = Path(out_dir) if out_dir else None

    def checkpoint(partial):   # the rows so far, should the run be cut off
        out.mkdir(parents=True, exist_ok=True)
        (out / "resnet50.partial.json").write_text(json.dumps({**result, "resnet50": partial}))

    sweep = run_batch_sweep(layers, batches, kernels, repeat=repeat, clock=clock,
                            budget_s=budget_s, progress=True,
                            on_row=checkpoint if out else None)
    sweep["summary"] = sweep_summary(sweep)
    result["resnet50"] = sweep
    print_results({"batch_sweep": sweep})
    print(sweep_summary_table(sweep["summary"]))
    spent, worst = Counter(), {}
    for row in sweep["rows"]:
        spent.update(row["seconds"])
        for k, v in row["max_rel_error"].items():
            if v > worst.get(k, (-1.0,))[0]:
                worst[k] = (v, f"{row['layer']} batch {row['batch']}")
    print("seconds spent: " + ", ".join(f"{k} {v:.0f}" for k, v in spent.items()))
    if worst:
        print("largest error / conv(|x|,|w|): " + ", ".join(
            f"{k} {v:.1e} ({where})" for k, (v, where) in worst.items()))
    for s in sweep["skipped"]:
        print(f"not run (time budget): {s}")
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "resnet50.json").write_text(json.dumps(result, indent=1))
        (out / "resnet50.partial.json").unlink(missing_ok=True)
        for b in sweep["batches"]:
            if any(r["batch"] == b for r in sweep["rows"]):   # a budget may leave none
                plot_layer_sweep(sweep, b, f"{result['device']}: ResNet-50 layers, batch {b}",
                                 out / f"resnet50_batch{b}.png")
    return result


def _conv_reference(x, w, kw, on_gpu: bool = False):
    """conv(x, w) and conv(|x|, |w|) in float64: PyTorch on the GPU when it can; on_gpu:
    left there as CuPy arrays, for `check.compare` on the GPU."""
    import numpy as np

    from . import baselines
    from . import reference as ref

    if baselines.torch_available():
        import torch

        F = torch.nn.functional
        xt, wt = torch.from_numpy(x).cuda().double(), torch.from_numpy(w).cuda().double()
        y, ya = F.conv2d(xt, wt, **kw), F.conv2d(xt.abs(), wt.abs(), **kw)
        if on_gpu:
            import cupy

            return cupy.asarray(y), cupy.asarray(ya)
        return y.cpu().numpy(), ya.cpu().numpy()
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    return ref.conv2d_im2col(x64, w64, **kw), ref.conv2d_im2col(np.abs(x64), np.abs(w64), **kw)


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
    """fp32 versions of every layer on the roofline: colour = version, marker = layer.

    The compute roof is the run's fp32 ceiling (the measured FMA rate, or the best fp32
    rate of the run where a library beat it); tf32 / fp16 rows are left out (other roofs).
    """
    import matplotlib

    matplotlib.use("Agg") if path else None
    import matplotlib.pyplot as plt

    ce = result["ceilings"]
    peak = result.get("roofline_fp32_tflops", ce["fma_tflops"])
    ax = bench.roofline([], ce["copy_gbps"], peak, title=f"{result['device']}: roofline (fp32)")
    fig = ax.figure
    fig.set_size_inches(8, 4.6)
    names = []
    for lad in result["ladders"]:
        for r in lad["rows"]:
            if r["name"] not in names and r["name"] not in ("cuDNN tf32", "cuDNN fp16"):
                names.append(r["name"])
    colors = {n: plt.cm.tab20(i % 20) for i, n in enumerate(names)}
    markers = "osD^v"
    ais = [lad["flops"] / lad["bytes"] for lad in result["ladders"]]
    ridge = peak * 1e12 / (ce["copy_gbps"] * 1e9)
    ax.plot([ridge, max(ais + [ridge]) * 3], [peak, peak], "k-", lw=2)  # the roof, extended
    if peak > ce["fma_tflops"]:
        ax.set_title(f"{result['device']}: roofline (fp32)\ncompute roof = the best fp32 rate of "
                     f"this run (the FMA test kernel reached {ce['fma_tflops']:.1f} TFLOP/s)",
                     fontsize=9)
    ax.set_ylim(top=peak * 2.5)
    for i, lad in enumerate(result["ladders"]):
        ai = lad["flops"] / lad["bytes"]
        for r in lad["rows"]:
            if r["name"] in colors:
                ax.plot(ai * (1 + 0.03 * (names.index(r["name"]) - len(names) / 2)), r["tflops"],
                        markers[i % len(markers)], color=colors[r["name"]], ms=6)
    handles = [plt.Line2D([], [], color=colors[n], marker="o", ls="", label=n) for n in names]
    handles += [plt.Line2D([], [], color="k", marker=markers[i % len(markers)], ls="",
                           label=lad["problem"].split(":")[0])
                for i, lad in enumerate(result["ladders"])]
    ax.legend(handles=handles, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    return fig


def plot_gemm_ladder(result: dict, path=None):
    """Bars: TFLOP/s of every GEMM version at 4096^3, cuBLAS last."""
    import matplotlib

    matplotlib.use("Agg") if path else None
    import matplotlib.pyplot as plt

    g = result["gemm_ladder"]
    rows = g["rows"]
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    names = [r["name"] for r in rows]
    bars = ax.bar(names, [r["tflops"] for r in rows],
                  color=["tab:gray" if n == "cuBLAS" else "tab:blue" for n in names])
    for b, r in zip(bars, rows, strict=True):
        if r.get("pct_cublas") is not None:
            ax.annotate(f"{r['pct_cublas']:.0f}%", (b.get_x() + b.get_width() / 2,
                                                    b.get_height()),
                        ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("TFLOP/s (fp32)")
    ax.set_title(f"{result['device']}: SGEMM {g['n']}^3, % of cuBLAS on the bars")
    ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    return fig


def plot_batch_sweep(result: dict, path=None):
    """% of cuDNN fp32 against batch size, one panel per layer."""
    import matplotlib

    matplotlib.use("Agg") if path else None
    import matplotlib.pyplot as plt

    sw = result["batch_sweep"]
    layers = list(dict.fromkeys(r["layer"] for r in sw["rows"]))
    fig, axes = plt.subplots(1, len(layers), figsize=(3.6 * len(layers), 3.3), sharey=True,
                             squeeze=False)
    have_base = any(v is not None for r in sw["rows"] for v in r["pct_cudnn"].values())
    key = "pct_cudnn" if have_base else "ms"  # without cuDNN: plain times
    for ax, layer in zip(axes[0], layers, strict=True):
        rows = [r for r in sw["rows"] if r["layer"] == layer]
        names = [n for n in dict.fromkeys(k for r in rows for k in r["ms"])
                 if n != "cuDNN fp32" or not have_base]
        for n in names:
            pts = [(r["batch"], r[key].get(n)) for r in rows if r[key].get(n) is not None]
            ax.plot([b for b, _ in pts], [v for _, v in pts], "o-", label=n)
        if have_base:
            ax.axhline(100, color="k", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sw["batches"], [str(b) for b in sw["batches"]])
        ax.set_title(layer, fontsize=9)
        ax.set_xlabel("batch")
    axes[0][0].set_ylabel("% of cuDNN fp32 speed" if have_base else "ms")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(f"{result['device']}: batch-size sweep", fontsize=10)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    return fig


def plot_layer_sweep(sweep: dict, batch: int = 32, title: str = "", path=None):
    """% of cuDNN fp32 of each kernel on every layer of a `run_batch_sweep` at one batch
    size: one group of bars per layer, the 100% line dashed; cuDNN's algorithm under it."""
    import matplotlib

    matplotlib.use("Agg") if path else None
    import matplotlib.pyplot as plt

    rows = [r for r in sweep["rows"] if r["batch"] == batch]
    if not rows:
        raise ValueError(f"the sweep has no rows at batch {batch} (batches with rows: "
                         f"{sorted({r['batch'] for r in sweep['rows']})})")
    names = [n for n in dict.fromkeys(k for r in rows for k in r["pct_cudnn"]) if n != "cuDNN fp32"]
    fig, ax = plt.subplots(figsize=(max(8.0, 0.55 * len(rows) + 2), 3.8))
    width = 0.8 / max(1, len(names))
    for j, n in enumerate(names):
        xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(rows))]
        ax.bar(xs, [r["pct_cudnn"].get(n) or 0 for r in rows], width, label=n)
    ax.axhline(100, color="k", lw=0.8, ls="--")
    labels = [f"{r['layer']}\n{(r.get('cudnn_algorithm') or '')[:13]}" for r in rows]
    ax.set_xticks(range(len(rows)), labels, rotation=90, fontsize=7)
    ax.set_ylabel("% of cuDNN fp32 speed")
    ax.set_title(title or f"every layer at batch {batch}", fontsize=10)
    ax.legend(fontsize=7, ncol=len(names))
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    return fig


# The one idea each conv rung adds to the rung before it.
RUNG_IDEAS = {
    "naive": "one thread per output, 32-bit flat indices, compile-time R x S",
    "coalesced": "neighbouring threads on neighbouring output columns",
    "tiled": "input tile + halo and filter taps staged in shared memory",
    "register_blocked": "4 rows x 16 filters of outputs per thread (outer products)",
    "implicit_gemm": "the conv as a GEMM: im2col slabs built on the fly, 8x8 per thread",
    "implicit_gemm_double_buffered": "next slab's loads in flight while this one multiplies",
    "implicit_gemm_warp_tiled": "a warp is an 8 x 4 patch of threads",
    "implicit_gemm_tuned": "tile shape measured per layer (autotuner)",
    "implicit_gemm_cuda": "CUDA C: float4 global loads, cp.async pipeline",
}


def climb(result: dict, tolerance: float = 0.03) -> dict:
    """Does the ladder climb? Per layer, the rungs slower than the rung before by more than
    `tolerance` (a fraction) and the register-blocking rung's gain over tiling; for the
    GEMM ladder, the rungs not faster than the one before. Keys: 'layers' (per layer:
    slower [(rung, ratio)], register_gain), 'gemm_not_faster' [(name, ratio)], 'ok'."""
    out, ok = {"layers": {}}, True
    for lad in result["ladders"]:
        rows = [r for r in lad["rows"] if r["name"] in RUNG_IDEAS]
        slower = [(b["name"], b["ms"] / a["ms"]) for a, b in zip(rows, rows[1:], strict=False)
                  if b["ms"] > a["ms"] * (1 + tolerance)]
        ms = {r["name"]: r["ms"] for r in rows}
        gain = ms["tiled"] / ms["register_blocked"] if {"tiled", "register_blocked"} <= set(ms) \
            else None
        out["layers"][lad["problem"].split(":")[0]] = dict(slower=slower, register_gain=gain)
        ok &= not slower and (gain is None or gain >= 1.3)
    g = [r for r in result.get("gemm_ladder", {}).get("rows", []) if r["name"] != "cuBLAS"]
    out["gemm_not_faster"] = [(b["name"], b["ms"] / a["ms"])
                              for a, b in zip(g, g[1:], strict=False) if b["ms"] >= a["ms"]]
    out["ok"] = bool(ok and not out["gemm_not_faster"])
    return out


def climb_report(result: dict, tolerance: float = 0.03) -> str:
    """`climb` as sentences."""
    c = climb(result, tolerance)
    lines = []
    for layer, d in c["layers"].items():
        slow = ", ".join(f"{n} {100 * (r - 1):.1f}% slower" for n, r in d["slower"])
        gain = f"register blocking {d['register_gain']:.2f}x over tiling" \
            if d["register_gain"] else "no register-blocking rung"
        lines.append(f"{layer}: " + (f"{slow} than the rung before" if slow else
                                     f"no rung more than {100 * tolerance:.0f}% slower than "
                                     "the one before") + f"; {gain}")
    lines.append("GEMM ladder: " + ("every rung faster than the one before"
                                    if not c["gemm_not_faster"] else "not faster: " + ", ".join(
                                        f"{n} ({r:.2f}x the time)" for n, r in
                                        c["gemm_not_faster"])))
    lines.append("the ladder climbs" if c["ok"] else "the ladder does not climb everywhere")
    return "\n".join(lines)


def rung_table(result: dict) -> str:
    """The conv ladder of a stored or fresh run, one table per layer: rung, the idea it
    adds, ms, % of the measured fp32 peak, gain over the rung before."""
    peak = result["ceilings"]["fma_tflops"]
    lines = []
    for lad in result["ladders"]:
        algo = (lad.get("cudnn_fp32") or {}).get("algorithm", "?")
        lines.append(f"{lad['problem']}  (cuDNN fp32 ran {algo}; fp32 peak {peak:.1f} TFLOP/s)")
        lines.append(f"{'rung':<30}{'ms':>8}{'% peak':>8}{'gain':>7}  idea")
        prev = None
        for r in lad["rows"]:
            if r["name"] not in RUNG_IDEAS:
                continue
            gain = f"{prev / r['ms']:6.2f}x" if prev else "      -"
            lines.append(f"{r['name']:<30}{r['ms']:8.3f}{100 * r['tflops'] / peak:7.1f}%{gain}"
                         f"  {RUNG_IDEAS[r['name']]}")
            prev = r["ms"]
        lines.append("")
    return "\n".join(lines)
