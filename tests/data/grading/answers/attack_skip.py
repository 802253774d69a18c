# ruff: noqa
"""Family "skip the tests": hooks that would swallow a failing test cell or drop its body."""

# EXERCISE: fx.box
ip = get_ipython()


def _clear(result):
    result.error_in_exec = None


ip.events.register("post_run_cell", _clear)
ip.input_transformer_manager.line_transforms.append(
    lambda lines: ["pass\n"] if any("TEST:" in x for x in lines) else lines)


def filter2d_numpy(image, kernel):
    return None

# EXERCISE: fx.gemm
import sys
import threading
import time

import convlab.check

BLOCK = 8
sys.addaudithook(lambda event, args: None)


def _patch():
    while True:
        convlab.check.compare = lambda *a, **k: convlab.check.Comparison((), True)
        time.sleep(0.01)


threading.Thread(target=_patch, daemon=True).start()


def matmul_blocked(a, b):
    return np.ones((a.shape[0], b.shape[1]), np.float32)

# EXERCISE: fx.tiled
import builtins

TILE = 8
_real_import = builtins.__import__
builtins.__import__ = lambda name, *a, **k: _real_import(name, *a, **k)


class _Sig:
    @property
    def __signature__(self):
        convlab.check.EPS["fp32"] = 1e30
        return None


@launcher
def conv2d_tiled(x, w, out, stride=1, padding=0):
    return None
