"""One launch of the Numba SGEMM's top rung (gemm04_double_buffered, the module's tile) and
one of cuBLAS's SGEMM (CuPy, TF32 off) at n^3, each checked against float64: the kernels an
Nsight Compute run profiles side by side.

    ncu --nvtx --nvtx-include "profile/" --clock-control none --section SpeedOfLight \\
        --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \\
        --section InstructionStats --section Occupancy --section LaunchStats \\
        --metrics "$(python3 tools/gpu/sgemm_profile.py --metrics)" \\
        python3 tools/gpu/sgemm_profile.py [n]
    python3 tools/gpu/sgemm_profile.py --parse NCU.txt     # -> JSON on stdout
    python3 tools/gpu/sgemm_profile.py --sass              # the slab loop's SASS, counted
    TILE=128x256x8/16x8 ...                                # another tile (`tile_spec`)

The launches to profile run inside the NVTX range "profile", after warm-up calls. The
metrics added to the sections: FFMA instructions, all instructions and the FMA pipe's busy
cycles (is the kernel issuing anything but FMAs?), and the stall reasons per issued
instruction (`convlab.measure.profile.STALLS`).
"""

import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mma_conv_profile import parse  # noqa: E402  (the section rows of a text report)

EXTRA = {"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": "ffma_thread_instructions",
         "smsp__inst_executed.sum": "warp_instructions",
         "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": "fma_pipe_active_pct"}
ROWS = {"duration_ms": r"Duration\s+ms\s+([\d.]+)",   # section rows `parse` does not keep
        "issued_warp_per_scheduler": r"Issued Warp Per Scheduler\s+([\d.]+)",
        "no_eligible_pct": r"No Eligible\s+%\s+([\d.]+)",
        "warp_cycles_per_issue": r"Warp Cycles Per Issued Instruction\s+cycle\s+([\d.]+)"}
_METRIC = re.compile(r"^    ([a-z][\w.]+)\s+(?:\S+\s+)?([\d,]+(?:\.\d+)?)\s*$", re.M)


def metric_names() -> list[str]:
    from convlab.measure.profile import STALLS, stall_metric

    return list(EXTRA) + [stall_metric(r) for r in STALLS]


def parse_report(text: str) -> list[dict]:
    """Each kernel of the report: `parse`'s section values, EXTRA's metrics, the stall
    reasons (warps per issued instruction) and the share of FFMAs among warp instructions."""
    from convlab.measure.profile import STALLS, stall_metric

    stall_of = {stall_metric(r): r for r in STALLS}
    kernels = parse(text)
    bodies = re.split(r"^  \S.*?\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\), Context.*$", text,
                      flags=re.M)[1:]
    for k, body in zip(kernels, bodies, strict=True):
        k["stalls"] = {}
        for key, pattern in ROWS.items():
            if m := re.search(pattern, body):
                k[key] = float(m[1])
        for name, value in _METRIC.findall(body):
            v = float(value.replace(",", ""))
            if name in EXTRA:
                k[EXTRA[name]] = v
            elif name in stall_of:
                k["stalls"][stall_of[name]] = v
        if k.get("warp_instructions"):
            k["ffma_share_pct"] = 100 * k.get("ffma_thread_instructions", 0) / 32 \
                / k["warp_instructions"]
    return kernels


