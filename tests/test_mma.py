"""The mma.sync kernel (convlab/kernels/csrc/mma_sync.cu) checked without a GPU.

- Its CUDA C runs on the CPU through tools/mma_emulate.py (ldmatrix.x4, mma.sync.m16n8k16
  and cp.async modelled as the PTX ISA defines them, every CUDA thread a fiber) on tiny
  odd shapes, GEMM and conv, directly and through the launchers, compared with float64
  NumPy; shared-memory addresses are checked for bounds, alignment and ldmatrix bank
  conflicts, cp.async writes against ldmatrix reads for races (no barrier between them),
  operand reads for bounds, the output for writes past its end. The scheduling switches
  (fragment double buffering, per-thread pointers, serpentine order) run alone and
  together at BK 32 / 64 and 3 / 4 stages, on a long K too (every slot reused); the
  epilogue staged through shared memory, fp32 and fp16, with and without 16-byte rows.
- Planted bugs in its index logic (fragment order, swizzle, conv gather, masks, waits,
  barriers, slot reuse, fragment sets, pointers, rasterization) make those checks fail.
- Every ladder step (sm_80 and sm_90) and every candidate (sm_90) compiles with NVRTC to
  PTX holding the instructions the lesson names.
"""

from __future__ import annotations

import importlib.util
import itertools
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from convlab.kernels import mma02_gemm_conv_cuda as M2

from ._nvrtc import nvrtc_available

ROOT = Path(__file__).resolve().parents[1]
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ (C++20) not installed")
needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="cuda-python's NVRTC missing")


def _emulator_module():
    spec = importlib.util.spec_from_file_location("mma_emulate", ROOT / "tools" / "mma_emulate.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mma_emulate"] = mod
    spec.loader.exec_module(mod)
    return mod


E = _emulator_module()
Spec = E.Spec
Cfg = M2.MmaConfig

# tiny tiles with the same switches as the ladder: 4 warps of 16 x 16 (or 2 of 32 x 32)
REGS_PAD = Cfg(32, 32, 32, 16, 16, STAGES=2, ASYNC=0, SWIZZLE=0)
ASYNC_PAD = Cfg(32, 32, 32, 16, 16, STAGES=3, ASYNC=1, SWIZZLE=0)
SWZ4 = Cfg(32, 32, 32, 16, 16, STAGES=4, ASYNC=1, SWIZZLE=1)        # 4-chunk rows: line XOR
SWZ8 = Cfg(32, 32, 64, 16, 16, STAGES=3, ASYNC=1, SWIZZLE=1, GROUP_M=2)  # 8-chunk rows
WIDE = Cfg(32, 64, 32, 32, 32, STAGES=3, ASYNC=1, SWIZZLE=1)        # MI = 2, NI = 4
# the scheduling switches, alone and together, at BK 32 / 64 and 3 / 4 stages
FP32 = Cfg(32, 32, 32, 16, 16, STAGES=3, FRAG_PIPE=1)
FP64 = Cfg(32, 32, 64, 16, 16, STAGES=4, FRAG_PIPE=1, GROUP_M=2)
FP_PAD = Cfg(32, 32, 32, 16, 16, STAGES=4, SWIZZLE=0, FRAG_PIPE=1)
GP32 = Cfg(32, 32, 32, 16, 16, STAGES=4, GPTR=1)
GP64 = Cfg(32, 32, 64, 16, 16, STAGES=3, GPTR=1)                    # 2 chunks per operand
BOTH32 = Cfg(32, 64, 32, 32, 32, STAGES=4, FRAG_PIPE=1, GPTR=1)     # 2 A, 4 B chunks
BOTH64 = Cfg(32, 32, 64, 16, 16, STAGES=3, FRAG_PIPE=1, GPTR=1)
SERP = Cfg(32, 64, 64, 32, 32, STAGES=4, FRAG_PIPE=1, GPTR=1, SERPENTINE=1)
FP128 = Cfg(32, 32, 128, 16, 16, STAGES=3, FRAG_PIPE=1)   # the XOR reaches the second line
SCHED = (FP32, FP64, FP_PAD, GP32, GP64, BOTH32, BOTH64, SERP, FP128)
# the staged epilogue after the plain pipeline, the register double buffer and both switches
EPI = Cfg(32, 32, 32, 16, 16, STAGES=3, EPI_SMEM=1)
EPI_REGS = Cfg(32, 32, 32, 16, 16, STAGES=2, ASYNC=0, SWIZZLE=0, EPI_SMEM=1)
EPI_FP = Cfg(32, 64, 64, 32, 32, STAGES=4, FRAG_PIPE=1, GPTR=1, EPI_SMEM=1)
EPIS = (EPI, EPI_REGS, EPI_FP)
# sliced K: two (or four) warps per warp tile, their sums added through shared memory; on
# the register double buffer, the plain pipeline, the fragment pipeline with per-thread
# pointers and the staged epilogue
KS_REGS = Cfg(32, 32, 32, 16, 16, STAGES=2, ASYNC=0, SWIZZLE=0, KSLICE=2)
KS_PLAIN = Cfg(32, 32, 32, 16, 16, STAGES=3, KSLICE=2)
KS4 = Cfg(32, 32, 64, 16, 16, STAGES=3, KSLICE=4)
KS_FP = Cfg(32, 64, 64, 16, 32, STAGES=4, FRAG_PIPE=1, GPTR=1, EPI_SMEM=1, KSLICE=2)
KS128 = Cfg(32, 64, 128, 16, 32, STAGES=3, FRAG_PIPE=1, GPTR=1, EPI_SMEM=1, KSLICE=2)
KSLICES = (KS_REGS, KS_PLAIN, KS4, KS_FP, KS128)
# stream-K (the GEMM's last wave shared by slabs): direct and staged stores; the top tile
SK32 = Cfg(32, 32, 32, 16, 16, STAGES=3, FRAG_PIPE=1, GPTR=1, STREAMK=1)
SK64 = Cfg(32, 64, 64, 32, 32, STAGES=4, FRAG_PIPE=1, GPTR=1, EPI_SMEM=1, STREAMK=1)
SK_TOP = replace(M2.GEMM_TOP, EPI_SMEM=1, STREAMK=1)
STREAMKS = (SK32, SK64, SK_TOP)
# the conv's one-tap-per-slab loader: 4- and 8-chunk rows, with the fragment pipeline and
# the staged epilogue
TAPS32 = Cfg(32, 32, 32, 16, 16, STAGES=3, TAPS=1)
TAPS64 = Cfg(32, 32, 64, 16, 16, STAGES=4, FRAG_PIPE=1, GROUP_M=2, TAPS=1)
TAPS_EPI = Cfg(32, 64, 64, 32, 32, STAGES=3, EPI_SMEM=1, TAPS=1)
TAPS48 = Cfg(48, 32, 32, 48, 16, STAGES=3, FRAG_PIPE=1, EPI_SMEM=1, TAPS=1)  # MI = 3
TAPS_KS = Cfg(48, 32, 64, 48, 16, STAGES=3, FRAG_PIPE=1, EPI_SMEM=1, TAPS=1, KSLICE=2)
TAPS128 = Cfg(48, 32, 128, 48, 16, STAGES=3, FRAG_PIPE=1, EPI_SMEM=1, TAPS=1, KSLICE=2)

