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


# ----------------------------------------------------------------------------------------
# Pictures of lesson 12: instruction shapes, the accumulator fragment, the WMMA tiling


MMA_SHAPES = [  # name, m, n, k, threads that issue it, what
    ("Volta tensor core", 4, 4, 4, None, "V100: 4x4x4 fp16,\nthe source's picture"),
    ("WMMA m16n16k16", 16, 16, 16, 32, "the wmma API\n(C++ or PTX), Volta+"),
    ("mma.sync m16n8k16", 16, 8, 16, 32, "what WMMA becomes\non Ampere and later"),
    ("wgmma m64n256k16", 64, 256, 16, 128, "Hopper: a warpgroup of 4 warps,\noperands "
     "read from shared memory"),
]


def plot_mma_shapes():
    """The output tile (m x n, to scale) of each generation's MMA instruction, with the
    multiply-adds one instruction performs."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, ax = plt.subplots(figsize=(10, 3.4))
    x = 0
    for name, m, n, k, threads, what in MMA_SHAPES:
        ax.add_patch(Rectangle((x, 0), n, m, fc="#8ecae6", ec="0.3"))
        ax.text(x + n / 2, m + 3, f"{name}\n{m * n * k:,} multiply-adds"
                + (f"\nissued by {threads} threads" if threads else ""), ha="center",
                va="bottom", fontsize=7.5)
        ax.text(x + n / 2, -4, what, ha="center", va="top", fontsize=7)
        x += n + 110
    ax.set_xlim(-50, x - 60)
    ax.set_ylim(-30, 105)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("output tile of one tensor-core instruction, to scale (D = A·B + C)",
                 fontsize=10)
    fig.tight_layout()
    return fig


def mma_m16n8_owner(row: int, col: int) -> tuple:
    """(lane, register) holding accumulator element (row, col) of mma.sync m16n8k16 with
    fp32 accumulators (PTX ISA: row = lane // 4 (+8 for c2, c3), col = 2 * (lane % 4) + i)."""
    lane = 4 * (row % 8) + col // 2
    reg = (col % 2) + (2 if row >= 8 else 0)
    return lane, reg


def plot_fragment_owners():
    """Which of the 32 lanes holds each of the 16x8 accumulator elements of mma.sync
    m16n8k16: every lane holds 4 floats (c0..c3) in 2 rows 8 apart."""
    import matplotlib.pyplot as plt

    owner = np.zeros((16, 8), int)
    for r in range(16):
        for c in range(8):
            owner[r, c] = mma_m16n8_owner(r, c)[0]
    fig, ax = plt.subplots(figsize=(4.2, 6))
    ax.imshow(owner, cmap="tab20", interpolation="nearest")
    for r in range(16):
        for c in range(8):
            lane, reg = mma_m16n8_owner(r, c)
            ax.text(c, r, f"{lane}\nc{reg}", ha="center", va="center", fontsize=6)
    ax.set_xticks(range(8))
    ax.set_yticks(range(16))
    ax.set_xlabel("column n")
    ax.set_ylabel("row m")
    ax.set_title("mma.sync m16n8k16: lane and register\nof each fp32 accumulator", fontsize=9)
    fig.tight_layout()
    return fig


def plot_wmma_tiling(cfg=None):
    """The tiled WMMA GEMM's block tile: warps (colours) and their 16x16 fragments, with
    the A and B slabs one K step reads."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from .kernels.wmma01_gemm_cuda import GEMM_DEFAULT

    cfg = cfg or GEMM_DEFAULT
    fig, ax = plt.subplots(figsize=(8, 5.2))
    gap = 8
    # A slab (BM x BK) left, B slab (BK x BN) on top, C tile (BM x BN)
    ax.add_patch(Rectangle((0, 0), cfg.BK, cfg.BM, fc="#ffb703", ec="0.3", alpha=0.6))
    ax.text(cfg.BK / 2, -4, f"A slab\n{cfg.BM}x{cfg.BK}", ha="center", va="bottom", fontsize=8)
    x0 = cfg.BK + gap
    ax.add_patch(Rectangle((x0, -cfg.BK - gap), cfg.BN, cfg.BK, fc="#b5e48c", ec="0.3",
                           alpha=0.6))
    ax.text(x0 + cfg.BN + 3, -cfg.BK / 2 - gap, f"B slab {cfg.BK}x{cfg.BN}", va="center",
            fontsize=8)
    warps_n = cfg.BN // cfg.WN
    colors = plt.cm.tab10.colors
    for w in range(cfg.warps):
        wm, wn = (w // warps_n) * cfg.WM, (w % warps_n) * cfg.WN
        for i in range(cfg.WM // 16):
            for j in range(cfg.WN // 16):
                ax.add_patch(Rectangle((x0 + wn + 16 * j, wm + 16 * i), 16, 16,
                                       fc=colors[w % 10], ec="white", lw=0.8, alpha=0.75))
        ax.text(x0 + wn + cfg.WN / 2, wm + cfg.WM / 2, f"warp {w}", ha="center",
                va="center", fontsize=8, color="black")
    ax.add_patch(Rectangle((x0, 0), cfg.BN, cfg.BM, fill=False, ec="k", lw=1.5))
    ax.set_xlim(-4, x0 + cfg.BN + 60)
    ax.set_ylim(cfg.BM + 6, -cfg.BK - gap - 10)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"one block: C tile {cfg.BM}x{cfg.BN}, {cfg.warps} warps of {cfg.WM}x{cfg.WN}"
                 f" = {cfg.WM // 16}x{cfg.WN // 16} fragments of 16x16 each", fontsize=9)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------
# Lesson 13: every kernel on one roofline and one "% of cuDNN" chart


def capstone_points(ladder_result: dict | None = None, tc: dict | None = None,
                    l0406: dict | None = None, l1011: dict | None = None) -> list:
    """Every measured kernel as a roofline point: dict(label, family, precision, ai
    (FLOP per byte of compulsory traffic), tflops). From a ladder run (conv ladder on the
    ResNet layers, the GEMM ladder), the tensor-core run (WMMA and cuDNN/cuBLAS at fp16),
    and, where given, lessons 04-06 (image filters) and 10-11 (depthwise)."""
    pts = []
    for lad in (ladder_result or {}).get("ladders", []):
        layer = lad["problem"].split(":")[0]
        for r in lad["rows"]:
            prec = {"cuDNN tf32": "tf32", "cuDNN fp16": "fp16"}.get(r["name"], "fp32")
            ai = lad["flops"] / lad["bytes"] * (2 if prec == "fp16" else 1)
            pts.append(dict(label=f"{r['name']} ({layer})", family="conv " + (
                "library" if r["kind"] == "library" else "course"), name=r["name"],
                precision=prec, ai=ai, tflops=r["tflops"]))
    g = (ladder_result or {}).get("gemm_ladder")
    if g:
        n = g["n"]
        for r in g["rows"]:
            pts.append(dict(label=f"GEMM {r['name']}", family="GEMM", name=r["name"],
                            precision="fp32", ai=2 * n**3 / (12 * n**2), tflops=r["tflops"]))
    if tc:
        n = tc["wmma_gemm"]["n"]
        for r in tc["wmma_gemm"]["table"]:
            if r["precision"] == "fp16":
                pts.append(dict(label=f"GEMM {r['name']}", family="tensor cores",
                                name=r["name"], precision="fp16",
                                ai=2 * n**3 / (2 * 2 * n**2 + 4 * n**2), tflops=r["tflops"]))
        for lay in tc["wmma_conv"]:
            for r in lay["table"]:
                if r["precision"] == "fp16" and "fp32 x" not in r["name"]:
                    pts.append(dict(label=f"{r['name']} ({lay['layer']})",
                                    family="tensor cores", name=r["name"], precision="fp16",
                                    ai=lay["flops"] / lay["bytes"] * 2, tflops=r["tflops"]))
    if l0406:
        f = l0406["sections"].get("l06_filter_4096")
        if f:
            n = f["n"]
            flops = 2 * 9 * n * n  # the 3x3 Gaussian
            rows = [r for r in f["rows"] if r["filter"] == "gauss3"]
            course = [r for r in rows if "cuDNN" not in r["name"]]
            pick = [r for r in rows if r["name"] == "naive" or "cuDNN" in r["name"]]
            pick += [min(course, key=lambda r: r["ms"])] if course else []
            for r in pick:
                pts.append(dict(label=f"3x3 filter {r['name']}", family="image filter",
                                name=r["name"], precision="fp32", ai=flops / f["bytes"],
                                tflops=flops / (r["ms"] * 1e-3) / 1e12))
    if l1011:
        d = l1011["sections"].get("l11_depthwise")
        for lay in (d or {}).get("layers", []):
            if lay.get("stride", 1) != 1:
                continue
            N, C, H, W = lay["x"]
            flops = 2 * 9 * N * C * H * W
            rows = [r for r in lay["rows"] if r.get("us")]
            # the course's kernels: not the library, not the reference copy
            course = [r for r in rows if not r["name"].startswith(("PyTorch", "copy"))]
            pick = [r for r in rows if "PyTorch" in r["name"]]
            pick += [min(course, key=lambda r: r["us"])] if course else []
            for r in pick:
                pts.append(dict(label=f"depthwise {r['name']} ({lay['layer']})",
                                family="depthwise", name=r["name"], precision="fp32",
                                ai=flops / lay["bytes"], tflops=flops / (r["us"] * 1e-6) / 1e12))
    return pts


def plot_capstone_roofline(points: list, copy_gbps: float, fp32_tflops: float,
                           fp16_tflops: float | None = None, title: str = ""):
    """One roofline, two compute roofs (fp32 CUDA cores; fp16 tensor cores), every point."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    ais = [p["ai"] for p in points] or [1.0]
    lo, hi = min(ais + [1.0]) / 3, max(ais) * 3
    grid = np.logspace(np.log10(lo), np.log10(hi), 200)
    for peak, label, ls in ((fp32_tflops, "fp32 CUDA cores", "-"),
                            (fp16_tflops, "fp16 tensor cores", "--")):
        if peak:
            ax.loglog(grid, np.minimum(peak, grid * copy_gbps / 1e3), "k", ls=ls, lw=1.8)
            ax.annotate(f"{label}: {peak:.0f} TFLOP/s", (hi / 1.5, peak * 1.1), ha="right",
                        fontsize=8)
    ax.annotate(f"memory {copy_gbps / 1e3:.2f} TB/s", (lo * 1.5, lo * 1.5 * copy_gbps / 1e3 * 1.3),
                fontsize=8, rotation=25)
    fams = list(dict.fromkeys(p["family"] for p in points))
    markers = dict(zip(fams, "osD^vP*X", strict=False))
    cmap = plt.cm.tab10.colors
    for i, fam in enumerate(fams):
        ps = [p for p in points if p["family"] == fam]
        ax.plot([p["ai"] for p in ps], [p["tflops"] for p in ps], markers[fam], ms=6,
                color=cmap[i % 10], alpha=0.85, label=fam, ls="")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of compulsory traffic)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title or "every kernel of the course on one roofline", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


