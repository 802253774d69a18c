"""The mma.sync conv from two versions of csrc/mma_sync.cu, raced in one process: the
working tree's and BASE's (a path to another copy of the file), each checked against
float64, then timed beside cuDNN fp16 NHWC in interleaved rounds, on the three ResNet layers
(batch 32, fp16 NHWC in and out). A same-size GEMM with the layer's tile (M = N P Q, N = K,
K = R S C; no gather) is timed beside them: what the tile reaches without the conv's loader.
Medians of ROUNDS rounds (default 5); a table last, JSON in $OUT/mma_conv_ab.json.

    . tools/device_env.sh && BASE=/tmp/mma_sync_base.cu OUT=/tmp/out \\
        python3 tools/gpu/mma_conv_ab.py

TILES=BMxBNxBK/WMxWN/STAGES[/kKSLICE][/SWITCH=V...],... adds tiles (the conv's switches on)
beside each layer's choice, timed from the working tree's source only.
"""

import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import convlab

convlab.setup("gpu")
from convlab import problems  # noqa: E402
from convlab.kernels import mma02_gemm_conv_cuda as MM  # noqa: E402
from convlab.kernels._launch import sm_count  # noqa: E402
from convlab.measure import tensor_cores as TC  # noqa: E402
from convlab.measure.clock import GpuClock  # noqa: E402
from convlab.measure.harness import Context  # noqa: E402
from convlab.measure.lessons12_13 import rtol_for  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", 5))
CUDNN = "cuDNN fp16 NHWC"


def parse_tiles(spec: str) -> list:
    """'BMxBNxBK/WMxWN/STAGES[/kKSLICE][/SWITCH=V...],...' -> MmaConfigs with the conv's
    switches (SWITCH: any MmaConfig field, e.g. SERPENTINE=1)."""
    out = []
    for item in filter(None, spec.split(",")):
        tile, warp, stages, *rest = item.split("/")
        bm, bn, bk = (int(v) for v in tile.split("x"))
        wm, wn = (int(v) for v in warp.split("x"))
        extra = dict(MM.CONV_SWITCHES, KSLICE=1)
        for r in rest:
            key, _, val = r.partition("=")
            extra.update({key: int(val)} if val else {"KSLICE": int(r.lstrip("k"))})
        out.append(replace(MM.STEP3, BM=bm, BN=bn, BK=bk, WM=wm, WN=wn, STAGES=int(stages),
                           **extra))
    return out


def run_layer(ctx, lname, sources, extra):
    import torch
    import torch.nn.functional as F

    prob = problems.conv_layer(lname)
    kw = prob.kwargs
    N, K, P, Q = prob.out_shape
    M, Kd = N * P * Q, prob.C * prob.R * prob.S
    x, w, x_nhwc, w_krsc, exp, absref = TC._conv_inputs(prob, torch, torch.float16)
    out = torch.empty(N, P, Q, K, device="cuda", dtype=torch.float16)
    tol = rtol_for("fp16", Kd)
    chosen = MM.choose_conv(K, M, sm_count())
    entries = [(f"{tag} {chosen}", src, chosen) for tag, src in sources.items()]
    entries += [(f"tree {c}", sources["tree"], c) for c in extra if c != chosen]

    # the GEMM of the same size with the chosen tile (its GEMM loader), checked too
    a, bt = (torch.randn(r, Kd, device="cuda").to(torch.float16) for r in (M, K))
    gout = torch.empty(M, K, device="cuda", dtype=torch.float16)
    gref = TC._reference(a, bt)
    gcfg = replace(chosen, TAPS=0, GPTR=1)

    x_cl = x.contiguous(memory_format=torch.channels_last)
    w_cl = w.contiguous(memory_format=torch.channels_last)
    torch.backends.cudnn.benchmark = True
    rows, times = [], {}
    for _ in range(ROUNDS):
        TC._try(rows, CUDNN, lambda: TC._library_row(
            ctx, CUDNN, lambda: F.conv2d(x_cl, w_cl, **kw), prob.flops, "fp16", queued=True))
        times.setdefault(CUDNN, []).append(rows[-1].get("ms"))
        for name, src, cfg in entries:
            MM._kernel = compiled[src]
            TC._try(rows, name, lambda name=name, cfg=cfg: TC._check_then_time(
                ctx, name, lambda: MM.conv2d_mma_nhwc(x_nhwc, w_krsc, out, cfg=cfg, **kw),
                out, exp, absref, tol, prob.flops, queued=True))
            times.setdefault(name, []).append(rows[-1].get("ms"))
        MM._kernel = compiled[sources["tree"]]
        gname = f"GEMM {M}x{K}x{Kd} {gcfg}"
        TC._try(rows, gname, lambda gname=gname: TC._check_then_time(
            ctx, gname, lambda: MM.gemm_mma_raw(a, bt, gout, cfg=gcfg), gout, *gref,
            rtol_for("fp16", Kd), prob.flops, queued=True))
        times.setdefault(gname, []).append(rows[-1].get("ms"))
    med = {n: statistics.median(t) for n, t in times.items() if t and all(t)}
    base = med.get(CUDNN)
    algo = next((r.get("algorithm") for r in rows if r["name"] == CUDNN), "?")
    return dict(layer=lname, problem=str(prob), chosen=str(chosen), cudnn_algorithm=algo,
                rows=rows,
                medians={n: dict(us=1e3 * m, pct_cudnn=100 * base / m if base else None)
                         for n, m in med.items()})


def table(results) -> str:
    lines = []
    for r in results:
        lines.append(f"{r['layer']} ({r['problem']}; cuDNN ran {r['cudnn_algorithm']}):")
        for n, v in r["medians"].items():
            pct = f"{v['pct_cudnn']:6.1f}%" if v["pct_cudnn"] else "     ?"
            lines.append(f"  {n[:84]:84} {v['us']:8.2f} us {pct}")
    for tag in ("base", "tree"):
        pcts = [r["medians"].get(f"{tag} {r['chosen']}", {}).get("pct_cudnn") for r in results]
        if all(pcts):
            lines.append(f"geomean of the chosen tiles, {tag}: "
                         f"{statistics.geometric_mean(pcts):.1f}% of cuDNN fp16 NHWC "
                         f"({' / '.join(f'{p:.1f}' for p in pcts)})")
    return "\n".join(lines)


compiled = {}


def main() -> int:
    MM.require_sm80()
    sources = {"tree": MM.source()}
    if os.environ.get("BASE"):
        sources = {"base": Path(os.environ["BASE"]).read_text(), **sources}
    for src in sources.values():
        compiled[src] = MM.compiler_for(src)
    extra = parse_tiles(os.environ.get("TILES", ""))
    ctx = Context(clock=GpuClock())
    t0 = time.time()
    results = [run_layer(ctx, lname, sources, extra) for lname in problems.RESNET]
    MM._kernel = compiled[sources["tree"]]
    data = dict(seconds=round(time.time() - t0, 1), rounds=ROUNDS, results=results)
    out_dir = os.environ.get("OUT", ".")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "mma_conv_ab.json"), "w") as f:
        json.dump(data, f, indent=1, default=str)
    print(f"\n{data['seconds']} s\n" + table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
