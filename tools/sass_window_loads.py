"""Where ptxas puts the window kernels' loads, without a GPU: the CUDA C kernel
(depthwise_window.cu, through NVRTC) and its pure Numba twin (depthwise06_window, through
Numba's PTX).

    PATH=/path/to/cuobjdump:$PATH .venv/bin/python tools/sass_window_loads.py

NVRTC's PTX for compute_90, ptxas (the nvidia-cuda-nvcc wheel) for sm_90, `cuobjdump
-sass` (the nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels). Printed per layer
shape and runs per thread (u): registers, SASS instructions, global loads (LDG: the
window's vectors and the taps) and how many of them come before the first multiply, the
FFMA count.
"""

import convlab

convlab.setup("gpu")  # Numba compiles PTX for the GPU (no GPU needed)
from numba import cuda  # noqa: E402
from sass import build, opcodes, ptxas_version  # noqa: E402

from convlab.kernels import depthwise05_window_cuda as D  # noqa: E402
from convlab.kernels import depthwise06_window as D6  # noqa: E402
from convlab.kernels._nvrtc import nvrtc_ptx  # noqa: E402


def summary(label: str, ptx: str) -> str:
    regs, _, sass = build(ptx)
    ops = opcodes(sass)
    first = next(i for i, o in enumerate(ops) if o in ("FFMA", "FMUL"))
    ldg = [i for i, o in enumerate(ops) if o == "LDG"]
    return (f"{label}: {regs} registers, {len(ops)} instructions; {len(ldg)} LDG, "
            f"{sum(i < first for i in ldg)} before the first FFMA; {ops.count('FFMA')} FFMA")


def main() -> None:
    print("ptxas:", ptxas_version())
    print("CUDA C (depthwise05_window_cuda), V = 4, 256 threads:")
    for H, W, u in ((14, 14, 1), (112, 112, 1), (4096, 4096, 1), (14, 14, 2)):
        name = D.kernel_name(H, W, 3, 3, 4, 4, 256, 0, u)
        ptx = nvrtc_ptx(D.SOURCE_PATH.read_text(), "depthwise_window.cu", [name], "compute_90")
        print(summary(f"  {H}x{W} u={u}", ptx))
    print("pure Numba (depthwise06_window), 16-byte build, 256 threads:")
    for H, v in ((14, 4), (112, 4), (112, 8), (4096, 4)):
        k = D6.make_kernel(H, H, 3, 3, 32, v, True, 256)
        ptx, _ = cuda.compile_ptx(k.py_func, D6.SIGNATURE, cc=(9, 0))
        print(summary(f"  {H}x{H} V={v}", ptx))


if __name__ == "__main__":
    main()
