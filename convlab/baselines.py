"""Library baselines timed beside the course's kernels: cuDNN (PyTorch) and cuBLAS (CuPy).

fp32 baselines run with TF32 off (PyTorch's cudnn/matmul allow_tf32 flags; CuPy without
CUPY_TF32), so the race is fair: same precision, same inputs, same run.

- `cudnn_conv_impl`, `cublas_im2col_impl`: `bench.Impl` rows of the conv ladder.
- `gemm_precisions`, `conv_precisions`: cuBLAS / cuDNN at fp32 (TF32 off), tf32, bf16 and
  fp16, each checked against float64 then timed (lesson 12); `throughput_ratio`: fp16 on
  tensor cores beside fp32 on the CUDA cores.
"""

from __future__ import annotations

import numpy as np

from . import bench
from .bench import Impl
from .check import random_array
from .runtime import import_optional


def torch_available() -> bool:
    torch = import_optional("torch")
    return bool(torch is not None and torch.cuda.is_available())


def cupy_available() -> bool:
    cp = import_optional("cupy")
    try:
        return bool(cp is not None and cp.cuda.runtime.getDeviceCount() > 0)
    except Exception:  # noqa: BLE001
        return False


def set_torch_precision(precision: str):
    """'fp32' (TF32 off), 'tf32' (TF32 on); returns torch."""
    torch = import_optional("torch")
    tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    return torch


def cudnn_conv_impl(problem, precision: str = "fp32", name: str | None = None,
                    device: str = "cuda") -> Impl:
    """PyTorch conv2d (cuDNN) at fp32 (TF32 off), tf32 or fp16 (inputs cast once).

    device='cpu' runs the same steps with PyTorch's CPU convolution (tests without a GPU).
    """
    torch = import_optional("torch")
    F = torch.nn.functional
    dtype = torch.float16 if precision == "fp16" else torch.float32
    kw = problem.kwargs

    def prepare(x, w):
        set_torch_precision(precision)
        s = dict(x=torch.from_numpy(x).to(device, dtype), w=torch.from_numpy(w).to(device, dtype))
        s["out"] = F.conv2d(s["x"], s["w"], **kw)
        return s

    def run(s):
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
        s["out"] = F.conv2d(s["x"], s["w"], **kw)

    def fetch(s):
        if device == "cuda":
            torch.cuda.synchronize()
        return s["out"].float().cpu().numpy()

    return Impl(name or f"cuDNN {precision}", prepare, run, fetch, kind="library")


def cublas_im2col_impl(problem, name: str = "im2col + cuBLAS", xp=None) -> Impl:
    """Explicit im2col on the GPU (CuPy) followed by one cuBLAS SGEMM, TF32 off.

    xp: the array module (default CuPy); NumPy runs the same steps on the CPU (tests).
    """
    cp = xp if xp is not None else import_optional("cupy")
    from . import reference as ref

    p = ref.conv_params(problem.x_shape, problem.w_shape, **problem.kwargs)
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation

    def prepare(x, w):
        return dict(x=cp.asarray(x), w=cp.asarray(w).reshape(p.K, -1), out=None)

    def run(s):
        xp = cp.pad(s["x"], ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        cols = cp.empty((p.C, p.R, p.S, p.N, p.P, p.Q), dtype=cp.float32)
        for r in range(p.R):
            for c in range(p.S):
                cols[:, r, c] = xp[:, :, r * dh: r * dh + sh * p.P: sh,
                                   c * dw: c * dw + sw * p.Q: sw].transpose(1, 0, 2, 3)
        y = s["w"] @ cols.reshape(p.C * p.R * p.S, -1)
        s["out"] = y.reshape(p.K, p.N, p.P, p.Q).transpose(1, 0, 2, 3)

    def fetch(s):
        return cp.asnumpy(s["out"]) if hasattr(cp, "asnumpy") else np.asarray(s["out"])

    return Impl(name, prepare, run, fetch, kind="library")


def cublas_gemm(a, b):
    """C = A @ B through cuBLAS (CuPy), fp32 (TF32 off unless CUPY_TF32 is set)."""
    cp = import_optional("cupy")
    return cp.matmul(a, b)


def as_numpy(a) -> np.ndarray:
    if hasattr(a, "copy_to_host"):
        return a.copy_to_host()
    if hasattr(a, "get"):
        return a.get()
    return np.asarray(a)


# ----------------------------------------------------------------------------------------
# Libraries at each precision (lesson 12)


def _torch_dtype(torch, prec):
    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
            "fp16": torch.float16}[prec]


def _set_tf32(torch, on: bool):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def _with_speedups(torch, rows: list, base: str) -> list:
    """TF32 back off; every row's speed-up over the row named `base` (same run)."""
    _set_tf32(torch, False)
    ref_row = next((r for r in rows if r["name"] == base), None)
    for r in rows:
        r["speedup_vs_fp32"] = ref_row["ms"] / r["ms"] if ref_row else None
    return rows


