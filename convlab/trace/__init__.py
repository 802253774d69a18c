"""convlab.trace: memory analytics for a Numba CUDA kernel, without a GPU or counters.

Run a kernel (the same Python source that runs on the GPU) for a small launch, record
the address of every global and shared memory access of every thread, and report what
the memory system would have to do::

    import convlab; convlab.setup()
    from convlab import kernels, trace
    t = trace.trace_launch(kernels.conv2d_naive, x, w, out, padding=1)  # a launcher ...
    t = trace.trace_launch(my_kernel, a, b, grid=4, block=256)          # ... or a kernel
    t.summary()                         # tables: sectors per request, conflicts, races
    t.sectors_per_request("load", array="x")
    t.loads_per_output("out"); t.reuse("x")
    t.shared_stats(); t.bank_conflicts(array="tile")
    t.plot_warp(site="x[", warp=0); t.heatmap("x")
    t.races()                           # shared-memory hazards (missing syncthreads)
    t.l2_sectors_per_request("load", array="x")   # sectors that get past L1 (model below)
    trace.compare(t_naive, t_coalesced, names=("naive", "coalesced"), array="x")

It works under the simulator and in a process where `convlab.setup()` chose the real
GPU: either way the kernel's Python function runs on the CPU, through numba-cuda's
simulator classes; a device array argument is copied to the host, and back afterwards.

The model
---------
- **Thread, warp.** Threads are numbered x fastest (``tid = x + X*(y + Y*z)``); a warp is
  32 consecutive thread numbers of one block.
- **Request.** An access *site* is one load or store instruction of the source (one
  subscript such as ``x[n, c, h, col]``, or one ``cuda.atomic`` call). The n-th
  execution of a site by the threads of one warp is one warp request. "n-th execution"
  means the same dynamic instance: same call path and the same iteration of every
  enclosing loop (iterations are counted by a bytecode tracer, so a thread that skips an
  iteration, e.g. at a padded border, is simply inactive in that request instead of
  shifting all its later accesses). That is how a GPU executes a divergent warp.
- **Global memory.** A request costs the number of distinct 32-byte sectors its active
  threads touch. The ideal is ``ceil(distinct bytes used / 32)``. Every allocation is
  taken to start at a 256-byte boundary (what ``cudaMalloc`` returns); views passed as
  arguments keep their offset. Bytes moved = sectors x 32; bytes used = distinct bytes.
- **Shared memory.** 32 banks of 4 bytes, bank = (byte address / 4) mod 32. A request's
  n-way degree is the largest number of *distinct* 4-byte words that fall in one bank;
  many threads reading one word is a broadcast (no conflict). Accesses wider than 4 bytes
  are served in phases of 128 bytes (8-byte: half warps; 16-byte: quarter warps), each
  phase at best one wavefront; ``ways`` averages wavefronts over phases.
- **After L1** (`l2_sectors_per_request`, `l2_bytes`, `cache_footprint`). Raw sectors
  per request are the L1's work per load instruction, not the traffic: a sector that
  another warp of the same block (or the same warp, one loop iteration earlier) already
  brought in is served by L1. The model: each thread block has an L1 of unlimited size
  that keeps every sector the block loads, and shares nothing with other blocks; so the
  sectors that leave the SM are the *distinct* sectors per block, summed over blocks.
  ``l2_sectors_per_request`` divides that by the load requests. Stores and atomics are
  written through to L2: all their sectors count. `compare(a, b)` prints both ratios and
  the FLOP per after-L1 byte of each traced launch.
  Which one predicts time: for a memory-bound kernel (little arithmetic per after-L1 byte,
  running near a memory limit) the after-L1 ratio; the raw ratio only where L1/load
  throughput is the limit; for a latency- or issue-bound kernel (the naive conv kernels
  at many channels) neither. Measured on an H200 (results/trace_h200_2026-11-29.txt):
  1-channel 4096 x 4096 3x3 filter, naive / coalesced 7.0x raw, 1.77x distinct sectors
  per block, 1.38x in time; 128-channel 28 x 28 layer: 6.8x raw, 1.95x per block, 1.02x
  in time; convlab/results/h200_trace_vs_measured.json holds a run on several
  memory-bound shapes (lesson 05 reads it).
- **Races.** Two different threads of a block touching the same shared address in the
  same barrier interval (between the same two ``cuda.syncthreads()``), at least one
  writing, is a hazard: RAW / WAR / WAW by each thread's program order. Atomics do not
  race with atomics.

Limits (the tracer refuses, loudly, what it cannot model)
---------------------------------------------------------
- **Caches, roughly.** Only the per-block L1 model above: no L1 capacity or eviction (a
  block whose working set exceeds L1 fetches more than modelled), no sharing between the
  blocks resident on one SM (they can hit each other's sectors: fetches fewer), no L2
  (``cache_footprint()["per_launch"]`` is the compulsory traffic an L2 that keeps
  everything would see), no texture or constant cache, no DRAM pages or TLB. Sectors are
  what the requests ask for; time also depends on latency, occupancy and instruction
  issue, which are not modelled at all.
- **Data-dependent control flow** is traced as it happens for *these* inputs: another
  input can give other numbers. Loops with thread-dependent trip counts (``while``,
  grid-stride loops) are grouped by iteration number, as a GPU reconverging at the loop
  head would run them. Independent thread scheduling (Volta+) may interleave differently.
- **Not recorded:** local arrays (``cuda.local.array``, registers or local memory),
  constant memory (``cuda.const.array_like``), scalars passed by value. Warp shuffles,
  cooperative groups and grid sync raise `TraceError` (the simulator has none either).
- **Atomics** are recorded as kind ``"atomic"``: one request per warp execution; the
  serialization of atomics to the same address is not modelled.
- **One instance, one access**: if a thread executes the same site twice in what the
  tracer takes as one loop iteration (e.g. a loop body written on the loop's own line),
  it raises `TraceError` rather than mis-group requests.
- ``syncthreads()`` reached at different call sites by threads of one block (a barrier
  in divergent code) raises `TraceError`.
- Small launches only: each CUDA thread is a Python call (about 0.1-0.3 ms with the
  tracer). The default limit is 65536 threads per launch (``max_threads=``).
"""

