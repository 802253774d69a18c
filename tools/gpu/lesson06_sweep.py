# ruff: noqa: B023  (closures are called inside the loop iteration that made them)
"""Every H200 measurement that lessons 04, 05 and 06 show, in one run.

    . tools/device_env.sh; python3 tools/gpu/lesson06_sweep.py        # on the GPU machine
    .venv/bin/python tools/gpu/lesson06_sweep.py --dry                # here: simulator, tiny

Each variant is checked against a float64 reference before it is timed (CUDA events,
median of groups, bench.time_gpu); the libraries (cuDNN through PyTorch with TF32 off,
cuBLAS through CuPy) are timed in the same run. Writes $OUT/lessons04_06.json (copy it to
convlab/results/h200_lessons04_06.json) and prints a short table last.

--dry runs every section under the Numba simulator on tiny shapes with a fake clock, to
find mistakes before spending GPU time; its numbers mean nothing.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
from _sections import Sections, fake_gpu_clocks

DRY = "--dry" in sys.argv
import convlab  # noqa: E402

convlab.setup("sim" if DRY else None)
from numba import cuda, float32  # noqa: E402

from convlab import baselines, bench, check, problems  # noqa: E402
from convlab import reference as ref  # noqa: E402
from convlab.kernels import (  # noqa: E402
    conv01_naive,
    conv02_coalesced,
    conv03_tiled,
    filter01_naive,
    filter02_tiled,
    gemm01_tiled,
    layout,
)

GAUSS = np.array([[1, 2, 1], [2, 4, 2], [1, 2, 1]], np.float32) / 16
SOBEL_X = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], np.float32)
OUT = os.environ.get("OUT", "/tmp/lesson06_out")
os.makedirs(OUT, exist_ok=True)
RUN = Sections(os.path.join(OUT, "lessons04_06.json"))
RES, section, save, T0 = RUN.res, RUN.section, RUN.save, RUN.t0
SUMMARY: list = []

if DRY:  # a fake clock: the simulator cannot time anything
    from convlab import measure as _m

    fake_gpu_clocks(bench, _m)
    _m.launch_cost_us = lambda fn, *a, calls=1, **k: (fn(*a, **k), 1.0)[1]
    _m.require_gpu = lambda *a: None
    _m.launch_overhead = lambda: {"dry": 1.0}
    _m.transfer_table = lambda sizes: [{"bytes": 1, "h2d_pageable": {"gbps": 1.0}}]
    _m.wall_vs_events = lambda fn, *a, **k: (fn(*a, **k), {"dry": 1.0})[1]
    bench.fma_peak = lambda *a, **k: 10.0


def med(fn, *args, **kw):
    return bench.time_gpu(fn, *args, **kw).median_ms


# ---------------------------------------------------------------------------------------
@section("environment")
def _env():
    if DRY:
        return dict(device="simulator (dry run)", date=time.strftime("%Y-%m-%d"))
    from convlab.ladder import environment

    env = environment()
    env["ceilings"] = bench.measure_ceilings()
    print(env)
    return env


COPY_GBPS = (RES["sections"].get("environment") or {}).get("ceilings", {}).get("copy_gbps",
                                                                                 1000.0)


# ---------------------------------------------------------------------------------------
# Lesson 04: transfers, timing pitfalls, launch overhead, batch crossover


@section("l04_transfers")
def _transfers():
    from convlab import measure

    sizes = (2**12, 2**16, 2**20, 2**24, 2**28) if not DRY else (2**12,)
    rows = measure.transfer_table(sizes)
    for r in rows:
        print(r["bytes"], {k: round(v["gbps"], 1) for k, v in r.items() if k != "bytes"})
    return rows


@section("l04_timing_pitfalls")
def _timing():
    """Wall clock without synchronize measures the launch, not the kernel."""
    from convlab import measure

    prob = problems.conv_layer("resnet128")
    rng = np.random.default_rng(1)
    x = cuda.to_device(check.random_array(prob.x_shape, rng))
    w = cuda.to_device(check.random_array(prob.w_shape, rng))
    y = cuda.device_array(prob.out_shape, np.float32)
    r = dict(problem=str(prob), **measure.wall_vs_events(conv01_naive.conv2d_naive, x, w, y,
                                                         **prob.kwargs))
    print(r)
    return r


@section("l04_launch_overhead")
def _launch():
    import warnings

    from convlab import measure

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = measure.launch_overhead()
        # the course's own launchers, from Python (CPU time per call)
        prob = problems.conv_layer("resnet128")
        x = cuda.device_array(prob.x_shape, np.float32)
        w = cuda.device_array(prob.w_shape, np.float32)
        y = cuda.device_array(prob.out_shape, np.float32)
        n = problems.image_size()
        img, out = cuda.device_array((n, n), np.float32), cuda.device_array((n, n), np.float32)
        taps = cuda.to_device(GAUSS)
        for name, fn in (("conv2d_naive", lambda: conv01_naive.conv2d_naive(x, w, y, padding=1)),
                         ("conv2d_tiled", lambda: conv03_tiled.conv2d_tiled(x, w, y, padding=1)),
                         ("filter2d_tiled_host_taps", lambda: filter02_tiled.launch(
                             img, taps, out, taps=GAUSS, **filter02_tiled.TILE)),
                         ("filter2d_tiled_device_taps",
                          lambda: filter02_tiled.filter2d_tiled(img, taps, out))):
            r[f"{name}_cpu_us"] = measure.launch_cost_us(fn, calls=20)
    print(r)
    return r


# ---------------------------------------------------------------------------------------
# Lessons 05 and 06: the conv ladder on the 128-channel layer, tile variants, NHWC

CONV_TILES = [dict(tx=32, ty=8, kpt=8, cb=8), dict(tx=32, ty=4, kpt=8, cb=8),
              dict(tx=16, ty=16, kpt=8, cb=8), dict(tx=28, ty=7, kpt=4, cb=8),
              dict(tx=28, ty=7, kpt=16, cb=8), dict(tx=28, ty=7, kpt=8, cb=16),
              dict(tx=28, ty=7, kpt=8, cb=4), dict(tx=28, ty=7, kpt=1, cb=8)]


def tile_name(t):
    return "tiled " + "x".join(str(t[k]) for k in ("tx", "ty")) + f" k{t['kpt']} c{t['cb']}"


def tiled_launcher(t):
    def fn(x, w, out, stride=1, padding=0, dilation=1, groups=1):
        return conv03_tiled.launch(x, w, out, stride, padding, dilation, groups, **t)
    return fn


@cuda.jit
def conv2d_nhwc_channels_kernel(x, w, y, sh, sw, ph, pw):
    # lesson 05's exercise design: thread x -> output channel k (x NHWC, w RSCK, y NHWC)
    k = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    q = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    npix = cuda.blockIdx.z
    N, P, Q, K = y.shape
    R, S, C = w.shape[0], w.shape[1], w.shape[2]
    H, W = x.shape[1], x.shape[2]
    n, p = npix // P, npix % P
    if k >= K or q >= Q:
        return
    acc = float32(0.0)
    for r in range(R):
        h = p * sh - ph + r
        if 0 <= h < H:
            for s in range(S):
                col = q * sw - pw + s
                if 0 <= col < W:
                    for c in range(C):
                        acc += x[n, h, col, c] * w[r, s, c, k]
    y[n, p, q, k] = acc


def nhwc_impl(name, kind, prob):
    """An Impl that stores x, w as NHWC / RSCK, runs an NHWC kernel, returns NCHW."""
    def prepare(x, w):
        xh, wh = layout.nhwc_inputs(x, w)
        N, K, P, Q = prob.out_shape
        return dict(x=cuda.to_device(xh), w=cuda.to_device(wh),
                    out=cuda.to_device(check.poisoned((N, P, Q, K))))

    def run(s):
        if kind == "pixels":
            layout.conv2d_nhwc_pixels(s["x"], s["w"], s["out"], **prob.kwargs)
        else:
            N, P, Q, K = s["out"].shape
            grid = ((K + 31) // 32, (Q + 7) // 8, N * P)
            conv2d_nhwc_channels_kernel[grid, (32, 8)](s["x"], s["w"], s["out"], prob.stride,
                                                       prob.stride, prob.padding, prob.padding)

    return bench.Impl(name, prepare, run, lambda s: s["out"].copy_to_host().transpose(0, 3, 1, 2))


def conv_ladder(layer, tiles, nhwc=False, libs=True):
    prob = problems.conv_layer(layer)
    impls = [bench.launcher_impl("naive", conv01_naive.conv2d_naive, prob),
             bench.launcher_impl("coalesced", conv02_coalesced.conv2d_coalesced, prob),
             bench.launcher_impl("tiled (default: " + "x".join(
                 map(str, conv03_tiled.fit_tile(*prob.out_shape[2:]))) + " k8 c8)",
                 conv03_tiled.conv2d_tiled, prob)]
    impls += [bench.launcher_impl(tile_name(t), tiled_launcher(t), prob) for t in tiles]
    if nhwc:
        impls += [nhwc_impl("NHWC, threads on q", "pixels", prob),
                  nhwc_impl("NHWC, threads on k", "channels", prob)]
    if libs and baselines.torch_available():
        impls.append(baselines.cudnn_conv_impl(prob, "fp32"))
    if libs and baselines.cupy_available():
        impls.append(baselines.cublas_im2col_impl(prob))
    if DRY:
        bench.require_gpu = lambda *a: None
    lad = bench.bench_conv(impls, prob, baseline="cuDNN fp32", repeat=10)
    return lad.to_dict()


@section("l06_conv_ladder_resnet128")
def _ladder128():
    return conv_ladder("resnet128", CONV_TILES, nhwc=True)


# ---------------------------------------------------------------------------------------
# Lessons 05/06: the single-channel filter on a 4096 x 4096 image


FILTER_TILES = [dict(tx=32, ty=8, v=8), dict(tx=32, ty=8, v=4), dict(tx=32, ty=4, v=16),
                dict(tx=32, ty=16, v=4), dict(tx=16, ty=16, v=4, pad=0),
                dict(tx=16, ty=16, v=4, pad=2), dict(tx=32, ty=8, v=1),
                dict(tx=32, ty=8, v=4, chunks=4, min_blocks=8),
                dict(tx=32, ty=8, v=4, chunks=8, min_blocks=8),
                dict(tx=32, ty=8, v=4, chunks=16, min_blocks=8),
                dict(tx=32, ty=16, v=4, chunks=4, min_blocks=4),
                dict(tx=32, ty=16, v=4, chunks=8, min_blocks=4),
                dict(tx=32, ty=4, v=8, chunks=8, min_blocks=16),
                dict(tx=32, ty=8, v=8, chunks=4)]


def ftile_name(t):
    name = f"tiled {t['tx']}x{t['ty']} v{t['v']}" + (f" pad{t['pad']}" if t.get("pad") else "")
    if t.get("chunks", 1) > 1:
        name = "pipelined" + name[5:] + f" ch{t['chunks']}" + (
            f" mb{t['min_blocks']}" if t.get("min_blocks") else "")
    return name


@section("l06_filter_4096")
def _filters():
    from convlab import measure

    n = problems.image_size()
    rng = np.random.default_rng(3)
    img = check.random_array((n, n), rng)
    nbytes = 2 * img.nbytes  # read the image once, write the output once
    d_img = cuda.to_device(img)
    d_out = cuda.device_array((n, n), np.float32)
    rows = []
    for fname, taps in (("gauss3", GAUSS), ("sobel_x", SOBEL_X)):
        expected = ref.filter2d(img.astype(np.float64), taps.astype(np.float64))
        absref = ref.filter2d(np.abs(img).astype(np.float64), np.abs(taps).astype(np.float64))
        d_taps = cuda.to_device(taps)
        variants = [("naive", lambda: filter01_naive.filter2d_naive(d_img, d_taps, d_out)),
                    ("naive rows (uncoalesced)",
                     lambda: filter01_naive.filter2d_naive_rows(d_img, d_taps, d_out))]
        tiles = FILTER_TILES if fname == "gauss3" else [FILTER_TILES[0], FILTER_TILES[8]]
        for t in tiles:
            variants.append((ftile_name(t), lambda t=t: filter02_tiled.launch(
                d_img, d_taps, d_out, taps=taps, **t)))
        if baselines.torch_available():
            import torch

            baselines.set_torch_precision("fp32")
            ti = torch.from_numpy(img).cuda()[None, None]
            tk = torch.from_numpy(taps).cuda()[None, None]
            holder = {}

            def torch_run():
                holder["y"] = torch.nn.functional.conv2d(ti, tk, padding=1)

            variants.append(("cuDNN (torch conv2d)", torch_run))
        for name, fn in variants:
            try:
                d_out.copy_to_device(check.poisoned((n, n)))
                fn()
                cuda.synchronize()
                got = holder["y"][0, 0].cpu().numpy() if name.startswith("cuDNN") \
                    else d_out.copy_to_host()
                comp = check.compare(got, expected, absref, 9)
                if not comp.ok:
                    raise check.CheckError(comp.summary())
                ms = med(fn)  # from Python, launch after launch
                gpu = ms if name.startswith("cuDNN") else measure.time_gpu_queued(fn).median_ms
            except Exception as e:  # noqa: BLE001
                print(f"  {fname} {name}: NOT TIMED: {type(e).__name__}: {str(e)[:300]}")
                continue
            gbps = nbytes / (gpu * 1e-3) / 1e9
            rows.append(dict(filter=fname, name=name, ms=gpu, per_call_ms=ms, gbps=gbps,
                             pct_copy=100 * gbps / COPY_GBPS, max_rel_err=comp.max_rel))
            print(f"  {fname:8s} {name:34s} {gpu * 1e3:7.1f} us GPU ({ms * 1e3:6.1f} per call) "
                  f"{gbps:6.0f} GB/s {100 * gbps / COPY_GBPS:5.1f}% of copy")
    return dict(n=n, bytes=nbytes, copy_gbps=COPY_GBPS, rows=rows)


# ---------------------------------------------------------------------------------------
# Lesson 06: bank conflicts in a shared-memory transpose (NCHW -> NHWC)


@section("l06_transpose_bank_conflicts")
def _transpose():
    prob = problems.conv_layer("resnet64")
    x = check.random_array(prob.x_shape, np.random.default_rng(4))
    N, C, H, W = x.shape
    dx = cuda.to_device(x)
    dy = cuda.device_array((N, H, W, C), np.float32)
    rows = []
    for pad in (0, 1):
        dy.copy_to_device(check.poisoned((N, H, W, C)))
        layout.nchw_to_nhwc(dx, dy, pad=pad)
        if not np.array_equal(dy.copy_to_host(), x.transpose(0, 2, 3, 1)):
            raise AssertionError(f"transpose pad={pad} is wrong")
        from convlab import measure

        per_call = med(layout.nchw_to_nhwc, dx, dy, pad=pad)
        ms = measure.time_gpu_queued(layout.nchw_to_nhwc, dx, dy, pad=pad).median_ms
        gbps = 2 * x.nbytes / (ms * 1e-3) / 1e9
        rows.append(dict(pad=pad, ms=ms, per_call_ms=per_call, gbps=gbps,
                         pct_copy=100 * gbps / COPY_GBPS))
        print(rows[-1])
    return dict(shape=list(x.shape), rows=rows)


# ---------------------------------------------------------------------------------------
# Lesson 06: the tiled GEMM of the im2col path vs cuBLAS


@section("l06_gemm")
def _gemm():
    rows = []
    prob = problems.conv_layer("resnet128")
    p = ref.conv_params(prob.x_shape, prob.w_shape, **prob.kwargs)
    s = problems.gemm_size()
    shapes = [("im2col " + prob.name.split(" (")[0], p.K, p.N * p.P * p.Q, p.C * p.R * p.S),
              (f"square {s}", s, s, s)]
    for label, M, N, K in shapes:
        rng = np.random.default_rng(5)
        a, b = check.random_array((M, K), rng), check.random_array((K, N), rng)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        expected, absref = a64 @ b64, np.abs(a64) @ np.abs(b64)
        da, db = cuda.to_device(a), cuda.to_device(b)
        dc = cuda.device_array((M, N), np.float32)
        flops = 2 * M * N * K
        impls = [("tiled 32x32", lambda: gemm01_tiled.launch(da, db, dc, 32)),
                 ("tiled 16x16", lambda: gemm01_tiled.launch(da, db, dc, 16))]
        if baselines.cupy_available():
            import cupy as cp

            ca, cb = cp.asarray(a), cp.asarray(b)
            hold = {}
            impls.append(("cuBLAS", lambda: hold.__setitem__("c", ca @ cb)))
        for name, fn in impls:
            fn()
            cuda.synchronize()
            got = cp.asnumpy(hold["c"]) if name == "cuBLAS" else dc.copy_to_host()
            comp = check.compare(got, expected, absref, K)
            if not comp.ok:
                print(f"  {label} {name}: WRONG {comp.summary()}")
                continue
            ms = med(fn)
            rows.append(dict(shape=label, M=M, N=N, K=K, name=name, ms=ms,
                             tflops=flops / (ms * 1e-3) / 1e12))
            print(f"  {label:24s} {name:12s} {ms:8.3f} ms {rows[-1]['tflops']:6.2f} TFLOP/s")
    return rows


# ---------------------------------------------------------------------------------------
# If time is left: the other two ResNet layers (tiled default vs cuDNN)


@section("l06_conv_other_layers")
def _others():
    if time.time() - T0 > 70 and not DRY:
        return {"skipped": f"time ({time.time() - T0:.0f} s elapsed)"}
    return [conv_ladder(layer, []) for layer in ("resnet64", "resnet256")]


# ---------------------------------------------------------------------------------------
# The short table, last

save()
print("\n" + "=" * 78)
env = RES["sections"].get("environment", {})
print(f"{env.get('device')}  {env.get('date')}  copy {COPY_GBPS:.0f} GB/s  "
      f"elapsed {time.time() - T0:.0f} s  errors: {list(RES['errors']) or 'none'}")
lad = RES["sections"].get("l06_conv_ladder_resnet128")
if lad:
    print(lad["problem"])
    rows = {r["name"]: r for r in lad["rows"]}
    naive = rows.get("naive", {}).get("ms")
    for r in lad["rows"]:
        x = f"{naive / r['ms']:6.1f}x naive" if naive else ""
        pct = f"{r['pct_of_baseline']:6.1f}% cuDNN" if r.get("pct_of_baseline") else ""
        print(f"  {r['name']:26s} {r['ms']:8.3f} ms {r['tflops']:6.2f} TFLOP/s {pct} {x}")
fl = RES["sections"].get("l06_filter_4096")
if fl:
    print(f"filter {fl['n']}x{fl['n']} (copy {fl['copy_gbps']:.0f} GB/s)")
    for r in fl["rows"]:
        print(f"  {r['filter']:7s} {r['name']:34s} {r['ms'] * 1e3:6.1f} us GPU "
              f"({r['per_call_ms'] * 1e3:6.1f} per call) {r['gbps']:5.0f} GB/s "
              f"{r['pct_copy']:5.1f}%")
tr = RES["sections"].get("l06_transpose_bank_conflicts")
if tr:
    for r in tr["rows"]:
        print(f"  transpose pad {r['pad']}: {r['ms'] * 1e3:6.1f} us GPU "
              f"({r['per_call_ms'] * 1e3:6.1f} per call) {r['gbps']:5.0f} GB/s")
lo = RES["sections"].get("l04_launch_overhead")
if lo:
    print("  launch overhead:", {k: round(v, 1) for k, v in lo.items()})
