"""Lessons 12 and 13 on a real GPU: tensor cores, precisions, and a real CNN's census.

    . tools/device_env.sh; python3 tools/gpu/lessons12_13.py $OUT [--notebooks SECONDS]
    .venv/bin/python tools/gpu/lessons12_13.py /tmp/dry --dry-run      # no GPU: tiny, CPU

Checks before it times, and times every library in the same run:

1. the WMMA GEMM (convlab/kernels/wmma01_gemm_cuda.py), simple and tiled, at 4096^3:
   verified against float64 with two stated tolerances (fp16 inputs: 2.5 * 2^-11 +
   8 * 2^-24 * sqrt(K) relative to sum |a||b|; and, against the product of the
   fp16-rounded inputs, the fp32 tolerance 8 * 2^-24 * sqrt(K)), then timed beside cuBLAS
   at fp32 (TF32 off), tf32, bf16 and fp16 (PyTorch) and fp16 (CuPy); tile sweep;
2. the WMMA implicit-GEMM conv on the three ResNet layers (batch 32): the course checker
   (odd shapes, stride, padding, dilation, NaN-poisoned outputs, run twice) at fp16
   tolerance, then verified and timed beside cuDNN fp32 / tf32 / bf16 / fp16 (NCHW and
   NHWC); tile sweep;
3. source 002's "12x": fp16 tensor-core GEMM vs fp32 on the CUDA cores (8192^3);
4. ResNet-18 (batch 32, 224x224): FLOPs and GPU time by kind of layer, fp32 and fp16;
5. optionally executes notebooks 12 and 13 (whatever time is left, up to SECONDS).

Writes $OUT/lessons12_13.json (device, versions, date; commit it as
convlab/results/h200_lessons12_13.json) and prints a short table last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

T0 = time.monotonic()
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
DRY = "--dry-run" in sys.argv

import convlab  # noqa: E402

convlab.setup("sim" if DRY else None)

import numpy as np  # noqa: E402

from convlab import bench, check, ladder, problems  # noqa: E402
from convlab import precision as P  # noqa: E402

RESULT: dict = {}
LOG: list = []


def log(msg: str):
    line = f"[{time.monotonic() - T0:6.1f}s] {msg}"
    print(line, flush=True)
    LOG.append(line)


OUT_DIR: list = []      # where save() writes (set by main)
DEADLINE_S = 100.0      # sections that would start later are skipped (a 120 s device call)


def section(name):
    def deco(fn):
        def run(*a, **k):
            t = time.monotonic()
            if t - T0 > DEADLINE_S:
                RESULT.setdefault("skipped", []).append(name)
                log(f"{name}: skipped ({t - T0:.0f} s elapsed)")
                return
            try:
                RESULT[name] = fn(*a, **k)
                log(f"{name}: done in {time.monotonic() - t:.1f} s")
            except Exception as e:  # noqa: BLE001  (one failing part must not stop the rest)
                RESULT.setdefault("failed", {})[name] = (
                    f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2500:]}")
                log(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}")
            if OUT_DIR:
                save(OUT_DIR[0])  # keep what is done if the call is cut short
        return run
    return deco


# ----------------------------------------------------------------------------------------
# Dry run: the library paths on the CPU (tiny), so that this script's Python is tested


def install_dry_run():
    import torch

    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.cuda.synchronize = lambda *a, **k: None

    class Event:
        def __init__(self, **k):
            self.t = None

        def record(self, *a):
            self.t = time.perf_counter()

        def elapsed_time(self, other):
            return (other.t - self.t) * 1e3

    torch.cuda.Event = Event

    def time_gpu(fn, *args, warmup=1, repeat=3, group_ms=0, **kw):
        return bench.time_cpu(fn, *args, warmup=1, repeat=2, **kw)

    bench.time_gpu = time_gpu
    bench.fma_peak = lambda repeat=5: 1.0
    P.torch_available = lambda: True
    for fname in ("empty", "full", "randn", "as_tensor"):  # device="cuda" -> the CPU
        def cpu(*a, _f=getattr(torch, fname), **k):
            k.pop("device", None)
            return _f(*a, **k)
        setattr(torch, fname, cpu)
    # CuPy stand-in: the WMMA kernels run on the CPU through tools/wmma_emulate.py
    sys.path.insert(0, str(ROOT / "tools"))
    import wmma_emulate

    sys.modules["cupy"] = wmma_emulate.fake_cupy()
    from convlab.kernels import wmma01_gemm_cuda as WM

    ptr = WM._ptr

    def sim_ptr(a):  # simulator device arrays hold a NumPy array
        return a._ary.ctypes.data if hasattr(a, "_ary") else ptr(a)

    WM._ptr = sim_ptr
    asarray = sys.modules["cupy"].asarray
    sys.modules["cupy"].asarray = lambda a, dtype=None: asarray(
        a._ary if hasattr(a, "_ary") else a, dtype)


# ----------------------------------------------------------------------------------------
# GPU comparisons (the checkers' rule, evaluated on the GPU for 16M-element outputs)


def gpu_compare(out, expected, absref, rtol):
    """check.compare's rule: |out - exp| <= rtol * absref everywhere, NaN/Inf fail."""
    import cupy as cp

    out = cp.asarray(out, dtype=cp.float64)
    diff = cp.abs(out - expected)
    ok = bool(cp.all(diff <= rtol * absref)) and bool(cp.all(cp.isfinite(out)))
    return dict(ok=ok, rtol=rtol, max_rel=float(cp.max(diff / (absref + 1e-30))),
                max_abs=float(cp.max(diff)))


