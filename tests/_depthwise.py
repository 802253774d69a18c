"""Cases shared by the tests of the stride-1 "same"-padding depthwise kernels (the strips
and the window kernels): launches they must refuse, and the GPU check of a launcher over
tilings."""

from __future__ import annotations

import numpy as np
import pytest

from convlab import check
from convlab.kernels import Unsupported

from ._emulate import assert_close_to_reference

# (arguments that differ from a valid 3x3 launch on (1, 3, 8, 8), the refusal's words)
SAME_PADDING_REFUSALS = [
    (dict(stride=2), "stride 1"),
    (dict(padding=0), "same"),
    (dict(w=np.ones((3, 1, 7, 7), np.float32), padding=3), "up to 5"),
]
GPU_SHAPES = [(32, 512, 14, 14), (2, 32, 112, 112), (3, 5, 13, 15), (2, 6, 7, 10)]


def assert_refused(launch, kw: dict, match: str, tiling_keys=("v", "u", "threads",
                                                               "min_blocks")) -> None:
    """launch(x, w, out, stride, padding, **tiling) raises Unsupported(match) for a valid
    launch changed by kw (tiling keys go to the tiling; out follows stride and padding)."""
    kw = dict(kw)
    args = dict(x=np.zeros((1, 3, 8, 8), np.float32), w=np.ones((3, 1, 3, 3), np.float32),
                out=np.zeros((1, 3, 8, 8), np.float32), stride=1, padding=1)
    tiling = {k: kw.pop(k) for k in tiling_keys if k in kw}
    args.update(kw)
    if args["stride"] == 2:
        args["out"] = np.zeros((1, 3, 4, 4), np.float32)
    if args["padding"] == 0:
        args["out"] = np.zeros((1, 3, 6, 6), np.float32)
    with pytest.raises(Unsupported, match=match):
        launch(args["x"], args["w"], args["out"], args["stride"], args["padding"], **tiling)


def assert_launcher_on_gpu(launch, shape, tilings) -> None:
    """launch on a real GPU, every tiling, NaN-poisoned output, against float64."""
    from numba import cuda

    rng = np.random.default_rng(shape[3])
    x = check.random_array(shape, rng)
    w = check.random_array((shape[1], 1, 3, 3), rng)
    for cfg in tilings:
        out = cuda.to_device(check.poisoned(shape))
        launch(cuda.to_device(x), cuda.to_device(w), out, 1, 1, **cfg)
        assert_close_to_reference(out.copy_to_host(), x, w, padding=1, groups=shape[1])
