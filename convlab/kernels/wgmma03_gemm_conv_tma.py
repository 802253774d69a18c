"""Hopper tensor cores: ``wgmma.mma_async`` fed by TMA, a bf16/fp16 GEMM and conv (lesson 12).

CUDA C (``csrc/wgmma_tma.cu``) for compute capability 9.0 only (``sm_90a``: the "a"
features are not forward-compatible), compiled by NVRTC to PTX and loaded by CuPy. What
changes from ``mma.sync`` (mma02):

- one instruction per *warpgroup* (4 warps, 128 threads): ``wgmma.m64nNk16`` multiplies a
  64 x 16 slab of A by a 16 x N slab of B (N up to 256) reading both from shared memory
  through 64-bit matrix descriptors; no ldmatrix, no fragments to load;
- it is asynchronous: issued, committed, waited for (``wgmma.wait_group``);
- the Tensor Memory Accelerator (TMA) copies a whole tile (a "box" of a tensor described
  once on the host by a ``CUtensorMap``) into shared memory, swizzled, and counts the bytes
  into an mbarrier; one thread issues the copies of a block (warp specialization: a
  producer warpgroup, CONSUMERS math warpgroups).

``MMA_SYNC=1`` keeps the producer, the ring and the mbarriers and has the consumers multiply
with ``ldmatrix`` + ``mma.sync`` (mma02's math): the copies' share of the difference,
measured apart from the multiply's (GEMM only).

``mma.sync`` on Hopper issues below the wgmma rate: even on registers alone, with no
loads (``csrc/mma_peak.cu``), it stays under what cuBLAS's wgmma kernel sustains on a
whole GEMM; and its operands must pass through registers (``ldmatrix``), where one wgmma
reads shared memory directly. So the Hopper peak is only reached with wgmma.

Both operands are K-major (``C = A @ B^T``); the conv is an implicit GEMM over NHWC
input, stride 1, C % 64 == 0, the TMA box moved by (r, s) per slab, and out-of-range rows
(the padding) arrive as zeros.
"""

from __future__ import annotations

import ctypes
import functools
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._launch import Unsupported, ceil_div, launcher
from ._launch import array_kind as _kind
from ._launch import check_array as _check
from ._launch import device_pointer as _ptr
from ._launch import sm_count as _sm_count
from ._nvrtc import nvrtc_ptx

SOURCE_PATH = Path(__file__).parent / "csrc" / "wgmma_tma.cu"
ARCH = "compute_90a"


@dataclass(frozen=True)
class WgmmaConfig:
    """BN columns per block (the wgmma n), STAGES slots, CONSUMERS warpgroups of 64 rows
    (BM = 64 * CONSUMERS); conv: BQ output columns per block tile; MMA_SYNC: the consumers
    multiply with ldmatrix + mma.sync (four warps of 64 x BN / 4 each) instead of wgmma."""

    BN: int = 256
    STAGES: int = 4
    CONSUMERS: int = 2
    BQ: int = 16
    GROUP_M: int = 8
    MMA_SYNC: int = 0

    @property
    def BM(self) -> int:  # noqa: N802  (the tile's name in the lesson)
        return 64 * self.CONSUMERS

    @property
    def threads(self) -> int:
        return 128 * (self.CONSUMERS + 1)

    def smem_bytes(self, out_half: bool = False) -> int:
        """The slots, their mbarriers, 1024 for the alignment; with MMA_SYNC and a half
        output, each consumer warp's staged rows (64 x (BN / 4 + 8) halves)."""
        staged = 4 * self.CONSUMERS * 64 * (self.BN // 4 + 8) * 2 if (
            self.MMA_SYNC and out_half) else 0
        return self.STAGES * (self.BM + self.BN) * 64 * 2 + 16 * self.STAGES + 1024 + staged

    def validate(self) -> WgmmaConfig:
        if self.BN not in (64, 128, 256):
            raise ValueError(f"{self}: BN must be 64, 128 or 256")
        if self.CONSUMERS not in (1, 2) or self.BM % self.BQ:
            raise ValueError(f"{self}: 1 or 2 consumers, BQ dividing {self.BM}")
        if self.smem_bytes(out_half=True) > 227 * 1024:
            raise ValueError(f"{self}: {self.smem_bytes(True)} bytes of shared memory > 227 KiB")
        return self

    def defines(self, **extra) -> tuple:
        vals = dict(BN=self.BN, STAGES=self.STAGES, CONSUMERS=self.CONSUMERS, BQ=self.BQ,
                    GROUP_M=self.GROUP_M, MMA_SYNC=self.MMA_SYNC, **extra)
        return tuple(f"-D{k}={int(v)}" for k, v in sorted(vals.items()))

    def __str__(self) -> str:
        if self.MMA_SYNC:
            return (f"{self.BM}x{self.BN}x64 warp 64x{self.BN // 4} TMA s{self.STAGES} "
                    f"{self.CONSUMERS} consumers")
        return f"{self.BM}x{self.BN}x64 s{self.STAGES} {self.CONSUMERS} consumers"


