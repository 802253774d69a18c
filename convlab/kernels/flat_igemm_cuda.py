"""The implicit GEMM for small convolutions: one launch, filters read where they are.

A 1x1 convolution is a GEMM straight on NCHW data: for each image, y (K x P*Q) = w (K x C)
@ x (C x H*W), rows of x strided for stride 2. A conv with few input channels (ResNet's
stem, C = 3) is one too, over the flat reduction index l = (c R + r) S + s: w is already
the (K, C*R*S) matrix, and the columns are gathered from x inside the loads (im2col fused
away). ``csrc/flat_igemm.cu`` does either in ONE kernel launch: no weight transform
(conv09 rearranges the filters on every call), no memset, no reduction kernel. That is
what matters at batch 1, where a layer's whole arithmetic takes a few microseconds and
every extra launch adds about as much again.

Small problems give few output tiles, so the tile shrinks with the problem (`choose`:
64x64, 32x64 or 32x32 outputs per block of 64 threads, the largest that still gives
about 4 blocks, 8 warps, per SM: with fewer, each scheduler waits on its one warp's
loads) and, when even 32x32 tiles give fewer, the reduction is split (`split_parts`).
The parts write their sums to a workspace; the last part of each
tile to finish adds them in the fixed order 0, 1, 2, ... (a counter per tile, reset by
that block), so results are reproducible from run to run, whichever part finishes first.
Those few-tile grids also slice each slab's reduction inside the block (``KS`` groups of
64 threads, `SMALL_GRID_KS`): each group multiplies BK/KS of a slab's rows into its own
sums, group 0 adds the others' in a fixed order; the block loads each slab with KS times
the threads, so an SM has KS times the warps to hide load and shared-memory latency.
A small tile's slab is far shorter than a load's latency, so the loads of the next
`prefetch_for` slabs (2, or 5 for long parts; fewer where a thread's sums and loads would
pass 96 registers, as on the 64x64 tile) are in flight while one is multiplied. A
strided 1x1 layer with a large input reads its rows of x as scalars; `subsample_first`
copies x[:, :, ::sh, ::sw] out densely first (a second, tiny launch) and runs the GEMM at
stride 1 on it, with float4 rows.
A launcher's workspace and counters belong to its shape: one stream at a time.

NCHW float32, any stride / padding / dilation, groups 1. Needs CuPy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ._launch import Unsupported, ceil_div, conv_launch_params, launcher
from ._launch import device_pointer as _ptr
from .conv09_implicit_gemm_cuda import MAX_SPLIT_K, SMS

SOURCE_PATH = Path(__file__).parent / "csrc" / "flat_igemm.cu"
BK = 16  # reduction indices per slab (the source's BK)


@dataclass(frozen=True)
class Tile:
    """BM filters x BN output pixels per block, the reduction split into SPLIT parts
    (blocks) and each slab of it sliced among KS groups of threads (inside a block)."""

    BM: int = 64
    BN: int = 64
    SPLIT: int = 1
    KS: int = 1

    @property
    def sums(self) -> int:
        """Outputs (fp32 accumulators) per thread: 8 x 8, 4 x 8 or 4 x 4."""
        return (8 if self.BM >= 64 else 4) * (8 if self.BN >= 64 else 4)

    @property
    def threads(self) -> int:
        return self.KS * self.BM * self.BN // self.sums

    @property
    def slab_floats(self) -> int:
        """Floats of one slab's loads a thread holds in registers (the source's
        4 * (A_F4 + B_F4))."""
        a_f4 = ceil_div(self.BM * BK // 4, self.threads)
        b_f4 = ceil_div(BK, self.threads // (self.BN // 4))
        return 4 * (a_f4 + b_f4)

    def name_expression(self, mode: int) -> str:
        return f"flat_igemm<{self.BM}, {self.BN}, {mode}, {self.KS}>"

    def __str__(self):
        return (f"{self.BM}x{self.BN}" + (f" split{self.SPLIT}" if self.SPLIT > 1 else "")
                + (f" ks{self.KS}" if self.KS > 1 else ""))


# Largest first; `choose` takes the first that fills the GPU.
TILES = (Tile(64, 64), Tile(32, 64), Tile(32, 32))
MODES = (0, 1)  # 0: 1x1 without padding (rows of x), 1: gathered (c, r, s) columns
KS_CHOICES = (1, 2, 4)  # groups a block's slab reduction can be sliced among
STATIC_SMEM = 48 * 1024  # bytes of static shared memory a kernel may declare


def smem_bytes(t: Tile) -> int:
    """Static shared memory of tile t's kernel: the larger of the two slab buffers and the
    partial sums of groups 1..KS-1 (a union), plus the split-K flag."""
    slabs = 2 * BK * (t.BM + t.BN) * 4
    return max(slabs, (t.KS - 1) * t.BM * t.BN * 4) + 4


# Every compiled kernel: each tile with each KS whose shared memory fits (SPLIT is a
# launch argument, not a kernel).
KERNELS = tuple(Tile(t.BM, t.BN, 1, ks) for t in TILES for ks in KS_CHOICES
                if smem_bytes(Tile(t.BM, t.BN, 1, ks)) <= STATIC_SMEM)


def mode_of(p) -> int:
    """The source's MODE for ConvParams p (1x1 unpadded: 0, else 1)."""
    return 0 if (p.R, p.S) == (1, 1) and p.padding == (0, 0) else 1


