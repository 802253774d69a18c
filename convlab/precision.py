"""Precision and tensor cores (lesson 12), and where a CNN's time goes (lesson 13).

- **Formats**: `FORMATS` (fp32, tf32, bf16, fp16, fp8): bits, range, unit roundoff;
  `round_to(x, fmt)` rounds float32 values to a format (round to nearest even) and keeps
  them in float32, the way a tensor core sees its inputs; `bits(x, fmt)` splits values
  into sign / exponent / mantissa for pictures.
- **Tensor-core arithmetic on the CPU**: `mma(a, b, fmt, acc)` multiplies with inputs
  rounded to `fmt` and sums in fp32 (or fp16) in chunks of 16, as an MMA instruction does;
  `accuracy_table` measures the error of each mode against float64 on the same data.
- **Libraries at each precision** (GPU): `gemm_precisions` (cuBLAS through PyTorch and
  CuPy) and `conv_precisions` (cuDNN through PyTorch) check, then time fp32 (TF32 off),
  tf32, bf16 and fp16; `throughput_ratio` puts tensor-core fp16 beside fp32 on the CUDA
  cores (source 002's "12x" claim).
- **Compute capability**: `COMPUTE_CAPABILITY` / `features(cc)` / `capability_table()`:
  what each precision and tensor-core feature needs, for the GPUs learners meet (T4,
  P100, L4, A100, H200, Jetson ...).
- **A real CNN**: `resnet18` (torch.nn), `census_flops` (FLOPs by kind of layer) and
  `census_time` (time by kind, CPU or GPU, fp32 or fp16).
- Stored numbers from the H200: `stored()` (convlab/results/h200_lessons12_13.json).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Functions here that only describe (tables, plots, the CNN) stay usable inside graded
# answers; the ones that compute an answer (round_to, mma...) do not (grading sandbox).
GRADING_ALLOWED = ("features", "capability_table", "format_table", "stored",
                   "accuracy_speed_table", "plot_formats", "plot_accuracy_speed",
                   "resnet18", "census_flops", "census_time", "torch_available")


@dataclass(frozen=True)
class Format:
    """A floating-point format: 1 sign bit, `exponent` bits, `mantissa` stored bits."""

    name: str
    exponent: int
    mantissa: int
    note: str = ""

    @property
    def bits(self) -> int:
        return 1 + self.exponent + self.mantissa

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent - 1) - 1

    @property
    def unit_roundoff(self) -> float:
        """Largest relative error of one rounding to nearest: 2^-(mantissa+1)."""
        return 2.0 ** -(self.mantissa + 1)

    @property
    def max(self) -> float:
        if self.name == "fp8 e4m3":  # no infinities: the top exponent still holds numbers
            return 448.0
        return (2 - 2.0 ** -self.mantissa) * 2.0 ** self.bias

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)


FORMATS = {
    "fp32": Format("fp32", 8, 23, "IEEE single: the course's default"),
    "tf32": Format("tf32", 8, 10, "tensor-core input format (Ampere+): fp32 range, fp16 "
                                  "precision; stored as fp32"),
    "bf16": Format("bf16", 8, 7, "brain float: fp32 range, 8 significant bits"),
    "fp16": Format("fp16", 5, 10, "IEEE half: 11 significant bits, max 65504"),
    "fp8 e4m3": Format("fp8 e4m3", 4, 3, "Hopper / Ada: inference and training forward"),
    "fp8 e5m2": Format("fp8 e5m2", 5, 2, "Hopper / Ada: gradients"),
}


def format_table() -> str:
    rows = [f"{'format':<10}{'bits':>5}{'exp':>5}{'mant':>6}{'max':>12}{'min normal':>12}"
            f"{'unit roundoff':>15}  note"]
    for f in FORMATS.values():
        rows.append(f"{f.name:<10}{f.bits:>5}{f.exponent:>5}{f.mantissa:>6}{f.max:>12.4g}"
                    f"{f.min_normal:>12.3g}{f.unit_roundoff:>15.3g}  {f.note}")
    return "\n".join(rows)


def _round_mantissa(x: np.ndarray, mantissa: int) -> np.ndarray:
    """float32 -> float32 with `mantissa` stored bits, round to nearest even (bits)."""
    x = np.asarray(x, dtype=np.float32)
    shape = x.shape
    x = np.ascontiguousarray(x.reshape(-1))
    u = x.view(np.uint32).astype(np.uint64)
    drop = 23 - mantissa
    half = np.uint64(1 << (drop - 1))
    lsb = (u >> np.uint64(drop)) & np.uint64(1)
    r = ((u + half - np.uint64(1) + lsb) >> np.uint64(drop)) << np.uint64(drop)
    r = (r & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(x), r, x).reshape(shape)  # NaN and Inf pass through


def round_to(x, fmt: str = "fp16") -> np.ndarray:
    """Round float32 values to `fmt` (nearest even); the result is float32.

    fp16 uses NumPy's float16 (its range: overflow gives Inf, tiny values lose bits);
    tf32 and bf16 keep fp32's exponent, so only the mantissa is rounded; fp8 formats
    are rounded in precision and clipped to their largest value (saturating).
    """
    x = np.asarray(x, dtype=np.float32)
    if fmt == "fp32":
        return x.copy()
    if fmt == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    if fmt in ("tf32", "bf16"):
        return _round_mantissa(x, FORMATS[fmt].mantissa)
    if fmt in ("fp8 e4m3", "fp8 e5m2"):
        f = FORMATS[fmt]
        # below the smallest normal the spacing is fixed (subnormals): round there on a grid
        sub = 2.0 ** (1 - f.bias - f.mantissa)
        r = _round_mantissa(x, f.mantissa)
        small = np.abs(x) < f.min_normal
        r = np.where(small, np.round(x / sub) * sub, r).astype(np.float32)
        return np.clip(r, -f.max, f.max).astype(np.float32)
    raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")


def bits(x: float, fmt: str = "fp16") -> dict:
    """Sign, exponent and mantissa bit strings of x rounded to fmt (for pictures)."""
    f = FORMATS[fmt]
    v = float(round_to(np.float32(x), fmt))
    u = int(np.float32(v).view(np.uint32))
    if fmt == "fp16":
        u = int(np.float16(v).view(np.uint16))
        e_bits, m_bits = (u >> 10) & 31, u & 1023
    else:
        e32, m32 = (u >> 23) & 255, u & 0x7FFFFF
        if f.exponent == 8:
            e_bits, m_bits = e32, m32 >> (23 - f.mantissa)
        else:  # fp8: re-bias the exponent
            e_bits = max(0, e32 - 127 + f.bias) if e32 else 0
            m_bits = m32 >> (23 - f.mantissa)
    sign = "1" if math.copysign(1.0, v) < 0 else "0"
    return dict(value=v, sign=sign, exponent=format(e_bits, f"0{f.exponent}b"),
                mantissa=format(m_bits, f"0{f.mantissa}b"))


# ----------------------------------------------------------------------------------------
# Tensor-core arithmetic, emulated on the CPU


def mma(a, b, fmt: str = "fp16", acc: str = "fp32", chunk: int = 16) -> np.ndarray:
    """A @ B as a tensor core computes it: inputs rounded to `fmt`, products exact,
    sums accumulated in `acc` ('fp32' or 'fp16'), rounded after every chunk of `chunk`
    along K (an MMA instruction's k). Returns float32."""
    a = round_to(np.asarray(a, np.float32), fmt).astype(np.float64)
    b = round_to(np.asarray(b, np.float32), fmt).astype(np.float64)
    K = a.shape[1]
    out = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k0 in range(0, K, chunk):
        part = a[:, k0:k0 + chunk] @ b[k0:k0 + chunk]
        out = (out.astype(np.float64) + part).astype(np.float32)
        if acc == "fp16":
            out = round_to(out, "fp16")
    return out


MODES = {  # name -> (input format, accumulator), in the order of the tables
    "fp32": ("fp32", "fp32"),
    "tf32 (fp32 acc)": ("tf32", "fp32"),
    "bf16 (fp32 acc)": ("bf16", "fp32"),
    "fp16 (fp32 acc)": ("fp16", "fp32"),
    "fp16 (fp16 acc)": ("fp16", "fp16"),
}


def errors(out, expected, absref) -> dict:
    """max |err| / sum|a||b| (what the checkers bound) and the relative L2 error."""
    out = np.asarray(out, np.float64)
    diff = np.abs(out - expected)
    return dict(max_rel=float(np.max(diff / (absref + 1e-30))),
                rel_l2=float(np.linalg.norm(diff) / np.linalg.norm(expected)))


def accuracy_table(M: int = 128, N: int = 128, K: int = 1024, seed: int = 0,
                   modes=MODES) -> list:
    """Each mode's error on one random GEMM (normal data plus a ramp), CPU emulation."""
    from .check import random_array

    rng = np.random.default_rng(seed)
    a, b = random_array((M, K), rng), random_array((K, N), rng)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    expected, absref = a64 @ b64, np.abs(a64) @ np.abs(b64)
    rows = []
    for name, (fmt, acc) in modes.items():
        out = (a @ b) if name == "fp32" else mma(a, b, fmt, acc)
        rows.append(dict(mode=name, **errors(out, expected, absref),
                         unit_roundoff=FORMATS[fmt].unit_roundoff))
    return rows


# ----------------------------------------------------------------------------------------
# Compute capability: what each feature needs


COMPUTE_CAPABILITY = [
    # name, cc, architecture, note
    ("Jetson TX1 / Nano", 5.3, "Maxwell", "embedded; fp16 at twice the fp32 rate, no tensor cores"),
    ("P100 (Kaggle)", 6.0, "Pascal", "fp16 at twice the fp32 rate, no tensor cores"),
    ("Jetson TX2", 6.2, "Pascal", "embedded; no tensor cores"),
    ("V100", 7.0, "Volta", "first tensor cores: fp16 in, fp16/fp32 accumulate"),
    ("Jetson AGX Xavier", 7.2, "Volta", "embedded tensor cores (fp16, int8)"),
    ("T4 (Colab, Kaggle)", 7.5, "Turing", "fp16 / int8 / int4 tensor cores"),
    ("A100 (Colab)", 8.0, "Ampere", "tf32 and bf16 tensor cores, cp.async, 2:4 sparsity"),
    ("Jetson AGX Orin", 8.7, "Ampere", "embedded Ampere: tf32 / bf16 / fp16 / int8"),
    ("L4 (Colab)", 8.9, "Ada", "adds fp8 tensor cores"),
    ("H100 / H200", 9.0, "Hopper", "wgmma (warpgroup MMA), TMA, fp8; this course's GPU"),
]


def features(cc: float) -> dict:
    """What compute capability `cc` (e.g. 7.5) offers, feature -> bool."""
    cc = round(float(cc), 1)
    return {
        "fp16 arithmetic (CUDA cores)": cc >= 5.3,
        "fp16 tensor cores (WMMA)": cc >= 7.0,
        "int8 tensor cores": cc >= 7.2,
        "bf16 tensor cores": cc >= 8.0,
        "tf32 tensor cores": cc >= 8.0,
        "cp.async (lesson 09)": cc >= 8.0,
        "fp8 tensor cores": cc >= 8.9,
        "wgmma + TMA (Hopper)": cc >= 9.0,
        "CUDA 13 builds": cc >= 7.5,
    }


def capability_table() -> str:
    """One row per GPU: compute capability and which precisions its tensor cores take."""
    cols = ["fp16 tensor cores (WMMA)", "bf16 tensor cores", "tf32 tensor cores",
            "fp8 tensor cores", "cp.async (lesson 09)", "CUDA 13 builds"]
    short = ["fp16 TC", "bf16 TC", "tf32 TC", "fp8 TC", "cp.async", "CUDA 13"]
    lines = [f"{'GPU':<20}{'cc':>5}  {'arch':<8}" + "".join(f"{s:>9}" for s in short)]
    for name, cc, arch, _ in COMPUTE_CAPABILITY:
        f = features(cc)
        lines.append(f"{name:<20}{cc:>5.1f}  {arch:<8}" + "".join(
            f"{'yes' if f[c] else '-':>9}" for c in cols))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------
# Libraries at each precision (GPU)


def torch_available() -> bool:
    from .baselines import torch_available as ok

    return ok()


def _torch_dtype(torch, prec):
    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
            "fp16": torch.float16}[prec]


