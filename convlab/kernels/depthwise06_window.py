"""Depthwise convolution, step 6: the window kernel in pure Numba.

`depthwise05_window_cuda` in Numba, same plan: thread t writes the V outputs of the
flattened y at t V .. t V + V - 1, and for each filter row loads the 16-byte vectors of the
flattened x that cover that row's taps of its V outputs (the output at flat index f reads x
at f + (r - PH) W + (s - PW), whatever its row). Numba has no ``float4``: the loads are
gemm05's `load4` intrinsic, the stores `store4`, its mirror (four floats inserted into an
LLVM vector, one store aligned to 16 bytes). Every window index is a Python constant of
the kernel's factory (`make_kernel` compiles one kernel per plane shape, filter, C and V),
so the window lives in registers.

Stride 1, "same" padding, odd filters up to 5 x 5; V outputs of one plane per thread
(`depthwise05_window_cuda.outputs_per_thread`); the 16-byte build where V is a multiple of
4 and both buffers start on 16 bytes, else a build with 4-byte loads and stores.

Launcher signature (device arrays, float32; w is (C, 1, R, S), groups = C)::

    conv2d_depthwise_window(x, w, out, stride=1, padding=(R // 2, S // 2), groups=C) -> out
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import cuda, float32, int32, types, uint32

from ..runtime import is_simulator
from ._blocking import flat, jit_options, unroll, unrolled
from ._launch import Unsupported, ceil_div, configured, device_pointer, launcher, planned_conv
from .depthwise01_direct import same_padding_params
from .depthwise05_window_cuda import MAX_SIZE, outputs_per_thread, window_runs
from .gemm05_wide_loads import load4

NAME = "conv2d_depthwise_window"
MAX_V = 8
# min_blocks 6 (launch bounds for six blocks of 256 threads per SM): faster than no bound on
# all three memory-bound layers of lesson 11 on an H100, by up to 3 points of the copy
DEFAULT = dict(v=4, threads=256, min_blocks=6)
SIM = is_simulator()

if SIM:
    def store4(array, index, v0, v1, v2, v3):
        """array[index : index + 4] = v0, v1, v2, v3 (the simulator runs kernels as Python)."""
        i = int(index)
        array[i], array[i + 1], array[i + 2], array[i + 3] = v0, v1, v2, v3
else:
    from numba.cuda.extending import intrinsic

    @intrinsic
    def store4(typingctx, array, index, v0, v1, v2, v3):
        """array[index : index + 4] = v0, v1, v2, v3 in one 16-byte store.

        array: 1-D C-contiguous float32 whose data starts 16-byte aligned; index: an
        integer, a multiple of 4 (the caller guarantees both).
        """
        if not (isinstance(array, types.Array) and array.ndim == 1
                and array.dtype == types.float32 and isinstance(index, types.Integer)
                and all(v == types.float32 for v in (v0, v1, v2, v3))):
            return None
        sig = types.void(array, index, v0, v1, v2, v3)

        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, value=args[0]).data
            i = context.cast(builder, args[1], sig.args[1], types.uint64)
            vec_t = ir.VectorType(ir.FloatType(), 4)
            vec = ir.Constant(vec_t, ir.Undefined)
            for j, v in enumerate(args[2:]):
                vec = builder.insert_element(vec, v, ir.Constant(ir.IntType(32), j))
            builder.store(vec, builder.bitcast(builder.gep(data, [i]), vec_t.as_pointer()),
                          align=16)
            return context.get_dummy_value()

        return sig, codegen


_CACHE: dict = {}


def make_kernel(H: int, W: int, R: int, S: int, C: int, v: int, wide: bool, threads: int,
                min_blocks: int | None = None):
    """Compile (once) the kernel for one plane shape, filter, channel count, V and build;
    min_blocks: launch bounds asking for that many blocks per SM (fewer registers)."""
    key = (H, W, R, S, C, v, wide, threads, min_blocks)
    if key in _CACHE:
        return _CACHE[key]
    lw = 4 if wide else 1
    if v % lw or (H * W) % v:
        raise Unsupported(f"{NAME}: V={v} must divide a plane of {H * W} floats"
                          + (" and be a multiple of 4 (16-byte build)" if wide else ""))
    PH, PW, HW, RS = R // 2, S // 2, H * W, R * S
    runs = window_runs(W, R, S, v, lw)
    # every vector the thread loads: its offset (in vectors) from the thread's first, and
    # where its floats go in the window; then, per output and tap, the window index
    VOFF = tuple(lo // lw + k for lo, n in runs for k in range(n))
    NVEC = len(VOFF)
    base, at = [], 0
    for lo, n in runs:
        base.append(at - lo)  # window index of flat offset 0 of row r's run
        at += n * lw
    WIN = at
    TAP = tuple(base[r] + o + (r - PH) * W + (s - PW)
                for o in range(v) for r in range(R) for s in range(S))
    VL = v // lw
    WRAPS = (W - 1 + v - 1) // W  # rows an output can sit below its thread's first
    WIDE = wide

    def depthwise_window_kernel(x, w, y, total):
        # x, y: (N*C*H*W,), w: (C*R*S,), flattened; total = N*C*H*W < 2**31. Every
        # `unroll` loop is written out (`_blocking.unrolled`): window indices are constants.
        # Numba widens int32 arithmetic to 64 bits; every index is cast back to int32 (or
        # divided as uint32) so that the compiler can keep it in one 32-bit register,
        # and array indices are unsigned (no test for negative indices).
        t = int32(int32(cuda.blockIdx.x) * int32(threads) + int32(cuda.threadIdx.x))
        f0 = int32(t * int32(v))
        if f0 >= total:
            return
        last = int32(uint32(total) // uint32(lw) - uint32(1))  # the last vector of x
        # 1. every load of the thread, written before the first multiply-add: the taps,
        # then the window
        plane = int32(uint32(f0) // uint32(HW))
        c = int32(uint32(plane) % uint32(C))
        taps = cuda.local.array(RS, float32)
        for i in unroll(RS):
            taps[i] = w[uint32(c * int32(RS) + int32(i))]
        win = cuda.local.array(WIN, float32)
        for j in unroll(NVEC):
            i = min(max(int32(t * int32(VL) + int32(VOFF[j])), int32(0)), last)  # into x
            if WIDE:
                win[4 * j], win[4 * j + 1], win[4 * j + 2], win[4 * j + 3] = load4(
                    x, int32(i * int32(4)))
            else:
                win[j] = x[uint32(i)]
        # 2. V outputs from registers, zero where a tap's row or column leaves the plane;
        # the last filter row first, as depthwise05_window_cuda. One division per thread:
        # output o sits at column q0 + o of row p0, wrapped into the rows below by compares
        # and selects; the bounds tests are `&` of compares, not `and` (which branches).
        pos0 = int32(f0 - plane * int32(HW))
        p0 = int32(uint32(pos0) // uint32(W))
        q0 = int32(pos0 - p0 * int32(W))
        out = cuda.local.array(v, float32)
        for o in unroll(v):
            p = p0
            q = int32(q0 + int32(o))
            for _k in unroll(WRAPS):
                wrap = q >= int32(W)
                q = int32(q - int32(W)) if wrap else q
                p = int32(p + int32(1)) if wrap else p
            acc = float32(0.0)
            for rr in unroll(R):
                pr = int32(p + int32(R - 1 - rr - PH))
                rok = (pr >= int32(0)) & (pr < int32(H))
                for ss in unroll(S):
                    qs = int32(q + int32(S - 1 - ss - PW))
                    ok = rok & (qs >= int32(0)) & (qs < int32(W))
                    a = win[TAP[(o * R + R - 1 - rr) * S + S - 1 - ss]]
                    acc += taps[(R - 1 - rr) * S + S - 1 - ss] * (a if ok else float32(0.0))
            out[o] = acc
        # 3. V / 4 stores of 16 bytes, or V of 4
        if WIDE:
            for k in unroll(v // 4):
                store4(y, int32(f0 + int32(4 * k)), out[4 * k], out[4 * k + 1], out[4 * k + 2],
                       out[4 * k + 3])
            return
        for o in unroll(v):
            y[uint32(f0 + int32(o))] = out[o]

    kernel = cuda.jit(unrolled(depthwise_window_kernel), **jit_options(threads, min_blocks))
    _CACHE[key] = kernel
    return kernel


def takes_wide(v: int, x, out) -> bool:
    """Whether the 16-byte build can run: V a multiple of 4, x and out on 16 bytes (the
    simulator's arrays have no device address; its load4 and store4 need no alignment)."""
    if v % 4:
        return False
    if SIM:
        return True
    return device_pointer(x) % 16 == 0 and device_pointer(out) % 16 == 0


_PLANS: dict = {}


def plan(x, w, out, stride=1, padding=1, dilation=1, groups=None, v=DEFAULT["v"],
         threads=DEFAULT["threads"], min_blocks=DEFAULT["min_blocks"], stream=0) -> tuple:
    """Check a launch and compile its kernel: (the configured kernel, int32 total, tiling)."""
    p = same_padding_params(NAME, x, w, out, stride, padding, dilation, groups, MAX_SIZE)
    if not (1 <= int(v) <= MAX_V and threads % 32 == 0 and 32 <= threads <= 1024
            and (min_blocks is None or 1 <= min_blocks * threads <= 2048)):
        raise Unsupported(f"{NAME}: bad tiling v={v} threads={threads} min_blocks={min_blocks} "
                          f"(v 1..{MAX_V}, threads a multiple of 32 up to 1024, at most 2048 "
                          "threads per SM)")
    v = outputs_per_thread(p.H, p.W, int(v))
    wide = takes_wide(v, x, out)
    k = make_kernel(p.H, p.W, p.R, p.S, p.C, v, wide, int(threads), min_blocks)
    total = p.N * p.C * p.H * p.W  # under 2**31 (depthwise_params)
    grid = ceil_div(ceil_div(total, v), threads)
    return (configured(k, grid, threads, stream), np.int32(total),
            dict(v=v, wide=wide, threads=int(threads), min_blocks=min_blocks))


def launch(x, w, out, stride=1, padding=1, dilation=1, groups=None, stream=0, **tiling):
    """Run the kernel with an explicit tiling (v, threads, min_blocks); the plan is kept per
    shapes, arguments, alignment and tiling."""
    kernel, total, _ = planned_conv(_PLANS, plan, x, w, out, (stride, padding, dilation, groups),
                                    {**DEFAULT, **tiling, "stream": stream})
    kernel(flat(x), flat(w), flat(out), total)
    return out


@launcher
def conv2d_depthwise_window(x, w, out, stride=1, padding=1, dilation=1, groups=None,
                            stream=0):
    """Depthwise conv (groups = C, w (C, 1, R, S)), stride 1, 'same' padding, up to 5x5."""
    return launch(x, w, out, stride, padding, dilation, groups, stream)


SIGNATURE = "(float32[::1], float32[::1], float32[::1], int32)"
KERNEL = make_kernel(14, 14, 3, 3, 512, 4, True, DEFAULT["threads"],  # the 512ch 14x14 layer
                     DEFAULT["min_blocks"])
