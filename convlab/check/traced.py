"""Technique checks from a trace (`convlab.trace`): coalescing, loads per output, bank
conflicts, barriers per block.

Each traces one launch of the learner's GPU launcher on the CPU (no GPU needed) and fails
when the technique the lesson teaches is missing: more 32-byte sectors per warp request
than coalesced access takes, more loads per output than register blocking allows,
shared-memory accesses that conflict, or more barriers than the design needs.
"""

from __future__ import annotations

from ..errors import CheckError
from .core import _name, learner_call


def check_coalesced(fn, *args, max_sectors: float = 4.5, kinds=("load", "store"),
                    quiet=False, **kwargs) -> str:
    """Trace one launch of the GPU launcher ``fn(*args, **kwargs)`` (device arrays) with
    `convlab.trace` and fail if, for a kind of global access, the warp requests average
    more than `max_sectors` 32-byte sectors (32 consecutive floats take 4; a broadcast 1).

    Works under the simulator and on a GPU (the tracer runs the kernel on the CPU).
    """
    from .. import trace

    name = _name(fn)
    try:
        with learner_call(fn):
            t = trace.trace_launch(fn, *args, **kwargs)
    except trace.TraceError as e:
        raise CheckError(f"coalescing FAILED: {e} (not implemented yet?)") from None
    stats = list(t.global_stats())
    found = []
    for kind in kinds:
        rows = [r for r in stats if r["kind"] == kind]
        if not rows:
            raise CheckError(f"coalescing FAILED: {name} makes no global {kind}s "
                             "(not implemented yet?)")
        spr = t.sectors_per_request(kind)
        found.append(f"{kind}s {spr:.1f}")
        if not spr <= max_sectors:
            worst = max(rows, key=lambda r: r["sectors_per_req"])
            raise CheckError(
                f"coalescing FAILED: {name}'s global {kind}s take {spr:.1f} sectors per warp "
                f"request on average (at most {max_sectors} allowed; 32 neighbouring floats "
                f"take 4); worst: {worst['site']} with {worst['sectors_per_req']:.1f}\n  hint: "
                "give neighbouring threads (threadIdx.x) neighbouring addresses in memory")
    line = f"✓ coalescing: {name}: sectors per warp request: " + ", ".join(found)
    if not quiet:
        print(line)
    return line


def _trace_answer(what: str, fn, args, kwargs):
    from .. import trace

    try:
        with learner_call(fn):
            return trace.trace_launch(fn, *args, **kwargs)
    except trace.TraceError as e:
        raise CheckError(f"{what} FAILED: {e} (not implemented yet?)") from None


def traffic(t) -> dict:
    """From a `convlab.trace` Trace: loads (one per thread per element) of each global and of
    each shared array, and the distinct elements stored into each global array."""
    stats = list(t.global_stats())
    glob = sorted({r["array"] for r in stats if r["kind"] == "load"})
    stored = sorted({r["array"] for r in stats if r["kind"] == "store"})
    shared: dict = {}
    for r in t.shared_stats():
        if r["kind"] == "load":
            shared[r["array"]] = shared.get(r["array"], 0) + int(
                round(r["requests"] * r["threads_per_req"]))
    return dict(global_loads={a: int(t.load_counts(a).sum()) for a in glob},
                shared_loads=shared,
                stored={a: int((t.load_counts(a, kind="store") > 0).sum()) for a in stored})


_REGISTER_BLOCKING = ("let each thread compute several outputs from every value it loads "
                     "(register blocking)")


