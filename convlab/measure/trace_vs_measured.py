"""Does convlab.trace predict the measured speed-up of coalescing? (lesson 05)

For each problem (four memory-bound single/few-channel 3x3 convs of different shapes, and
the batch-32 128-channel 28x28 layer as a not-memory-bound control):

1. "trace": both kernels (conv01 naive, conv02 coalesced) traced on the CPU on a tiny
   stand-in with the timed problem's block/warp spatial pattern (checked, see `stand_in`),
   with the two predictions of `trace.compare`: raw sectors per load request (L1 work)
   and after-L1 sectors per request (traffic to L2/DRAM);
2. "timed": both kernels and cuDNN (fp32, TF32 off) checked, then timed on the full-size
   problem (`bench.bench_conv`);
3. "table": prediction beside measurement, per problem.

Stored flat (trace_vs_measured.json: date, versions, device, trace, timed, table).
"""

from __future__ import annotations

import time

import numpy as np

from .. import check, problems
from .. import reference as ref
from ..problems import ConvProblem
from .harness import Group

GROUP = Group("trace_vs_measured", layout="flat")
section = GROUP.section
KERNELS = ("naive", "coalesced")
THREAD_BUDGET = 8192  # traced (thread x channel) per kernel: ~1-3 s each on one CPU core


def cases(ctx) -> dict:
    """label: (timed problem, memory-bound by construction?)."""
    if ctx.dry:
        return {"1ch 20x24 (dry)": (ConvProblem("1ch H20 W24 3x3", 1, 1, 20, 24, 1), True)}
    return {
        "1ch 4096x4096": (ConvProblem("1ch H4096 W4096 3x3", 1, 1, 4096, 4096, 1), True),
        "1ch 2048x8192 (W large)": (ConvProblem("1ch H2048 W8192 3x3", 1, 1, 2048, 8192, 1),
                                    True),
        "1ch 16384x256 (W small)": (ConvProblem("1ch H16384 W256 3x3", 1, 1, 16384, 256, 1),
                                    True),
        "4ch 2048x2048 K=4": (ConvProblem("4ch H2048 W2048 3x3 K4", 1, 4, 2048, 2048, 4), True),
        "128ch 28x28 b32 (control)": (problems.GPU_LAYERS["resnet128"], False),
    }


def _env(ctx) -> dict:
    from .. import trace

    env = dict(model=trace.WHICH_PREDICTS)
    if not ctx.dry:
        from ..runtime import driver_info

        env["driver"] = driver_info().get("driver")
    return env


GROUP.environment = _env


