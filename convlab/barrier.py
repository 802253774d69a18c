"""A ``syncthreads`` barrier for one block of a kernel run as OS threads (the tracer and the
stage checks run a block's threads this way). Nothing here imports numba."""

from __future__ import annotations

import threading


class BarrierAbort(BaseException):
    """Raised in every waiting thread when the block stops (an error, or a stop point)."""


class BlockBarrier:
    """``syncthreads`` for `n` threads; a thread that has exited counts as arrived.

    Thread ``i`` calls ``enter(i)`` before it runs and ``exit()`` when it is done. With
    `start` (a callable taking a thread index) threads start lazily: the first of `order`
    is started by the caller, a thread reached at a barrier by `start`, and one reached
    when a thread exits is handed to that thread's OS thread (``exit()`` returns its index,
    to be entered next), so a block without barriers runs on one OS thread.
    ``sync(site, value)`` waits for the others and returns the values all threads passed
    at this barrier. A subclass can stop the block (`halted`: every thread then raises
    `abort`) and act when all have arrived, before they go on (`on_release`; `sites`
    holds the barrier sites of the arrived threads).

    One thread runs at a time: a thread runs until it reaches a barrier (or ends), then
    hands the turn to the next thread that has not reached it, in `order` (a permutation
    of the thread indices; by index if None); the last to arrive goes on.
    Between two barriers a GPU orders nothing, so any order is one the GPU may take, and a
    block of 128 threads then costs one thread switch per thread and barrier, not a herd
    of 128 threads queueing for the GIL after every barrier.
    """

    abort: type = BarrierAbort

    def __init__(self, n: int, start=None, order=None):
        self._order = list(range(n)) if order is None else [int(i) for i in order]
        if sorted(self._order) != list(range(n)):
            raise ValueError(f"order must be a permutation of range({n})")
        self._pos = {t: k for k, t in enumerate(self._order)}
        self._start = start
        self._started = [start is None] * n
        self._turn = [threading.Lock() for _ in range(n)]
        for k, t in enumerate(self._turn):
            if n and k != self._order[0]:
                t.acquire()  # the first thread of `order` goes first
        if n:
            self._started[self._order[0]] = True
        self.finished = threading.Event()  # set when the last thread exits
        self._local = threading.local()
        self.n = self.alive = n
        self._done = [False] * n
        self._arrived = [False] * n
        self.values: list = []
        self.sites: set = set()
        self.last_values: list = []
        self.error = None  # what fail() got first: an exception, or the caller's record of one

    def halted(self) -> bool:
        return self.error is not None

    def on_release(self):
        pass

    def _release(self):
        self.on_release()
        self.last_values, self.values, self.sites = self.values, [], set()
        self._arrived = [False] * self.n

    def _hand_on(self, i: int, adopt: bool = False):
        """Thread `i` stops running: the next thread that can run goes on. Returns a thread
        not started yet that the OS thread of `i` (which has exited: `adopt`) is to run."""
        if not self.halted() and self.values and len(self.values) == self.alive:
            self._release()  # everyone else was waiting for `i` to exit
        n, order, pos = self.n, self._order, self._pos[i]
        for d in range(1, n + 1):
            j = order[(pos + d) % n]
            if not self._done[j] and (self.halted() or not self._arrived[j]):
                self._turn[j].release()
                if not self._started[j]:
                    self._started[j] = True
                    if adopt:
                        return j
                    self._start(j)
                return None
        return None

    def enter(self, i: int):
        """Thread `i` waits for its first turn."""
        self._local.i = i
        self._turn[i].acquire()
        if self.halted():
            raise self.abort

    def sync(self, site=None, value=None):
        i = self._local.i
        if self.halted():
            raise self.abort
        self.values.append(value)
        self.sites.add(site)
        if len(self.values) == self.alive:
            self._release()
        else:
            self._arrived[i] = True
            self._hand_on(i)
            self._turn[i].acquire()  # released when it is this thread's turn again
        if self.halted():
            raise self.abort
        return self.last_values

    def fail(self, e):
        if self.error is None:
            self.error = e

    def exit(self) -> int | None:
        """The calling thread is done; the index of a thread for its OS thread to enter
        next (with lazy `start`), else None."""
        i = getattr(self._local, "i", None)
        if i is None or self._done[i]:
            return None
        self._done[i] = True
        self.alive -= 1
        if self.alive == 0:
            self.finished.set()
        return self._hand_on(i, adopt=True)
