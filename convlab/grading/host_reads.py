"""Host reads of device arrays in a graded GPU call (the learner's process).

A GPU task asks for the work on the device: a launcher that copies its inputs to the host
and computes with NumPy fails with "HostCopyError". On a GPU the reads to count are
``copy_to_host`` (`GpuHostCopies`). Under the Numba CUDA simulator a device array *is* a
NumPy array of this process, so ``np.asarray``, one element, printing or whole-array
arithmetic read it with no copy at all (`SimHostReads` counts those).

Both are installed once, before any learner code runs (`install`, from the worker): the
classes are patched for good, so no unpatched method exists for a learner to keep, and
`HostReads.counting` switches counting on for one graded call. Code of the simulator's
own array and launch modules and of `convlab.trace` (both known by their code objects,
not by a file name a learner could give their own code) is exempt: launches, views,
copies between device arrays and to the device cost nothing; a copy to the host always
counts, the simulator's write-back of a host array passed to a kernel too. An in-process
check: it stops the offload written plainly, and the review flags
(`notebook.scan_flags`) name the ways around it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref

import numpy as np


class HostReads:
    """Counts host reads while `counting()` is on (base: counts nothing by itself)."""

    def __init__(self):
        self.n, self.active = 0, False
        self.tracer = _code_objects(*_trace_modules())  # the tracer reads arrays itself

    @contextlib.contextmanager
    def counting(self):
        self.n, self.active = 0, True
        try:
            yield self
        finally:
            self.active = False

    def count(self, exempt=True) -> None:
        """One host read, unless the caller of the patched method (two frames up) is
        exempt code."""
        if self.active and not (exempt and self._exempt(sys._getframe(2))):
            self.n += 1

    def _exempt(self, frame) -> bool:
        return frame.f_code in self.tracer

    def device_values(self, arr):
        """The grader's own read of a value it sends back: a host copy of `arr` if it is
        exactly one of the runtime's device arrays (not a subclass, no changed class), read
        without counting and without looking up any attribute through `arr`; else None."""
        return None


class GpuHostCopies(HostReads):
    """``copy_to_host`` of numba's device arrays (a GPU)."""

    def __init__(self):
        super().__init__()
        from numba.cuda.cudadrv import devicearray

        base = devicearray.DeviceNDArrayBase
        original = base.copy_to_host
        # numba's own device array classes, known before any learner code runs
        self._classes = frozenset({devicearray.DeviceNDArray,
                                   *devicearray.DeviceNDArray.__subclasses__()})
        self._copy = original

        def copy_to_host(arr, *a, **k):
            self.count()
            return original(arr, *a, **k)

        base.copy_to_host = copy_to_host

    def device_values(self, arr):
        return self._copy(arr) if type(arr) in self._classes else None


