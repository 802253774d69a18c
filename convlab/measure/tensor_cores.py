"""Lesson 12's tensor-core ladder, measured: mma.sync and wgmma kernels beside cuBLAS/cuDNN.

1. "mma_gemm": WMMA -> mma.sync + ldmatrix -> + cp.async stages -> + swizzle -> + 128x256
   tile (kernels/mma02), fp16 at 4096^3 and 8192^3, beside cuBLAS fp16 (same K-major
   operands: a (M, K) @ bt (N, K)^T), each step's gain over the one before;
2. "mma_conv": the mma.sync conv (NHWC fp16) on the three ResNet layers, batch 32, beside
   cuDNN fp16 in NHWC and NCHW; also the NCHW fp32 call with its layout transforms;
3. "wgmma_gemm": the Hopper kernel (kernels/wgmma03: TMA + wgmma, warp-specialized) bf16
   and fp16 at 4096^3 and 8192^3 beside cuBLAS; the precision table fp32 / tf32 / fp16 /
   bf16 / fp8 (cuBLAS) with the kernel each one ran;
4. "wgmma_conv": the wgmma conv (NHWC bf16) beside cuDNN bf16.

Every kernel is checked against float64 of its rounded inputs at the fp32 tolerance
(8 * 2^-24 * sqrt(K), relative to sum |a||b|) before it is timed; a kernel that fails is a
row with its error. The wgmma kernels first run once in a child process with a time limit
(a wrong mbarrier phase hangs a GPU, it does not raise). Needs CuPy and a CUDA PyTorch
(wgmma: compute capability 9.0); a dry run skips every section.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np

from .. import baselines, check, problems
from . import timing
from .harness import Group, Skip
from .lessons12_13 import gpu_compare, rtol_for

GROUP = Group("tensor_cores")
section = GROUP.section
SIZES = (4096, 8192)


def _inputs(n, torch, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = torch.from_numpy(check.random_array((n, n), rng)).cuda().to(dtype)
    bt = torch.from_numpy(check.random_array((n, n), rng)).cuda().to(dtype)
    return a, bt


def _reference(a, bt):
    """float64 product of the rounded inputs and its sum of |a||b| (CuPy arrays)."""
    import cupy as cp

    a64, b64 = cp.asarray(a.double()), cp.asarray(bt.double())
    return a64 @ b64.T, cp.abs(a64) @ cp.abs(b64).T


def _timed(ctx, run, flops, queued):
    """GPU time of run(): back to back (long kernels), or queued behind a spin kernel so
    that Python's launch cost does not count (conv layers of tens of microseconds; the
    wall time per call from Python is kept beside it)."""
    if queued:
        tm = ctx.clock.queued(run, calls=50, repeat=7)
        call = ctx.clock.time_gpu(run, repeat=5)
        return dict(ms=tm.median_ms, spread=tm.spread, tflops=tm.tflops(flops),
                    call_ms=call.median_ms, method=tm.method)
    tm = ctx.clock.time_gpu(run, repeat=10)
    return dict(ms=tm.median_ms, spread=tm.spread, tflops=tm.tflops(flops), method=tm.method)


def _check_then_time(ctx, name, run, out, exp, absref, tol, flops, queued=False):
    """Run once on a NaN-poisoned output, compare, run again (same bits), then time."""
    import cupy as cp
    import torch

    out.fill_(float("nan"))
    run()
    torch.cuda.synchronize()
    v = gpu_compare(cp.asarray(out.float()), exp, absref, tol)
    first = out.clone()
    run()
    torch.cuda.synchronize()
    row = dict(name=name, check=v, reproducible=bool(torch.equal(first, out)))
    if v["ok"] and row["reproducible"]:
        row.update(_timed(ctx, run, flops, queued))
    ctx.log(f"{name}: ok={v['ok']} max_rel={v['max_rel']:.2e} "
            f"{row.get('tflops', 0):.1f} TFLOP/s")
    return row


def _try(rows, name, fn):
    try:
        rows.append(fn())
    except Exception as e:  # noqa: BLE001  (a variant that fails is a row with its error)
        rows.append(dict(name=name, error=f"{type(e).__name__}: {e}"[:400]))


def _library_row(ctx, name, run, flops, prec, queued=False):
    row = _timed(ctx, run, flops, queued)
    kernels = baselines.library_kernels(run)
    return dict(name=name, precision=prec, algorithm=baselines.algorithm_of(kernels),
                kernels=kernels[:3], **row)


def _sustained_race(ctx, pairs, flops, rounds=2):
    """Each (name, run) back to back for about 1.5 s (`clock.sustained`), in turn, `rounds`
    times; per kernel the mean ms, the SM clock and power (medians), the slowing reasons,
    and % of the first kernel (the library) on those times."""
    runs = {name: [] for name, _ in pairs}
    for _ in range(rounds):
        for name, run in pairs:
            runs[name].append(ctx.clock.sustained(run))
            ctx.log(f"{name} sustained: {runs[name][-1]['ms']:.3f} ms at "
                    f"{runs[name][-1]['sm_mhz']} MHz, {runs[name][-1]['power_w']} W")
    rows = []
    for name, rs in runs.items():
        ms = float(np.mean([r["ms"] for r in rs]))
        mhz = [r["sm_mhz"] for r in rs if r["sm_mhz"]]
        watts = [r["power_w"] for r in rs if r["power_w"]]
        rows.append(dict(name=name, ms=ms, tflops=flops / ms / 1e9,
                         sm_mhz=float(np.median(mhz)) if mhz else None,
                         power_w=float(np.median(watts)) if watts else None,
                         reasons=sorted({x for r in rs for x in r["reasons"]}),
                         calls=[r["calls"] for r in rs], method=rs[0]["method"]))
    for r in rows:
        r["pct_library"] = 100 * rows[0]["ms"] / r["ms"]
    return dict(rows=rows, library=rows[0]["name"], rounds=rounds,
                note="each kernel back to back for ~1.5 s, in turn; clocks from nvidia-smi "
                     "over the last 80% of each run")


def _burst_rounds(ctx, pairs, flops, rounds=9):
    """`timing.burst_rounds` of (name, run) pairs, the library first, each burst
    `clock.time_gpu` (5 groups of ~2 ms): per kernel the median ms, TFLOP/s and the median
    over rounds of the library's time over its own in that round, with its range."""
    lib = pairs[0][0]
    rows = []
    for name, r in timing.burst_rounds(
            pairs, lambda run: ctx.clock.time_gpu(run, repeat=5).median_ms, rounds).items():
        rows.append(dict(name=name, tflops=flops / r["ms"] / 1e9, **r))
        ctx.log(f"{name} burst rounds: {r['ms']:.3f} ms, {r['pct_library']:.1f}% of {lib} "
                f"({r['pct_low']:.1f}-{r['pct_high']:.1f})")
    return dict(rows=rows, library=lib, rounds=rounds,
                note="one short burst per kernel in turn, order reversed every other round; "
                     "% of the library: median over rounds of the per-round ratio")