GEMM_DEFAULT = WgmmaConfig()
# the mma.sync GEMM fed by TMA (lesson 12's mma.sync top): three slots leave room for
# the staged fp16 output rows
MMA_SYNC_TOP = WgmmaConfig(STAGES=3, MMA_SYNC=1)
GEMM_CANDIDATES = (GEMM_DEFAULT, WgmmaConfig(STAGES=3), WgmmaConfig(BN=128, STAGES=6),
                   WgmmaConfig(BN=128, CONSUMERS=1, STAGES=8))
CONV_CANDIDATES = (WgmmaConfig(BN=128, STAGES=5), WgmmaConfig(BN=64, STAGES=8),
                   WgmmaConfig(BN=256, STAGES=4), WgmmaConfig(BN=128, STAGES=5, BQ=8),
                   WgmmaConfig(BN=64, STAGES=8, BQ=8))


def source() -> str:
    return SOURCE_PATH.read_text()


def compile_ptx(cfg: WgmmaConfig = GEMM_DEFAULT, conv: bool = False, f16: bool = False,
                out_half: bool = False) -> str:
    """PTX for sm_90a (NVRTC, no GPU needed)."""
    return nvrtc_ptx(source(), "wgmma_tma.cu", (), ARCH,
                     options=cfg.validate().defines(CONV=conv, F16=f16, OUT_HALF=out_half))


def require_hopper():
    from ..runtime import import_optional

    cp = import_optional("cupy")
    cc = cp.cuda.Device().compute_capability
    if cc != "90":
        raise Unsupported(f"wgmma and TMA need compute capability 9.0 (sm_90a); this GPU is "
                          f"{cc[:-1]}.{cc[-1]}: read the stored H200 results and the PTX "
                          "(compile_ptx) instead")


@functools.cache
def _kernel(cfg: WgmmaConfig, conv: bool, f16: bool, out_half: bool):
    """Compiled kernel (`compile_ptx`, loaded by CuPy), once per process."""
    import cupy as cp

    path = Path(tempfile.mkdtemp(prefix="convlab-wgmma-")) / "wgmma_tma.ptx"
    path.write_text(compile_ptx(cfg, conv, f16, out_half))
    fn = cp.RawModule(path=str(path)).get_function("wgmma_tma_kernel")
    fn.max_dynamic_shared_size_bytes = cfg.smem_bytes(out_half)
    return fn


# ----------------------------------------------------------------------------------------
# Tensor maps (cuTensorMapEncodeTiled, through ctypes: the driver API is not in CuPy)

_DTYPE = {"bfloat16": 9, "float16": 6}  # CU_TENSOR_MAP_DATA_TYPE_*
_SWIZZLE_128B, _L2_256B = 3, 3


def tensor_map(ptr: int, kind: str, dims, strides_bytes, box) -> bytes:
    """A 128-byte CUtensorMap: a tensor of `dims` (innermost first) at `ptr`, copied in
    boxes of `box` elements with the 128-byte swizzle; out-of-range elements read as 0."""
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuTensorMapEncodeTiled
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p,
                   u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    rank = len(dims)
    raw = ctypes.create_string_buffer(128 + 64)
    addr = (ctypes.addressof(raw) + 63) // 64 * 64  # CUtensorMap is 64-byte aligned
    res = fn(ctypes.c_void_p(addr), _DTYPE[kind], rank, ctypes.c_void_p(ptr),
             (ctypes.c_uint64 * rank)(*dims), (ctypes.c_uint64 * (rank - 1))(*strides_bytes),
             (ctypes.c_uint32 * rank)(*box), (ctypes.c_uint32 * rank)(*([1] * rank)),
             0, _SWIZZLE_128B, _L2_256B, 0)
    if res != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {res}) for dims {dims}, "
                           f"strides {strides_bytes}, box {box}")
    return ctypes.string_at(addr, 128)


_PLANS: dict = {}


def _maps_on_device(key, make):
    """The two tensor maps of a launch in one device buffer (cached: the maps name the
    operands' addresses, so the key holds them)."""
    import cupy as cp

    if key not in _PLANS:
        if len(_PLANS) > 64:
            _PLANS.clear()
        a_map, b_map = make()
        _PLANS[key] = cp.asarray(np.frombuffer(a_map + b_map, dtype=np.uint64))
    return _PLANS[key]






def _scalars(*vals) -> tuple:
    return tuple(np.int32(v) for v in vals)




