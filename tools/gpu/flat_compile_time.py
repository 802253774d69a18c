"""First-use cost of the one-launch GEMM (`flat_igemm_cuda`): the first call on each 1x1 and
stem layer of ResNet-50 at batch 1 and 32, in a fresh process. Run twice with the same
CUPY_CACHE_DIR: the first process compiles each module it needs, the second loads them.

    CUPY_CACHE_DIR=/tmp/cc python3 tools/gpu/flat_compile_time.py first
    CUPY_CACHE_DIR=/tmp/cc python3 tools/gpu/flat_compile_time.py second names

"names": then also build the module of every tile from name expressions (the way before
one module per tile): compiled in the first process that builds it, then cached too.
"""
import sys
import time

t0 = time.perf_counter()
import convlab  # noqa: E402

convlab.setup("gpu")
import cupy as cp  # noqa: E402

from convlab import problems  # noqa: E402
from convlab import reference as ref  # noqa: E402
from convlab.kernels import flat_igemm_cuda as F  # noqa: E402

t1 = time.perf_counter()
n = 0
for lay in problems.RESNET50:
    if not lay.name.startswith(("1x1", "stem")):
        continue
    for b in (1, 32):
        p = lay.with_batch(b)
        x = cp.random.rand(*p.x_shape, dtype=cp.float32)
        w = cp.random.rand(*p.w_shape, dtype=cp.float32)
        q = ref.conv_params(p.x_shape, p.w_shape, **p.kwargs)
        y = cp.empty(q.out_shape, cp.float32)
        F.conv2d_flat_igemm_cuda(x, w, y, **p.kwargs)
        n += 1
cp.cuda.Device().synchronize()
print(f"{sys.argv[1]}: import {t1 - t0:.1f} s; first calls of {n} layer shapes "
      f"{time.perf_counter() - t1:.1f} s; modules {len(F._MODULES)}")

if "names" in sys.argv[2:]:   # what `_module` built before: every tile from name expressions
    t2 = time.perf_counter()
    names = tuple(F.name_expressions())
    mod = cp.RawModule(code=F.SOURCE_PATH.read_text(), name_expressions=names,
                       options=("-std=c++17", f"-DPREFETCH={F.PREFETCH}"))
    mod.get_function(names[0])
    print(f"{sys.argv[1]}: the module of all {len(names)} kernels from name expressions "
          f"{time.perf_counter() - t2:.1f} s")