def _pct(rows, base_name):
    base = next((r for r in rows if r["name"] == base_name and r.get("ms")), None)
    prev = None
    for r in rows:
        if base and r.get("ms"):
            r["pct_" + base_name.replace(" ", "_")] = 100 * base["ms"] / r["ms"]
        if r.get("step") and r.get("ms") and prev is not None:
            r["gain_over_previous"] = prev / r["ms"]
        if r.get("step") and r.get("ms"):
            prev = r["ms"]


@section("mma_gemm", lessons=("12",))
def mma_gemm(ctx):
    ctx.need("cupy", "torch.cuda")
    return [_mma_gemm_size(ctx, n) for n in SIZES]


def _mma_gemm_size(ctx, n):
    import torch

    from ..kernels import mma02_gemm_conv_cuda as MM
    from ..kernels import wgmma03_gemm_conv_tma as WG
    from ..kernels import wmma01_gemm_cuda as WM

    a, bt = _inputs(n, torch, torch.float16)
    exp, absref = _reference(a, bt)
    tol, flops = rtol_for("fp32", n), 2 * n**3
    out = torch.empty(n, n, device="cuda", dtype=torch.float32)
    b_row = bt.T.contiguous()  # WMMA reads B row-major (K, N)
    rows, runs = [], {}

    def checked(name, run, dest=out, rtol=tol, **extra):
        runs[name] = run
        _try(rows, name, lambda: dict(**extra, **_check_then_time(
            ctx, name, run, dest, exp, absref, rtol, flops)))

    checked(f"WMMA tiled {WM.GEMM_DEFAULT}", lambda: WM.gemm_wmma_raw(a, b_row, out),
            step=True)
    for step, cfg in MM.LADDER.items():
        checked(f"{step} ({cfg})", lambda cfg=cfg: MM.gemm_mma_raw(a, bt, out, cfg), step=True)
    for cfg in MM.GEMM_CANDIDATES[1:]:
        checked(f"mma.sync {cfg}", lambda cfg=cfg: MM.gemm_mma_raw(a, bt, out, cfg))
    o16 = torch.empty(n, n, device="cuda", dtype=torch.float16)
    tol16 = rtol_for("fp16", n)   # the output's rounding to fp16 on top
    for cfg in MM.GEMM_FP16_OUT:
        checked(f"mma.sync {cfg} (fp16 out)", lambda cfg=cfg: MM.gemm_mma_raw(a, bt, o16, cfg),
                dest=o16, rtol=tol16, fp16_out=True, tol=tol16)
    # the same mma.sync math fed by TMA (Hopper only): a producer warpgroup, mbarriers
    tma = f"mma.sync {WG.MMA_SYNC_TOP}"
    if torch.cuda.get_device_capability() == (9, 0):
        checked(tma, lambda: WG.gemm_wgmma_raw(a, bt, out, WG.MMA_SYNC_TOP))
        checked(f"{tma} (fp16 out)", lambda: WG.gemm_wgmma_raw(a, bt, o16, WG.MMA_SYNC_TOP),
                dest=o16, rtol=tol16, fp16_out=True, tol=tol16)
    _try(rows, "cuBLAS fp16", lambda: _library_row(ctx, "cuBLAS fp16", lambda: a @ bt.T, flops,
                                                   "fp16"))
    _pct(rows, "cuBLAS fp16")
    best = max((r for r in rows if r.get("tflops") and "cuBLAS" not in r["name"]),
               key=lambda r: r["tflops"], default=None)
    # the fastest fp32-out and fp16-out kernels again, back to back against cuBLAS, and
    # the staged cp.async tile if it is not one of them
    good = {r["name"] for r in rows if r.get("tflops")}
    ours = [max((r for r in rows if r.get("tflops") and "cuBLAS" not in r["name"]
                 and bool(r.get("fp16_out")) == f16), key=lambda r: r["tflops"], default=None)
            for f16 in (False, True)]
    names = [r["name"] for r in ours if r]
    staged = f"mma.sync {MM.GEMM_FP16_OUT[2]} (fp16 out)"
    if staged in good and staged not in names:
        names.append(staged)
    sustained = _sustained_race(ctx, [("cuBLAS fp16", lambda: a @ bt.T)] + [
        (name, runs[name]) for name in names], flops)
    # the top tile (fp32 out) and the top fp16-output tiles, each in short bursts beside
    # cuBLAS, round after round: the ratio without the drift between one row and the next
    tops = ([f"mma.sync {MM.GEMM_TOP}"] + [f"mma.sync {c} (fp16 out)" for c in MM.GEMM_FP16_OUT[1:]]
            + [f"{tma} (fp16 out)"])
    burst_rounds = _burst_rounds(ctx, [("cuBLAS fp16", lambda: a @ bt.T)] + [
        (name, runs[name]) for name in tops if name in good], flops)
    return dict(n=n, tol=tol, rows=rows, best=best and best["name"], sustained=sustained,
                burst_rounds=burst_rounds,
                note="cuBLAS writes fp16; the course's rows fp32 unless marked fp16 out")


