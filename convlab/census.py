"""Where a real CNN's time goes: ResNet-18 counted and timed by kind of layer.

- `resnet18()`: ResNet-18 (He et al. 2016) built from torch.nn layers, inference mode.
- `census_flops(model, x_shape)`: FLOPs of one forward pass by kind of layer (`KINDS`).
- `census_time(model, x)`: time of one pass by kind of layer (CUDA events on the GPU,
  perf_counter on the CPU), with the pass's time without hooks beside it.
- `conv_share_isolated(model, x)`: the convolutions' share of the pass, each Conv2d timed
  alone on the input it receives in the network (no hooks in the timed work).
- `census_gpu(model, x)`: the GPU's own view of one pass. An eager pass from Python is
  bound by the rate at which Python issues kernels (a few ms for ResNet-18 whatever the
  precision), so its wall time says little about the GPU. Here the pass is captured in a
  CUDA graph and its replay timed with CUDA events (GPU time); the profiler's per-kernel
  GPU times, attributed to the kind of layer that launched each kernel, give the shares;
  the eager call's wall time (CPU issue time) is reported beside them.
- `census_precisions(batch, side)`: `census_gpu` at fp32 (TF32 off), tf32 and fp16 NHWC.
- `conv_share`, `kernel_table`, `summarize`: the arithmetic behind it, on plain data.

Needs PyTorch (the ``torch`` extra); importing this module does not.
"""

from __future__ import annotations

import time

import numpy as np

from . import bench

# Describing the network stays usable inside graded answers (grading sandbox).
GRADING_ALLOWED = ("resnet18", "census_flops", "census_time")

KINDS = ("convolution", "batch norm", "ReLU", "residual add", "pooling", "fully connected")
OTHER = "other"  # GPU kernels launched outside every layer of KINDS
CLAIM_PCT = 70.0  # source 000: convolutions take over 70% of a CNN's time

# (label, dtype name or None, NHWC, torch precision switch): the census's variants
PRECISIONS = (("fp32", None, False, "fp32"), ("tf32", None, False, "tf32"),
              ("fp16 NHWC", "float16", True, "fp32"))


