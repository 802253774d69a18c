"""In a graded GPU call, reading a device array on the host counts as a device-to-host
copy (`convlab.grading.host_reads`). Under the simulator a device array is a NumPy array
of the learner's process: without the count a NumPy answer passed GPU tasks. What a
launcher legitimately does with device arrays (shapes, views, kernels, copies between
device arrays, copies to the device) costs nothing.

The counter patches the simulator's array classes for good, so the cases
(tests/_host_reads_cases.py) run in a process of their own, once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from . import _host_reads_cases as cases

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def counted():
    r = subprocess.run([sys.executable, "-m", "tests._host_reads_cases"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(cases.READ))
def test_host_reads_count(counted, name):
    assert counted["read"][name] >= 1


@pytest.mark.parametrize("name", list(cases.HIDDEN))
def test_the_wrapped_array_is_not_in_the_instance(counted, name):
    assert counted["hidden"][name] is True


@pytest.mark.parametrize("name", list(cases.FREE))
def test_device_work_is_free(counted, name):
    assert counted["free"][name] == [0, None]


@pytest.mark.parametrize("name", list(cases.VALUES))
def test_the_graders_own_read_takes_the_runtimes_device_arrays_only(counted, name):
    """What the worker sends back is read by `device_values`: exactly the runtime's device
    arrays, uncounted and without a method of the array; None for anything else (a subclass,
    a changed class), which the wire then refuses."""
    assert counted["values"][name] == [0, True, None]


def test_counting_is_off_outside_a_graded_call(counted):
    total, element, n = counted["after"]
    assert (total, element, n) == (15.0, 5.0, 0)


def test_on_a_gpu_copy_to_host_is_patched_once_at_install():
    """GPU mode (numba's real device arrays; no GPU needed to patch the class): every
    copy_to_host, including one a learner saved after install, goes through the counter."""
    code = ("import convlab\nconvlab.setup('gpu')\n"
            "from numba.cuda.cudadrv import devicearray as d\n"
            "from convlab.grading import host_reads\n"
            "r = host_reads.install()\n"
            "print(type(r).__name__, d.DeviceNDArrayBase.copy_to_host.__qualname__,"
            " host_reads.install() is r)\n")
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "CONVLAB_MODE")}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    kind, method, same = r.stdout.split()
    assert kind == "GpuHostCopies" and method.startswith("GpuHostCopies") and same == "True"