def stand_in(prob: ConvProblem, rows=None):
    """(x shape, w shape, checks) of a tiny problem with `prob`'s spatial access pattern.

    What decides sectors per request and per block: the threads per block (both kernels
    walk one (image, filter) plane's P*Q pixels, THREADS at a time: the coalesced one
    along rows, the naive one along columns), R, S, stride, padding, where each image
    row starts within a 128-byte line, i.e. W mod 32 (allocations are 256-byte aligned),
    and where a warp wraps from one column to the next, H mod 32. N and K only add
    identical planes (w reads are warp broadcasts), so the stand-in has N = K = 1; C
    multiplies the loop, not the pattern, so it keeps at most 16 channels.
    """
    from ..kernels import conv01_naive, conv02_coalesced

    if not (prob.stride == 1 and prob.dilation == 1 and prob.groups == 1):
        raise ValueError(f"stand_in: {prob.name} needs stride 1, dilation 1, groups 1")
    C = min(prob.C, 16)
    W = prob.W if prob.W <= 256 else 128 + prob.W % 32
    H = rows or max(32, min(64, THREAD_BUDGET // (W * C) // 32 * 32))
    H = min(H, prob.H)
    threads = getattr(conv01_naive, "THREADS", None)
    checks = {
        f"{threads} threads per block in both kernels":
            threads is not None and threads == getattr(conv02_coalesced, "THREADS", None),
        "same R, S, padding, stride 1": True,
        f"W mod 32 equal ({W % 32} = {prob.W % 32}): rows start alike within 128-byte lines":
            W % 32 == prob.W % 32,
        f"H mod 32 equal ({H % 32} = {prob.H % 32}): naive warps wrap alike at column ends":
            H % 32 == prob.H % 32,
        "coalesced: an interior warp per row (W >= 96 or W equal)": W >= 96 or W == prob.W,
        "naive: a full warp per column (H >= 32 or H equal)": H >= 32 or H == prob.H,
        "every channel of the timed problem kept (else intensity is a lower bound)":
            C == prob.C,
    }
    must = [k for k in list(checks)[:6] if not checks[k]]
    if must:
        raise ValueError(f"stand-in for {prob.name} does not match: {must}")
    return (1, C, H, W), (1, C, prob.R, prob.S), checks


def trace_pair(xs, ws, padding, rng):
    """Trace both kernels on x xs, w ws; check their outputs; return (traces, seconds)."""
    from .. import kernels, trace

    x, w = check.random_array(xs, rng), check.random_array(ws, rng)
    expected = ref.conv2d(x, w, padding=padding)
    traces, secs = {}, {}
    for name in KERNELS:
        out = check.poisoned(expected.shape)
        t0 = time.perf_counter()
        traces[name] = trace.trace_launch(kernels.CONV_LADDER[name], x, w, out, padding=padding)
        secs[name] = round(time.perf_counter() - t0, 2)
        err = float(np.nanmax(np.abs(out - expected)))
        if not err < 1e-4:
            raise check.CheckError(f"traced {name} gave a wrong answer (max error {err})")
    return traces, secs


@section("trace", lessons=("05",))
def trace_part(ctx):
    from .. import kernels, trace

    rng = np.random.default_rng(4)
    cache, res = {}, {}
    probs = cases(ctx)
    for label, (prob, _) in probs.items():
        xs, ws, checks = stand_in(prob)
        key = (xs, ws, prob.padding)
        if key not in cache:
            cache[key] = trace_pair(xs, ws, prob.padding, rng)
        traces, secs = cache[key]
        c = trace.compare(traces["naive"], traces["coalesced"], names=KERNELS, array="x",
                          flops=ref.conv2d_flops(xs, ws, padding=prob.padding))
        res[label] = dict(
            timed=str(prob), stand_in=dict(x=list(xs), w=list(ws), checks=checks),
            trace_s=secs, compare=c.as_dict(),
            stores={k: t.sectors_per_request("store") for k, t in traces.items()},
            predicted=dict(raw=c.raw_ratio, after_l1=c.l2_ratio))
        ctx.log(f"trace {label:27s} stand-in x{xs}: raw {c.raw_ratio:.2f}x, after L1 "
                f"{c.l2_ratio:.2f}x (traced in {secs['naive']} + {secs['coalesced']} s)")
    if ctx.dry:
        return res
    # Is the stand-in big enough? The first problem again, 4x the threads (64 x 256): the
    # predicted ratios should barely move.
    first_label = next(iter(probs))
    prob = probs[first_label][0]
    xs, ws, _ = stand_in(prob)
    big = (1, 1, 64, 256)
    traces, secs = trace_pair(big, ws, prob.padding, rng)
    c = trace.compare(traces["naive"], traces["coalesced"], names=KERNELS, array="x",
                      flops=ref.conv2d_flops(big, ws, padding=prob.padding))
    first = res[first_label]["predicted"]
    res["stand_in_size_check"] = dict(
        small=dict(x=list(xs), **first), big=dict(x=list(big), raw=c.raw_ratio,
                                                 after_l1=c.l2_ratio), trace_s=secs)
    # how long tracing a 64x64 conv kernel takes (4096 threads)
    x64 = check.random_array((1, 1, 64, 64), rng)
    w3 = check.random_array((1, 1, 3, 3), rng)
    t0 = time.perf_counter()
    trace.trace_launch(kernels.conv2d_coalesced, x64, w3, check.poisoned((1, 1, 64, 64)),
                       padding=1)
    res["trace_64x64_s"] = round(time.perf_counter() - t0, 2)
    return res


def _timed_problem(ctx, prob):
    """The problem timed: full size on a GPU; the stand-in itself in a dry run."""
    if not ctx.dry:
        return prob
    xs, ws, _ = stand_in(prob)
    return ConvProblem(prob.name + " (stand-in)", *xs[:2], *xs[2:], ws[0], padding=prob.padding)


@section("timed", lessons=("05",))
def time_part(ctx):
    from .. import baselines, bench, kernels

    res = {}
    for label, (prob, _) in cases(ctx).items():
        prob = _timed_problem(ctx, prob)
        impls = [bench.launcher_impl(n, kernels.CONV_LADDER[n], prob) for n in KERNELS]
        if baselines.torch_available():
            impls.append(baselines.cudnn_conv_impl(prob, "fp32", name="cuDNN fp32"))
        lad = bench.bench_conv(impls, prob, baseline="cuDNN fp32", repeat=10, verbose=False,
                               clock=ctx.clock)
        res[label] = lad.to_dict()
        ctx.log(f"timed {label}: " + ", ".join(f"{r.name} {r.ms:.4f} ms" for r in lad.rows))
    return res


@section("copy_gbps", lessons=("05",))
def copy_gbps(ctx):
    return ctx.clock.copy_bandwidth()


@section("table", lessons=("05",))
def table(ctx):
    """Prediction beside measurement per problem (from "trace", "timed", "copy_gbps")."""
    traced, timed = ctx.result("trace") or {}, ctx.result("timed") or {}
    copy = ctx.result("copy_gbps")
    rows = []
    for label, (prob, membound) in cases(ctx).items():
        if label not in traced:
            continue
        tr = traced[label]
        got = {r["name"]: r for r in timed.get(label, {}).get("rows", [])}
        inten = dict(zip(KERNELS, tr["compare"]["intensity"], strict=True))
        row = dict(problem=label, memory_bound=membound, raw=tr["predicted"]["raw"],
                   after_l1=tr["predicted"]["after_l1"], flop_per_l2_byte=inten["coalesced"])
        if "naive" in got and "coalesced" in got:
            co = got["coalesced"]
            prob = _timed_problem(ctx, prob)
            row.update(naive_ms=got["naive"]["ms"], coalesced_ms=co["ms"],
                       measured=got["naive"]["ms"] / co["ms"], coalesced_gbps=co["gbps"],
                       cudnn_ms=got.get("cuDNN fp32", {}).get("ms"))
            # the modelled after-L1 traffic per second (the stand-in's FLOP per after-L1
            # byte; a lower bound where the stand-in has fewer channels)
            for k in KERNELS:
                row[f"{k}_l2_gbps"] = prob.flops / inten[k] / (got[k]["ms"] * 1e-3) / 1e9
            if isinstance(copy, float):
                row["coalesced_pct_copy"] = 100 * co["gbps"] / copy
        rows.append(row)
        ctx.log(f"{label:27s} predicted raw {row['raw']:.2f}x after L1 {row['after_l1']:.2f}x"
                + (f", measured {row['measured']:.2f}x" if "measured" in row else ""))
    return rows
