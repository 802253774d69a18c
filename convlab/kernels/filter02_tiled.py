"""Image filter, step 2: a halo tile in shared memory, the filter in constant memory.

A block of TX x TY threads computes an output tile TX wide and TY*V tall: every thread
computes V outputs stacked in one column. The block first copies the input tile it
needs, the output tile plus a halo of R//2 rows and S//2 columns on each side, from
global into shared memory (every pixel read from DRAM about once, with all of a
thread's loads in flight together), waits at ``cuda.syncthreads()``, then computes from
shared memory only. A thread slides down its column: each input row it reads from
shared memory feeds up to R of its V accumulators, so it reads (V+R-1)*S values for
V*R*S multiply-adds.

The filter taps live in constant memory: ``cuda.const.array_like`` needs the filter as
an array known when the kernel is compiled, so `make_kernel` builds (and caches) one
kernel per filter and tile shape. Every thread reads the same tap at the same time,
which constant memory serves as a broadcast; and because the values are known at compile
time, the compiler goes one step further and writes them into the multiply-add
instructions as immediates (``fma.rn.f32 %f2, %f1, 0f3E000000, %f0`` in the PTX): no load
at all.

`make_pipelined_kernel` is the same tile with one more trick for the memory-bound
4096 x 4096 case: a block computes several tiles down a column strip and issues the
loads of the next tile before it computes the current one.

Launcher signature (device arrays, float32)::

    filter2d_tiled(image (H, W), kernel (R, S), out (H, W)) -> out

Given a device array, the launcher copies the taps to the host on every call (a few
bytes, but a synchronization) to pick the compiled kernel; given the filter as a NumPy
array (``filter2d_tiled(image, taps, out)``), or `launch(..., taps=host_array)`, it skips
that, and that is what the timings use.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32, uint32

from ._blocking import flat
from ._filter import filter_launch_params, jit_options
from ._launch import Unsupported, ceil_div, configured, launcher, remember

# Default tile: TX threads along a row (a full warp), TY rows of threads, V outputs per
# thread, PAD extra floats per shared-memory row (for the bank-conflict experiments).
# Chosen by the H200 sweep (`python -m convlab measure 06`; results in
# convlab/results/h200_lessons04_06.json): 40.1 us of GPU time on a 4096 x 4096 image,
# 79.8% of the copy bandwidth measured in that run; the pipelined variants were slower.
TILE = dict(tx=32, ty=8, v=8, pad=0)

_CACHE: dict = {}


def _shapes(taps, tx, ty, v, pad):
    taps = np.ascontiguousarray(np.asarray(taps, dtype=np.float32))
    R, S = taps.shape
    HT = ty * v  # output rows per tile
    HI, WI = HT + R - 1, tx + S - 1  # input tile with its halo
    WP = WI + pad  # row pitch in shared memory
    if HI * WP * 4 > 48 * 1024:
        raise Unsupported(f"filter2d_tiled: a {HI}x{WP} float tile does not fit in 48 KiB "
                          "of shared memory; use a smaller tile or filter")
    return taps, R, S, HT, HI, WI, WP


def make_kernel(taps, tx: int = 32, ty: int = 8, v: int = 8, pad: int = 0, sync: bool = True):
    """Compile (once) a tiled filter kernel for the filter `taps` and this tile shape.

    sync=False leaves out the ``cuda.syncthreads()`` (lesson 06's broken demo: threads
    read tile elements other threads may not have written yet).
    """
    taps, R, S, HT, HI, WI, WP = _shapes(taps, tx, ty, v, pad)
    key = (taps.shape, taps.tobytes(), tx, ty, v, pad, 1, sync)
    if key in _CACHE:
        return _CACHE[key]
    NT = tx * ty  # threads per block
    NIN = HI * WI  # input tile elements
    NLOAD = -(-NIN // NT)  # loads per thread
    NSH = HI * WP  # floats of shared memory
    TAPS = taps  # read by cuda.const.array_like at compile time

    @cuda.jit
    def filter2d_tiled_kernel(img, out, H, W):
        # img, out: the image flattened to 1-D; H, W: int32. Index arithmetic stays in
        # 32 bits, and indices are cast to uint32 where they are used, which spares the
        # 64-bit multiplies and the negative-index checks Numba adds for signed indices.
        kc = cuda.const.array_like(TAPS)
        tile = cuda.shared.array(NSH, float32)
        tx_ = cuda.threadIdx.x
        ty_ = cuda.threadIdx.y
        t = uint32(ty_ * tx + tx_)  # unsigned: the compiler then knows i >= 0 below
        bx0 = int32(cuda.blockIdx.x * tx)  # first output column of the tile
        by0 = int32(cuda.blockIdx.y * HT)  # first output row of the tile
        gy0 = int32(by0 - R // 2)  # image row and column of the tile's corner (halo)
        gx0 = int32(bx0 - S // 2)
        # 1. global -> registers: every load of this thread issued before any is used
        vals = cuda.local.array(NLOAD, float32)
        for it in range(NLOAD):
            i = t + it * NT
            val = float32(0.0)
            if i < NIN:
                rr = i // WI  # row and column in the tile
                gy = int32(gy0 + rr)
                gx = int32(gx0 + (i - rr * WI))
                if 0 <= gy < H and 0 <= gx < W:  # zero padding outside the image
                    val = img[uint32(gy * W + gx)]
            vals[it] = val
        # 2. registers -> shared tile
        for it in range(NLOAD):
            i = t + it * NT
            if i < NIN:
                if pad == 0:
                    tile[i] = vals[it]
                else:
                    rr = i // WI
                    tile[rr * WP + (i - rr * WI)] = vals[it]
        if sync:
            cuda.syncthreads()  # the whole tile is written before anyone reads it
        # 3. compute V outputs down one column, sliding over the rows of the tile
        acc = cuda.local.array(v, float32)
        for j in range(v):
            acc[j] = float32(0.0)
        base = uint32(ty_ * (v * WP) + tx_)
        for j in range(v + R - 1):
            for s in range(S):
                a = tile[base + (j * WP + s)]
                for r in range(R):
                    o = j - r
                    if 0 <= o < v:
                        acc[o] += a * kc[r, s]
        gx = int32(bx0 + tx_)
        if gx < W:
            for j in range(v):
                gy = int32(by0 + ty_ * v + j)
                if gy < H:
                    out[uint32(gy * W + gx)] = acc[j]

    _CACHE[key] = filter2d_tiled_kernel
    return filter2d_tiled_kernel


def make_pipelined_kernel(taps, tx: int = 32, ty: int = 8, v: int = 8, pad: int = 0,
                          chunks: int = 4, min_blocks: int = 0):
    """The tiled kernel with a block computing `chunks` tiles stacked vertically.

    A pipeline one tile deep: the block issues the global loads of the next tile into
    registers before it computes the current tile from shared memory, so its loads are
    in flight while it computes (double buffering through registers, lesson 09's
    prefetch). min_blocks > 0 asks the compiler for that many resident blocks per SM
    (launch bounds: fewer registers per thread).
    """
    taps, R, S, HT, HI, WI, WP = _shapes(taps, tx, ty, v, pad)
    key = (taps.shape, taps.tobytes(), tx, ty, v, pad, chunks, min_blocks)
    if key in _CACHE:
        return _CACHE[key]
    NT = tx * ty
    NIN = HI * WI
    NLOAD = -(-NIN // NT)
    NSH = HI * WP
    TAPS = taps

    @cuda.jit(**jit_options(NT, min_blocks))
    def filter2d_pipelined_kernel(img, out, H, W):
        kc = cuda.const.array_like(TAPS)
        tile = cuda.shared.array(NSH, float32)
        vals = cuda.local.array(NLOAD, float32)
        acc = cuda.local.array(v, float32)
        tx_ = cuda.threadIdx.x
        ty_ = cuda.threadIdx.y
        t = uint32(ty_ * tx + tx_)
        x0 = int32(cuda.blockIdx.x * tx)  # first output column of the block
        y0 = int32(cuda.blockIdx.y * (HT * chunks))  # first output row of the block
        base = uint32(ty_ * (v * WP) + tx_)
        gx = int32(x0 + tx_)
        # step k loads tile k and computes tile k - 1
        for step in range(chunks + 1):
            if step > 0:
                for it in range(NLOAD):  # tile step-1: registers -> shared memory
                    i = t + it * NT
                    if i < NIN:
                        if pad == 0:
                            tile[i] = vals[it]
                        else:
                            rr = i // WI
                            tile[rr * WP + (i - rr * WI)] = vals[it]
                cuda.syncthreads()
            if step < chunks:  # tile step: global -> registers, in flight from here on
                gy0 = int32(y0 + step * HT - R // 2)
                gx0 = int32(x0 - S // 2)
                for it in range(NLOAD):
                    i = t + it * NT
                    val = float32(0.0)
                    if i < NIN:
                        rr = i // WI
                        gy = int32(gy0 + rr)
                        gxi = int32(gx0 + (i - rr * WI))
                        if 0 <= gy < H and 0 <= gxi < W:
                            val = img[uint32(gy * W + gxi)]
                    vals[it] = val
            if step > 0:  # compute tile step-1 from shared memory
                for j in range(v):
                    acc[j] = float32(0.0)
                for j in range(v + R - 1):
                    for s in range(S):
                        a = tile[base + (j * WP + s)]
                        for r in range(R):
                            o = j - r
                            if 0 <= o < v:
                                acc[o] += a * kc[r, s]
                if gx < W:
                    for j in range(v):
                        gy = int32(y0 + (step - 1) * HT + ty_ * v + j)
                        if gy < H:
                            out[uint32(gy * W + gx)] = acc[j]
                if step < chunks:
                    cuda.syncthreads()  # all reads done before the tile is rewritten

    _CACHE[key] = filter2d_pipelined_kernel
    return filter2d_pipelined_kernel


_PLANS: dict = {}


def plan(image, kernel, out, taps, tx, ty, v, pad=0, chunks=1, min_blocks=0, sync=True):
    """Check a launch; (the configured kernel compiled for `taps`, its int32 H and W)."""
    H, W, R, S = filter_launch_params("filter2d_tiled", image, kernel, out)
    if chunks == 1:
        k = make_kernel(taps, tx, ty, v, pad, sync)
    else:
        k = make_pipelined_kernel(taps, tx, ty, v, pad, chunks, min_blocks)
    grid = (ceil_div(W, tx), ceil_div(H, ty * v * chunks))
    return configured(k, grid, (tx, ty)), np.int32(H), np.int32(W)


def launch(image, kernel, out, tx: int, ty: int, v: int, pad: int = 0, chunks: int = 1,
           min_blocks: int = 0, taps=None, sync: bool = True):
    """Run the tiled filter with an explicit tile shape (the sweep and the lessons use it).

    taps: the filter on the host (default: `kernel` itself if it is a host array, else a
    copy of it, read on every call). The `plan` is made once per shapes, dtypes, tile and
    filter values: the values are part of the key because they are compiled in.
    """
    if taps is None:
        taps = kernel.copy_to_host() if hasattr(kernel, "copy_to_host") else np.asarray(kernel)
    try:
        t = np.asarray(taps)
        key = (image.shape, kernel.shape, out.shape, image.dtype, kernel.dtype, out.dtype,
               t.dtype, t.shape, t.tobytes(), tx, ty, v, pad, chunks, min_blocks, sync)
        run = _PLANS.get(key)
    except (AttributeError, TypeError, ValueError):  # not arrays, or unhashable: no cache
        key = run = None
    if run is None:
        run = remember(_PLANS, key, plan(image, kernel, out, taps, tx, ty, v, pad, chunks,
                                         min_blocks, sync))
    k, H, W = run
    k(flat(image), flat(out), H, W)
    return out


@launcher
def filter2d_tiled(image, kernel, out):
    """Tiled 2-D filter ('same' zero padding, odd filter sizes), filter in constant memory."""
    return launch(image, kernel, out, **TILE)


# For PTX reports: the default tile with a 3x3 Gaussian.
GAUSS3 = np.array([[1, 2, 1], [2, 4, 2], [1, 2, 1]], np.float32) / 16
KERNEL = make_kernel(GAUSS3, **TILE)
SIGNATURE = "(float32[::1], float32[::1], int32, int32)"
