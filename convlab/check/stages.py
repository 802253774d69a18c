"""Stage checks: one part of a kernel checked before the whole kernel is.

A tiled kernel goes wrong in one of a few places: the tile it stages in shared memory, the
fragment of outputs a thread keeps in registers, the loop over the reduction's slabs. Each
checker here looks at one of them and says what is wrong and where:

- `staged_tile`: run one block of a kernel up to its n-th ``cuda.syncthreads()`` and
  compare a shared array with the expected tile (index, expected, got, a map of the bad
  elements);
- `register_fragment`: run one block to the end and compare one thread's local array
  (its accumulators) with the outputs that thread owns;
- `slab_bounds`: trace a whole launch and check that every element of an operand is
  loaded as often as the tiling says (a slab loop that stops early, or runs twice over
  some k, shows up there);
- `window`: the expected tile for a halo or a slab: a window of an array, zero outside.

`run_block` runs the kernel's Python source for one block, one OS thread per CUDA thread,
in either mode (simulator or GPU: only the CPU runs it). Shared memory starts as NaN, so a
value never staged is reported as "not written".
"""

from __future__ import annotations

import linecache
import re
import sys
import threading

import numpy as np

from ..barrier import BlockBarrier
from ..errors import CheckError
from .core import raised_at

_tls = threading.local()
MAX_BLOCK = 1024
MAP_SIDE = 40  # largest tile drawn as a map of bad elements


class _Stop(BaseException):
    """Unwinds a thread of the block once the snapshot is taken (or another thread failed)."""


def _dim3(d) -> tuple:
    d = (int(d),) if np.isscalar(d) else tuple(int(v) for v in d)
    if not 1 <= len(d) <= 3 or min(d) < 1:
        raise CheckError(f"bad launch dimension {d}")
    return d + (1,) * (3 - len(d))


def _name_at(frame, fallback: str) -> str:
    src = linecache.getline(frame.f_code.co_filename, frame.f_lineno) or ""
    m = re.match(r"\s*([A-Za-z_]\w*)\s*=", src)
    return m.group(1) if m else fallback


class BlockRun:
    """What one block left behind: shared arrays by name, local arrays by (thread, name)."""

    def __init__(self, shared: dict, local: dict, barriers: int, finished: bool):
        self.shared, self.local = shared, local
        self.barriers, self.finished = barriers, finished

    def shared_array(self, name: str) -> np.ndarray:
        if name not in self.shared:
            raise CheckError(f"the kernel has no shared array named {name!r} (it has "
                             f"{sorted(self.shared) or 'none'}): name the array as in "
                             f"`{name} = cuda.shared.array(...)`")
        return self.shared[name]

    def local_array(self, thread: int, name: str) -> np.ndarray:
        if (thread, name) not in self.local:
            names = sorted({n for t, n in self.local if t == thread})
            raise CheckError(f"thread {thread} has no local array named {name!r} (it has "
                             f"{names or 'none'}): name it as in "
                             f"`{name} = cuda.local.array(...)`")
        return self.local[thread, name]


class _Block(BlockBarrier):
    """One block's threads, barrier, shared and local arrays; stops at barrier `stop_at`."""

    abort = _Stop

    def __init__(self, n: int, stop_at):
        super().__init__(n)
        self.count, self.stop_at, self.stopped = 0, stop_at, False
        self.shared: dict = {}
        self.local: dict = {}
        self.snapshot = None
        self.lock = threading.Lock()

    def halted(self) -> bool:
        return self.error is not None or self.stopped

    def on_release(self):
        self.count += 1
        if self.stop_at is not None and self.count == self.stop_at:
            self.snapshot = ({k: a.copy() for k, a in self.shared.items()},
                             {k: a.copy() for k, a in self.local.items()})
            self.stopped = True