@section("mma_peak", lessons=("12",))
def mma_peak(ctx):
    """What mma.sync can do at all on this GPU: independent mma.sync on registers only
    (no loads), 8 warps per SM and more, against which the GEMM's rate is read."""
    ctx.need("cupy", "cuda")
    import cupy as cp

    from ..kernels import mma02_gemm_conv_cuda as MM

    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    out = cp.zeros(1, cp.float32)
    rows = []
    for chains, warps in ((4, 8), (8, 8), (8, 16), (8, 32), (16, 16)):
        fn = MM.mma_peak_kernel(chains)
        iters = 4096
        flops = sms * warps * 32 // 32 * chains * iters * 4096

        def run(fn=fn, warps=warps, iters=iters):
            fn((sms,), (32 * warps,), (out, np.int32(iters)))
        tm = ctx.clock.time_gpu(run, repeat=7)
        rows.append(dict(chains=chains, warps_per_sm=warps, ms=tm.median_ms,
                         tflops=tm.tflops(flops)))
        ctx.log(f"mma.sync peak, {chains} chains, {warps} warps/SM: {rows[-1]['tflops']:.0f}")
    return dict(rows=rows, best_tflops=max(r["tflops"] for r in rows))


@section("mma_conv", lessons=("12",))
def mma_conv(ctx):
    ctx.need("cupy", "torch.cuda")
    return [_mma_conv_layer(ctx, lname) for lname in problems.RESNET]


