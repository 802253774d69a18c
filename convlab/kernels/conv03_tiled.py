"""Ladder step 3: the coalesced kernel of step 2, reading from shared-memory tiles.

The naive kernels read every input value R*S*K times and every filter tap P*Q*N times
from global memory. Here a block of TX x TY threads computes a TX x TY tile of output
pixels for a block of KPT output channels of one image, and walks over the input
channels CB at a time:

1. all threads copy the input tile (the output tile's receptive field: the tile plus
   its halo, (TY-1)*stride + (R-1)*dilation + 1 rows) for CB channels, and the KPT x CB
   x R x S filter taps, from global into shared memory;
2. ``cuda.syncthreads()``: nobody reads the tiles before everybody has written them;
3. every thread computes its pixel for the KPT output channels from shared memory (the
   taps are read by all threads of a warp at one address: a broadcast; KPT of them
   side by side, so four come in one 128-bit read);
4. ``cuda.syncthreads()`` again, before the next channel block overwrites the tiles.

Threads whose pixel lies outside the output (the last tiles of an odd-sized image)
still help load and still reach every ``syncthreads``; they only skip the store.

Shared arrays need their size at compile time, and the tile depends on the filter size,
stride and dilation, so `make_kernel` compiles (and caches) one kernel per combination.
Index arithmetic is 32-bit and unsigned where it indexes (lesson 04's rule).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32, uint32

from ._blocking import SMEM_ALIGN, flat, unroll, unrolled
from ._launch import Unsupported, ceil_div, direct_launch_args, launcher

# Output channels per thread and input channels per shared-memory stage.
TILE = dict(kpt=1, cb=4)
# Tile widths x heights to choose from (`fit_tile`): the one that idles fewest threads.
TILE_SHAPES = ((32, 4), (32, 8), (28, 7), (16, 8), (16, 16), (14, 14), (8, 16))
SHARED_LIMIT = 48 * 1024  # bytes of static shared memory per block

_CACHE: dict = {}



def tile_shapes(R, S, sh, sw, dh, dw, tx, ty, kpt, cb, pix=1):
    """(rows, columns) of the input tile of a tx x (ty*pix) output tile, and the
    shared-memory bytes for cb channels."""
    HI = (ty * pix - 1) * sh + (R - 1) * dh + 1
    WI = (tx - 1) * sw + (S - 1) * dw + 1
    return HI, WI, 4 * cb * (HI * WI + R * S * kpt)


def fit_tile(P: int, Q: int, shapes=TILE_SHAPES) -> tuple[int, int]:
    """The (tx, ty) of `shapes` that idles the fewest threads on a P x Q output.

    Ties go to the earlier (wider) shape: wide rows keep the loads coalesced.
    """
    def waste(shape):
        tx, ty = shape
        return ceil_div(Q, tx) * tx * ceil_div(P, ty) * ty / (P * Q)

    return min(shapes, key=waste)


def make_kernel(R, S, sh, sw, dh, dw, tx=32, ty=8, kpt=4, cb=4):
    """Compile (once) the tiled kernel for this filter size, stride, dilation and tile."""
    key = (R, S, sh, sw, dh, dw, tx, ty, kpt, cb)
    if key in _CACHE:
        return _CACHE[key]
    HI, WI, nbytes = tile_shapes(R, S, sh, sw, dh, dw, tx, ty, kpt, cb)
    if nbytes > SHARED_LIMIT:
        raise Unsupported(f"conv2d_tiled: tiles of {nbytes} bytes exceed {SHARED_LIMIT} bytes "
                          "of shared memory")
    RS = R * S
    NT = tx * ty
    XT = HI * WI  # one channel of the input tile
    NX = cb * XT  # floats of input tile
    NW = cb * RS * kpt  # floats of filter tile
    NLX = -(-NX // NT)  # input loads per thread
    NLW = -(-NW // NT)  # filter loads per thread
    # unsigned constants for the inner loops: a range over an unsigned value has an
    # unsigned counter, and unsigned indices need no negative-index check
    U = np.uint32
    Ru, Su, KPTu, XTu, DHWI, DWu = U(R), U(S), U(kpt), U(XT), U(dh * WI), U(dw)

    def conv2d_tiled_kernel(x, w, y, C, H, W, K, P, Q, sh_, sw_, ph, pw, dh_, dw_):
        # x, w, y flat (NCHW, KCRS, NKPQ); sizes int32; stride and dilation are compiled in
        xs = cuda.shared.array(NX, float32)  # [c][row][col]
        ws = cuda.shared.array(NW, float32, SMEM_ALIGN)  # [c][r][s][k]: taps side by side
        t = uint32(cuda.threadIdx.y * tx + cuda.threadIdx.x)
        ntq = (Q + (tx - 1)) // tx
        tile_p = int32(cuda.blockIdx.x) // ntq
        tile_q = int32(cuda.blockIdx.x) - tile_p * ntq
        k0 = int32(cuda.blockIdx.y * kpt)
        n = int32(cuda.blockIdx.z)
        p = int32(tile_p * ty + cuda.threadIdx.y)
        q = int32(tile_q * tx + cuda.threadIdx.x)
        h0 = int32(tile_p * ty * sh - ph)  # input row of the tile's first element
        w0 = int32(tile_q * tx * sw - pw)
        acc = cuda.local.array(kpt, float32)
        for kk in range(kpt):
            acc[kk] = float32(0.0)
        xv = cuda.local.array(NLX, float32)
        wv = cuda.local.array(NLW, float32)
        base = uint32(cuda.threadIdx.y * (sh * WI) + cuda.threadIdx.x * sw)
        for c0 in range(0, C, cb):
            # 1. global -> registers (all loads in flight together), then -> shared
            for it in range(NLX):
                i = t + it * NT
                val = float32(0.0)
                if i < NX:
                    c = i // XT
                    rem = i - c * XT
                    rr = rem // WI
                    gc = int32(c0 + c)
                    gh = int32(h0 + rr)
                    gw = int32(w0 + (rem - rr * WI))
                    if gc < C and 0 <= gh < H and 0 <= gw < W:
                        val = x[uint32(((n * C + gc) * H + gh) * W + gw)]
                xv[it] = val
            for it in range(NLW):
                i = t + it * NT
                val = float32(0.0)
                if i < NW:
                    kk = i // (cb * RS)  # s fastest: contiguous runs of w in global
                    rem = i - kk * (cb * RS)
                    c = rem // RS
                    gk = int32(k0 + kk)
                    gc = int32(c0 + c)
                    if gk < K and gc < C:
                        val = w[uint32((gk * C + gc) * RS + (rem - c * RS))]
                wv[it] = val
            for it in range(NLX):
                i = t + it * NT
                if i < NX:
                    xs[i] = xv[it]
            for it in range(NLW):
                i = t + it * NT
                if i < NW:
                    kk = i // (cb * RS)
                    rem = i - kk * (cb * RS)
                    ws[rem * kpt + kk] = wv[it]
            cuda.syncthreads()  # 2. the tiles are complete
            # 3. KPT outputs from shared memory
            for c in unroll(cb):
                for r in unroll(R):
                    for s in unroll(S):
                        a = xs[base + c * XTu + r * DHWI + s * DWu]
                        wb = ((c * Ru + r) * Su + s) * KPTu
                        for kk in range(KPTu):
                            acc[kk] += a * ws[wb + kk]
            cuda.syncthreads()  # 4. everyone is done reading before the next stage
        if p < P and q < Q:
            for kk in range(kpt):
                k = k0 + kk
                if k < K:
                    y[uint32(((n * K + k) * P + p) * Q + q)] = acc[kk]

    kernel = cuda.jit(unrolled(conv2d_tiled_kernel))
    _CACHE[key] = kernel
    return kernel


def launch(x, w, out, stride=1, padding=0, dilation=1, groups=1, *, tx=None, ty=None, kpt=4,
           cb=4):
    """Run the tiled conv with an explicit tile (tx, ty None: fitted by `fit_tile`)."""
    p, args = direct_launch_args("conv2d_tiled", x, w, out, stride, padding, dilation, groups)
    if tx is None or ty is None:
        tx, ty = fit_tile(p.P, p.Q)
    (sh, sw), (dh, dw) = p.stride, p.dilation
    _, _, nbytes = tile_shapes(p.R, p.S, sh, sw, dh, dw, tx, ty, kpt, 1)
    cb = min(cb, SHARED_LIMIT // nbytes)  # fewer channels per stage for big receptive fields
    if cb < 1:
        raise Unsupported(f"conv2d_tiled: one channel of a {tx}x{ty} tile with a {p.R}x{p.S} "
                          f"filter, stride {p.stride}, dilation {p.dilation} needs {nbytes} "
                          f"bytes of shared memory (limit {SHARED_LIMIT})")
    grid = (ceil_div(p.P, ty) * ceil_div(p.Q, tx), ceil_div(p.K, kpt), p.N)
    k = make_kernel(p.R, p.S, sh, sw, dh, dw, tx, ty, kpt, cb)
    k[grid, (tx, ty)](flat(x), flat(w), flat(out), *args)
    return out


@launcher
def conv2d_tiled(x, w, out, stride=1, padding=0, dilation=1, groups=1):
    """Input tile + halo and a block of filters in shared memory; KPT filters per thread."""
    return launch(x, w, out, stride, padding, dilation, groups, **TILE)


# For PTX reports: the 28x7 tile, 3x3 filter, stride 1.
KERNEL = make_kernel(3, 3, 1, 1, 1, 1, 28, 7, **TILE)
SIGNATURE = ("(float32[::1], float32[::1], float32[::1], int32, int32, int32, int32, int32, "
             "int32, int32, int32, int32, int32, int32, int32)")