GEMM_SHAPE = (70, 36, 168)   # M, N, K: partial tiles in M and N, a K tail of 8
LONG_SHAPE = (37, 50, 424)   # 7 slabs of 64 (a tail of 40), 14 of 32: every slot reused
VEC_SHAPE = (33, 40, 64)     # rows of 16-byte multiples in fp16 as well as fp32
# (shape, SMs) for stream-K: a tail of 1, 2, 3 tiles; every tile shared (fewer tiles than
# SMs); shares of two segments (LONG_SHAPE on 6: the tail of one tile, the head of the
# next); whole waves (no sharing)
SK_CASES = [(GEMM_SHAPE, 4), (GEMM_SHAPE, 5), (LONG_SHAPE, 3), (LONG_SHAPE, 6),
            (LONG_SHAPE, 8), (LONG_SHAPE, 4), (GEMM_SHAPE, 132)]
SK_TOP_CASES = [((300, 520, 200), 4), ((300, 520, 200), 5)]   # 9 tiles of 128 x 256
CONV_CASES = [  # x (N, C, H, W), w (K, C, R, S), stride, padding, dilation
    ((2, 16, 5, 5), (12, 16, 3, 3), 2, 1, 1),
    ((2, 16, 5, 5), (12, 16, 3, 3), 1, 2, 2),
    ((1, 8, 7, 6), (10, 8, 3, 2), (1, 2), (1, 0), (2, 1)),
    # C a multiple of 32 and 64 (TAPS), several filter tiles, every tap of a row masked
    # somewhere, 18 / 9 slabs of 32 / 64
    ((2, 64, 5, 5), (36, 64, 3, 3), 1, 2, 2),
    ((1, 64, 6, 7), (40, 64, 3, 2), (1, 2), (1, 0), (2, 1)),
    ((2, 32, 5, 5), (12, 32, 3, 3), 2, 1, 1),
    # C = 128 for the slabs of 128 (one tap each): 9 slabs, two filter tiles
    ((1, 128, 4, 5), (36, 128, 3, 3), 1, 1, 1),
]


def _runs(spec, case) -> bool:
    """TAPS kernels only see the layers their launcher gives them (C % BK == 0); the
    C = 128 case runs for the slabs of 128 only (the others' paths are reached already)."""
    C = case[0][1]
    if C == 128:
        return spec.cfg.BK == 128
    return not spec.cfg.TAPS or C % spec.cfg.BK == 0


def _unique(cfgs):
    return list(dict.fromkeys(c.validate() for c in cfgs))


GEMM_SPECS = ([Spec(c) for c in _unique(M2.LADDER.values())]
              + [Spec(c) for c in (REGS_PAD, ASYNC_PAD, SWZ4, SWZ8, WIDE)]
              + [Spec(SWZ8, out_f16=True), Spec(SWZ4, bf16=True)]
              + [Spec(c) for c in SCHED] + [Spec(BOTH32, bf16=True)]
              + [Spec(c, out_f16=f16) for c in EPIS for f16 in (False, True)]
              + [Spec(c) for c in KSLICES] + [Spec(KS_FP, out_f16=True)]
              + [Spec(c) for c in STREAMKS] + [Spec(SK64, out_f16=True)])
CONV_SPECS = ([Spec(c, conv=True) for c in (REGS_PAD, SWZ4, SWZ8, BOTH64)]  # GPTR: no-op
              + [Spec(c, conv=True) for c in _unique(M2.CONV_CANDIDATES[:2])]  # the launcher's
              + [Spec(c, conv=True) for c in M2.CONV_ONE_WAVE.values()]
              + [Spec(M2.CONV_TILES[192, 128], conv=True)]   # 8 warps, slabs of 64
              + [Spec(c, conv=True) for c in (TAPS32, TAPS64, TAPS_EPI, TAPS48, TAPS_KS,
                                              TAPS128)]
              + [Spec(replace(TAPS32, TAPS=0), conv=True)]   # TAPS32 where C % BK != 0
              + [Spec(c, conv=True, out_f16=True) for c in (TAPS64, TAPS_EPI, TAPS48,
                                                            TAPS_KS, TAPS128)])


