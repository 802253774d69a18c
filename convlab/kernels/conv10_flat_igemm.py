"""The one-launch implicit GEMM for small convolutions, in pure Numba.

`flat_igemm_cuda`'s algorithm without CUDA C: at batch 1 a layer's arithmetic takes a few
microseconds, so what the implicit GEMM of steps 5-8 does around the product costs as
much as the product itself (a weight transform launched on every call) and a grid of
large tiles leaves most SMs idle. Here:

- one launch per convolution: the filters are read where they are, as the (K, C*R*S)
  row-major matrix A that ``w`` already is, over the flat reduction index
  l = (c R + r) S + s; the columns B[l, j] (j = (n, p, q), an output pixel) are gathered
  from x inside the loads. MODE 0 (1x1, no padding): B[c, j] = x[n, c, p sh, q sw], rows
  of x; MODE 1 (anything else): a thread keeps the input row, column and address of its
  next l and steps them by adds with carries ((c, r, s) in mixed radix), so the main loop
  neither divides nor multiplies;
- small tiles: 64x64, 32x64 or 32x32 outputs per block of 64 threads (8 x 8 threads, 8x8
  or 4x4 outputs each, as 4x4 sub-blocks so shared reads are 128-bit), 16-deep slabs, the
  next slab's global loads held in registers while this one is multiplied (two shared
  buffers, one barrier per slab). Loads are coalesced scalars (a column of B gathered
  from x starts wherever padding and stride put it, so it is no aligned 16-byte run in
  general, and gemm05's `load4` is not used): 16 threads read 16 neighbouring filter
  values of one row, 32 threads 32 neighbouring pixels; the A slab is stored transposed
  with 4 floats of padding per row.
  The block's outputs go through shared memory so that a warp stores 32 neighbouring
  pixels of one filter (one full 128-byte line where a row of the image allows);
- a split-K inside the same launch for grids with too few tiles: part z of a tile
  reduces slabs [z per, (z+1) per) into its own slice z of a workspace (y's layout). The
  last part of a tile to finish (a counter per tile, incremented after a threadfence)
  adds the slices in the fixed order 0, 1, ..., Z-1 into y and resets the counter. The
  float32 additions are the same whichever part finishes last, so results are
  reproducible bit for bit from run to run.

The tile and the split come from `choose_tile` (the CUDA C rule with one group of 64
threads: about 4 blocks per SM). A plan's workspace and counters belong to its shape: one
stream at a time. NCHW float32, any stride / padding / dilation, groups 1; 64-bit indices.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32, uint64

from ._blocking import SIM, SMEM_ALIGN, flat, jit_options, unroll, unrolled
from ._blocking import log2 as _log2
from ._launch import Unsupported, ceil_div, configured, conv_launch_params, launcher, remember
from .flat_igemm_cuda import BK, MODES, TILES, Tile, choose, mode_of

APAD = 4  # floats of padding per row of the transposed A slab (fewer bank conflicts)


def _read(a, i):
    return a[i]


# The split sum reads the other parts' slices from L2 (``ld.global.cg``): an SM's L1 is
# not coherent with the other SMs' stores, and a line of ws cached there by the sum of a
# neighbouring tile may predate them. The simulator has no caches: a plain read.
read_l2 = _read if SIM else cuda.ldcg

# (x, w, y, ws, counters, prm), all flat; prm = int64[N, C, H, W, K, R, S, P, Q, sh, sw,
# ph, pw, dh, dw, slabs per part]
SIGNATURE = ("(float32[::1], float32[::1], float32[::1], float32[::1], int32[::1], "
             "int64[::1])")


def make_kernel(BM: int = 64, BN: int = 64, MODE: int = 1):
    """The kernel for BM filters x BN pixels per block of 64 threads; MODE 0 reads rows of x
    (1x1, no padding), MODE 1 gathers (c, r, s) columns."""
    if (BM, BN) not in {(t.BM, t.BN) for t in TILES} or MODE not in MODES:
        raise ValueError(f"conv10_flat_igemm: no kernel for tile {BM}x{BN}, mode {MODE}")
    TM, TN = (8 if BM >= 64 else 4), (8 if BN >= 64 else 4)  # outputs per thread
    MH, NH = TM // 4, TN // 4  # 4x4 sub-blocks per thread
    TXN = BN // TN  # threads along the pixels (8)
    NT = TXN * (BM // TM)  # 64
    LTX, LBK, LBN = _log2(TXN), _log2(BK), _log2(BN)
    A_LOADS, B_LOADS = BM * BK // NT, BK * BN // NT  # per thread per slab
    A_STEP, B_STEP = NT // BK, NT // BN  # slab rows between a thread's loads
    AH, BH = BM // MH, BN // NH  # distance between a thread's sub-blocks
    AW, CW = BM + APAD, BN + APAD  # row lengths of the shared A slab and output tile
    C_ROWS = BM * BN // NT  # output rows per thread in the epilogue

    def flat_igemm_kernel(x, w, y, ws, cnt, prm):
        N, C, H, W, K = prm[0], prm[1], prm[2], prm[3], prm[4]
        R, S, P, Q = prm[5], prm[6], prm[7], prm[8]
        sh, sw, ph, pw, dh, dw, per = prm[9], prm[10], prm[11], prm[12], prm[13], prm[14], prm[15]
        As = cuda.shared.array((2, BK, AW), float32, alignment=SMEM_ALIGN)
        Bs = cuda.shared.array((2, BK, BN), float32, alignment=SMEM_ALIGN)
        Cs = cuda.shared.array((BM, CW), float32, alignment=SMEM_ALIGN)
        last = cuda.shared.array(1, int32)
        tid = cuda.threadIdx.x & (NT - 1)
        tx, ty = tid & (TXN - 1), tid >> LTX
        bx, by = cuda.blockIdx.x & 0x7FFFFFFF, cuda.blockIdx.y & 0xFFFF
        z, parts = cuda.blockIdx.z & 0xFFFF, cuda.gridDim.z
        m0, n0 = by * BM, bx * BN
        RS, HW, PQ = R * S, H * W, P * Q
        L, NPQ = C * RS, N * PQ
        t0 = z * per
        n_slabs = min((L + BK - 1) // BK, t0 + per) - t0

        # A: this thread reads filter values l0 + a_l of rows a_r, a_r + A_STEP, ... (zero
        # past K: they feed outputs never stored)
        a_l, a_r = tid & (BK - 1), tid >> LBK
        a_rows = K - m0 - a_r  # rows a_r + ld A_STEP with ld A_STEP < a_rows exist
        a_at = (m0 + a_r) * L + a_l
        a_step = A_STEP * L
        # B: this thread's pixel j (clamped like the rows), rows b_k, b_k + B_STEP, ...
        b_n, b_k = tid & (BN - 1), tid >> LBN
        j = min(n0 + b_n, NPQ - 1)
        img = j // PQ
        pq = j - img * PQ
        p = pq // Q
        q = pq - p * Q
        h_base, w_base, x_img = p * sh - ph, q * sw - pw, img * C * HW
        lb = t0 * BK + b_k  # the next B row this thread loads, and its (c, r, s)
        x_row = x_img + h_base * W + w_base + lb * HW  # MODE 0: where row lb is read
        row_step = B_STEP * HW
        c = lb // RS
        r = (lb - c * RS) // S
        s = lb - c * RS - r * S
        dc = B_STEP // RS  # B_STEP as (dc, dr, ds): the step between a thread's rows
        dr = (B_STEP - dc * RS) // S
        ds = B_STEP - dc * RS - dr * S
        # MODE 1 keeps, instead of (c, r, s), the input row h = h_base + r dh, column
        # col = w_base + s dw and address at = x_img + c H W + h W + col of row lb, and
        # steps them with adds: (c, r, s) += (dc, dr, ds), one carry per digit at most
        h = h_base + r * dh
        col = w_base + s * dw
        at = x_img + c * HW + h * W + col
        h_end, col_end = h_base + R * dh, w_base + S * dw  # r = R, s = S: carry
        col_step, col_wrap, at_col_wrap = ds * dw, S * dw, dh * W - S * dw
        h_step, at_h_step = dr * dh, dr * dh * W + dc * HW
        h_wrap, at_h_wrap = R * dh, HW - R * dh * W

        acc = cuda.local.array((TM, TN), float32)
        af = cuda.local.array(TM, float32)
        bf = cuda.local.array(TN, float32)
        ra = cuda.local.array(A_LOADS, float32)
        rb = cuda.local.array(B_LOADS, float32)
        for i in range(TM):
            for jj in range(TN):
                acc[i, jj] = float32(0.0)

        for t in range(n_slabs + 1):
            if t < n_slabs:  # global -> registers: slab t0 + t
                l0 = (t0 + t) * BK
                inside_a = l0 + a_l < L
                for ld in unroll(A_LOADS):
                    v = float32(0.0)
                    if inside_a and ld * A_STEP < a_rows:
                        v = w[uint64(a_at + ld * a_step + l0)]
                    ra[ld] = v
                for ld in unroll(B_LOADS):
                    v = float32(0.0)
                    if MODE == 0:
                        if lb < L:
                            v = x[uint64(x_row)]
                        x_row += row_step
                    else:
                        if lb < L and 0 <= h < H and 0 <= col < W:
                            v = x[uint64(at)]
                        col += col_step  # s += ds
                        at += col_step
                        if col >= col_end:  # s -= S, r += 1
                            col -= col_wrap
                            h += dh
                            at += at_col_wrap
                        h += h_step  # r += dr, c += dc
                        at += at_h_step
                        if h >= h_end:  # r -= R, c += 1
                            h -= h_wrap
                            at += at_h_wrap
                    rb[ld] = v
                    lb += B_STEP
            if t > 0:  # multiply slab t0 + t - 1, k unrolled
                buf = (t - 1) & 1
                for kk in unroll(BK):
                    for hh in range(MH):
                        for e in range(4):
                            af[4 * hh + e] = As[buf, kk, hh * AH + ty * 4 + e]
                    for g in range(NH):
                        for e in range(4):
                            bf[4 * g + e] = Bs[buf, kk, g * BH + tx * 4 + e]
                    for i in range(TM):
                        for jj in range(TN):
                            acc[i, jj] += af[i] * bf[jj]
            if t < n_slabs:  # registers -> the other buffer
                buf = t & 1
                for ld in unroll(A_LOADS):
                    As[buf, a_l, a_r + ld * A_STEP] = ra[ld]
                for ld in unroll(B_LOADS):
                    Bs[buf, b_k + ld * B_STEP, b_n] = rb[ld]
            cuda.syncthreads()

        # outputs through shared memory, so that a warp stores 32 neighbouring pixels of one
        # filter: thread (b_k, b_n) writes pixel n0 + b_n of rows b_k, b_k + B_STEP, ... at
        # y[(img K + m) PQ + pq]; split parts write slice z of ws instead
        for hh in unroll(MH):
            for i4 in unroll(4):
                for g in unroll(NH):
                    for e in unroll(4):
                        Cs[hh * AH + ty * 4 + i4, g * BH + tx * 4 + e] = acc[4 * hh + i4, 4 * g + e]
        cuda.syncthreads()
        split = parts > 1
        n_out = N * K * PQ
        jo = n0 + b_n
        pix_ok = jo < NPQ
        io = jo // PQ
        out_at = (io * K + m0) * PQ + jo - io * PQ  # row m0 of this pixel
        for ld in unroll(C_ROWS):
            mr = b_k + ld * B_STEP
            if pix_ok and m0 + mr < K:
                if split:
                    ws[uint64(z * n_out + out_at + mr * PQ)] = Cs[mr, b_n]
                else:
                    y[uint64(out_at + mr * PQ)] = Cs[mr, b_n]
        if split:
            cuda.threadfence()  # this thread's slice is visible to every block ...
            cuda.syncthreads()  # ... for all threads of the block, before the count moves
            if tid == 0:
                tile = by * cuda.gridDim.x + bx
                before = cuda.atomic.add(cnt, tile, 1)
                last[0] = 1 if before == parts - 1 else 0
                if before == parts - 1:
                    cnt[tile] = 0  # every part has counted: ready for the next launch
            cuda.syncthreads()
            if last[0] == 1:  # the last part of this tile: y = slice 0 + slice 1 + ...
                cuda.threadfence()
                for ld in unroll(C_ROWS):
                    mr = b_k + ld * B_STEP
                    if pix_ok and m0 + mr < K:
                        o = out_at + mr * PQ
                        total = read_l2(ws, uint64(o))
                        for zz in range(1, parts):
                            total += read_l2(ws, uint64(zz * n_out + o))
                        y[uint64(o)] = total

    kernel = cuda.jit(**jit_options(NT))(unrolled(flat_igemm_kernel))
    kernel.tile = dict(BM=BM, BN=BN, BK=BK, TM=TM, TN=TN, threads=NT, mode=MODE)
    return kernel


_KERNELS: dict = {}


def kernel_for(tile: Tile, mode: int):
    """The compiled kernel of one tile and mode (built on first use, then kept)."""
    key = (tile.BM, tile.BN, mode)
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = make_kernel(*key)
    return k


def plan_args(p, tile: Tile) -> dict:
    """Grid, parts and the int64 parameters (prm) of one launch for ConvParams p (the
    tile's KS, the CUDA C kernel's sliced reduction, is ignored: one group of 64 threads)."""
    if (tile.BM, tile.BN) not in {(t.BM, t.BN) for t in TILES} or tile.SPLIT < 1:
        raise ValueError(f"conv10_flat_igemm: no kernel for tile {tile}")
    slabs = ceil_div(p.C * p.R * p.S, BK)
    per = ceil_div(slabs, tile.SPLIT)
    parts = ceil_div(slabs, per)  # no empty part
    grid = (ceil_div(p.N * p.P * p.Q, tile.BN), ceil_div(p.K, tile.BM), parts)
    if grid[1] > 65535 or parts > 65535:
        raise Unsupported(f"conv10_flat_igemm: K={p.K} needs {grid[1]} block rows; CUDA "
                          "allows 65535")
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
    return dict(grid=grid, parts=parts, mode=mode_of(p), tiles=grid[0] * grid[1],
                n_out=p.N * p.K * p.P * p.Q,
                prm=(p.N, p.C, p.H, p.W, p.K, p.R, p.S, p.P, p.Q, sh, sw, ph, pw, dh, dw, per))


def choose_tile(p) -> Tile:
    """The tile and split for ConvParams p: `flat_igemm_cuda.choose` with one group of 64
    threads per block (this kernel has no sliced reduction)."""
    return choose(p, ks=1)


def make_launcher(tile: Tile | None = None, name: str = "conv2d_flat_igemm"):
    """A conv launcher (common signature): the tile `choose_tile` picks per shape, or `tile`.
    Its plans (one per shape) keep the parameters, the split workspace and the counters."""
    plans: dict = {}

    def plan_for(x, w, out, stride, padding, dilation, groups):
        try:
            key = (x.shape, w.shape, out.shape, stride, padding, dilation, groups)
            plan = plans.get(key)
        except TypeError:  # unhashable arguments: plan every time
            key, plan = None, None
        if plan is not None and x.dtype == w.dtype == out.dtype == np.float32:
            return plan
        p = conv_launch_params(name, x, w, out, stride, padding, dilation, groups)
        t = tile or choose_tile(p)
        a = plan_args(p, t)
        split = a["parts"] > 1
        plan = dict(a, tile=t, run=configured(kernel_for(t, a["mode"]), a["grid"], 64),
                    prm=cuda.to_device(np.array(a["prm"], np.int64)),
                    ws=cuda.device_array(a["parts"] * a["n_out"] if split else 1, np.float32),
                    counters=cuda.to_device(np.zeros(a["tiles"] if split else 1, np.int32)))
        return remember(plans, key, plan)

    @launcher
    def conv2d(x, w, out, stride=1, padding=0, dilation=1, groups=1):
        plan = plan_for(x, w, out, stride, padding, dilation, groups)
        plan["run"](flat(x), flat(w), flat(out), plan["ws"], plan["counters"], plan["prm"])
        return out

    conv2d.__name__ = name
    conv2d.tile, conv2d.plans = tile, plans
    return conv2d


conv2d_flat_igemm = make_launcher()
conv2d_flat_igemm.__doc__ = (
    "x (N, C, H, W), w (K, C, R, S), out (N, K, P, Q) fp32 device arrays; any stride, "
    "padding, dilation; groups 1. One launch, pure Numba; the tile and split "
    "`flat_igemm_cuda.choose` picks.")
KERNEL = kernel_for(Tile(64, 64), 1)  # for PTX reports: the largest tile, gathered
conv2d_flat_igemm.kernel = KERNEL
