"""Depthwise convolution through a zero-padded shared-memory tile: copy, then compute.

`depthwise01_direct` reads its inputs straight from global memory; every load carries a
clamp and a select for the padding, and the thread finds its plane, strip and column with
run-time divisions: about 78 PTX instructions per output at V=7, for a layer that should
run at the speed of a copy. This kernel splits the work in two phases per block:

1. **Copy.** A block owns a contiguous piece of the input: G whole planes (small planes
   such as 14x14; G planes of one image lie one after the other in NCHW) or a band of TP
   output rows of one plane (large planes such as 112x112; the input rows of a band are
   contiguous too). Consecutive threads copy consecutive elements of that piece into a
   zero-padded shared tile, like a copy kernel (coalesced). Halo rows outside the image
   and the pad columns are written as zeros, so phase 2 has no bounds tests at all.
2. **Compute.** Each thread takes V vertically adjacent outputs of one column, reads the
   (V-1)*stride + R rows x S values it needs from shared memory (neighbouring threads,
   neighbouring columns: no bank conflicts at stride 1), keeps the taps in registers and
   writes its V outputs; a warp writes runs of consecutive columns.

The kernel is specialised on the whole shape of a plane (H, W, padding, R, S, stride), on
C, and on the tiling (G, TP, V, threads): `make_kernel` compiles one kernel per key and
caches it, so every division and remainder is by a compile-time constant (a multiply and
a shift), every loop unrolls, and the shared tile has a constant size. `default_tiling`
chooses the tiling from the shape; the launcher accepts overrides (for the sweep of
`python -m convlab measure 11`).

Launcher signature (device arrays, float32; w is (C, 1, R, S), groups = C)::

    conv2d_depthwise_smem(x, w, out, stride=1, padding=0, dilation=1, groups=C,
                          stream=0) -> out
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, uint32

from ._blocking import flat, jit_options
from ._launch import Unsupported, ceil_div, configured, launcher, remember
from .depthwise01_direct import MAX_TAPS, depthwise_params

NAME = "conv2d_depthwise_smem"
SMEM_LIMIT = 24 * 1024  # bytes of shared tile per block: several blocks fit on an SM
MAX_THREADS = 1024

_CACHE: dict = {}


def tile_shape(P: int, Q: int, R: int, S: int, stride: int, tp: int) -> tuple:
    """(rows, cols) of the padded shared tile for a band of `tp` output rows."""
    return (tp - 1) * stride + R, (Q - 1) * stride + S


def make_kernel(H, W, P, Q, R, S, stride, ph, pw, C, g, tp, v, threads, ragged=True):
    """Compile (once) the kernel for one plane shape and one tiling.

    g planes per block, each a band of tp output rows (tp = P: whole planes), v outputs
    per thread down a column (v divides tp), `threads` threads per block.
    """
    key = (H, W, P, Q, R, S, stride, ph, pw, C, g, tp, v, threads, ragged)
    if key in _CACHE:
        return _CACHE[key]
    if R * S > MAX_TAPS:
        raise Unsupported(f"{NAME}: filters up to {MAX_TAPS} taps, got {R}x{S}")
    if tp % v or tp > P or g < 1 or threads % 32 or not 32 <= threads <= MAX_THREADS:
        raise Unsupported(f"{NAME}: bad tiling g={g} tp={tp} v={v} threads={threads} (v must "
                          f"divide tp <= P={P}; threads a multiple of 32 up to {MAX_THREADS})")
    TR, TC = tile_shape(P, Q, R, S, stride, tp)
    PT = TR * TC  # one plane's tile
    NT = g * PT  # the block's tile
    if NT * 4 > SMEM_LIMIT:
        raise Unsupported(f"{NAME}: a tile of {g} x {TR} x {TC} floats exceeds "
                          f"{SMEM_LIMIT // 1024} KB of shared memory")
    BANDS = ceil_div(P, tp)
    STRIPS = tp // v  # strips of v outputs per band
    ITEMS = g * STRIPS * Q  # (plane, strip, column) work items per block
    if threads < TC:
        raise Unsupported(f"{NAME}: {threads} threads cannot cover a tile row of {TC}")
    RPT = threads // TC  # tile rows copied per pass
    if RPT >= TR:
        RPT -= RPT % TR  # whole planes per pass (a few threads idle in phase 1)
    WHOLE = RPT % TR == 0  # a pass copies whole planes: one row test per thread
    N_LOAD = ceil_div(g * TR, RPT)  # tile rows each thread copies
    N_ITEM = ceil_div(ITEMS, threads)
    LOAD_EXACT = (g * TR) % RPT == 0
    ITEM_EXACT = ITEMS % threads == 0
    P_EXACT = P % tp == 0  # no band runs past the bottom of the image
    ROWS = (v - 1) * stride + R  # tile rows a strip reads
    RS = R * S
    NWIN = ROWS * S  # the window a strip reads
    HW, PQ = H * W, P * Q
    ROW_STEP = tp * stride  # input rows between the first rows of two bands
    # as uint32 constants: the arithmetic below stays 32-bit (no 64-bit divisions)
    u = uint32
    uW, uQ, uTC, uPT = u(W), u(Q), u(TC), u(PT)
    uPH, uPW, uHW, uPQ, uC = u(ph), u(pw), u(HW), u(PQ), u(C)
    uSTRIDE, uG, uBANDS = u(stride), u(g), u(BANDS)
    uITEMS, uRS, uROW_STEP = u(ITEMS), u(RS), u(ROW_STEP)
    uSQ, uTP, uV, uP = u(STRIPS * Q), u(tp), u(v), u(P)
    uHP, uWP, uOFF = u(H + ph), u(W + pw), u(ph * W + pw)
    uTR, uRPT, uGTR = u(TR), u(RPT), u(g * TR)
    uSTRIP_T = u(v * stride * TC)  # tile elements between the first rows of two strips

    @cuda.jit(**jit_options(threads))
    def depthwise_smem_kernel(x, w, y, NC):
        # every index computation is wrapped in u() (uint32): Numba would widen uint32
        # arithmetic to 64 bits; with the casts the divisions by constants stay 32-bit.
        # Compile-time offsets are added last, unwrapped (base + 7: int64, no overflow),
        # so they become address offsets ([%rd + 28]) instead of an add per access.
        tile = cuda.shared.array(NT, float32)
        tid = u(cuda.threadIdx.x)
        b = u(cuda.blockIdx.x)
        band = u(b % uBANDS)  # the bands of one plane group are neighbouring blocks
        plane0 = u(u(b // uBANDS) * uG)
        hb = u(band * uROW_STEP)  # padded row (input row + ph) of tile row 0
        base = u(plane0 * uHW)
        # 1. copy, row by row: thread (jr, k) copies column k of tile rows jr, jr + RPT,
        # ... (RPT rows per pass), so k, its column test and (whole planes per pass) the
        # row test are computed once; consecutive threads, consecutive addresses
        k = u(tid % uTC)  # tile column; input column k - pw
        jr = u(tid // uTC)
        kok = k >= uPW and k < uWP and jr < uRPT
        vals = cuda.local.array(N_LOAD, float32)
        if WHOLE:  # RPT is a multiple of TR: a pass copies RPT / TR whole planes
            hh = u(hb + u(jr % uTR))
            ok = kok and hh >= uPH and hh < uHP
            gq = u(jr // uTR)
            src = u(u(u(base + u(gq * uHW)) + u(hh * uW) + k) - uOFF) if ok else u(0)
            for i in range(N_LOAD):
                gp = u(gq + u(i * (RPT // TR)))
                a = float32(0.0)
                if ok and (LOAD_EXACT or gp < uG) and (not ragged or u(plane0 + gp) < NC):
                    a = x[src + i * (RPT // TR) * HW]
                vals[i] = a
        elif g == 1:  # one plane: rows i*RPT apart, addresses i*RPT*W apart
            hh0 = u(hb + jr)
            src = u(u(base + u(hh0 * uW)) + k)  # the input address + ph*W + pw
            for i in range(N_LOAD):
                hh = u(hh0 + u(i * RPT))
                a = float32(0.0)
                if (kok and (LOAD_EXACT or u(jr + u(i * RPT)) < uTR) and hh >= uPH
                        and hh < uHP):
                    a = x[np.int64(src) + (i * RPT * W - ph * W - pw)]
                vals[i] = a
        else:
            for i in range(N_LOAD):
                J = u(jr + u(i * RPT))  # row of the block's tile (g planes x TR rows)
                gp = u(J // uTR)
                hh = u(hb + u(J - u(gp * uTR)))
                a = float32(0.0)
                if (kok and (LOAD_EXACT or J < uGTR) and hh >= uPH and hh < uHP
                        and (not ragged or u(plane0 + gp) < NC)):
                    a = x[u(u(u(base + u(gp * uHW)) + u(hh * uW) + k) - uOFF)]
                vals[i] = a
        dst = u(u(jr * uTC) + k)
        for i in range(N_LOAD):
            if jr < uRPT and (LOAD_EXACT or u(jr + u(i * RPT)) < uGTR):
                tile[dst + i * RPT * TC] = vals[i]
        cuda.syncthreads()
        # 2. compute: item -> (plane gp, strip, column q), column fastest
        for it in range(N_ITEM):
            item = u(tid + u(it * threads))
            gp = u(item // uSQ)
            rest = u(item - u(gp * uSQ))
            strip = u(rest // uQ)
            q = u(rest - u(strip * uQ))
            plane = u(plane0 + gp)
            if (ITEM_EXACT or item < uITEMS) and (not ragged or plane < NC):
                c = u(plane % uC)
                taps = cuda.local.array(RS, float32)
                for t in range(RS):
                    taps[t] = w[u(c * uRS) + t]
                t0 = u(u(gp * uPT) + u(strip * uSTRIP_T) + u(q * uSTRIDE))
                win = cuda.local.array(NWIN, float32)
                for jj in range(ROWS):
                    for s in range(S):
                        win[jj * S + s] = tile[t0 + (jj * TC + s)]
                p0 = u(u(band * uTP) + u(strip * uV))
                out = u(u(plane * uPQ) + u(p0 * uQ) + q)
                for o in range(v):
                    acc = float32(0.0)
                    for r in range(R):
                        for s in range(S):
                            acc += win[(o * stride + r) * S + s] * taps[r * S + s]
                    if P_EXACT or u(p0 + u(o)) < uP:
                        y[out + o * Q] = acc

    _CACHE[key] = depthwise_smem_kernel
    return depthwise_smem_kernel


def default_tiling(N, C, H, W, P, Q, R=3, S=3, stride=1) -> dict:
    """G (planes per block), TP (output rows per block), V (outputs per thread) and threads.

    Small planes (P*Q <= 1024 and a plane's tile fits): whole planes (TP = P), V the
    largest divisor of P up to 8, G = 8 planes per block (fewer if the tile would pass
    SMEM_LIMIT; on the H200 sweep (`convlab measure 11`) G = 8 of 14 x 14
    was the fastest at stride 1, 11.5 us, and at stride 2, 7.9 us, where G = 27 took 10.6).
    Larger planes: one plane per block, bands of TP = 16 rows (fewer if the tile would not
    fit), V the largest divisor of TP up to 8 (within 5% of the sweep's best there).
    """
    TR, TC = tile_shape(P, Q, R, S, stride, P)
    if P * Q <= 1024 and TR * TC * 4 <= SMEM_LIMIT:
        v = max(d for d in range(1, 9) if P % d == 0)
        items = (P // v) * Q  # work items of one plane
        g = max(1, min(8, SMEM_LIMIT // (4 * TR * TC), N * C))
        # at least a plane's tile of threads: phase 1 then copies whole planes per pass
        threads = min(MAX_THREADS, 32 * ceil_div(max(g * items, TR * TC), 32))
        return dict(g=g, tp=P, v=v, threads=threads)
    tp = min(P, 16)
    while tp > 1 and 4 * tile_shape(P, Q, R, S, stride, tp)[0] * TC > SMEM_LIMIT:
        tp -= 1
    v = max(d for d in range(1, 9) if tp % d == 0)
    items = (tp // v) * Q
    threads = min(MAX_THREADS, 32 * ceil_div(max(items, TC), 32))
    return dict(g=1, tp=tp, v=v, threads=threads)


_PLANS: dict = {}


def plan(x, w, out, stride=1, padding=0, dilation=1, groups=None, g=None, tp=None, v=None,
         threads=None, stream=0) -> tuple:
    """Check a launch and choose its tiling: (the configured kernel, NC as uint32).

    g, tp, v, threads default to `default_tiling` (each can be set).
    """
    p = depthwise_params(NAME, x, w, out, stride, padding, dilation, groups)
    s = p.stride[0]
    NC = p.N * p.C
    tl = default_tiling(p.N, p.C, p.H, p.W, p.P, p.Q, p.R, p.S, s)
    tp = min(p.P, int(tp)) if tp is not None else tl["tp"]
    v = max(1, min(int(v), tp)) if v is not None else min(tl["v"], tp)
    if tp % v:
        raise Unsupported(f"{NAME}: v={v} must divide tp={tp}")
    g = max(1, int(g)) if g is not None else (tl["g"] if tp == p.P else 1)
    if threads is None:
        threads = min(MAX_THREADS, 32 * ceil_div(g * (tp // v) * p.Q, 32))
    k = make_kernel(p.H, p.W, p.P, p.Q, p.R, p.S, s, p.padding[0], p.padding[1], p.C, g, tp,
                    v, int(threads), ragged=NC % g != 0)
    blocks = ceil_div(p.P, tp) * ceil_div(NC, g)
    if blocks >= 2**31:
        raise Unsupported(f"{NAME}: {blocks} blocks is too many")
    return configured(k, blocks, int(threads), stream), np.uint32(NC)


def launch(x, w, out, stride=1, padding=0, dilation=1, groups=None, g=None, tp=None, v=None,
           threads=None, stream=0):
    """Run the kernel; g, tp, v, threads default to `default_tiling` (each can be set).

    The `plan` is made once per shapes, dtypes, arguments and stream; a repeat costs a
    dict lookup, the cached flat views of the arrays and the launch.
    """
    try:
        key = (x.shape, w.shape, out.shape, x.dtype, w.dtype, out.dtype, stride, padding,
               dilation, groups, g, tp, v, threads, stream)
        run = _PLANS.get(key)
    except (AttributeError, TypeError):  # not arrays, or unhashable arguments: no cache
        key = run = None
    if run is None:
        run = remember(_PLANS, key, plan(x, w, out, stride, padding, dilation, groups, g, tp,
                                         v, threads, stream))
    kernel, nc = run
    kernel(flat(x), flat(w), flat(out), nc)
    return out


@launcher
def conv2d_depthwise_smem(x, w, out, stride=1, padding=0, dilation=1, groups=None, stream=0):
    """Depthwise conv (groups = C, w (C, 1, R, S)), stride 1 or 2, any padding, up to 7x7."""
    return launch(x, w, out, stride, padding, dilation, groups, stream=stream)


SIGNATURE = "(float32[::1], float32[::1], float32[::1], uint32)"
# The module's kernel (for PTX reports): the 512-channel 14x14 layer, 3x3, pad 1, stride 1.
TILING_DW512 = default_tiling(32, 512, 14, 14, 14, 14)
KERNEL = make_kernel(14, 14, 14, 14, 3, 3, 1, 1, 1, 512, TILING_DW512["g"], TILING_DW512["tp"],
                     TILING_DW512["v"], TILING_DW512["threads"])


def ptx_instructions(ptx: str) -> int:
    """PTX instructions in a kernel's text (not directives, labels, braces or comments)."""
    n = 0
    for line in ptx.splitlines():
        s = line.strip()
        if not s or s[0] in ".{}/" or s.endswith(":"):
            continue
        n += 1
    return n


def outputs_per_thread(P, Q, g, tp, v, threads) -> float:
    """Outputs a block computes per thread (for instructions per output)."""
    return g * tp * Q / threads
