import json, os, convlab
convlab.setup()
from convlab import ladder, problems
from convlab.kernels import CONV_LADDER as L
r = ladder.run_batch_sweep(problems.RESNET50, (1,), {k: L[k] for k in ("implicit_gemm_tuned", "implicit_gemm_cuda")}, repeat=8)
json.dump(r, open(os.environ["OUT"] + "/b1.json", "w"), indent=1)
ladder.print_results({"batch_sweep": r})
print(ladder.sweep_summary_table(ladder.sweep_summary(r)))
