"""GEMM step 5: 16-byte global loads.

Built on `gemm04_double_buffered` (same tiles, warp tiling, unrolled k-loop, two shared
buffers); what changes is how a slab travels from global memory to registers.

1. One load instruction fetches four neighbouring floats (16 bytes, ``ld.global.v4.f32``):
   a quarter of the load instructions, and of the address arithmetic feeding them. Numba
   has no ``float4``; `load4` writes the 16-byte load in a few lines of LLVM IR through
   Numba's extension API (``numba.cuda.extending.intrinsic``).
2. A 16-byte load must start on a 16-byte boundary: rows of A and B a multiple of four
   floats long, arrays that start aligned. Other shapes run a second build of the same
   kernel with four 4-byte loads in place of each 16-byte one (libraries do the same:
   cuBLAS names its kernels by alignment, ``align4``).
3. No test in the slab loop. The one ragged slab (K not a multiple of BK) is the first:
   slab s covers k in [s·BK - shift, (s+1)·BK - shift), so only slab 0, loaded before the
   loop, has positions to zero (k < 0). Load offsets are 32-bit, computed once, with rows
   of A past M and columns of B past N clamped (they feed outputs that are never stored).
   The loads of slab t+2 start right after the barrier that ends slab t, so all of slab
   t+1's FMAs hide their latency.

``make_kernel(BM, BN, BK, TM, TN, min_blocks, wide)`` builds one kernel; `make_launcher`
takes a wide and a narrow build and picks per call. The module's kernel keeps gemm04's 8x8
outputs per thread and BK = 16 on 128x128 tiles (256 threads): with fewer registers for
addresses (127), two such blocks fit on an SM.
"""

from llvmlite import ir
from numba import cuda, float32, types, uint32, uint64

from ..runtime import is_simulator
from ._blocking import (
    FLAT_GEMM_SIGNATURE,
    SMEM_ALIGN,
    flat,
    gemm_grid,
    gemm_launch_params,
    jit_options,
    nothing_to_launch,
    unroll,
    unrolled,
)
from ._blocking import log2 as _log2
from ._launch import Unsupported, device_pointer, launcher

SIM = is_simulator()

if SIM:
    def load4(array, index):
        """array[index : index + 4] as a tuple (the simulator runs kernels as Python)."""
        i = int(index)
        return array[i], array[i + 1], array[i + 2], array[i + 3]
else:
    from numba.cuda.extending import intrinsic

    @intrinsic
    def load4(typingctx, array, index):
        """array[index : index + 4] as a tuple of float32, in one 16-byte load.

        array: 1-D C-contiguous float32 whose data starts 16-byte aligned; index: an
        unsigned integer, a multiple of 4 (the caller guarantees both).
        """
        if not (isinstance(array, types.Array) and array.ndim == 1
                and array.dtype == types.float32 and isinstance(index, types.Integer)):
            return None
        sig = types.UniTuple(types.float32, 4)(array, index)

        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, value=args[0]).data
            i = context.cast(builder, args[1], sig.args[1], types.uint64)
            vec_t = ir.VectorType(ir.FloatType(), 4)
            vec = builder.load(builder.bitcast(builder.gep(data, [i]), vec_t.as_pointer()),
                               align=16)
            return context.make_tuple(builder, sig.return_type, [
                builder.extract_element(vec, ir.Constant(ir.IntType(32), j))
                for j in range(4)])

        return sig, codegen


