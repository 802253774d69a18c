"""convlab: the package behind the course on making 2D convolution fast on GPUs.

``import convlab`` is cheap and never imports numba, so `setup()` can still choose the
real GPU or the simulator. Modules:

- runtime: setup() / doctor(): GPU or simulator, compatibility fixes, diagnosis
- reference: CPU reference convolutions, im2col/col2im, FLOP and byte counts
- check: the checkers learners call and the grader reuses
- problems: problem sizes, scaled for the runtime
- kernels: the GPU kernels, one module per ladder step
- bench: event timing, the check-then-time ladder, roofline ceilings
- baselines: cuDNN (PyTorch) and cuBLAS (CuPy) for the race
"""

from .runtime import doctor, is_simulator, setup

__version__ = "0.1.0"
__all__ = ["doctor", "is_simulator", "setup", "__version__"]
