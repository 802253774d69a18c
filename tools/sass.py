"""SASS without a GPU, for the tools that read it: PTX through ptxas (the nvidia-cuda-nvcc
wheel), then `cuobjdump -sass` (the nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels:
put their bin folder on PATH). Imports nothing of convlab, so a tool can set Numba's mode
before it imports the kernels."""

import re
import subprocess
import tempfile
from pathlib import Path

import nvidia.cuda_nvcc

PTXAS = Path(nvidia.cuda_nvcc.__path__[0]) / "bin" / "ptxas"
# address, predicate, opcode (before its first '.'), operands
INSTR = re.compile(r"/\*([0-9a-f]{4,5})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)[.\s]([^;]*);")


def ptxas_version() -> str:
    r = subprocess.run([str(PTXAS), "--version"], capture_output=True, text=True)
    return r.stdout.strip().splitlines()[-1]


def build(ptx: str, arch: str = "sm_90") -> tuple[str, list, str]:
    """(registers, spill byte counts, SASS text) of PTX built by ptxas for `arch`."""
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "k.ptx").write_text(ptx)
        r = subprocess.run([str(PTXAS), f"-arch={arch}", "-v", str(Path(d) / "k.ptx"), "-o",
                            str(Path(d) / "k.cubin")], capture_output=True, text=True)
        sass = subprocess.run(["cuobjdump", "-sass", str(Path(d) / "k.cubin")],
                              capture_output=True, text=True, check=True).stdout
    log = r.stderr + r.stdout
    regs = re.search(r"Used (\d+) registers", log)
    return regs.group(1) if regs else "?", re.findall(r"(\d+) bytes spill", log), sass


def opcodes(sass: str) -> list:
    """The opcodes in program order."""
    return [op for _, _, op, _ in INSTR.findall(sass)]


def slab_loop(sass: str, op: str = "HMMA") -> list:
    """Opcodes of the backward branch's body with the most `op` (HMMA, or FFMA for the
    fp32 kernels)."""
    ins = [(int(a, 16), o, rest) for a, _, o, rest in INSTR.findall(sass)]
    best = []
    for addr, o, rest in ins:
        m = re.search(r"0x([0-9a-f]+)", rest) if o == "BRA" else None
        if m and int(m.group(1), 16) < addr:
            body = [x for a, x, _ in ins if int(m.group(1), 16) <= a <= addr]
            if body.count(op) > best.count(op):
                best = body
    return best
