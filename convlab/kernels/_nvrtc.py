"""Compile CUDA C to PTX with NVRTC: no GPU needed (CI checks the CUDA C kernels this way).

NVRTC comes with the CUDA 12 wheels that numba-cuda[cu12] installs (cuda.bindings).
"""

from __future__ import annotations


def nvrtc_ptx(source: str, filename: str, name_expressions=(), arch: str = "compute_90",
              options=()) -> str:
    """PTX of `source` for virtual architecture `arch` (e.g. 'compute_90').

    name_expressions: template instantiations to compile (e.g. 'conv<64, 64, 16>');
    options: more NVRTC options (e.g. '-DBM=128').
    Raises RuntimeError with NVRTC's log if the source does not compile.
    """
    from cuda.bindings import nvrtc

    def ok(res, what):
        if res[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"NVRTC {what} failed: {res[0]}")
        return res[1] if len(res) > 1 else None

    prog = ok(nvrtc.nvrtcCreateProgram(source.encode(), filename.encode(), 0, [], []), "create")
    for n in name_expressions:
        ok(nvrtc.nvrtcAddNameExpression(prog, n.encode() if isinstance(n, str) else n),
           "add name")
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17"] + [o.encode() for o in options]
    res = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if res[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        size = ok(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(f"NVRTC compile failed:\n{log.decode(errors='replace')}")
    size = ok(nvrtc.nvrtcGetPTXSize(prog), "ptx size")
    ptx = b" " * size
    ok(nvrtc.nvrtcGetPTX(prog, ptx), "get ptx")
    return ptx.decode().rstrip("\x00")
