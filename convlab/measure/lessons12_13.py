"""The GPU measurements lessons 12 and 13 show: tensor cores, precisions, a CNN's census.

1. "wmma_gemm": the WMMA GEMM (kernels/wmma01_gemm_cuda.py), simple and tiled, at 4096^3,
   verified against float64 with two stated tolerances (fp16 inputs: 2.5 * 2^-11 +
   8 * 2^-24 * sqrt(K) relative to sum |a||b|; and, against the product of the
   fp16-rounded inputs, the fp32 tolerance 8 * 2^-24 * sqrt(K)), run twice (same bits),
   then timed beside cuBLAS at fp32 (TF32 off), tf32, bf16 and fp16; a tile sweep;
2. "wmma_conv": the WMMA implicit-GEMM conv on the three ResNet layers (batch 32),
   verified and timed beside cuDNN fp32 / tf32 / bf16 / fp16 (NCHW and NHWC); tile sweep;
   "wmma_conv_checker" / "wmma_gemm_checker": the course checkers at fp16 tolerance;
3. "throughput_ratio": source 002's "12x", fp16 tensor-core GEMM vs fp32 (8192^3);
4. "census": ResNet-18 (224x224, batch 32 and lesson 00's batch): FLOPs, and GPU time by
   kind of layer (CUDA graph replay and profiler kernel times) with the CPU issue time.

Everything but the census's FLOP count needs CuPy and a CUDA PyTorch; a dry run skips
those sections (tools/wmma_emulate.py tests the WMMA kernels' logic on the CPU). Stored
flat (lessons12_13.json: device, versions, date, one entry per section).
"""

from __future__ import annotations

import time

import numpy as np

from .. import baselines, census, check, problems
from .harness import Group, Skip

GROUP = Group("lessons12_13", layout="flat")
section = GROUP.section


def gpu_compare(out, expected, absref, rtol):
    """check.compare's rule on the GPU (16M-element outputs): |out - exp| <= rtol * absref
    everywhere, NaN/Inf fail."""
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


@section("wmma_gemm", lessons=("12",))
def wmma_gemm(ctx):
    ctx.need("cupy", "torch.cuda")
    import cupy as cp
    import torch

    from ..kernels import wmma01_gemm_cuda as WM

    n = problems.gemm_size()
    t = time.monotonic()
    WM._module(WM.GEMM_CANDIDATES + WM.CONV_CANDIDATES)
    compile_s = time.monotonic() - t
    ctx.log(f"NVRTC compile of every WMMA instantiation: {compile_s:.1f} s")
    rng = np.random.default_rng(0)
    a32 = cp.asarray(check.random_array((n, n), rng))
    b32 = cp.asarray(check.random_array((n, n), rng))
    a16, b16 = a32.astype(cp.float16), b32.astype(cp.float16)
    a64, b64 = a32.astype(cp.float64), b32.astype(cp.float64)
    exact, exact_abs = a64 @ b64, cp.abs(a64) @ cp.abs(b64)
    r64a, r64b = a16.astype(cp.float64), b16.astype(cp.float64)
    rounded, rounded_abs = r64a @ r64b, cp.abs(r64a) @ cp.abs(r64b)
    tol16, tol32 = rtol_for("fp16", n), rtol_for("fp32", n)
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
            row = dict(name=name, vs_fp32_inputs=v16, vs_rounded_inputs=v32, reproducible=same)
            if v16["ok"] and v32["ok"] and same:
                tm = ctx.clock.time_gpu(WM.gemm_wmma_raw, a16, b16, out, repeat=10, **kw)
                row.update(ms=tm.median_ms, spread=tm.spread, tflops=tm.tflops(2 * n**3))
            (rows if "simple" in name or kw.get("cfg") == WM.GEMM_DEFAULT else sweep).append(row)
            ctx.log(f"{name}: ok16={v16['ok']} ok32={v32['ok']} same={same} "
                    f"{row.get('tflops', 0):.1f} TFLOP/s")
        except Exception as e:  # noqa: BLE001  (a tile that fails is a row of the sweep)
            sweep.append(dict(name=name, error=f"{type(e).__name__}: {e}"[:400]))
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
    table = baselines.gemm_precisions(n, extra=extra)
    return dict(n=n, tol_fp16=tol16, tol_fp32=tol32, compile_s=compile_s, verified=rows,
                sweep=sweep, best=best["name"] if best else None, table=table)


