# ruff: noqa
"""Exiting: sys.exit in the answer cell and in the function, os._exit while being tested."""

# EXERCISE: fx.box
import sys


def filter2d_numpy(image, kernel):
    sys.exit(0)


sys.exit(0)

# EXERCISE: fx.gemm
import os

BLOCK = 8


def matmul_blocked(a, b):
    os._exit(0)
