"""Every distinct ResNet-50 conv at one batch size, chosen kernels against cuDNN fp32 (each
checked against float64 first); JSON to $OUT/b<batch>.json. The split-K follow-up run:

    python3 tools/gpu/batch1_split_k.py 1 implicit_gemm_tuned,implicit_gemm_cuda
    python3 tools/gpu/batch1_split_k.py 32 implicit_gemm_cuda
"""

import json
import os
import sys

import convlab

convlab.setup()
from convlab import ladder, problems  # noqa: E402
from convlab.kernels import CONV_LADDER  # noqa: E402

batch = int(sys.argv[1]) if len(sys.argv) > 1 else 1
names = sys.argv[2].split(",") if len(sys.argv) > 2 else ["implicit_gemm_tuned",
                                                          "implicit_gemm_cuda"]
r = ladder.run_batch_sweep(problems.RESNET50, (batch,), {k: CONV_LADDER[k] for k in names},
                           repeat=8)
with open(os.path.join(os.environ.get("OUT", "."), f"b{batch}.json"), "w") as f:
    json.dump(r, f, indent=1)
ladder.print_results({"batch_sweep": r})
print(ladder.sweep_summary_table(ladder.sweep_summary(r)))
