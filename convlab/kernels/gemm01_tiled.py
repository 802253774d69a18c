"""The GEMM of the im2col path, tiled through shared memory.

C (M, N) = A (M, K) @ B (K, N). A block of T x T threads computes a T x T tile of C,
one element per thread, walking along K one T-wide slab at a time: all threads copy a
T x T tile of A and one of B into shared memory (each global value is then read once
per block instead of T times), ``syncthreads``, T multiply-adds from shared memory,
``syncthreads`` again before the next slab overwrites the tiles. Threads off the edge of
C (odd M, N) load zeros and skip the store; a K that is not a multiple of T is padded
with zeros in the last slab.

In the im2col path (lesson 02) A is the filter matrix (K_out, C*R*S) and B the column
matrix (C*R*S, N*P*Q): thread x walks columns of B and C, so the loads of B and the
stores of C are coalesced and the reads of the A tile are broadcasts.

Launcher signature (device arrays, float32)::

    gemm_<name>(a (M, K), b (K, N), out (M, N)) -> out
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32, uint32

from ._blocking import gemm_launch_params, nothing_to_launch
from ._launch import Unsupported, ceil_div, launcher

T = 32  # tile side (threads per block: T*T); 16 and 32 are built, see make_kernel

_CACHE: dict = {}


def make_kernel(tile: int = T):
    """Compile (once) the tiled GEMM for a tile side of `tile`."""
    if tile in _CACHE:
        return _CACHE[tile]
    TT = tile * tile
    Tu = np.uint32(tile)

    @cuda.jit
    def gemm_tiled_kernel(a, b, c, M, N, K):
        # a, b, c flattened to 1-D (row-major); M, N, K int32
        As = cuda.shared.array(TT, float32)  # [row][k]
        Bs = cuda.shared.array(TT, float32)  # [k][col]
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row = int32(cuda.blockIdx.y * tile + ty)
        col = int32(cuda.blockIdx.x * tile + tx)
        mine = uint32(ty * tile + tx)  # this thread's slot in both tiles
        acc = float32(0.0)
        for k0 in range(0, K, tile):
            ka = int32(k0 + tx)  # column of A this thread loads
            kb = int32(k0 + ty)  # row of B this thread loads
            va = float32(0.0)
            vb = float32(0.0)
            if row < M and ka < K:
                va = a[uint32(row * K + ka)]
            if kb < K and col < N:
                vb = b[uint32(kb * N + col)]
            As[mine] = va
            Bs[mine] = vb
            cuda.syncthreads()  # both tiles complete
            arow = uint32(ty * tile)
            for kk in range(Tu):
                acc += As[arow + kk] * Bs[kk * Tu + tx]
            cuda.syncthreads()  # all reads done before the next slab is written
        if row < M and col < N:
            c[uint32(row * N + col)] = acc

    _CACHE[tile] = gemm_tiled_kernel
    return gemm_tiled_kernel


def _check(name, a, b, out):
    M, N, K = gemm_launch_params(name, a, b, out)
    if max(M * K, K * N, M * N) >= 2**31:
        raise Unsupported(f"{name}: matrices of 2**31 elements or more need 64-bit indices")
    return M, N, K


def launch(a, b, out, tile: int = T):
    M, N, K = _check("gemm_tiled", a, b, out)
    if tile not in (8, 16, 32):
        raise Unsupported(f"gemm_tiled: tile {tile} (8, 16 or 32)")
    if nothing_to_launch(out, M, N, K):
        return out
    k = make_kernel(tile)
    k[(ceil_div(N, tile), ceil_div(M, tile)), (tile, tile)](
        a.reshape(M * K), b.reshape(K * N), out.reshape(M * N), np.int32(M), np.int32(N),
        np.int32(K))
    return out


@launcher
def gemm_tiled(a, b, out):
    """C = A @ B with 32 x 32 shared-memory tiles, one output per thread."""
    return launch(a, b, out, T)


@launcher
def gemm_tiled16(a, b, out):
    """C = A @ B with 16 x 16 shared-memory tiles, one output per thread."""
    return launch(a, b, out, 16)


KERNEL = make_kernel(T)
SIGNATURE = "(float32[::1], float32[::1], float32[::1], int32, int32, int32)"