def capstone_ladder(ladder_result: dict, tc: dict | None = None) -> list:
    """Rows (layer, name, group, pct) for the "% of cuDNN" chart: fp32 kernels as % of
    cuDNN fp32 (same run), tensor-core versions as % of cuDNN fp16 NCHW (same run)."""
    rows = []
    for lad in ladder_result.get("ladders", []):
        layer = lad["problem"].split(":")[0].split(" (")[0]
        for r in lad["rows"]:
            if r["name"] in ("cuDNN tf32", "cuDNN fp16"):
                continue
            rows.append(dict(layer=layer, name=r["name"], group="fp32: % of cuDNN fp32",
                             pct=r["pct_of_baseline"]))
    for lay in (tc or {}).get("wmma_conv", []):
        ms = {r["name"]: r["ms"] for r in lay["table"]}
        layer = lay["problem"].split(":")[0].split(" (")[0]
        base = ms.get("cuDNN fp16")
        for name in ("cuDNN tf32", "cuDNN bf16", "cuDNN fp16 NHWC", "WMMA conv",
                     "WMMA conv (fp32 x in)"):
            if name in ms and base:
                rows.append(dict(layer=layer, name=name, group="tensor cores: % of cuDNN fp16",
                                 pct=100 * base / ms[name]))
    return rows