def rtol_for(precision: str, reduction: int) -> float:
    """The tolerance check.compare uses (stated in the results)."""
    eps = check.EPS
    return 2.5 * (0.0 if precision == "fp32" else eps[precision]) + 8 * eps["fp32"] * max(
        1.0, np.sqrt(reduction))


# ----------------------------------------------------------------------------------------
# 1. the WMMA GEMM


@section("wmma_gemm")
def wmma_gemm(n: int):
    import cupy as cp
    import torch

    from convlab.kernels import wmma01_gemm_cuda as WM

    t = time.monotonic()
    WM._module(WM.GEMM_CANDIDATES + WM.CONV_CANDIDATES)
    compile_s = time.monotonic() - t
    log(f"NVRTC compile of every WMMA instantiation: {compile_s:.1f} s")
    rng = np.random.default_rng(0)
    a32 = cp.asarray(check.random_array((n, n), rng))
    b32 = cp.asarray(check.random_array((n, n), rng))
    a16, b16 = a32.astype(cp.float16), b32.astype(cp.float16)
    a64, b64 = a32.astype(cp.float64), b32.astype(cp.float64)
    exact, exact_abs = a64 @ b64, cp.abs(a64) @ cp.abs(b64)
    r64a, r64b = a16.astype(cp.float64), b16.astype(cp.float64)
    rounded, rounded_abs = r64a @ r64b, cp.abs(r64a) @ cp.abs(r64b)
    tol16, tol32 = rtol_for("fp16", n), rtol_for("fp32", n)
    flops = 2 * n**3
    rows, sweep = [], []
    impls = [("WMMA simple", dict(simple=True))] + [
        (f"WMMA tiled {c}", dict(cfg=c)) for c in WM.GEMM_CANDIDATES]
    for name, kw in impls:
        out = cp.full((n, n), np.nan, cp.float32)
        try:
            WM.gemm_wmma_raw(a16, b16, out, **kw)
            cp.cuda.runtime.deviceSynchronize()
            v16 = gpu_compare(out, exact, exact_abs, tol16)
            v32 = gpu_compare(out, rounded, rounded_abs, tol32)
            again = out.copy()
            WM.gemm_wmma_raw(a16, b16, out, **kw)
            same = bool(cp.array_equal(again, out))
            row = dict(name=name, vs_fp32_inputs=v16, vs_rounded_inputs=v32,
                       reproducible=same)
            if v16["ok"] and v32["ok"] and same:
                tm = bench.time_gpu(WM.gemm_wmma_raw, a16, b16, out, repeat=10, **kw)
                row.update(ms=tm.median_ms, spread=tm.spread, tflops=tm.tflops(flops))
            (rows if "simple" in name or kw.get("cfg") == WM.GEMM_DEFAULT else sweep).append(
                row)
            log(f"{name}: ok16={v16['ok']} ok32={v32['ok']} same={same} "
                f"{row.get('tflops', 0):.1f} TFLOP/s")
        except Exception as e:  # noqa: BLE001
            sweep.append(dict(name=name, error=f"{type(e).__name__}: {e}"[:400]))
            log(f"{name}: ERROR {e}")
    best = max((r for r in rows + sweep if r.get("tflops")), key=lambda r: r["tflops"],
               default=None)

    def wmma_extra(cfg=None, simple=False):
        def make(a, b):
            ah, bh = a.half(), b.half()
            out = torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=torch.float32)

            def run():
                WM.gemm_wmma_raw(ah, bh, out, cfg=cfg, simple=simple)
            return run, lambda: out
        return make

    def cupy_fp16(a, b):
        ah, bh = cp.asarray(a.half()), cp.asarray(b.half())
        box = {}

        def run():
            box["c"] = ah @ bh
        return run, lambda: torch.as_tensor(box["c"], device="cuda").float()

    extra = {"CuPy cuBLAS fp16": cupy_fp16, "WMMA simple": wmma_extra(simple=True),
             "WMMA tiled (default)": wmma_extra()}
    if best is not None and "tiled" in best["name"] and best["name"] != (
            f"WMMA tiled {WM.GEMM_DEFAULT}"):
        cfg = next(c for c in WM.GEMM_CANDIDATES if f"WMMA tiled {c}" == best["name"])
        extra[f"WMMA tiled (best: {cfg})"] = wmma_extra(cfg)
    table = P.gemm_precisions(n, extra=extra)
    return dict(n=n, tol_fp16=tol16, tol_fp32=tol32, compile_s=compile_s, verified=rows,
                sweep=sweep, best=best["name"] if best else None, table=table)