def _set_tf32(torch, on: bool):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def gemm_precisions(n: int = 4096, precisions=("fp32", "tf32", "bf16", "fp16"), repeat=10,
                    seed: int = 0, extra: dict | None = None) -> list:
    """cuBLAS (PyTorch matmul) at each precision on one n^3 GEMM: checked then timed.

    Error against float64 (computed on the GPU) of the same fp32 inputs; `extra` maps a
    name to a callable ``f(a32, b32) -> (run, result)`` for more rows (e.g. the WMMA kernel):
    run() launches, result() returns the fp32 product.
    """
    import torch

    from . import bench
    from .check import random_array

    rng = np.random.default_rng(seed)
    a = torch.from_numpy(random_array((n, n), rng)).cuda()
    b = torch.from_numpy(random_array((n, n), rng)).cuda()
    exp = (a.double() @ b.double())
    absref = (a.double().abs() @ b.double().abs())
    flops = 2 * n**3
    rows = []

    def add(name, prec, run, result, note=""):
        _set_tf32(torch, prec == "tf32")
        run()
        torch.cuda.synchronize()
        diff = (result().double() - exp).abs()
        err = dict(max_rel=float((diff / absref).max()),
                   rel_l2=float(diff.norm() / exp.norm()))
        t = bench.time_gpu(run, repeat=repeat)
        rows.append(dict(name=name, precision=prec, ms=t.median_ms, spread=t.spread,
                         tflops=t.tflops(flops), note=note, **err))

    for prec in precisions:
        dt = _torch_dtype(torch, prec)
        ad, bd = a.to(dt), b.to(dt)
        box = {}

        def run(ad=ad, bd=bd, box=box):
            box["c"] = ad @ bd

        add(f"cuBLAS {prec}", prec, run, lambda box=box: box["c"].float(),
            "output in the input precision" if prec in ("bf16", "fp16") else "")
    for name, make in (extra or {}).items():
        run, result = make(a, b)
        add(name, "fp16", run, result)
    _set_tf32(torch, False)
    base = next((r for r in rows if r["precision"] == "fp32"), None)
    for r in rows:
        r["speedup_vs_fp32"] = base["ms"] / r["ms"] if base else None
    return rows


