"""Precision and tensor cores (lesson 12), and the capstone's summaries (lesson 13).

- **Formats**: `FORMATS`, `round_to`, `bits`, `format_table` (from `convlab.formats`).
- **Tensor-core arithmetic on the CPU**: `mma(a, b, fmt, acc)` multiplies with inputs
  rounded to `fmt` and sums in fp32 (or fp16) in chunks of 16, as an MMA instruction does;
  `accuracy_table` measures the error of each mode against float64 on the same data.
- **Compute capability**: `COMPUTE_CAPABILITY` / `features(cc)` / `capability_table()`:
  what each precision and tensor-core feature needs, for the GPUs learners meet (T4,
  P100, L4, A100, H200, Jetson ...).
- **Libraries at each precision** (GPU, from `convlab.baselines`): `gemm_precisions`,
  `conv_precisions`, `throughput_ratio`; `accuracy_speed_table` prints their rows.
- **A real CNN** (from `convlab.census`): `resnet18`, `census_flops`, `census_time`,
  `conv_share_isolated`.
- **The capstone**: `capstone_points` (every measured kernel as a roofline point) and
  `capstone_ladder` (rows of the "% of cuDNN" chart) from stored or fresh runs.
- Stored numbers from the H200: `stored()` (convlab/results/h200_lessons12_13.json).
- Pictures (from `convlab.viz`): `plot_formats`, `plot_accuracy_speed`, `plot_mma_shapes`,
  `plot_fragment_owners`, `plot_wmma_tiling`, `plot_capstone_roofline`,
  `plot_capstone_ladder`, `plot_census`.
"""

from __future__ import annotations

import numpy as np

from . import results
from .baselines import (  # noqa: F401
    conv_precisions,
    gemm_precisions,
    throughput_ratio,
    torch_available,
)
from .census import (  # noqa: F401
    KINDS,
    census_flops,
    census_time,
    conv_share_isolated,
    resnet18,
)
from .check import random_array
from .formats import FORMATS, Format, bits, format_table, round_mantissa, round_to  # noqa: F401
from .viz import (  # noqa: F401
    MMA_SHAPES,
    mma_m16n8_owner,
    plot_accuracy_speed,
    plot_capstone_ladder,
    plot_capstone_roofline,
    plot_census,
    plot_formats,
    plot_fragment_owners,
    plot_mma_shapes,
    plot_wmma_tiling,
)

# Functions here that only describe (tables, plots, the CNN) stay usable inside graded
# answers; the ones that compute an answer (round_to, mma...) do not (grading sandbox).
GRADING_ALLOWED = ("features", "capability_table", "format_table", "stored",
                   "accuracy_speed_table", "plot_formats", "plot_accuracy_speed",
                   "resnet18", "census_flops", "census_time", "torch_available")


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


# ----------------------------------------------------------------------------------------
# Stored results of the H200 run


def stored(name: str = "h200_lessons12_13") -> dict:
    """The lesson 12/13 measurements from a real GPU (convlab/results/<name>.json)."""
    return results.load(name)


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
