"""Cases for tests/test_grading_host_reads.py, run in a process of their own (the counter
patches the simulator's array classes for good): ``python -m tests._host_reads_cases``
prints {case: host reads counted} as JSON."""

from __future__ import annotations

import json
import pickle
import threading
import types

import numpy as np

# set by main(), in the process of its own (the lambdas below read them when they run)
cuda = copy_flat = numpy_in_a_kernel = item_in_a_kernel = None
FakeWithinKernelCUDAArray = READS = SAVED_COPY = DeviceSub = None


def _setup() -> None:
    global cuda, copy_flat, numpy_in_a_kernel, item_in_a_kernel, FakeWithinKernelCUDAArray
    global READS, SAVED_COPY, DeviceSub
    import convlab

    convlab.setup("sim")
    from numba import cuda
    from numba.cuda.simulator.cudadrv.devicearray import FakeWithinKernelCUDAArray

    from convlab.grading import host_reads

    READS = host_reads.install()
    SAVED_COPY = type(cuda.device_array(1)).copy_to_host  # kept by a learner before a call

    class DeviceSub(type(cuda.device_array(1))):  # a learner's subclass of the device array
        def copy_to_device(self, ary, stream=0):
            self.got = ary

    @cuda.jit
    def copy_flat(src, dst):
        i = cuda.grid(1)
        if i < dst.shape[0]:
            dst[i] = src[i]

    @cuda.jit
    def numpy_in_a_kernel(src, dst):
        if cuda.threadIdx.x == 0:
            dst[0] = np.asarray(src).sum()

    @cuda.jit
    def item_in_a_kernel(src, dst):
        if cuda.threadIdx.x == 0:
            dst[0] = src._item.sum()


def in_thread(fn):
    t = threading.Thread(target=fn)
    t.start()
    t.join()


def as_if_from(module, fn):
    """fn with module globals named like exempt code (its file stays the caller's)."""
    return types.FunctionType(fn.__code__, {**fn.__globals__, "__name__": module})


class Sub(np.ndarray):
    pass


def _no_values(text):
    assert "11." not in text and "[" not in text, text
    return text


class Staging(np.ndarray):
    seen = None

    def __array_function__(self, func, types_, args, kwargs):
        Staging.seen = args[0]
        return None


def hook_sees(a):
    Staging.seen = None
    a.copy_to_device(np.zeros(a.shape, a.dtype).view(Staging))
    return Staging.seen


def with_block_thread(cls, fn):
    from numba.cuda.simulator import kernel

    saved, kernel.BlockThread = kernel.BlockThread, cls
    try:
        return fn()
    finally:
        kernel.BlockThread = saved


def own_block_thread(fn):
    from numba.cuda.simulator import kernel

    manager = types.SimpleNamespace(_block_dim=(1, 1, 1))
    t = kernel.BlockThread(fn, manager, (0, 0, 0), (0, 0, 0), False)
    t.start()
    t.join()


def forged_file(fn, exempt):
    code = fn.__code__.replace(co_filename=exempt.__code__.co_filename)
    return types.FunctionType(code, fn.__globals__)


def in_tracer_folder(fn):
    """fn compiled as if it were a file of convlab.trace (the tracer's code is exempt)."""
    import os

    import convlab.trace

    path = os.path.join(os.path.dirname(convlab.trace.__file__), "learner.py")
    return types.FunctionType(fn.__code__.replace(co_filename=path), fn.__globals__)


class Grab:
    """Not a device array: to_device(..., to=Grab()) hands it what it copies."""

    def copy_to_device(self, ary, stream=0):
        self.ary = ary


def holds_no_array(state) -> bool:
    return not any(isinstance(v, np.ndarray) for v in dict(state or {}).values())