def conv_precisions(problem, precisions=("fp32", "tf32", "bf16", "fp16"), repeat=10,
                    seed: int = 0, channels_last: bool = True, extra: dict | None = None):
    """cuDNN (PyTorch conv2d) at each precision on one layer: checked then timed.

    With channels_last, fp16 is also timed in NHWC memory order (tensor cores' favourite).
    `extra`: name -> ``f(x32, w32) -> (run, result)`` for more rows (the WMMA conv).
    """
    import torch

    from . import bench
    from .check import random_array

    F = torch.nn.functional
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(random_array(problem.x_shape, rng)).cuda()
    w = torch.from_numpy(random_array(problem.w_shape, rng)).cuda()
    kw = problem.kwargs
    torch.backends.cudnn.benchmark = True
    exp = F.conv2d(x.double(), w.double(), **kw)
    absref = F.conv2d(x.double().abs(), w.double().abs(), **kw)
    rows = []

    def add(name, prec, run, result):
        _set_tf32(torch, prec == "tf32")
        run()
        torch.cuda.synchronize()
        diff = (result().double() - exp).abs()
        t = bench.time_gpu(run, repeat=repeat)
        rows.append(dict(name=name, precision=prec, ms=t.median_ms, spread=t.spread,
                         tflops=t.tflops(problem.flops),
                         max_rel=float((diff / (absref + 1e-30)).max()),
                         rel_l2=float(diff.norm() / exp.norm())))

    variants = [(p, False) for p in precisions]
    if channels_last and "fp16" in precisions:
        variants.append(("fp16", True))
    for prec, nhwc in variants:
        dt = _torch_dtype(torch, prec)
        xd, wd = x.to(dt), w.to(dt)
        if nhwc:
            xd = xd.contiguous(memory_format=torch.channels_last)
            wd = wd.contiguous(memory_format=torch.channels_last)
        box = {}

        def run(xd=xd, wd=wd, box=box):
            box["y"] = F.conv2d(xd, wd, **kw)

        add(f"cuDNN {prec}" + (" NHWC" if nhwc else ""), prec, run,
            lambda box=box: box["y"].float())
    for name, make in (extra or {}).items():
        run, result = make(x, w)
        add(name, "fp16", run, result)
    _set_tf32(torch, False)
    base = next((r for r in rows if r["name"] == "cuDNN fp32"), None)
    for r in rows:
        r["speedup_vs_fp32"] = base["ms"] / r["ms"] if base else None
    return rows


