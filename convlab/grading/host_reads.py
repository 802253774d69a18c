"""Host reads of device arrays in a graded GPU call (the learner's process).

A GPU task asks for the work on the device: a launcher that copies its inputs to the host
and computes with NumPy fails with "HostCopyError". On a GPU the reads to count are
``copy_to_host`` (`GpuHostCopies`). Under the Numba CUDA simulator a device array *is* a
NumPy array of this process, so ``np.asarray``, one element, printing or whole-array
arithmetic read it with no copy at all (`SimHostReads` counts those).

Both are installed once, before any learner code runs (`install`, from the worker): the
classes are patched for good, so no unpatched method exists for a learner to keep, and
`HostReads.counting` switches counting on for one graded call. Code of the simulator's
own array and launch modules and of `convlab.trace` is exempt (by file): launches, views,
copies between device arrays and to the device cost nothing; a copy to the host always
counts, the simulator's write-back of a host array passed to a kernel too. An in-process
check: it stops the offload written plainly, and the review flags
(`notebook.scan_flags`) name the ways around it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import weakref

import numpy as np


class HostReads:
    """Counts host reads while `counting()` is on (base: counts nothing by itself)."""

    def __init__(self):
        self.n, self.active = 0, False
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.exempt = {os.path.join(package, "trace")}  # the tracer reads arrays itself

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
        f = frame.f_code.co_filename
        return f in self.exempt or os.path.dirname(f) in self.exempt


class GpuHostCopies(HostReads):
    """``copy_to_host`` of numba's device arrays (a GPU)."""

    def __init__(self):
        super().__init__()
        from numba.cuda.cudadrv import devicearray

        for cls in (devicearray.DeviceNDArrayBase,):
            original = cls.copy_to_host

            def copy_to_host(arr, *a, _original=original, **k):
                self.count()
                return _original(arr, *a, **k)

            cls.copy_to_host = copy_to_host


class SimHostReads(HostReads):
    """Every host read of the simulator's device arrays outside its kernel threads.

    Counted: ``np.asarray`` and any other NumPy attribute of the array (``tolist``,
    ``sum``, the array interface), one element, ``repr``, whole-array arithmetic, the
    wrapped ``_ary``, ``copy_to_host``, a device array made around one's own buffer
    (``FakeCUDAArray(h)``, ``device_array(..., buffer=h)``, an ndarray subclass sent to
    the device), the kernel-side wrapper used outside a kernel thread, and the array
    interface or a ufunc on it inside one (NumPy in a kernel body: a GPU would not
    compile it). The wrapped array is kept off the instance's ``__dict__``, so ``vars()``
    and pickling do not reach it.
    """

    META = frozenset({"shape", "dtype", "strides", "size", "ndim", "itemsize", "nbytes",
                      "flags", "alloc_size", "stream"})
    DUNDERS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__add__",
               "__sub__", "__mul__", "__floordiv__", "__truediv__", "__mod__", "__pow__",
               "__str__", "__repr__")

    def __init__(self):
        super().__init__()
        from numba import cuda
        from numba.cuda.simulator import kernel
        from numba.cuda.simulator.cudadrv import devicearray as da

        self.exempt |= {da.__file__, kernel.__file__}
        self._in_kernel = lambda: isinstance(threading.current_thread(), kernel.BlockThread)
        self._store: dict = {}  # id(array) -> (weak reference, the wrapped NumPy array)
        self._patch_arrays(da.FakeCUDAArray)
        self._patch_kernel_side(da.FakeWithinKernelCUDAArray)
        self._patch_constructors(da, cuda)

    def host(self, exempt=True) -> None:
        """A read from the host: counted outside kernel threads."""
        if self.active and not self._in_kernel() and not (
                exempt and self._exempt(sys._getframe(2))):
            self.n += 1

    def _wrapped(self, arr):
        entry = self._store.get(id(arr))
        if entry is not None and entry[0]() is arr:
            return entry[1]
        try:
            return arr.__dict__["_ary"]  # made before the patch
        except KeyError:  # not AttributeError: the class's __getattr__ would ask again
            raise RuntimeError("a device array without its data (a pickled copy?)") from None

    def _keep(self, arr, value) -> None:
        key, store = id(arr), self._store

        def forget(ref, key=key):
            if store.get(key, (None,))[0] is ref:
                del store[key]

        store[key] = (weakref.ref(arr, forget), value)
        arr.__dict__.pop("_ary", None)

    def _patch_arrays(self, fake) -> None:
        host, wrapped = self.host, self._wrapped
        getattr_, getitem = fake.__getattr__, fake.__getitem__
        copy_to_host, init = fake.copy_to_host, fake.__init__

        def _ary(arr):
            host()
            return wrapped(arr)

        def get_attr(arr, name):
            value = getattr_(arr, name)  # an attribute the array lacks costs nothing
            if name not in self.META:
                host()
            return value

        def get_item(arr, idx):
            value = getitem(arr, idx)
            if not isinstance(value, fake):  # one element, not a view
                host()
            return value

        def to_host(arr, *a, **k):
            self.host(exempt=False)
            return copy_to_host(arr, *a, **k)

        def new(arr, *a, **k):  # a device array around one's own host buffer
            host()
            ary = a[0] if a else k.get("ary")
            if isinstance(ary, np.ndarray) and type(ary).__module__.split(".")[0] != "numpy":
                self.host(exempt=False)  # an ndarray subclass: its hooks see the buffer
            init(arr, *a, **k)

        fake._ary = property(_ary, self._keep)
        fake.__getattr__, fake.__getitem__, fake.copy_to_host = get_attr, get_item, to_host
        fake.__init__ = new
        for name in self.DUNDERS:
            setattr(fake, name, self._counted(getattr(fake, name), exempt=False))

    def _patch_kernel_side(self, within) -> None:
        """The wrapper kernels see: only kernel threads use it, and they read elements."""
        for name in ("__getattr__", "__getitem__", "__setitem__", "__setattr__", "__len__"):
            setattr(within, name, self._counted(getattr(within, name), exempt=False))
        getattr_, ufunc = within.__getattr__, within.__array_ufunc__

        def get_attr(arr, name):
            if name.startswith("__array"):  # NumPy's array protocol, in a kernel or not
                self.count(exempt=False)
            return getattr_(arr, name)

        def array_ufunc(*a, **k):
            self.count(exempt=False)
            return ufunc(*a, **k)

        within.__getattr__, within.__array_ufunc__ = get_attr, array_ufunc

    def _patch_constructors(self, da, cuda) -> None:
        device_array = da.device_array

        def new_device_array(*a, **k):
            if "buffer" in k or len(a) > 2:  # np.ndarray(shape, dtype, buffer, ...)
                self.count(exempt=False)
            return device_array(*a, **k)

        for mod in (da, cuda):
            mod.device_array = new_device_array

    def _counted(self, method, exempt):
        def counted(*a, **k):
            if self.active and not self._in_kernel() and not (
                    exempt and self._exempt(sys._getframe(1))):
                self.n += 1
            return method(*a, **k)

        return counted


_installed: list = []


def install() -> HostReads:
    """The counter for this process's mode, patched in once (later calls return it)."""
    if not _installed:
        from convlab.runtime import is_simulator

        _installed.append(SimHostReads() if is_simulator() else GpuHostCopies())
    return _installed[0]
