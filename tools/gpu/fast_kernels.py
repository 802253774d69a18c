# ruff: noqa: E402
"""Issue 7 on the GPU: check then time every fast kernel variant against cuDNN / cuBLAS.

    . tools/device_env.sh; python3 tools/gpu/fast_kernels.py          # on the GPU machine

One run: the libraries first (cuDNN fp32 with TF32 off on the three ResNet layers at
batch 32, cuBLAS SGEMM 4096^3), then many Numba and CUDA C variants and tile shapes.
Compilation is spread over worker processes (Numba compiles one kernel at a time per
process); each worker checks its variants against float64 references (computed once by
PyTorch on the GPU, same inputs as the timing) and odd-shaped cases (convlab.check), then
times them while holding a lock, so that only one process uses the GPU while timing.
Then the libraries again (drift). Writes $OUT/fast_kernels.json and the per-layer best
tile shapes as $OUT/tuned.json (the format of convlab.autotune.stored; point
CONVLAB_TUNED at it and `python -m convlab bench` uses them); prints a compact table last.
The batch-size sweep is part of `python -m convlab bench`.

--quick: fewer variants (for a retry in little time).
--dry: here, without a GPU: the simulator, tiny shapes, a fake clock, no CUDA C; finds
mistakes in this script before it spends device time. Its numbers mean nothing.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import json
import math
import multiprocessing as mp
import os
import sys
import time
import traceback

import numpy as np

T0 = time.time()
DEV = "cpu" if "--dry" in sys.argv else "cuda"
OUT = os.environ.get("OUT", "/tmp/fast_kernels_out")
REF = "/tmp/fast_kernels_ref"
LAYERS = ("resnet64", "resnet128", "resnet256")
GEMM_N = 4096
QUICK = "--quick" in sys.argv
DRY = "--dry" in sys.argv
if DRY:
    os.environ["CONVLAB_MODE"] = "sim"
    GEMM_N = 40

# ---- the variants: (group, name, kind, python expression building the launcher) ----
# Run 1 (2026-11-29) timed the whole ladder; run 2 sweeps the tile shapes of the two
# fastest families (conv07 pipelined Numba, conv09 CUDA C) after the launch-overhead fix
# and writes the per-layer choice ($OUT/tuned.json) that `convlab bench` then uses.
G = "from convlab.kernels import "
G4 = "gemm04_double_buffered"
VARIANTS = [
    (0, "gemm04 db 128x64x8", "gemm", f"{G4}.make_launcher({G4}.make_kernel(BN=64))"),
    (0, "gemm04 db 128x64x16", "gemm", f"{G4}.make_launcher({G4}.make_kernel(BN=64, BK=16))"),
    (0, "gemm04 db 64x128x8", "gemm", f"{G4}.make_launcher({G4}.make_kernel(BM=64))"),
    (0, "gemm04 db 128x64x8 b3", "gemm",
     f"{G4}.make_launcher({G4}.make_kernel(BN=64, min_blocks=3))"),
]
C7 = "conv07_implicit_gemm_pipelined"
for i, cfg in enumerate(("Config(64, 128, 8)", "Config(64, 128, 16)", "Config(128, 64, 8)",
                         "Config(128, 64, 16)", "Config(64, 64, 8)", "Config(64, 64, 16)",
                         "Config(128, 128, 8)", "Config(128, 128, 16)",
                         "Config(128, 128, 8, min_blocks=2)", "Config(64, 128, 8, min_blocks=3)")):
    VARIANTS.append((1 + i // 2, f"conv07 {cfg[7:-1]}", "conv", f"{C7}.launcher_for({C7}.{cfg})"))
CUDA_GROUP = 9
if QUICK or DRY:
    VARIANTS = [v for v in VARIANTS if v[0] in (0, 1)]


def _setup():
    """GPU (or the simulator with --dry); under --dry the clock is fake."""
    import convlab

    convlab.setup("sim" if DRY else "gpu")
    if DRY:
        from convlab import bench

        def fake(fn, *args, warmup=1, repeat=3, group_ms=2.0, **kw):
            fn(*args, **kw)
            return bench.Timing([1.0, 1.0, 1.0], "dry run (fake)")

        bench.time_gpu = fake
        bench.measure_ceilings = lambda: dict(device="simulator", copy_gbps=1.0, fma_tflops=1.0)


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------------------------------
# References (main process, PyTorch float64 on the GPU)


def make_refs():
    import torch

    from convlab import check, problems

    os.makedirs(REF, exist_ok=True)
    rng = np.random.default_rng(2026)
    meta = {}
    for name in LAYERS:
        prob = problems.conv_layer(name)
        x = check.random_array(prob.x_shape, rng)
        w = check.random_array(prob.w_shape, rng)
        xt, wt = torch.from_numpy(x).to(DEV).double(), torch.from_numpy(w).to(DEV).double()
        y = torch.nn.functional.conv2d(xt, wt, padding=prob.padding).cpu().numpy()
        ya = torch.nn.functional.conv2d(xt.abs(), wt.abs(), padding=prob.padding).cpu().numpy()
        for tag, arr in (("x", x), ("w", w), ("y", y), ("ya", ya)):
            np.save(f"{REF}/{name}_{tag}.npy", arr)
        meta[name] = dict(problem=str(prob), flops=prob.flops, bytes=prob.bytes,
                          reduction=prob.C * prob.R * prob.S)
    a = check.random_array((GEMM_N, GEMM_N), rng)
    b = check.random_array((GEMM_N, GEMM_N), rng)
    at, bt = torch.from_numpy(a).to(DEV).double(), torch.from_numpy(b).to(DEV).double()
    np.save(f"{REF}/gemm_a.npy", a)
    np.save(f"{REF}/gemm_b.npy", b)
    np.save(f"{REF}/gemm_c.npy", (at @ bt).cpu().numpy())
    np.save(f"{REF}/gemm_ca.npy", (at.abs() @ bt.abs()).cpu().numpy())
    del at, bt, xt, wt
    if not DRY:
        torch.cuda.empty_cache()
    return meta


def time_libraries(meta, tag):
    """cuDNN fp32 / tf32 per layer, cuBLAS SGEMM 4096^3 (TF32 off)."""
    import torch

    from convlab import bench

    out = {}
    F = torch.nn.functional
    for name in LAYERS:
        x = torch.from_numpy(np.load(f"{REF}/{name}_x.npy")).to(DEV)
        w = torch.from_numpy(np.load(f"{REF}/{name}_w.npy")).to(DEV)
        for prec in ("fp32", "tf32"):
            torch.backends.cudnn.allow_tf32 = prec == "tf32"
            torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
            torch.backends.cudnn.benchmark = True
            t = bench.time_gpu(functools.partial(F.conv2d, x, w, padding=1), warmup=5, repeat=15)
            out[f"cuDNN {prec} {name}"] = dict(ms=t.median_ms, spread=t.spread,
                                               tflops=t.tflops(meta[name]["flops"]))
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    if DRY:
        import numpy as cp  # noqa: ICN001  (the dry run has no CuPy)
    else:
        import cupy as cp
    a = cp.asarray(np.load(f"{REF}/gemm_a.npy"))
    b = cp.asarray(np.load(f"{REF}/gemm_b.npy"))
    c = cp.empty_like(a)
    t = bench.time_gpu(functools.partial(cp.matmul, a, b, out=c), warmup=3, repeat=15)
    out["cuBLAS sgemm 4096"] = dict(ms=t.median_ms, spread=t.spread,
                                    tflops=t.tflops(2 * GEMM_N**3))
    ref = np.load(f"{REF}/gemm_c.npy")
    out["cuBLAS sgemm 4096"]["rel_l2"] = float(np.linalg.norm((c if DRY else c.get()) - ref) /
                                               np.linalg.norm(ref))
    log(f"libraries ({tag}): " + ", ".join(f"{k} {v['ms']:.4f} ms" for k, v in out.items()))
    return out


# ---------------------------------------------------------------------------------------
# Workers


_LOCK = None


def _init(lock):
    global _LOCK
    _LOCK = lock


def host_us(launcher, args, kw, n=30):
    """Python time per call (no synchronization inside the loop): if it approaches the
    GPU time, back-to-back timing measures the launcher, not the kernel."""
    from numba import cuda

    cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        launcher(*args, **kw)
    dt = time.perf_counter() - t0
    cuda.synchronize()
    return 1e6 * dt / n


def _regs(launcher):
    k = getattr(launcher, "kernel", None)
    try:
        if k is not None:
            return int(max(k.get_regs_per_thread().values()))
    except Exception:  # noqa: BLE001
        pass
    return None


def run_group(items, meta):
    """Compile + check every variant (GPU shared), then time them (GPU exclusive)."""
    _setup()
    from numba import cuda

    from convlab import bench, check
    from convlab import kernels as K  # noqa: N812

    res = {}
    ready = []
    data = {}
    for name in LAYERS:
        data[name] = {t: np.load(f"{REF}/{name}_{t}.npy") for t in ("x", "w", "y", "ya")}
    for grp, vname, kind, expr in items:
        r = res.setdefault(vname, dict(group=grp, kind=kind, expr=expr))
        t0 = time.time()
        try:
            ns = {}
            exec(G + expr.split(".")[0], vars(K), ns)  # noqa: S102
            launcher = eval(expr, {**vars(K), **ns})  # noqa: S307
            if kind == "gemm":
                a = cuda.to_device(np.load(f"{REF}/gemm_a.npy"))
                b = cuda.to_device(np.load(f"{REF}/gemm_b.npy"))
                c = cuda.to_device(check.poisoned((GEMM_N, GEMM_N)))
                launcher(a, b, c)
                cuda.synchronize()
                comp = check.compare(c.copy_to_host(), np.load(f"{REF}/gemm_c.npy"),
                                     np.load(f"{REF}/gemm_ca.npy"), GEMM_N)
                r["gemm4096_ok"], r["gemm4096_max_rel"] = comp.ok, comp.max_rel
                if not comp.ok:
                    raise check.CheckError("4096^3: " + comp.summary())
                r["odd"] = "skipped (dry)" if DRY else check.check_gemm(launcher, quiet=True)
                states = {"gemm4096": (a, b, c)}
            else:
                states = {}
                for name in LAYERS:
                    d = data[name]
                    x, w = cuda.to_device(d["x"]), cuda.to_device(d["w"])
                    y = cuda.to_device(check.poisoned(d["y"].shape))
                    launcher(x, w, y, padding=1)
                    cuda.synchronize()
                    comp = check.compare(y.copy_to_host(), d["y"], d["ya"],
                                         meta[name]["reduction"])
                    r[f"{name}_max_rel"] = comp.max_rel
                    if not comp.ok:
                        raise check.CheckError(f"{name}: " + comp.summary())
                    states[name] = (x, w, y)
                r["odd"] = "skipped (dry)" if DRY else check.check_conv2d(
                    launcher, dilation=True, quiet=True)
            r["compile_check_s"] = time.time() - t0
            r["regs"] = _regs(launcher)
            ready.append((vname, kind, launcher, states))
        except Exception as e:  # noqa: BLE001
            r["error"] = f"{type(e).__name__}: {str(e)[:600]}"
            r["trace"] = traceback.format_exc()[-1500:]
    with _LOCK:
        for vname, kind, launcher, states in ready:
            r = res[vname]
            try:
                for key, st in states.items():
                    if kind == "gemm":
                        t = bench.time_gpu(launcher, *st, warmup=2, repeat=10, group_ms=5)
                        flops = 2 * GEMM_N**3
                    else:
                        t = bench.time_gpu(launcher, *st, padding=1, warmup=2, repeat=10,
                                           group_ms=5)
                        flops = meta[key]["flops"]
                    r[f"{key}_ms"] = t.median_ms
                    r[f"{key}_spread"] = t.spread
                    r[f"{key}_tflops"] = t.tflops(flops)
                    r[f"{key}_host_us"] = host_us(launcher, st, {} if kind == "gemm" else
                                                  {"padding": 1})
            except Exception as e:  # noqa: BLE001
                r["error"] = f"timing: {type(e).__name__}: {str(e)[:600]}"
    return res


def run_cuda_group(meta):
    """The CUDA C kernel (CuPy RawKernel): every candidate tile shape on every layer."""
    _setup()
    from numba import cuda

    from convlab import bench, check
    from convlab.kernels import conv09_implicit_gemm_cuda as cc

    res = {}
    t0 = time.time()
    try:
        cc.prepare(cc.CANDIDATES)
    except Exception as e:  # noqa: BLE001
        return {"cuda compile": dict(error=f"{type(e).__name__}: {str(e)[:3000]}")}
    compile_s = time.time() - t0
    data = {name: {t: np.load(f"{REF}/{name}_{t}.npy") for t in ("x", "w", "y", "ya")}
            for name in LAYERS}
    dev = {name: (cuda.to_device(d["x"]), cuda.to_device(d["w"]),
                  cuda.to_device(check.poisoned(d["y"].shape))) for name, d in data.items()}
    ready = []
    for cfg in cc.CANDIDATES:
        vname = f"conv09 cuda {cfg}"
        r = res.setdefault(vname, dict(group=CUDA_GROUP, kind="conv", config=vars(cfg).copy(),
                                       compile_s=compile_s))
        try:
            launcher = cc.make_launcher(cfg)
            for name in LAYERS:
                x, w, y = dev[name]
                y.copy_to_device(check.poisoned(data[name]["y"].shape))
                launcher(x, w, y, padding=1)
                cuda.synchronize()
                comp = check.compare(y.copy_to_host(), data[name]["y"], data[name]["ya"],
                                     meta[name]["reduction"])
                r[f"{name}_max_rel"] = comp.max_rel
                if not comp.ok:
                    raise check.CheckError(f"{name}: " + comp.summary())
            r["odd"] = check.check_conv2d(launcher, dilation=True, quiet=True)
            try:
                fn = cc._module([cfg]).get_function(cfg.name_expression)
                r["regs"] = int(fn.num_regs)
            except Exception:  # noqa: BLE001
                r["regs"] = None
            ready.append((vname, launcher))
        except Exception as e:  # noqa: BLE001
            r["error"] = f"{type(e).__name__}: {str(e)[:600]}"
            r["trace"] = traceback.format_exc()[-1500:]
    with _LOCK:
        for vname, launcher in ready:
            r = res[vname]
            try:
                for name in LAYERS:
                    t = bench.time_gpu(launcher, *dev[name], padding=1, warmup=2, repeat=10,
                                       group_ms=5)
                    r[f"{name}_ms"] = t.median_ms
                    r[f"{name}_spread"] = t.spread
                    r[f"{name}_tflops"] = t.tflops(meta[name]["flops"])
                    r[f"{name}_host_us"] = host_us(launcher, dev[name], {"padding": 1})
            except Exception as e:  # noqa: BLE001
                r["error"] = f"timing: {type(e).__name__}: {str(e)[:600]}"
    return res


def main():
    os.makedirs(OUT, exist_ok=True)
    _setup()
    from convlab import bench, ladder

    result = dict(env=dict(device="simulator", versions={}) if DRY else ladder.environment(),
                  quick=QUICK)
    log(f"{result['env']['device']} {result['env']['versions']}")
    try:
        result["ceilings"] = bench.measure_ceilings()
        log(f"ceilings {result['ceilings']}")
    except Exception as e:  # noqa: BLE001
        result["ceilings_error"] = repr(e)
    meta = make_refs()
    result["layers"] = meta
    log("references done")
    result["libraries_before"] = libs = time_libraries(meta, "before")

    ctx = mp.get_context("spawn")
    lock = ctx.Lock()
    groups = sorted({v[0] for v in VARIANTS})
    variants = {}
    with cf.ProcessPoolExecutor(len(groups) + 1, mp_context=ctx, initializer=_init,
                                initargs=(lock,)) as ex:
        futs = [ex.submit(run_group, [v for v in VARIANTS if v[0] == g], meta) for g in groups]
        if not DRY:
            futs.append(ex.submit(run_cuda_group, meta))
        for f in cf.as_completed(futs):
            try:
                got = f.result()
                variants.update(got)
                log("group done: " + ", ".join(got))
            except Exception as e:  # noqa: BLE001
                variants[f"worker {len(variants)}"] = dict(error=repr(e)[:1000])
    result["variants"] = variants
    result["libraries_after"] = libs_after = time_libraries(meta, "after")
    base = {n: min(libs[f"cuDNN fp32 {n}"]["ms"], libs_after[f"cuDNN fp32 {n}"]["ms"])
            for n in LAYERS}
    cublas = min(libs["cuBLAS sgemm 4096"]["ms"], libs_after["cuBLAS sgemm 4096"]["ms"])
    for v in variants.values():
        if v.get("kind") == "conv" and all(f"{n}_ms" in v for n in LAYERS):
            pct = [100 * base[n] / v[f"{n}_ms"] for n in LAYERS]
            v["pct_cudnn"] = pct
            v["geomean_pct"] = math.prod(pct) ** (1 / 3)
        if v.get("kind") == "gemm" and "gemm4096_ms" in v:
            v["pct_cublas"] = 100 * cublas / v["gemm4096_ms"]
    with open(f"{OUT}/fast_kernels.json", "w") as f:
        json.dump(result, f, indent=1, default=str)

    # ---- the compact table (the batch sweep follows) ----
    print()
    print("cuDNN fp32 ms: " + "  ".join(f"{n} {base[n]:.4f}" for n in LAYERS) +
          f" | cuBLAS 4096 {cublas:.3f} ms "
          f"({libs['cuBLAS sgemm 4096']['tflops']:.1f} TF)")
    print(f"{'variant':<30}{'l64 ms':>8}{'%':>5}{'l128 ms':>8}{'%':>5}{'l256 ms':>8}{'%':>5}"
          f"{'geo%':>6}{'regs':>5}{'host us':>8}")
    for k, v in variants.items():
        if v.get("kind") == "conv":
            k = k.replace("conv09 cuda", "cuda").replace("conv07", "numba")
            if "error" in v:
                print(f"{k:<30} ERROR {v['error'][:90]}")
                continue
            cells = "".join(f"{v.get(f'{n}_ms', float('nan')):8.4f}"
                            f"{(v.get('pct_cudnn') or [0, 0, 0])[i]:5.0f}"
                            for i, n in enumerate(LAYERS))
            host = max(v.get(f"{n}_host_us", 0) for n in LAYERS)
            print(f"{k:<30}{cells}{v.get('geomean_pct', 0):6.1f}{v.get('regs') or 0:5d}"
                  f"{host:8.0f}")
    for k, v in variants.items():
        if v.get("kind") == "gemm":
            if "error" in v:
                print(f"{k:<30} ERROR {v['error'][:90]}")
                continue
            print(f"{k:<30}{v.get('gemm4096_ms', float('nan')):8.3f} ms "
                  f"{v.get('gemm4096_tflops', 0):6.1f} TF {v.get('pct_cublas', 0):5.1f}% cuBLAS"
                  f" regs {v.get('regs')}")

    # the per-layer choice of each family -> $OUT/tuned.json (autotune.stored format)
    from convlab import autotune, problems
    from convlab import reference as ref

    tuned = {"numba": {}, "cuda": {}}
    choice = {}
    for name in LAYERS:
        prob = problems.conv_layer(name)
        key = autotune.problem_key(ref.conv_params(prob.x_shape, prob.w_shape, **prob.kwargs))
        for fam, prefix in (("numba", "conv07"), ("cuda", "conv09")):
            cands = [(v[f"{name}_ms"], k) for k, v in variants.items()
                     if k.startswith(prefix) and f"{name}_ms" in v and "error" not in v]
            if not cands:
                continue
            ms, k = min(cands)
            v = variants[k]
            if fam == "cuda":
                cfg = dict(v["config"])
            else:
                ns = {}
                exec(G + C7, {}, ns)  # noqa: S102
                c = eval(v["expr"].split("launcher_for(")[1][:-1].replace(C7 + ".", ""),  # noqa: S307
                         vars(ns[C7]))
                cfg = dict(BM=c.BM, BN=c.BN, BK=c.BK, TM=c.TM, TN=c.TN, min_blocks=c.min_blocks)
            tuned[fam][key] = cfg
            choice[f"{fam} {name}"] = dict(variant=k, ms=ms, pct_cudnn=100 * base[name] / ms)
    result["tuned"] = tuned
    result["tuned_choice"] = choice
    with open(f"{OUT}/tuned.json", "w") as f:
        json.dump({"tuned": tuned, "choice": choice}, f, indent=1)
    with open(f"{OUT}/fast_kernels.json", "w") as f:
        json.dump(result, f, indent=1, default=str)
    for fam in ("numba", "cuda"):
        pct = [choice[f"{fam} {n}"]["pct_cudnn"] for n in LAYERS if f"{fam} {n}" in choice]
        if len(pct) == len(LAYERS):
            print(f"tuned {fam}: " + "  ".join(
                f"{n} {choice[f'{fam} {n}']['variant'][7:]} {choice[f'{fam} {n}']['ms']:.4f} ms"
                f" ({p:.0f}%)" for n, p in zip(LAYERS, pct, strict=True)) +
                f"  geomean {math.prod(pct) ** (1 / 3):.1f}% of cuDNN")
    other = [k for k, v in variants.items() if "error" in v and v.get("kind") not in
             ("conv", "gemm")]
    for k in other:
        print(f"{k}: ERROR {variants[k]['error'][:300]}")
    print(f"total {time.time() - T0:.0f}s")


if __name__ == "__main__":
    main()