def throughput_ratio(n: int = 8192, repeat: int = 5) -> dict:
    """Source 002's claim, measured: fp16 on tensor cores vs fp32 on the CUDA cores.

    fp16: the best of cuBLAS fp16 GEMM (PyTorch) at n^3; fp32: the course's FMA-peak kernel
    (every CUDA core busy) and cuBLAS SGEMM with TF32 off at the same size.
    """
    import torch

    from . import bench

    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    flops = 2 * n**3
    _set_tf32(torch, False)
    sgemm = bench.time_gpu(lambda: a @ b, repeat=repeat).tflops(flops)
    a16, b16 = a.half(), b.half()
    hgemm = bench.time_gpu(lambda: a16 @ b16, repeat=repeat).tflops(flops)
    fma = bench.fma_peak()
    return dict(n=n, fp16_tensor_tflops=hgemm, fp32_sgemm_tflops=sgemm, fp32_fma_tflops=fma,
                ratio_vs_sgemm=hgemm / sgemm, ratio_vs_fma=hgemm / max(fma, sgemm))


def accuracy_speed_table(rows: list, title: str = "") -> str:
    """Rows of gemm_precisions / conv_precisions as text: time, TFLOP/s, speed-up, errors."""
    lines = [title] if title else []
    lines.append(f"{'version':<26}{'ms':>9}{'TFLOP/s':>9}{'x fp32':>8}{'max rel err':>13}"
                 f"{'rel L2 err':>12}")
    for r in rows:
        sp = r.get("speedup_vs_fp32")
        lines.append(f"{r['name']:<26}{r['ms']:9.4f}{r['tflops']:9.1f}"
                     f"{(f'{sp:7.2f}x') if sp else '       -'}{r['max_rel']:13.2e}"
                     f"{r['rel_l2']:12.2e}")
    return "\n".join(lines)