def _module_class():
    from .. import runtime

    runtime.setup()
    from numba.cuda.simulator.kernelapi import Dim3, FakeCUDAModule

    class _Shared:
        def array(self, shape, dtype, alignment=None):
            return _tls.run.shared_array(sys._getframe(1), shape, dtype)

    class _Local:
        def array(self, shape, dtype, alignment=None):
            return _tls.run.local_array(sys._getframe(1), shape, dtype)

    class StageModule(FakeCUDAModule):
        """``numba.cuda`` inside the block being run."""

        def __init__(self, grid, block):
            super().__init__(grid, block, 0)
            self._shared, self._local = _Shared(), _Local()

        @property
        def threadIdx(self):
            return Dim3(*_tls.thread)

        @property
        def blockIdx(self):
            return Dim3(*_tls.run.block_idx)

        @property
        def laneid(self):
            return _tls.tid % 32

        def syncthreads(self):
            _tls.run.block.sync()

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            raise CheckError(f"cuda.{name} is not supported by the stage checks")

    return StageModule


def _dtype(dtype):
    from numba.core import types as nbtypes
    from numba.np import numpy_support

    return numpy_support.as_dtype(dtype) if isinstance(dtype, nbtypes.Type) else np.dtype(dtype)


class _Run:
    def __init__(self, block_idx, block: _Block):
        self.block_idx, self.block = block_idx, block

    def shared_array(self, frame, shape, dtype):
        key = _name_at(frame, f"shared@{frame.f_lineno}")
        with self.block.lock:
            if key not in self.block.shared:
                a = np.empty(shape, _dtype(dtype))
                if a.dtype.kind == "f":
                    a.fill(np.nan)  # never staged -> NaN
                self.block.shared[key] = a
            return self.block.shared[key]

    def local_array(self, frame, shape, dtype):
        a = np.empty(shape, _dtype(dtype))
        if a.dtype.kind == "f":
            a.fill(np.nan)
        key = (_tls.tid, _name_at(frame, f"local@{frame.f_lineno}"))
        with self.block.lock:
            self.block.local[key] = a
        return a


def _host(a):
    if hasattr(a, "copy_to_host") and not isinstance(a, np.ndarray):
        return a.copy_to_host()
    return a


