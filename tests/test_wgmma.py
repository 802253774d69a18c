"""The Hopper kernel (convlab/kernels/csrc/wgmma_tma.cu) checked without a GPU.

- Every GEMM and conv candidate compiles with NVRTC for sm_90a and holds the wgmma, TMA
  (cp.async.bulk.tensor) and mbarrier instructions the lesson names.
- The 128-byte swizzle that TMA writes and the wgmma matrix descriptor (``desc_sw128``, its
  k16 step and the consumers' row offset, all read from the source) address the same
  element for every (row, k) of every slab, for A and B.
- The epilogue stores each accumulator register where the wgmma m64nNk16 D-fragment layout
  (PTX ISA) puts it, every element of the block tile exactly once.
- The tile walk (``tile_coords``) covers every output tile exactly once.
- The kernel's CUDA C runs on the CPU (tools/mma_emulate.py: wgmma, TMA copies and
  mbarriers modelled, every thread a fiber) through the real launchers, persistent blocks
  walking several tiles, with wgmma and with the mma.sync consumers (MMA_SYNC); planted
  pipeline and gather bugs make it fail.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from convlab.kernels import wgmma03_gemm_conv_tma as W3

from ._nvrtc import nvrtc_available

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("mma_emulate", ROOT / "tools" / "mma_emulate.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mma_emulate"] = mod
    spec.loader.exec_module(mod)
    return mod


E = _tool()
SRC = W3.source()


def _without_mma_sync(src: str) -> str:
    """The source with the consumers' mma.sync branch (#if MMA_SYNC ... #else) cut out:
    the wgmma kernel the static checks below read."""
    start = src.index("#if MMA_SYNC\n        // Warp w")
    depth, pos = 0, start
    for line in src[start:].splitlines(keepends=True):
        pos += len(line)
        depth += line.startswith("#if") - line.startswith("#endif")
        if depth == 1 and line.startswith("#else"):
            return src[:start] + src[pos:]
    raise AssertionError("no #else of the mma.sync branch")


WG_SRC = _without_mma_sync(SRC)


def _one(pattern: str, text: str = WG_SRC) -> re.Match:
    hits = list(re.finditer(pattern, text))
    assert len(hits) == 1, f"expected one match of {pattern!r} in wgmma_tma.cu, got {len(hits)}"
    return hits[0]


def _int_expr(expr: str, **env) -> int:
    """A C integer constant expression (digits, names from env, + - * / % << >> & |)."""
    expr = re.sub(r"//[^\n]*", "", expr)
    expr = " ".join(re.sub(r"\bu64\(", "(", expr).replace("/", "//").split())
    assert re.fullmatch(r"[\w\s()+\-*/%<>&|]*", expr), expr
    return int(eval(expr, {"__builtins__": {}}, env))  # noqa: S307  (checked characters)


# ---------------------------------------------------------------------------------------
# The 128-byte swizzle: TMA's writes and the descriptor's reads


def sw128(off: int) -> int:
    """CU_TENSOR_MAP_SWIZZLE_128B / wgmma swizzle mode 1 on a byte address inside
    1024-byte aligned atoms: bits 4-6 (the 16-byte chunk) XOR bits 7-9 (the row mod 8)."""
    return off ^ (((off >> 7) & 7) << 4)


def tma_offset(row: int, col: int) -> int:
    """Byte offset, from the 1024-byte aligned destination, where a TMA box copy with the
    128-byte swizzle puts element (row, col) of a box whose rows are 64 halves."""
    assert 0 <= col < 64
    return sw128(row * 128 + col * 2)


def wgmma_address(desc: int, m: int, k: int) -> int:
    """Shared-memory byte address wgmma reads for element (m, k) of a K-major operand
    through matrix descriptor `desc` (PTX ISA matrix-descriptor format: start address
    bits 0-13, stride byte offset bits 32-45, both >> 4; swizzle mode bits 62-63)."""
    start = (desc & 0x3FFF) << 4
    sbo = ((desc >> 32) & 0x3FFF) << 4
    mode = desc >> 62
    if mode != 1:
        raise ValueError(f"swizzle mode {mode}, the model knows 128-byte (1) only")
    return sw128(start + (m // 8) * sbo + (m % 8) * 128 + k * 2)


def descriptor_mismatches(src: str, cfg) -> int:
    """Elements of A and B slabs that the kernel's descriptors do not find where TMA put
    them, over every stage, consumer and k16 step of one configuration."""
    body = E.function_body(src, "desc_sw128")
    ret = _one(r"return([^;]*);", body).group(1)
    step_a, step_b = (int(v) for v in _one(
        r"wgmma_tile\(d, da \+ (\d+) \* k, db \+ (\d+) \* k", src).groups())
    row_off = _int_expr(_one(r"desc_sw128\(sA \+ s \* A_BYTES \+ c \* ([^)]*)\)", src).group(1))
    bk = int(_one(r"#define BK (\d+)", src).group(1))
    a_bytes, b_bytes = cfg.BM * bk * 2, cfg.BN * bk * 2
    bad = 0
    for s in range(cfg.STAGES):
        for base, rows, first, step in [
                (s * a_bytes, 64, [c * row_off for c in range(cfg.CONSUMERS)], step_a),
                (cfg.STAGES * a_bytes + s * b_bytes, cfg.BN, [0], step_b)]:
            assert base % 1024 == 0, "a slot is not 1024-byte aligned"
            for c, off in enumerate(first):
                desc0 = _int_expr(ret, addr=base + off)
                for kk, m, k in itertools.product(range(bk // 16), range(rows), range(16)):
                    got = wgmma_address(desc0 + step * kk, m, k) - base
                    bad += got != tma_offset(c * 64 + m, 16 * kk + k)
    return bad


def test_descriptor_reads_what_tma_wrote():
    for cfg in {*W3.GEMM_CANDIDATES, *W3.CONV_CANDIDATES}:
        assert descriptor_mismatches(SRC, cfg) == 0, cfg


def test_descriptor_check_can_fail():
    cfg = W3.GEMM_DEFAULT
    for old, new in [("(u64(1024 >> 4) << 32)", "(u64(512 >> 4) << 32)"),  # stride offset
                     ("da + 2 * k", "da + 1 * k"),                           # k16 step
                     ("c * 64 * 128", "c * 64 * 64")]:                       # consumer rows
        assert SRC.count(old) == 1, old
        assert descriptor_mismatches(SRC.replace(old, new), cfg) > 0, old
    with pytest.raises(ValueError, match="swizzle mode 2"):
        descriptor_mismatches(SRC.replace("(u64(1) << 62)", "(u64(2) << 62)"), cfg)


# ---------------------------------------------------------------------------------------
# The epilogue against the D-fragment layout


def isa_d_position(warp: int, lane: int, j: int) -> tuple[int, int]:
    """(row, column) of accumulator register d[j] of a thread in wgmma m64nNk16 (f32 D)."""
    g, t = lane // 4, lane % 4
    return 16 * warp + g + 8 * ((j >> 1) & 1), 8 * (j >> 2) + 2 * t + (j & 1)


def epilogue_mismatches(src: str, BN: int, consumers: int) -> list:  # noqa: N803
    wgt = E.c_ints_to_python(_one(r"const int w = tid / 32[^;]*;", src).group(0), ("tid",),
                             ("w", "g", "tq"))
    lr_f = E.c_ints_to_python(_one(r"const int lr = [^;]*;", src).group(0), ("c", "w", "g", "h"),
                              ("lr",))
    col_f = E.c_ints_to_python(_one(r"const int col = [^;]*;", src).group(0),
                               ("bn", "i", "tq"), ("col",), (("BN", str(BN)),))
    j0, j1 = _one(r"store2\(Cout, row \* pb\.N \+ col, d\[([^\]]+)\], d\[([^\]]+)\]\)",
                  src).groups()
    regs = E.c_ints_to_python(f"const int j0 = {j0}; const int j1 = {j1};", ("i", "h"),
                              ("j0", "j1"))
    bad, seen = [], {}
    for c, tid, h, i in itertools.product(range(consumers), range(128), range(2),
                                          range(BN // 8)):
        w, g, tq = wgt(tid)
        lr, col = lr_f(c, w, g, h), col_f(0, i, tq)
        for reg, cc in zip(regs(i, h), (col, col + 1), strict=True):
            r, k = isa_d_position(tid // 32, tid % 32, reg)
            if (c * 64 + r, k) != (lr, cc):
                bad.append((c, tid, h, i, reg))
            seen[(lr, cc)] = seen.get((lr, cc), 0) + 1
    if sorted(seen) != [(r, k) for r in range(64 * consumers) for k in range(BN)] or \
            set(seen.values()) != {1}:
        bad.append("the tile is not covered exactly once")
    return bad


def test_epilogue_matches_the_fragment_layout():
    for cfg in {*W3.GEMM_CANDIDATES, *W3.CONV_CANDIDATES}:
        assert not epilogue_mismatches(WG_SRC, cfg.BN, cfg.CONSUMERS), cfg
    old = "d[4 * i + 2 * h], d[4 * i + 2 * h + 1]"
    assert WG_SRC.count(old) == 1
    assert epilogue_mismatches(WG_SRC.replace(old, "d[4 * i + h], d[4 * i + h + 2]"), 128, 2)
    old = "w * 16 + g + h * 8"
    assert WG_SRC.count(old) == 1
    assert epilogue_mismatches(WG_SRC.replace(old, "w * 16 + g * 2 + h"), 128, 2)


# ---------------------------------------------------------------------------------------
# Tiles


def tile_coords(src: str):
    return E.c_ints_to_python(E.function_body(src, "tile_coords"), ("t", "nbm", "nbn", "group_m"),
                              ("bm", "bn"), (("GROUP_M", "group_m"),))


def test_every_tile_is_visited_once():
    f = tile_coords(SRC)
    for nbm, nbn, g in itertools.product((1, 2, 3, 7, 8, 21), (1, 2, 5, 9), (1, 2, 3, 8, 16)):
        tiles = sorted(f(t, nbm, nbn, g) for t in range(nbm * nbn))
        assert tiles == [(m, n) for m in range(nbm) for n in range(nbn)], (nbm, nbn, g)
    bad = tile_coords(SRC.replace("min(nbm - first_m, GROUP_M)", "GROUP_M"))
    assert sorted(bad(t, 5, 3, 2) for t in range(15)) != [(m, n) for m in range(5)
                                                          for n in range(3)]
    # producer and consumers walk the same tiles and slabs (their ring stays in step)
    walk = "for (int t = blockIdx.x; t < ntiles; t += gridDim.x)"
    # (three walks: the producer's, and the consumers' in each branch, wgmma and mma.sync)
    assert SRC.count(walk) == 3 and SRC.count("for (int kt = 0; kt < KT; ++kt, ++it)") == 3


# ---------------------------------------------------------------------------------------
# PTX for sm_90a (NVRTC, no GPU)


@pytest.mark.skipif(not nvrtc_available(), reason="cuda-python's NVRTC missing")
def test_every_candidate_compiles_for_sm90a():
    common = ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned",
              "wgmma.wait_group.sync.aligned", "mbarrier.init.shared", "mbarrier.try_wait.parity",
              "mbarrier.arrive.expect_tx", "setmaxnreg", "cp.async.bulk.tensor.2d")
    for conv, cfgs in ((False, W3.GEMM_CANDIDATES), (True, W3.CONV_CANDIDATES)):
        for cfg in dict.fromkeys(cfgs):
            ptx = W3.compile_ptx(cfg, conv=conv)
            assert ".target sm_90a" in ptx and ptx.count(".entry wgmma_tma_kernel") == 1
            mma = f"wgmma.mma_async.sync.aligned.m64n{cfg.BN}k16.f32.bf16.bf16"
            for instr in common + (mma,) + (("cp.async.bulk.tensor.4d",) if conv else ()):
                assert instr in ptx, (cfg, conv, instr)
    ptx = W3.compile_ptx(W3.GEMM_DEFAULT, f16=True)
    assert f"wgmma.mma_async.sync.aligned.m64n{W3.GEMM_DEFAULT.BN}k16.f32.f16.f16" in ptx
    for out_half in (False, True):   # mma.sync consumers: no wgmma left
        ptx = W3.compile_ptx(W3.MMA_SYNC_TOP, f16=True, out_half=out_half)
        for instr in common[3:] + ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                                   "ldmatrix.sync.aligned.m8n8.x4.shared.b16"):
            assert instr in ptx, (out_half, instr)
        assert "wgmma.mma_async" not in ptx, out_half


# ---------------------------------------------------------------------------------------
# The CUDA C on the CPU, through the launchers

Wg = W3.WgmmaConfig
G1 = Wg(BN=128, CONSUMERS=1, STAGES=3)   # one consumer, a ring shorter than a tile's slabs
REAL = [E.WgSpec(W3.GEMM_DEFAULT, f16=True), E.WgSpec(G1, f16=True),
        E.WgSpec(G1, f16=True, out_half=True),
        E.WgSpec(W3.CONV_CANDIDATES[0], conv=True, f16=True),
        E.WgSpec(Wg(BN=64, STAGES=3, BQ=8), conv=True, f16=True),
        # mma.sync consumers: the GEMM's top tile (staged fp16 output), and one consumer
        # of 32-column warps, fp32 output stored from registers
        E.WgSpec(W3.MMA_SYNC_TOP, f16=True, out_half=True),
        E.WgSpec(Wg(BN=128, CONSUMERS=1, STAGES=3, MMA_SYNC=1), f16=True)]
GEMM_SHAPE = (150, 200, 328)   # two block rows, partial tiles, 6 slabs with a K tail
CONV_X, CONV_W = (2, 6, 7, 128), (10, 3, 3, 128)   # NHWC, KRSC: 2 channel slabs per (r, s)


def _moved_arrive(src: str) -> tuple[str, str]:
    """(text, replacement): the mma.sync consumer's release of a slot moved from after its
    slab's last mma.sync to before its first ldmatrix of the slab."""
    start = src.index("const int s = it % STAGES;\n#pragma unroll\n")
    tail = "mbar_arrive(&empty[s]);\n            }\n#if OUT_HALF"
    end = src.index(tail, start) + len(tail)
    old = src[start:end]
    return old, old.replace(tail, "}\n#if OUT_HALF").replace(
        "const int s = it % STAGES;\n", "const int s = it % STAGES;\nmbar_arrive(&empty[s]);\n", 1)


