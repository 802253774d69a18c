"""One launch of the mma.sync conv (the tile `choose_conv` picks, fp16 out) and one of
cuDNN's fp16 NHWC conv per ResNet layer (batch 32), each checked: the kernels an Nsight
Compute run profiles side by side.

    ncu --nvtx --nvtx-include "profile/" --section SpeedOfLight ... \\
        python3 tools/gpu/mma_conv_profile.py [resnet64,resnet128,resnet256]

The launches to profile run inside the NVTX range "profile", after warm-up calls (which
let cuDNN's benchmark mode pick its algorithm). ``--parse NCU.txt`` turns that text report
(this script's output included) into the "layers" of `convlab/results/h200_mma_conv_ncu.json`.
"""

import json
import re
import sys

# the report's metrics kept, by (name, unit) -> key
METRICS = {("SM Frequency", "Ghz"): "sm_clock_ghz", ("Duration", "us"): "duration_us",
           ("Compute (SM) Throughput", "%"): "sm_throughput_pct",
           ("Memory Throughput", "%"): "memory_throughput_pct",
           ("L1/TEX Cache Throughput", "%"): "l1_throughput_pct",
           ("Issue Slots Busy", "%"): "issue_slots_busy_pct",
           ("Active Warps Per Scheduler", "warp"): "active_warps_per_scheduler",
           ("Eligible Warps Per Scheduler", "warp"): "eligible_warps_per_scheduler",
           ("Registers Per Thread", "register/thread"): "registers_per_thread",
           ("Block Limit Registers", "block"): "block_limit_registers",
           ("Block Limit Shared Mem", "block"): "block_limit_shared_mem",
           ("Waves Per SM", ""): "waves_per_sm",
           ("Achieved Occupancy", "%"): "achieved_occupancy_pct"}
_KERNEL = re.compile(r"^  (\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context", re.M)
_ROW = re.compile(r"^    ([A-Z#][\w#/ ().%-]*?)\s{2,}(?:([\w/%]+)\s{2,})?([\d,]+(?:\.\d+)?)\s*$",
                  re.M)   # name, unit (optional), value
_PIPE = re.compile(r"INF   (\w+) is the highest-utilized pipeline \(([\d.]+)%\)")


def parse(text: str) -> list[dict]:
    """Each kernel of an ncu text report: name, grid, block, the METRICS, the pipeline ncu
    names as most used (with its % of peak over the elapsed cycles)."""
    heads = list(_KERNEL.finditer(text))
    out = []
    for i, h in enumerate(heads):
        body = text[h.end():heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        k = dict(kernel=h[1], grid=[int(v) for v in h.groups()[1:4]],
                 block=[int(v) for v in h.groups()[4:7]])
        for r in _ROW.finditer(body):
            key = METRICS.get((r[1].strip(), r[2] or ""))
            if key:
                k[key] = float(r[3].replace(",", ""))
        if m := _PIPE.search(body):
            k["top_pipeline"], k["top_pipeline_pct"] = m[1], float(m[2])
        out.append(k)
    return out


def layers(text: str) -> list[dict]:
    """Per layer this script profiled (its "resnetNN: CONFIG (...)" lines, in order): the
    config and the two kernels, ours first, then cuDNN's."""
    picks = re.findall(r"^(resnet\d+): (.*?) \(\d+ threads\)", text, re.M)
    ks = parse(text)
    if len(ks) != 2 * len(picks) or any(k["kernel"] != "mma_sync_kernel" for k in ks[::2]):
        raise ValueError(f"expected ours then cuDNN's kernel per layer: {len(picks)} layers, "
                         f"{len(ks)} kernels")
    return [dict(layer=name, config=cfg, ours=ks[2 * i], cudnn=ks[2 * i + 1])
            for i, (name, cfg) in enumerate(picks)]


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--parse":
        with open(sys.argv[2]) as f:
            print(json.dumps(layers(f.read()), indent=1))
        return 0
    import convlab

    convlab.setup("gpu")
    import torch
    import torch.nn.functional as F

    from convlab import problems
    from convlab.kernels import mma02_gemm_conv_cuda as MM
    from convlab.kernels._launch import sm_count
    from convlab.measure import tensor_cores as TC

    names = sys.argv[1].split(",") if len(sys.argv) > 1 else problems.RESNET
    torch.backends.cudnn.benchmark = True
    for lname in names:
        prob = problems.conv_layer(lname)
        N, K, P, Q = prob.out_shape
        x, w, x_nhwc, w_krsc, exp, absref = TC._conv_inputs(prob, torch, torch.float16)
        cfg = MM.choose_conv(K, N * P * Q, sm_count())
        exp_t, abs_t = (torch.as_tensor(a, device="cuda") for a in (exp, absref))
        out = torch.empty((N, P, Q, K), device="cuda", dtype=torch.float16)
        x_cl = x.contiguous(memory_format=torch.channels_last)
        w_cl = w.contiguous(memory_format=torch.channels_last)
        for _ in range(3):   # warm-up; cuDNN's benchmark mode picks its algorithm here
            MM.conv2d_mma_nhwc(x_nhwc, w_krsc, out, cfg=cfg, **prob.kwargs)
            y = F.conv2d(x_cl, w_cl, **prob.kwargs)
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("profile")
        MM.conv2d_mma_nhwc(x_nhwc, w_krsc, out, cfg=cfg, **prob.kwargs)
        y = F.conv2d(x_cl, w_cl, **prob.kwargs)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        errs = [float(((v.double() - exp_t).abs() / abs_t.clamp_min(1e-30)).max())
                for v in (out, y.permute(0, 2, 3, 1))]
        print(f"{lname}: {cfg} ({cfg.threads} threads), max rel err {errs[0]:.1e}; cuDNN "
              f"{errs[1]:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
