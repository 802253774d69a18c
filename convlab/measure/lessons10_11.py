# ruff: noqa: B023  (closures are called inside the loop iteration that made them)
"""The GPU measurements lessons 10 and 11 show (stored as lessons10_11.json).

Lesson 10: pinned vs pageable transfers; a copy overlapping a kernel (streams); the JPEG
pipeline (decode in threads -> GPU stem conv -> features), serial vs overlapped images/s
on the same work for several GPU workloads, the timeline of both; the batch split across
every visible GPU (checked against one device).
Lesson 11: the depthwise 3x3 kernels (outputs per thread, block sizes, the shared-memory
tile) vs PyTorch's depthwise conv2d and the copy bandwidth; separable two-pass filter vs
2-D; FFT vs direct (the crossover filter size) on the GPU and the CPU; Winograd
F(2x2,3x3) (and F(4x4), F(6x6)) accuracy on random data, and its time through CuPy.

Every variant is checked against a float64 CPU reference before it is timed. GPU times
of short kernels come from the clock's `queued` timing (launches queued behind a spin
kernel: GPU time, not Python's launch rate); the depthwise inputs rotate over enough
buffers to exceed the 50 MB L2, so every call reads from DRAM like the copy it is
compared with.
"""

from __future__ import annotations

import os
import time

import numpy as np

from .. import baselines, bench, check, fft_conv, problems, winograd
from .. import pipeline as pl
from .. import reference as ref
from .harness import Group

GROUP = Group("lessons10_11", about=(
    "GPU measurements behind lessons 10-11 (python -m convlab measure 10 11): every variant "
    "checked against a float64 CPU reference before it was timed; PyTorch/cuDNN with TF32 "
    "off and CuPy in the same run. GPU times of short kernels: launches queued behind a spin "
    "kernel; depthwise inputs rotate over enough buffers (>200 MB) to miss the L2."))
section = GROUP.section


class _Cuda:
    """numba.cuda, imported on first use (after `convlab.setup` chose GPU or simulator)."""

    def __getattr__(self, name):
        from ..runtime import cuda as _cuda

        return getattr(_cuda(), name)


cuda = _Cuda()


def _env(ctx) -> dict:
    return dict(copy_gbps=ctx.clock.copy_bandwidth(nbytes=1 << 30, repeat=5),
                cpu_count=os.cpu_count(), gpus_visible=pl.visible_gpus())


GROUP.environment = _env


def copy_gbps(ctx) -> float:
    return ctx.env.get("copy_gbps") or ctx.clock.copy_bandwidth()


def queued_ms(ctx, fn, calls=20, repeat=7) -> float:
    return ctx.clock.queued(fn, calls=calls, repeat=repeat).median_ms


# ---------------------------------------------------------------------------------------
# Lesson 10


@section("l10_transfers", lessons=("10",))
def transfers(ctx):
    rows = ctx.clock.transfer_table(ctx.pick((1 << 20, 16 << 20, 256 << 20), (1 << 12,)),
                                    repeat=5)
    for r in rows:
        print(r["bytes"], {k: round(v["gbps"], 1) for k, v in r.items() if k != "bytes"})
    return rows


@section("l10_streams", lessons=("10",))
def streams(ctx):
    """A copy and a kernel, one after the other and on two streams (pinned / pageable)."""
    ctx.need("cuda")  # CUDA streams and events: the simulator has neither
    r = pl.copy_compute_overlap(64 << 20, 5.0)
    print({k: round(v, 3) for k, v in r.items()})
    return r


