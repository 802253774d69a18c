# ruff: noqa: B023  (closures are called inside the loop iteration that made them)
"""The GPU measurements lessons 04, 05 and 06 show (stored as lessons04_06.json).

Lesson 04: transfers (pageable vs pinned), timing pitfalls (wall clock vs events), launch
overhead. Lessons 05-06: the conv ladder on the 128-channel layer with conv03's tile
variants and two NHWC kernels, the single-channel filter on a 4096 x 4096 image (tiles,
vector widths, pipelining; in GB/s against the copy bandwidth), bank conflicts in a
shared-memory transpose, the tiled GEMM of the im2col path vs cuBLAS. Every variant is
checked against a float64 reference before it is timed; the libraries (cuDNN through
PyTorch with TF32 off, cuBLAS through CuPy) are timed in the same run.
"""

from __future__ import annotations

import warnings

import numpy as np

from .. import baselines, bench, check, problems
from .. import reference as ref
from .harness import Group

GROUP = Group("lessons04_06", about=(
    "GPU measurements behind lessons 04-06 (python -m convlab measure 04 05 06): every "
    "variant checked against a float64 reference before it was timed; cuDNN via PyTorch "
    "and cuBLAS via CuPy, TF32 off, in the same run."))
section = GROUP.section

GAUSS = np.array([[1, 2, 1], [2, 4, 2], [1, 2, 1]], np.float32) / 16
SOBEL_X = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], np.float32)
DRY_LAYER = problems.ConvProblem("dry 4ch 9x7", 1, 4, 9, 7, 4)  # odd, tiny


def _env(ctx) -> dict:
    return dict(ceilings=ctx.clock.ceilings())


GROUP.environment = _env


def copy_gbps(ctx) -> float:
    return ctx.env.get("ceilings", {}).get("copy_gbps") or ctx.clock.copy_bandwidth()


# ---------------------------------------------------------------------------------------
# Lesson 04


@section("l04_transfers", lessons=("04",))
def transfers(ctx):
    sizes = ctx.pick((2**12, 2**16, 2**20, 2**24, 2**28), (2**12,))
    rows = ctx.clock.transfer_table(sizes)
    for r in rows:
        ctx.log(f"{r['bytes']} " + str({k: round(v["gbps"], 1) for k, v in r.items()
                                         if k != "bytes"}))
    return rows


@section("l04_timing_pitfalls", lessons=("04",))
def timing_pitfalls(ctx):
    """Wall clock without synchronize measures the launch, not the kernel."""
    from ..kernels import conv01_naive
    from ..runtime import cuda

    c = cuda()
    prob = ctx.pick(problems.conv_layer("resnet128"), DRY_LAYER)
    rng = np.random.default_rng(1)
    x = c.to_device(check.random_array(prob.x_shape, rng))
    w = c.to_device(check.random_array(prob.w_shape, rng))
    y = c.device_array(prob.out_shape, np.float32)
    return dict(problem=str(prob), **ctx.clock.wall_vs_events(conv01_naive.conv2d_naive, x, w,
                                                               y, **prob.kwargs))


@section("l04_launch_overhead", lessons=("04",))
def launch_overhead(ctx):
    """An empty kernel's launch cost and GPU time; the course's launchers' CPU cost."""
    from ..kernels import conv01_naive, conv03_tiled, filter02_tiled
    from ..runtime import cuda

    c = cuda()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = ctx.clock.launch_overhead()
        prob = ctx.pick(problems.conv_layer("resnet128"), DRY_LAYER)
        x = c.device_array(prob.x_shape, np.float32)
        w = c.device_array(prob.w_shape, np.float32)
        y = c.device_array(prob.out_shape, np.float32)
        n = ctx.pick(problems.image_size(), 16)
        img, out = c.device_array((n, n), np.float32), c.device_array((n, n), np.float32)
        taps = c.to_device(GAUSS)
        for name, fn in (("conv2d_naive", lambda: conv01_naive.conv2d_naive(x, w, y, padding=1)),
                         ("conv2d_tiled", lambda: conv03_tiled.conv2d_tiled(x, w, y, padding=1)),
                         ("filter2d_tiled_host_taps", lambda: filter02_tiled.launch(
                             img, taps, out, taps=GAUSS, **filter02_tiled.TILE)),
                         ("filter2d_tiled_device_taps",
                          lambda: filter02_tiled.filter2d_tiled(img, taps, out))):
            r[f"{name}_cpu_us"] = ctx.clock.launch_cost_us(fn, calls=20)
    ctx.log(str({k: round(v, 1) for k, v in r.items()}))
    return r