REAL = GEMM_SPECS + CONV_SPECS


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    """One library: the REAL specs from the kernel's source, then one per planted bug."""
    if shutil.which("g++") is None:
        pytest.skip("g++ (C++20) not installed")
    src = M2.source()
    planted = [(spec, src.replace(old, new)) for old, new, spec, _ in MUTANTS.values()]
    return E.Emulator(REAL + [p[0] for p in planted], workdir=tmp_path_factory.mktemp("mma"),
                      sources=[src] * len(REAL) + [p[1] for p in planted])


def _verdict(em, err, spec) -> str:
    """'' when the run was right: error within tolerance, no fault, no bank conflict."""
    bad = []
    if not err < E.tolerance(spec):
        bad.append(f"max rel err {err:.1e}")
    if em.errors:
        bad.append(f"{em.errors} faults")
    if em.conflicts:
        bad.append(f"{em.conflicts} ldmatrix bank conflicts")
    return ", ".join(bad)


@needs_gxx
def test_gemm_emulated_matches_float64(emu):
    """Every ladder step at its own tiles and the tiny variants (padded / 4-chunk / 8-chunk
    swizzle, register staging, fp16 output, bf16 inputs), copies landing early or late."""
    rng = np.random.default_rng(11)
    bad = []
    for i, s in enumerate(REAL):
        if s.conv or s.cfg in STREAMKS:
            continue
        shapes = ((GEMM_SHAPE, LONG_SHAPE) if s.cfg in SCHED + KSLICES else
                  (GEMM_SHAPE, LONG_SHAPE, VEC_SHAPE) if s.cfg in EPIS else (GEMM_SHAPE,))
        for shape, late in itertools.product(shapes, (0, 1, 3)):   # early, late, reversed
            err = E.gemm_case(emu, i, *shape, rng, late)
            if v := _verdict(emu, err, s):
                bad.append(f"{s.cfg} {shape} f16out={s.out_f16} bf16={s.bf16} late={late}: {v}")
    assert not bad, "\n".join(bad)


@needs_gxx
def test_stream_k_emulated_matches_float64(emu):
    """Stream-K: tails of 1-3 tiles, every tile shared, shares of two segments, whole
    waves; sums NaN-poisoned and guarded in the workspace, its flags zero again after the
    run; a wait for a block that has not run yet is a fault."""
    rng = np.random.default_rng(15)
    bad = []
    for i, s in enumerate(REAL):
        if s.cfg not in STREAMKS:
            continue
        cases = SK_TOP_CASES if s.cfg == SK_TOP else SK_CASES
        for (shape, sms), late in itertools.product(cases, (0, 1, 3)):
            err = E.gemm_case(emu, i, *shape, rng, late, sms)
            if v := _verdict(emu, err, s):
                bad.append(f"{s.cfg} {shape} on {sms} SMs f16out={s.out_f16} late={late}: {v}")
    assert not bad, "\n".join(bad)