def _conv_inputs(prob, torch, dtype):
    """x, w rounded to dtype (NCHW), their NHWC / KRSC copies, and the float64 reference
    (NHWC, CuPy) with its sum of |x||w|."""
    import cupy as cp

    F = torch.nn.functional
    kw = prob.kwargs
    rng = np.random.default_rng(3)
    x = torch.from_numpy(check.random_array(prob.x_shape, rng)).cuda().to(dtype)
    w = torch.from_numpy(check.random_array(prob.w_shape, rng)).cuda().to(dtype)
    exp = cp.asarray(F.conv2d(x.double(), w.double(), **kw).permute(0, 2, 3, 1).contiguous())
    absref = cp.asarray(F.conv2d(x.double().abs(), w.double().abs(), **kw)
                        .permute(0, 2, 3, 1).contiguous())
    return (x, w, x.permute(0, 2, 3, 1).contiguous(), w.permute(0, 2, 3, 1).contiguous(),
            exp, absref)


# cuDNN's autotuner (cudnn.benchmark) times its candidates once per cache key and keeps the
# fastest; run to run it keeps different kernels, some several % slower than its best. The
# key holds the allow_tf32 and deterministic flags, which change nothing for fp16 / bf16
# inputs: four keys are four autotunes, and the race takes the fastest of their picks.
AUTOTUNE_KEYS = tuple((tf32, det) for tf32 in (True, False) for det in (False, True))


def _cudnn_best_row(ctx, name, run, flops, label, cudnn):
    """`run` autotuned and timed under each of AUTOTUNE_KEYS (`cudnn`: torch.backends.cudnn,
    its flags restored after); the fastest pick's row, with every pick under 'autotunes'."""
    saved = cudnn.allow_tf32, cudnn.deterministic
    picks = []
    try:
        for tf32, det in AUTOTUNE_KEYS:
            cudnn.allow_tf32, cudnn.deterministic = tf32, det
            # this key's autotune runs in the timer's warm-up calls
            row = _library_row(ctx, name, run, flops, label, queued=True)
            picks.append((row, dict(allow_tf32=tf32, deterministic=det, ms=row["ms"],
                                    kernel=next((k for k in row["kernels"]
                                                 if "Memset" not in k), "?"))))
    finally:
        cudnn.allow_tf32, cudnn.deterministic = saved
    best = min(picks, key=lambda p: p[0]["ms"])[0]
    return dict(best, autotunes=[p[1] for p in picks])


