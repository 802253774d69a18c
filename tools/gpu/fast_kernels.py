# ruff: noqa: E402
"""Issue 7 on the GPU: check then time every fast kernel variant against cuDNN / cuBLAS.

    . tools/device_env.sh; python3 tools/gpu/fast_kernels.py          # on the GPU machine

One run: the libraries first (cuDNN fp32 with TF32 off on the three ResNet layers at
batch 32, cuBLAS SGEMM 4096^3), then many Numba and CUDA C variants and tile shapes.
Compilation is spread over worker processes (Numba compiles one kernel at a time per
process); each worker checks its variants against float64 references (computed once by
PyTorch on the GPU, same inputs as the timing) and odd-shaped cases (convlab.check), then
times them while holding a lock, so that only one process uses the GPU while timing.
Then the libraries again (drift), and a batch-size sweep (32/64/128) of the best
kernels. Writes $OUT/fast_kernels.json; prints a compact table last.

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
G = "from convlab.kernels import "
VARIANTS = [
    # GEMM ladder (Numba)
    (0, "gemm02 128x128 8x8", "gemm", "gemm02_register_blocked.gemm_register_blocked"),
    (0, "gemm03 v4 128x128x8", "gemm", "gemm03_vectorized.gemm_vectorized"),
    (0, "gemm04 db 128x128x8", "gemm", "gemm04_double_buffered.gemm_double_buffered"),
    (1, "gemm04 db 128x128x8 b2", "gemm",
     "gemm04_double_buffered.make_launcher(gemm04_double_buffered.make_kernel(min_blocks=2))"),
    (1, "gemm04 db 128x128x16", "gemm",
     "gemm04_double_buffered.make_launcher(gemm04_double_buffered.make_kernel(BK=16))"),
    (1, "gemm04 db 128x64x8", "gemm",
     "gemm04_double_buffered.make_launcher(gemm04_double_buffered.make_kernel(BN=64))"),
    # conv ladder (Numba)
    (2, "conv04 regblock 4x8", "conv", "conv04_register_blocked.conv2d_register_blocked"),
    (2, "conv05 igemm 64x128", "conv", "conv05_implicit_gemm.conv2d_implicit_gemm"),
    (2, "conv06 igemm v4 64x128", "conv", "conv06_implicit_gemm_v4.conv2d_implicit_gemm_v4"),
]
C7 = "conv07_implicit_gemm_pipelined"
for grp, args in ((3, "BM=64, BN=128"), (3, "BM=128, BN=128"), (4, "BM=128, BN=64"),
                  (4, "BM=64, BN=64"), (5, "BM=128, BN=128, BK=16"),
                  (5, "BM=64, BN=128, BK=16"), (6, "BM=128, BN=128, min_blocks=2"),
                  (6, "BM=128, BN=64, BK=16")):
    short = args.replace("BM=", "").replace(", BN=", "x").replace(", BK=", "x").replace(
        ", min_blocks=", " b")
    VARIANTS.append((grp, f"conv07 pipe {short}", "conv",
                     f"{C7}.make_launcher({C7}.make_kernel({args}))"))
CUDA_GROUP = 7
if QUICK or DRY:
    VARIANTS = [v for v in VARIANTS if v[0] in (0, 2, 3)]


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
            except Exception as e:  # noqa: BLE001
                r["error"] = f"timing: {type(e).__name__}: {str(e)[:600]}"
    return res


# ---------------------------------------------------------------------------------------
# Batch sweep of the best kernels (main process)


def batch_sweep(best: dict, libs: dict):
    """Time the best Numba and CUDA C variants per layer at batch 32/64/128 vs cuDNN."""
    import torch

    from convlab import bench, check, problems
    from convlab import kernels as K  # noqa: N812
    from convlab.runtime import cuda

    out = {}
    F = torch.nn.functional
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    launchers = {}
    for fam, (vname, expr) in best.items():
        ns = {}
        exec(G + expr.split(".")[0], vars(K), ns)  # noqa: S102
        launchers[fam] = (vname, eval(expr, {**vars(K), **ns}))  # noqa: S307
    rng = np.random.default_rng(5)
    c = cuda()
    for name in LAYERS:
        for nb in ((1, 2) if DRY else (32, 64, 128)):
            prob = problems.conv_layer(name).with_batch(nb)
            x = check.random_array(prob.x_shape, rng)
            w = check.random_array(prob.w_shape, rng)
            xt, wt = torch.from_numpy(x).to(DEV), torch.from_numpy(w).to(DEV)
            t = bench.time_gpu(functools.partial(F.conv2d, xt, wt, padding=1), warmup=5,
                               repeat=10)
            yref = F.conv2d(xt.double(), wt.double(), padding=1).cpu().numpy()
            yabs = F.conv2d(xt.double().abs(), wt.double().abs(), padding=1).cpu().numpy()
            row = {"cuDNN fp32": dict(ms=t.median_ms, tflops=t.tflops(prob.flops))}
            xd, wd = c.to_device(x), c.to_device(w)
            for fam, (vname, launch) in launchers.items():
                yd = c.to_device(check.poisoned(prob.out_shape))
                try:
                    launch(xd, wd, yd, padding=1)
                    c.synchronize()
                    comp = check.compare(yd.copy_to_host(), yref, yabs, prob.C * 9)
                    if not comp.ok:
                        raise check.CheckError(comp.summary())
                    tt = bench.time_gpu(launch, xd, wd, yd, padding=1, warmup=2, repeat=10,
                                        group_ms=5)
                    row[fam] = dict(variant=vname, ms=tt.median_ms,
                                    tflops=tt.tflops(prob.flops), max_rel=comp.max_rel,
                                    pct_cudnn=100 * t.median_ms / tt.median_ms)
                except Exception as e:  # noqa: BLE001
                    row[fam] = dict(variant=vname, error=f"{type(e).__name__}: {e}"[:400])
            out[f"{name} batch {nb}"] = row
            del xt, wt, xd, wd
    if not DRY:
        torch.cuda.empty_cache()
    return out


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
    print(f"{'variant':<34}{'l64 ms':>8}{'%':>5}{'l128 ms':>8}{'%':>5}{'l256 ms':>8}{'%':>5}"
          f"{'geo%':>6}{'regs':>5}")
    for k, v in variants.items():
        if v.get("kind") == "conv":
            if "error" in v:
                print(f"{k:<34} ERROR {v['error'][:90]}")
                continue
            cells = "".join(f"{v.get(f'{n}_ms', float('nan')):8.4f}"
                            f"{(v.get('pct_cudnn') or [0, 0, 0])[i]:5.0f}"
                            for i, n in enumerate(LAYERS))
            print(f"{k:<34}{cells}{v.get('geomean_pct', 0):6.1f}{v.get('regs') or 0:5d}")
    for k, v in variants.items():
        if v.get("kind") == "gemm":
            if "error" in v:
                print(f"{k:<34} ERROR {v['error'][:90]}")
                continue
            print(f"{k:<34}{v.get('gemm4096_ms', float('nan')):8.3f} ms "
                  f"{v.get('gemm4096_tflops', 0):6.1f} TF {v.get('pct_cublas', 0):5.1f}% cuBLAS"
                  f" regs {v.get('regs')}")

    # best per family (by geomean), then the batch sweep
    def best_of(prefix):
        cands = [(v["geomean_pct"], k) for k, v in variants.items()
                 if k.startswith(prefix) and "geomean_pct" in v]
        return max(cands)[1] if cands else None

    best = {}
    b7 = best_of("conv07")
    if b7:
        best["numba best"] = (b7, variants[b7]["expr"])
    b9 = best_of("conv09")
    if b9:
        cfg = variants[b9]["config"]
        best["cuda best"] = (b9, "conv09_implicit_gemm_cuda.make_launcher("
                                 "conv09_implicit_gemm_cuda.Config(" +
                             ", ".join(f"{k}={v}" for k, v in cfg.items()) + "))")
    if time.time() - T0 < 100:
        try:
            result["batch_sweep"] = batch_sweep(best, libs)
        except Exception as e:  # noqa: BLE001
            result["batch_sweep_error"] = traceback.format_exc()[-2000:]
            log(f"batch sweep failed: {e!r}")
    else:
        result["batch_sweep_skipped"] = f"time {time.time() - T0:.0f}s"
    with open(f"{OUT}/fast_kernels.json", "w") as f:
        json.dump(result, f, indent=1, default=str)

    for k, row in result.get("batch_sweep", {}).items():
        print(f"{k:<22}" + "  ".join(
            f"{fam} {d.get('ms', float('nan')):.4f} ({d.get('pct_cudnn', 100):.0f}%)"
            for fam, d in row.items()))
    other = [k for k, v in variants.items() if "error" in v and v.get("kind") not in
             ("conv", "gemm")]
    for k in other:
        print(f"{k}: ERROR {variants[k]['error'][:300]}")
    print(f"total {time.time() - T0:.0f}s")


if __name__ == "__main__":
    main()