def plot_capstone_ladder(rows: list, title: str = ""):
    """Two panels of grouped bars: the fp32 ladder and the tensor-core versions."""
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys(r["group"] for r in rows))
    fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 4), squeeze=False,
                             gridspec_kw=dict(width_ratios=[2, 1][:len(groups)]))
    for ax, grp in zip(axes[0], groups, strict=True):
        rs = [r for r in rows if r["group"] == grp]
        names = list(dict.fromkeys(r["name"] for r in rs))
        layers = list(dict.fromkeys(r["layer"] for r in rs))
        width = 0.8 / max(1, len(layers))
        for i, lay in enumerate(layers):
            pct = {r["name"]: r["pct"] for r in rs if r["layer"] == lay}
            ax.bar(np.arange(len(names)) + i * width, [pct.get(n, 0) for n in names], width,
                   label=lay)
        ax.axhline(100, color="k", lw=0.8, ls="--")
        ax.set_xticks(np.arange(len(names)) + width * (len(layers) - 1) / 2, names,
                      rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(grp.split(": ")[1])
        ax.set_title(grp.split(":")[0], fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_census(census: dict, variants=("fp32", "tf32", "fp16 NHWC"), title: str = ""):
    """Stacked bars: each kind of layer's share of FLOPs and of time (per variant)."""
    import matplotlib.pyplot as plt

    cols = ["FLOPs"] + [v for v in variants if v in census]
    fig, ax = plt.subplots(figsize=(1.5 * len(cols) + 3, 3.8))
    colors = dict(zip(KINDS, plt.cm.Set2.colors, strict=False))
    for i, col in enumerate(cols):
        data = census["flops"] if col == "FLOPs" else census[col]
        tot = sum(data[k] for k in KINDS)
        bottom = 0.0
        for k in KINDS:
            share = 100 * data[k] / tot
            ax.bar(i, share, bottom=bottom, color=colors[k], label=k if i == 0 else None)
            if share > 6:
                ax.text(i, bottom + share / 2, f"{share:.0f}%", ha="center", va="center",
                        fontsize=8)
            bottom += share
    ax.axhline(70, color="#d62828", lw=1, ls="--")
    ax.text(len(cols) - 0.5, 71, "70% (source 000)", color="#d62828", fontsize=8, ha="right")
    ax.set_xticks(range(len(cols)), ["share of FLOPs"] + [f"time, {c}" for c in cols[1:]],
                  fontsize=8)
    ax.set_ylabel("% of the forward pass")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    return fig


def conv_share_isolated(model, x, runs: int = 5, dtype=None, channels_last: bool = False):
    """Convolutions' share of a forward pass without hooks in the timed work: every Conv2d
    is timed alone on the input it receives in the network (captured once), the times are
    summed and divided by the time of the whole pass (no hooks). On the GPU by CUDA events
    (bench.time_gpu, calls queued back to back), on the CPU by perf_counter.
    Returns dict(conv_ms, total_ms, share_pct, convs)."""
    import torch

    from . import bench

    device = x.device.type == "cuda"
    model = model.to(x.device)
    if dtype is not None:
        model, x = model.to(dtype), x.to(dtype)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
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
