"""Registers, local memory and the time of each mma.sync configuration beside cuBLAS fp16:
ROUNDS (default 5) rounds of one short burst each, the order reversed every other round,
and per configuration the median over rounds of its ratio to cuBLAS in that round. Also
the inputs of an Nsight Compute run (`ncu --kernel-name mma_sync_kernel ... python3
tools/gpu/mma_profile.py`).

    python3 tools/gpu/mma_profile.py 4096 "BM=256,BK=64,STAGES=3,FRAG_PIPE=1,GPTR=1" ...

Each argument after the size is a configuration: MmaConfig fields over mma02's STEP3,
F16OUT=1 for an fp16 output (as cuBLAS writes; checked at fp16's tolerance), and SRC=path
for another copy of mma_sync.cu (same kernel signature) in place of the package's, to time
a change against the tree in one process.
"""

import functools
import os
import sys
from dataclasses import replace
from pathlib import Path

import convlab

convlab.setup("gpu")
import torch  # noqa: E402

from convlab import bench  # noqa: E402
from convlab.kernels import mma02_gemm_conv_cuda as MM  # noqa: E402
from convlab.measure import tensor_cores as TC  # noqa: E402
from convlab.measure import timing  # noqa: E402


def parse(spec: str):
    kw = dict(p.split("=") for p in spec.split(",") if p)
    src = kw.pop("SRC", None)
    kw = {k: int(v) for k, v in kw.items()}
    f16 = bool(kw.pop("F16OUT", 0))
    return replace(MM.STEP3, **kw), f16, src


_TREE_KERNEL = MM._kernel


@functools.cache
def _compiled(src: str):
    """MM._kernel's signature, compiling the file `src` instead of the package's."""
    return MM.compiler_for(Path(src).read_text())


def use_source(src):
    MM._kernel = _compiled(src) if src else _TREE_KERNEL


def main() -> int:
    n = int(sys.argv[1])
    if os.environ.get("DATA") == "randn":
        a = torch.randn(n, n, device="cuda", dtype=torch.float16)
        bt = torch.randn(n, n, device="cuda", dtype=torch.float16)
    else:   # the measured tables' data (check.random_array)
        a, bt = TC._inputs(n, torch, torch.float16)
    outs = {False: torch.empty(n, n, device="cuda", dtype=torch.float32),
            True: torch.empty(n, n, device="cuda", dtype=torch.float16)}
    ref = (a.float() @ bt.float().T)
    flop = 2 * n**3

    specs = sys.argv[2:]
    rounds = int(os.environ.get("ROUNDS", "5"))
    checked, info = [], {}
    for spec in specs:
        cfg, f16, src = parse(spec)
        use_source(src)
        out = outs[f16]
        out.fill_(float("nan"))
        MM.gemm_mma_raw(a, bt, out, cfg)
        err = float(((out.float() - ref).abs().max() / ref.abs().max()).item())
        if not err < (2e-3 if f16 else 1e-4):
            print(f"{spec:44} WRONG: max rel err {err:.1e}, not timed")
            continue
        fn = MM._kernel(cfg.validate(), False, f16, False)
        checked.append((spec, cfg, out, src))
        info[spec] = (f"regs {fn.num_regs:3} local {fn.local_size_bytes:4} B  "
                      f"smem {cfg.smem_bytes() // 1024:3} KiB err {err:.1e}")
    # each round: cuBLAS and every spec, one burst each, the order reversed every other
    # round; per spec the median over rounds of cuBLAS's time over its own in that round
    pairs = [("cuBLAS fp16", lambda: a @ bt.T)] + [
        (spec, lambda cfg=cfg, out=out, src=src: (use_source(src),
                                                    MM.gemm_mma_raw(a, bt, out, cfg)))
        for spec, cfg, out, src in checked]
    race = timing.burst_rounds(pairs, lambda fn: bench.time_gpu(fn, repeat=5).median_ms, rounds)
    for spec, r in race.items():
        print(f"{spec:44} {info.get(spec, ''):44} {flop / r['ms'] / 1e9:6.1f} TFLOP/s "
              f"{r['pct_library']:5.1f}% of cuBLAS ({r['pct_low']:.1f}-{r['pct_high']:.1f}, "
              f"{rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