# planted bugs: (text, replacement, spec)
MUTANTS = {
    "slot released before its wgmma finished": ("wgmma_wait1();", "", REAL[1]),
    "full barrier waited with the wrong parity": (
        "mbar_wait(&full[s], (it / STAGES) & 1);", "mbar_wait(&full[s], (it / STAGES + 1) & 1);",
        REAL[1]),
    "empty barrier waited with the wrong parity": (
        "mbar_wait(&empty[s], (round - 1) & 1);", "mbar_wait(&empty[s], round & 1);", REAL[1]),
    "expected bytes without B": ("mbar_expect_tx(&full[s], A_BYTES + B_BYTES);",
                                 "mbar_expect_tx(&full[s], A_BYTES);", REAL[1]),
    "conv: column padding ignored": ("q0 + sx * pb.dw - pb.pw", "q0 + sx * pb.dw", REAL[4]),
    "conv: row dilation ignored": ("p0 + r * pb.dh - pb.ph", "p0 + r - pb.ph", REAL[4]),
    "conv: filter slab without its channel offset": ("rs * pb.C + c0, bn * BN",
                                                     "rs * pb.C, bn * BN", REAL[4]),
    "mma.sync: next slot read before its full barrier": (
        "mbar_wait(&full[s2], ((it + 1) / STAGES) & 1);", "", REAL[5]),
    "mma.sync: slot released before its fragments were read": (
        *_moved_arrive(SRC), REAL[6]),
    "mma.sync: ldmatrix rows without the swizzle": (
        "(((lane >> 4) ^ (ar & 7)) << 4)", "((lane >> 4) << 4)", REAL[5]),
    "mma.sync: staged rows read before the whole warp wrote them": (
        "            __syncwarp();\n            constexpr int CPR", "            constexpr int CPR",
        REAL[5]),
}


