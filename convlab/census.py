"""Where a real CNN's time goes: ResNet-18 counted and timed by kind of layer.

- `resnet18()`: ResNet-18 (He et al. 2016) built from torch.nn layers, inference mode.
- `census_flops(model, x_shape)`: FLOPs of one forward pass by kind of layer (`KINDS`).
- `census_time(model, x)`: time of one pass by kind of layer (CUDA events on the GPU,
  perf_counter on the CPU), with the pass's time without hooks beside it.
- `conv_share_isolated(model, x)`: the convolutions' share of the pass, each Conv2d timed
  alone on the input it receives in the network (no hooks in the timed work).

Needs PyTorch (the ``torch`` extra); importing this module does not.
"""

from __future__ import annotations

import time

import numpy as np

from . import bench

# Describing the network stays usable inside graded answers (grading sandbox).
GRADING_ALLOWED = ("resnet18", "census_flops", "census_time")

KINDS = ("convolution", "batch norm", "ReLU", "residual add", "pooling", "fully connected")


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
    Returns dict(conv_ms, total_ms, share_pct, convs)."""
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