def loop_mix(sass: str) -> dict:
    """Opcodes of the longest loop in a SASS listing (the slab loop: the backward branch
    that jumps furthest), counted: {"instructions": n, "FFMA": ..., ...}. Branch targets
    may be addresses (cuobjdump) or labels (nvdisasm)."""
    ins, labels, pending = [], {}, []
    for line in sass.splitlines():
        if m := re.match(r"\s*(\.L\w+):", line):
            pending.append(m[1])
        elif m := re.search(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)"
                            r"([^;]*);", line):
            at = int(m[1], 16)
            labels.update((name, at) for name in pending)
            pending = []
            ins.append((at, m[2].split(".")[0], m[3]))

    def target(rest):
        if t := re.search(r"(\.L\w+)", rest):
            return labels.get(t[1])
        t = re.search(r"0x([0-9a-f]+)", rest)
        return int(t[1], 16) if t else None

    loops = [(t, at) for at, op, rest in ins if op == "BRA"
             for t in [target(rest)] if t is not None and t < at]
    lo, hi = max(loops, key=lambda span: span[1] - span[0])
    body = [op for at, op, _ in ins if lo <= at <= hi]
    mix = {op: body.count(op) for op in sorted(set(body), key=body.count, reverse=True)}
    return dict(instructions=len(body), **mix)


def tile_spec(spec: str) -> tuple:
    """"BMxBNxBK[/TMxTN][:min_blocks]" -> (BM, BN, BK, TM, TN, min_blocks): a gemm04 tile,
    its outputs per thread (default 8x8) and launch bounds (default none)."""
    spec, _, mb = spec.partition(":")
    tile, _, per = spec.partition("/")
    bm, bn, bk = (int(v) for v in tile.split("x"))
    tm, tn = (int(v) for v in per.split("x")) if per else (8, 8)
    return bm, bn, bk, tm, tn, int(mb) if mb else None


def kernel_of(G):
    """The module's kernel, or make_kernel's for TILE (`tile_spec`) from the environment."""
    if not os.environ.get("TILE"):
        return G.KERNEL
    bm, bn, bk, tm, tn, mb = tile_spec(os.environ["TILE"])
    return G.make_kernel(BM=bm, BN=bn, BK=bk, TM=tm, TN=tn, min_blocks=mb)


def main(argv) -> int:
    if argv[:1] == ["--metrics"]:
        print(",".join(metric_names()))
        return 0
    if argv[:1] == ["--parse"]:
        print(json.dumps(parse_report(Path(argv[1]).read_text()), indent=1))
        return 0
    import convlab

    convlab.setup("gpu")
    if argv[:1] == ["--sass"]:   # the kernel as this GPU's toolchain compiles it
        from convlab.kernels import gemm04_double_buffered as G

        k = kernel_of(G)
        k.compile(G.SIGNATURE)
        sass, regs = k.inspect_sass(), k.get_regs_per_thread()
        text = sass if isinstance(sass, str) else "\n".join(sass.values())
        regs = max(regs.values()) if isinstance(regs, dict) else regs
        print(json.dumps(dict(tile=k.tile, regs=int(regs), loop=loop_mix(text))))
        return 0
    import cupy as cp
    import numpy as np
    import torch

    from convlab import check
    from convlab.kernels import gemm04_double_buffered as G

    n = int(argv[0]) if argv else 4096
    gemm = G.make_launcher(kernel_of(G))
    rng = np.random.default_rng(0)
    a, b = check.random_array((n, n), rng), check.random_array((n, n), rng)
    ad, bd = cp.asarray(a), cp.asarray(b)
    ours, theirs = cp.empty_like(ad), cp.empty_like(ad)
    for _ in range(3):   # warm-up (compiles the Numba kernel)
        gemm(ad, bd, ours)
        cp.matmul(ad, bd, out=theirs)
    ours.fill(np.nan)
    theirs.fill(np.nan)
    cp.cuda.Device().synchronize()
    torch.cuda.nvtx.range_push("profile")
    gemm(ad, bd, ours)
    cp.matmul(ad, bd, out=theirs)
    cp.cuda.Device().synchronize()
    torch.cuda.nvtx.range_pop()
    exp = a.astype(np.float64) @ b.astype(np.float64)
    absref = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    for name, out in ((f"gemm04 {gemm.kernel.tile}", ours), ("cuBLAS", theirs)):
        comp = check.compare(cp.asnumpy(out), exp, absref, n)
        print(f"{name} {n}^3: {'ok' if comp.ok else 'WRONG'} (max rel err {comp.max_rel:.1e})",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