@section("wmma_gemm_checker")
def wmma_gemm_checker():
    from convlab.kernels import wmma01_gemm_cuda as WM

    def gemm(a, b):
        return WM.gemm_fp16(a, b)
    return check.check_gemm(gemm, precision="fp16", device=True)


# ----------------------------------------------------------------------------------------
# 2. the WMMA conv


@section("wmma_conv_checker")
def wmma_conv_checker():
    from convlab.kernels import wmma01_gemm_cuda as WM

    lines = [check.check_conv2d(WM.conv2d_wmma, dilation=True, precision="fp16")]
    for cfg in WM.CONV_CANDIDATES:
        lines.append(str(cfg) + ": " + check.check_conv2d(
            WM.make_conv_launcher(cfg), precision="fp16", quiet=True))
    return lines


@section("wmma_conv")
def wmma_conv(layers):
    import cupy as cp
    import torch

    from convlab.kernels import wmma01_gemm_cuda as WM

    F = torch.nn.functional
    out_layers = []
    for lname in layers:
        prob = problems.conv_layer(lname)
        kw = prob.kwargs
        red = prob.C * prob.R * prob.S

        def make(launch, half_input=True, prob=prob, kw=kw):
            def mk(xx, ww):
                xin = xx.half() if half_input else xx
                wh = ww.half()
                out = torch.empty(prob.out_shape, device="cuda", dtype=torch.float32)

                def run():
                    launch(xin, wh, out, **kw)
                return run, lambda: out
            return mk

        table = P.conv_precisions(prob, extra={
            "WMMA conv": make(WM.conv2d_wmma),
            "WMMA conv (fp32 x in)": make(WM.conv2d_wmma, half_input=False)})
        # verification against the product of the rounded inputs (fp32 tolerance)
        rng = np.random.default_rng(3)
        x = torch.from_numpy(check.random_array(prob.x_shape, rng)).cuda()
        w = torch.from_numpy(check.random_array(prob.w_shape, rng)).cuda()
        xh, wh = x.half(), w.half()
        exp_r = F.conv2d(xh.double(), wh.double(), **kw)
        abs_r = F.conv2d(xh.double().abs(), wh.double().abs(), **kw)
        exp_x = F.conv2d(x.double(), w.double(), **kw)
        abs_x = F.conv2d(x.double().abs(), w.double().abs(), **kw)
        sweep = []
        base = {r["name"]: r["ms"] for r in table}
        for cfg in [WM.choose_conv(prob.K)] + [c for c in WM.CONV_CANDIDATES
                                                if c != WM.choose_conv(prob.K)]:
            launch = WM.make_conv_launcher(cfg)
            out = torch.full(prob.out_shape, float("nan"), device="cuda")
            try:
                launch(xh, wh, out, **kw)
                torch.cuda.synchronize()
                o = cp.asarray(out)
                v32 = gpu_compare(o, cp.asarray(exp_r), cp.asarray(abs_r), rtol_for("fp32", red))
                v16 = gpu_compare(o, cp.asarray(exp_x), cp.asarray(abs_x), rtol_for("fp16", red))
                row = dict(config=str(cfg), chosen=cfg == WM.choose_conv(prob.K),
                           vs_rounded_inputs=v32, vs_fp32_inputs=v16)
                if v32["ok"] and v16["ok"]:
                    tm = bench.time_gpu(launch, xh, wh, out, repeat=10, **kw)
                    calls = 1 if DRY else 100
                    t = time.perf_counter()
                    for _ in range(calls):
                        launch(xh, wh, out, **kw)
                    torch.cuda.synchronize()
                    row["wall_us_per_call"] = (time.perf_counter() - t) * 1e6 / calls
                    row.update(ms=tm.median_ms, tflops=tm.tflops(prob.flops),
                               pct_cudnn_fp16=100 * base["cuDNN fp16"] / tm.median_ms,
                               pct_cudnn_fp16_nhwc=100 * base["cuDNN fp16 NHWC"] / tm.median_ms,
                               pct_cudnn_fp32=100 * base["cuDNN fp32"] / tm.median_ms)
                sweep.append(row)
            except Exception as e:  # noqa: BLE001
                sweep.append(dict(config=str(cfg), error=f"{type(e).__name__}: {e}"[:400]))
        out_layers.append(dict(layer=lname, problem=str(prob), flops=prob.flops,
                               bytes=prob.bytes, table=table, sweep=sweep,
                               tol_fp16=rtol_for("fp16", red), tol_fp32=rtol_for("fp32", red)))
        log(f"{lname}: " + ", ".join(f"{r['name']} {r['ms']:.4f}" for r in table))
    return out_layers