def check_loads_per_output(fn, *args, max_per_output: float, array: str | None = None,
                           space: str = "global", only_output: bool = True,
                           hint: str = _REGISTER_BLOCKING, quiet=False, **kwargs) -> str:
    """Trace one launch of the GPU launcher ``fn(*args, **kwargs)`` and fail if its kernels
    load more than `max_per_output` values per output element from `space` ('global' or
    'shared') memory, counting every load of every thread (caches are not modelled), of
    the launcher argument named `array` only if given (pass it to the kernel unchanged);
    with `only_output`, also fail if any global array besides one output is written (an
    im2col matrix, say).

    Register blocking shows up here: a thread that computes several outputs from every
    value it loads divides the loads per output; so does shared-memory tiling. hint: what
    a failure suggests.
    """
    if space not in ("global", "shared"):
        raise ValueError(f"space must be 'global' or 'shared', got {space!r}")
    name = _name(fn)
    t = _trace_answer("loads per output", fn, args, kwargs)
    tr = traffic(t)
    if not tr["stored"]:
        raise CheckError(f"loads per output FAILED: {name} stores nothing to global memory "
                         "(not implemented yet?)")
    if only_output and len(tr["stored"]) > 1:
        extra = ", ".join(f"{a} ({n} elements)" for a, n in tr["stored"].items())
        raise CheckError(f"loads per output FAILED: {name} writes {len(tr['stored'])} global "
                         f"arrays: {extra}; only the output should be written (build "
                         "intermediate tiles in shared memory or registers instead)")
    outputs = sum(tr["stored"].values())
    loads = tr[f"{space}_loads"]
    if array is not None:
        try:
            arr = t.array(array)
        except Exception:  # noqa: BLE001  (the tracer's TraceError names what it has)
            raise CheckError(f"loads per output FAILED: the tracer cannot find the array "
                             f"{array!r} in {name}'s kernels: pass it to the kernel as it is "
                             "(not a reshaped view)") from None
        count = loads.get(arr.name, 0)
    else:
        count = sum(loads.values())
    per = count / outputs
    what = f"{space}-memory loads" + (f" of {array}" if array else "")
    if not per <= max_per_output:
        raise CheckError(
            f"loads per output FAILED: {name} makes {per:.2f} {what} per output ({count} for "
            f"{outputs} outputs; at most {max_per_output:g} allowed)\n  hint: {hint}")
    line = f"✓ loads per output: {name}: {per:.2f} {what} per output (at most {max_per_output:g})"
    if not quiet:
        print(line)
    return line


def check_bank_conflicts(fn, *args, max_ways: float = 1.0, kind="load", quiet=False,
                         **kwargs) -> str:
    """Trace one launch of ``fn(*args, **kwargs)`` and fail if its shared-memory accesses
    of `kind` ('load', 'store' or None for both) average more than `max_ways` wavefronts
    per request phase (1.0: conflict-free; 4-byte accesses, as the tracer sees them)."""
    name = _name(fn)
    what = {"load": "loads", "store": "stores"}.get(kind, "accesses")
    t = _trace_answer("bank conflicts", fn, args, kwargs)
    rows = [r for r in t.shared_stats() if kind is None or r["kind"] == kind]
    if not rows:
        raise CheckError(f"bank conflicts FAILED: {name} makes no shared-memory {what} "
                         "(not implemented yet?)")
    ways = t.bank_conflicts(kind=kind)
    if not ways <= max_ways:
        worst = max(rows, key=lambda r: r["ways"])
        raise CheckError(
            f"bank conflicts FAILED: {name}'s shared-memory {what} are "
            f"{ways:.2f}-way on average (at most {max_ways:g} allowed); worst: {worst['site']} "
            f"({worst['ways']:.1f}-way, a {worst['kind']})\n  hint: within a warp, threads "
            f"that {'write' if worst['kind'] == 'store' else 'read'} different words should "
            "reach different banks (word address mod 32)")
    line = f"✓ bank conflicts: {name}: shared-memory {what} {ways:.2f}-way on average"
    if not quiet:
        print(line)
    return line


def check_barriers_per_block(fn, *args, expected: int, why: str = "", quiet=False,
                             **kwargs) -> str:
    """Trace one launch of ``fn(*args, **kwargs)`` and fail unless every block passes
    exactly `expected` ``cuda.syncthreads()`` barriers. why: what the count stands for
    (printed with a failure, e.g. "one before the loop and one per slab")."""
    name = _name(fn)
    t = _trace_answer("barriers per block", fn, args, kwargs)
    counts = t.barriers_per_block()
    if not counts:
        raise CheckError(f"barriers per block FAILED: {name} ran no block (not implemented "
                         "yet?)")
    bad = [(k, b, n) for k, b, n in counts if n != expected]
    if bad:
        kernel, block, n = bad[0]
        more = n > expected
        raise CheckError(
            f"barriers per block FAILED: block {list(block)} of {kernel} passed {n} "
            f"cuda.syncthreads() barrier(s), the task asks for {expected}"
            + (f" ({why})" if why else "") + f"; {len(bad)} of {len(counts)} blocks differ\n"
            "  hint: " + ("every extra barrier makes each warp of the block wait for the "
                          "slowest one: which barrier does no write need?" if more else
                          "a barrier fewer than the design lets a thread overwrite a buffer "
                          "another thread still reads (or read one before it is written)"))
    line = (f"✓ barriers per block: {name}: every block passed {expected} cuda.syncthreads() "
            "barrier(s)")
    if not quiet:
        print(line)
    return line
