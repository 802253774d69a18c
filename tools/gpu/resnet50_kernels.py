"""Distinct ResNet-50 convs at chosen batch sizes, chosen kernels against cuDNN fp32 (each
checked against float64 first): `ladder.run_resnet50`, results in $OUT/resnet50.json.

    python3 tools/gpu/resnet50_kernels.py 1 implicit_gemm_tuned,implicit_gemm_cuda
    python3 tools/gpu/resnet50_kernels.py 32,1,128 implicit_gemm_cuda,winograd_f4_cuda 3x3

Kernel names: the conv ladder's (`convlab.kernels.CONV_LADDER`) and the ones raced beside
it (`convlab.ladder.beside_kernels`); the optional third argument keeps the layers whose
name starts with it ("3x3", "1x1", "stem"). BUDGET_S=400: rows not started within 400 s
are listed as skipped (batch by batch, so the first batch size is complete first).
"""

import os
import sys

import convlab

convlab.setup()
from convlab import ladder, problems  # noqa: E402
from convlab.kernels import CONV_LADDER  # noqa: E402

batches = tuple(int(b) for b in (sys.argv[1] if len(sys.argv) > 1 else "1").split(","))
names = (sys.argv[2] if len(sys.argv) > 2 else "implicit_gemm_tuned,implicit_gemm_cuda")
prefix = sys.argv[3] if len(sys.argv) > 3 else ""
known = {**CONV_LADDER, **ladder.beside_kernels()}
kernels = {k: known[k] for k in names.split(",")}
layers = [lay for lay in problems.RESNET50 if lay.name.startswith(prefix)]
budget = float(os.environ["BUDGET_S"]) if os.environ.get("BUDGET_S") else None  # rows not
ladder.run_resnet50(batches, os.environ.get("OUT", "."), kernels, repeat=8, layers=layers,
                    budget_s=budget)   # started after BUDGET_S seconds: listed as skipped
