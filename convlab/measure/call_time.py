"""GPU time and call time side by side: what a Python loop pays per call, beside the kernel.

A kernel's GPU time (`bench.time_gpu_queued`: launches queued behind a spin kernel, so the
events see the kernels back to back) says nothing about the Python work of each call:
checks, planning, argument conversion, the launch itself. A learner calls a launcher in
a loop, and what that loop costs per call is the larger of the two. For the depthwise
layers, the 3x3 filter on a 4096 x 4096 image and the conv top (the tuned implicit GEMM
on 128ch 28x28), each row has, in microseconds:

- ``gpu_us``: GPU time (50 calls queued behind a spin kernel, median of 7);
- ``call_us``: wall time per call of a Python loop, synchronized at the end
  (`bench.time_call`);
- ``issue_us``: CPU time per call of the loop without waiting for the GPU (the launch
  overhead: `bench.launch_cost_us`);
- for a course launcher, the same three of a *bare* Numba launch of the same compiled
  kernel (``kernel[grid, block](...)``, device arrays flattened beforehand, scalars
  converted beforehand): the floor a Python launcher can reach; ``call_vs_bare`` is
  call_us / bare_call_us, ``issue_vs_bare`` the same for the issue times (the Python
  work alone, even where the GPU time hides it in call_us).

PyTorch's equivalent (``F.conv2d``, with ``groups=C`` for depthwise; TF32 off) gets the
same gpu / call / issue columns. Every implementation is checked before it is timed (the
conv top on its first image; the bare launch against the launcher's output). All calls
reuse the same buffers, so the small layers run from L2 in every row alike.

``python -m convlab measure call_time --out convlab/results --prefix h200`` stores
``h200_call_time.json``.
"""

from __future__ import annotations

import sys
import traceback

import numpy as np

from .. import baselines, check, problems
from .. import reference as ref
from .harness import Group

GROUP = Group("call_time", about="GPU time and call time from Python of the course's "
                                 "depthwise, filter and conv tops, a bare Numba launch of "
                                 "the same kernels, and PyTorch (us)")
section = GROUP.section

QUEUED_CALLS = 50


def _cuda():
    from ..runtime import cuda

    return cuda()


def _times(ctx, fn, queued: bool = True) -> dict:
    """gpu_us, call_us, issue_us of fn (see the module docstring); queued=False leaves
    gpu_us out (a call that synchronizes cannot queue behind the spin kernel)."""
    clock = ctx.clock
    gpu = clock.queued(fn, calls=QUEUED_CALLS, repeat=7).median_ms if queued else None
    call = clock.time_call(fn, repeat=5).median_ms
    issue = clock.launch_cost_us(fn, calls=200)
    return dict(gpu_us=1e3 * gpu if queued else None, call_us=1e3 * call, issue_us=issue)


def _checked(got, expected, absref, reduction, what):
    comp = check.compare(got, expected, absref, reduction)
    if not comp.ok:
        raise check.CheckError(f"{what}: {comp.summary()}")
    return comp.max_rel


def _bare(run, *args):
    """A bare launch of the kernel behind the plan's launch `run`: ``kernel[grid, block]``
    with pre-made arguments."""
    k, grid, block = run.dispatcher, run.griddim, run.blockdim
    return lambda: k[grid, block](*args)


def _flat(a):
    return a.reshape(a.size)


def _row(ctx, case, name, kind, fn, bare=None, max_rel=None, queued=True) -> dict:
    row = dict(case=case, name=name, kind=kind, **_times(ctx, fn, queued))
    if bare is not None:
        b = _times(ctx, bare)
        row.update(bare_gpu_us=b["gpu_us"], bare_call_us=b["call_us"],
                   bare_issue_us=b["issue_us"], call_vs_bare=row["call_us"] / b["call_us"],
                   issue_vs_bare=row["issue_us"] / b["issue_us"])
    row["max_rel_err"] = max_rel
    ctx.log(f"{case:40s} {name:34s} call {row['call_us']:8.1f} us")
    return row


def _torch_conv(torch, x, w, kw):
    """F.conv2d on device copies of x, w (fp32, TF32 off), and its output for the check."""
    import torch.nn.functional as F  # noqa: N812

    tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()

    def fn():
        return F.conv2d(tx, tw, **kw)

    return fn, fn().cpu().numpy()