TARGET_BLOCKS = 4 * SMS  # blocks of 64 threads wanted: 8 warps per SM (H200: 132 SMs)
SMALL_GRID_KS = 2  # KS of choose's 32x32 fallback (few tiles): tools/gpu/flat_ks.py


def split_target(ks: int) -> int:
    """Blocks the fallback's split aims at: 4 per SM of 64 threads; one per SM once each
    block has KS > 1 thread groups (their own latency hiding), as fewer parts cost less
    workspace traffic (the faster on every batch-1 layer timed)."""
    return TARGET_BLOCKS if ks == 1 else SMS


def split_parts(blocks: int, slabs: int, target: int = TARGET_BLOCKS) -> int:
    """Parts to split a reduction of `slabs` slabs into so that `blocks` output tiles give
    about `target` blocks, each part keeping at least 4 slabs (64 reduction indices)."""
    return max(1, min(MAX_SPLIT_K, ceil_div(target, blocks), slabs // 4))


def choose(p, ks: int | None = None) -> Tile:
    """The tile for ConvParams p: the largest of `TILES` (no taller than the filters, when
    a shorter one exists) whose grid has `TARGET_BLOCKS` blocks, else 32x32 with the
    reduction split (`split_parts`) towards that many and each slab sliced among
    `ks` (default `SMALL_GRID_KS`) groups of threads (`split_target`)."""
    npq = p.N * p.P * p.Q
    fits = [t for t in TILES if t.BM <= p.K] or [TILES[-1]]
    for t in fits:
        if ceil_div(p.K, t.BM) * ceil_div(npq, t.BN) >= TARGET_BLOCKS:
            return t
    t = TILES[-1]
    blocks = ceil_div(p.K, t.BM) * ceil_div(npq, t.BN)
    ks = SMALL_GRID_KS if ks is None else ks
    return Tile(t.BM, t.BN, split_parts(blocks, ceil_div(p.C * p.R * p.S, BK), split_target(ks)),
                ks)


PREFETCH = 2  # slabs whose loads are in flight (the source's default PREFETCH)
DEEP_PREFETCH, DEEP_MIN_SLABS = 5, 16  # ... and for parts of at least 16 slabs
MAX_THREAD_FLOATS = 96  # a thread's sums plus its loads in flight, at most


def prefetch_for(tile: Tile, slabs_per_part: int) -> int:
    """Slabs whose loads a part keeps in flight: 5 where it reduces 16 slabs or more, else
    2 (a short part spends its first slabs filling a deep pipeline), fewer (down to 1)
    while the thread's sums and those loads would pass MAX_THREAD_FLOATS registers.
    Chosen on the H200 (`tools/gpu/flat_ks.py`, `results/h200_flat_prefetch_2026-12-03.txt`,
    `results/h200_flat_prefetch5_2026-12-04.txt`): on the batch-1 ResNet-50 layers (32x32
    tiles) 2 was at least as fast as 1 on each; on the parts of 16 slabs and more 4 was
    faster than 2, and 5 faster than 4 (by 0-11%) and at least as fast as 6 on each; at
    batch 32 and 128 the tiles at 128 floats and more (64x64 at 2 and 4, 32x64 at 4) ran
    1.13-2x slower than at 1, the 32x32 tile at 80 (4 slabs) 5% faster."""
    depth = DEEP_PREFETCH if slabs_per_part >= DEEP_MIN_SLABS else PREFETCH
    while depth > 1 and tile.sums + depth * tile.slab_floats > MAX_THREAD_FLOATS:
        depth -= 1
    return depth


_MODULES: dict = {}


def module_options(tile: Tile, mode: int, prefetch: int) -> tuple:
    """NVRTC options of the one-kernel module of `tile` (its BM, BN, KS) in `mode` with
    `prefetch` slabs in flight: the source's -D switches for ``flat_igemm_tile``."""
    return ("-std=c++17", f"-DPREFETCH={int(prefetch)}", f"-DFLAT_BM={tile.BM}",
            f"-DFLAT_BN={tile.BN}", f"-DFLAT_MODE={int(mode)}", f"-DFLAT_KS={tile.KS}")


def _module(prefetch: int, tile: Tile, mode: int):
    """The CuPy RawModule of one tile, mode and prefetch depth (``flat_igemm_tile``, and
    ``flat_subsample``), compiled at its first use (a few seconds; CuPy keeps it in its
    disk cache for later processes): a layer waits for its own tile only, not for every
    tile (`tools/gpu/flat_compile_time.py`)."""
    options = module_options(tile, mode, prefetch)
    if options not in _MODULES:
        import cupy as cp

        _MODULES[options] = cp.RawModule(code=SOURCE_PATH.read_text(), options=options)
    return _MODULES[options]


def plan_args(p, tile: Tile) -> dict:
    """Grid, block, parts and the int32 scalars of one launch (no GPU needed)."""
    L = p.C * p.R * p.S
    npq = p.N * p.P * p.Q
    if max(p.N * p.C * p.H * p.W, p.N * p.K * p.P * p.Q, p.K * L) >= 2**31:
        raise Unsupported("flat_igemm_cuda uses 32-bit indices: tensors must have fewer "
                          "than 2**31 elements")
    if Tile(tile.BM, tile.BN, 1, tile.KS) not in KERNELS or tile.SPLIT < 1:
        raise ValueError(f"flat_igemm_cuda: no kernel for tile {tile}")
    slabs = ceil_div(L, BK)
    per = ceil_div(slabs, tile.SPLIT)
    parts = ceil_div(slabs, per)  # no empty part
    grid = (ceil_div(npq, tile.BN), ceil_div(p.K, tile.BM), parts)
    if grid[1] > 65535 or parts > 65535:
        raise Unsupported(f"flat_igemm_cuda: K={p.K} needs {grid[1]} block rows; CUDA "
                          "allows 65535")
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
    mode = mode_of(p)
    return dict(grid=grid, block=(tile.threads,), parts=parts, mode=mode, tiles=grid[0] * grid[1],
                slabs_per_part=per,
                n_out=p.N * p.K * p.P * p.Q,
                a_vec=L % 4 == 0, b_vec=mode == 0 and p.stride == (1, 1) and p.P * p.Q % 4 == 0,
                y_vec=p.P * p.Q % 4 == 0,
                ints=(p.N, p.C, p.H, p.W, p.K, p.R, p.S, p.P, p.Q, sh, sw, ph, pw, dh, dw, per))


def flags_for(a, x, w, out, ws=None) -> int:
    """The kernel's float4 flags for this call: the shapes allow it (plan_args) and the
    buffers are 16-byte aligned (a view into an array need not be)."""
    def aligned(*arrs):
        return all(_ptr(v) % 16 == 0 for v in arrs if v is not None)

    return ((1 if a["a_vec"] and aligned(w) else 0) | (2 if a["b_vec"] and aligned(x) else 0)
            | (4 if a["y_vec"] and aligned(out, ws) else 0))


SUBSAMPLE_MIN = 2**17  # elements of the subsampled input from which it is made first


def subsample_first(p) -> bool:
    """A strided 1x1 layer whose subsampled input x[:, :, ::sh, ::sw] has SUBSAMPLE_MIN
    elements or more, and rows the stride-1 GEMM reads as float4s (P*Q % 4 == 0): copy
    it out densely first (one more launch), then run the GEMM at stride 1. On the H200 at
    batch 1 that paid on 256->512 56x56/2 (200704 elements; 74 -> 81% of cuDNN) and lost
    on 512->1024 28x28/2 (100352; 78 -> 76%): `tools/gpu/flat_ks.py` with SUBSAMPLE=0,1."""
    return (mode_of(p) == 0 and p.stride != (1, 1) and p.P * p.Q % 4 == 0
            and p.N * p.C * p.P * p.Q >= SUBSAMPLE_MIN)


def dense_params(p):
    """The stride-1 1x1 layer on the subsampled input: same N, C, K, P, Q."""
    return replace(p, H=p.P, W=p.Q, stride=(1, 1))


SUBSAMPLE_THREADS = 256


def subsample_args(p) -> dict:
    """Grid, block and int32 scalars of flat_subsample for ConvParams p (one thread per
    element of the (N, C, P, Q) copy)."""
    n = p.N * p.C * p.P * p.Q
    return dict(grid=(ceil_div(n, SUBSAMPLE_THREADS),), block=(SUBSAMPLE_THREADS,),
                shape=(p.N, p.C, p.P, p.Q),
                ints=(p.N * p.C, p.H, p.W, p.P, p.Q, *p.stride))


_PLANS: dict = {}


def _plan(x, w, out, stride, padding, dilation, groups, tile, prefetch, subsample):
    try:
        key = (x.shape, w.shape, out.shape, stride, padding, dilation, groups, tile, prefetch,
               subsample)
        plan = _PLANS.get(key)
    except TypeError:
        key, plan = None, None
    if plan is not None and x.dtype == w.dtype == out.dtype == np.float32:
        return plan
    p = conv_launch_params("conv2d_flat_igemm_cuda", x, w, out, stride, padding, dilation,
                           groups)
    import cupy as cp

    if subsample is None:
        subsample = subsample_first(p)
    elif subsample and (mode_of(p) != 0 or p.stride == (1, 1)):
        raise ValueError("flat_igemm_cuda: only a strided 1x1 layer can be subsampled")
    sub = subsample_args(p) if subsample else None
    if sub is not None:
        p = dense_params(p)
    t = tile or choose(p)
    a = plan_args(p, t)
    prefetch = prefetch or prefetch_for(t, a["slabs_per_part"])
    module = _module(prefetch, t, a["mode"])
    if sub is not None:
        sub.update(fn=module.get_function("flat_subsample"),
                   ints=tuple(np.int32(v) for v in sub["ints"]),
                   xs=cp.empty(sub["shape"], cp.float32))
    plan = dict(a, tile=t, prefetch=prefetch, subsample=sub,
                fn=module.get_function("flat_igemm_tile"),
                ints=tuple(np.int32(v) for v in a["ints"]),
                ws=cp.empty(a["parts"] * a["n_out"], cp.float32) if a["parts"] > 1 else None,
                counters=cp.zeros(a["tiles"], cp.int32) if a["parts"] > 1 else None)
    if key is not None:
        if len(_PLANS) >= 256:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def make_launcher(tile: Tile | None = None, name: str = "conv2d_flat_igemm_cuda",
                  prefetch: int | None = None, subsample: bool | None = None):
    """A conv launcher (common signature): the tile `choose` picks per shape, or `tile`
    (its BM, BN, SPLIT and KS all forced, e.g. ``Tile(32, 32, 5, 4)``); `prefetch` slabs'
    loads in flight (default `prefetch_for` the part; the results do not depend on it, only
    the time); `subsample` the input first or not (default `subsample_first`)."""

    @launcher
    def conv2d(x, w, out, stride=1, padding=0, dilation=1, groups=1):
        plan = _plan(x, w, out, stride, padding, dilation, groups, tile, prefetch, subsample)
        ws, cnt = plan["ws"], plan["counters"]
        u64 = np.uint64
        null = u64(0)
        sub = plan["subsample"]
        if sub is not None:   # x[:, :, ::sh, ::sw] copied out; the GEMM runs at stride 1
            sub["fn"](sub["grid"], sub["block"], (u64(_ptr(x)), u64(_ptr(sub["xs"])),
                                                  *sub["ints"]))
            x = sub["xs"]
        plan["fn"](plan["grid"], plan["block"],
                   (u64(_ptr(x)), u64(_ptr(w)), u64(_ptr(out)),
                    ws if ws is not None else null, cnt if cnt is not None else null,
                    *plan["ints"], np.int32(flags_for(plan, x, w, out, ws))))
        return out

    conv2d.__name__ = name
    conv2d.tile = tile
    return conv2d


conv2d_flat_igemm_cuda = make_launcher()
conv2d_flat_igemm_cuda.__doc__ = (
    "x (N, C, H, W), w (K, C, R, S), out (N, K, P, Q) fp32 device arrays; any stride, "
    "padding, dilation; groups 1. One launch; the tile and split `choose` picks.")


def name_expressions() -> list:
    """The template instantiation of every compiled kernel: each tile, KS and mode."""
    return [t.name_expression(m) for t in KERNELS for m in MODES]


def compile_ptx(arch: str = "compute_90") -> str:
    """PTX of every tile, KS and mode, compiled by NVRTC (no GPU needed)."""
    from ._nvrtc import nvrtc_ptx

    return nvrtc_ptx(SOURCE_PATH.read_text(), "flat_igemm.cu", name_expressions(), arch)


def compile_tile_ptx(tile: Tile, mode: int, prefetch: int = PREFETCH,
                     arch: str = "compute_90") -> str:
    """PTX of the one-kernel module `_module` loads for tile, mode and prefetch (NVRTC, no
    GPU needed)."""
    from ._nvrtc import nvrtc_ptx

    options = [o for o in module_options(tile, mode, prefetch) if not o.startswith("-std")]
    return nvrtc_ptx(SOURCE_PATH.read_text(), "flat_igemm.cu", (), arch, options)
