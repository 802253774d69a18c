"""How fast can a kernel copy the bytes of each memory-bound problem? The ceiling under the
3x3 filter (4096^2, one buffer, not rotated) and the two depthwise layers (rotated over
> 200 MB of buffer sets, as tools/gpu/memory_bound.py times them).

    python3 tools/gpu/copy_ceiling.py          # table last; $OUT/copy_ceiling.json

Copies: the driver's memcpy, and a CUDA C kernel (16-byte loads, U per thread issued
before the first store; one-shot grids, or SM-count multiples walking the buffer; plain or
streaming (.cs) loads and stores). Every copy is checked (bit-exact) before it is timed
with `bench.time_gpu_queued`. GB/s count bytes read + written; % of the best copy of a
2 GiB buffer (`bench.copy_bandwidth`).
"""

import json
import os
import time

import numpy as np

import convlab

convlab.setup()
import cupy as cp  # noqa: E402

from convlab import bench  # noqa: E402

SRC = r"""
template <int U, int HINT, bool STRIDE>
__global__ void copy4(const float4* __restrict__ s, float4* __restrict__ d, long long n) {
    const long long step = (long long)gridDim.x * blockDim.x * U;
    for (long long base = (long long)blockIdx.x * blockDim.x * U + threadIdx.x; base < n;
         base += step) {
        float4 r[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const long long i = base + (long long)u * blockDim.x;
            if (i < n) r[u] = (HINT & 1) ? __ldcs(s + i) : s[i];
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const long long i = base + (long long)u * blockDim.x;
            if (i < n) { if (HINT & 2) __stcs(d + i, r[u]); else d[i] = r[u]; }
        }
        if (!STRIDE) break;
    }
}
"""
VARIANTS = [(u, h, stride, threads, per_sm) for u, h, stride, threads, per_sm in (
    (1, 0, False, 256, 0), (2, 0, False, 256, 0), (4, 0, False, 256, 0), (8, 0, False, 256, 0),
    (4, 2, False, 256, 0), (4, 3, False, 256, 0), (8, 2, False, 128, 0), (4, 0, False, 512, 0),
    (4, 0, True, 256, 8), (8, 0, True, 256, 4), (4, 2, True, 256, 8), (8, 2, True, 512, 2),
    (2, 0, True, 1024, 2), (4, 0, True, 1024, 2))]
SIZES = [("filter", 2 * 4096 * 4096 * 4, False), ("dw512", 2 * 32 * 512 * 196 * 4, True),
         ("dw32", 2 * 32 * 32 * 112 * 112 * 4, True), ("2GiB", 1 << 31, False)]
TABLE = []


def size_rows(label, nbytes, rotate, copy, mod, names, sms):
    """Check and time every copy of one problem's bytes (rows into TABLE)."""
    half = nbytes // 2
    n4 = half // 16
    nsets = max(2, int(np.ceil(200e6 / nbytes))) if rotate else 1
    srcs = [cp.random.standard_normal(half // 4, dtype=cp.float32) for _ in range(nsets)]
    dsts = [cp.empty_like(s) for s in srcs]
    state = [0]

    def rotating(call):
        def f():
            i = state[0] % nsets
            state[0] += 1
            call(srcs[i], dsts[i])
        return f

    def timed(name, call):
        for d in dsts:
            d.fill(cp.nan)
        f = rotating(call)
        for _ in range(nsets):
            f()
        cp.cuda.Device().synchronize()
        ok = all(bool(cp.array_equal(s, d)) for s, d in zip(srcs, dsts, strict=True))
        us = bench.time_gpu_queued(f, calls=20, repeat=7).median_ms * 1e3 if ok else None
        r = dict(size=label, name=name, ok=ok, us=us, sets=nsets,
                 gbps=nbytes / (us * 1e-6) / 1e9 if ok else None)
        r["pct_copy"] = 100 * r["gbps"] / copy if ok else None
        TABLE.append(r)
        print(f"  {label:6s} {name:40s} " + (f"{us:8.1f} us {r['gbps']:6.0f} GB/s "
                                              f"{r['pct_copy']:5.1f}%" if ok else "WRONG"),
              flush=True)

    timed("memcpy (cupy D2D)", lambda s, d: d.__setitem__(slice(None), s))
    for (u, _, st, threads, per_sm), nm in zip(VARIANTS, names, strict=True):
        k = mod.get_function(nm)
        grid = per_sm * sms if st else -(-n4 // (threads * u))
        timed(f"{nm} t{threads} grid{grid}",
              lambda s, d, k=k, grid=grid, threads=threads: k(
                  (grid,), (threads,), (s, d, np.int64(n4))))


def main():
    t0 = time.time()
    copy = bench.copy_bandwidth(repeat=5)
    print(f"best copy of 2 GiB: {copy:.0f} GB/s", flush=True)
    names = [f"copy4<{u}, {h}, {'true' if st else 'false'}>" for u, h, st, _, _ in VARIANTS]
    mod = cp.RawModule(code=SRC, options=("-std=c++17",), name_expressions=names)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    for label, nbytes, rotate in SIZES:
        size_rows(label, nbytes, rotate, copy, mod, names, sms)
        cp.get_default_memory_pool().free_all_blocks()
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "copy_ceiling.json"), "w") as f:
        json.dump(dict(copy_gbps=copy, rows=TABLE, seconds=time.time() - t0), f, indent=1)
    print(f"\n{'size':6s} {'copy':52s} {'us':>8s} {'GB/s':>6s} {'% copy':>7s}")
    for r in TABLE:
        if r["ok"]:
            print(f"{r['size']:6s} {r['name']:52s} {r['us']:8.1f} {r['gbps']:6.0f} "
                  f"{r['pct_copy']:6.1f}%")
    for label, _, _ in SIZES:
        best = max((r for r in TABLE if r["size"] == label and r["ok"]), key=lambda r: r["gbps"])
        print(f"best {label}: {best['name']} {best['pct_copy']:.1f}% of the 2 GiB copy")


if __name__ == "__main__":
    main()
