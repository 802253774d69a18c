# ruff: noqa
"""Family "thread": a thread of the answer's own still running during the graded GPU calls
(one that could read a call's inputs and rewrite the reply the grader reads). The launcher
itself does nothing: the call is refused before it runs."""

# EXERCISE: fx.tiled
import threading as _th, time as _tm

TILE = 8
_th.Thread(target=_tm.sleep, args=(600,), daemon=True).start()


@launcher
def conv2d_tiled(x, w, out, stride=1, padding=0):
    return out
