"""The tensor-core kernels (convlab/kernels/wmma01_gemm_cuda.py).

Without a GPU: the CUDA C compiles with NVRTC (cuda.bindings, no GPU needed) to PTX that
really uses WMMA (and cp.async only where the architecture has it); tile shapes and bad
arguments are refused before anything needs CuPy; and, where g++ is installed, the
kernels run on the CPU through tools/wmma_emulate.py (threads, barriers, cp.async that
lands late), so their indexing and pipelining are checked against float64.
On a GPU (marked gpu): the course checkers at fp16 tolerance, and the products verified
against float64 of the fp16-rounded inputs at fp32 tolerance.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from convlab import check
from convlab.kernels import Unsupported
from convlab.kernels import wmma01_gemm_cuda as WM

from ._nvrtc import nvrtc_available

ROOT = Path(__file__).resolve().parents[1]


_nvrtc_available = nvrtc_available


needs_nvrtc = pytest.mark.skipif(not _nvrtc_available(), reason="cuda-python's NVRTC missing")


@needs_nvrtc
def test_source_compiles_with_nvrtc_without_gpu():
    cfgs = [WM.GEMM_DEFAULT, WM.CONV_DEFAULT, WM.GemmConfig(128, 128, 16, 64, 32, 3)]
    ptx = WM.compile_ptx(cfgs, arch="compute_90")
    # simple GEMM, two tiled GEMMs, the conv, fp32->fp16, two filter packers
    assert ptx.count(".entry") == 7
    for instr in ("wmma.load.a.sync.aligned.row.m16n16k16.shared.f16",
                  "wmma.load.a.sync.aligned.col.m16n16k16.shared.f16",
                  "wmma.load.b.sync.aligned.row.m16n16k16.shared.f16",
                  "wmma.mma.sync.aligned.row.row.m16n16k16.f32.f32",
                  "wmma.mma.sync.aligned.col.row.m16n16k16.f32.f32",
                  "wmma.store.d.sync.aligned.row.m16n16k16.f32",
                  "cp.async.cg.shared.global", "cvt.rn.f16.f32"):
        assert instr in ptx, instr
    assert "ld.local" not in ptx and "st.local" not in ptx


@needs_nvrtc
def test_turing_build_has_no_cp_async():
    """T4 (7.5) has tensor cores but no cp.async: the slabs go through registers."""
    ptx = WM.compile_ptx([WM.GEMM_DEFAULT], arch="compute_75")
    assert "wmma.mma.sync" in ptx and "cp.async" not in ptx


@needs_nvrtc
def test_nvrtc_errors_are_reported(monkeypatch):
    monkeypatch.setattr(WM, "CUDA_SOURCE", WM.CUDA_SOURCE + "\nnot C++ at all;\n")
    with pytest.raises(RuntimeError, match="NVRTC compile failed"):
        WM.compile_ptx([WM.GEMM_DEFAULT])


def test_tile_shapes_are_validated():
    for c in WM.GEMM_CANDIDATES + WM.CONV_CANDIDATES:
        c.validate()
        assert c.smem_bytes() <= 48 * 1024
    with pytest.raises(ValueError, match="power of two"):
        WM.GemmConfig(BM=96).validate()
    with pytest.raises(ValueError, match="fragments are 16x16"):
        WM.ConvConfig(WM=8).validate()
    with pytest.raises(ValueError, match="48 KB"):
        WM.GemmConfig(128, 256, 32, 64, 64, 2).validate()
    with pytest.raises(ValueError, match="warp tile must divide"):
        WM.ConvConfig(64, 128, 32, 128, 32).validate()
    with pytest.raises(ValueError, match="16-byte pieces"):
        WM.GemmConfig(32, 128, 16, 16, 64, 2).validate()


def test_bad_arguments_are_refused_before_cupy():
    a = np.zeros((32, 48), np.float16)
    b = np.zeros((48, 64), np.float16)
    out = np.zeros((32, 64), np.float32)
    with pytest.raises(TypeError, match="a must be float16"):
        WM.gemm_wmma_raw(a.astype(np.float32), b, out)
    with pytest.raises(ValueError, match="do not chain"):
        WM.gemm_wmma_raw(a, b[:32], out)
    with pytest.raises(Unsupported, match="multiples of 16"):
        WM.gemm_wmma_raw(a[:, :40], b[:40], out)
    with pytest.raises(Unsupported, match="needs M, N, K multiples of 128"):
        WM.gemm_wmma_raw(a, b, out, cfg=WM.GEMM_DEFAULT)
    x = np.zeros((1, 4, 5, 5), np.float32)
    w = np.zeros((4, 2, 3, 3), np.float32)
    with pytest.raises(Unsupported, match="groups=2"):
        WM.conv2d_wmma(x, w, np.zeros((1, 4, 3, 3), np.float32), groups=2)
    with pytest.raises(TypeError, match="out must be float32"):
        WM.conv2d_wmma(x, np.zeros((4, 4, 3, 3), np.float32), np.zeros((1, 4, 3, 3),
                                                                        np.float16))


def test_tile_rule():
    assert WM.choose_conv(64).BM == 64 and WM.choose_conv(256).BM == 128


# ---------------------------------------------------------------------------------------
# The CUDA C on the CPU (tools/wmma_emulate.py)


def _emulator():
    spec = importlib.util.spec_from_file_location("wmma_emulate",
                                                  ROOT / "tools" / "wmma_emulate.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["wmma_emulate"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ (C++20) not installed")
def test_kernels_emulated_on_cpu(tmp_path):
    """Every index, stride, layout flag and barrier of one GEMM and one conv tile, with
    cp.async copies that land only at their wait; odd conv sizes, stride, dilation,
    a partial filter tile and channels not a multiple of the slab."""
    E = _emulator()
    g, c = WM.GemmConfig(64, 128, 32, 32, 32, 3), WM.ConvConfig(64, 64, 32, 32, 32)
    lib, wm = E.build([g], [c], workdir=tmp_path)
    rng = np.random.default_rng(7)
    assert E.gemm_case(lib, "run_gemm0", 128, 128, 96, 1, rng) < 1e-5
    assert E.gemm_case(lib, "run_simple", 16, 32, 48, 0, rng) < 1e-5
    for xs, ws, st, pd, dl in [((1, 37, 7, 9), (70, 37, 3, 2), (2, 1), (1, 0), 1),
                               ((2, 3, 8, 7), (5, 3, 3, 3), 1, 2, 2)]:
        assert E.conv_case(lib, wm, 0, c, xs, ws, st, pd, dl, rng) < 1e-5


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ (C++20) not installed")
def test_emulator_catches_a_missing_wait(tmp_path, monkeypatch):
    """The emulator is able to fail: waiting for one cp.async group too few reads a slab
    before it has landed."""
    E = _emulator()
    wm = E._load_kernels()
    bad = wm.CUDA_SOURCE.replace("cp_async_wait<STAGES - 2>();", "cp_async_wait<STAGES - 1>();")
    assert bad != wm.CUDA_SOURCE
    monkeypatch.setattr(wm, "CUDA_SOURCE", bad)
    monkeypatch.setattr(E, "_load_kernels", lambda: wm)
    lib, _ = E.build([WM.GemmConfig(64, 128, 32, 32, 32, 3)], [], workdir=tmp_path)
    assert not E.gemm_case(lib, "run_gemm0", 64, 128, 128, 1, np.random.default_rng(0)) < 1e-3


# ---------------------------------------------------------------------------------------
# On a GPU


@pytest.mark.gpu
def test_wmma_conv_passes_the_checker_at_fp16_tolerance():
    pytest.importorskip("cupy")
    check.check_conv2d(WM.conv2d_wmma, dilation=True, precision="fp16")
    for cfg in WM.CONV_CANDIDATES[:3]:
        check.check_conv2d(WM.make_conv_launcher(cfg), precision="fp16")


@pytest.mark.gpu
def test_wmma_gemm_passes_the_checker_and_matches_rounded_inputs():
    cp = pytest.importorskip("cupy")
    check.check_gemm(lambda a, b: WM.gemm_fp16(a, b), precision="fp16", device=True)
    rng = np.random.default_rng(2)
    n = 512
    a = check.random_array((n, n), rng).astype(np.float16)
    b = check.random_array((n, n), rng).astype(np.float16)
    exp = a.astype(np.float64) @ b.astype(np.float64)
    absref = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    for kw in (dict(simple=True), dict(cfg=WM.GEMM_DEFAULT)):
        out = cp.full((n, n), np.nan, cp.float32)
        WM.gemm_wmma_raw(cp.asarray(a), cp.asarray(b), out, **kw)
        comp = check.compare(cp.asnumpy(out), exp, absref, n, "fp32")
        assert comp.ok, comp.summary()