@pytest.fixture(scope="module")
def wemu(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ (C++20) not installed")
    planted = [(spec, SRC.replace(old, new)) for old, new, spec in MUTANTS.values()]
    return E.WgmmaEmulator(REAL + [p[0] for p in planted], workdir=tmp_path_factory.mktemp("wg"),
                           sources=[SRC] * len(REAL) + [p[1] for p in planted])


@pytest.fixture
def launch_on_cpu(wemu, monkeypatch):
    """Route the launchers to the emulator: returns set(index, late, operands)."""
    state = {}

    def kernel(cfg, conv, f16, out_half):
        def fn(grid, block, args, shared_mem):
            i = state["i"]
            assert wemu.specs[i] == E.WgSpec(cfg, conv, f16, out_half)
            wemu.launch(i, grid, block, args, shared_mem, state["operands"], state["late"])
        return fn

    def maps(key, make):
        a, b = make()
        state["maps"] = arr = np.frombuffer(a + b, np.uint64).copy()
        return types.SimpleNamespace(data=types.SimpleNamespace(ptr=arr.ctypes.data))

    monkeypatch.setattr(W3, "_kernel", kernel)
    monkeypatch.setattr(W3, "require_hopper", lambda: None)
    monkeypatch.setattr(W3, "_ptr", lambda a: a.ctypes.data)
    monkeypatch.setattr(W3, "tensor_map", E.encode_tensor_map)
    monkeypatch.setattr(W3, "_maps_on_device", maps)
    monkeypatch.setattr(W3, "_sm_count", lambda: 1)   # one persistent block walks all tiles

    def setter(i, late):
        state.update(i=i, late=late)
        return state
    return setter


def _guarded(shape, dtype, extra):
    n = int(np.prod(shape))
    buf = np.full(n + extra, np.nan, dtype)
    return buf, buf[:n].reshape(shape)


def _run_case(wemu, state, i, rng) -> str:
    """'' if spec i (through its launcher) matches float64, else what went wrong."""
    from convlab import reference as ref

    s = wemu.specs[i]
    tol = 2e-3 if s.out_half else 1e-5
    if not s.conv:
        M, N, K = GEMM_SHAPE
        a, bt, exp, absr = E.fp16_operands(M, N, K, rng)
        buf, out = _guarded((M, N), np.float16 if s.out_half else np.float32, s.cfg.BM * N)
        state["operands"] = [a, bt]
        W3.gemm_wgmma_raw(a, bt, out, cfg=s.cfg)
    else:
        x = rng.standard_normal(CONV_X).astype(np.float16)
        w = rng.standard_normal(CONV_W).astype(np.float16)
        kw = dict(padding=(1, 2), dilation=(2, 1))
        p = ref.conv_params(np.array(CONV_X)[[0, 3, 1, 2]], np.array(CONV_W)[[0, 3, 1, 2]],
                            1, **kw)
        buf, y = _guarded((p.N, p.P, p.Q, p.K), np.float32, s.cfg.BM * p.K)
        state["operands"] = [x, w]
        W3.conv2d_wgmma_nhwc(x, w, y, cfg=s.cfg, **kw)
        out = y.transpose(0, 3, 1, 2)
        X, W = (v.astype(np.float64).transpose(0, 3, 1, 2) for v in (x, w))
        exp, absr = ref.conv2d(X, W, **kw), ref.conv2d(np.abs(X), np.abs(W), **kw)
    err = E.rel_err(out.astype(np.float32), exp, absr)
    bad = [f"max rel err {err:.1e}"] if not err < tol else []
    bad += [f"{wemu.errors} faults"] if wemu.errors else []
    bad += ["written past the output"] if not np.isnan(buf[out.size:]).all() else []
    return ", ".join(bad)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ (C++20) not installed")
def test_emulated_kernel_through_the_launchers(wemu, launch_on_cpu):
    """GEMM (fp32 and fp16 output) and conv (padding, dilation, several channel slabs) with
    copies landing late and wgmma running late: every pipeline and gather index matters."""
    rng = np.random.default_rng(21)
    bad = []
    for i, s in enumerate(REAL):
        for late in (1, 2):   # TMA late (reads before a copy landed), wgmma late (slot reuse)
            if v := _run_case(wemu, launch_on_cpu(i, late), i, rng):
                bad.append(f"{s} late={late}: {v}")
    assert not bad, "\n".join(bad)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ (C++20) not installed")
def test_emulator_catches_planted_pipeline_bugs(wemu, launch_on_cpu):
    rng = np.random.default_rng(22)
    missed = []
    for k, (name, (old, _, _)) in enumerate(MUTANTS.items()):
        assert SRC.count(old) == 1, f"{name}: {old!r} is not in the source once"
        i = len(REAL) + k
        if not any(_run_case(wemu, launch_on_cpu(i, late), i, rng) for late in (1, 2)):
            missed.append(name)
    assert not missed, f"planted bugs not caught: {missed}"


def test_emulator_refuses_ptx_it_does_not_model():
    for old, new, who in [("%32, %33, p, 1, 1, 0, 0;", "%32, %33, p, 1, 1, 0, 1;", "wgmma_n64"),
                          ("mbarrier.try_wait.parity", "mbarrier.try_wait", "mbar_wait"),
                          ("[%1, {%2, %3}], [%4]", "[%1, {%3, %2}], [%4]", "tma_load_2d")]:
        assert SRC.count(old) == 1, old
        with pytest.raises(ValueError, match=who):
            E.wg_emulated_source(SRC.replace(old, new))
    with pytest.raises(ValueError, match="does not model"):
        E.wg_emulated_source(SRC.replace("__syncthreads();", 'asm volatile("bar.sync 1;");', 1))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(300, 262, 200), (1030, 1040, 520), (2100, 4100, 136)],
                         ids=str)