READ = {  # each reads the device array's values on the host
    "np.asarray": lambda a, o: np.asarray(a),
    "np.copyto into a host array": lambda a, o: np.copyto(np.empty((3, 4), np.float32), a),
    "one element": lambda a, o: a[1, 2],
    "iteration": lambda a, o: list(a[0]),
    "copy_to_host": lambda a, o: a.copy_to_host(),
    "copy_to_host saved before the call": lambda a, o: SAVED_COPY(a),
    "the wrapped array": lambda a, o: a._ary,
    "a NumPy method": lambda a, o: a.sum(),
    "arithmetic": lambda a, o: a * 2,
    "a comparison": lambda a, o: a > 0,
    "a device array around one's own host buffer": lambda a, o: type(a)(
        np.empty((3, 4), np.float32)).copy_to_device(a),
    "device_array(buffer=)": lambda a, o: cuda.device_array(
        (3, 4), np.float32, buffer=np.empty((3, 4), np.float32)).copy_to_device(a),
    "an ndarray subclass sent to the device": lambda a, o: cuda.to_device(
        np.zeros((3, 4), np.float32).view(Sub)).copy_to_device(a),
    "a kernel writing into a host array": lambda a, o: copy_flat[1, 12](
        a.reshape(12), np.empty(12, np.float32)),
    "the kernel-side wrapper": lambda a, o: FakeWithinKernelCUDAArray(a)[0, 0],
    "np.asarray in a thread of one's own": lambda a, o: in_thread(lambda: np.asarray(a)),
    "np.asarray from a function named like exempt code": lambda a, o: as_if_from(
        "numba.cuda.simulator.cudadrv.devicearray", lambda x: np.asarray(x))(a),
    "cuda.reduce": lambda a, o: cuda.reduce(lambda p, q: p + q)(a.reshape(12)),
    "NumPy in a kernel body": lambda a, o: numpy_in_a_kernel[1, 1](a.reshape(12),
                                                                   o.reshape(12)),
    "the kernel-side wrapper's _item, in a kernel": lambda a, o: item_in_a_kernel[1, 1](
        a.reshape(12), o.reshape(12)),
    "np.asarray with the simulator's BlockThread replaced": lambda a, o: with_block_thread(
        object, lambda: np.asarray(a)),
    "np.asarray in a BlockThread of one's own": lambda a, o: own_block_thread(
        lambda: np.asarray(a)),
    "an array method on a look-alike holding one's buffer": lambda a, o: type(a).reshape(
        type("Box", (), {"_ary": np.empty((3, 4), np.float32)})(), (3, 4)).copy_to_device(a),
    "np.asarray from code with a forged file name": lambda a, o: forged_file(
        lambda x: np.asarray(x), type(a).reshape)(a),
    "np.asarray from code named as a file of the tracer": lambda a, o: in_tracer_folder(
        lambda x: np.asarray(x))(a),
    "to_device(a, to=) into an object of one's own": lambda a, o: cuda.to_device(a, to=Grab()),
    "to_device(a, to=) into a subclass of the device array": lambda a, o: cuda.to_device(
        a, to=DeviceSub.__new__(DeviceSub)),
    "a device array as an index": lambda a, o: cuda.device_array(12, np.float32)[
        a.reshape(12).view(np.int32)[0:1]],
    "a device array as the index of a store": lambda a, o: o.reshape(12).__setitem__(
        (cuda.to_device(np.array([1])),), 0.0),
}
HIDDEN = {  # the device buffer is not where these look (True: nothing found)
    "an __array_function__ hook given to copy_to_device": lambda a, o: hook_sees(a) is None,
    "vars()": lambda a, o: holds_no_array(vars(a)),
    "__reduce_ex__": lambda a, o: holds_no_array(a.__reduce_ex__(4)[2]),
    "pickle": lambda a, o: np.arange(12, dtype=np.float32).tobytes() not in pickle.dumps(a),
}
FREE = {  # what a launcher does with device arrays on a GPU without a copy to the host
    "printing (shape and type, no values)": lambda a, o: _no_values(repr(a) + f"{a}"),
    "squeeze (a view)": lambda a, o: a.reshape(1, 3, 4).squeeze().copy_to_device(a),
    "shapes": lambda a, o: (a.shape, a.dtype, a.strides, a.size, a.ndim, a.nbytes, len(a)),
    "probing for an attribute it lacks": lambda a, o: (
        hasattr(a, "__cuda_array_interface__"), getattr(a, "device_ctypes_pointer", None)),
    "views": lambda a, o: (a.reshape(12), a[1], a[:, 1:3], a.T, a.ravel(), a.view(np.int32)),
    "a kernel": lambda a, o: copy_flat[1, 12](a.reshape(12), o.reshape(12)),
    "device to device": lambda a, o: (o.copy_to_device(a), o.__setitem__(Ellipsis, a),
                                      cuda.to_device(a, to=o)),
    "host to device": lambda a, o: (o.copy_to_device(np.ones((3, 4), np.float32)),
                                    o.__setitem__(Ellipsis, 0.0)),
    "new device arrays": lambda a, o: (cuda.device_array_like(a), cuda.to_device(a),
                                       cuda.to_device(np.ones(3)), cuda.device_array(5),
                                       cuda.device_array((2, 3), np.float32)),
}


VALUES = {  # the grader's own read of what it sends back (True: as expected)
    "a device array, its values": lambda a, o: np.array_equal(
        READS.device_values(a), np.arange(12, dtype=np.float32).reshape(3, 4)),
    "a view": lambda a, o: READS.device_values(a[1]).tolist() == [4.0, 5.0, 6.0, 7.0],
    "not after its class was changed": lambda a, o: (
        setattr(o, "__class__", DeviceSub), READS.device_values(o))[1] is None,
    "not a subclass": lambda a, o: READS.device_values(DeviceSub.__new__(DeviceSub)) is None,
    "not a host array": lambda a, o: READS.device_values(np.zeros(2)) is None,
}


def run(action):
    """(host reads counted, the action's value, its error or None)."""
    a = cuda.to_device(np.arange(12, dtype=np.float32).reshape(3, 4))
    out = cuda.device_array((3, 4), np.float32)
    value, error = None, None
    with READS.counting() as reads:
        try:
            value = action(a, out)
        except Exception as e:  # noqa: BLE001  (what was read before it is what counts)
            error = f"{type(e).__name__}: {e}"[:200]
    return reads.n, value, error


def main() -> None:
    _setup()
    result = {"read": {}, "hidden": {}, "free": {}, "values": {}}
    for name, action in READ.items():
        result["read"][name] = run(action)[0]
    for name, action in HIDDEN.items():
        n, value, error = run(action)
        result["hidden"][name] = bool(value) and error is None
    for name, action in FREE.items():
        n, _, error = run(action)
        result["free"][name] = [n, error]
    for name, action in VALUES.items():
        n, value, error = run(action)
        result["values"][name] = [n, value is True, error]
    a = cuda.to_device(np.arange(6, dtype=np.float32))
    result["after"] = [float(np.asarray(a).sum()), float(a[5]), READS.n]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