def plot_accuracy_speed(rows: list, title: str = "accuracy vs speed"):
    """Speed-up over fp32 (x) against relative L2 error (y, log): one point per version."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for r in rows:
        sp = r.get("speedup_vs_fp32") or 1.0
        ax.plot(sp, max(r["rel_l2"], 1e-9), "o", ms=7)
        ax.annotate(r["name"], (sp, max(r["rel_l2"], 1e-9)), textcoords="offset points",
                    xytext=(6, 3), fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("speed-up over fp32 (TF32 off), same run")
    ax.set_ylabel("relative L2 error vs float64")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_formats(fmts=("fp32", "tf32", "bf16", "fp16", "fp8 e4m3")):
    """The bit layouts of the formats, drawn to scale: sign, exponent, mantissa."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, ax = plt.subplots(figsize=(9, 0.55 * len(fmts) + 0.6))
    colors = {"sign": "#f4a3c0", "exponent": "#8ecae6", "mantissa": "#b5e48c"}
    for row, name in enumerate(fmts):
        f = FORMATS[name]
        y = len(fmts) - 1 - row
        x = 0
        for part, n in (("sign", 1), ("exponent", f.exponent), ("mantissa", f.mantissa)):
            for _ in range(n):
                ax.add_patch(Rectangle((x, y + 0.1), 0.95, 0.8, fc=colors[part], ec="0.4",
                                       lw=0.5))
                x += 1
        ax.text(-0.6, y + 0.5, name, ha="right", va="center", fontsize=9)
        ax.text(x + 0.6, y + 0.5, f"{f.bits} bits: {f.exponent} exponent, {f.mantissa} "
                f"mantissa; max {f.max:.3g}, rel. step {2 * f.unit_roundoff:.1e}",
                va="center", fontsize=8)
    handles = [Rectangle((0, 0), 1, 1, fc=c, ec="0.4", label=k) for k, c in colors.items()]
    ax.legend(handles=handles, loc="upper right", fontsize=8, ncol=3,
              bbox_to_anchor=(1.0, 1.25))
    ax.set_xlim(-6, 50)
    ax.set_ylim(0, len(fmts))
    ax.axis("off")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------
# A real CNN: ResNet-18 built with torch.nn, its FLOPs and its time by kind of layer

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
    import time

    import torch

    device = x.device.type == "cuda"
    model = model.to(x.device)
    if dtype is not None:
        model, x = model.to(dtype), x.to(dtype)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
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
            from . import bench

            out["unhooked"] = bench.time_gpu(plain, repeat=max(3, runs), warmup=1).median_ms
        else:
            from . import bench

            out["unhooked"] = bench.time_cpu(plain, repeat=max(3, runs)).median_ms
    return out


# ----------------------------------------------------------------------------------------
# Stored results of the H200 run (tools/gpu/lessons12_13.py)


def stored(name: str = "h200_lessons12_13") -> dict:
    """The lesson 12/13 measurements from a real GPU (convlab/results/<name>.json)."""
    from .bench import stored_results

    return stored_results(name)
