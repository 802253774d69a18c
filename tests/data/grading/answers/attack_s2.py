# ruff: noqa
"""Tampering 2: numpy.allclose / numpy.testing patched, the test's checker name rebound,
the package's own kernel used as the answer."""

# EXERCISE: fx.box
import numpy

numpy.allclose = lambda *a, **k: True
numpy.testing.assert_allclose = lambda *a, **k: None
numpy.isfinite = lambda a, *args, **kw: numpy.ones(numpy.shape(a), bool)


def filter2d_numpy(image, kernel):
    return numpy.zeros_like(image)

# EXERCISE: fx.gemm
BLOCK = 8
check_gemm = lambda fn, **kw: "✓ gemm: 2 cases passed"


def matmul_blocked(a, b):
    return None

# EXERCISE: fx.tiled
from convlab.kernels import conv2d_coalesced


@launcher
def conv2d_tiled(x, w, out, stride=1, padding=0):
    return conv2d_coalesced(x, w, out, stride=stride, padding=padding)