class SimHostReads(HostReads):
    """Every host read of the simulator's device arrays.

    Counted: ``np.asarray`` and any other NumPy attribute of the array (``tolist``,
    ``sum``, the array interface), one element, whole-array arithmetic, the wrapped
    ``_ary`` (and the kernel-side wrapper's ``_item``), ``copy_to_host``, a device array
    made around one's own buffer (``FakeCUDAArray(h)``, ``device_array(..., buffer=h)``,
    an ndarray subclass, an array method called on an object that is not a device array),
    the kernel-side wrapper used outside the simulator's own kernel threads, and NumPy
    attributes of it inside one (NumPy on arrays in a kernel body: a GPU would not compile
    it). Printing shows the array's shape and type, as a GPU's device array does. The
    wrapped array is kept off the instance's ``__dict__``, so ``vars()`` and pickling do not
    reach it; exempt code is known by its code objects, not by a name or file a learner
    could give their own. Arrays handed to the simulator's copies are made plain NumPy
    arrays first, so no subclass or ``__array_function__`` hook sees the device buffer.
    """

    META = frozenset({"shape", "dtype", "strides", "size", "ndim", "itemsize", "nbytes",
                      "flags", "alloc_size", "stream"})
    DUNDERS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__add__",
               "__sub__", "__mul__", "__floordiv__", "__truediv__", "__mod__", "__pow__")
    METHODS = ("reshape", "ravel", "view", "transpose", "bind", "split", "copy_to_device",
               "__setitem__", "is_c_contiguous", "is_f_contiguous")

    def __init__(self):
        super().__init__()
        from numba import cuda
        from numba.cuda.simulator import kernel
        from numba.cuda.simulator.cudadrv import devicearray as da

        # the simulator's own array and launch code, and this module's
        self.codes = _code_objects(da, kernel, sys.modules[__name__])
        self._fake = da.FakeCUDAArray
        self._threads = weakref.WeakSet()  # kernel threads the simulator itself started
        self._store: dict = {}  # id(array) -> (weak reference, the wrapped NumPy array)
        self._patch_threads(kernel.BlockThread, kernel.BlockManager.run.__code__)
        self._patch_arrays(da.FakeCUDAArray)
        self._patch_kernel_side(da.FakeWithinKernelCUDAArray)
        self._patch_constructors(da, cuda)

    def _exempt(self, frame) -> bool:
        return frame.f_code in self.codes or super()._exempt(frame)

    def device_values(self, arr):
        if type(arr) is not self._fake:
            return None
        entry = self._store.get(id(arr))
        if entry is None or entry[0]() is not arr:
            return None
        return np.array(entry[1], subok=False)  # a copy: the buffer stays the device's

    def _in_kernel(self) -> bool:
        return threading.current_thread() in self._threads

    def _patch_threads(self, block_thread, run_code) -> None:
        init, threads = block_thread.__init__, self._threads

        def new_thread(t, *a, **k):
            init(t, *a, **k)
            if sys._getframe(1).f_code is run_code:  # BlockManager.run: a kernel's thread
                threads.add(t)

        block_thread.__init__ = new_thread

    def _side(self, name):
        """A property keeping attribute `name` off the instance's __dict__; reading it
        counts unless the simulator's own code reads it."""
        store, count = self._store, self.count

        def get(obj):
            count()
            entry = store.get(id(obj))
            if entry is not None and entry[0]() is obj:
                return entry[1]
            try:
                return obj.__dict__[name]  # made before the patch
            except KeyError:  # not AttributeError: the class's __getattr__ would ask again
                raise RuntimeError("a device array without its data (a pickled copy?)") from None

        def put(obj, value):
            key = id(obj)

            def forget(ref, key=key):
                if store.get(key, (None,))[0] is ref:
                    del store[key]

            store[key] = (weakref.ref(obj, forget), value)
            obj.__dict__.pop(name, None)

        return property(get, put)

    def _patch_arrays(self, fake) -> None:
        count = self.count
        getattr_, getitem, copy_to_host = fake.__getattr__, fake.__getitem__, fake.copy_to_host
        init = fake.__init__

        def get_attr(arr, name):
            if name == "squeeze":  # a view on a GPU: a device array here too
                return lambda *a, **k: fake(arr._ary.squeeze(*a, **k))  # this module: free
            value = getattr_(arr, name)  # an attribute the array lacks costs nothing
            if name not in self.META:
                count()
            return value

        def get_item(arr, idx):
            if type(arr) is not fake or _holds(idx, fake):
                self.count(exempt=False)  # a look-alike; a device array read as an index
            value = getitem(arr, idx)
            if not isinstance(value, fake):  # one element, not a view
                count()
            return value

        def to_host(arr, *a, **k):
            self.count(exempt=False)  # the simulator's write-back to a host array too
            return copy_to_host(arr, *a, **k)

        def new(arr, *a, **k):  # a device array around one's own host buffer
            count()
            ary = a[0] if a else k.get("ary")
            if isinstance(ary, np.ndarray) and type(ary) is not np.ndarray:
                self.count(exempt=False)  # an ndarray subclass: its hooks see the buffer
            init(arr, *a, **k)

        def shown(arr):  # what a GPU's device array prints: no values
            return f"<device array {tuple(arr.shape)} {arr.dtype}>"

        fake._ary = self._side("_ary")
        fake.__getattr__, fake.__getitem__, fake.copy_to_host = get_attr, get_item, to_host
        fake.__init__, fake.__repr__, fake.__str__ = new, shown, shown
        for name in self.DUNDERS:
            setattr(fake, name, self._counted(getattr(fake, name), exempt=False))
        for name in self.METHODS:
            setattr(fake, name, self._plain_args(getattr(fake, name), fake,
                                                 index=name == "__setitem__"))

    def _plain_args(self, method, fake, index=False):
        """An array method that refuses a `self` that is not a device array (a look-alike
        holding one's own buffer) and hands the simulator plain NumPy arrays only."""
        def checked(arr, *a, **k):
            if type(arr) is not fake or (index and a and _holds(a[0], fake)):
                self.count(exempt=False)  # a look-alike; a device array read as an index
            a = tuple(_plain(v, fake) for v in a)
            return method(arr, *a, **{n: _plain(v, fake) for n, v in k.items()})

        return checked

    def _patch_kernel_side(self, within) -> None:
        """The wrapper kernels see: only the simulator's kernel threads use it, to read and
        write elements and shapes."""
        within._item = self._side("_item")
        for name in ("__getitem__", "__setitem__", "__setattr__", "__len__",
                     "__array_ufunc__"):
            setattr(within, name, self._counted(getattr(within, name), exempt=False,
                                                kernel_ok=name != "__array_ufunc__"))
        getattr_ = within.__getattr__

        def get_attr(arr, name):
            if not self._in_kernel() or name not in self.META:  # NumPy on it, in a kernel too
                self.count(exempt=False)
            return getattr_(arr, name)

        within.__getattr__ = get_attr

    def _patch_constructors(self, da, cuda) -> None:
        device_array, to_device, fake = da.device_array, da.to_device, da.FakeCUDAArray

        def new_device_array(*a, **k):
            if "buffer" in k or len(a) > 2:  # np.ndarray(shape, dtype, buffer, ...)
                self.count(exempt=False)
            return device_array(*a, **k)

        def new_to_device(ary, stream=0, copy=True, to=None):
            # with `to`, the simulator hands `to.copy_to_device` the source's own buffer:
            # anything but a device array there gets a host view of it
            if to is not None and type(to) is not fake:  # a subclass's method too
                self.count(exempt=False)
            return to_device(ary, stream, copy, to)

        for mod in (da, cuda):
            mod.device_array, mod.to_device = new_device_array, new_to_device

    def _counted(self, method, exempt, kernel_ok=True):
        def counted(*a, **k):
            if self.active and not (kernel_ok and self._in_kernel()):
                self.count(exempt)
            return method(*a, **k)

        return counted