def resnet18(classes: int = 1000):
    """ResNet-18 (He et al. 2016) in inference mode, built from torch.nn layers."""
    import torch

    nn = torch.nn

    class Add(nn.Module):  # the residual addition, as a module so that it can be timed
        def forward(self, a, b):
            return a + b

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()
            self.add = Add()
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            idt = x if self.down is None else self.down(x)
            y = self.relu1(self.bn1(self.conv1(x)))
            return self.relu2(self.add(self.bn2(self.conv2(y)), idt))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in [(64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
                         (512, 1)]:
        layers.append(Block(cin, cout, stride))
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    model = nn.Sequential(*layers).eval()
    model.Add = Add
    return model


def _kind(mod, add_cls) -> str | None:
    import torch

    nn = torch.nn
    table = {nn.Conv2d: "convolution", nn.BatchNorm2d: "batch norm", nn.ReLU: "ReLU",
             nn.MaxPool2d: "pooling", nn.AdaptiveAvgPool2d: "pooling",
             nn.Linear: "fully connected"}
    if isinstance(mod, add_cls):
        return "residual add"
    return table.get(type(mod))


def _placed(model, x, dtype, channels_last):
    """The model on x's device, both in `dtype` (if given) and NHWC memory order (if asked)."""
    import torch

    model = model.to(x.device)
    if dtype is not None:
        model, x = model.to(dtype), x.to(dtype)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    return model, x


def census_flops(model, x_shape) -> dict:
    """FLOPs of one forward pass by kind of layer (multiply-add = 2 FLOPs), from hooks."""
    import torch

    flops = dict.fromkeys(KINDS, 0)
    hooks = []

    def hook(mod, inp, out):
        kind = _kind(mod, model.Add)
        n_out = out.numel()
        if kind == "convolution":
            k = mod.weight.shape[1] * mod.weight.shape[2] * mod.weight.shape[3]
            flops[kind] += 2 * n_out * k
        elif kind == "fully connected":
            flops[kind] += 2 * n_out * mod.in_features
        elif kind == "batch norm":
            flops[kind] += 2 * n_out
        elif kind == "pooling":
            ks = mod.kernel_size if isinstance(mod, torch.nn.MaxPool2d) else None
            flops[kind] += n_out * (ks * ks if ks else inp[0].shape[2] * inp[0].shape[3])
        elif kind is not None:
            flops[kind] += n_out

    for m in model.modules():
        if _kind(m, model.Add):
            hooks.append(m.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(torch.zeros(x_shape))
    finally:
        for h in hooks:
            h.remove()
    return flops


def census_time(model, x, runs: int = 5, dtype=None, channels_last: bool = False) -> dict:
    """Time of one forward pass by kind of layer, in ms, median over `runs` passes.

    Every timed module gets a pre- and a post-hook: on the GPU they record CUDA events
    (read after the pass, so timing does not serialise the work); on the CPU perf_counter.
    Returns {kind: ms, ..., "total": ms of the whole pass (without hooks: "unhooked")}.
    On the GPU an eager pass is paced by Python issuing kernels, and hooks slow it more:
    the GPU waits between layers and those waits count in the layers. For the GPU's own
    time by kind use `census_gpu`.
    """
    import torch

    device = x.device.type == "cuda"
    model, x = _placed(model, x, dtype, channels_last)
    marks = []

    def stamp():
        if device:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def pre(mod, inp):
        mod._convlab_t0 = stamp()

    def post(mod, inp, out):
        marks.append((_kind(mod, model.Add), mod._convlab_t0, stamp()))

    def elapsed(t0, t1):
        return t0.elapsed_time(t1) if device else (t1 - t0) * 1e3

    hooks = []
    for m in model.modules():
        if _kind(m, model.Add):
            hooks += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    per_run = []
    try:
        with torch.no_grad():
            model(x)
            if device:
                torch.cuda.synchronize()
            for _ in range(runs):
                marks.clear()
                t0 = stamp()
                model(x)
                t1 = stamp()
                if device:
                    torch.cuda.synchronize()
                ms = dict.fromkeys(KINDS, 0.0)
                for kind, a, b in marks:
                    ms[kind] += elapsed(a, b)
                ms["total"] = elapsed(t0, t1)
                per_run.append(ms)
    finally:
        for h in hooks:
            h.remove()
    out = {k: float(np.median([r[k] for r in per_run])) for k in per_run[0]}
    with torch.no_grad():  # the same pass without hooks, for the overhead of measuring
        def plain():
            model(x)
        if device:
            out["unhooked"] = bench.time_gpu(plain, repeat=max(3, runs), warmup=1).median_ms
        else:
            out["unhooked"] = bench.time_cpu(plain, repeat=max(3, runs)).median_ms
    return out


def conv_share_isolated(model, x, runs: int = 5, dtype=None, channels_last: bool = False):
    """Convolutions' share of a forward pass without hooks in the timed work: every Conv2d
    is timed alone on the input it receives in the network (captured once), the times are
    summed and divided by the time of the whole pass (no hooks). On the GPU by CUDA events
    (bench.time_gpu, calls queued back to back), on the CPU by perf_counter.
    Returns dict(conv_ms, total_ms, share_pct, convs). On the GPU the whole pass's time is
    an eager call's, paced by Python's launches: `census_gpu` measures the share in GPU time."""
    import torch

    device = x.device.type == "cuda"
    model, x = _placed(model, x, dtype, channels_last)
    seen = []
    hooks = [m.register_forward_hook(lambda mod, inp, out: seen.append((mod, inp[0])))
             for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        try:
            model(x)
        finally:
            for h in hooks:
                h.remove()
        timer = bench.time_gpu if device else bench.time_cpu
        kw = dict(repeat=runs, warmup=1)
        conv_ms = sum(timer(lambda m=m, i=i: m(i), **kw).median_ms for m, i in seen)
        total = timer(lambda: model(x), **kw).median_ms
    return dict(conv_ms=conv_ms, total_ms=total, share_pct=100 * conv_ms / total,
                convs=len(seen))


# ----------------------------------------------------------------------------------------
# The GPU's view: CUDA graph replay, profiler kernel times by kind, CPU issue time beside

RANGE = "census:"  # profiler range names: "census:<kind>", one around every layer's call
CONV_NAMES = ("conv", "fprop", "winograd", "fft", "implicit_gemm", "xmma_fprop")


def kernel_kind(name: str, launched_by: str | None) -> str:
    """The kind a GPU kernel's time counts for: the kind of layer that launched it; a
    kernel launched outside every layer counts as convolution when its name says so
    (cuDNN's ``..._fprop_...``, ``implicit_gemm``, ``winograd``, ``fft2d_...``), else OTHER."""
    if launched_by in KINDS:
        return launched_by
    low = name.lower()
    return "convolution" if any(k in low for k in CONV_NAMES) else OTHER


def _launcher_kind(event) -> str | None:
    """The kind named by the innermost "census:<kind>" range around a profiler event."""
    while event is not None:
        if event.name.startswith(RANGE):
            return event.name[len(RANGE):]
        event = event.cpu_parent
    return None


def kernel_table(events) -> list:
    """[(kernel name, kind, GPU us)] from profiler events (FunctionEvent-like: ``name``,
    ``kernels`` (name, device, duration in us) and ``cpu_parent``): every kernel a CPU op
    launched, with the kind of the layer around that op (`kernel_kind`). Ranges' own GPU
    spans (named like the range) are not kernels and are left out."""
    rows = []
    for e in events:
        for k in getattr(e, "kernels", None) or ():
            if k.name.startswith(RANGE) or k.name == e.name:
                continue
            rows.append((k.name, kernel_kind(k.name, _launcher_kind(e)), float(k.duration)))
    return rows


def conv_share(by_kind_ms: dict) -> float:
    """Convolutions' share of GPU kernel time, in %: conv / sum of every kind (OTHER too)."""
    total = sum(by_kind_ms.get(k, 0.0) for k in (*KINDS, OTHER))
    if total <= 0:
        raise ValueError(f"no GPU kernel time to share out: {by_kind_ms}")
    return 100.0 * by_kind_ms.get("convolution", 0.0) / total


def summarize(kernels, graph_ms: float, eager: dict, top: int = 8) -> dict:
    """One census record from kernel rows (`kernel_table`), the graph's GPU time and the
    eager times (`eager_time`).

    Returns {kind: GPU ms per pass (KINDS and OTHER), "kernel_ms": their sum,
    "conv_share_pct": the convolutions' share of kernel time, "holds": share > 70%,
    "graph_ms": CUDA graph replay, "eager_ms" / "issue_ms": the eager call's wall time with
    and without waiting for the GPU, "coverage": kernel_ms / graph_ms (the rest: gaps
    between kernels), "kernels": launches per pass, "top_kernels": the largest by time}.
    The share's denominator is GPU time, never eager wall time (Python's launch rate).
    """
    by_kind = dict.fromkeys((*KINDS, OTHER), 0.0)
    per_name: dict = {}
    for name, kind, us in kernels:
        us = float(us)
        by_kind[kind] += us / 1e3
        row = per_name.setdefault((name, kind), [0.0, 0])
        row[0] += us
        row[1] += 1
    kernel_ms = sum(by_kind.values())
    share = float(conv_share(by_kind))
    biggest = sorted(per_name.items(), key=lambda kv: -kv[1][0])[:top]
    return dict(by_kind, kernel_ms=kernel_ms, conv_share_pct=share, holds=bool(share > CLAIM_PCT),
                graph_ms=float(graph_ms), eager_ms=float(eager["eager_ms"]),
                issue_ms=float(eager["issue_ms"]), coverage=kernel_ms / float(graph_ms),
                kernels=len(kernels),
                top_kernels=[dict(name=n[:160], kind=k, us=us, calls=c)
                             for (n, k), (us, c) in biggest])


def eager_time(fn, sync, runs: int = 10, now=time.perf_counter) -> dict:
    """The eager call's wall time from Python, median of `runs`, in ms: "issue_ms" until
    fn returns (the CPU's issue time: its kernels are queued, not done), "eager_ms" until
    `sync()` returns too (what a stopwatch around a synchronised call reads)."""
    fn()
    sync()
    issue, wall = [], []
    for _ in range(runs):
        sync()
        t0 = now()
        fn()
        t1 = now()
        sync()
        t2 = now()
        issue.append((t1 - t0) * 1e3)
        wall.append((t2 - t0) * 1e3)
    return dict(issue_ms=float(np.median(issue)), eager_ms=float(np.median(wall)))


def cuda_graph(fn, warmup: int = 3):
    """Capture ``fn()`` (static inputs) in a CUDA graph; returns the graph's replay.

    As PyTorch's CUDA-graph docs do it: warm-up calls on a side stream first (lazy
    initialisation, cuDNN's algorithm choice, the allocator), then the capture."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph.replay


def time_events(fn, warmup: int = 2, repeat: int = 20) -> bench.Timing:
    """GPU time of ``fn()`` by CUDA events recorded around each call, median of `repeat`."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeat):
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return bench.Timing(samples, f"CUDA graph replay, cuda events, median of {repeat}")


def graph_time(fn, runs: int = 20, timer=None, capture=None) -> bench.Timing:
    """GPU time of one ``fn()`` without Python in the way: ``capture(fn)`` (default
    `cuda_graph`) records it once, ``timer(replay, warmup=, repeat=)`` (default
    `time_events`; a clock's ``time_gpu`` fits) times the replay."""
    replay = (capture or cuda_graph)(fn)
    return (timer or time_events)(replay, warmup=2, repeat=runs)


def profile_events(model, x):
    """Profiler events of one pass of `model` on `x` (PyTorch profiler: CPU ops, and the
    GPU's kernels when x is on the GPU), with a "census:<kind>" range around every layer
    of KINDS (hooks; they cost CPU time, which kernel times do not count)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    gpu = x.device.type == "cuda"

    def pre(mod, inp):
        mod._convlab_range = record_function(RANGE + _kind(mod, model.Add))
        mod._convlab_range.__enter__()

    def post(mod, inp, out):
        mod._convlab_range.__exit__(None, None, None)

    hooks = []
    for m in model.modules():
        if _kind(m, model.Add):
            hooks += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    try:
        with torch.no_grad(), profile(activities=acts) as prof:
            model(x)
            if gpu:
                torch.cuda.synchronize()
    finally:
        for h in hooks:
            h.remove()
    return prof.events()


def profile_kernels(model, x) -> list:
    """`kernel_table` of one profiled eager pass (`profile_events`; x on the GPU)."""
    return kernel_table(profile_events(model, x))


def census_gpu(model, x, runs: int = 20, dtype=None, channels_last: bool = False,
               timer=None) -> dict:
    """GPU time of one forward pass by kind of layer, the CPU's issue time beside (`summarize`).

    x on the GPU. Eager passes first (cuDNN picks its algorithms: set
    torch.backends.cudnn.benchmark before), then the pass captured in a CUDA graph and
    replayed `runs` times (GPU time), then eager passes timed from Python (issue time),
    then one profiled eager pass (kernel times by kind: the profiler never sees the graph).
    `timer`: see `graph_time`."""
    import torch

    model, x = _placed(model, x, dtype, channels_last)
    with torch.no_grad():
        def fwd():
            model(x)

        for _ in range(3):
            fwd()
        torch.cuda.synchronize()
        graph = graph_time(fwd, runs=runs, timer=timer)
        eager = eager_time(fwd, torch.cuda.synchronize, runs=max(3, runs // 2))
        kernels = profile_kernels(model, x)
    return summarize(kernels, graph.median_ms, eager)


def census_precisions(batch: int, side: int = 224, runs: int = 20, precisions=PRECISIONS,
                      seed: int = 0, device: str = "cuda") -> dict:
    """`census_gpu` of ResNet-18 at each precision of `precisions`, on one random batch.

    Returns {"batch", "side", "flops": census_flops at this batch, label: record, ...};
    PyTorch's precision switches are left at fp32 (TF32 off)."""
    import torch

    from . import baselines

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 3, side, side, generator=g).to(device)
    flops = census_flops(resnet18(), (1, 3, side, side))
    out = dict(batch=batch, side=side, flops={k: v * batch for k, v in flops.items()})
    try:
        for label, dtype, nhwc, switch in precisions:
            baselines.set_torch_precision(switch)
            out[label] = census_gpu(resnet18(), x, runs=runs,
                                    dtype=getattr(torch, dtype) if dtype else None,
                                    channels_last=nhwc)
    finally:
        baselines.set_torch_precision("fp32")
    return out


def at_batch(stored: dict, batch: int) -> dict:
    """The census of a stored run at `batch`: the top level (its own batch) or "by_batch"."""
    if stored.get("batch") == batch:
        return stored
    try:
        return stored["by_batch"][str(batch)]
    except KeyError:
        have = [stored.get("batch")] + [int(b) for b in stored.get("by_batch", {})]
        raise KeyError(f"no stored census at batch {batch} (stored: {have})") from None


def stored(batch: int | None = None, name: str = "h200_lessons12_13") -> dict | None:
    """The census of a stored GPU run (convlab/results/<name>.json) at `batch` (default:
    the run's own batch), with "device" and "date"; None where the run has none."""
    from . import results

    try:
        data = results.load(name)
        c = data["census"]
        c = at_batch(c, c["batch"] if batch is None else batch)
    except (FileNotFoundError, KeyError):
        return None
    return dict(c, device=data.get("device"), date=data.get("date"))


def measured(record) -> bool:
    """Whether a census record has the GPU-time fields (`summarize`)."""
    return isinstance(record, dict) and "graph_ms" in record and "conv_share_pct" in record


def report(c: dict, labels=None) -> list:
    """Lines that state the census of `c` (`census_precisions` or `stored`): per precision
    the convolutions' share of GPU time and the claim's verdict, GPU time beside the
    eager call's CPU issue time; then what the two clocks say, from the same numbers."""
    labels = [lab for lab, *_ in PRECISIONS] if labels is None else list(labels)
    rows = [(lab, c[lab]) for lab in labels if lab in c]
    lines = []
    for lab, t in rows:
        if not measured(t):
            lines.append(f"{lab:<10}: no GPU-time census in this run")
            continue
        lines.append(
            f"{lab:<10}: convolutions {t['conv_share_pct']:3.0f}% of GPU time "
            f"({'over' if t['holds'] else 'not over'} {CLAIM_PCT:.0f}%) | GPU time "
            f"{t['graph_ms']:.2f} ms per pass (CUDA graph; kernels {t['kernel_ms']:.2f} ms) "
            f"| eager call from Python {t['eager_ms']:.2f} ms, of which issuing "
            f"{t['issue_ms']:.2f} ms")
    done = [t for _, t in rows if measured(t)]
    if not done:
        return lines
    held = sum(t["holds"] for t in done)
    lines.append(f"-> source 000's 'over {CLAIM_PCT:.0f}%' holds at {held} of {len(done)} "
                 f"precision(s) in GPU time.")
    busy = {lab: min(100.0, 100 * t["graph_ms"] / t["eager_ms"]) for lab, t in rows
            if measured(t)}
    waits = [lab for lab, b in busy.items() if b < 80]
    if waits:
        lines.append(
            f"-> in an eager call the GPU works {min(busy.values()):.0f}-"
            f"{max(busy.values()):.0f}% of the wall time ({', '.join(waits)} under 80%): "
            "the rest it waits for Python to issue kernels, so a stopwatch around an eager "
            "call measures the launch rate, not the layers.")
    else:
        lines.append(f"-> in an eager call the GPU works {min(busy.values()):.0f}% or more "
                     "of the wall time: here the eager call's time is close to GPU time.")
    return lines
