"""convlab.barrier: syncthreads for a block of OS threads (the tracer and the stage checks)."""

from __future__ import annotations

import threading
import time

import pytest

from convlab.barrier import BarrierAbort, BlockBarrier


def run_thread(b: BlockBarrier, i: int, body, raised: dict, ran_on: dict) -> int | None:
    """Thread i of block b: enter, body(i, b), what it raised kept; exit()'s answer."""
    try:
        b.enter(i)
        ran_on[i] = threading.get_ident()
        body(i, b)
    except BarrierAbort:
        raised[i] = "abort"
    except Exception as e:  # noqa: BLE001
        raised[i] = e
        b.fail(e)
    return b.exit()


def run_block(barrier: BlockBarrier, n: int, body, timeout: float = 20.0) -> dict:
    """Thread i runs body(i) between enter(i) and exit(); what each raised, by thread."""
    raised: dict = {}
    threads = [threading.Thread(target=run_thread, daemon=True,
                                args=(barrier, i, lambda i, b: body(i), raised, {}))
               for i in range(n)]
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


def run_block_lazily(n: int, body, timeout: float = 20.0):
    """As the simulator runs a block: thread objects made up front, started when their turn
    comes, an exited thread's OS thread running the next one not started; body(i, barrier).
    Returns (the barrier, what each raised, the OS thread each CUDA thread ran on)."""
    raised, ran_on = {}, {}

    def work(first):
        i = first
        while i is not None:
            i = run_thread(b, i, body, raised, ran_on)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
    b = BlockBarrier(n, start=lambda j: threads[j].start())
    threads[0].start()
    assert b.finished.wait(timeout), "the block hung"
    for t in threads:
        if t.ident is not None:
            t.join(timeout)
    return b, raised, ran_on


def test_lazily_started_block_without_barriers_runs_on_one_os_thread():
    out = [None] * 50
    _, raised, ran_on = run_block_lazily(50, lambda i, b: out.__setitem__(i, i * 3))
    assert raised == {} and out == [i * 3 for i in range(50)]
    assert len(set(ran_on.values())) == 1


def test_lazily_started_block_with_barriers_and_early_exits():
    n = 20
    seen = {}

    def body(i, b):
        if i % 4 == 1:
            return  # an exited thread's OS thread goes on with the next one
        seen[i] = sorted(b.sync(value=i))
        b.sync()

    b, raised, ran_on = run_block_lazily(n, body)
    assert raised == {}
    want = [i for i in range(n) if i % 4 != 1]
    assert seen == {i: want for i in want}
    assert len(set(ran_on.values())) < n  # OS threads were reused


def test_lazily_started_block_stops_every_thread_after_an_error():
    n = 12

    def body(i, b):
        if i == 2:
            raise KeyError("k")
        b.sync()

    b, raised, _ = run_block_lazily(n, body)
    assert isinstance(raised.pop(2), KeyError)
    assert raised == {i: "abort" for i in range(n) if i > 2} | {0: "abort", 1: "abort"}


def test_threads_take_turns_in_the_given_order():
    n = 9
    order = [4, 0, 8, 2, 6, 1, 3, 7, 5]
    b = BlockBarrier(n, order=order)
    log = []

    def body(i):
        log.append(("a", i))
        b.sync()
        log.append(("b", i))

    assert run_block(b, n, body) == {}
    first = [i for s, i in log if s == "a"]
    assert first == order
    assert all(s == "a" for s, _ in log[:n])  # nobody passed the barrier early
    with pytest.raises(ValueError, match="permutation"):
        BlockBarrier(3, order=[0, 0, 1])
