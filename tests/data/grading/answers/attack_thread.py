# ruff: noqa
"""Family "thread": a right tiled kernel, and a thread of the answer's own still running
during the graded GPU calls (one that could rewrite the replies the grader reads)."""

# EXERCISE: fx.tiled
import threading as _th, time as _tm

_th.Thread(target=_tm.sleep, args=(600,), daemon=True).start()
TILE = 8   # outputs per block side
SMEM = 32  # side of the shared-memory input tile (the halo included)
KMAX = 32  # output channels one thread accumulates (in registers)


@cuda.jit
def conv2d_tiled_kernel(x, w, y, sh, sw, ph, pw):
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    K, P, Q = y.shape[1], y.shape[2], y.shape[3]
    C, R, S = w.shape[1], w.shape[2], w.shape[3]
    H, W = x.shape[2], x.shape[3]
    n = cuda.blockIdx.z
    p0, q0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    th, tw = (TILE - 1) * sh + R, (TILE - 1) * sw + S  # the tile with its halo
    h0, w0 = p0 * sh - ph, q0 * sw - pw  # its first input row and column
    tile = cuda.shared.array((SMEM, SMEM), float32)
    acc = cuda.local.array(KMAX, float32)
    for k in range(K):
        acc[k] = float32(0.0)
    for c in range(C):
        for i in range(ty, th, TILE):  # the block copies the tile together
            for j in range(tx, tw, TILE):
                h, col = h0 + i, w0 + j
                v = float32(0.0)
                if 0 <= h < H and 0 <= col < W:
                    v = x[n, c, h, col]
                tile[i, j] = v
        cuda.syncthreads()  # the whole tile is in shared memory
        for k in range(K):  # one tile load serves every output channel
            a = acc[k]
            for r in range(R):
                for s in range(S):
                    a += tile[ty * sh + r, tx * sw + s] * w[k, c, r, s]
            acc[k] = a
        cuda.syncthreads()  # everyone is done with the tile before the next channel
    p, q = p0 + ty, q0 + tx
    if p < P and q < Q:
        for k in range(K):
            y[n, k, p, q] = acc[k]


@launcher
def conv2d_tiled(x, w, out, stride=1, padding=0):
    p = conv_launch_params("conv2d_tiled", x, w, out, stride, padding, 1, 1,
                           supports=("stride", "padding"))
    (sh, sw), (ph, pw) = p.stride, p.padding
    if (TILE - 1) * sh + p.R > SMEM or (TILE - 1) * sw + p.S > SMEM:
        raise Unsupported(f"conv2d_tiled: the input tile does not fit in {SMEM}x{SMEM}")
    if p.K > KMAX:
        raise Unsupported(f"conv2d_tiled: at most {KMAX} output channels")
    grid = (ceil_div(p.Q, TILE), ceil_div(p.P, TILE), p.N)
    conv2d_tiled_kernel[grid, (TILE, TILE)](x, w, out, sh, sw, ph, pw)