# ---------------------------------------------------------------------------------------
# Lessons 05 and 06: the conv ladder, tile variants, NHWC

CONV_TILES = [dict(tx=32, ty=8, kpt=8, cb=8), dict(tx=32, ty=4, kpt=8, cb=8),
              dict(tx=16, ty=16, kpt=8, cb=8), dict(tx=28, ty=7, kpt=4, cb=8),
              dict(tx=28, ty=7, kpt=16, cb=8), dict(tx=28, ty=7, kpt=8, cb=16),
              dict(tx=28, ty=7, kpt=8, cb=4), dict(tx=28, ty=7, kpt=1, cb=8)]


def tile_name(t) -> str:
    return "tiled " + "x".join(str(t[k]) for k in ("tx", "ty")) + f" k{t['kpt']} c{t['cb']}"


def tiled_launcher(t):
    from ..kernels import conv03_tiled

    def fn(x, w, out, stride=1, padding=0, dilation=1, groups=1):
        return conv03_tiled.launch(x, w, out, stride, padding, dilation, groups, **t)
    return fn


_NHWC: dict = {}


def nhwc_channels_kernel():
    """Lesson 05's exercise design: thread x -> output channel k (x NHWC, w RSCK, y NHWC)."""
    if not _NHWC:
        from numba import float32

        from ..runtime import cuda

        c = cuda()

        @c.jit
        def conv2d_nhwc_channels(x, w, y, sh, sw, ph, pw):
            k = c.blockIdx.x * c.blockDim.x + c.threadIdx.x
            q = c.blockIdx.y * c.blockDim.y + c.threadIdx.y
            npix = c.blockIdx.z
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
                            for ch in range(C):
                                acc += x[n, h, col, ch] * w[r, s, ch, k]
            y[n, p, q, k] = acc

        _NHWC["kernel"] = conv2d_nhwc_channels
    return _NHWC["kernel"]


