"""Batch-1 1x1 layers through the one-launch GEMM, for Nsight Compute:

    ncu --kernel-name regex:flat_igemm --launch-skip 3 --launch-count 1 \
        python3 tools/gpu/flat_profile.py 512,2048,7,1

Arguments: C,K,H,stride per layer (batch 1, 1x1, no padding). Prints the tile chosen
and the queued GPU time beside cuDNN fp32. TILE=BM,BN,SPLIT,KS forces a tile (e.g.
TILE=32,32,2,2) instead of `flat_igemm_cuda.choose`'s.
"""

import os
import sys

import convlab

convlab.setup("gpu")
import cupy as cp  # noqa: E402
import torch  # noqa: E402

from convlab import bench as timing  # noqa: E402
from convlab.kernels import flat_igemm_cuda as F  # noqa: E402


def main() -> int:
    torch.backends.cudnn.allow_tf32 = False
    tile = os.environ.get("TILE")
    conv = (F.make_launcher(F.Tile(*(int(v) for v in tile.split(",")))) if tile
            else F.conv2d_flat_igemm_cuda)
    for spec in sys.argv[1:]:
        c, k, h, s = (int(v) for v in spec.split(","))
        x = cp.random.standard_normal((1, c, h, h), dtype=cp.float32)
        w = cp.random.standard_normal((k, c, 1, 1), dtype=cp.float32)
        p = (h - 1) // s + 1
        out = cp.empty((1, k, p, p), cp.float32)
        run = lambda x=x, w=w, out=out, s=s: conv(x, w, out, stride=s)  # noqa: E731
        for _ in range(4):
            run()
        tx, tw = torch.as_tensor(x, device="cuda"), torch.as_tensor(w, device="cuda")
        ref = torch.nn.functional.conv2d(tx.double(), tw.double(), stride=s)
        err = float((torch.as_tensor(out, device="cuda").double() - ref).abs().max())
        ours = timing.time_gpu_queued(run, calls=50, repeat=7).median_ms
        lib_run = lambda tx=tx, tw=tw, s=s: torch.nn.functional.conv2d(tx, tw, stride=s)  # noqa: E731
        lib = timing.time_gpu_queued(lib_run, calls=50, repeat=7).median_ms
        plan = next(v for kk, v in F._PLANS.items() if kk[0] == x.shape and kk[1] == w.shape)
        print(f"{spec:14} tile {plan['tile']!s:14} grid {plan['grid']} err {err:.1e} "
              f"ours {ours * 1e3:6.1f} us  cuDNN {lib * 1e3:6.1f} us  {100 * lib / ours:4.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
