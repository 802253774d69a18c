# ruff: noqa
"""Hanging forever: the time limit costs only this task."""

# EXERCISE: fx.box
def filter2d_numpy(image, kernel):
    while True:
        pass