@section("wmma_conv", lessons=("12", "13"))
def wmma_conv(ctx):
    ctx.need("cupy", "torch.cuda")
    import cupy as cp
    import torch

    from ..kernels import wmma01_gemm_cuda as WM

    F = torch.nn.functional
    out_layers = []
    for lname in problems.RESNET:
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

        table = baselines.conv_precisions(prob, extra={
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
        chosen = WM.choose_conv(prob.K)
        for cfg in [chosen] + [c for c in WM.CONV_CANDIDATES if c != chosen]:
            launch = WM.make_conv_launcher(cfg)
            out = torch.full(prob.out_shape, float("nan"), device="cuda")
            try:
                launch(xh, wh, out, **kw)
                torch.cuda.synchronize()
                o = cp.asarray(out)
                v32 = gpu_compare(o, cp.asarray(exp_r), cp.asarray(abs_r), rtol_for("fp32", red))
                v16 = gpu_compare(o, cp.asarray(exp_x), cp.asarray(abs_x), rtol_for("fp16", red))
                row = dict(config=str(cfg), chosen=cfg == chosen, vs_rounded_inputs=v32,
                           vs_fp32_inputs=v16)
                if v32["ok"] and v16["ok"]:
                    tm = ctx.clock.time_gpu(launch, xh, wh, out, repeat=10, **kw)

                    def hundred(launch=launch, args=(xh, wh, out), kw=kw):  # per-call cost
                        for _ in range(100):
                            launch(*args, **kw)
                        torch.cuda.synchronize()

                    row["wall_us_per_call"] = 1e6 * ctx.clock.seconds(hundred) / 100
                    row.update(ms=tm.median_ms, tflops=tm.tflops(prob.flops),
                               pct_cudnn_fp16=100 * base["cuDNN fp16"] / tm.median_ms,
                               pct_cudnn_fp16_nhwc=100 * base["cuDNN fp16 NHWC"] / tm.median_ms,
                               pct_cudnn_fp32=100 * base["cuDNN fp32"] / tm.median_ms)
                sweep.append(row)
            except Exception as e:  # noqa: BLE001  (a tile that fails is a row of the sweep)
                sweep.append(dict(config=str(cfg), error=f"{type(e).__name__}: {e}"[:400]))
        out_layers.append(dict(layer=lname, problem=str(prob), flops=prob.flops,
                               bytes=prob.bytes, table=table, sweep=sweep,
                               tol_fp16=rtol_for("fp16", red), tol_fp32=rtol_for("fp32", red)))
        ctx.log(f"{lname}: " + ", ".join(f"{r['name']} {r['ms']:.4f}" for r in table))
    return out_layers


@section("throughput_ratio", lessons=("12",))
def throughput_ratio(ctx):
    ctx.need("torch.cuda")
    return baselines.throughput_ratio(8192)


@section("wmma_conv_checker", lessons=("12",))
def wmma_conv_checker(ctx):
    ctx.need("cupy", "cuda")
    from ..kernels import wmma01_gemm_cuda as WM

    lines = [check.check_conv2d(WM.conv2d_wmma, dilation=True, precision="fp16")]
    for cfg in WM.CONV_CANDIDATES:
        lines.append(str(cfg) + ": " + check.check_conv2d(
            WM.make_conv_launcher(cfg), precision="fp16", quiet=True))
    return lines


@section("wmma_gemm_checker", lessons=("12",))
def wmma_gemm_checker(ctx):
    ctx.need("cupy", "cuda")
    from ..kernels import wmma01_gemm_cuda as WM

    def gemm(a, b):
        return WM.gemm_fp16(a, b)
    return check.check_gemm(gemm, precision="fp16", device=True)


@section("census", lessons=("13",))
def census_section(ctx):
    """ResNet-18's FLOPs by kind of layer, and (with a CUDA PyTorch) its GPU time by kind
    at fp32, tf32 and fp16 NHWC (`census.census_precisions`: CUDA graph replay, profiler
    kernel times, the eager call's CPU issue time beside); at batch 32 (lesson 13, the top
    level) and at lesson 00's batch ("by_batch")."""
    ctx.need("torch")
    import torch

    batch, side, runs = ctx.pick((32, 224, 20), (2, 32, 1))
    flops = census.census_flops(census.resnet18(), (1, 3, side, side))
    res = dict(batch=batch, side=side, flops={k: v * batch for k, v in flops.items()})
    if ctx.dry or not torch.cuda.is_available():
        res["skipped_timing"] = "needs PyTorch with a GPU"
        return res
    if ctx.clock.fake:
        raise Skip("census timing uses its own CUDA events")
    res = census.census_precisions(batch, side, runs=runs)
    small = problems.cpu_sizes(real=True)["cnn_batch"]  # lesson 00's batch
    res["by_batch"] = {str(small): census.census_precisions(small, side, runs=runs)}
    res["method"] = ("GPU ms by kind: PyTorch profiler kernel times of one eager pass, "
                     "attributed to the layer that launched them; graph_ms: the pass in a "
                     "CUDA graph, replay timed by CUDA events (median); eager_ms / issue_ms: "
                     "wall time of the eager call with / without waiting for the GPU")
    for b, r in [(batch, res), (small, res["by_batch"][str(small)])]:
        for label, *_ in census.PRECISIONS:
            t = r[label]
            ctx.log(f"batch {b} {label}: conv {t['conv_share_pct']:.0f}% of "
                    f"{t['kernel_ms']:.2f} ms kernel time; graph {t['graph_ms']:.2f} ms, "
                    f"eager {t['eager_ms']:.2f} ms (issue {t['issue_ms']:.2f} ms)")
    return res
