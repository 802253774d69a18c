"""Choose GPU or simulator once, before anything imports numba; skip GPU tests without one."""

import pytest

import convlab

MODE = convlab.setup()  # real GPU when a driver reports one, else the simulator


def pytest_report_header(config):
    return f"convlab mode: {MODE}"


def pytest_collection_modifyitems(config, items):
    if MODE == "gpu":
        return
    skip = pytest.mark.skip(reason="needs a real CUDA GPU (this run uses the simulator)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