def test_stream_k_shares_cover_the_tail_once():
    """stream_k_split and the kernel's shares (its sk_begin, in Python): the tail's slabs
    each in one share, shares shorter than a tile (at most two segments), blocks no more
    than SMs; the H200's 4096^3 at 128 x 256: 512 tiles, 3 whole waves, 116 shared by 132."""
    top = SK_TOP
    assert M2.stream_k_split(top, 4096, 4096, 4096, 132) == (116, 132)
    assert M2.stream_k_split(M2.GEMM_TOP, 4096, 4096, 4096, 132) == (0, 0)   # no STREAMK
    assert M2.stream_k_split(top, 4096, 4096, 4096, 128) == (0, 0)           # whole waves
    assert M2.stream_k_split(top, 128 * 131, 256, 64, 132) == (0, 0)         # 99% full
    assert M2.grid_of(top, 4096, 4096, 116, 132) == (512 - 116 + 132, 1)
    for M, N, K, sms in itertools.product((1, 300, 4096), (256, 1000), (8, 520, 4096),
                                          (1, 7, 132)):
        tiles, kt = -(-M // top.BM) * -(-N // top.BN), -(-K // top.BK)
        sk_tiles, sk_blocks = M2.stream_k_split(top, M, N, K, sms)
        if not sk_tiles:
            continue
        assert sk_tiles == tiles % sms and 1 <= sk_blocks <= sms
        begin = [s * sk_tiles * kt // sk_blocks for s in range(sk_blocks + 1)]
        sizes = np.diff(begin)
        assert begin[-1] == sk_tiles * kt and sizes.min() >= 1 and sizes.max() <= kt
        # room for the flags and one fp32 BM x BN partial tile per sharing block, each
        # further block one tile more
        assert M2.work_floats(top, sk_blocks) >= M2.SK_FLAGS + sk_blocks * top.BM * top.BN
        assert (M2.work_floats(top, sk_blocks + 1) - M2.work_floats(top, sk_blocks)
                == top.BM * top.BN)
    assert M2.work_floats(top, 0) == 0  # no stream-K, no workspace
    assert f"#define SK_FLAGS {M2.SK_FLAGS}" in M2.source()


@needs_gxx
def test_conv_emulated_matches_float64(emu):
    """The implicit-GEMM gather (padding, stride, dilation, the K tail, partial tiles) on
    odd sizes, against float64 NCHW convolution."""
    rng = np.random.default_rng(12)
    bad = []
    for i, s in enumerate(REAL):
        if not s.conv:
            continue
        for case, late in itertools.product(filter(lambda c: _runs(s, c), CONV_CASES), (1, 3)):
            err = E.conv_case(emu, i, *case, rng, late)
            if v := _verdict(emu, err, s):
                bad.append(f"{s.cfg} {case} late={late}: {v}")
    assert not bad, "\n".join(bad)


def _guarded(shape, N):
    """A NaN output array followed by NaN words enough for a whole unmasked block tile."""
    n = int(np.prod(shape))
    buf = np.full(n + SWZ4.BM * N + SWZ4.BN, np.nan, np.float32)
    return buf, buf[:n].reshape(shape)


@needs_gxx
def test_launchers_drive_the_emulated_kernel(emu, monkeypatch):
    """gemm_mma_raw and conv2d_mma_nhwc end to end (their grid, shared memory, argument
    order and conv geometry) with the kernel emulated and host arrays as device arrays."""
    assert M2._SCALARS == E.kernel_scalars(M2.source())
    operands, asked = [], []

    def kernel(cfg, conv, out_f16, bf16):
        asked.append(cfg)
        i = emu.specs.index(Spec(cfg, conv=conv, out_f16=out_f16, bf16=bf16))
        return lambda grid, block, args, shared_mem: emu.launch(i, grid, block, args,
                                                                shared_mem, operands)

    monkeypatch.setattr(M2, "_kernel", kernel)
    for name in dir(M2):   # the GPU checks (require_sm80, ...)
        if name.startswith("require_"):
            monkeypatch.setattr(M2, name, lambda: 90)
    monkeypatch.setattr(M2, "_ptr", lambda a: a.ctypes.data)
    rng = np.random.default_rng(14)
    M, N, K = GEMM_SHAPE
    a, bt, exp, absref = E.fp16_operands(M, N, K, rng)
    buf, out = _guarded((M, N), N)
    operands[:] = [a, bt]
    M2.gemm_mma_raw(a, bt, out, cfg=SWZ4)
    assert emu.errors == 0 and np.isnan(buf[out.size:]).all()
    assert E.rel_err(out, exp, absref) < 1e-5

    from convlab import reference as ref

    x = rng.standard_normal((2, 7, 6, 16)).astype(np.float16)
    w = rng.standard_normal((10, 3, 2, 16)).astype(np.float16)
    buf, y = _guarded((2, 4, 4, 10), 10)
    operands[:] = [x, w]
    M2.conv2d_mma_nhwc(x, w, y, stride=(2, 1), padding=(1, 0), dilation=(1, 2), cfg=SWZ4)
    X, W = (v.astype(np.float64).transpose(0, 3, 1, 2) for v in (x, w))
    kw = dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2))
    exp, absr = ref.conv2d(X, W, **kw), ref.conv2d(np.abs(X), np.abs(W), **kw)
    assert emu.errors == 0 and np.isnan(buf[y.size:]).all()
    assert E.rel_err(y.transpose(0, 3, 1, 2), exp, absr) < 1e-5

    # TAPS where C % BK == 0, and dropped where a slab would straddle two taps
    for C, taps in ((32, 1), (16, 0)):
        x = rng.standard_normal((2, 5, 6, C)).astype(np.float16)
        w = rng.standard_normal((12, 3, 3, C)).astype(np.float16)
        buf, y = _guarded((2, 5, 6, 12), 12)
        operands[:] = [x, w]
        M2.conv2d_mma_nhwc(x, w, y, padding=1, cfg=TAPS32)
        assert asked[-1] == replace(TAPS32, TAPS=taps)
        X, W = (v.astype(np.float64).transpose(0, 3, 1, 2) for v in (x, w))
        exp, absr = ref.conv2d(X, W, padding=1), ref.conv2d(np.abs(X), np.abs(W), padding=1)
        assert emu.errors == 0 and np.isnan(buf[y.size:]).all()
        assert E.rel_err(y.transpose(0, 3, 1, 2), exp, absr) < 1e-5


@needs_gxx
def test_swizzle_maps_each_stage_one_to_one(emu):
    """smem_off: every (row, 16-byte chunk) of a stage gets its own 16-byte slot inside it."""
    for i, s in enumerate(REAL):
        c = s.cfg
        rows, kch = max(c.BM, c.BN), c.BK // 8
        lds = c.BK + (0 if c.SWIZZLE else 8)
        offs = [emu.smem_off(i, r, k) for r in range(rows) for k in range(kch)]
        assert all(o % 8 == 0 and 0 <= o <= rows * lds - 8 for o in offs), c
        assert len(set(offs)) == len(offs), c


def test_rasterization_covers_every_tile_once():
    f = E.rasterization(M2.source())
    for gx, gy, g in itertools.product((1, 2, 5, 9), (1, 2, 3, 7, 8, 21), (1, 2, 3, 8, 16)):
        tiles = E.tiles_covered(f, gx, gy, g)
        assert sorted(tiles) == [(m, n) for m in range(gy) for n in range(gx)], (gx, gy, g)
    # grouped: the first GROUP_M block rows come first, column by column
    assert E.tiles_covered(f, 3, 5, 2)[:4] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    bad = E.rasterization(M2.source().replace("min(nbm - first_m, GROUP_M)", "GROUP_M"))
    assert sorted(E.tiles_covered(bad, 3, 5, 2)) != [(m, n) for m in range(5) for n in range(3)]



