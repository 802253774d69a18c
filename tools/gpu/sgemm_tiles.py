"""The Numba SGEMM's top rung (gemm04_double_buffered) over tiles and launch bounds, beside
cuBLAS fp32 (TF32 off) in the same process: `ladder.run_gemm_ladder` with these kernels
(each checked against float64 first, then timed with queued launches, median).

    python3 tools/gpu/sgemm_tiles.py [n]        # table last; $OUT/sgemm_tiles.json
    CONFIGS=128x64x16,256x128x8/8x16 python3 tools/gpu/sgemm_tiles.py   # these only

A configuration is BMxBNxBK, outputs per thread TMxTN (default 8x8) and min_blocks (the
blocks per SM the registers must allow: launch bounds; "-" leaves it to the compiler);
CONFIGS spells them BMxBNxBK[/TMxTN][:min_blocks]. ROUNDS=k times the whole list k times.
"""

import json
import os
import sys
from pathlib import Path

import convlab

convlab.setup("gpu")
from convlab import ladder  # noqa: E402
from convlab.kernels import gemm04_double_buffered as G  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from sgemm_profile import tile_spec  # noqa: E402  (the CONFIGS spelling)

CONFIGS = [(128, 64, 16, None), (128, 64, 16, 3), (128, 64, 16, 2), (128, 128, 8, None),
           (128, 128, 16, None), (128, 128, 8, 2), (64, 128, 16, 3), (128, 64, 8, 3),
           (256, 64, 16, 1), (128, 128, 16, 2)]


def configs() -> list[tuple]:
    """(BM, BN, BK, TM, TN, min_blocks): CONFIGS from the environment, else the list above."""
    if not os.environ.get("CONFIGS"):
        return [(bm, bn, bk, 8, 8, mb) for bm, bn, bk, mb in CONFIGS]
    return [tile_spec(spec) for spec in os.environ["CONFIGS"].split(",")]


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    kernels = {}
    for bm, bn, bk, tm, tn, mb in configs():
        name = f"{bm}x{bn}x{bk}" + (f" {tm}x{tn}" if (tm, tn) != (8, 8) else "") + f" mb{mb or '-'}"
        k = G.make_kernel(BM=bm, BN=bn, BK=bk, TM=tm, TN=tn, min_blocks=mb)
        kernels[name] = G.make_launcher(k, name)
    kernels["module default " + "x".join(str(G.KERNEL.tile[k]) for k in ("BM", "BN", "BK"))] = \
        G.gemm_double_buffered
    results = [ladder.run_gemm_ladder(n, kernels, repeat=10)
               for _ in range(int(os.environ.get("ROUNDS", "1")))]
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "sgemm_tiles.json"), "w") as f:
        json.dump(results, f, indent=1)
    for r in results:
        print(f"\n{'config':28s} {'TFLOP/s':>8s} {'% cuBLAS':>9s}")
        base = next(x for x in r["rows"] if x["name"] == "cuBLAS")["tflops"]
        for row in r["rows"]:
            print(f"{row['name']:28s} {row['tflops']:8.1f} {100 * row['tflops'] / base:8.1f}%")
        for name, err in r["errors"].items():
            print(f"{name:28s} FAILED {err[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
