"""Ladder step 4: the tiled kernel of step 3 with register blocking.

Step 3 gives each thread one output pixel for one filter (its default, KPT = 1): per tap
it reads one input value and one filter value from shared memory for one multiply-add.
Here a thread computes PIX output *rows* of its column for KPT filters: a PIX x KPT block
of sums held in registers, updated in outer-product form (PIX input values times KPT
filter values per tap):

- one filter value read from shared memory (four at once: KPT/4 128-bit vectors) now
  feeds PIX pixels instead of one, and one input value KPT filters;
- at stride 1 the PIX rows' input windows overlap: an R-tap column needs PIX + R - 1
  input values, not PIX * R; the loops run over compile-time sizes, so they unroll and
  the compiler reads each shared value once and reuses it from a register;
- the threads of a warp still take neighbouring columns: conflict-free shared reads.

Everything else (tiles + halo staged per channel block, two ``syncthreads`` per stage,
32-bit unsigned indexing) is step 3's. The block's output tile is TX x (TY*PIX).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32, uint32

from ._blocking import SMEM_ALIGN, flat, unroll, unrolled
from ._launch import Unsupported, ceil_div, direct_launch_args, launcher
from .conv03_tiled import SHARED_LIMIT, fit_tile, tile_shapes

# Output channels and rows per thread, input channels per shared-memory stage.
TILE = dict(kpt=16, pix=4, cb=2)
# Thread-tile widths x heights to choose from; the output tile is tx x (ty * pix).
TILE_SHAPES = ((32, 2), (32, 4), (28, 7), (28, 2), (16, 4), (16, 8), (14, 7), (8, 8))
_CACHE: dict = {}


def make_kernel(R, S, sh, sw, dh, dw, tx=32, ty=4, kpt=8, pix=4, cb=4):
    """Compile (once) the register-blocked kernel for this filter, stride, dilation, tile."""
    key = (R, S, sh, sw, dh, dw, tx, ty, kpt, pix, cb)
    if key in _CACHE:
        return _CACHE[key]
    HI, WI, nbytes = tile_shapes(R, S, sh, sw, dh, dw, tx, ty, kpt, cb, pix)
    if nbytes > SHARED_LIMIT:
        raise Unsupported(f"conv2d_register_blocked: tiles of {nbytes} bytes exceed "
                          f"{SHARED_LIMIT} bytes of shared memory")
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
    PIXu, SHWI = U(pix), U(sh * WI)

    def conv2d_register_blocked_kernel(x, w, y, C, H, W, K, P, Q, sh_, sw_, ph, pw, dh_, dw_):
        # x, w, y flat (NCHW, KCRS, NKPQ); sizes int32; stride and dilation are compiled in
        xs = cuda.shared.array(NX, float32)  # [c][row][col]
        ws = cuda.shared.array(NW, float32, SMEM_ALIGN)  # [c][r][s][k]: taps side by side
        t = uint32(cuda.threadIdx.y * tx + cuda.threadIdx.x)
        ntq = (Q + (tx - 1)) // tx
        tile_p = int32(cuda.blockIdx.x) // ntq  # tiles of tx x (ty * pix) outputs
        tile_q = int32(cuda.blockIdx.x) - tile_p * ntq
        k0 = int32(cuda.blockIdx.y * kpt)
        n = int32(cuda.blockIdx.z)
        p = int32((tile_p * ty + cuda.threadIdx.y) * pix)  # the first of the thread's rows
        q = int32(tile_q * tx + cuda.threadIdx.x)
        h0 = int32(tile_p * ty * pix * sh - ph)  # input row of the tile's first element
        w0 = int32(tile_q * tx * sw - pw)
        acc = cuda.local.array((pix, kpt), float32)
        for i in range(pix):
            for kk in range(kpt):
                acc[i, kk] = float32(0.0)
        a = cuda.local.array(pix, float32)
        b = cuda.local.array(kpt, float32)
        xv = cuda.local.array(NLX, float32)
        wv = cuda.local.array(NLW, float32)
        base = uint32(cuda.threadIdx.y * (pix * sh * WI) + cuda.threadIdx.x * sw)
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
            # 3. PIX x KPT outputs from shared memory, an outer product per tap
            for c in unroll(cb):
                for r in unroll(R):
                    for s in unroll(S):
                        for i in range(PIXu):
                            a[i] = xs[base + c * XTu + i * SHWI + r * DHWI + s * DWu]
                        wb = ((c * Ru + r) * Su + s) * KPTu
                        for kk in range(KPTu):
                            b[kk] = ws[wb + kk]
                        for i in range(PIXu):
                            for kk in range(KPTu):
                                acc[i, kk] += a[i] * b[kk]
            cuda.syncthreads()  # 4. everyone is done reading before the next stage
        if q < Q:
            for i in range(pix):
                if p + i < P:
                    for kk in range(kpt):
                        k = k0 + kk
                        if k < K:
                            y[uint32(((n * K + k) * P + p + i) * Q + q)] = acc[i, kk]

    kernel = cuda.jit(unrolled(conv2d_register_blocked_kernel))
    _CACHE[key] = kernel
    return kernel


def launch(x, w, out, stride=1, padding=0, dilation=1, groups=1, *, tx=None, ty=None, kpt=8,
           pix=4, cb=4):
    """Run the register-blocked conv with an explicit tile (tx, ty None: fitted)."""
    p, args = direct_launch_args("conv2d_register_blocked", x, w, out, stride, padding,
                                 dilation, groups)
    if tx is None or ty is None:
        tx, ty = fit_tile(ceil_div(p.P, pix), p.Q, TILE_SHAPES)
    (sh, sw), (dh, dw) = p.stride, p.dilation
    _, _, nbytes = tile_shapes(p.R, p.S, sh, sw, dh, dw, tx, ty, kpt, 1, pix)
    cb = min(cb, SHARED_LIMIT // nbytes)  # fewer channels per stage for big receptive fields
    if cb < 1:
        raise Unsupported(f"conv2d_register_blocked: one channel of a {tx}x{ty} tile with a "
                          f"{p.R}x{p.S} "
                          f"filter, stride {p.stride}, dilation {p.dilation} needs {nbytes} "
                          f"bytes of shared memory (limit {SHARED_LIMIT})")
    grid = (ceil_div(p.P, ty * pix) * ceil_div(p.Q, tx), ceil_div(p.K, kpt), p.N)
    k = make_kernel(p.R, p.S, sh, sw, dh, dw, tx, ty, kpt, pix, cb)
    k[grid, (tx, ty)](flat(x), flat(w), flat(out), *args)
    return out


@launcher
def conv2d_register_blocked(x, w, out, stride=1, padding=0, dilation=1, groups=1):
    """The tiled conv with PIX rows x KPT filters of outputs per thread, in registers."""
    return launch(x, w, out, stride, padding, dilation, groups, **TILE)


# For PTX reports: the 28x7 thread tile, 3x3 filter, stride 1.
KERNEL = make_kernel(3, 3, 1, 1, 1, 1, 28, 7, **TILE)
SIGNATURE = ("(float32[::1], float32[::1], float32[::1], int32, int32, int32, int32, int32, "
             "int32, int32, int32, int32, int32, int32, int32)")
