# ruff: noqa
"""Tampering 1: the checker redefined, compare() patched while being checked, __code__ swapped."""

# EXERCISE: fx.box
import convlab.check

convlab.check.check_filter2d = lambda *a, **k: "✓ filter2d: 2 cases passed (max rel err 0.0e+00)"


def filter2d_numpy(image, kernel):
    return None

# EXERCISE: fx.gemm
BLOCK = 8


def matmul_blocked(a, b):
    # patch the comparison while the checker is running the answer
    convlab.check.compare = lambda *a, **k: convlab.check.Comparison((), True)
    return np.zeros((a.shape[0], b.shape[1]), np.float32)

# EXERCISE: fx.tiled
TILE = 8
convlab.check.check_conv2d.__code__ = (lambda *a, **k: "✓ conv2d: 5 cases passed").__code__


@launcher
def conv2d_tiled(x, w, out, stride=1, padding=0):
    pass