def _cudnn_rows(ctx, rows, prob, x, w, label):
    import torch

    F = torch.nn.functional
    kw = prob.kwargs
    torch.backends.cudnn.benchmark = True
    x_cl = x.contiguous(memory_format=torch.channels_last)
    w_cl = w.contiguous(memory_format=torch.channels_last)
    for name, xx, ww in ((f"cuDNN {label} NHWC", x_cl, w_cl), (f"cuDNN {label}", x, w)):
        _try(rows, name, lambda name=name, xx=xx, ww=ww: _cudnn_best_row(
            ctx, name, lambda: F.conv2d(xx, ww, **kw), prob.flops, label, torch.backends.cudnn))


def _conv_tiles(ctx, prob, dtype, label, launch, chosen, candidates):
    """A layer's inputs rounded to `dtype` (NHWC), and each candidate tile of
    ``launch(x_nhwc, w_krsc, out, cfg)`` (the chosen one first) checked, then timed; the
    rows, the tolerance, the inputs and the float64 reference (NHWC) with its sum of
    |x||w|."""
    import torch

    x, w, x_nhwc, w_krsc, exp, absref = _conv_inputs(prob, torch, dtype)
    N, K, P, Q = prob.out_shape
    out = torch.empty(N, P, Q, K, device="cuda", dtype=torch.float32)
    tol = rtol_for("fp32", prob.C * prob.R * prob.S)
    rows = []
    for cfg in [chosen] + [c for c in candidates if c != chosen]:
        _try(rows, str(cfg), lambda cfg=cfg: dict(chosen=cfg == chosen, **_check_then_time(
            ctx, f"{label} {cfg}", lambda: launch(x_nhwc, w_krsc, out, cfg), out, exp, absref,
            tol, prob.flops, queued=True)))
    return rows, tol, x, w, x_nhwc, w_krsc, exp, absref


def _mma_conv_layer(ctx, lname):
    import cupy as cp
    import torch

    from ..kernels import mma02_gemm_conv_cuda as MM
    from ..kernels._launch import sm_count

    prob = problems.conv_layer(lname)
    kw = prob.kwargs
    N, K, P, Q = prob.out_shape
    chosen = MM.choose_conv(K, N * P * Q, sm_count())
    rows, tol, xh, wh, x_nhwc, w_krsc, exp, absref = _conv_tiles(
        ctx, prob, torch.float16, "mma.sync conv",
        lambda x, w, out, cfg: MM.conv2d_mma_nhwc(x, w, out, cfg=cfg, **kw), chosen,
        MM.CONV_CANDIDATES)
    out16 = torch.empty(N, P, Q, K, device="cuda", dtype=torch.float16)
    crs = prob.C * prob.R * prob.S
    # the chosen tile without the conv's switches, then with one more each (fp16 out); the
    # sliced K last, where the chosen tile has it
    one = dict(KSLICE=1)
    steps = [("gather", dict(TAPS=0, FRAG_PIPE=0, EPI_SMEM=0, **one)),
             ("+ taps", dict(FRAG_PIPE=0, EPI_SMEM=0, **one)),
             ("+ frag pipe", dict(EPI_SMEM=0, **one))]
    if chosen.KSLICE > 1:
        steps.append(("+ staged epilogue", one))
    for step, off in steps:
        cfg = replace(chosen, **off)
        _try(rows, step, lambda cfg=cfg, step=step: dict(fp16_out=True, conv_step=step,
             **_check_then_time(ctx, f"mma.sync conv (fp16 out) {cfg}",
                                lambda: MM.conv2d_mma_nhwc(x_nhwc, w_krsc, out16, cfg=cfg, **kw),
                                out16, exp, absref, rtol_for("fp16", crs), prob.flops,
                                queued=True)))
    last = "+ sliced K" if chosen.KSLICE > 1 else "+ staged epilogue"
    _try(rows, "fp16 out", lambda: dict(fp16_out=True, conv_step=last,
                                        **_check_then_time(
        ctx, "mma.sync conv (fp16 out)", lambda: MM.conv2d_mma_nhwc(x_nhwc, w_krsc, out16, **kw),
        out16, exp, absref, rtol_for("fp16", crs), prob.flops, queued=True)))
    x32, w32 = cp.asarray(xh.float()), cp.asarray(wh.float())
    o_nchw = cp.empty(prob.out_shape, cp.float32)
    exp_nchw, abs_nchw = (cp.ascontiguousarray(e.transpose(0, 3, 1, 2)) for e in (exp, absref))
    _try(rows, "NCHW fp32 call", lambda: _check_then_time(
        ctx, "mma.sync conv, NCHW fp32 in/out (transforms counted)",
        lambda: MM.conv2d_mma(x32, w32, o_nchw, **kw), torch.as_tensor(o_nchw, device="cuda"),
        exp_nchw, abs_nchw, tol, prob.flops, queued=True))
    _cudnn_rows(ctx, rows, prob, xh, wh, "fp16")
    _pct(rows, "cuDNN fp16 NHWC")
    _pct(rows, "cuDNN fp16")
    return dict(layer=lname, problem=str(prob), tol=tol, rows=rows)


