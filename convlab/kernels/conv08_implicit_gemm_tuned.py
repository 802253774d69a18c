"""Ladder step 8: the warp-tiled implicit GEMM of step 7 with its tile shape chosen per layer.

No single tile shape is best for every layer. A block tile of BM filters x BN pixels
makes ceil(K/BM) * ceil(N*P*Q/BN) blocks: 64 filters (ResNet's first 3x3 layers) waste
half of a 128-filter tile, and a late layer (256 filters, 14x14 at batch 32: 6272
pixels) has only 98 tiles of 128x128 for 132 SMs. Smaller tiles fill the GPU but reuse
each loaded value fewer times (a 64x64 tile loads twice as much per FMA as 128x128).

`choose` answers per layer shape: first from the table that the H200 sweep measured
(convlab/results/h200.json, "tuned" / "numba"; `python -m convlab measure 09`,
`convlab.autotune`), else `heuristic`. On the H200 the answer was 64x128x16 for all three
ResNet layers, not the tile-count rule above: with
8x8 outputs per thread, 128 threads per block and ~128-170 registers, several blocks
share an SM, and that hid the latency better than bigger tiles reused data. Under the
simulator `heuristic` picks a small 32x32 tile (4x4 per thread) so that checks run
fast; the kernel code is the same.
"""

from __future__ import annotations

from ..runtime import is_simulator
from . import conv07_implicit_gemm_warp_tiled as c7
from ._launch import picked_launcher


def heuristic(p) -> c7.Config:
    """64 filters x 128 pixels x 16 channels: on the H200 (batch 32) the best or
    within 5% of the best shape on all three ResNet layers."""
    if is_simulator():
        return c7.Config(32, 32, 8, 4, 4)
    return c7.Config(64, 128, 16)


def choose(p) -> c7.Config:
    """The tile shape for ConvParams p: the H200 autotuning table, else `heuristic`."""
    from .. import results

    if not is_simulator():
        cfg = results.tuned("numba").get(results.problem_key(p))
        if cfg:
            return c7.Config(**cfg)
    return heuristic(p)


conv2d_implicit_gemm_tuned = picked_launcher(
    "conv2d_implicit_gemm_tuned", c7.launcher_for, choose,
    "conv07's kernel with the tile shape `choose` picks for this layer.")


KERNEL, SIGNATURE = c7.KERNEL, c7.SIGNATURE
conv2d_implicit_gemm_tuned.kernel = KERNEL