def _depthwise(ctx, torch, rows):
    from ..kernels import depthwise01_direct as dw
    from ..kernels import depthwise02_smem as dws

    c = _cuda()
    for layer in ("dw512", "dw32"):
        prob = problems.depthwise_layer(layer)
        kw = dict(stride=1, padding=1, groups=prob.C)
        rng = np.random.default_rng(15)
        x = check.random_array(prob.x_shape, rng)
        w = check.random_array(prob.w_shape, rng)
        x64, w64 = x.astype(np.float64), w.astype(np.float64)
        exp = ref.conv2d(x64, w64, **kw)
        absref = ref.conv2d(np.abs(x64), np.abs(w64), **kw)
        dx, dwt = c.to_device(x), c.to_device(w)
        for name, mod, launcher in (("depthwise_smem", dws, dws.conv2d_depthwise_smem),
                                    ("depthwise_direct", dw, dw.conv2d_depthwise)):
            out = c.to_device(check.poisoned(exp.shape))
            launcher(dx, dwt, out, **kw)
            got = out.copy_to_host()
            err = _checked(got, exp, absref, 9, name)
            run, scalars = mod.plan(dx, dwt, out, 1, 1, 1, prob.C)
            scalars = scalars if isinstance(scalars, tuple) else (scalars,)
            bout = c.to_device(check.poisoned(exp.shape))
            bare = _bare(run, _flat(dx), _flat(dwt), _flat(bout), *scalars)
            bare()
            c.synchronize()
            if not np.array_equal(bout.copy_to_host(), got):
                raise check.CheckError(f"{name}: the bare launch differs from the launcher")
            rows.append(_row(ctx, prob.name, name, "course",
                             lambda f=launcher, a=(dx, dwt, out), k=kw: f(*a, **k), bare, err))
        if torch is not None:
            fn, tgot = _torch_conv(torch, x, w, kw)
            err = _checked(tgot, exp, absref, 9, "PyTorch")
            rows.append(_row(ctx, prob.name, "PyTorch F.conv2d", "library", fn, max_rel=err))


def _filter(ctx, torch, rows):
    from ..kernels import filter02_tiled as f2

    c = _cuda()
    n = ctx.pick(problems.image_size(), 24)
    rng = np.random.default_rng(16)
    image = check.random_array((n, n), rng)
    taps = check.random_array((3, 3), rng)
    exp = ref.filter2d(image.astype(np.float64), taps.astype(np.float64))
    absref = ref.filter2d(np.abs(image).astype(np.float64), np.abs(taps).astype(np.float64))
    case = f"filter 3x3 {n}x{n}"
    dimg, dtaps = c.to_device(image), c.to_device(taps)
    out = c.to_device(check.poisoned(exp.shape))
    # device taps: the launcher copies them to the host on every call (a synchronization,
    # so no GPU time queued behind the spin kernel: it is the NumPy-taps row's kernel)
    variants = (("filter2d_tiled (NumPy taps)", taps),
                ("filter2d_tiled (device taps)", dtaps))
    for name, k in variants:
        out.copy_to_device(check.poisoned(exp.shape))
        f2.filter2d_tiled(dimg, k, out)
        got = out.copy_to_host()
        err = _checked(got, exp, absref, 9, name)
        bare = None
        if k is taps:
            run, H, W = f2.plan(dimg, taps, out, taps, **f2.TILE)
            bout = c.to_device(check.poisoned(exp.shape))
            bare = _bare(run, _flat(dimg), _flat(bout), H, W)
            bare()
            c.synchronize()
            if not np.array_equal(bout.copy_to_host(), got):
                raise check.CheckError(f"{name}: the bare launch differs from the launcher")
        rows.append(_row(ctx, case, name, "course",
                         lambda k=k: f2.filter2d_tiled(dimg, k, out), bare, err,
                         queued=k is taps))
    if torch is not None:
        fn, tgot = _torch_conv(torch, image[None, None], taps[None, None], dict(padding=1))
        err = _checked(tgot[0, 0], exp, absref, 9, "PyTorch")
        rows.append(_row(ctx, case, "PyTorch F.conv2d", "library", fn, max_rel=err))


