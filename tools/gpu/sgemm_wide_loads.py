"""The Numba GEMM ladder with its fifth rung (gemm05_wide_loads, 16-byte global loads) over
tiles, beside cuBLAS fp32 (TF32 off), in one process.

    COMMIT=<tree> python3 tools/gpu/sgemm_wide_loads.py [n]   # table last
    TILES=128x64x16,128x256x8/16x8 ...                        # other gemm05 tiles

Writes $OUT/<card>_gemm_wide_loads.json (h200_... is the file lesson 09 reads), with the
stored file's SASS counts carried over.

First `check.check_gemm` on the module's launcher (odd shapes: the 4-byte build) and a
poisoned 16-byte case of every tile; then `ladder.run_gemm_ladder` at n^3 (4096 on the
H200): every rung of GEMM_LADDER and every tile, each checked against float64 before it is
timed (queued launches, median), ROUNDS times (default 2).
"""

import json
import os
import sys
import time
from pathlib import Path

import convlab

convlab.setup("gpu")
import numpy as np  # noqa: E402

from convlab import check, ladder  # noqa: E402
from convlab.kernels import GEMM_LADDER  # noqa: E402
from convlab.kernels import gemm05_wide_loads as W  # noqa: E402
from convlab.measure import harness  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from sgemm_profile import tile_spec  # noqa: E402  (BMxBNxBK[/TMxTN][:min_blocks])

TILES = "128x64x16,64x64x16,128x128x16,128x256x8/16x8,128x128x16/16x8"


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    t0 = time.time()
    print(check.check_gemm(W.gemm_wide_loads))
    kernels = dict(GEMM_LADDER)
    for spec in os.environ.get("TILES", TILES).split(","):
        kernels[f"wide_loads {spec}"] = W.make(*tile_spec(spec), name=f"wide_loads {spec}")
    c, rng = convlab.runtime.cuda(), np.random.default_rng(1)
    # every tile on a 16-byte case that is no multiple of any tile (ragged K, M and N
    # past the last whole tile), output poisoned first
    a, b = check.random_array((1000, 340), rng), check.random_array((340, 516), rng)
    ref, absref = a.astype(np.float64) @ b, np.abs(a).astype(np.float64) @ np.abs(b)
    for name, fn in kernels.items():
        if name.startswith("wide_loads"):
            out = c.to_device(check.poisoned((1000, 516)))
            fn(c.to_device(a), c.to_device(b), out)
            comp = check.compare(out.copy_to_host(), ref, absref, 340)
            assert comp.ok, f"{name}: {comp.summary()}"
    rounds = [ladder.run_gemm_ladder(n, kernels, repeat=10)
              for _ in range(int(os.environ.get("ROUNDS", "2")))]
    regs = {}
    for name, fn in kernels.items():
        k = getattr(fn, "kernel", None)
        try:
            r = k.get_regs_per_thread()
            regs[name] = max(r.values()) if isinstance(r, dict) else r
        except Exception:  # noqa: BLE001  (CUDA C rungs, or not compiled)
            pass
    result = dict(environment=ladder.environment(),
                  run=dict(commit=harness.commit() or "unknown", command="python3 "
                           "tools/gpu/sgemm_wide_loads.py " + str(n),
                           clock="cuda events (queued launches, median)"),
                  about="The Numba GEMM ladder and gemm05_wide_loads over tiles beside cuBLAS "
                        "fp32 (TF32 off), every output checked against float64 first; rounds "
                        "of the whole list, one after another.",
                  n=n, timed="gemm05_wide_loads itself: the module's launcher (row "
                  "'wide_loads', edge code and all) and its builds over tiles (rows "
                  "'wide_loads <tile>').", module_row="wide_loads", registers=regs,
                  rounds=rounds, seconds=round(time.time() - t0, 1))
    stored = Path(__file__).resolve().parents[2] / "convlab/results/h200_gemm_wide_loads.json"
    if stored.exists():  # the slab loops' SASS counts, computed without a GPU (lesson 09)
        result["sass"] = json.loads(stored.read_text()).get("sass", {})
    out = os.environ.get("OUT", ".")
    card = harness.card_prefix(result["environment"]["device"])
    with open(os.path.join(out, f"{card}_gemm_wide_loads.json"), "w") as f:
        json.dump(result, f, indent=1)
    for r in rounds:
        base = next(x for x in r["rows"] if x["name"] == "cuBLAS")["ms"]
        print(f"\n{'kernel':34s} {'regs':>5s} {'TFLOP/s':>8s} {'% cuBLAS':>9s}")
        for row in r["rows"]:
            print(f"{row['name']:34s} {regs.get(row['name'], ''):>5} {row['tflops']:8.1f} "
                  f"{100 * base / row['ms']:8.1f}%")
        for name, err in r["errors"].items():
            print(f"{name:34s} FAILED {err[:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
