"""Tensor cores through ``mma.sync`` + ``ldmatrix``: an fp16/bf16 GEMM and conv (lesson 12).

CUDA C (``csrc/mma_sync.cu``) through CuPy, compiled by NVRTC. WMMA (wmma01) hides the
fragments; here each warp names its registers: ``ldmatrix.x4`` loads four 8x8 blocks
of shared memory straight into the registers ``mma.sync.m16n8k16`` multiplies, so a
64 x 64 warp tile costs 8 ldmatrix and 32 mma per 16-deep step. The lesson's ladder is
the same source with one switch more each step (`LADDER`):

1. ``mma.sync + ldmatrix``: global -> registers -> shared memory, two buffers, rows
   padded by 8 halves;
2. ``+ cp.async stages``: 16-byte asynchronous copies, STAGES slabs in flight;
3. ``+ swizzle``: no padding, 16-byte chunks XOR-permuted per row (ldmatrix stays
   conflict-free, as with the padding, and the cp.async writes become so too; less
   shared memory per stage, a fifth at BK = 32: room for more blocks or stages).

Both operands are K-major: the GEMM computes ``C = A @ B^T`` with a (M, K) and bt (N, K)
(cuBLAS's "TN"; `gemm_mma` transposes a row-major b once); the convolution is an
implicit GEMM over an NHWC input with filters as (K, R, S, C) — C % 8 == 0. The conv
adds its own switches (`CONV_SWITCHES`: one filter tap per slab, double-buffered
fragments, 16-byte stores staged in shared memory) and takes its tile by wave fill
(`choose_conv`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ._launch import Unsupported, ceil_div, launcher
from ._launch import array_kind as _kind
from ._launch import check_array as _check
from ._launch import device_pointer as _ptr
from ._launch import sm_count as _sm_count
from ._nvrtc import nvrtc_ptx

SOURCE_PATH = Path(__file__).parent / "csrc" / "mma_sync.cu"
PEAK_PATH = Path(__file__).parent / "csrc" / "mma_peak.cu"


@dataclass(frozen=True)
class MmaConfig:
    """Block tile BM x BN, slabs of BK, warp tile WM x WN; the loading switches; the
    scheduling switches of mma_sync.cu (FRAG_PIPE, GPTR, SERPENTINE: cp.async only); the
    conv's one-tap-per-slab loader TAPS (the conv launcher drops it where C % BK != 0);
    KSLICE warps per warp tile, each taking a share of every slab's 16-deep steps;
    STREAMK: the GEMM's last part-empty wave as stream-K shares (`stream_k_split`)."""

    BM: int = 128
    BN: int = 128
    BK: int = 32
    WM: int = 64
    WN: int = 64
    STAGES: int = 4
    ASYNC: int = 1
    SWIZZLE: int = 1
    GROUP_M: int = 8
    FRAG_PIPE: int = 0
    GPTR: int = 0
    SERPENTINE: int = 0
    EPI_SMEM: int = 0
    TAPS: int = 0
    KSLICE: int = 1
    STREAMK: int = 0
    EPI_PAD = 8   # elements per staged output row (mma_sync.cu's EPAD; not a field)

    @property
    def warp_tiles(self) -> int:
        return (self.BM // self.WM) * (self.BN // self.WN)

    @property
    def threads(self) -> int:
        return 32 * self.warp_tiles * self.KSLICE

    def smem_bytes(self) -> int:
        row = self.BK + (0 if self.SWIZZLE else 8)
        stages = 2 * self.STAGES * (self.BM + self.BN) * row
        # EPI_SMEM: each warp tile's WM rows of WN + EPI_PAD elements, fp32 (the larger
        # output); KSLICE > 1: as many again, the fp32 sums of the other slices
        tile = 4 * self.WM * (self.WN + self.EPI_PAD)
        staged = tile * self.warp_tiles * ((1 if self.EPI_SMEM else 0) + (self.KSLICE > 1))
        return max(stages, staged)

    def validate(self) -> MmaConfig:
        if self.BM % self.WM or self.BN % self.WN or self.WM % 16 or self.WN % 16:
            raise ValueError(f"{self}: warps of 16-multiples must tile the block")
        if self.BK % 16 or (self.SWIZZLE and self.BK != 32 and self.BK % 64):
            raise ValueError(f"{self}: BK must be a multiple of 16 (32 or a multiple of 64 "
                             "with the swizzle: rows of 64 bytes or of whole 128-byte lines)")
        if not self.ASYNC and self.STAGES != 2:
            raise ValueError(f"{self}: register staging uses STAGES=2")
        if (self.FRAG_PIPE or self.GPTR or self.SERPENTINE or self.TAPS) and not self.ASYNC:
            raise ValueError(f"{self}: FRAG_PIPE, GPTR, SERPENTINE and TAPS need ASYNC=1")
        if self.KSLICE < 1 or (self.BK // 16) % self.KSLICE:
            raise ValueError(f"{self}: KSLICE must divide BK / 16")
        if self.FRAG_PIPE and ((self.BK // 16 // self.KSLICE) % 2
                               or (self.SWIZZLE and self.BK not in (32, 64, 128))):
            raise ValueError(f"{self}: FRAG_PIPE needs BK / 16 / KSLICE even (and BK 32, 64 "
                             "or 128 swizzled)")
        if (self.GPTR or self.TAPS) and (self.threads % (self.BK // 8)
                          or self.BM * (self.BK // 8) % self.threads
                          or self.BN * (self.BK // 8) % self.threads):
            raise ValueError(f"{self}: GPTR and TAPS need whole chunks per thread, one column "
                             "each")
        if self.STREAMK and not (self.FRAG_PIPE and self.GPTR and self.KSLICE == 1):
            raise ValueError(f"{self}: STREAMK needs FRAG_PIPE and GPTR, without KSLICE")
        if self.smem_bytes() > 227 * 1024:
            raise ValueError(f"{self}: {self.smem_bytes()} bytes of shared memory > 227 KiB")
        return self

    def defines(self, **extra) -> tuple:
        vals = dict(BM=self.BM, BN=self.BN, BK=self.BK, WM=self.WM, WN=self.WN,
                    STAGES=self.STAGES, ASYNC=self.ASYNC, SWIZZLE=self.SWIZZLE,
                    GROUP_M=self.GROUP_M, FRAG_PIPE=self.FRAG_PIPE, GPTR=self.GPTR,
                    SERPENTINE=self.SERPENTINE, EPI_SMEM=self.EPI_SMEM, TAPS=self.TAPS,
                    KSLICE=self.KSLICE, STREAMK=self.STREAMK, **extra)
        return tuple(f"-D{k}={int(v)}" for k, v in sorted(vals.items()))

    def __str__(self) -> str:
        load = f"cp.async s{self.STAGES}" if self.ASYNC else "regs s2"
        return (f"{self.BM}x{self.BN}x{self.BK} warp {self.WM}x{self.WN} {load} "
                f"{'swizzle' if self.SWIZZLE else 'pad'}"
                + (f" group {self.GROUP_M}" if self.GROUP_M != 8 else "")
                + "".join(f" {k.lower()}" for k in ("FRAG_PIPE", "GPTR", "SERPENTINE",
                                                    "EPI_SMEM", "TAPS", "STREAMK")
                          if getattr(self, k))
                + (f" kslice {self.KSLICE}" if self.KSLICE > 1 else ""))


STEP1 = MmaConfig(STAGES=2, ASYNC=0, SWIZZLE=0)
STEP2 = replace(STEP1, STAGES=4, ASYNC=1)
STEP3 = replace(STEP2, SWIZZLE=1)
LADDER = {"mma.sync + ldmatrix": STEP1, "+ cp.async stages": STEP2, "+ swizzle": STEP3}
GEMM_DEFAULT = STEP3
# 8 warps of 64 x 64 on a 128 x 256 tile, both scheduling switches: the fastest tile timed
GEMM_TOP = replace(STEP3, BN=256, BK=64, STAGES=3, FRAG_PIPE=1, GPTR=1)
GEMM_CANDIDATES = (STEP3, replace(STEP3, STAGES=3), replace(STEP3, STAGES=5),
                   replace(STEP3, BN=64, WN=32), replace(STEP3, BM=64, WM=32),
                   replace(STEP3, BK=64, STAGES=3), replace(STEP3, BN=256),
                   replace(STEP3, GROUP_M=16), GEMM_TOP)
# fp16 output (what cuBLAS writes): direct 4-byte stores, then staged in shared memory,
# then the last part-empty wave as stream-K shares
GEMM_FP16_OUT = (STEP3, GEMM_TOP, replace(GEMM_TOP, EPI_SMEM=1),
                 replace(GEMM_TOP, EPI_SMEM=1, STREAMK=1))
# The conv: its loader and epilogue (one tap per slab, fragment double buffering, 16-byte
# stores staged in shared memory), then the tiles `choose_conv` picks from, (BM, BN) ->
# config; block heights of 96 fill whole waves where 128 leaves SMs idle.
CONV_SWITCHES = dict(TAPS=1, FRAG_PIPE=1, EPI_SMEM=1)
CONV_TILES = {
    (192, 64): replace(STEP3, BM=192, BN=64, WM=48, STAGES=4, **CONV_SWITCHES),
    (128, 64): replace(STEP3, BN=64, WM=32, STAGES=4, **CONV_SWITCHES),
    (96, 64): replace(STEP3, BM=96, BN=64, WM=48, WN=32, STAGES=4, **CONV_SWITCHES),
    (192, 128): replace(STEP3, BM=192, WM=48, BK=64, STAGES=4, **CONV_SWITCHES),
    (128, 128): replace(STEP3, STAGES=4, **CONV_SWITCHES),
    (96, 128): replace(STEP3, BM=96, WM=48, STAGES=4, **CONV_SWITCHES),
    (64, 128): replace(STEP3, BM=64, WM=32, BK=64, STAGES=3, **CONV_SWITCHES),
}
# where the grid is one block per SM (a single wave), 8 warps per block instead of 4: two
# per 48 x 64 warp tile, each taking half of every slab (sliced K)
CONV_ONE_WAVE = {
    (96, 128): replace(STEP3, BM=96, WM=48, BK=64, STAGES=3, KSLICE=2, **CONV_SWITCHES),
}
# the earlier conv tiles: the chunk-by-chunk gather, direct stores (lesson 12's steps)
CONV_GATHER = (replace(STEP3, BM=64, WM=32, BK=64, STAGES=3),
               replace(STEP3, BM=64, BN=64, WM=32, WN=32, BK=64, STAGES=4))
CONV_CANDIDATES = tuple(CONV_TILES.values()) + tuple(CONV_ONE_WAVE.values()) + CONV_GATHER


def source() -> str:
    return SOURCE_PATH.read_text()


def require_sm80():
    """Raise Unsupported below compute capability 8.0: mma.sync.m16n8k16, ldmatrix and
    cp.async are Ampere instructions (a T4 or V100 runs the WMMA kernels instead)."""
    import cupy as cp

    cc = cp.cuda.Device().compute_capability
    if int(cc) < 80:
        raise Unsupported(f"mma.sync.m16n8k16 and cp.async need compute capability 8.0 or "
                          f"higher; this GPU has {cc[:-1]}.{cc[-1]} (use wmma01 there)")
    return int(cc)


def _compile(text: str, cfg: MmaConfig, conv: bool, out_f16: bool, bf16: bool):
    import cupy as cp

    opts = ("-std=c++17",) + cfg.validate().defines(CONV=conv, OUT_F16=out_f16, BF16=bf16)
    fn = cp.RawModule(code=text, options=opts).get_function("mma_sync_kernel")
    fn.max_dynamic_shared_size_bytes = cfg.smem_bytes()
    return fn


@functools.cache
def _kernel(cfg: MmaConfig, conv: bool, out_f16: bool, bf16: bool):
    """The compiled kernel for one configuration (CuPy RawModule, once per process)."""
    return _compile(source(), cfg, conv, out_f16, bf16)


def compiler_for(text: str):
    """`_kernel` over another copy of mma_sync.cu (same kernel signature): what the A/B
    tools put in its place to time a change beside the package's kernel."""
    return functools.cache(lambda cfg, conv, out_f16, bf16: _compile(text, cfg, conv, out_f16,
                                                                     bf16))


def compile_ptx(cfg: MmaConfig = GEMM_DEFAULT, arch: str = "compute_80", conv: bool = False,
                bf16: bool = False) -> str:
    """PTX of one configuration (NVRTC, no GPU needed)."""
    return nvrtc_ptx(source(), "mma_sync.cu", (), arch,
                     options=cfg.validate().defines(CONV=conv, BF16=bf16))


# Scalar arguments of the kernel after the four pointers, in order.
_SCALARS = ("M", "N", "Kd", "H", "W", "C", "P", "Q", "S", "sh", "sw", "ph", "pw", "dh", "dw",
            "sk_blocks", "sk_tiles")
SK_FLAGS = 1024        # mma_sync.cu's SK_FLAGS: stream-K's flags, ahead of the shares' sums
STREAM_K_FILL = 0.95   # stream-K where the last wave is emptier than this


def _scalars(**v) -> tuple:
    return tuple(np.int32(v.get(k, 0)) for k in _SCALARS)


def stream_k_split(cfg: MmaConfig, M: int, N: int, Kd: int, sms: int) -> tuple[int, int]:
    """(sk_tiles, sk_blocks) of a STREAMK GEMM on `sms` SMs: the tiles after the whole
    waves (all of them when fewer than sms) and the blocks sharing their slabs, at most one
    per SM; (0, 0) without STREAMK or where the last wave is STREAM_K_FILL full or more."""
    tiles = ceil_div(M, cfg.BM) * ceil_div(N, cfg.BN)
    left = tiles % sms
    if not cfg.STREAMK or left == 0 or left / sms >= STREAM_K_FILL:
        return 0, 0
    return left, min(sms, left * ceil_div(Kd, cfg.BK))


def work_floats(cfg: MmaConfig, sk_blocks: int) -> int:
    """fp32 words of stream-K's `work`: SK_FLAGS flags (zero between launches), then one
    BM x BN tile of sums per sharing block."""
    return SK_FLAGS + sk_blocks * cfg.BM * cfg.BN if sk_blocks else 0


# device -> zeroed CuPy float32 array, grown as needed: one workspace per device, so
# STREAMK launches must not run on two streams at once (their flags and sums would mix)
_WORK: dict = {}


def _work(floats: int) -> int:
    """Device address of at least `floats` words of stream-K workspace (0 for none)."""
    if not floats:
        return 0
    import cupy as cp

    dev = cp.cuda.Device().id
    if dev not in _WORK or _WORK[dev].size < floats:
        _WORK[dev] = cp.zeros(floats, cp.float32)
    return _WORK[dev].data.ptr


def grid_of(cfg: MmaConfig, M: int, N: int, sk_tiles: int = 0, sk_blocks: int = 0) -> tuple:
    """The launch grid: (N / BN, M / BM) blocks, or with STREAMK 1-D: the whole tiles, then
    the sharing blocks."""
    if cfg.STREAMK:
        return (ceil_div(M, cfg.BM) * ceil_div(N, cfg.BN) - sk_tiles + sk_blocks, 1)
    return (ceil_div(N, cfg.BN), ceil_div(M, cfg.BM))


def _launch_kernel(cfg, conv, a, b, out, M, N, Kd, **geom):
    bf16 = _kind(a) == "bfloat16"
    fn = _kernel(cfg, conv, _kind(out) == "float16", bf16)
    sk_tiles, sk_blocks = stream_k_split(cfg, M, N, Kd, _sm_count()) if cfg.STREAMK else (0, 0)
    grid = grid_of(cfg, M, N, sk_tiles, sk_blocks)
    if grid[1] > 65535:
        raise Unsupported(f"{cfg}: {grid[1]} block rows > 65535")
    work = _work(work_floats(cfg, sk_blocks))
    fn(grid, (cfg.threads,), (np.uint64(_ptr(a)), np.uint64(_ptr(b)), np.uint64(_ptr(out)),
                              np.uint64(work))
       + _scalars(M=M, N=N, Kd=Kd, sk_blocks=sk_blocks, sk_tiles=sk_tiles, **geom),
       shared_mem=cfg.smem_bytes())
    return out


@launcher
def gemm_mma_raw(a, bt, out, cfg: MmaConfig | None = None):
    """C = A @ B^T on tensor cores: a (M, K) and bt (N, K) fp16 or bf16, out (M, N) fp32 or
    fp16, device arrays (CuPy or PyTorch). K % 8 == 0, N even; any M, N, K otherwise."""
    name = "gemm_mma"
    if a.ndim != 2 or bt.ndim != 2 or a.shape[1] != bt.shape[1]:
        raise ValueError(f"{name}: a {tuple(a.shape)} and bt {tuple(bt.shape)} must share K")
    M, K = a.shape
    N = bt.shape[0]
    halves = ("float16", "bfloat16")
    _check(name, "a", a, (M, K), halves)
    _check(name, "bt", bt, (N, K), (_kind(a),))
    _check(name, "out", out, (M, N), ("float32", "float16"))
    if K % 8 or N % 2:
        raise Unsupported(f"{name}: K must be a multiple of 8 and N even, got K={K}, N={N}")
    if max(M * K, N * K, M * N) >= 2**31:
        raise Unsupported(f"{name}: matrices must have fewer than 2**31 elements")
    require_sm80()
    return _launch_kernel((cfg or GEMM_DEFAULT).validate(), False, a, bt, out, M, N, K)


def gemm_mma(a, b, cfg: MmaConfig | None = None):
    """A @ B (fp32 or fp16, host or device, any shapes) on tensor cores -> fp32 CuPy array.

    Inputs rounded to fp16; b transposed once to K-major; K padded to a multiple of 8."""
    import cupy as cp

    a, b = cp.asarray(a), cp.asarray(b)
    M, K = a.shape
    N = b.shape[1]
    Kp, Np = ceil_div(K, 8) * 8, N + N % 2
    ah = cp.zeros((M, Kp), cp.float16)
    bt = cp.zeros((Np, Kp), cp.float16)
    ah[:, :K] = a.astype(cp.float16)
    bt[:N, :K] = b.T.astype(cp.float16)
    out = cp.empty((M, Np), cp.float32)
    gemm_mma_raw(ah, bt, out, cfg)
    return out[:, :N]


@launcher
def conv2d_mma_nhwc(x, w, out, stride=1, padding=0, dilation=1, cfg: MmaConfig | None = None):
    """Implicit-GEMM conv on tensor cores, channels last: x (N, H, W, C) fp16/bf16,
    w (K, R, S, C) same type, out (N, P, Q, K) fp32 or fp16. C % 8 == 0, K even."""
    from ..reference import conv_params

    name = "conv2d_mma_nhwc"
    if x.ndim != 4 or w.ndim != 4:
        raise ValueError(f"{name}: x and w must be 4-D (NHWC and KRSC)")
    Nb, H, W, C = (int(v) for v in x.shape)
    K, R, S, Cw = (int(v) for v in w.shape)
    p = conv_params((Nb, C, H, W), (K, Cw, R, S), stride, padding, dilation)
    halves = ("float16", "bfloat16")
    _check(name, "x", x, (Nb, H, W, C), halves)
    _check(name, "w", w, (K, R, S, C), (_kind(x),))
    _check(name, "out", out, (Nb, p.P, p.Q, K), ("float32", "float16"))
    if C % 8 or K % 2:
        raise Unsupported(f"{name}: needs C % 8 == 0 and K even, got C={C}, K={K}")
    M, Kd = Nb * p.P * p.Q, R * S * C
    if max(M * Kd, M * K, Nb * H * W * C) >= 2**31:
        raise Unsupported(f"{name}: tensors must have fewer than 2**31 elements")
    require_sm80()
    cfg = (cfg or choose_conv(K, M, _sm_count())).validate()
    if cfg.STREAMK:
        raise ValueError(f"{name}: STREAMK is the GEMM's ({cfg})")
    if cfg.TAPS and (C % cfg.BK or R * S > 32):   # a slab would straddle two taps
        cfg = replace(cfg, TAPS=0)
    return _launch_kernel(cfg, True, x, w, out, M, K, Kd, H=H, W=W, C=C, P=p.P, Q=p.Q, S=S,
                   sh=p.stride[0], sw=p.stride[1], ph=p.padding[0], pw=p.padding[1],
                   dh=p.dilation[0], dw=p.dilation[1])


def wave_fill(blocks: int, slots: int) -> float:
    """Busy share of the SMs over the run: `blocks` in waves of `slots` (SMs x blocks per
    SM); 1.0 when the last wave is full."""
    return blocks / (ceil_div(blocks, slots) * slots)


def choose_conv(K: int, M: int | None = None, sms: int = 132) -> MmaConfig:
    """The conv tile for M output pixels x K filters, without timing: 64 filters wide when
    K <= 64, else 128; then the tallest block (192, 128, 96, 64 rows) whose blocks fill
    the waves on `sms` SMs within 2% of the best fill (counted at one block per SM); its
    8-warp form (`CONV_ONE_WAVE`) when those blocks are at most one per SM."""
    bn = 64 if K <= 64 else 128
    tiles = [(bm, cfg) for (bm, b), cfg in CONV_TILES.items() if b == bn]
    if M is None:
        return tiles[0][1]
    blocks = {bm: ceil_div(M, bm) * ceil_div(K, bn) for bm, _ in tiles}
    fill = {bm: wave_fill(n, sms) for bm, n in blocks.items()}
    best = max(fill.values())
    bm, cfg = next((bm, cfg) for bm, cfg in tiles if fill[bm] >= best - 0.02)
    return CONV_ONE_WAVE.get((bm, bn), cfg) if blocks[bm] <= sms else cfg


def make_conv_launcher(cfg: MmaConfig | None = None, name: str = "conv2d_mma"):
    """The course's signature (NCHW fp32 x, w, out device arrays) around the NHWC kernel:
    x rounded to fp16 and moved to NHWC, w to (K, R, S, C), out back to NCHW; those
    conversions are part of the call (and of its time)."""

    @launcher
    def conv2d_mma(x, w, out, stride=1, padding=0, dilation=1, groups=1):
        import cupy as cp

        from ._launch import conv_launch_params

        p = conv_launch_params(name, x, w, out, stride, padding, dilation, groups)
        if p.C % 8:
            raise Unsupported(f"{name}: needs C % 8 == 0, got C={p.C}")
        xh = cp.ascontiguousarray(cp.asarray(x).transpose(0, 2, 3, 1).astype(cp.float16))
        wh = cp.ascontiguousarray(cp.asarray(w).transpose(0, 2, 3, 1).astype(cp.float16))
        y = cp.empty((p.N, p.P, p.Q, p.K), cp.float32)
        conv2d_mma_nhwc(xh, wh, y, p.stride, p.padding, p.dilation, cfg=cfg)
        cp.asarray(out)[...] = y.transpose(0, 3, 1, 2)
        return out

    conv2d_mma.__name__ = name
    return conv2d_mma


conv2d_mma = make_conv_launcher()


def mma_peak_kernel(chains: int = 8):
    """The register-only mma.sync throughput kernel (csrc/mma_peak.cu): ``fn(grid, block,
    (out, iters))``; each thread's warp issues `chains` independent mma per iteration, 4096
    flops each."""
    import cupy as cp

    return cp.RawKernel(PEAK_PATH.read_text(), "mma_peak", options=(f"-DCHAINS={chains}",))