def _conv_top(ctx, torch, rows):
    from ..kernels import _blocking
    from ..kernels import conv07_implicit_gemm_warp_tiled as c7
    from ..kernels import conv08_implicit_gemm_tuned as c8

    c = _cuda()
    prob = problems.conv_layer("resnet128")
    kw = prob.kwargs
    rng = np.random.default_rng(17)
    x = check.random_array(prob.x_shape, rng)
    w = check.random_array(prob.w_shape, rng)
    first = dict(x=x[:1].astype(np.float64), w=w.astype(np.float64))
    exp = ref.conv2d(first["x"], first["w"], **kw)
    absref = ref.conv2d(np.abs(first["x"]), np.abs(first["w"]), **kw)
    red = prob.C * 9
    dx, dwt = c.to_device(x), c.to_device(w)
    out = c.to_device(check.poisoned(prob.out_shape))
    launcher = c8.conv2d_implicit_gemm_tuned
    launcher(dx, dwt, out, **kw)
    got = out.copy_to_host()
    if np.isnan(got).any():
        raise check.CheckError("implicit_gemm_tuned left NaN (unwritten) outputs")
    err = _checked(got[:1], exp, absref, red, "implicit_gemm_tuned")
    cfg = c8.choose(ref.conv_params(prob.x_shape, prob.w_shape, **kw))
    kernel = c7.launcher_for(cfg).kernel
    t = kernel.tile
    bout = c.to_device(check.poisoned(prob.out_shape))
    plan = _blocking.conv_plan("call_time bare", dx, dwt, bout, kw.get("stride", 1),
                               kw.get("padding", 0), kw.get("dilation", 1), kw.get("groups", 1),
                               t["BM"], t["BN"], t["BK"])
    wt = _blocking.rsck_weights_into(plan, dwt)
    xf, of, grid, threads = _flat(dx), _flat(bout), plan.grid, t["threads"]

    def bare():
        kernel[grid, threads](xf, wt, of, plan.prm)

    bare()
    c.synchronize()
    if not np.array_equal(bout.copy_to_host(), got):
        raise check.CheckError("implicit_gemm_tuned: the bare launch differs from the launcher")
    rows.append(_row(ctx, prob.name, f"implicit_gemm_tuned {cfg}", "course",
                     lambda: launcher(dx, dwt, out, **kw), bare, err))
    if torch is not None:
        fn, tgot = _torch_conv(torch, x[:1], w, kw)  # checked on the first image
        err = _checked(tgot, exp, absref, red, "PyTorch")
        fn, _ = _torch_conv(torch, x, w, kw)
        rows.append(_row(ctx, prob.name, "PyTorch F.conv2d", "library", fn, max_rel=err))


def table(rows) -> str:
    """name, GPU us, call us, bare-launch call us, call / bare (and the issue times)."""
    lines = [f"{'case':<40}{'name':<34}{'GPU us':>9}{'call us':>9}{'bare us':>9}"
             f"{'call/bare':>10}{'issue us':>10}{'bare iss':>10}"]

    def f(v, w=9, p=1):
        return f"{v:{w}.{p}f}" if v is not None else " " * (w - 1) + "-"

    for r in rows:
        lines.append(f"{r['case']:<40}{r['name']:<34}{f(r['gpu_us'])}{f(r['call_us'])}"
                     f"{f(r.get('bare_call_us'))}{f(r.get('call_vs_bare'), 10, 2)}"
                     f"{f(r['issue_us'], 10)}{f(r.get('bare_issue_us'), 10)}")
    lines.append("GPU: queued behind a spin kernel; call: per call of a Python loop, "
                 "synchronized at the end; bare: kernel[grid, block] with pre-made arguments; "
                 "issue: the loop without waiting for the GPU")
    return "\n".join(lines)


@section("call_time")
def call_time(ctx):
    """The rows of the module docstring for every case, and the table printed."""
    torch = baselines.set_torch_precision("fp32") if baselines.torch_available() else None
    rows, failed = [], {}
    for name, part in (("depthwise", _depthwise), ("filter", _filter),
                       ("conv_top", _conv_top)):
        try:
            part(ctx, torch, rows)
        except Exception as e:  # noqa: BLE001  (one broken case must not stop the others)
            traceback.print_exc(file=sys.stdout)
            failed[name] = f"{type(e).__name__}: {str(e)[:500]}"
    print(table(rows))
    if failed:
        print("FAILED cases:", failed)
    dws = [r["call_vs_bare"] for r in rows if r["name"] == "depthwise_smem"]
    out = dict(rows=rows, queued_calls=QUEUED_CALLS, torch=torch is not None,
               depthwise_smem_call_vs_bare_max=max(dws) if dws else None)
    if failed:
        out["failed"] = failed
        if not rows:
            raise RuntimeError(f"every case failed: {failed}")
    return out
