"""Issue 4: does convlab.trace predict the measured speed difference between the naive
(conv01) and the coalesced (conv02) conv kernels on a GPU? One device call:

    . tools/device_env.sh; CONVLAB_MODE=gpu python3 tools/gpu/trace_vs_measured.py "$OUT"

For each problem (four memory-bound single/few-channel 3x3 convs of different shapes,
and the batch-32 128-channel 28x28 layer as a not-memory-bound control):
1. traces both kernels on the CPU (also in GPU mode: the tracer runs the kernels' Python
   source) on a tiny stand-in with the timed problem's block/warp spatial pattern, checked
   (see `stand_in`), and reports the two predictions of `trace.compare`: raw sectors per
   load request (L1 work) and after-L1 sectors per request (traffic to L2/DRAM);
2. checks, then times both kernels and cuDNN (fp32, TF32 off) with CUDA events (median),
   via convlab.bench.bench_conv, on the full-size problem.
Prints the table last; JSON to OUT/trace_vs_measured.json.
--dry: tracing only (runs under the simulator on any machine, in well under a minute).
Run 1 (one memory-bound problem, this script's predecessor): results/trace_h200_2026-11-29.*.
"""

import datetime
import importlib.metadata as md
import json
import os
import platform
import sys
import time

import numpy as np

import convlab

MODE = convlab.setup()

from convlab import check, kernels, trace  # noqa: E402
from convlab import reference as ref  # noqa: E402
from convlab.kernels import conv01_naive, conv02_coalesced  # noqa: E402
from convlab.problems import GPU_LAYERS, ConvProblem  # noqa: E402

DRY = "--dry" in sys.argv
OUT = next((a for a in sys.argv[1:] if not a.startswith("--")), ".")
KERNELS = ("naive", "coalesced")

PROBLEMS = {  # label: (timed problem, memory-bound by construction?)
    "1ch 4096x4096": (ConvProblem("1ch H4096 W4096 3x3", 1, 1, 4096, 4096, 1), True),
    "1ch 2048x8192 (W large)": (ConvProblem("1ch H2048 W8192 3x3", 1, 1, 2048, 8192, 1), True),
    "1ch 16384x256 (W small)": (ConvProblem("1ch H16384 W256 3x3", 1, 1, 16384, 256, 1), True),
    "4ch 2048x2048 K=4": (ConvProblem("4ch H2048 W2048 3x3 K4", 1, 4, 2048, 2048, 4), True),
    "128ch 28x28 b32 (control)": (GPU_LAYERS["resnet128"], False),
}
THREAD_BUDGET = 8192  # traced (thread x channel) per kernel: ~1-3 s each on one CPU core


