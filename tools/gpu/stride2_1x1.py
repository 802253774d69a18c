"""The strided 1x1 layers two ways, beside cuDNN: the one-launch GEMM on the strided input,
and with the input subsampled first (`flat_igemm_cuda.make_launcher(subsample=True)`: a
dense copy of x[:, :, ::sh, ::sw], then the GEMM at stride 1, both launches timed), each at
the rule's prefetch depth and at 1, 2 and 4; the launcher with its own rules
(`subsample_first`, `prefetch_for`); and the dense GEMM alone, on a copy made beforehand.

    python3 tools/gpu/stride2_1x1.py [BATCHES]   # default 1,32; $OUT/stride2_1x1.json

Every output is checked against float64 (poisoned first) before it is timed with
`bench.time_gpu_queued`.
"""

import json
import os
import sys
from pathlib import Path

import convlab

convlab.setup("gpu")
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

from convlab import baselines, check, problems  # noqa: E402
from convlab import bench as timing  # noqa: E402
from convlab import reference as ref  # noqa: E402
from convlab.kernels import conv_cuda  # noqa: E402
from convlab.kernels import flat_igemm_cuda as F  # noqa: E402

LAYERS = ("1x1 256->512 56x56/2", "1x1 512->1024 28x28/2", "1x1 1024->2048 14x14/2")


def time_us(fn):
    return 1e3 * timing.time_gpu_queued(fn, calls=50, repeat=7).median_ms


def run_layer(layer, batch, rng):
    torch = baselines.set_torch_precision("fp32")
    prob = layer.with_batch(batch)
    kw = prob.kwargs
    p = ref.conv_params(prob.x_shape, prob.w_shape, **kw)
    sh, sw = p.stride
    xh, wh = check.random_array(prob.x_shape, rng), check.random_array(prob.w_shape, rng)
    case = check.reference_case(xh, wh, **kw)
    x, w = cp.asarray(xh), cp.asarray(wh)
    tx, tw = torch.as_tensor(x, device="cuda"), torch.as_tensor(w, device="cuda")
    cudnn = time_us(lambda: torch.nn.functional.conv2d(tx, tw, **kw))
    xs = cp.ascontiguousarray(x[:, :, ::sh, ::sw][:, :, :p.P, :p.Q])   # for the dense GEMM
    runs = {"launcher (its rules)": F.conv2d_flat_igemm_cuda,
            "conv2d_cuda": conv_cuda.conv2d_cuda}
    for sub in (False, True):
        name = "subsampled" if sub else "strided"
        runs[name] = F.make_launcher(subsample=sub)
        for d in (1, 2, 4):
            runs[f"{name} prefetch {d}"] = F.make_launcher(prefetch=d, subsample=sub)
    row = dict(layer=layer.name, batch=batch, cudnn_us=cudnn, rule=str(F.choose(p)),
               subsample_first=F.subsample_first(p),
               dense_rule=str(F.choose(ref.conv_params(xs.shape, prob.w_shape))),
               algorithm=conv_cuda.choose_algorithm(p), configs=[])
    for name, fn in runs.items():
        out = cp.asarray(check.poisoned(p.out_shape))
        fn(x, w, out, **kw)
        comp = check.compare(cp.asnumpy(out), case["expected"], case["absref"],
                             reduction=case["reduction"])
        entry = dict(name=name, ok=bool(comp.ok))
        if comp.ok:
            us = time_us(lambda fn=fn, out=out: fn(x, w, out, **kw))
            entry.update(us=us, pct_cudnn=100 * cudnn / us)
        else:
            entry["error"] = comp.summary()
        row["configs"].append(entry)
    out = cp.empty(p.out_shape, cp.float32)
    row["dense_us"] = time_us(lambda: F.conv2d_flat_igemm_cuda(xs, w, out))
    row["cudnn_us_after"] = time_us(lambda: torch.nn.functional.conv2d(tx, tw, **kw))
    return row


def main(argv) -> int:
    batches = [int(b) for b in (argv[0] if argv else "1,32").split(",")]
    layers = {lay.name: lay for lay in problems.RESNET50}
    rng = np.random.default_rng(1)
    rows = []
    for b in batches:
        for n in LAYERS:
            if n not in layers:
                print(f"unknown layer {n}")
                continue
            row = run_layer(layers[n], b, rng)
            rows.append(row)
            print(f"\n{row['layer']} batch {b}: cuDNN {row['cudnn_us']:.1f} us (after "
                  f"{row['cudnn_us_after']:.1f}); rule {row['rule']}, dense rule "
                  f"{row['dense_rule']}; dense GEMM alone "
                  f"{row['dense_us']:.1f} us; conv2d_cuda picks {row['algorithm']}")
            for c in row["configs"]:
                cell = (f"{c['us']:7.1f} us {c['pct_cudnn']:5.0f}%" if c["ok"]
                        else f"WRONG {c['error'][:60]}")
                print(f"  {c['name']:<40} {cell}")
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "stride2_1x1.json").write_text(json.dumps(dict(rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
