"""Problem sizes, in one place, scaled for the runtime.

On a real GPU the course uses real layers (ResNet-50's 3x3 convolutions at batch 32);
under the simulator, which spends ~65 µs per CUDA thread, the same names give tiny
shapes so that every notebook still runs top to bottom in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import reference as ref


@dataclass(frozen=True)
class ConvProblem:
    """One convolution layer: x (N, C, H, W), w (K, C, R, S)."""

    name: str
    N: int
    C: int
    H: int
    W: int
    K: int
    R: int = 3
    S: int = 3
    stride: int = 1
    padding: int = 1
    dilation: int = 1
    groups: int = 1  # C for a depthwise layer

    @property
    def x_shape(self):
        return (self.N, self.C, self.H, self.W)

    @property
    def w_shape(self):
        return (self.K, self.C // self.groups, self.R, self.S)

    @property
    def kwargs(self) -> dict:
        kw = dict(stride=self.stride, padding=self.padding, dilation=self.dilation)
        if self.groups != 1:
            kw["groups"] = self.groups
        return kw

    @property
    def out_shape(self):
        return ref.conv_params(self.x_shape, self.w_shape, **self.kwargs).out_shape

    @property
    def flops(self) -> int:
        return ref.conv2d_flops(self.x_shape, self.w_shape, **self.kwargs)

    @property
    def bytes(self) -> int:
        return ref.conv2d_bytes(self.x_shape, self.w_shape, **self.kwargs)

    def with_batch(self, N: int) -> ConvProblem:
        return replace(self, N=N, name=f"{self.name} (batch {N})")

    def __str__(self) -> str:
        s = f"{self.name}: x {self.x_shape}, w {self.w_shape}"
        if self.stride != 1:
            s += f", stride {self.stride}"
        return s + f", pad {self.padding}"


# Real layers (GPU). ResNet-50's 3x3 convolutions at batch 32, its 7x7 stem, batch 1.
GPU_LAYERS = {
    "resnet64": ConvProblem("64ch 56x56", 32, 64, 56, 56, 64),
    "resnet128": ConvProblem("128ch 28x28", 32, 128, 28, 28, 128),
    "resnet256": ConvProblem("256ch 14x14", 32, 256, 14, 14, 256),
    "stem": ConvProblem("stem 7x7/2", 32, 3, 224, 224, 64, 7, 7, stride=2, padding=3),
    "batch1": ConvProblem("64ch 56x56 batch 1", 1, 64, 56, 56, 64),
    # a realistic CPU layer for lessons 02-03
    "cpu": ConvProblem("64ch 56x56 batch 8", 8, 64, 56, 56, 64),
}

# Tiny stand-ins with the same names for the simulator (odd sizes on purpose).
SIM_LAYERS = {
    "resnet64": ConvProblem("64ch 56x56 (sim: 4ch 14x14)", 1, 4, 14, 14, 4),
    "resnet128": ConvProblem("128ch 28x28 (sim: 8ch 10x10)", 1, 8, 10, 10, 8),
    "resnet256": ConvProblem("256ch 14x14 (sim: 8ch 7x7)", 1, 8, 7, 7, 8),
    "stem": ConvProblem("stem 7x7/2 (sim: 3ch 20x20)", 1, 3, 20, 20, 4, 7, 7, stride=2,
                        padding=3),
    "batch1": ConvProblem("64ch 56x56 batch 1 (sim: 4ch 12x12)", 1, 4, 12, 12, 4),
    "cpu": ConvProblem("64ch 56x56 batch 8 (CI: 8ch 20x20)", 2, 8, 20, 20, 8),
}

RESNET = ("resnet64", "resnet128", "resnet256")


def _resnet50() -> tuple:
    """Every distinct convolution of ResNet-50 (v1.5: stride on the 3x3) at 224x224, batch 32:
    the stem, seven 3x3 and fifteen 1x1 layers."""
    out = [ConvProblem("stem 7x7/2", 32, 3, 224, 224, 64, 7, 7, stride=2, padding=3)]
    for c, hw, s in ((64, 56, 1), (128, 56, 2), (128, 28, 1), (256, 28, 2), (256, 14, 1),
                     (512, 14, 2), (512, 7, 1)):
        out.append(ConvProblem(f"3x3 {c}ch {hw}x{hw}" + (f"/{s}" if s > 1 else ""), 32, c, hw,
                               hw, c, stride=s, padding=1))
    for c, k, hw, s in ((64, 64, 56, 1), (64, 256, 56, 1), (256, 64, 56, 1), (256, 128, 56, 1),
                        (256, 512, 56, 2), (128, 512, 28, 1), (512, 128, 28, 1),
                        (512, 256, 28, 1), (512, 1024, 28, 2), (256, 1024, 14, 1),
                        (1024, 256, 14, 1), (1024, 512, 14, 1), (1024, 2048, 14, 2),
                        (512, 2048, 7, 1), (2048, 512, 7, 1)):
        out.append(ConvProblem(f"1x1 {c}->{k} {hw}x{hw}" + (f"/{s}" if s > 1 else ""), 32, c,
                               hw, hw, k, 1, 1, stride=s, padding=0))
    return tuple(out)


RESNET50 = _resnet50()


def _sim() -> bool:
    from .runtime import is_simulator

    return is_simulator()


def conv_layer(name: str, real: bool | None = None) -> ConvProblem:
    """The named layer, real-sized on a GPU, tiny under the simulator (real=None: auto)."""
    table = GPU_LAYERS if (not _sim() if real is None else real) else SIM_LAYERS
    if name not in table:
        raise KeyError(f"unknown layer {name!r}; known: {', '.join(table)}")
    return table[name]


def image_size(real: bool | None = None) -> int:
    """Side of the square single-channel image for the image-filter lessons."""
    return 4096 if (not _sim() if real is None else real) else 48


def gemm_size(real: bool | None = None) -> int:
    """M = N = K of the square GEMMs the course times."""
    return 4096 if (not _sim() if real is None else real) else 40


# CPU-only measurements (lessons 00-03). They are real measurements at any size, so a
# learner without a GPU may ask for the real sizes: CONVLAB_REAL_CPU=1 (takes minutes).


def cpu_real() -> bool:
    """True when the CPU lessons time real sizes: on a GPU machine, or CONVLAB_REAL_CPU=1."""
    import os

    flag = os.environ.get("CONVLAB_REAL_CPU")
    if flag in ("0", "1"):
        return flag == "1"
    return not _sim()


def cpu_sizes(real: bool | None = None) -> dict:
    """Sizes for lessons 00-03's CPU measurements: copy MB, square GEMM side, the CNN
    input (batch, side) for the layer-time census, batch sizes of the latency sweep."""
    real = cpu_real() if real is None else real
    if real:
        return dict(copy_mb=512, gemm=2048, cnn_batch=8, cnn_side=224,
                    batches=(1, 2, 4, 8, 16, 32, 64, 128))
    return dict(copy_mb=32, gemm=384, cnn_batch=2, cnn_side=64, batches=(1, 2, 4, 8))


# Lessons 10-11: the pipeline's work and the memory-bound depthwise layers.


def pipeline_sizes(real: bool | None = None) -> dict:
    """Lesson 10's pipeline: JPEGs per batch, batches, the decoded image side, the GPU
    stage's conv (7x7 stride 2 from 3 channels to `k` channels) and decode threads."""
    real = (not _sim()) if real is None else real
    if real:
        return dict(batch=32, batches=12, side=224, k=32, threads=None)
    return dict(batch=2, batches=3, side=12, k=2, threads=2)


# Depthwise 3x3 (groups = channels) at batch 32: MobileNet-like layers, memory-bound.
GPU_DEPTHWISE = {
    "dw512": ConvProblem("depthwise 512ch 14x14", 32, 512, 14, 14, 512, groups=512),
    "dw32": ConvProblem("depthwise 32ch 112x112", 32, 32, 112, 112, 32, groups=32),
}
SIM_DEPTHWISE = {
    "dw512": ConvProblem("depthwise 512ch 14x14 (sim: 6ch 7x7)", 1, 6, 7, 7, 6, groups=6),
    "dw32": ConvProblem("depthwise 32ch 112x112 (sim: 2ch 13x15)", 1, 2, 13, 15, 2, groups=2),
}


def depthwise_layer(name: str, real: bool | None = None) -> ConvProblem:
    """A depthwise layer (w is (C, 1, 3, 3), groups = C), real-sized on a GPU."""
    table = GPU_DEPTHWISE if (not _sim() if real is None else real) else SIM_DEPTHWISE
    if name not in table:
        raise KeyError(f"unknown depthwise layer {name!r}; known: {', '.join(table)}")
    return table[name]