def gemm_precisions(n: int = 4096, precisions=("fp32", "tf32", "bf16", "fp16"), repeat=10,
                    seed: int = 0, extra: dict | None = None) -> list:
    """cuBLAS (PyTorch matmul) at each precision on one n^3 GEMM: checked then timed.

    Error against float64 (computed on the GPU) of the same fp32 inputs; `extra` maps a
    name to a callable ``f(a32, b32) -> (run, result)`` for more rows (e.g. the WMMA kernel):
    run() launches, result() returns the fp32 product.
    """
    import torch

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
        t = bench.time_gpu_queued(run, repeat=repeat)  # the GPU's time, not Python's
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
        add(name, "fp16", *make(a, b))
    return _with_speedups(torch, rows, "cuBLAS fp32")


def conv_precisions(problem, precisions=("fp32", "tf32", "bf16", "fp16"), repeat=10,
                    seed: int = 0, channels_last: bool = True, extra: dict | None = None):
    """cuDNN (PyTorch conv2d) at each precision on one layer: checked then timed.

    With channels_last, fp16 is also timed in NHWC memory order (tensor cores' favourite).
    `extra`: name -> ``f(x32, w32) -> (run, result)`` for more rows (the WMMA conv).
    """
    import torch

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
        t = bench.time_gpu_queued(run, repeat=repeat)  # the GPU's time, not Python's
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
        add(name, "fp16", *make(x, w))
    return _with_speedups(torch, rows, "cuDNN fp32")


def throughput_ratio(n: int = 8192, repeat: int = 5) -> dict:
    """Source 002's claim, measured: fp16 on tensor cores vs fp32 on the CUDA cores.

    fp16: the best of cuBLAS fp16 GEMM (PyTorch) at n^3; fp32: the course's FMA-peak kernel
    (every CUDA core busy) and cuBLAS SGEMM with TF32 off at the same size.
    """
    import torch

    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    flops = 2 * n**3
    _set_tf32(torch, False)
    sgemm = bench.time_gpu(lambda: a @ b, repeat=repeat).tflops(flops)
    a16, b16 = a.half(), b.half()
    hgemm = bench.time_gpu(lambda: a16 @ b16, repeat=repeat).tflops(flops)
    fma = bench.fma_peak()
    theory = bench.theoretical_peak()["tflops"]
    return dict(n=n, fp16_tensor_tflops=hgemm, fp32_sgemm_tflops=sgemm, fp32_fma_tflops=fma,
                fp32_theoretical_tflops=theory, ratio_vs_sgemm=hgemm / sgemm,
                ratio_vs_fma=hgemm / max(fma, sgemm), ratio_vs_theoretical=hgemm / theory)


# ----------------------------------------------------------------------------------------
# Which algorithm did the library run?

ALGORITHMS = (("fft", "FFT"), ("winograd", "Winograd"), ("precomputed", "precomputed GEMM"),
              ("implicit", "implicit GEMM"), ("direct", "direct"), ("gemm", "GEMM"),
              ("nvjet", "GEMM (nvJet)"))


def algorithm_of(kernel_names) -> str:
    """Name the convolution algorithm from the GPU kernels a library call launched.

    cuDNN's kernel names say it: ``fft2d_r2c_...`` / ``...winograd...`` /
    ``..._implicit_gemm_...`` / ``...precomputed...``; the first match in ALGORITHMS wins.
    """
    text = " ".join(kernel_names).lower()
    for key, name in ALGORITHMS:
        if key in text:
            return name
    return "unknown (" + ", ".join(sorted(set(kernel_names)))[:120] + ")"


def library_kernels(fn, *args) -> list:
    """Names of the GPU kernels that one call ``fn(*args)`` launches (PyTorch profiler)."""
    torch = import_optional("torch")
    from torch.profiler import ProfilerActivity, profile

    fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return kernel_names(prof.events())


def kernel_names(events) -> list:
    """The GPU kernels among profiler events, in launch order, without memsets and copies
    ("Memset (Device)", "Memcpy DtoD ..."): the last one is the call's last kernel."""
    gpu = [e for e in events if e.device_type.name == "CUDA"
           and not e.name.lower().startswith(("memset", "memcpy"))]
    return [e.name for e in sorted(gpu, key=lambda e: e.time_range.start)]


def cudnn_algorithm(impl: Impl, x, w) -> dict:
    """The kernels and algorithm of a prepared cuDNN Impl on inputs x, w."""
    state = impl.prepare(x, w)
    names = library_kernels(impl.run, state)
    return dict(algorithm=algorithm_of(names), kernels=names)


def same_shape_gemm_impl(problem, precision: str = "fp32") -> Impl:
    """cuBLAS (PyTorch) on the GEMM an implicit-GEMM conv computes: (N*P*Q, C*R*S) x
    (C*R*S, K). Its time is the yardstick "% of cuBLAS on the same GEMM shape"; the
    output is not the conv's, so `bench_conv` does not check it (time it directly)."""
    torch = import_optional("torch")
    from . import reference as ref

    p = ref.conv_params(problem.x_shape, problem.w_shape, **problem.kwargs)
    M, N, K = p.N * p.P * p.Q, p.K, p.C * p.R * p.S

    def prepare(x, w):
        set_torch_precision(precision)
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.rand((M, K), device="cuda", generator=g) - 0.5
        b = torch.rand((K, N), device="cuda", generator=g) - 0.5
        return dict(a=a, b=b, out=torch.empty((M, N), device="cuda"))

    def run(s):
        torch.matmul(s["a"], s["b"], out=s["out"])

    return Impl(f"cuBLAS {precision} same GEMM ({M}x{K} @ {K}x{N})", prepare, run,
                lambda s: None, kind="library")