def smoke(timeout_s: float = 120) -> dict:
    """Run each wgmma kernel once on a small problem in a child process: a hang (wrong
    mbarrier phase) becomes a timeout here instead of a stuck GPU."""
    code = ("from convlab.measure.tensor_cores import _smoke_child; _smoke_child()")
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return dict(ok=False, why=f"timed out after {timeout_s} s")
    return dict(ok=p.returncode == 0, why=(p.stdout + p.stderr)[-2000:])


def _smoke_child():
    from .. import runtime

    runtime.setup()
    import torch

    from ..kernels import wgmma03_gemm_conv_tma as WG

    a, bt = _inputs(256, torch, torch.bfloat16)
    out = torch.empty(256, 256, device="cuda")
    WG.gemm_wgmma_raw(a, bt, out)
    torch.cuda.synchronize()
    err = (out.double() - a.double() @ bt.double().T).abs().max().item()
    print("gemm max abs err", err)
    x = torch.randn(2, 8, 8, 64, device="cuda").bfloat16()
    w = torch.randn(64, 3, 3, 64, device="cuda").bfloat16()
    o = torch.empty(2, 8, 8, 64, device="cuda")
    WG.conv2d_wgmma_nhwc(x, w, o, padding=1)
    torch.cuda.synchronize()
    ref = torch.nn.functional.conv2d(x.double().permute(0, 3, 1, 2),
                                     w.double().permute(0, 3, 1, 2), padding=1)
    err2 = (o.double() - ref.permute(0, 2, 3, 1)).abs().max().item()
    print("conv max abs err", err2)
    assert err < 1e-2 and err2 < 1e-2, (err, err2)


_SMOKE: dict = {}


def _need_hopper(ctx):
    ctx.need("cupy", "torch.cuda")
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        raise Skip("wgmma + TMA need compute capability 9.0")
    s = _SMOKE.get("result") or _SMOKE.setdefault("result", smoke())
    if not s["ok"]:
        raise RuntimeError("wgmma smoke test failed: " + s["why"])


@section("wgmma_gemm", lessons=("12",))
def wgmma_gemm(ctx):
    _need_hopper(ctx)
    return [_wgmma_gemm_size(ctx, n) for n in SIZES]


