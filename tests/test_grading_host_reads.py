"""In a graded GPU call under the simulator, reading a device array on the host counts as a
device-to-host copy (`convlab.grading.worker._SimHostReads`): the simulator's device arrays
are NumPy arrays of the learner's process, so without it a NumPy answer passed GPU tasks.
What a launcher legitimately does with device arrays (shapes, views, kernels, copies
between device arrays, copies to the device) costs nothing."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from convlab.grading import worker
from convlab.runtime import cuda, is_simulator

pytestmark = pytest.mark.skipif(not is_simulator(), reason="the simulator's device arrays")

if is_simulator():
    from numba import cuda as numba_cuda
    from numba.cuda.simulator.cudadrv.devicearray import FakeWithinKernelCUDAArray

    @numba_cuda.jit
    def _copy_flat(src, dst):
        i = numba_cuda.grid(1)
        if i < dst.shape[0]:
            dst[i] = src[i]


def _in_thread(fn):
    t = threading.Thread(target=fn)
    t.start()
    t.join()


READS = {  # each reads the device array's values on the host
    "np.asarray": lambda a, o: np.asarray(a),
    "np.copyto into a host array": lambda a, o: np.copyto(np.empty((3, 4), np.float32), a),
    "one element": lambda a, o: a[1, 2],
    "iteration": lambda a, o: list(a[0]),
    "copy_to_host": lambda a, o: a.copy_to_host(),
    "the wrapped array": lambda a, o: a._ary,
    "a NumPy method": lambda a, o: a.sum(),
    "arithmetic": lambda a, o: a * 2,
    "a comparison": lambda a, o: a > 0,
    "printing": lambda a, o: repr(a),
    "a device array around one's own host buffer": lambda a, o: type(a)(
        np.empty((3, 4), np.float32)).copy_to_device(a),
    "a kernel writing into a host array": lambda a, o: _copy_flat[1, 12](
        a.reshape(12), np.empty(12, np.float32)),
    "the kernel-side wrapper": lambda a, o: FakeWithinKernelCUDAArray(a)[0, 0],
    "np.asarray in a thread of one's own": lambda a, o: _in_thread(lambda: np.asarray(a)),
}

FREE = {  # what a launcher does with device arrays on a GPU without a copy to the host
    "shapes": lambda a, o: (a.shape, a.dtype, a.strides, a.size, a.ndim, a.nbytes, len(a)),
    "views": lambda a, o: (a.reshape(12), a[1], a[:, 1:3], a.T, a.ravel(), a.view(np.int32)),
    "a kernel": lambda a, o: _copy_flat[1, 12](a.reshape(12), o.reshape(12)),
    "device to device": lambda a, o: (o.copy_to_device(a), o.__setitem__(Ellipsis, a)),
    "host to device": lambda a, o: (o.copy_to_device(np.ones((3, 4), np.float32)),
                                    o.__setitem__(Ellipsis, 0.0)),
    "new device arrays": lambda a, o: (cuda().device_array_like(a), cuda().to_device(a),
                                       cuda().to_device(np.ones(3)), cuda().device_array(5)),
}


def _reads(action) -> int:
    c = cuda()
    a = c.to_device(np.arange(12, dtype=np.float32).reshape(3, 4))
    out = c.device_array((3, 4), np.float32)
    with worker._SimHostReads() as reads:
        action(a, out)
    return reads.n


@pytest.mark.parametrize("name", list(READS))
def test_host_reads_count(name):
    assert _reads(READS[name]) >= 1


@pytest.mark.parametrize("name", list(FREE))
def test_device_work_is_free(name):
    assert _reads(FREE[name]) == 0


def test_the_arrays_are_as_before_afterwards():
    c = cuda()
    a = c.to_device(np.arange(6, dtype=np.float32))
    with worker._SimHostReads():
        b = c.to_device(np.ones(6, np.float32))  # made while the guard is on
    assert np.array_equal(np.asarray(a), np.arange(6)) and np.asarray(b).sum() == 6
    assert float(a[5]) == 5.0 and "_ary" in vars(b)
