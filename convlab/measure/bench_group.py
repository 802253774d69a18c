"""`convlab bench` as a measurement group (lessons 08 and 13): the ladder race.

"bench" runs `ladder.run_ladder` (every conv kernel against cuDNN / cuBLAS on the three
ResNet layers, the GEMM ladder, the batch sweep) and stores its entries at the top level
of the main results file, beside the tile sweep; "summary" keeps the headline numbers;
"pictures" redraws the four figures next to the file.
"""

from __future__ import annotations

from .. import ladder, problems
from .harness import Group, Skip

GROUP = Group("bench", layout="flat", file="bench")
section = GROUP.section
PICTURES = (("ladder", ladder.plot_ladder), ("roofline", ladder.plot_roofline),
            ("gemm_ladder", ladder.plot_gemm_ladder), ("batch_sweep", ladder.plot_batch_sweep))


@section("bench", lessons=("08", "13"), spread=True)
def bench(ctx):
    if not ctx.dry:
        res = ladder.run_ladder(problems.RESNET, clock=ctx.clock)
    else:  # two rungs, and the CUDA C one that cannot run here (a not-timed row)
        from ..kernels import CONV_LADDER, GEMM_LADDER, conv2d_implicit_gemm_cuda

        kernels = dict(naive=CONV_LADDER["naive"], coalesced=CONV_LADDER["coalesced"],
                       implicit_gemm_cuda=conv2d_implicit_gemm_cuda)
        res = ladder.run_ladder(("resnet256",), repeat=3, kernels=kernels, clock=ctx.clock,
                                batches=(1,), sweep_kernels={"naive": CONV_LADDER["naive"]},
                                gemm_kernels=dict(list(GEMM_LADDER.items())[:1]), gemm_n=24)
    for key in ("date", "python", "versions", "compute_capability"):
        res.pop(key, None)  # the group's environment says these
    return res


@section("summary", lessons=("08", "13"))
def summary(ctx):
    if not ctx.data.get("ladders"):
        raise Skip("no ladder in this results file")
    return ladder.summary(ctx.data)


@section("pictures", lessons=("08", "13"))
def pictures(ctx):
    """The ladder's four figures as <prefix>_<name>.png next to the results file."""
    if ctx.out is None or ctx.dry:
        raise Skip("no output folder" if ctx.out is None else "dry run")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, fn in PICTURES:
        path = ctx.out / (f"{ctx.prefix}_{name}.png" if ctx.prefix else f"{name}.png")
        try:
            fig = fn(ctx.data, path)
        except KeyError:  # a part that was not run
            continue
        plt.close(fig)
        written.append(path.name)
    return written