def stand_in(prob: ConvProblem, rows=None):
    """(x shape, w shape, checks) of a tiny problem with `prob`'s spatial access pattern.

    What decides sectors per request and per block: the block shape (fixed by the
    launcher), R, S, stride, padding, and where each image row starts within a 128-byte
    line, i.e. W mod 32 (allocations are 256-byte aligned). N and K only add identical
    blocks (blockIdx.z = n K + k; w reads are warp broadcasts), so the stand-in has N = K = 1;
    C multiplies the loop, not the pattern, so it keeps at most 16 channels.
    """
    assert prob.stride == 1 and prob.dilation == 1 and prob.groups == 1
    C = min(prob.C, 16)
    W = prob.W if prob.W <= 256 else 128 + prob.W % 32
    H = rows or max(32, min(64, THREAD_BUDGET // (W * C) // 32 * 32))
    H = min(H, prob.H)
    bx = conv01_naive.BLOCK
    assert bx == conv02_coalesced.BLOCK == (32, 8)
    checks = {
        "block (32, 8) in both kernels": True,
        "same R, S, padding, stride 1": True,
        f"W mod 32 equal ({W % 32} = {prob.W % 32}): rows start alike within 128-byte lines":
            W % 32 == prob.W % 32,
        "coalesced: an interior warp per row (W >= 96 or W equal)": W >= 96 or W == prob.W,
        "naive: a full 32-row block (H >= 32 or H equal)": H >= 32 or H == prob.H,
        "every channel of the timed problem kept (else intensity is a lower bound)":
            C == prob.C,
    }
    must = [k for k in list(checks)[:5] if not checks[k]]
    assert not must, f"stand-in for {prob.name} does not match: {must}"
    return (1, C, H, W), (1, C, prob.R, prob.S), checks


def trace_pair(xs, ws, padding, rng):
    """Trace both kernels on x xs, w ws; check their outputs; return (traces, seconds)."""
    x, w = check.random_array(xs, rng), check.random_array(ws, rng)
    expected = ref.conv2d(x, w, padding=padding)
    traces, secs = {}, {}
    for name in KERNELS:
        out = check.poisoned(expected.shape)
        t0 = time.perf_counter()
        traces[name] = trace.trace_launch(kernels.CONV_LADDER[name], x, w, out,
                                          padding=padding)
        secs[name] = round(time.perf_counter() - t0, 2)
        err = float(np.abs(out - expected).max())
        assert err < 1e-4, f"traced {name} gave a wrong answer (max error {err})"
    return traces, secs


def trace_part():
    rng = np.random.default_rng(4)
    cache, res = {}, {}
    for label, (prob, _) in PROBLEMS.items():
        xs, ws, checks = stand_in(prob)
        key = (xs, ws, prob.padding)
        if key not in cache:
            cache[key] = trace_pair(xs, ws, prob.padding, rng)
        traces, secs = cache[key]
        c = trace.compare(traces["naive"], traces["coalesced"], names=KERNELS, array="x")
        res[label] = dict(
            timed=str(prob), stand_in=dict(x=list(xs), w=list(ws), checks=checks),
            trace_s=secs, compare=c.as_dict(),
            stores={k: t.sectors_per_request("store") for k, t in traces.items()},
            predicted=dict(raw=c.raw_ratio, after_l1=c.l2_ratio))
        print(f"trace {label:27s} stand-in x{xs}: raw {c.raw_ratio:.2f}x, after L1 "
              f"{c.l2_ratio:.2f}x, FLOP per after-L1 byte {c.intensity[0]:.2f} / "
              f"{c.intensity[1]:.2f} (traced in {secs['naive']} + {secs['coalesced']} s)",
              flush=True)
    # Is the stand-in big enough? The first problem again, 4x the threads (64 x 256):
    # the predicted ratios should barely move.
    prob = PROBLEMS["1ch 4096x4096"][0]
    xs, ws, _ = stand_in(prob)
    big = (1, 1, 64, 256)
    traces, secs = trace_pair(big, ws, prob.padding, rng)
    c = trace.compare(traces["naive"], traces["coalesced"], names=KERNELS, array="x")
    first = res["1ch 4096x4096"]["predicted"]
    res["stand_in_size_check"] = dict(
        small=dict(x=list(xs), **first), big=dict(x=list(big), raw=c.raw_ratio,
                                                 after_l1=c.l2_ratio), trace_s=secs)
    print(f"stand-in size check, 1ch 4096x4096: x{xs} raw {first['raw']:.2f}x after L1 "
          f"{first['after_l1']:.2f}x; x{big} raw {c.raw_ratio:.2f}x after L1 "
          f"{c.l2_ratio:.2f}x", flush=True)
    # the issue's speed claim: tracing a 64x64 conv kernel takes seconds
    x64 = check.random_array((1, 1, 64, 64), rng)
    w3 = check.random_array((1, 1, 3, 3), rng)
    t0 = time.perf_counter()
    trace.trace_launch(kernels.conv2d_coalesced, x64, w3, check.poisoned((1, 1, 64, 64)),
                       padding=1)
    res["trace_64x64_s"] = round(time.perf_counter() - t0, 2)
    print(f"tracing a 64x64 3x3 conv (4096 threads, coalesced kernel): "
          f"{res['trace_64x64_s']} s on this machine's CPU", flush=True)
    return res


def time_part():
    from convlab import baselines, bench

    res = {}
    for label, (prob, _) in PROBLEMS.items():
        impls = [bench.launcher_impl(n, kernels.CONV_LADDER[n], prob) for n in KERNELS]
        if baselines.torch_available():
            impls.append(baselines.cudnn_conv_impl(prob, "fp32", name="cuDNN fp32"))
        t0 = time.perf_counter()
        lad = bench.bench_conv(impls, prob, baseline="cuDNN fp32", repeat=10, verbose=False)
        res[label] = lad.to_dict()
        print(f"timed {label} in {time.perf_counter() - t0:.1f} s: "
              + ", ".join(f"{r.name} {r.ms:.4f} ms" for r in lad.rows), flush=True)
    return res


def versions():
    v = {"python": platform.python_version(), "convlab_mode": MODE}
    for d in ("numpy", "numba", "numba-cuda", "torch", "cupy-cuda13x", "cupy-cuda12x"):
        try:
            v[d] = md.version(d)
        except md.PackageNotFoundError:
            pass
    return v


def main():
    os.makedirs(OUT, exist_ok=True)
    t_start = time.perf_counter()
    info = dict(date=datetime.date.today().isoformat(), versions=versions(),
                command="CONVLAB_MODE=gpu python3 tools/gpu/trace_vs_measured.py $OUT",
                model=trace.WHICH_PREDICTS)
    gpu = MODE == "gpu" and not DRY
    if gpu:
        from convlab import bench

        dev = kernels._runtime.cuda().get_current_device()
        info["device"] = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
        info["driver"] = convlab.runtime.driver_info()["driver"]
    traced = trace_part()
    info["trace"] = traced
    timed = time_part() if gpu else {}
    info["timed"] = timed
    if gpu:
        info["copy_gbps"] = bench.copy_bandwidth()
    info["wall_s"] = round(time.perf_counter() - t_start, 1)
    table = []
    for label, (prob, membound) in PROBLEMS.items():
        tr = traced[label]
        rows = {r["name"]: r for r in timed.get(label, {}).get("rows", [])}
        inten = dict(zip(KERNELS, tr["compare"]["intensity"], strict=True))
        row = dict(problem=label, memory_bound=membound, raw=tr["predicted"]["raw"],
                   after_l1=tr["predicted"]["after_l1"], flop_per_l2_byte=inten["coalesced"])
        if "naive" in rows and "coalesced" in rows:
            co = rows["coalesced"]
            row.update(naive_ms=rows["naive"]["ms"], coalesced_ms=co["ms"],
                       measured=rows["naive"]["ms"] / co["ms"], coalesced_gbps=co["gbps"],
                       cudnn_ms=rows.get("cuDNN fp32", {}).get("ms"))
            # the modelled after-L1 traffic of the timed problem per second (stand-in's
            # FLOP per after-L1 byte; a lower bound on traffic where the stand-in has
            # fewer channels): how close each kernel runs to an L2 / DRAM limit
            for k in KERNELS:
                row[f"{k}_l2_gbps"] = prob.flops / inten[k] / (rows[k]["ms"] * 1e-3) / 1e9
            if info.get("copy_gbps"):
                row["coalesced_pct_copy"] = 100 * co["gbps"] / info["copy_gbps"]
        table.append(row)
    info["table"] = table
    with open(os.path.join(OUT, "trace_vs_measured.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"\n{info.get('device', MODE)}; {info['versions']}; {info['wall_s']} s")
    print("predicted = naive / coalesced from convlab.trace (raw: sectors per x load request;"
          " after L1: distinct x sectors per block per request); measured = naive ms / "
          "coalesced ms; FLOP/B: coalesced, per after-L1 byte (stand-in); GB/s: compulsory "
          "bytes / coalesced time; L2 GB/s: modelled after-L1 bytes / time, naive | coalesced")
    print(f"{'problem':27s}{'raw':>7s}{'afterL1':>8s}{'measured':>9s}{'FLOP/B':>7s}"
          f"{'naive ms':>9s}{'coal ms':>8s}{'cuDNN ms':>9s}{'GB/s':>6s}{'L2 GB/s':>12s}")

    def f(r, k, fmt):
        return format(r[k], fmt) if r.get(k) is not None else "-"

    for r in table:
        l2 = f"{f(r, 'naive_l2_gbps', '.0f')}|{f(r, 'coalesced_l2_gbps', '.0f')}"
        print(f"{r['problem']:27s}{r['raw']:6.2f}x{r['after_l1']:7.2f}x"
              f"{f(r, 'measured', '8.2f') + 'x' if r.get('measured') else '-':>9s}"
              f"{r['flop_per_l2_byte']:7.2f}"
              f"{f(r, 'naive_ms', '9.3f')}{f(r, 'coalesced_ms', '8.3f')}{f(r, 'cudnn_ms', '9.3f')}"
              f"{f(r, 'coalesced_gbps', '6.0f')}{l2:>12s}")


if __name__ == "__main__":
    main()
