"""This GPU's roofline ceilings, measured, beside the theoretical ones.

- `theoretical_peak`: SMs x FP32 lanes per SM (by compute capability) x 2 x clock.
- `fma_peak`: a CUDA C kernel of independent FMA chains (CuPy, NVRTC); a Numba kernel
  spends a third of its issue slots on 64-bit loop arithmetic and reaches ~2/3 of the
  peak, so it is only the fallback where CuPy is missing (and says so).
- `copy_bandwidth`: the best device-to-device copy of a buffer far larger than L2
  (driver memcpy through Numba, CuPy and PyTorch, and a grid-stride kernel), in GB/s of
  bytes read plus bytes written.
- `measure_ceilings`: all of these as one dict (`ceilings` in the stored results).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .runtime import cuda, import_optional

# FP32 lanes (CUDA cores) per SM by compute capability.
FP32_LANES = {(6, 0): 64, (6, 1): 128, (6, 2): 128, (7, 0): 64, (7, 2): 64, (7, 5): 64,
              (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128, (9, 0): 128, (10, 0): 128,
              (10, 3): 128, (12, 0): 128, (12, 1): 128}
CSRC = Path(__file__).parent / "kernels" / "csrc"


def _device():
    return cuda().get_current_device()


def theoretical_peak(device=None) -> dict:
    """fp32 TFLOP/s = SMs x lanes x 2 (an FMA is two FLOPs) x clock, from the device."""
    dev = device or _device()
    cc = tuple(dev.compute_capability)
    sms = dev.MULTIPROCESSOR_COUNT
    ghz = dev.CLOCK_RATE / 1e6  # kHz -> GHz (the boost clock the driver reports)
    lanes = FP32_LANES.get(cc)
    if lanes is None:
        raise KeyError(f"FP32 lanes per SM of compute capability {cc} unknown: add it to "
                       "convlab.ceilings.FP32_LANES")
    return dict(tflops=sms * lanes * 2 * ghz / 1e3, sms=sms, lanes_per_sm=lanes,
                clock_ghz=ghz, compute_capability=list(cc))


def _time_ms(fn, repeat: int, warmup: int = 2) -> float:
    """Median ms of fn() by CUDA events (bench.time_gpu builds on this module, not back)."""
    c = cuda()
    for _ in range(warmup):
        fn()
    c.synchronize()
    start, end = c.event(), c.event()
    samples = []
    for _ in range(repeat):
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(c.event_elapsed_time(start, end))
    return float(np.median(samples))


def fma_peak(repeat: int = 7) -> dict:
    """Measured fp32 FMA TFLOP/s and the kernel that reached it ('cuda c' or 'numba')."""
    dev = _device()
    blocks, threads, n_iter = dev.MULTIPROCESSOR_COUNT * 16, 256, 4096
    flops = blocks * threads * n_iter * 16 * 8 * 2
    cp = import_optional("cupy")
    if cp is not None:
        k = cp.RawKernel((CSRC / "fma_chains.cu").read_text(), "fma_chains",
                         options=("-std=c++17",))
        out = cp.empty(blocks * threads, dtype=cp.float32)
        ms = _time_ms(lambda: k((blocks,), (threads,), (out, np.int32(n_iter))), repeat)
        return dict(tflops=flops / ms / 1e9, kernel="cuda c (8 fmaf chains, unrolled)")
    k = _numba_fma()
    out = cuda().device_array(blocks * threads, dtype=np.float32)
    ms = _time_ms(lambda: k[blocks, threads](out, np.int32(n_iter)), repeat)
    return dict(tflops=flops / ms / 1e9, kernel="numba (CuPy missing: ~2/3 of the peak)")


def _numba_fma():
    from numba import float32, int32

    c = cuda()

    @c.jit
    def fma_chains(out, n_iter):
        i = c.grid(1)
        a0 = float32(i) * float32(1e-9)
        a1, a2, a3 = a0 + float32(1), a0 + float32(2), a0 + float32(3)
        a4, a5, a6, a7 = a0 + float32(4), a0 + float32(5), a0 + float32(6), a0 + float32(7)
        m, k = float32(0.9999), float32(1e-6)
        for _ in range(int32(n_iter)):
            for _u in range(16):
                a0, a1, a2, a3 = a0 * m + k, a1 * m + k, a2 * m + k, a3 * m + k
                a4, a5, a6, a7 = a4 * m + k, a5 * m + k, a6 * m + k, a7 * m + k
        out[i] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7

    return fma_chains


def copy_bandwidth(nbytes: int = 1 << 31, repeat: int = 10) -> dict:
    """Best device-to-device copy in GB/s (bytes read + written) and every copy tried."""
    c = cuda()
    n = nbytes // 4
    tried = {}
    a = c.device_array(n, dtype=np.float32)
    b = c.device_array(n, dtype=np.float32)
    tried["numba memcpy"] = _time_ms(lambda: b.copy_to_device(a), repeat)
    k = _copy_kernel()
    blocks = _device().MULTIPROCESSOR_COUNT * 8
    tried["numba grid-stride kernel"] = _time_ms(lambda: k[blocks, 512](a, b), repeat)
    a = b = None  # free before the next pair
    cp = import_optional("cupy")
    if cp is not None:
        ca, cb = cp.empty(n, cp.float32), cp.empty(n, cp.float32)
        tried["cupy memcpy"] = _time_ms(lambda: cb.__setitem__(Ellipsis, ca), repeat)
        ca = cb = None
    torch = import_optional("torch")
    if torch is not None and torch.cuda.is_available():
        ta = torch.empty(n, dtype=torch.float32, device="cuda")
        tb = torch.empty_like(ta)
        tried["torch copy_"] = _time_ms(lambda: tb.copy_(ta), repeat)
        ta = tb = None
    gbps = {name: 2 * nbytes / ms / 1e6 for name, ms in tried.items()}
    best = max(gbps, key=gbps.get)
    return dict(gbps=gbps[best], best=best, tried=gbps, buffer_bytes=nbytes)


def _copy_kernel():
    c = cuda()

    @c.jit
    def copy_kernel(src, dst):
        i = c.grid(1)
        step = c.gridsize(1)
        while i < src.size:
            dst[i] = src[i]
            i += step

    return copy_kernel


def measure_ceilings() -> dict:
    """Measured and theoretical ceilings of this device, for the roofline and % of peak."""
    from .runtime import is_simulator

    if is_simulator():
        raise RuntimeError("measure_ceilings needs a real GPU (this is the simulator)")
    dev = _device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
    theory = theoretical_peak(dev)
    fma = fma_peak()
    copy = copy_bandwidth()
    return dict(device=name, fma_tflops=fma["tflops"], fma_kernel=fma["kernel"],
                theoretical_tflops=theory["tflops"], theoretical=theory,
                copy_gbps=copy["gbps"], copy_best=copy["best"], copy_tried=copy["tried"],
                fma_pct_of_theoretical=100 * fma["tflops"] / theory["tflops"])
