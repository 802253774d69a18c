"""convlab.barrier: syncthreads for a block of OS threads (the tracer and the stage checks)."""

from __future__ import annotations

import threading
import time

import pytest

from convlab.barrier import BarrierAbort, BlockBarrier


def run_block(barrier: BlockBarrier, n: int, body, timeout: float = 20.0) -> dict:
    """Thread i runs body(i) between enter(i) and exit(); what each raised, by thread."""
    raised: dict = {}

    def work(i):
        try:
            barrier.enter(i)
            body(i)
        except BarrierAbort:
            raised[i] = "abort"
        except Exception as e:  # noqa: BLE001
            raised[i] = e
            barrier.fail(e)
        finally:
            barrier.exit()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "the block hung"
    return raised


def test_every_thread_sees_every_value_passed_at_each_barrier():
    n, rounds = 37, 4  # not a power of two, several barriers
    b = BlockBarrier(n)
    seen: dict = {}

    def body(i):
        for r in range(rounds):
            seen[i, r] = sorted(b.sync(site="s", value=i * 10 + r))

    assert run_block(b, n, body) == {}
    for r in range(rounds):
        want = sorted(i * 10 + r for i in range(n))
        assert all(seen[i, r] == want for i in range(n)), r


def test_writes_before_a_barrier_are_seen_by_every_thread_after_it():
    n = 29
    b = BlockBarrier(n)
    tile = [None] * n
    sums = [None] * n

    def body(i):
        tile[i] = i * i
        b.sync()
        sums[i] = sum(tile)  # every slot written before anyone reads
        b.sync()
        tile[i] = -1  # overwriting only after everybody has read

    assert run_block(b, n, body) == {}
    assert sums == [sum(i * i for i in range(n))] * n


def test_one_thread_runs_at_a_time():
    n = 16
    b = BlockBarrier(n)
    running, most = [0], [0]

    def body(i):
        for _ in range(3):
            running[0] += 1
            most[0] = max(most[0], running[0])
            time.sleep(0.002)  # lets the GIL go: with threads free to run, another would
            running[0] -= 1
            b.sync()

    assert run_block(b, n, body) == {}
    assert most[0] == 1


def test_a_thread_that_exits_early_counts_as_arrived():
    n = 12
    b = BlockBarrier(n)
    passed = []

    def body(i):
        if i % 3 == 0:
            return  # skips both barriers, like threads past the edge of the data
        b.sync()
        b.sync()
        passed.append(i)

    assert run_block(b, n, body) == {}
    assert sorted(passed) == [i for i in range(n) if i % 3]


@pytest.mark.parametrize("leaver", [0, 5, 7])
def test_the_barrier_opens_when_the_last_thread_it_waits_for_exits(leaver):
    n = 8
    b = BlockBarrier(n)
    passed = []

    def body(i):
        if i == leaver:
            return  # every other thread may already wait at the barrier
        b.sync()
        passed.append(i)

    assert run_block(b, n, body) == {}
    assert sorted(passed) == [i for i in range(n) if i != leaver]


def test_an_error_in_one_thread_stops_the_others():
    n = 9
    b = BlockBarrier(n)

    def body(i):
        b.sync()
        if i == 4:
            raise ValueError("boom")
        b.sync()
        b.sync()

    raised = run_block(b, n, body)
    assert isinstance(raised.pop(4), ValueError)
    assert isinstance(b.error, ValueError)
    assert raised == {i: "abort" for i in range(n) if i != 4}


class _StopAtSecond(BlockBarrier):
    def __init__(self, n):
        super().__init__(n)
        self.count, self.stopped, self.sites_seen = 0, False, []

    def halted(self):
        return self.error is not None or self.stopped

    def on_release(self):
        self.count += 1
        self.sites_seen.append(set(self.sites))
        self.stopped = self.count == 2


def test_a_subclass_stops_the_block_at_a_barrier_and_sees_its_sites():
    n = 10
    b = _StopAtSecond(n)
    after = []

    def body(i):
        b.sync(site="first")
        b.sync(site="second" if i else "other")
        after.append(i)

    raised = run_block(b, n, body)
    assert after == []
    assert raised == {i: "abort" for i in range(n)}
    assert b.sites_seen == [{"first"}, {"second", "other"}]


@pytest.mark.parametrize("n", [1, 2, 64])
def test_block_sizes(n):
    b = BlockBarrier(n)
    out = []

    def body(i):
        out.append(len(b.sync(value=i)))

    assert run_block(b, n, body) == {}
    assert out == [n] * n