def test_choose_conv_fills_the_waves():
    """The conv tile: 64 filters wide up to K = 64, else 128; the tallest block whose
    blocks fill the SMs' waves within 2% of the best (ResNet's 256-filter 14 x 14 layer at
    batch 32: 96 rows, 132 blocks on 132 SMs, where 128 rows leave a quarter idle); at
    most one block per SM, the tile's 8-warp form."""
    assert M2.wave_fill(132, 132) == 1.0 and M2.wave_fill(98, 132) == 98 / 132
    assert M2.wave_fill(133, 132) == 133 / 264
    cases = [(64, 32 * 56 * 56, 132), (128, 32 * 28 * 28, 132), (256, 32 * 14 * 14, 132),
             (512, 32 * 7 * 7, 132), (93, 7 * 33 * 41, 132), (256, 6272, 108), (64, 3136, 80)]
    picked = {}
    for K, M, sms in cases:
        cfg = M2.choose_conv(K, M, sms)
        assert cfg.BN == (64 if K <= 64 else 128) and cfg.TAPS and cfg.EPI_SMEM, cfg
        blocks = -(-M // cfg.BM) * -(-K // cfg.BN)
        tile = M2.CONV_TILES[cfg.BM, cfg.BN]
        assert cfg == (M2.CONV_ONE_WAVE.get((cfg.BM, cfg.BN), tile) if blocks <= sms else tile)
        fills = {bm: M2.wave_fill(-(-M // bm) * -(-K // bn), sms)
                 for (bm, bn) in M2.CONV_TILES if bn == cfg.BN}
        assert fills[cfg.BM] >= max(fills.values()) - 0.02, (K, M, sms, cfg)
        assert all(bm <= cfg.BM or f < max(fills.values()) - 0.02 for bm, f in fills.items())
        picked[K, M, sms] = cfg.BM
    assert picked[256, 6272, 132] == 96 and picked[64, 32 * 56 * 56, 132] == 192
    assert picked[128, 32 * 28 * 28, 132] == 192   # 131 blocks of 192 x 128: one wave
    assert M2.choose_conv(256, 6272, 132).threads == 256    # one wave: 8 warps
    assert M2.choose_conv(128, 32 * 28 * 28, 132).threads == 256    # 4 x 2 warp tiles

# one-line bugs in the index logic: (text, replacement, spec, conv case or None for GEMM)
CONV4, F16OUT = Spec(SWZ4, conv=True), Spec(SWZ8, out_f16=True)
TAPS4, TAPS8 = Spec(TAPS32, conv=True), Spec(TAPS64, conv=True)
MUTANTS = {
    "b0 and b1 swapped": ("bf[j / 2][(j & 1) * 2], bf[j / 2][(j & 1) * 2 + 1]",
                          "bf[j / 2][(j & 1) * 2 + 1], bf[j / 2][(j & 1) * 2]", Spec(SWZ4), None),
    "A ldmatrix k-half from lane bit 3": ("kk * 2 + (lane >> 4))",
                                          "kk * 2 + ((lane >> 3) & 1))", Spec(SWZ4), None),
    "B ldmatrix matrices 2, 3 not 8 rows on": (" + ((lane >> 4) << 3)", "", Spec(WIDE), None),
    "swizzle XOR with r / 2": ("((c ^ r) & 7)", "((c ^ (r >> 1)) & 7)", Spec(SWZ8), None),
    "fragment XOR kept inside the first line": ("(unsigned)(kk * 32)", "(unsigned)((kk & 3) * 32)",
                                               Spec(FP128), None),
    "line swizzle without XOR": ("((idx ^ line) & 7)", "(idx & 7)", Spec(SWZ4), None),
    "rows not padded": ("#define LDS (BK + 8)", "#define LDS BK", Spec(ASYNC_PAD), None),
    "conv padding check dropped": ("kd < pb.Kd && h >= 0 && ", "kd < pb.Kd && ", CONV4, 0),
    "conv dilation ignored": ("    int h = cr.h0 + r * pb.dh", "    int h = cr.h0 + r", CONV4, 1),
    "conv stride ignored": ("p * pb.sh", "p", CONV4, 0),
    "taps: tap offset without dilation": ("(tap_r * pb.dh * pb.W + tap_s * pb.dw) * pb.C",
                                          "(tap_r * pb.W + tap_s) * pb.C", TAPS4, 3),
    "taps: the image's bottom edge not masked": ("if (h >= 0 && h < pb.H) t |=",
                                                 "if (h >= 0) t |=", TAPS8, 3),
    "taps: the image's right edge not masked": ("(w >= 0 && w < pb.W) << s", "(w >= 0) << s",
                                                TAPS8, 3),
    "taps: s not reset at the row's end": ("tap_s = 0;\n                ++tap_r;", "++tap_r;",
                                           TAPS8, 4),
    "taps: tap index not advanced": ("++tap;\n", "\n", TAPS4, 5),
    "taps: rows past M keep taps": ("m0 + j * RSTEP < pb.M ? t : 0u", "t", TAPS8, 4),
    "taps: the next row's p not carried": ("q -= pb.Q;\n            ++p;", "q -= pb.Q;",
                                           TAPS8, 3),
    "taps: the next row's n not carried": ("p -= pb.P;\n            ++n;", "p -= pb.P;",
                                           TAPS8, 3),
    "K tail of B not masked": ("valid = n < pb.N && kd < pb.Kd;", "valid = n < pb.N;",
                               Spec(SWZ4), None),
    "epilogue column mask dropped": ("row < pb.M && col < pb.N", "row < pb.M", Spec(SWZ4), None),
    "c0, c1 swapped in the epilogue": ("acc[i][j][2 * h], acc[i][j][2 * h + 1]",
                                       "acc[i][j][2 * h + 1], acc[i][j][2 * h]",
                                       Spec(SWZ4), None),
    "fp16 halves packed the wrong way": ('"f"(hi), "f"(lo)', '"f"(lo), "f"(hi)', F16OUT, None),
    "epilogue rows g + 8 at g": ("i * 16 + g + h * 8, j * 8", "i * 16 + g, j * 8",
                                 Spec(EPI, out_f16=True), None),
    "staged epilogue: 16-byte stores on rows that are not 16-byte multiples": (
        "vec_ok = pb.N % VEC == 0", "vec_ok = true", Spec(EPI), None),
    "staged epilogue: chunk column not scaled by VEC": (
        "col = col0 + (c % CPR) * VEC", "col = col0 + (c % CPR)", Spec(EPI_FP), None),
    "one cp.async group too few waited for": (
        "cp_async_wait<STAGES - 2>();\n        __syncthreads();   // slab kt landed",
        "cp_async_wait<STAGES - 1>();\n        __syncthreads();   // slab kt landed",
        Spec(ASYNC_PAD), None),
    "group size not clipped": ("min(nbm - first_m, GROUP_M)", "GROUP_M", Spec(SWZ8), None),
    "no barrier between the wait and the reads": ("__syncthreads();   // slab kt landed",
                                                  "/* */   // slab kt landed", Spec(ASYNC_PAD),
                                                  None),
    "register staging: no barrier before the next store": (
        "store_slab((kt + 1) & 1);\n        __syncthreads();", "store_slab((kt + 1) & 1);\n",
        Spec(REGS_PAD), None),
    "a barrier only one warp reaches": (
        "store_slab((kt + 1) & 1);\n        __syncthreads();",
        "store_slab((kt + 1) & 1);\n        if (tid < 32) __syncthreads();", Spec(REGS_PAD), None),
    "next slab's first fragments from the old slot": (
        "load_frags(af[(kk + 1) & 1], bf[(kk + 1) & 1], nx, k0)",
        "load_frags(af[(kk + 1) & 1], bf[(kk + 1) & 1], rd, k0)", Spec(FP32), None),
    "mma.sync on the fragment set being loaded": (
        "mma_step(af[kk & 1], bf[kk & 1]);", "mma_step(af[(kk + 1) & 1], bf[(kk + 1) & 1]);",
        Spec(FP64), None),
    "no barrier at the slab boundary": ("__syncthreads();   // slab kt + 1 landed",
                                        "/* */   // slab kt + 1 landed", Spec(BOTH32), None),
    "slab boundary waits for one group too few": (
        "cp_async_wait<STAGES - 2>();\n                __syncthreads();   // slab kt + 1",
        "cp_async_wait<STAGES - 1>();\n                __syncthreads();   // slab kt + 1",
        Spec(FP64), None),
    "copies into the slot of slab kt - 1 before the barrier": (
        "cp_async_wait<STAGES - 2>();\n        __syncthreads();   // slab kt landed for everyone;"
        " slot (kt-1) % STAGES is free\n        int next = kt + STAGES - 1;\n"
        "        if (next < KT) load_slab(next % STAGES, next);\n",
        "int next = kt + STAGES - 1;\n        if (next < KT) load_slab(next % STAGES, next);\n"
        "        cp_async_wait<STAGES - 2>();\n        __syncthreads();\n", Spec(SWZ4), None),
    "fragment pipeline: slot of slab kt - 1 taken after the update": (
        "wr = rd;\n                rd = nx;", "rd = nx;\n                wr = rd;", Spec(BOTH64),
        None),
    "next slab's fragments read before the boundary barrier": (
        "__syncthreads();   // slab kt + 1 landed; nobody reads slot rd any more\n"
        "                const int nx = rd + 1 == STAGES ? 0 : rd + 1;\n"
        "                if (kt + 1 < KT) load_frags(af[(kk + 1) & 1], bf[(kk + 1) & 1], nx, k0);",
        "const int nx = rd + 1 == STAGES ? 0 : rd + 1;\n"
        "                if (kt + 1 < KT) load_frags(af[(kk + 1) & 1], bf[(kk + 1) & 1], nx, k0);\n"
        "                __syncthreads();", Spec(FP32), None),
    "per-thread pointers not advanced": ("ag += BK;", "", Spec(GP64), None),
    "sliced K: every slice from step 0": ("k0 = ks * KSTEPS;", "k0 = 0;", Spec(KS_FP), None),
    "sliced K: a slice's sums not added": ("v1 += v.y;", "v1 = v.y;", Spec(KS_PLAIN), None),
    "sliced K: the last slice stores C": ("const bool stores = ks == 0;",
                                          "const bool stores = ks == KSLICE - 1;", Spec(KS4), None),
    "sliced K: sums read before they are written": (
        "make_float2(v0, v1);\n                });\n            __syncthreads();",
        "make_float2(v0, v1);\n                });\n", Spec(KS_PLAIN), None),
    "sliced K: slices' sums in one another's rows": (
        "(EPI_SMEM ? MN_WARPS : 0) + mn)", "EPI_SMEM ? MN_WARPS : 0)", Spec(KS_FP), None),
    "per-thread pointers: Kd tail not checked": (
        "const bool kin = c8 < pb.Kd - kt * BK;", "const bool kin = true;", Spec(GP32), None),
    "per-thread pointers: rows past M not clamped": ("ag + min(j, ajmax) * gstep",
                                                     "ag + j * gstep", Spec(GP64), None),
    "per-thread pointers: rows past N not clamped": ("bg + min(j, bjmax) * gstep",
                                                     "bg + j * gstep", Spec(GP64), None),
    # stream-K (the case: SMs, on LONG_SHAPE: 6, shares of two segments; 3, whole tiles
    # and one shared)
    "stream-K: one of a share's sums not added": ("acc[i][j][3] += v.w;\n", "\n", Spec(SK32), 6),
    "stream-K: the share ending at the tile's start waited for": (
        "sk_begin(p + 1) > t0", "sk_begin(p + 1) >= t0", Spec(SK32), 6),
    "stream-K: flags left raised": ("flags[p] = 0;", "", Spec(SK64), 6),
    "stream-K: a share's A from the tile's first slab": (
        "* pb.Kd + c8 + kbeg * BK;\n    const int ajmax", "* pb.Kd + c8;\n    const int ajmax",
        Spec(SK32), 6),
    "stream-K: shared tiles from tile 0": ("(int)blockIdx.x : n_dp + t;", "(int)blockIdx.x : t;",
                                           Spec(SK32), 3),
    "stream-K: a segment's role by its start": ("if (kend < KT_TILE) {", "if (kbeg > 0) {",
                                                Spec(SK64, out_f16=True), 6),
}


@needs_gxx
def test_emulator_catches_planted_bugs(emu):
    """Each one-line bug makes the emulated kernel wrong, faulting or bank-conflicted."""
    src = M2.source()
    rng = np.random.default_rng(13)
    missed = []
    for k, (name, (old, _, spec, case)) in enumerate(MUTANTS.items()):
        assert src.count(old) == 1, f"{name}: {old!r} is not in the source once"
        assert spec.conv == (case is not None) or spec.cfg in STREAMKS, name
        i = len(REAL) + k
        def run(late, i=i, spec=spec, case=case):
            if spec.cfg in STREAMKS:
                return E.gemm_case(emu, i, *LONG_SHAPE, rng, late, case)
            if case is None:
                shape = LONG_SHAPE if spec.cfg in SCHED + EPIS + KSLICES else GEMM_SHAPE
                return E.gemm_case(emu, i, *shape, rng, late)
            return E.conv_case(emu, i, *CONV_CASES[case], rng, late)
        # late copies; the threads in one order after each barrier, then in the other
        if not any(_verdict(emu, run(late), spec) for late in (1, 3)):
            missed.append(name)
    assert not missed, f"planted bugs not caught: {missed}"


def test_emulator_refuses_ptx_it_does_not_model():
    """The models stand for exact instructions: a changed one must be noticed, not run."""
    src = M2.source()
    for old, new, who in [('"r"(valid ? 16 : 0)', '"r"(16)', "cp_async16"),
                          ("m8n8.x4.shared.b16", "m8n8.x4.trans.shared.b16", "ldsm_x4"),
                          ('"r"(b0), "r"(b1)', '"r"(b1), "r"(b0)', "mma16816")]:
        assert src.count(old) == 1, old
        with pytest.raises(ValueError, match=who):
            E.emulated_source(src.replace(old, new))
    extra = src.replace("const int g = lane >> 2",
                        'asm volatile("bar.sync 0;");\n    const int g = lane >> 2')
    with pytest.raises(ValueError, match="inline assembly it does not model"):
        E.emulated_source(extra)


# ---------------------------------------------------------------------------------------
# PTX (NVRTC, no GPU)

KEY = ("ldmatrix.sync.aligned.m8n8.x4.shared.b16", "mma.sync.aligned.m16n8k16.row.col.f32")


def _check_ptx(ptx: str, cfg, bf16=False):
    assert ptx.count(".entry mma_sync_kernel") == 1, cfg
    for instr in KEY + (f".{'bf16' if bf16 else 'f16'}.{'bf16' if bf16 else 'f16'}.f32",):
        assert instr in ptx, (cfg, instr)
    if cfg.ASYNC:
        for instr in ("cp.async.cg.shared.global", "cp.async.commit_group", "cp.async.wait_group"):
            assert instr in ptx, (cfg, instr)
    else:
        assert "cp.async" not in ptx, cfg


@needs_nvrtc
def test_every_ladder_step_and_candidate_compiles_to_ptx():
    """The ladder's GEMM for sm_80 and sm_90, its conv for sm_80; every H200 candidate
    (GEMM and conv) and the bf16 default for sm_90."""
    ladder = _unique(M2.LADDER.values())
    for cfg in ladder:
        for arch in ("compute_80", "compute_90"):
            _check_ptx(M2.compile_ptx(cfg, arch), cfg)
        _check_ptx(M2.compile_ptx(cfg, "compute_80", conv=True), cfg)
    for cfg in _unique(M2.GEMM_CANDIDATES):
        if cfg not in ladder:
            _check_ptx(M2.compile_ptx(cfg, "compute_90"), cfg)
    for cfg in _unique(M2.CONV_CANDIDATES):
        _check_ptx(M2.compile_ptx(cfg, "compute_90", conv=True), cfg)
    _check_ptx(M2.compile_ptx(M2.GEMM_DEFAULT, "compute_90", bf16=True), M2.GEMM_DEFAULT, True)


@needs_nvrtc
def test_scheduling_switches_compile_to_ptx():
    """FRAG_PIPE, GPTR, SERPENTINE alone and together on the H200 tiles (sm_90), the
    combination on sm_80 and in the conv (where GPTR has no effect); the conv's TAPS."""

    tiles = (replace(M2.STEP3, STAGES=4), replace(M2.STEP3, BK=64, STAGES=3),
             replace(M2.STEP3, BN=256, STAGES=3))
    combos = (dict(FRAG_PIPE=1), dict(GPTR=1), dict(SERPENTINE=1),
              dict(FRAG_PIPE=1, GPTR=1, SERPENTINE=1))
    for tile, kw in itertools.product(tiles, combos):
        cfg = replace(tile, **kw)
        _check_ptx(M2.compile_ptx(cfg, "compute_90"), cfg)
    both = replace(tiles[0], FRAG_PIPE=1, GPTR=1)
    _check_ptx(M2.compile_ptx(both, "compute_80"), both)
    _check_ptx(M2.compile_ptx(both, "compute_90", conv=True), both)
    with pytest.raises(ValueError, match="FRAG_PIPE"):
        replace(M2.STEP1, FRAG_PIPE=1).validate()
    for kw in (dict(GPTR=1), dict(TAPS=1)):
        with pytest.raises(ValueError, match="TAPS need whole chunks"):
            replace(M2.STEP3, BK=48, SWIZZLE=0, **kw).validate()
    taps = replace(tiles[1], FRAG_PIPE=1, TAPS=1)   # the conv's loader, sm_80 and sm_90
    for arch in ("compute_80", "compute_90"):
        _check_ptx(M2.compile_ptx(taps, arch, conv=True), taps)


def test_swizzle_and_fragment_pipeline_refuse_rows_they_cannot_map():
    """The swizzle XORs a chunk inside its 128-byte line: rows of 4 chunks or of whole
    lines only (BK = 96's chunks 8..11 would land in the next row); the fragment
    pipeline's address XOR needs BK a power of two (32, 64, 128)."""
    small = replace(M2.STEP3, BM=64, BN=64, WM=32, WN=32, STAGES=2)
    for bk in (32, 64, 128, 192, 256):
        replace(small, BK=bk).validate()
    for bk in (48, 80, 96, 112, 160):
        with pytest.raises(ValueError, match="with the swizzle"):
            replace(small, BK=bk).validate()
        replace(small, BK=bk, SWIZZLE=0).validate()   # padded rows: any BK
    for bk in (32, 64, 128):
        replace(small, BK=bk, FRAG_PIPE=1).validate()
    with pytest.raises(ValueError, match="FRAG_PIPE"):
        replace(small, BK=192, FRAG_PIPE=1).validate()


@needs_nvrtc
def test_the_kernel_refuses_what_validate_refuses():
    """mma_sync.cu's static_asserts stop the configurations MmaConfig.validate refuses,
    for a caller that skips validate (the -D switches straight to NVRTC)."""
    from convlab.kernels._nvrtc import nvrtc_ptx

    def compiles(cfg):
        try:
            nvrtc_ptx(M2.source(), "mma_sync.cu", (), "compute_90", options=cfg.defines())
            return True
        except RuntimeError as e:
            assert "static assertion" in str(e) or "static_assert" in str(e), e
            return False

    assert compiles(replace(M2.STEP3, BK=128, STAGES=2, FRAG_PIPE=1))
    assert not compiles(replace(M2.STEP3, BK=96, STAGES=2))
    assert not compiles(replace(M2.STEP3, BK=192, STAGES=2, FRAG_PIPE=1))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(300, 264, 200), (1024, 1040, 520), (2100, 4100, 136)],
                         ids=str)
def test_every_gemm_configuration_on_the_gpu(shape):
    """The compiled kernels themselves (not the emulation): the ladder, every candidate
    tile and every fp16-output configuration on odd shapes, each output poisoned with NaN,
    against float64 of the fp16 inputs; stream-K twice (its flags zero again between
    launches), on 6 / 40 tiles all shared, and on 289 of 128 x 256: whole waves, then 25
    shared on the H200's 132 SMs."""
    from convlab.runtime import is_simulator

    if is_simulator():
        pytest.skip("needs a real CUDA GPU (this run uses the simulator)")
    import cupy as cp

    M, N, K = shape
    rng = np.random.default_rng(21)
    a, bt, exp, absref = E.fp16_operands(M, N, K, rng)
    a, bt = cp.asarray(a), cp.asarray(bt)
    specs = ([Spec(c) for c in (*M2.LADDER.values(), *M2.GEMM_CANDIDATES)]
             + [Spec(c, out_f16=True) for c in M2.GEMM_FP16_OUT]
             + [Spec(SK_TOP), Spec(SK_TOP, out_f16=True)] * 2)
    bad = []
    for s in dict.fromkeys(specs) if M > 2000 else specs:   # the large shape: once each
        out = cp.full((M, N), np.nan, cp.float16 if s.out_f16 else cp.float32)
        M2.gemm_mma_raw(a, bt, out, s.cfg)
        err = E.rel_err(cp.asnumpy(out).astype(np.float64), exp, absref)
        if not err < E.tolerance(s):
            bad.append(f"{s.cfg} f16out={s.out_f16}: max rel err {err:.1e}")
    assert not bad, "\n".join(bad)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [((3, 64, 13, 11), (72, 64, 3, 3), 1, 1, 1),
                                  ((2, 128, 9, 10), (136, 128, 3, 3), 2, 1, 1)], ids=str)