def nhwc_impl(name: str, kind: str, prob) -> bench.Impl:
    """An Impl that stores x, w as NHWC / RSCK, runs an NHWC kernel, returns NCHW."""
    from ..kernels import layout
    from ..runtime import cuda

    def prepare(x, w):
        c = cuda()
        xh, wh = layout.nhwc_inputs(x, w)
        N, K, P, Q = prob.out_shape
        return dict(x=c.to_device(xh), w=c.to_device(wh),
                    out=c.to_device(check.poisoned((N, P, Q, K))))

    def run(s):
        if kind == "pixels":
            layout.conv2d_nhwc_pixels(s["x"], s["w"], s["out"], **prob.kwargs)
        else:
            N, P, Q, K = s["out"].shape
            grid = ((K + 31) // 32, (Q + 7) // 8, N * P)
            nhwc_channels_kernel()[grid, (32, 8)](s["x"], s["w"], s["out"], prob.stride,
                                                  prob.stride, prob.padding, prob.padding)

    return bench.Impl(name, prepare, run, lambda s: s["out"].copy_to_host().transpose(0, 3, 1, 2))


def conv_ladder(ctx, prob, tiles, nhwc=False) -> dict:
    from ..kernels import conv01_naive, conv02_coalesced, conv03_tiled

    default = "x".join(map(str, conv03_tiled.fit_tile(*prob.out_shape[2:])))
    impls = [bench.launcher_impl("naive", conv01_naive.conv2d_naive, prob),
             bench.launcher_impl("coalesced", conv02_coalesced.conv2d_coalesced, prob),
             bench.launcher_impl(f"tiled (default: {default} k{conv03_tiled.TILE['kpt']} "
                                 f"c{conv03_tiled.TILE['cb']})", conv03_tiled.conv2d_tiled, prob)]
    impls += [bench.launcher_impl(tile_name(t), tiled_launcher(t), prob) for t in tiles]
    if nhwc:
        impls += [nhwc_impl("NHWC, threads on q", "pixels", prob),
                  nhwc_impl("NHWC, threads on k", "channels", prob)]
    if baselines.torch_available():
        impls.append(baselines.cudnn_conv_impl(prob, "fp32"))
    if baselines.cupy_available():
        impls.append(baselines.cublas_im2col_impl(prob))
    lad = bench.bench_conv(impls, prob, baseline="cuDNN fp32", repeat=10, clock=ctx.clock)
    return lad.to_dict()


@section("l06_conv_ladder_resnet128", lessons=("04", "05", "06"))
def conv_ladder_resnet128(ctx):
    return conv_ladder(ctx, ctx.pick(problems.conv_layer("resnet128"), DRY_LAYER),
                       ctx.pick(CONV_TILES, []), nhwc=True)


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


def ftile_name(t) -> str:
    name = f"tiled {t['tx']}x{t['ty']} v{t['v']}" + (f" pad{t['pad']}" if t.get("pad") else "")
    if t.get("chunks", 1) > 1:
        name = "pipelined" + name[5:] + f" ch{t['chunks']}" + (
            f" mb{t['min_blocks']}" if t.get("min_blocks") else "")
    return name


@section("l06_filter_4096", lessons=("04", "05", "06", "11"))
def filter_4096(ctx):
    from ..kernels import filter01_naive, filter02_tiled
    from ..runtime import cuda

    c = cuda()
    n = ctx.pick(problems.image_size(), 12)
    copy = copy_gbps(ctx)
    rng = np.random.default_rng(3)
    img = check.random_array((n, n), rng)
    nbytes = 2 * img.nbytes  # read the image once, write the output once
    d_img, d_out = c.to_device(img), c.device_array((n, n), np.float32)
    rows, not_timed = [], []
    for fname, taps in (("gauss3", GAUSS), ("sobel_x", SOBEL_X)):
        expected = ref.filter2d(img.astype(np.float64), taps.astype(np.float64))
        absref = ref.filter2d(np.abs(img).astype(np.float64), np.abs(taps).astype(np.float64))
        d_taps = c.to_device(taps)
        variants = [("naive", lambda: filter01_naive.filter2d_naive(d_img, d_taps, d_out)),
                    ("naive rows (uncoalesced)",
                     lambda: filter01_naive.filter2d_naive_rows(d_img, d_taps, d_out))]
        tiles = [FILTER_TILES[0], FILTER_TILES[8]]  # one plain, one pipelined
        if fname == "gauss3" or ctx.dry:
            tiles = ctx.pick(FILTER_TILES, tiles if fname == "gauss3" else [])
        for t in tiles:
            variants.append((ftile_name(t), lambda t=t: filter02_tiled.launch(
                d_img, d_taps, d_out, taps=taps, **t)))
        holder = {}
        if baselines.torch_available():
            torch = baselines.set_torch_precision("fp32")
            ti = torch.from_numpy(img).cuda()[None, None]
            tk = torch.from_numpy(taps).cuda()[None, None]

            def torch_run():
                holder["y"] = torch.nn.functional.conv2d(ti, tk, padding=1)

            variants.append(("cuDNN (torch conv2d)", torch_run))
        for name, fn in variants:
            try:
                d_out.copy_to_device(check.poisoned((n, n)))
                fn()
                c.synchronize()
                lib = name.startswith("cuDNN")
                got = holder["y"][0, 0].cpu().numpy() if lib else d_out.copy_to_host()
                comp = check.compare(got, expected, absref, 9)
                if not comp.ok:
                    raise check.CheckError(comp.summary())
                ms = ctx.clock.time_gpu(fn).median_ms  # from Python, launch after launch
                gpu = ms if lib else ctx.clock.queued(fn).median_ms
            except Exception as e:  # noqa: BLE001  (a variant that fails is data, not a stop)
                not_timed.append(dict(filter=fname, name=name, error=f"{type(e).__name__}: "
                                                                     f"{str(e)[:300]}"))
                continue
            gbps = nbytes / (gpu * 1e-3) / 1e9
            rows.append(dict(filter=fname, name=name, ms=gpu, per_call_ms=ms, gbps=gbps,
                             pct_copy=100 * gbps / copy, max_rel_err=comp.max_rel))
            ctx.log(f"{fname:8s} {name:34s} {gpu * 1e3:7.1f} us GPU ({ms * 1e3:6.1f} per call) "
                    f"{gbps:6.0f} GB/s {100 * gbps / copy:5.1f}% of copy")
    return dict(n=n, bytes=nbytes, copy_gbps=copy, rows=rows, not_timed=not_timed)


# ---------------------------------------------------------------------------------------
# Lesson 06: bank conflicts in a shared-memory transpose (NCHW -> NHWC)


@section("l06_transpose_bank_conflicts", lessons=("05", "06"))
def transpose_bank_conflicts(ctx):
    from ..kernels import layout
    from ..runtime import cuda

    c = cuda()
    prob = ctx.pick(problems.conv_layer("resnet64"), DRY_LAYER)
    x = check.random_array(prob.x_shape, np.random.default_rng(4))
    N, C, H, W = x.shape
    dx, dy = c.to_device(x), c.device_array((N, H, W, C), np.float32)
    copy = copy_gbps(ctx)
    rows = []
    for pad in (0, 1):
        dy.copy_to_device(check.poisoned((N, H, W, C)))
        layout.nchw_to_nhwc(dx, dy, pad=pad)
        if not np.array_equal(dy.copy_to_host(), x.transpose(0, 2, 3, 1)):
            raise check.CheckError(f"transpose pad={pad} is wrong")
        per_call = ctx.clock.time_gpu(layout.nchw_to_nhwc, dx, dy, pad=pad).median_ms
        ms = ctx.clock.queued(layout.nchw_to_nhwc, dx, dy, pad=pad).median_ms
        gbps = 2 * x.nbytes / (ms * 1e-3) / 1e9
        rows.append(dict(pad=pad, ms=ms, per_call_ms=per_call, gbps=gbps,
                         pct_copy=100 * gbps / copy))
        ctx.log(str(rows[-1]))
    return dict(shape=list(x.shape), rows=rows)


# ---------------------------------------------------------------------------------------
# Lesson 06: the tiled GEMM of the im2col path vs cuBLAS


@section("l06_gemm", lessons=("06",))
def gemm(ctx):
    from ..kernels import gemm01_tiled
    from ..runtime import cuda

    c = cuda()
    prob = ctx.pick(problems.conv_layer("resnet128"), DRY_LAYER)
    p = ref.conv_params(prob.x_shape, prob.w_shape, **prob.kwargs)
    s = ctx.pick(problems.gemm_size(), 17)
    shapes = [("im2col " + prob.name.split(" (")[0], p.K, p.N * p.P * p.Q, p.C * p.R * p.S),
              (f"square {s}", s, s, s)]
    shapes = ctx.pick(shapes, shapes[1:])
    rows = []
    for label, M, N, K in shapes:
        rng = np.random.default_rng(5)
        a, b = check.random_array((M, K), rng), check.random_array((K, N), rng)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        expected, absref = a64 @ b64, np.abs(a64) @ np.abs(b64)
        da, db = c.to_device(a), c.to_device(b)
        dc = c.device_array((M, N), np.float32)
        impls = [("tiled 32x32", lambda: gemm01_tiled.launch(da, db, dc, 32)),
                 ("tiled 16x16", lambda: gemm01_tiled.launch(da, db, dc, 16))]
        hold = {}
        if baselines.cupy_available():
            import cupy as cp

            ca, cb = cp.asarray(a), cp.asarray(b)
            impls.append(("cuBLAS", lambda: hold.__setitem__("c", ca @ cb)))
        for name, fn in ctx.pick(impls, impls[1:]):
            dc.copy_to_device(check.poisoned((M, N)))
            fn()
            c.synchronize()
            got = hold["c"].get() if name == "cuBLAS" else dc.copy_to_host()
            comp = check.compare(got, expected, absref, K)
            if not comp.ok:  # reported, never timed
                ctx.log(f"{label} {name}: WRONG {comp.summary()}")
                continue
            ms = ctx.clock.time_gpu(fn).median_ms
            rows.append(dict(shape=label, M=M, N=N, K=K, name=name, ms=ms,
                             tflops=2 * M * N * K / (ms * 1e-3) / 1e12))
            ctx.log(f"{label:24s} {name:12s} {ms:8.3f} ms {rows[-1]['tflops']:6.2f} TFLOP/s")
    return rows


@section("l06_conv_other_layers", lessons=("05",), optional=True)
def conv_other_layers(ctx):
    layers = ctx.pick([problems.conv_layer(n) for n in ("resnet64", "resnet256")], [DRY_LAYER])
    return [conv_ladder(ctx, prob, []) for prob in layers]
