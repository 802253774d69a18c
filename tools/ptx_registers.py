"""Registers per thread and shared memory of the lesson 06 kernels, without a GPU.

    CONVLAB_MODE=gpu .venv/bin/python tools/ptx_registers.py   # prints JSON

Compiles each kernel to PTX with numba-cuda and runs ptxas (from the nvidia-cuda-nvcc
wheel) for sm_90, the H200's architecture.
"""

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import convlab

convlab.setup("gpu")
import nvidia.cuda_nvcc  # noqa: E402
from numba import cuda  # noqa: E402

from convlab.kernels import conv03_tiled, filter02_tiled  # noqa: E402

PTXAS = Path(nvidia.cuda_nvcc.__path__[0]) / "bin" / "ptxas"


def usage(kernel, sig, **kw):
    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0), **kw)
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        r = subprocess.run([str(PTXAS), "-arch=sm_90", "-v", str(src), "-o",
                            str(Path(d) / "k.cubin")], capture_output=True, text=True)
    text = r.stderr
    regs = int(re.search(r"Used (\d+) registers", text).group(1))
    smem = re.search(r"(\d+) bytes smem", text)
    spill = re.search(r"(\d+) bytes spill stores", text)
    return dict(registers=regs, smem_bytes=int(smem.group(1)) if smem else 0,
                spill_bytes=int(spill.group(1)) if spill else 0)


out = {"ptxas": str(PTXAS), "arch": "sm_90", "conv03_tiled": {}, "filter02_tiled": {}}
for t in [(28, 7, 8, 8), (28, 7, 8, 4), (28, 7, 8, 16), (28, 7, 4, 8), (28, 7, 16, 8),
          (28, 7, 1, 8), (32, 8, 8, 8), (32, 4, 8, 8), (16, 16, 8, 8), (14, 14, 8, 8)]:
    k = conv03_tiled.make_kernel(3, 3, 1, 1, 1, 1, *t)
    out["conv03_tiled"]["{}x{} k{} c{}".format(*t)] = usage(k, conv03_tiled.SIGNATURE)
g = filter02_tiled.GAUSS3
for t in [dict(tx=32, ty=8, v=8), dict(tx=32, ty=8, v=4), dict(tx=32, ty=8, v=1),
          dict(tx=32, ty=4, v=16), dict(tx=16, ty=16, v=4)]:
    out["filter02_tiled"]["{tx}x{ty} v{v}".format(**t)] = usage(filter02_tiled.make_kernel(g, **t),
                                                              filter02_tiled.SIGNATURE)
json.dump(out, sys.stdout, indent=1)