def _wgmma_gemm_size(ctx, n):
    import torch

    from ..kernels import wgmma03_gemm_conv_tma as WG

    rows, runs = [], {}
    flops, tol = 2 * n**3, rtol_for("fp32", n)
    out = torch.empty(n, n, device="cuda", dtype=torch.float32)
    for prec, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        a, bt = _inputs(n, torch, dt)
        exp, absref = _reference(a, bt)
        runs[f"cuBLAS {prec}"] = lambda a=a, bt=bt: a @ bt.T
        for cfg in WG.GEMM_CANDIDATES if prec == "bf16" else WG.GEMM_CANDIDATES[:1]:
            name = f"wgmma {prec} {cfg}"
            runs[name] = lambda cfg=cfg, a=a, bt=bt: WG.gemm_wgmma_raw(a, bt, out, cfg)
            _try(rows, name, lambda name=name, exp=exp, absref=absref, prec=prec: dict(
                precision=prec, **_check_then_time(ctx, name, runs[name], out, exp, absref,
                                                   tol, flops)))
        o16 = torch.empty(n, n, device="cuda", dtype=dt)
        _try(rows, f"{prec} out", lambda a=a, bt=bt, prec=prec, o16=o16, exp=exp, absref=absref:
             dict(precision=prec, **_check_then_time(
                 ctx, f"wgmma {prec} {WG.GEMM_DEFAULT} ({prec} out)",
                 lambda: WG.gemm_wgmma_raw(a, bt, o16), o16, exp, absref, rtol_for(prec, n),
                 flops)))
        _try(rows, f"cuBLAS {prec}", lambda a=a, bt=bt, prec=prec: _library_row(
            ctx, f"cuBLAS {prec}", lambda: a @ bt.T, flops, prec))
    a32, bt32 = _inputs(n, torch, torch.float32)
    for prec in ("fp32", "tf32"):
        baselines.set_torch_precision(prec)
        _try(rows, f"cuBLAS {prec}", lambda prec=prec: _library_row(
            ctx, f"cuBLAS {prec}", lambda: a32 @ bt32.T, flops, prec))
    baselines.set_torch_precision("fp32")
    if hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn"):
        a8, b8 = a32.to(torch.float8_e4m3fn), bt32.to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        _try(rows, "cuBLAS fp8", lambda: _library_row(
            ctx, "cuBLAS fp8 (e4m3, bf16 out)", lambda: torch._scaled_mm(
                a8, b8.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), flops, "fp8"))
    _pct(rows, "cuBLAS bf16")
    _pct(rows, "cuBLAS fp16")
    best = max((r for r in rows if r.get("tflops") and r["name"] in runs and r.get(
        "precision") == "bf16" and "cuBLAS" not in r["name"]), key=lambda r: r["tflops"],
               default=None)
    sustained = _sustained_race(ctx, [("cuBLAS bf16", runs["cuBLAS bf16"])] + (
        [(best["name"], runs[best["name"]])] if best else []), flops)
    return dict(n=n, tol=tol, rows=rows, sustained=sustained)


@section("wgmma_conv", lessons=("12",))
def wgmma_conv(ctx):
    _need_hopper(ctx)
    return [_wgmma_conv_layer(ctx, lname) for lname in problems.RESNET]


def _wgmma_conv_layer(ctx, lname):
    import torch

    from ..kernels import wgmma03_gemm_conv_tma as WG

    prob = problems.conv_layer(lname)
    kw = prob.kwargs
    N, K, P, Q = prob.out_shape
    chosen = WG.choose_conv(K)
    geom = dict(padding=kw.get("padding", 0), dilation=kw.get("dilation", 1))
    rows, tol, xb, wb, x_nhwc, w_krsc, exp, absref = _conv_tiles(
        ctx, prob, torch.bfloat16, "wgmma conv",
        lambda x, w, out, cfg: WG.conv2d_wgmma_nhwc(x, w, out, cfg=cfg, **geom), chosen,
        WG.CONV_CANDIDATES)
    out16 = torch.empty(N, P, Q, K, device="cuda", dtype=torch.bfloat16)
    _try(rows, "bf16 out", lambda: _check_then_time(
        ctx, f"wgmma conv {chosen} (bf16 out)",
        lambda: WG.conv2d_wgmma_nhwc(x_nhwc, w_krsc, out16, cfg=chosen, **geom), out16, exp,
        absref, rtol_for("bf16", prob.C * prob.R * prob.S), prob.flops, queued=True))
    _cudnn_rows(ctx, rows, prob, xb, wb, "bf16")
    _pct(rows, "cuDNN bf16 NHWC")
    _pct(rows, "cuDNN bf16")
    return dict(layer=lname, problem=str(prob), tol=tol, rows=rows)
