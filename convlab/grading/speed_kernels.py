"""Device kernels of speed grading (imports numba): inputs filled from the counter hash
of `speed_worker.values` (bit for bit), outputs poisoned, the L2 flushed, changed and
non-finite elements counted, values gathered at the grader's indices. 1-D arrays."""

from numba import cuda, float32, int64, uint32, uint64

M32 = uint64(0xFFFFFFFF)
POISON_BITS = 0x7FC0DEAD  # convlab.check's 'not written' NaN


@cuda.jit(device=True)
def u(seed, i):
    x = (uint64(i) * uint64(0x9E3779B1) + uint64(seed)) & M32
    x ^= x >> uint64(16)
    x = (x * uint64(0x85EBCA6B)) & M32
    x ^= x >> uint64(13)
    x = (x * uint64(0xC2B2AE35)) & M32
    x ^= x >> uint64(16)
    return float32(x >> uint64(8)) * float32(2.0**-23) - float32(1.0)


@cuda.jit
def fill(a, seed):
    i = cuda.grid(1)
    while i < a.size:
        a[i] = u(seed, i)
        i += cuda.gridsize(1)


@cuda.jit
def poison(a):
    i = cuda.grid(1)
    while i < a.size:
        a[i] = uint32(POISON_BITS)
        i += cuda.gridsize(1)


@cuda.jit
def flush(a, v):
    i = cuda.grid(1)
    while i < a.size:
        a[i] = v
        i += cuda.gridsize(1)


@cuda.jit
def changed(a, seed, count):
    i = cuda.grid(1)
    while i < a.size:
        if a[i] != u(seed, i):
            cuda.atomic.add(count, 0, int64(1))
        i += cuda.gridsize(1)


@cuda.jit
def nonfinite(a, count):
    i = cuda.grid(1)
    while i < a.size:
        v = a[i]
        if not (v - v == float32(0.0)):  # NaN or Inf
            cuda.atomic.add(count, 0, int64(1))
        i += cuda.gridsize(1)


@cuda.jit
def gather(a, idx, out):
    i = cuda.grid(1)
    while i < idx.size:
        out[i] = a[idx[i]]
        i += cuda.gridsize(1)

KERNELS = {"fill": fill, "poison": poison, "flush": flush, "changed": changed,
           "nonfinite": nonfinite, "gather": gather}