def run_block(kernel, args, *, grid, block, block_idx=(0, 0, 0), barrier=None) -> BlockRun:
    """Run block `block_idx` of ``kernel[grid, block](*args)`` on the CPU.

    barrier: stop every thread when the block reaches its n-th ``syncthreads`` (1 = the
    first) and return the arrays as they were there; None runs the block to its end.
    Device arrays among `args` are copied to the host first; nothing is written back.
    """
    py_func = getattr(kernel, "py_func", kernel)
    if not callable(py_func):
        raise CheckError(f"run_block needs a CUDA kernel, got {type(kernel).__name__}")
    grid, block = _dim3(grid), _dim3(block)
    block_idx = (block_idx,) if np.isscalar(block_idx) else tuple(block_idx)
    block_idx = tuple(int(v) for v in block_idx) + (0,) * (3 - len(block_idx))
    if any(not 0 <= b < g for b, g in zip(block_idx, grid, strict=True)):
        raise CheckError(f"block {block_idx} is outside the grid {grid}")
    n = int(np.prod(block))
    if n > MAX_BLOCK:
        raise CheckError(f"block of {n} threads: a GPU allows at most {MAX_BLOCK}")
    state = _Block(n, barrier)
    run = _Run(block_idx, state)
    module = _module_class()(grid, block)
    host_args = [_host(a) for a in args]
    threads = [(x, y, z) for z in range(block[2]) for y in range(block[1])
               for x in range(block[0])]

    def work(tid, thread):
        _tls.run, _tls.thread, _tls.tid = run, thread, tid
        try:
            state.enter(tid)
            py_func(*host_args)
        except _Stop:
            pass
        except BaseException as e:  # noqa: BLE001
            state.fail((tid, thread, e))
        finally:
            state.exit()

    from ..trace._engine import _Swaps  # imports numba: only when a block runs

    with _Swaps(py_func, module):
        workers = [threading.Thread(target=work, args=(t, th), daemon=True)
                   for t, th in enumerate(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    if state.error is not None:
        tid, thread, e = state.error
        raise CheckError(f"thread {list(thread)} (tid {tid}) of block {_where(block_idx)} "
                         f"raised {type(e).__name__}: {e}{raised_at(e)}") from e
    if barrier is not None and state.snapshot is None:
        raise CheckError(f"block {_where(block_idx)} reached only {state.count} "
                         f"cuda.syncthreads() barrier(s), not {barrier}: is the barrier "
                         "missing (or inside a branch some threads skip)?")
    shared, local = state.snapshot or (state.shared, state.local)
    return BlockRun(shared, local, state.count, state.snapshot is None)


# ----------------------------------------------------------------------------------------
# Expected values and reports


def window(a, origin, shape, fill=0.0) -> np.ndarray:
    """a[origin[0]:origin[0]+shape[0], ...] with `fill` wherever the window leaves `a`
    (the zero padding of a halo tile, the zeros past the edge of a slab)."""
    a = np.asarray(a)
    out = np.full(tuple(shape), fill, dtype=np.float64)
    src, dst = [], []
    for o, s, n in zip(origin, shape, a.shape, strict=True):
        lo, hi = max(o, 0), min(o + s, n)
        if hi <= lo:
            return out
        src.append(slice(lo, hi))
        dst.append(slice(lo - o, hi - o))
    out[tuple(dst)] = a[tuple(src)]
    return out


def _map(bad, unwritten) -> str:
    """A character map of a 2-D comparison: '.' right, 'X' wrong, '?' never written."""
    rows = []
    for i in range(bad.shape[0]):
        rows.append("".join("?" if unwritten[i, j] else "X" if bad[i, j] else "."
                            for j in range(bad.shape[1])))
    return "\n".join("      " + r for r in rows)


def _compare(got, expected, what: str, tol: float, hint=None,
             nan="never written") -> str:
    """Compare `got` with `expected` (NaN in expected: not checked); raise on mismatch.
    nan: what a NaN in `got` means (the run starts every array as NaN)."""
    got = np.asarray(got)
    expected = np.asarray(expected, dtype=np.float64)
    if got.ndim != expected.ndim or any(
            g < e for g, e in zip(got.shape, expected.shape, strict=True)):
        raise CheckError(f"{what}: has shape {got.shape}, the check needs at least "
                         f"{expected.shape}")
    got = got[tuple(slice(0, e) for e in expected.shape)].astype(np.float64)
    care = ~np.isnan(expected)
    unwritten = np.isnan(got) & care
    scale = tol * np.maximum(1.0, np.abs(np.where(care, expected, 0)))
    bad = care & (unwritten | ~np.isfinite(got) | (np.abs(got - np.where(care, expected, 0))
                                                   > scale))
    if not bad.any():
        return f"✓ {what}: all {int(care.sum())} checked elements right"
    idx = tuple(int(v) for v in np.argwhere(bad)[0])
    g, e = got[idx], expected[idx]
    why = f"NaN: {nan}" if np.isnan(g) else f"got {g:.6g}"
    lines = [f"{what}: {int(bad.sum())} of {int(care.sum())} elements wrong "
             f"({int(unwritten.sum())} NaN: {nan})",
             f"  first bad element {list(idx)}: expected {e:.6g}, {why}"]
    found = np.argwhere(np.isclose(expected, g, rtol=tol, atol=tol) & care) if np.isfinite(
        g) else []
    if len(found) and not np.isclose(g, e, rtol=tol, atol=tol):
        lines.append(f"  (the value there belongs at {list(int(v) for v in found[0])}: an "
                     "index is shifted or swapped?)")
    if hint:
        lines.append(f"  {hint}")
    if bad.ndim == 2 and max(bad.shape) <= MAP_SIDE:
        lines.append("  map ('.' right, 'X' wrong, '?' never written):")
        lines.append(_map(bad, unwritten))
    raise CheckError("\n".join(lines))


def _nth(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _where(block_idx) -> str:
    """A block index, (1, 2) rather than (1, 2, 0)."""
    b = [int(block_idx)] if np.isscalar(block_idx) else [int(v) for v in block_idx]
    if len(b) == 3 and b[2] == 0:
        b.pop()
    return str(tuple(b)) if len(b) > 1 else str(b[0])


def _say(text: str, quiet: bool) -> str:
    if not quiet:
        print(text)
    return text


# ----------------------------------------------------------------------------------------
# The stage checks


def staged_tile(kernel, *args, grid, block, block_idx=(0, 0), array, expected,
                barrier: int = 1, tol: float = 1e-6, quiet: bool = False) -> str:
    """The shared array `array` of one block at its `barrier`-th ``syncthreads`` equals
    `expected` (its leading corner; NaN entries of `expected` are not checked).

    kernel: the ``@cuda.jit`` kernel, called as ``kernel[grid, block](*args)``.
    Raises CheckError naming the first bad element (index, expected, got) with a map.
    """
    res = run_block(kernel, args, grid=grid, block=block, block_idx=block_idx,
                    barrier=barrier)
    what = f"shared array {array!r} of block {_where(block_idx)} at barrier {barrier}"
    hint = None
    got = res.shared_array(array)
    exp = np.asarray(expected)
    if got.ndim == 2 and exp.ndim == 2 and exp.shape[0] != exp.shape[1] and \
            got.shape[0] >= exp.shape[1] and got.shape[1] >= exp.shape[0]:
        t = got[:exp.shape[1], :exp.shape[0]].T
        if np.allclose(t, np.where(np.isnan(exp), t, exp), rtol=tol, atol=tol):
            hint = "the tile is there, transposed: swap the two indices of the store"
    try:
        return _say(_compare(got, exp, what, tol, hint), quiet)
    except CheckError as e:
        raise CheckError(f"{e}\n  (barrier {barrier} is the block's {_nth(barrier)} "
                         "cuda.syncthreads(): if the staging looks right, count the barriers "
                         "per slab: one more or fewer than the design puts another slab "
                         "here)") from None


def register_fragment(kernel, *args, grid, block, block_idx=(0, 0), thread: int,
                      array: str = "acc", expected, tol: float = 1e-4,
                      quiet: bool = False) -> str:
    """One thread's local array `array` at the end of its block equals `expected` (the
    outputs that thread owns, before they are stored). thread: the flat thread index
    (x fastest). tol: relative, for sums in float32."""
    res = run_block(kernel, args, grid=grid, block=block, block_idx=block_idx)
    what = f"local array {array!r} of thread {thread} in block {_where(block_idx)}"
    return _say(_compare(res.local_array(thread, array), expected, what, tol,
                         nan="never written, or summed from a shared element nobody staged "
                         "(the wrong buffer or slab?)"), quiet)


def slab_bounds(fn, *args, array: str, expected_loads, quiet: bool = False, **kwargs) -> str:
    """Every element of the global array `array` is loaded exactly `expected_loads` times
    by one traced run of ``fn(*args, **kwargs)``: a launcher, or a kernel with ``grid=``
    and ``block=`` among the keywords.

    expected_loads: an int, or an array of the operand's shape. A slab loop that stops
    before the last partial slab leaves elements unloaded; one that steps too little
    loads some twice.
    """
    from ..trace import trace_launch

    tr = trace_launch(fn, *args, **kwargs)
    counts = tr.load_counts(array)
    exp = np.broadcast_to(np.asarray(expected_loads), counts.shape)
    bad = counts != exp
    if not bad.any():
        return _say(f"✓ slab loop: every element of {array!r} loaded "
                    f"{int(exp.flat[0]) if np.all(exp == exp.flat[0]) else 'as expected'} "
                    "time(s)", quiet)
    idx = tuple(int(v) for v in np.argwhere(bad)[0])
    lines = [f"slab loop: {int(bad.sum())} of {bad.size} elements of {array!r} loaded the "
             f"wrong number of times",
             f"  first at {list(idx)}: expected {int(exp[idx])} load(s), got {int(counts[idx])}"]
    if counts.ndim == 2:
        never = np.where((counts == 0).all(axis=0) & (exp > 0).any(axis=0))[0]
        twice = np.where((counts > exp).any(axis=0))[0]
        if len(never):
            lines.append(f"  columns {never[0]}..{never[-1]} are never loaded: does the slab "
                         "loop stop before the last (partial) slab?")
        if len(twice):
            lines.append(f"  columns {twice[0]}..{twice[-1]} are loaded too often: does the "
                         "slab loop step by less than a slab, or stage a slab twice?")
        if counts.shape[0] <= MAP_SIDE and counts.shape[1] <= MAP_SIDE:
            lines.append("  loads per element:")
            lines += ["      " + " ".join(f"{int(v)}" for v in row) for row in counts]
    raise CheckError("\n".join(lines))


__all__ = ["BlockRun", "register_fragment", "run_block", "slab_bounds", "staged_tile",
           "window"]
