"""The inner loops of the Numba kernels, without a GPU: registers, the slab loop's length
and FFMA share, and the PTX's 64-bit integer instructions.

    PATH=/path/to/cuobjdump:$PATH .venv/bin/python tools/sass_numba_loops.py [module ...]

Each module of convlab.kernels with a KERNEL and its SIGNATURE (default: all of them):
Numba's PTX for compute_90, ptxas (the nvidia-cuda-nvcc wheel) for sm_90, `cuobjdump
-sass`. The slab loop is the backward branch whose body holds the most FFMA. Numba widens
int32 arithmetic to 64 bits unless the code casts back, so the 64-bit integer count
(parameter loads and address moves left out) shows where index arithmetic went wide.
"""

import collections
import importlib
import pkgutil
import re
import sys

import convlab

convlab.setup("gpu")  # Numba compiles PTX for the GPU (no GPU needed)
from numba import cuda  # noqa: E402
from sass import build, slab_loop  # noqa: E402

import convlab.kernels  # noqa: E402

WIDE = re.compile(r"\.(s|u|b)64")


def report(name: str) -> str | None:
    m = importlib.import_module(f"convlab.kernels.{name}")
    k, sig = getattr(m, "KERNEL", None), getattr(m, "SIGNATURE", None)
    if sig is None or not hasattr(k, "py_func"):
        return None
    try:
        ptx, _ = cuda.compile_ptx(k.py_func, sig, cc=(9, 0))
    except Exception as e:  # noqa: BLE001  (a kernel that needs a driver to build)
        return f"{name:38s} not compiled: {type(e).__name__}"
    ops = [ln.split()[0] for ln in (x.strip() for x in ptx.splitlines())
           if ln and ln[0].isalpha() and not ln.endswith(":")]
    wide = sum(WIDE.search(o) is not None and not o.startswith(("ld.param", "cvta", "mov"))
               for o in ops)
    regs, _, sass = build(ptx)
    loop = collections.Counter(slab_loop(sass, "FFMA"))
    n = sum(loop.values())
    share = f"{100 * loop['FFMA'] / n:5.1f}%" if n else "    -"
    return (f"{name:38s} {regs:>4s} regs  PTX {len(ops):5d}, 64-bit int {wide:4d}  "
            f"slab loop {n:5d}, FFMA {loop['FFMA']:5d} ({share})")


def main() -> int:
    names = sys.argv[1:] or sorted(m.name for m in pkgutil.iter_modules(convlab.kernels.__path__)
                                   if not m.name.startswith("_"))
    for name in names:
        line = report(name)
        if line:
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
