"""Issue 4 device run: does convlab.trace's sectors-per-request ratio predict the measured
speed difference between the naive and the coalesced conv kernels on an H200?

    . tools/device_env.sh; CONVLAB_MODE=gpu python3 results/trace_h200_run.py "$OUT"

1. Traces both kernels in GPU mode (numba's real CUDA target imported; the tracer runs
   the kernels' Python source on the CPU) on tiny problems with the same spatial access
   pattern as the timed layers. 2. Checks, then times both kernels (CUDA events) with
   cuDNN (fp32, TF32 off) in the same run, on the batch-32 128ch 28x28 3x3 layer and on a
   memory-bound single-channel 4096x4096 3x3 filter. Prints a table last; JSON in OUT.
   --dry: only the tracing part (runs under the simulator too).
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
from convlab.problems import GPU_LAYERS, ConvProblem  # noqa: E402

DRY = "--dry" in sys.argv
OUT = next((a for a in sys.argv[1:] if not a.startswith("--")), ".")

# Tiny stand-ins with the timed problems' spatial pattern (W, padding, block shape):
# sectors per request depend on W and the warp's layout, not on N, C or K.
TRACED = {
    "128ch 28x28": ((1, 2, 28, 28), (2, 2, 3, 3)),
    "1ch 4096x4096": ((1, 1, 64, 128), (1, 1, 3, 3)),
}
TIMED = {
    "128ch 28x28": GPU_LAYERS["resnet128"],
    "1ch 4096x4096": ConvProblem("1ch 4096x4096 filter (memory-bound)", 1, 1, 4096, 4096, 1),
}


def versions():
    v = {"python": platform.python_version(), "convlab_mode": MODE}
    for d in ("numpy", "numba", "numba-cuda", "torch", "cupy-cuda13x", "cupy-cuda12x"):
        try:
            v[d] = md.version(d)
        except md.PackageNotFoundError:
            pass
    return v


def trace_part():
    rng = np.random.default_rng(4)
    rows = {}
    for label, (xs, ws) in TRACED.items():
        x, w = check.random_array(xs, rng), check.random_array(ws, rng)
        for name in ("naive", "coalesced"):
            out = check.poisoned((xs[0], ws[0], xs[2], xs[3]))
            t0 = time.perf_counter()
            t = trace.trace_launch(kernels.CONV_LADDER[name], x, w, out, padding=1)
            dt = time.perf_counter() - t0
            err = float(np.abs(out - ref.conv2d(x, w, padding=1)).max())
            assert err < 1e-4, f"traced {name} gave a wrong answer ({err})"
            fp = t.cache_footprint(array="x")
            rows[(label, name)] = dict(
                traced_shape=f"x{xs} w{ws}", threads=t.launches[0]["threads"],
                trace_s=round(dt, 2),
                x_sectors_per_req=round(t.sectors_per_request("load", array="x"), 3),
                x_ideal_per_req=round(t.ideal_sectors_per_request("load", array="x"), 3),
                store_sectors_per_req=round(t.sectors_per_request("store"), 3),
                loads_per_output=round(t.loads_per_output("out"), 3),
                x_sectors_requested=fp["requested"], x_sectors_per_block=fp["per_block"],
                x_sectors_per_launch=fp["per_launch"])
            print(f"trace {label:14s} {name:9s}", rows[(label, name)], flush=True)
    return rows


def time_part():
    from convlab import baselines, bench

    res = {}
    for label, prob in TIMED.items():
        impls = [bench.launcher_impl(n, kernels.CONV_LADDER[n], prob)
                 for n in ("naive", "coalesced")]
        if baselines.torch_available():
            impls.append(baselines.cudnn_conv_impl(prob, "fp32", name="cuDNN fp32"))
        lad = bench.bench_conv(impls, prob, baseline="cuDNN fp32", repeat=10, verbose=True)
        res[label] = lad.to_dict()
    return res


def main():
    os.makedirs(OUT, exist_ok=True)
    info = dict(date=datetime.date.today().isoformat(), versions=versions())
    if MODE == "gpu" and not DRY:
        from numba import cuda

        dev = cuda.get_current_device()
        info["device"] = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
        info["driver"] = convlab.runtime.driver_info()["driver"]
    traced = trace_part()
    info["trace"] = {f"{k[0]} | {k[1]}": v for k, v in traced.items()}
    timed = {} if DRY or MODE != "gpu" else time_part()
    info["timed"] = timed
    with open(os.path.join(OUT, "trace_h200.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"\n{info.get('device', MODE)}; {info['versions']}")
    print(f"{'problem':15s}{'kernel':11s}{'x sect/req':>11s}{'L1 bound':>10s}{'ms':>9s}"
          f"{'TFLOP/s':>9s}{'GB/s':>8s}{'% cuDNN':>9s}")
    for label in TRACED:
        rows = {r["name"]: r for r in timed.get(label, {}).get("rows", [])}
        for name in ("naive", "coalesced", "cuDNN fp32"):
            tr = traced.get((label, name), {})
            r = rows.get(name, {})
            sect = f"{tr['x_sectors_per_req']:.2f}" if tr else "-"
            blk = f"{tr['x_sectors_per_block']}" if tr else "-"
            ms = f"{r['ms']:.4f}" if r else "-"
            tf = f"{r['tflops']:.2f}" if r else "-"
            gb = f"{r['gbps']:.0f}" if r else "-"
            pct = f"{r['pct_of_baseline']:.1f}" if r and r.get("pct_of_baseline") else "-"
            print(f"{label:15s}{name:11s}{sect:>11s}{blk:>10s}{ms:>9s}{tf:>9s}{gb:>8s}{pct:>9s}")
        n, c = traced.get((label, "naive")), traced.get((label, "coalesced"))
        if n and c:
            line = (f"  {label}: tracer ratio naive/coalesced {n['x_sectors_per_req'] / c['x_sectors_per_req']:.2f}x"
                    f" sectors per request, {n['x_sectors_per_block'] / c['x_sectors_per_block']:.2f}x"
                    " distinct sectors per block")
            if "naive" in rows and "coalesced" in rows:
                line += f"; measured time ratio {rows['naive']['ms'] / rows['coalesced']['ms']:.2f}x"
            print(line)


if __name__ == "__main__":
    main()