def test_every_conv_configuration_on_the_gpu(case):
    """The compiled conv kernels: every candidate tile with the chunk-by-chunk gather, with
    TAPS and with TAPS + FRAG_PIPE, fp32 and fp16 output, outputs poisoned with NaN,
    against float64 of the fp16 inputs (odd pixels and filters: partial tiles)."""
    from convlab import reference as ref
    from convlab.runtime import is_simulator

    if is_simulator():
        pytest.skip("needs a real CUDA GPU (this run uses the simulator)")
    import cupy as cp

    xs, ws, stride, padding, dilation = case
    rng = np.random.default_rng(22)
    x = rng.standard_normal(xs).astype(np.float16)
    w = rng.standard_normal(ws).astype(np.float16)
    kw = dict(stride=stride, padding=padding, dilation=dilation)
    X, W = x.astype(np.float64), w.astype(np.float64)
    exp = ref.conv2d(X, W, **kw).transpose(0, 2, 3, 1)
    absref = ref.conv2d(np.abs(X), np.abs(W), **kw).transpose(0, 2, 3, 1)
    xd = cp.asarray(x.transpose(0, 2, 3, 1).copy())
    wd = cp.asarray(w.transpose(0, 2, 3, 1).copy())
    bad = []
    for base in _unique(M2.CONV_CANDIDATES):
        for cfg in (replace(base, TAPS=0, FRAG_PIPE=0), replace(base, TAPS=1),
                    replace(base, TAPS=1, FRAG_PIPE=1)):
            for f16 in (False, True):
                out = cp.full(exp.shape, np.nan, cp.float16 if f16 else cp.float32)
                M2.conv2d_mma_nhwc(xd, wd, out, cfg=cfg, **kw)
                err = E.rel_err(cp.asnumpy(out).astype(np.float64), exp, absref)
                if not err < E.tolerance(Spec(cfg, conv=True, out_f16=f16)):
                    bad.append(f"{cfg} f16out={f16}: max rel err {err:.1e}")
    assert not bad, "\n".join(bad)
