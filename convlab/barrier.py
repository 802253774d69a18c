"""A ``syncthreads`` barrier for one block of a kernel run as OS threads (the tracer and the
stage checks run a block's threads this way). Nothing here imports numba."""

from __future__ import annotations

import threading


class BarrierAbort(BaseException):
    """Raised in every waiting thread when the block stops (an error, or a stop point)."""


class BlockBarrier:
    """``syncthreads`` for `n` threads; a thread that has exited counts as arrived.

    ``sync(site, value)`` waits for the others and returns the values all threads passed
    at this barrier. A subclass can stop the block (`halted`: every thread then raises
    `abort`) and act when all have arrived, before they go on (`on_release`; `sites`
    holds the barrier sites of the arrived threads).
    """

    abort: type = BarrierAbort

    def __init__(self, n: int):
        self.cond = threading.Condition()
        self.alive, self.waiting, self.gen = n, 0, 0
        self.values: list = []
        self.sites: set = set()
        self.last_values: list = []
        self.error: BaseException | None = None

    def halted(self) -> bool:
        return self.error is not None

    def on_release(self):
        pass

    def _release(self):
        self.on_release()
        self.last_values, self.values, self.sites = self.values, [], set()
        self.waiting = 0
        self.gen += 1
        self.cond.notify_all()

    def sync(self, site=None, value=None):
        with self.cond:
            if self.halted():
                raise self.abort
            self.waiting += 1
            self.values.append(value)
            self.sites.add(site)
            gen = self.gen
            if self.waiting == self.alive:
                self._release()
            else:
                while gen == self.gen and self.error is None:
                    self.cond.wait()
            if self.halted():
                raise self.abort
            return self.last_values

    def fail(self, e: BaseException):
        with self.cond:
            if self.error is None:
                self.error = e
            self.cond.notify_all()

    def exit(self):
        with self.cond:
            self.alive -= 1
            if self.waiting and self.waiting == self.alive and self.error is None:
                self._release()