def make_kernel(BM=128, BN=64, BK=16, TM=8, TN=8, min_blocks=None, wide=True):
    """Double-buffered, warp-tiled GEMM kernel with 16-byte loads (or 4x4-byte: wide=False)."""
    TX, TY = BN // TN, BM // TM
    NT = TX * TY
    HM, HN = TM // 2, TN // 2
    if TX < 8 or TY < 4 or NT < 32:
        raise ValueError("warp tiling needs at least 8x4 threads")
    for v, what in ((BM, "BM"), (BN, "BN"), (BK, "BK"), (TM, "TM"), (TN, "TN")):
        _log2(v, what)  # masks replace % and //: powers of two only
    if BK < 4:
        raise ValueError("BK must be at least 4 (one 16-byte load along k)")
    WX = TX // 8  # warps along the columns of the tile
    LWX = _log2(WX, "warps along N")
    AP = BM + 4
    CA, CB = BK // 4, BN // 4  # 4-float chunks per row of the A slab and of the B slab
    LCA, LCB = _log2(CA), _log2(CB)
    A4, B4 = BM * CA // NT, BK * CB // NT  # chunks each thread loads per slab
    if A4 < 1 or B4 < 1 or NT % CA or NT % CB:
        raise ValueError(f"{NT} threads cannot share the {BM}x{BK} and {BK}x{BN} slabs in "
                         "4-float chunks")
    RA, RB = NT // CA, NT // CB  # rows between one thread's chunks
    NA, NB = 4 * A4, 4 * B4
    NOA, NOB = (A4, B4) if wide else (NA, NB)  # load offsets per thread
    HALF_M, HALF_N = BM // 2, BN // 2
    WIDE = wide

    def gemm_wide_loads_kernel(a, b, c, M, N, K):
        As = cuda.shared.array((2, BK, AP), float32, alignment=SMEM_ALIGN)
        Bs = cuda.shared.array((2, BK, BN), float32, alignment=SMEM_ALIGN)
        tid = cuda.threadIdx.x & (NT - 1)
        lane, warp = tid & 31, tid >> 5
        tx = ((warp & (WX - 1)) << 3) | (lane & 7)  # a warp is an 8x4 patch of threads
        ty = ((warp >> LWX) << 2) | (lane >> 3)
        m0 = (cuda.blockIdx.y & 0xFFFF) * BM
        n0 = (cuda.blockIdx.x & 0x7FFFFFFF) * BN
        am, bn = ty * HM, tx * HN
        row_a, k_a = tid >> LCA, (tid & (CA - 1)) << 2  # this thread's chunks of A: row, k
        k_b, col_b = tid >> LCB, (tid & (CB - 1)) << 2  # and of B: k, column
        n_slabs = (K + BK - 1) // BK
        shift = n_slabs * BK - K  # slab s starts at k = s * BK - shift

        acc = cuda.local.array((TM, TN), float32)
        af = cuda.local.array(TM, float32)
        bf = cuda.local.array(TN, float32)
        ra = cuda.local.array(NA, float32)  # the slab in flight
        rb = cuda.local.array(NB, float32)
        a_off = cuda.local.array(NOA, uint32)
        b_off = cuda.local.array(NOB, uint32)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = float32(0.0)

        # slab 0, the ragged one (k < 0 reads as zero) -> buffer 0
        for ld in range(A4):
            row = uint64(min(m0 + row_a + ld * RA, M - 1)) * uint64(K)
            if WIDE:
                v0 = v1 = v2 = v3 = float32(0.0)
                if k_a >= shift:
                    v0, v1, v2, v3 = load4(a, row + uint64(k_a - shift))
                ra[4 * ld], ra[4 * ld + 1], ra[4 * ld + 2], ra[4 * ld + 3] = v0, v1, v2, v3
            else:
                for j in range(4):
                    v = float32(0.0)
                    if k_a + j >= shift:
                        v = a[row + uint64(k_a + j - shift)]
                    ra[4 * ld + j] = v
        for ld in range(B4):
            kb = k_b + ld * RB - shift
            if WIDE:
                v0 = v1 = v2 = v3 = float32(0.0)
                if kb >= 0:
                    v0, v1, v2, v3 = load4(b, uint64(kb) * uint64(N)
                                           + uint64(min(n0 + col_b, N - 4)))
                rb[4 * ld], rb[4 * ld + 1], rb[4 * ld + 2], rb[4 * ld + 3] = v0, v1, v2, v3
            else:
                for j in range(4):
                    v = float32(0.0)
                    if kb >= 0:
                        v = b[uint64(kb) * uint64(N) + uint64(min(n0 + col_b + j, N - 1))]
                    rb[4 * ld + j] = v
        for ld in range(A4):
            for j in range(4):
                As[0, k_a + j, row_a + ld * RA] = ra[4 * ld + j]
        for ld in range(B4):
            for j in range(4):
                Bs[0, k_b + ld * RB, col_b + j] = rb[4 * ld + j]

        # Offsets of the whole slabs 1, 2, ... from their first k. Rows of A past M and
        # columns of B past N are clamped (they feed outputs that are never stored); so
        # are k past K, which only K < BK reaches, in loads that are never used.
        for ld in range(A4):
            row = uint32(min(m0 + row_a + ld * RA, M - 1)) * uint32(K)
            if WIDE:
                a_off[ld] = row + uint32(min(k_a, K - 4))
            else:
                for j in range(4):
                    a_off[4 * ld + j] = row + uint32(min(k_a + j, K - 1))
        for ld in range(B4):
            krow = uint32(min(k_b + ld * RB, K - 1)) * uint32(N)
            if WIDE:
                b_off[ld] = krow + uint32(min(n0 + col_b, N - 4))
            else:
                for j in range(4):
                    b_off[4 * ld + j] = krow + uint32(min(n0 + col_b + j, N - 1))
        cuda.syncthreads()

        # Each step multiplies slab t while slab t+1 is in flight in registers, stores it to
        # the other buffer, waits, then starts the loads of slab t+2 (past the end, the last
        # slab again: harmless), so the whole next slab's FMAs hide their latency. Where
        # they stand matters: the compiler moves a load towards its use within a block of
        # straight-line code. At the top of the body, ptxas places them after two thirds of
        # the FMAs; behind a branch, LLVM moves them after all of them; at the end of a
        # branch-free body, nothing can move them past the loop's back edge.
        last = n_slabs - 1
        stride_b = uint64(N)
        k0 = uint64(max(min(1, last) * BK - shift, 0))
        for ld in range(A4):
            if WIDE:
                ra[4 * ld], ra[4 * ld + 1], ra[4 * ld + 2], ra[4 * ld + 3] = load4(
                    a, uint64(a_off[ld]) + k0)
            else:
                for j in range(4):
                    ra[4 * ld + j] = a[uint64(a_off[4 * ld + j]) + k0]
        for ld in range(B4):
            if WIDE:
                rb[4 * ld], rb[4 * ld + 1], rb[4 * ld + 2], rb[4 * ld + 3] = load4(
                    b, uint64(b_off[ld]) + k0 * stride_b)
            else:
                for j in range(4):
                    rb[4 * ld + j] = b[uint64(b_off[4 * ld + j]) + k0 * stride_b]
        for t in range(n_slabs):
            buf = t & 1
            for kk in unroll(BK):
                for i in range(HM):  # four 128-bit shared reads
                    af[i] = As[buf, kk, am + i]
                    af[HM + i] = As[buf, kk, HALF_M + am + i]
                for j in range(HN):
                    bf[j] = Bs[buf, kk, bn + j]
                    bf[HN + j] = Bs[buf, kk, HALF_N + bn + j]
                for i in range(TM):  # the 8x8 outer product
                    for j in range(TN):
                        acc[i, j] += af[i] * bf[j]
            nb = buf ^ 1
            for ld in range(A4):
                for j in range(4):
                    As[nb, k_a + j, row_a + ld * RA] = ra[4 * ld + j]
            for ld in range(B4):
                for j in range(4):
                    Bs[nb, k_b + ld * RB, col_b + j] = rb[4 * ld + j]
            cuda.syncthreads()
            k0 = uint64(max(min(t + 2, last) * BK - shift, 0))
            for ld in range(A4):
                if WIDE:
                    ra[4 * ld], ra[4 * ld + 1], ra[4 * ld + 2], ra[4 * ld + 3] = load4(
                        a, uint64(a_off[ld]) + k0)
                else:
                    for j in range(4):
                        ra[4 * ld + j] = a[uint64(a_off[4 * ld + j]) + k0]
            for ld in range(B4):
                if WIDE:
                    rb[4 * ld], rb[4 * ld + 1], rb[4 * ld + 2], rb[4 * ld + 3] = load4(
                        b, uint64(b_off[ld]) + k0 * stride_b)
                else:
                    for j in range(4):
                        rb[4 * ld + j] = b[uint64(b_off[4 * ld + j]) + k0 * stride_b]

        for i in range(TM):
            row = m0 + (i // HM) * HALF_M + am + i % HM
            if row < M:
                for j in range(TN):
                    col = n0 + (j // HN) * HALF_N + bn + j % HN
                    if col < N:
                        c[row * N + col] = acc[i, j]

    kernel = cuda.jit(**jit_options(NT, min_blocks))(unrolled(gemm_wide_loads_kernel))
    kernel.tile = dict(BM=BM, BN=BN, BK=BK, TM=TM, TN=TN, threads=NT, min_blocks=min_blocks,
                       wide=wide)
    return kernel


def takes_wide_loads(a, b) -> bool:
    """Whether every row of a and b starts on a 16-byte boundary (16-byte loads allowed)."""
    (_, K), (_, N) = a.shape, b.shape
    if K % 4 or N % 4:
        return False
    # the simulator's arrays have no device address (and its load4 needs no alignment)
    return SIM or (device_pointer(a) % 16 == 0 and device_pointer(b) % 16 == 0)


def make_launcher(wide_kernel, narrow_kernel, name="gemm_wide_loads"):
    """A launcher that runs the wide build when `takes_wide_loads`, else the narrow one."""
    t = wide_kernel.tile

    @launcher
    def gemm_wide_loads(a, b, out):
        """out = a @ b (device arrays, float32): 16-byte loads where rows are aligned."""
        M, N, K = gemm_launch_params(name, a, b, out)
        if max(M * K, K * N) >= 2**32:
            raise Unsupported(f"{name}: 32-bit load offsets: a and b must each have fewer "
                              f"than 2^32 elements (a is {M}x{K}, b is {K}x{N})")
        if nothing_to_launch(out, M, N, K):
            return out
        kernel = wide_kernel if takes_wide_loads(a, b) else narrow_kernel
        grid = gemm_grid(M, N, t["BM"], t["BN"])
        kernel[grid, t["threads"]](flat(a), flat(b), flat(out), M, N, K)
        return out

    gemm_wide_loads.kernel = wide_kernel
    gemm_wide_loads.narrow_kernel = narrow_kernel
    gemm_wide_loads.__name__ = name
    return gemm_wide_loads


def make(BM=128, BN=64, BK=16, TM=8, TN=8, min_blocks=None, name="gemm_wide_loads"):
    """The launcher for one tile: its wide and narrow builds."""
    return make_launcher(make_kernel(BM, BN, BK, TM, TN, min_blocks, wide=True),
                         make_kernel(BM, BN, BK, TM, TN, min_blocks, wide=False), name)


TILE = dict(BM=128, BN=128, BK=16, TM=8, TN=8, min_blocks=2)
gemm_wide_loads = make(**TILE)
KERNEL = gemm_wide_loads.kernel  # the 16-byte build
SIGNATURE = FLAT_GEMM_SIGNATURE