def _launch_kernel(fn, cfg, maps, out, scalars, nbm, nbn):
    """One block per SM (persistent), at most one per tile."""
    blocks = min(nbm * nbn, _sm_count())
    fn((blocks,), (cfg.threads,), (np.uint64(maps.data.ptr), np.uint64(_ptr(out)))
       + _scalars(*scalars, nbm, nbn), shared_mem=cfg.smem_bytes(_kind(out) != "float32"))
    return out


@launcher
def gemm_wgmma_raw(a, bt, out, cfg: WgmmaConfig | None = None):
    """C = A @ B^T: a (M, K), bt (N, K) bf16 or fp16 (PyTorch or CuPy), out (M, N) fp32 or
    the input type. K % 8 == 0 (TMA rows are whole 16-byte units), N even."""
    name = "gemm_wgmma"
    M, K = a.shape
    N = bt.shape[0]
    kinds = ("bfloat16", "float16")
    _check(name, "a", a, (M, K), kinds)
    _check(name, "bt", bt, (N, K), (_kind(a),))
    _check(name, "out", out, (M, N), ("float32", _kind(a)))
    if K % 8 or N % 2 or min(M, N, K) < 1:
        raise Unsupported(f"{name}: needs K % 8 == 0 and N even, got M={M}, N={N}, K={K}")
    require_hopper()
    cfg = (cfg or GEMM_DEFAULT).validate()
    kind = _kind(a)
    pa, pb = _ptr(a), _ptr(bt)
    maps = _maps_on_device(
        ("gemm", pa, pb, M, N, K, kind, cfg),
        lambda: (tensor_map(pa, kind, (K, M), (2 * K,), (64, cfg.BM)),
                 tensor_map(pb, kind, (K, N), (2 * K,), (64, cfg.BN))))
    fn = _kernel(cfg, False, kind == "float16", _kind(out) != "float32")
    return _launch_kernel(fn, cfg, maps, out, (M, N, K, *([0] * 14)), ceil_div(M, cfg.BM),
                   ceil_div(N, cfg.BN))


@launcher
def conv2d_wgmma_nhwc(x, w, out, padding=0, dilation=1, cfg: WgmmaConfig | None = None):
    """Implicit-GEMM conv, stride 1: x (N, H, W, C) bf16/fp16, w (K, R, S, C) the same type,
    out (N, P, Q, K) fp32 or the input type. C % 64 == 0 (one 128-byte swizzle row per
    slab), K even."""
    from ..reference import conv_params

    name = "conv2d_wgmma_nhwc"
    Nb, H, W, C = (int(v) for v in x.shape)
    K, R, S, Cw = (int(v) for v in w.shape)
    p = conv_params((Nb, C, H, W), (K, Cw, R, S), 1, padding, dilation)
    kinds = ("bfloat16", "float16")
    _check(name, "x", x, (Nb, H, W, C), kinds)
    _check(name, "w", w, (K, R, S, C), (_kind(x),))
    _check(name, "out", out, (Nb, p.P, p.Q, K), ("float32", _kind(x)))
    if C % 64 or K % 2:
        raise Unsupported(f"{name}: needs C % 64 == 0 and K even, got C={C}, K={K}")
    if cfg is not None and cfg.MMA_SYNC:
        raise Unsupported(f"{name}: the mma.sync consumers (MMA_SYNC) are written for the "
                          "GEMM only")
    require_hopper()
    cfg = (cfg or choose_conv(K)).validate()
    kind = _kind(x)
    BP = cfg.BM // cfg.BQ
    tiles_p, tiles_q = ceil_div(p.P, BP), ceil_div(p.Q, cfg.BQ)
    px, pw = _ptr(x), _ptr(w)
    RSC = R * S * C
    maps = _maps_on_device(
        ("conv", px, pw, Nb, H, W, C, K, R, S, kind, cfg),
        lambda: (tensor_map(px, kind, (C, W, H, Nb), (2 * C, 2 * C * W, 2 * C * W * H),
                            (64, cfg.BQ, BP, 1)),
                 tensor_map(pw, kind, (RSC, K), (2 * RSC,), (64, cfg.BN))))
    fn = _kernel(cfg, True, kind == "float16", _kind(out) != "float32")
    return _launch_kernel(fn, cfg, maps, out, (Nb * p.P * p.Q, K, RSC, Nb, H, W, C, p.P, p.Q, R, S,
                                        *p.padding, *p.dilation, tiles_p, tiles_q),
                   Nb * tiles_p * tiles_q, ceil_div(K, cfg.BN))


def choose_conv(K: int) -> WgmmaConfig:
    """BN = 64 for K <= 64, else 128."""
    return CONV_CANDIDATES[1] if K <= 64 else CONV_CANDIDATES[0]
