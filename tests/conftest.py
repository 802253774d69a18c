"""Choose GPU or simulator once, before anything imports numba; skip GPU tests without one.

Also the order the files run in. `make test` spreads files over processes (pytest-xdist,
``--dist loadfile``: a file stays in one process, so its module and session fixtures are
built once) and hands them out in collection order. The slowest files go first, so that
the small ones fill the gaps at the end instead of one big file finishing alone.
"""

import pytest

import convlab

MODE = convlab.setup()  # real GPU when a driver reports one, else the simulator

# Slowest first (seconds under the simulator on 2 cores, one file in one process). Only the
# order depends on this list: a file missing from it runs after these, in name order.
SLOWEST_FILES = (
    "test_notebooks.py",  # ~230 s: every lesson notebook in a kernel
    "test_grading.py",  # ~165 s: every solution and exercise graded
    "test_measure.py",  # ~90 s: the dry run of every lesson's measurements
    "test_kernel_mutants.py",  # ~90 s
    "test_grading_attacks.py",  # ~75 s
    "test_kernels_fast.py",
    "test_kernels.py",
    "test_install_cell.py",  # ~50 s: a Colab-like venv
    "test_kernels_tiled.py",
    "test_browser.py",
    "test_runtime.py",
    "test_call_time.py",
    "test_layers.py",
    "test_check_traced.py",
    "test_trace.py",
    "test_wmma.py",
)


def pytest_report_header(config):
    return f"convlab mode: {MODE}"


def pytest_configure(config):
    # pytest-xdist >= 3.6 sorts files by their number of tests unless told not to; the
    # collection order below is the better one (a file's cost is not its test count)
    if getattr(config.option, "loadscopereorder", None):
        config.option.loadscopereorder = False


def _rank(item) -> int:
    name = item.path.name
    return SLOWEST_FILES.index(name) if name in SLOWEST_FILES else len(SLOWEST_FILES)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_rank)  # stable: files keep their name order and their tests' order
    if MODE == "gpu":
        return
    skip = pytest.mark.skip(reason="needs a real CUDA GPU (this run uses the simulator)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