@section("l10_pipeline", lessons=("10",))
def jpeg_pipeline(ctx):
    """Throughput of decode -> GPU stage, serial vs overlapped (wall clock: end to end)."""
    PIPE = {}
    sz = problems.pipeline_sizes()
    B, NB, side = sz["batch"], sz["batches"], sz["side"]
    threads = pl.decode_threads(sz["threads"])
    files = pl.jpeg_corpus(B * NB)
    res = dict(batch=B, batches=NB, side=side, threads=threads,
               jpeg_kb=float(np.mean([len(f) for f in files]) / 1024))
    # correctness of the GPU stage first
    stage = pl.GpuStage(B, side, sz["k"])
    u8 = np.empty((B, side, side, 3), np.uint8)
    pl.decode_into(files[:B], u8)
    d_u8, d_feat = cuda.to_device(u8), cuda.device_array((B, sz["k"]), np.float32)
    stage.run(d_u8, d_feat)
    cuda.synchronize()
    res["check_max_rel_err"] = pl.check_features(u8, stage.w, d_feat.copy_to_host(), images=2)
    print(f"  GPU stage checked: max rel err {res['check_max_rel_err']:.1e}")
    # the CPU stage alone: images/s decoding one batch, three ways
    from concurrent.futures import ThreadPoolExecutor

    dec = {}
    with ThreadPoolExecutor(threads) as pool:
        for label, p, draft in (("1 thread, full decode", None, False),
                                ("1 thread, draft", None, True),
                                (f"{threads} threads, draft", pool, True)):
            t = []
            for _ in range(2 if not ctx.dry else 1):
                t0 = time.perf_counter()
                pl.decode_into(files[:B], u8, p, draft)
                t.append(time.perf_counter() - t0)
            dec[label] = B / min(t)
            print(f"  decode {label}: {dec[label]:.0f} images/s")
    res["decode_images_per_s"] = dec
    # the same work, serial and overlapped, for several GPU workloads (output channels k)
    ks = (8, 16, 32, 64, 128) if not ctx.dry else (sz["k"],)
    rows = []
    for k in ks:
        st = pl.GpuStage(B, side, k)
        pl.run_serial(files[:B], st, threads)  # warm-up: compile, thread pool
        times = pl.stage_times(files, st, threads, repeat=3 if not ctx.dry else 1)
        ser = pl.run_serial(files, st, threads)
        stages = [pl.GpuStage(B, side, k) for _ in range(2)]
        ovl = pl.run_overlapped(files, stages, threads)
        slot = pl.run_overlapped(files, stages, threads, streams="per-slot")
        same = bool(np.allclose(ser.features, ovl.features, rtol=1e-5, atol=1e-6)
                    and np.allclose(ser.features, slot.features, rtol=1e-5, atol=1e-6))
        row = dict(k=k, gflop_per_batch=st.flops / 1e9, **times,
                   serial_images_per_s=ser.images_per_s,
                   overlapped_images_per_s=ovl.images_per_s,
                   per_slot_images_per_s=slot.images_per_s,
                   speedup=ovl.images_per_s / ser.images_per_s,
                   per_slot_speedup=slot.images_per_s / ser.images_per_s, same_features=same)
        rows.append(row)
        PIPE[k] = (ser, ovl, slot)
        print(f"  k={k:3d}: decode {times['decode_s'] * 1e3:6.1f} ms, GPU "
              f"{times['gpu_s'] * 1e3:6.1f} ms per batch (bound "
              f"{times.get('bound', 0):.2f}x): serial "
              f"{ser.images_per_s:6.0f} img/s, overlapped {ovl.images_per_s:6.0f} img/s = "
              f"{row['speedup']:.2f}x (streams per slot {row['per_slot_speedup']:.2f}x), "
              f"same features: {same}")
    res["rows"] = rows
    # the headline: the workload whose two stages are closest to balanced (chosen from the
    # stage times, before looking at end-to-end results)
    best = min(rows, key=lambda r: abs(np.log(max(r["gpu_s"], 1e-9) / r["decode_s"])))
    res["balanced_k"] = best["k"]
    ser, ovl, slot = PIPE[best["k"]]
    res["timeline"] = dict(k=best["k"], serial=ser.spans_dict(), overlapped=ovl.spans_dict(),
                           per_slot=slot.spans_dict())
    # the source's chain at that workload: unoptimized decode, serial -> optimized + overlap
    nb0 = max(2, NB // 3)
    base = pl.run_serial(files[:B * nb0], pl.GpuStage(B, side, best["k"]), threads=1,
                         draft=False)
    res["baseline"] = base.summary()
    res["chain"] = {"serial, 1 thread, full decode": base.images_per_s,
                    f"serial, {threads} threads, draft": ser.images_per_s,
                    "overlapped, pinned, streams by kind": ovl.images_per_s}
    print("  chain:", {k: round(v) for k, v in res["chain"].items()})
    return res


@section("l10_multi_gpu", lessons=("10",))
def multi_gpu(ctx):
    sz = problems.pipeline_sizes()
    side, k = sz["side"], sz["k"]
    B = 2 * sz["batch"]
    files = pl.jpeg_corpus(B)
    u8 = np.empty((B, side, side, 3), np.uint8)
    pl.decode_into(files, u8)
    n = pl.visible_gpus()
    res = dict(visible=n, batch=B, k=k)
    res["check_all"] = pl.check_split(u8, k)  # every visible GPU vs one
    res["check_two_parts_one_gpu"] = pl.check_split(u8, k, devices=[0, 0])
    timing = {}
    for label, devs in (("1 GPU", [0]), (f"{n} GPU(s)", None), ("2 parts on GPU 0", [0, 0])):
        m = pl.MultiGpu(B, side, k, devices=devs)
        m.host[:] = u8
        s = m.time(repeat=5 if not ctx.dry else 1)
        timing[label] = dict(devices=m.devices, parts=m.parts, ms=s * 1e3,
                             images_per_s=B / s)
        print(f"  {label}: {s * 1e3:.2f} ms per batch of {B} ({B / s:.0f} images/s)")
    res["timing"] = timing
    return res


# ---------------------------------------------------------------------------------------
# Lesson 11: depthwise


def _rotating(nsets, make_call):
    i = [0]

    def f():
        make_call(i[0] % nsets)
        i[0] += 1

    return f


# depthwise02_smem tilings timed on each layer (g planes per block, tp output rows per
# block, v outputs per thread, threads per block); the first of each is the default tiling
SMEM_SWEEP = {
    ("dw512", 1): [{}, dict(g=8, v=7, threads=256), dict(g=18, v=7, threads=512),
                   dict(g=4, v=7, threads=128), dict(g=9, v=14, threads=256),
                   dict(g=8, v=14, threads=128), dict(g=9, v=2, threads=256),
                   dict(g=16, v=7, threads=256)],
    ("dw512", 2): [{}, dict(g=16, v=7, threads=256), dict(g=8, v=7, threads=256),
                   dict(g=27, v=1, threads=256), dict(g=12, v=1, threads=256),
                   dict(g=27, v=7, threads=192)],
    ("dw32", 1): [{}, dict(tp=16, v=8, threads=256), dict(tp=16, v=4, threads=512),
                  dict(tp=8, v=8, threads=128), dict(tp=32, v=8, threads=512),
                  dict(tp=32, v=16, threads=256), dict(tp=8, v=4, threads=256),
                  dict(tp=28, v=7, threads=512)],
    ("dw32", 2): [{}, dict(tp=16, v=8, threads=256), dict(tp=14, v=7, threads=128),
                  dict(tp=16, v=4, threads=256), dict(tp=8, v=4, threads=256),
                  dict(tp=8, v=8, threads=128)],
}


@section("l11_depthwise", lessons=("11",))
def depthwise(ctx):
    """The course's depthwise kernels, every variant checked then timed, vs PyTorch and a
    copy of the same bytes (GB/s: a memory-bound kernel's yardstick)."""
    from ..kernels import depthwise01_direct as dw
    from ..kernels import depthwise02_smem as dws

    copy = copy_gbps(ctx)
    res = dict(copy_gbps=copy, layers=[])
    torch = baselines.set_torch_precision("fp32") if baselines.torch_available() else None
    for name, stride in ctx.pick([(n, s) for n in ("dw512", "dw32") for s in (1, 2)],
                                 [("dw32", 1)]):
        prob = problems.depthwise_layer(name)
        kw = dict(stride=stride, padding=1, groups=prob.C)
        rng = np.random.default_rng(11)
        x = check.random_array(prob.x_shape, rng)
        w = check.random_array(prob.w_shape, rng)
        x64, w64 = x.astype(np.float64), w.astype(np.float64)
        expected = ref.conv2d(x64, w64, **kw)
        absref = ref.conv2d(np.abs(x64), np.abs(w64), **kw)
        out_shape = expected.shape
        nbytes = x.nbytes + w.nbytes + expected.size * 4
        nsets = max(2, int(np.ceil(200e6 / nbytes))) if not ctx.dry else 1
        dxs = [cuda.to_device(x) for _ in range(nsets)]
        dys = [cuda.device_array(out_shape, np.float32) for _ in range(nsets)]
        dwt = cuda.to_device(w)
        layer = dict(layer=prob.name, stride=stride, x=list(x.shape), bytes=nbytes,
                     rotating_sets=nsets, rows=[], not_timed=[])
        variants = []
        vs = ctx.pick((1, 2, 4, 7, 8) if stride == 1 else (1, 2, 4), (4,))
        for v in vs:
            for th in ctx.pick((128, 256) if stride == 1 else (256,), (128,)):
                variants.append((f"direct v{v} t{th}", dict(v=v, threads=th)))
        # the 3-D launch: plane / strip / column from the grid
        for v in ctx.pick((4, 7, 8) if stride == 1 else (2, 4), (4,)):
            for th in ctx.pick((128, 256), (128,)):
                variants.append((f"direct3d v{v} t{th}", dict(v=v, threads=th, d3=True)))
        # the shared-memory tile kernel (depthwise02_smem): default tiling + a sweep
        for cfg in SMEM_SWEEP[(name, stride)] if not ctx.dry else ({}, dict(v=1)):
            variants.append(("smem " + (" ".join(f"{k}{v}" for k, v in cfg.items())
                                        or "default"), dict(cfg, smem=True)))
        for label, cfg in variants:
            run = dw.launch_3d if cfg.get("d3") else dw.launch
            if cfg.get("smem"):
                def run(x_, w_, y_, s_, p_, v=None, threads=None, _c=cfg):
                    return dws.launch(x_, w_, y_, s_, p_, g=_c.get("g"), tp=_c.get("tp"),
                                      v=v, threads=threads)
            try:
                dys[0].copy_to_device(check.poisoned(out_shape))
                run(dxs[0], dwt, dys[0], stride, 1, v=cfg.get("v"), threads=cfg.get("threads"))
                got = dys[0].copy_to_host()
                comp = check.compare(got, expected, absref, 9)
                if not comp.ok:
                    raise check.CheckError(comp.summary())
                fn = _rotating(nsets, lambda i: run(dxs[i], dwt, dys[i], stride, 1,
                                                    v=cfg.get("v"),
                                                    threads=cfg.get("threads")))
                gpu = queued_ms(ctx, fn)
                call = ctx.clock.time_gpu(fn, repeat=7).median_ms
            except Exception as e:  # noqa: BLE001  (a variant that fails is data)
                layer["not_timed"].append(dict(name=label, error=f"{type(e).__name__}: "
                                                                 f"{str(e)[:300]}"))
                continue
            gbps = nbytes / (gpu * 1e-3) / 1e9
            layer["rows"].append(dict(name=label, **cfg, us=gpu * 1e3, per_call_us=call * 1e3,
                                      gbps=gbps, pct_copy=100 * gbps / copy,
                                      max_rel_err=comp.max_rel))
        # a plain device-to-device copy moving the same bytes (M floats read, M
        # written, 8M = x + w + y bytes, or x + y: M <= x.size), same rotating
        # buffers, same timing; compared in GB/s
        M = min(nbytes // 8, x.size)
        srcs = [d.reshape(d.size)[:M] for d in dxs]
        dcs = [cuda.device_array(M, np.float32) for _ in range(nsets)]
        fn = _rotating(nsets, lambda i: dcs[i].copy_to_device(srcs[i]))
        try:
            fn()
            gpu = queued_ms(ctx, fn)
            call = ctx.clock.time_gpu(fn, repeat=7).median_ms
            gbps = 8 * M / (gpu * 1e-3) / 1e9
            layer["copy_same_bytes"] = dict(bytes=8 * M, us=gpu * 1e3, per_call_us=call * 1e3,
                                            gbps=gbps, pct_copy=100 * gbps / copy)
            layer["rows"].append(dict(name="copy same bytes (D2D)", **layer["copy_same_bytes"],
                                      max_rel_err=0.0))
        except Exception as e:  # noqa: BLE001
            layer["not_timed"].append(dict(name="copy same bytes (D2D)",
                                           error=f"{type(e).__name__}: {str(e)[:300]}"))
        dcs.clear()
        if torch is not None:
            F = torch.nn.functional
            txs = [torch.from_numpy(x).cuda() for _ in range(nsets)]
            tw = torch.from_numpy(w).cuda()
            hold = {}
            got = F.conv2d(txs[0], tw, stride=stride, padding=1, groups=prob.C)
            comp = check.compare(got.cpu().numpy(), expected, absref, 9)
            fn = _rotating(nsets, lambda i: hold.__setitem__(
                "y", F.conv2d(txs[i], tw, stride=stride, padding=1, groups=prob.C)))
            if comp.ok:
                call = ctx.clock.time_gpu(fn, repeat=7).median_ms
                try:
                    gpu = queued_ms(ctx, fn)
                except Exception as e:  # noqa: BLE001  (fall back to per-call time)
                    print(f"  torch queued timing failed ({e}); per-call time instead")
                    gpu = call
                gbps = nbytes / (gpu * 1e-3) / 1e9
                layer["rows"].append(dict(name="PyTorch conv2d (groups=C)", us=gpu * 1e3,
                                          per_call_us=call * 1e3, gbps=gbps,
                                          pct_copy=100 * gbps / copy,
                                          max_rel_err=comp.max_rel))
            else:
                layer["not_timed"].append(dict(name="PyTorch conv2d (groups=C)",
                                               error="wrong: " + comp.summary()))
            del txs
        for r in layer["rows"]:
            print(f"  {prob.name} s{stride} {r['name']:28s} {r['us']:8.1f} us GPU "
                  f"({r['per_call_us']:7.1f} per call) {r['gbps']:6.0f} GB/s "
                  f"{r['pct_copy']:5.1f}% of copy")
        res["layers"].append(layer)
        dxs.clear()  # free the device memory before the next layer
        dys.clear()
    return res


@section("l11_depthwise_block", lessons=("11",), optional=True)
def depthwise_block(ctx):
    """Source 003's claim, timed: a standard 3x3 conv vs depthwise 3x3 + pointwise 1x1
    (MobileNet's block) on the 512-channel 14x14 layer at batch 32. Inputs rotate over
    >200 MB: each call's working set (x, the intermediate, y, the weights: about 40 MB)
    would otherwise stay in the 50 MB L2 from the call before."""
    from ..kernels import depthwise01_direct as dw

    if not ctx.dry:
        ctx.need("torch.cuda")
    prob = problems.depthwise_layer("dw512")
    N, C, H, W = prob.x_shape
    rng = np.random.default_rng(17)
    x = check.random_array(prob.x_shape, rng)
    w_std = check.random_array((C, C, 3, 3), rng)
    w_dw = check.random_array((C, 1, 3, 3), rng)
    w_pw = check.random_array((C, C, 1, 1), rng)
    nsets = max(2, int(np.ceil(200e6 / (3 * x.nbytes)))) if not ctx.dry else 1
    dxs = [cuda.to_device(x) for _ in range(nsets)]
    dys = [cuda.device_array(prob.out_shape, np.float32) for _ in range(nsets)]
    dwt = cuda.to_device(w_dw)
    rows = dict(params=dict(standard=ref.conv2d_params_count(C, C, 3, 3),
                            depthwise=ref.conv2d_params_count(C, C, 3, 3, groups=C),
                            pointwise=ref.conv2d_params_count(C, C, 1, 1)),
                flops=dict(standard=ref.conv2d_flops(x.shape, w_std.shape, padding=1),
                           depthwise=ref.conv2d_flops(x.shape, w_dw.shape, padding=1, groups=C),
                           pointwise=ref.conv2d_flops(x.shape, w_pw.shape)))
    course = _rotating(nsets, lambda i: dw.conv2d_depthwise(dxs[i], dwt, dys[i], padding=1))
    ms = {"depthwise (course kernel)": queued_ms(ctx, course)}
    rows["rotating_sets"] = nsets
    if not ctx.dry:
        torch = baselines.set_torch_precision("fp32")
        F = torch.nn.functional
        txs = [torch.from_numpy(x).cuda() for _ in range(nsets)]
        ts, td, tp = (torch.from_numpy(a).cuda() for a in (w_std, w_dw, w_pw))
        hold = {}
        for name, fn in (("standard 3x3 (cuDNN)", lambda t: F.conv2d(t, ts, padding=1)),
                         ("depthwise (PyTorch)", lambda t: F.conv2d(t, td, padding=1, groups=C)),
                         ("pointwise 1x1 (cuDNN)", lambda t: F.conv2d(t, tp)),
                         ("depthwise + pointwise (PyTorch)", lambda t: F.conv2d(
                             F.conv2d(t, td, padding=1, groups=C), tp))):
            ms[name] = queued_ms(ctx, _rotating(nsets, lambda i, fn=fn: hold.__setitem__(
                "y", fn(txs[i]))), calls=10, repeat=5)
    rows["ms"] = ms
    print(rows)
    return rows


# ---------------------------------------------------------------------------------------
# Lesson 11: separable vs 2-D


def gaussian_taps(R: int) -> np.ndarray:
    sigma = max(R / 6, 0.5)
    t = np.arange(R) - R // 2
    g = np.exp(-t**2 / (2 * sigma**2))
    return (g / g.sum()).astype(np.float32)


@section("l11_separable", lessons=("11",))
def separable(ctx):
    """A Gaussian as two 1-D passes vs one 2-D pass, and cuDNN both ways; checked on a
    small odd image, timed on the big one."""
    from ..kernels import filter01_naive
    from ..kernels import separable01_rows_cols as sep

    n = ctx.pick(problems.image_size(), 16)
    rng = np.random.default_rng(12)
    img = check.random_array((n, n), rng)
    small = check.random_array(ctx.pick((97, 131), (13, 17)), rng)
    d_img, d_out = cuda.to_device(img), cuda.device_array((n, n), np.float32)
    d_tmp = cuda.device_array((n, n), np.float32)
    d_small, d_sout = cuda.to_device(small), cuda.device_array(small.shape, np.float32)
    d_stmp = cuda.device_array(small.shape, np.float32)
    torch = baselines.set_torch_precision("fp32") if baselines.torch_available() else None
    if torch is not None:
        torch.backends.cudnn.benchmark = False
    rows = []
    for R in ((3, 7, 15, 31) if not ctx.dry else (3, 5)):
        g = gaussian_taps(R)
        k2 = np.outer(g, g).astype(np.float32)
        d_g, d_k2 = cuda.to_device(g), cuda.to_device(k2)
        exp_s = ref.filter2d(small.astype(np.float64), k2.astype(np.float64))
        abs_s = ref.filter2d(np.abs(small).astype(np.float64), k2.astype(np.float64))
        variants = [("2-D naive (filter01)", lambda im, o, t: filter01_naive.filter2d_naive(
                        im, d_k2, o)),
                    ("separable rows+cols", lambda im, o, t: sep.filter2d_separable(
                        im, d_g, d_g, o, t))]
        for name, fn in variants:
            d_sout.copy_to_device(check.poisoned(small.shape))
            fn(d_small, d_sout, d_stmp)
            comp = check.compare(d_sout.copy_to_host(), exp_s, abs_s, R * R)
            if not comp.ok:
                print(f"  R={R} {name}: WRONG {comp.summary()}")
                continue
            ms = queued_ms(ctx, lambda: fn(d_img, d_out, d_tmp), calls=10, repeat=5)
            rows.append(dict(R=R, name=name, ms=ms, max_rel_err=comp.max_rel,
                             gflops=n * n * sep.flops_per_pixel(R, R, "separable" in name)
                             / (ms * 1e-3) / 1e9))
        if torch is not None:
            F = torch.nn.functional
            ti = torch.from_numpy(img).cuda()[None, None]
            ts = torch.from_numpy(small).cuda()[None, None]
            tk2 = torch.from_numpy(k2).cuda()[None, None]
            tr = torch.from_numpy(g).cuda().reshape(1, 1, 1, R)
            tc = torch.from_numpy(g).cuda().reshape(1, 1, R, 1)
            hold = {}
            for name, fn in (("cuDNN 2-D", lambda t: F.conv2d(t, tk2, padding=R // 2)),
                             ("cuDNN two 1-D", lambda t: F.conv2d(
                                 F.conv2d(t, tr, padding=(0, R // 2)), tc,
                                 padding=(R // 2, 0)))):
                comp = check.compare(fn(ts)[0, 0].cpu().numpy(), exp_s, abs_s, R * R)
                if not comp.ok:
                    print(f"  R={R} {name}: WRONG {comp.summary()}")
                    continue
                ms = queued_ms(ctx, lambda: hold.__setitem__("y", fn(ti)), calls=10, repeat=5)
                rows.append(dict(R=R, name=name, ms=ms, max_rel_err=comp.max_rel,
                                 gflops=n * n * sep.flops_per_pixel(R, R, "1-D" in name)
                                 / (ms * 1e-3) / 1e9))
        for r in rows:
            if r["R"] == R:
                print(f"  {R:2d}x{R:<2d} {r['name']:22s} {r['ms'] * 1e3:8.1f} us "
                      f"{r['gflops']:7.0f} useful GFLOP/s")
    return dict(n=n, rows=rows)


# ---------------------------------------------------------------------------------------
# Lesson 11: FFT vs direct


@section("l11_fft_gpu", lessons=("11",))
def fft_gpu(ctx):
    """FFT (CuPy; NumPy in a dry run) vs the direct kernel and cuDNN: the crossover size."""
    from ..kernels import filter01_naive

    res = {}
    if not ctx.dry:
        ctx.need("cupy")
    xp = np if ctx.dry else __import__("cupy")
    torch = baselines.set_torch_precision("fp32") if baselines.torch_available() else None
    if torch is not None:  # cuDNN's own choice of algorithm (benchmarking 65x65 takes long)
        torch.backends.cudnn.benchmark = False
    res["cudnn_benchmark"] = False
    # (a) one image, one filter
    n = ctx.pick(2048, 16)
    rng = np.random.default_rng(13)
    img = check.random_array((n, n), rng)
    small = check.random_array(ctx.pick((71, 90), (13, 17)), rng)
    d_img, d_out = cuda.to_device(img), cuda.device_array((n, n), np.float32)
    x_img = xp.asarray(img)
    rows = []
    sizes = (3, 5, 7, 9, 13, 17, 25, 33, 49, 65) if not ctx.dry else (3, 5)
    for R in sizes:
        k = check.random_array((R, R), rng)
        exp = ref.filter2d(small.astype(np.float64), k.astype(np.float64))
        ab = ref.filter2d(np.abs(small).astype(np.float64), np.abs(k).astype(np.float64))
        d_k = cuda.to_device(k)
        x_k = xp.asarray(k)
        row = dict(R=R)
        got = fft_conv.filter2d_fft(xp.asarray(small), x_k, xp=xp)
        got = got.get() if hasattr(got, "get") else got
        c1 = check.compare(got, exp, ab, R * R, rtol=1e-4)
        d_s, d_so = cuda.to_device(small), cuda.device_array(small.shape, np.float32)
        filter01_naive.filter2d_naive(d_s, d_k, d_so)
        c2 = check.compare(d_so.copy_to_host(), exp, ab, R * R)
        row["fft_max_rel_err"], row["direct_max_rel_err"] = c1.max_rel, c2.max_rel
        if not (c1.ok and c2.ok):
            print(f"  R={R}: WRONG fft {c1.summary()} direct {c2.summary()}")
            continue
        hold = {}
        row["fft_ms"] = queued_ms(ctx, lambda: hold.__setitem__(
            "y", fft_conv.filter2d_fft(x_img, x_k, xp=xp)), calls=5, repeat=5)
        row["direct_ms"] = queued_ms(ctx, lambda: filter01_naive.filter2d_naive(d_img, d_k, d_out),
                                     calls=5, repeat=5)
        if torch is not None:
            ti = torch.from_numpy(img).cuda()[None, None]
            tk = torch.from_numpy(k).cuda()[None, None]
            row["cudnn_ms"] = queued_ms(ctx, lambda: hold.__setitem__(
                "t", torch.nn.functional.conv2d(ti, tk, padding=R // 2)), calls=5, repeat=5)
        rows.append(row)
        print("  image", {k_: (round(v, 4) if isinstance(v, float) else v)
                          for k_, v in row.items()})
    res["image"] = dict(n=n, rows=rows,
                        crossover_vs_direct=fft_conv.crossover_size(rows),
                        crossover_vs_cudnn=fft_conv.crossover_size(rows, direct="cudnn_ms")
                        if rows and "cudnn_ms" in rows[0] else None)
    # (b) a conv layer: batch 8, 32 -> 32 channels, 64 x 64, cuDNN vs FFT
    if torch is not None or ctx.dry:
        N, C, K, H = (8, 32, 32, 64) if not ctx.dry else (1, 2, 2, 9)
        rows = []
        for R in ((3, 5, 7, 9, 11, 15, 21) if not ctx.dry else (3,)):
            x = check.random_array((N, C, H, H), rng)
            w = check.random_array((K, C, R, R), rng)
            xs, ws = x[:1, :, :23, :23], w  # checked on a small crop (the float64 reference)
            exp = ref.conv2d(xs.astype(np.float64), ws.astype(np.float64), padding=R // 2)
            ab = ref.conv2d(np.abs(xs).astype(np.float64), np.abs(ws).astype(np.float64),
                            padding=R // 2)
            gx, gw = xp.asarray(x), xp.asarray(w)
            got = fft_conv.conv2d_fft(xp.asarray(xs), gw, R // 2, xp=xp)
            got = got.get() if hasattr(got, "get") else got
            c1 = check.compare(got, exp, ab, C * R * R, rtol=1e-4)
            row = dict(R=R, fft_max_rel_err=c1.max_rel)
            hold = {}
            if c1.ok:
                row["fft_ms"] = queued_ms(ctx, lambda: hold.__setitem__(
                    "y", fft_conv.conv2d_fft(gx, gw, R // 2, xp=xp)), calls=5, repeat=5)
            if torch is not None:
                tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
                ts = torch.from_numpy(np.ascontiguousarray(xs)).cuda()
                c2 = check.compare(torch.nn.functional.conv2d(ts, tw, padding=R // 2)
                                   .cpu().numpy(), exp, ab, C * R * R)
                row["cudnn_max_rel_err"] = c2.max_rel
                if c2.ok:
                    row["direct_ms"] = queued_ms(ctx, lambda: hold.__setitem__(
                        "t", torch.nn.functional.conv2d(tx, tw, padding=R // 2)), calls=5,
                        repeat=5)
            rows.append(row)
            print("  layer", {k_: (round(v, 4) if isinstance(v, float) else v)
                              for k_, v in row.items()})
        ok = [r for r in rows if "fft_ms" in r and "direct_ms" in r]
        res["layer"] = dict(shape=[N, C, H, H], K=K, rows=rows,
                            crossover_vs_cudnn=fft_conv.crossover_size(ok) if ok else None)
    return res


@section("l11_fft_cpu", lessons=("11",))
def fft_cpu(ctx):
    import scipy.ndimage as ndi

    n = ctx.pick(1024, 32)
    rng = np.random.default_rng(14)
    img = check.random_array((n, n), rng)
    rows = []
    for R in ((3, 5, 9, 15, 25, 41) if not ctx.dry else (3, 5)):
        k = check.random_array((R, R), rng)
        a = ndi.correlate(img, k, mode="constant")
        b = fft_conv.filter2d_fft(img, k, xp=np)
        rel = float(np.abs(a - b).max() / np.abs(a).max())
        ta = ctx.clock.time_cpu(ndi.correlate, img, k, mode="constant", repeat=3).median_ms
        tb = ctx.clock.time_cpu(fft_conv.filter2d_fft, img, k, repeat=3).median_ms
        rows.append(dict(R=R, direct_ms=ta, fft_ms=tb, max_rel_diff=rel))
        print(f"  CPU {n}x{n} R={R}: direct (scipy.ndimage) {ta:8.2f} ms, FFT (numpy) "
              f"{tb:8.2f} ms, rel diff {rel:.1e}")
    return dict(n=n, rows=rows, crossover=fft_conv.crossover_size(rows),
                note="one thread each: scipy.ndimage.correlate vs numpy.fft")


# ---------------------------------------------------------------------------------------
# Lesson 11: Winograd


@section("l11_winograd_accuracy", lessons=("11",))
def wino_acc(ctx):
    rng = np.random.default_rng(15)
    shape = (2, 64, 28, 28) if not ctx.dry else (1, 4, 9, 9)
    x = check.random_array(shape, rng)
    w = check.random_array((shape[1], shape[1], 3, 3), rng)
    out = {}
    for m in (2, 4, 6):
        out[f"F({m}x{m},3x3)"] = winograd.accuracy(x, w, padding=1, m=m)
        print(f"  F({m}x{m},3x3): {out[f'F({m}x{m},3x3)']}")
    return dict(shape=list(shape), errors=out,
                note="|y - y64| / conv(|x|,|w|) over all outputs, float32 arithmetic")


@section("l11_winograd_gpu", lessons=("11",), optional=True)
def wino_gpu(ctx):
    """Winograd through CuPy (NumPy in a dry run) on the 128-channel layer, beside cuDNN."""
    if not ctx.dry:
        ctx.need("cupy")
    xp = np if ctx.dry else __import__("cupy")
    prob = ctx.pick(problems.conv_layer("resnet128"), problems.ConvProblem("dry", 2, 4, 9, 9, 4))
    rng = np.random.default_rng(16)
    x = check.random_array(prob.x_shape, rng)
    w = check.random_array(prob.w_shape, rng)
    gx, gw = xp.asarray(x), xp.asarray(w)
    x2 = x[:2].astype(np.float64)
    exp = ref.conv2d(x2, w.astype(np.float64), padding=1)
    ab = ref.conv2d(np.abs(x2), np.abs(w).astype(np.float64), padding=1)
    rows = []
    hold = {}
    for m in (2, 4):
        got = winograd.conv2d_winograd(gx[:2], gw, 1, m=m, xp=xp)
        comp = check.compare(got.get() if hasattr(got, "get") else got, exp, ab, prob.C * 9,
                             rtol=1e-4)
        ms = ctx.clock.time_gpu(lambda: hold.__setitem__(
            "y", winograd.conv2d_winograd(gx, gw, 1, m=m, xp=xp)), repeat=5).median_ms
        rows.append(dict(name=f"Winograd F({m}x{m},3x3), CuPy", ms=ms, ok=comp.ok,
                         max_rel_err=comp.max_rel))
    if baselines.torch_available():
        lad = bench.bench_conv([baselines.cudnn_conv_impl(prob, "fp32")], prob, verbose=False,
                               repeat=5, clock=ctx.clock)
        rows += [dict(name=r.name, ms=r.ms, ok=True, max_rel_err=r.max_rel_err)
                 for r in lad.rows]
    for r in rows:
        ctx.log(f"{prob.name} {r['name']:32s} {r['ms']:8.3f} ms ok={r['ok']} "
                f"err {r['max_rel_err']:.1e}")
    return dict(problem=str(prob), rows=rows)