def test_mma_sync_consumers_on_the_gpu(shape):
    """The compiled mma.sync-consumer kernel on a Hopper GPU (not the emulation): odd
    shapes (partial tiles, a K tail, N not a multiple of 8: the staged rows' element-wise
    tail), fp32 and fp16 output poisoned with NaN, against float64 of the fp16 inputs;
    persistent blocks walk several tiles each on the largest."""
    from convlab.runtime import is_simulator

    if is_simulator():
        pytest.skip("needs a real CUDA GPU (this run uses the simulator)")
    import cupy as cp

    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("TMA needs compute capability 9.0")
    M, N, K = shape
    rng = np.random.default_rng(23)
    a, bt, exp, absref = E.fp16_operands(M, N, K, rng)
    a, bt = cp.asarray(a), cp.asarray(bt)
    bad = []
    for cfg in (W3.MMA_SYNC_TOP, Wg(BN=128, CONSUMERS=1, STAGES=3, MMA_SYNC=1),
                Wg(STAGES=3, MMA_SYNC=1, GROUP_M=16)):
        for half in (False, True):
            out = cp.full((M, N), np.nan, cp.float16 if half else cp.float32)
            W3.gemm_wgmma_raw(a, bt, out, cfg)
            err = E.rel_err(cp.asnumpy(out).astype(np.float64), exp, absref)
            if not err < (2e-3 if half else 1e-5):
                bad.append(f"{cfg} half={half}: max rel err {err:.1e}")
    assert not bad, "\n".join(bad)


def test_conv_refuses_the_mma_sync_consumers():
    """They store GEMM rows: a conv launch with them must not run (the launcher refuses,
    and the source does not compile with CONV)."""
    from convlab.kernels._launch import Unsupported

    x = np.zeros((1, 8, 8, 64), np.float16)
    w = np.zeros((64, 3, 3, 64), np.float16)
    y = np.zeros((1, 8, 8, 64), np.float32)
    with pytest.raises(Unsupported, match="GEMM only"):
        W3.conv2d_wgmma_nhwc(x, w, y, padding=1, cfg=W3.MMA_SYNC_TOP)
    if nvrtc_available():
        with pytest.raises(RuntimeError, match="GEMM only"):
            W3.compile_ptx(W3.MMA_SYNC_TOP, conv=True)