# ----------------------------------------------------------------------------------------
# 3. the 12x claim, 4. the CNN census


@section("throughput_ratio")
def throughput_ratio(n):
    return P.throughput_ratio(n)


@section("census")
def census(batch, side, runs):
    import torch

    model = P.resnet18()
    flops = P.census_flops(model, (1, 3, side, side))
    flops = {k: v * batch for k, v in flops.items()}
    x = torch.randn(batch, 3, side, side).cuda()
    res = dict(batch=batch, side=side, flops=flops)
    torch.backends.cudnn.benchmark = True
    for label, dtype, cl, tf32 in (("fp32", None, False, False), ("tf32", None, False, True),
                                   ("fp16 NHWC", torch.float16, True, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        res[label] = P.census_time(P.resnet18(), x, runs=runs, dtype=dtype, channels_last=cl)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return res


# ----------------------------------------------------------------------------------------
# 5. the notebooks


@section("notebooks")
def notebooks(out: Path, seconds: float):
    paths = [p for p in (ROOT / "notebooks").glob("1[23]_*.ipynb")]
    if not paths:
        return "no notebooks 12/13 yet"
    left = seconds - (time.monotonic() - T0)
    if left < 20:
        return f"skipped: {left:.0f} s left"
    r = subprocess.run([sys.executable, str(ROOT / "tools/gpu/run_notebooks.py"), str(out)]
                       + [str(p) for p in sorted(paths)], capture_output=True, text=True,
                       timeout=left)
    return (r.stdout + r.stderr)[-2000:]


# ----------------------------------------------------------------------------------------


def short_table() -> str:
    lines = []
    g = RESULT.get("wmma_gemm")
    if g:
        lines.append(f"GEMM {g['n']}^3 (fp16 tol {g['tol_fp16']:.1e}, rounded-input tol "
                     f"{g['tol_fp32']:.1e})")
        lines.append(P.accuracy_speed_table(g["table"]))
    convs = RESULT.get("wmma_conv") or []
    if convs:
        names = ["cuDNN fp32", "cuDNN tf32", "cuDNN bf16", "cuDNN fp16", "cuDNN fp16 NHWC",
                 "WMMA conv"]
        lines.append("conv batch 32, ms " + " | ".join(n.replace("cuDNN ", "") for n in names)
                     + " | best WMMA tile: ms, % of cuDNN fp16 / fp16 NHWC / fp32")
        for lay in convs:
            ms = {r["name"]: r["ms"] for r in lay["table"]}
            cells = " ".join(f"{ms[n]:.4f}" if n in ms else "-" for n in names)
            ok = [x for x in lay["sweep"] if x.get("ms")]
            best = ""
            if ok:
                b = min(ok, key=lambda x: x["ms"])
                best = (f" | {b['config']}: {b['ms']:.4f}, {b['pct_cudnn_fp16']:.0f}% / "
                        f"{b['pct_cudnn_fp16_nhwc']:.0f}% / {b['pct_cudnn_fp32']:.0f}%")
            err = max((r["max_rel"] for r in lay["table"] if r["name"] == "WMMA conv"),
                      default=float("nan"))
            lines.append(f"{lay['layer']:<10} {cells}{best} (WMMA max rel err {err:.1e}, "
                         f"tol {lay['tol_fp16']:.1e})")
    r = RESULT.get("throughput_ratio")
    if r:
        lines.append(f"12x claim: fp16 tensor {r['fp16_tensor_tflops']:.0f} TFLOP/s vs fp32 "
                     f"SGEMM {r['fp32_sgemm_tflops']:.1f} / FMA {r['fp32_fma_tflops']:.1f}: "
                     f"{r['ratio_vs_sgemm']:.1f}x / {r['ratio_vs_fma']:.1f}x")
    c = RESULT.get("census")
    if c:
        tot_f = sum(c["flops"].values())
        def share(k):
            return 100 * c[k]["convolution"] / sum(c[k][x] for x in P.KINDS)

        lines.append(f"ResNet-18 batch {c['batch']}: conv = "
                     f"{100 * c['flops']['convolution'] / tot_f:.1f}% of FLOPs; of time: "
                     + ", ".join(f"{k} {share(k):.0f}% ({c[k]['total']:.2f} ms)"
                                 for k in ("fp32", "tf32", "fp16 NHWC") if k in c))
    for name, err in (RESULT.get("failed") or {}).items():
        lines.append(f"FAILED {name}: {err.splitlines()[0][:150]}")
    return "\n".join(lines)


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = Path(args[0] if args else os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    OUT_DIR.append(out)
    nb_seconds = 0.0
    if "--notebooks" in sys.argv:
        nb_seconds = float(sys.argv[sys.argv.index("--notebooks") + 1])
    if DRY:
        install_dry_run()
        RESULT.update(device="(dry run: CPU, kernels emulated)", date=time.strftime("%Y-%m-%d"))
        try:
            from convlab.kernels import wmma01_gemm_cuda as WM

            ptx = WM.compile_ptx(WM.GEMM_CANDIDATES + WM.CONV_CANDIDATES, "compute_90")
            log(f"dry run: NVRTC compiled {ptx.count('.entry')} WMMA kernels")
        except Exception as e:  # noqa: BLE001
            log(f"dry run: no NVRTC ({e})")
        sizes = dict(gemm=256, ratio=64, census=(2, 64, 2))
        global DEADLINE_S
        DEADLINE_S = 1e9
    else:
        RESULT.update(ladder.environment())
        RESULT["command"] = ("python3 tools/gpu/lessons12_13.py $OUT " +
                             " ".join(sys.argv[2:])).strip()
        try:
            RESULT["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                              capture_output=True, text=True,
                                              cwd=ROOT).stdout.strip()
        except Exception:  # noqa: BLE001
            pass
        log(f"{RESULT['device']} cc {RESULT['compute_capability']}, {RESULT['versions']}")
        sizes = dict(gemm=problems.gemm_size(), ratio=8192, census=(32, 224, 5))
    wmma_gemm(sizes["gemm"])
    wmma_conv(problems.RESNET)
    throughput_ratio(sizes["ratio"])
    wmma_conv_checker()
    wmma_gemm_checker()
    census(*sizes["census"])
    save(out)
    if nb_seconds:
        notebooks(out, nb_seconds)
        save(out)
    print(short_table())
    return 0


def save(out: Path):
    RESULT["log"] = LOG
    RESULT["wall_s"] = time.monotonic() - T0
    (out / "lessons12_13.json").write_text(json.dumps(RESULT, indent=1, default=str))
    print(f"wrote {out / 'lessons12_13.json'} ({RESULT['wall_s']:.0f} s)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
