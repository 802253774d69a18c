"""Choose GPU or simulator once, before anything imports numba; skip GPU tests without one."""

import pytest

import convlab

MODE = convlab.setup()  # real GPU when a driver reports one, else the simulator


def pytest_report_header(config):
    return f"convlab mode: {MODE}"


# Test files whose tests are independent of each other (no module fixtures): with
# `pytest -n 2 --dist loadgroup` (make test) their tests spread over the processes; every
# other file stays in one process, so a module fixture (a graded notebook) is built once.
SPREAD = ("test_notebooks.py",)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name not in SPREAD:
            item.add_marker(pytest.mark.xdist_group(item.path.name))
    if MODE == "gpu":
        return
    skip = pytest.mark.skip(reason="needs a real CUDA GPU (this run uses the simulator)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