from __future__ import annotations

import inspect

from ._engine import (
    MAX_THREADS,
    Recorder,
    TraceError,
    data_key,
    is_kernel,
    patched_launches,
)
from ._report import WHICH_PREDICTS, Comparison, Race, Table, Trace, compare

__all__ = ["WHICH_PREDICTS", "Comparison", "Race", "Table", "Trace", "TraceError", "compare",
           "trace_launch"]


def _launch_config(fn):
    """(kernel, grid, block, dynshared) for an already configured ``kernel[grid, block]``."""
    if type(fn).__name__ == "_LaunchConfiguration":
        return fn.dispatcher, fn.griddim, fn.blockdim, fn.sharedmem
    return None


def trace_launch(fn, *args, grid=None, block=None, shared=0, max_threads=MAX_THREADS,
                 **kwargs) -> Trace:
    """Run `fn` once with every memory access recorded; return a `Trace`.

    fn: a convlab launcher (any Python function that launches CUDA kernels; each launch
    inside it is traced) called as ``fn(*args, **kwargs)``, or a CUDA kernel
    (``@cuda.jit``) launched as ``fn[grid, block, 0, shared](*args)``.
    Array arguments may be NumPy arrays (updated in place) or device arrays.
    """
    rec = Recorder(max_threads)
    cfg = _launch_config(fn)
    if cfg is not None:
        fn, g, b, sh = cfg
        grid, block, shared = grid or g, block or b, shared or sh
    if is_kernel(fn):
        if grid is None or block is None:
            raise TraceError("a raw kernel needs grid= and block= (or pass a launcher)")
        if kwargs:
            raise TraceError(f"kernels take positional arguments only, got {sorted(kwargs)}")
        rec.launch(fn, grid, block, shared, args, {})
        result = None
    else:
        if grid is not None or block is not None:
            raise TraceError("grid= and block= are for raw kernels; a launcher picks its own")
        if not callable(fn):
            raise TraceError(f"cannot trace {type(fn).__name__}: pass a launcher or a kernel")
        names = {}
        try:
            bound = inspect.signature(fn).bind_partial(*args, **kwargs)
            names = {data_key(v): k for k, v in bound.arguments.items() if hasattr(v, "shape")}
        except (TypeError, ValueError):
            pass
        with patched_launches(rec, names):
            result = fn(*args, **kwargs)
    if not rec.launches:
        raise TraceError(f"{getattr(fn, '__name__', fn)} launched no CUDA kernel")
    return Trace(rec, result)
