"""Instructions in the slab loop of mma_sync.cu's GEMM, per configuration, without a GPU.

    PATH=/path/to/cuobjdump:$PATH .venv/bin/python tools/sass_slab_loop.py "" "STREAMK=1"

Each argument: MmaConfig fields over MM.GEMM_TOP with EPI_SMEM=1 and an fp16 output
(F16OUT=0 for fp32), and SRC=path for another copy of the .cu file. NVRTC's PTX for
compute_90a, then ptxas (the nvidia-cuda-nvcc wheel) for sm_90a, then `cuobjdump -sass`
(with nvdisasm; the wheels nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm carry both).
The slab loop is the backward branch whose body holds the most HMMA; printed: registers,
spills, the loop's length and its commonest instructions.
"""

import collections
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from sass import build, slab_loop

from convlab.kernels import mma02_gemm_conv_cuda as MM
from convlab.kernels._nvrtc import nvrtc_ptx


def main() -> int:
    if shutil.which("cuobjdump") is None:
        print("cuobjdump (and nvdisasm) must be on PATH")
        return 1
    for arg in sys.argv[1:] or [""]:
        kw = dict(x.split("=") for x in arg.split(",") if x)
        src = kw.pop("SRC", None)
        kw = {k: int(v) for k, v in kw.items()}
        f16 = kw.pop("F16OUT", 1)
        cfg = replace(MM.GEMM_TOP, **{"EPI_SMEM": 1, **kw}).validate()
        text = Path(src).read_text() if src else MM.source()
        ptx = nvrtc_ptx(text, "mma_sync.cu", (), "compute_90a",
                        options=cfg.defines(CONV=0, BF16=0, OUT_F16=f16))
        regs, spills, sass = build(ptx, "sm_90a")
        loop = slab_loop(sass)
        top = ", ".join(f"{k} {v}" for k, v in collections.Counter(loop).most_common(6))
        print(f"{arg or '(GEMM_TOP, staged fp16)':34} regs {regs} spills {spills} "
              f"slab loop {len(loop)} instructions: {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