def _holds(idx, fake, depth: int = 0) -> bool:
    """An index that holds a device array (NumPy's C code reads it as an index, from inside
    the simulator's own code)."""
    if isinstance(idx, fake):
        return True
    if isinstance(idx, (tuple, list)) and depth < 4:
        return any(_holds(i, fake, depth + 1) for i in idx)
    return False


def _plain(value, fake):
    """value for the simulator's copies: a device array as it is, any other array-like as a
    plain NumPy array (no subclass, no __array_function__ hook to see the other side)."""
    if isinstance(value, (fake, np.generic, int, float, complex, str, slice, tuple)) or (
            value is None or value is Ellipsis):
        return value  # device arrays, scalars (a kernel's element stores) and indices
    if type(value) is np.ndarray:
        return value
    if isinstance(value, np.ndarray) or hasattr(type(value), "__array_function__") or hasattr(
            type(value), "__array__"):
        return np.array(value)  # np.array is not dispatched through __array_function__
    return value


def _trace_modules() -> list:
    """`convlab.trace` and every module of it."""
    import importlib
    import pkgutil

    import convlab.trace as trace

    return [trace] + [importlib.import_module(f"{trace.__name__}.{m.name}")
                      for m in pkgutil.iter_modules(trace.__path__)]


def _code_objects(*modules) -> set:
    """Every code object of the functions and methods defined in `modules`, nested ones
    included."""
    found, todo = set(), []
    for mod in modules:
        for obj in vars(mod).values():
            for f in [obj, *vars(obj).values()] if isinstance(obj, type) else [obj]:
                f = getattr(f, "fget", f)  # properties
                code = getattr(getattr(f, "__func__", f), "__code__", None)
                if code is not None and code.co_filename == mod.__file__:
                    todo.append(code)
    while todo:
        code = todo.pop()
        if code not in found:
            found.add(code)
            todo.extend(c for c in code.co_consts if hasattr(c, "co_code"))
    return found


_installed: list = []


def install() -> HostReads:
    """The counter for this process's mode, patched in once (later calls return it)."""
    if not _installed:
        from convlab.runtime import is_simulator

        _installed.append(SimHostReads() if is_simulator() else GpuHostCopies())
    return _installed[0]
