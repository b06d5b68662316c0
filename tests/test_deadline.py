"""The one deadline primitive (exporter.deadline): reads on a bounded pool, each under its own
deadline, a hung read written off once. Behaviour only: every item that must finish has a 30 s
deadline, every hung item waits on an event the test sets, and nothing asserts a duration, so a
loaded host cannot turn slowness into a failure."""

from __future__ import annotations

import threading

import pytest

from exporter.deadline import BLOCKED, ERROR, OK, SKIPPED, TIMEOUT, Deadlines, Pool
from tests.helpers import START_HANG_GUARD_S, wait_for

LONG = 30.0  # the deadline of an item that must finish, however loaded the host
SHORT = 0.05  # the deadline of an item that hangs
OVERRAN = f"did not finish within its {SHORT:g}s deadline; not read again until that read returns"


class Items:
    """fn for `each`: items in `hang` block until `release` is set; every call is logged with its
    thread. Items in `hang` get the SHORT deadline (`timeout`), the others the LONG one."""

    def __init__(self, hang=()):
        self.hang = set(hang)
        self.release = threading.Event()
        self.calls: list[tuple[str, int]] = []

    def __call__(self, item):
        self.calls.append((item, threading.get_ident()))
        if item in self.hang:
            self.release.wait(60)
        if item == "boom":
            raise OSError(5, "Input/output error", item)
        return item.upper()

    def timeout(self, item):
        return SHORT if item in self.hang else LONG

    def count(self, item):
        return [c for c, _ in self.calls].count(item)


@pytest.fixture
def items():
    made = []

    def make(hang=()):
        made.append(Items(hang))
        return made[-1]
    yield make
    for it in made:
        it.release.set()  # no thread of a test stays blocked past it


def statuses(outcomes):
    return [o.status for o in outcomes]


def test_items_are_read_in_order_on_one_worker_not_the_caller(pool, items):
    fn = items()
    out = Deadlines(pool).each(["a", "b", "c"], fn, timeout=LONG)
    assert [(o.status, o.value, o.reason) for o in out] == [(OK, "A", ""), (OK, "B", ""), (OK, "C", "")]
    assert [c for c, _ in fn.calls] == ["a", "b", "c"]
    assert len({t for _, t in fn.calls}) == 1 and fn.calls[0][1] != threading.get_ident()


def test_an_error_is_that_item_s_outcome_with_its_reason(pool, items):
    out = Deadlines(pool).each(["a", "boom", "c"], items(), timeout=LONG)
    assert statuses(out) == [OK, ERROR, OK]
    assert isinstance(out[1].value, OSError)
    assert out[1].reason == "OSError: [Errno 5] Input/output error: 'boom'"


def test_call_is_one_read_under_its_deadline(pool, items):
    reads = Deadlines(pool)
    fn = items(hang={"x"})
    assert reads.call("a", lambda: fn("a"), LONG)[:2] == (OK, "A")
    o = reads.call("boom", lambda: fn("boom"), LONG)
    assert o.status == ERROR and o.reason.startswith("OSError:")
    assert reads.call("x", lambda: fn("x"), SHORT).status == TIMEOUT
    assert reads.call("x", lambda: fn("x"), SHORT).status == BLOCKED and fn.count("x") == 1


def test_a_hung_item_is_written_off_once_and_not_read_again_until_it_returns(pool, items):
    fn = items(hang={"b"})
    reads = Deadlines(pool)
    out = reads.each(["a", "b", "c"], fn, timeout=fn.timeout)
    assert statuses(out) == [OK, TIMEOUT, OK] and out[2].value == "C"
    assert out[1].took >= SHORT
    assert out[1].reason == OVERRAN
    assert reads.stuck() == ["b"] and pool.written_off == 1 and reads.abandoned == 1
    # a and c went on on another worker; b's thread is no longer counted against the pool
    assert next(t for i, t in fn.calls if i == "c") != next(t for i, t in fn.calls if i == "b")
    for _ in range(3):  # while it is blocked: BLOCKED at once, in the same words, never read again
        out = reads.each(["a", "b", "c"], fn, timeout=fn.timeout)
        assert statuses(out) == [OK, BLOCKED, OK]
        assert out[1].reason == OVERRAN
    assert fn.count("b") == 1 and pool.written_off == 1 and reads.abandoned == 1
    fn.release.set()
    wait_for(lambda: not reads.stuck(), what="the written-off read returned")
    fn.hang.clear()
    assert statuses(reads.each(["a", "b", "c"], fn, timeout=fn.timeout)) == [OK, OK, OK]
    assert fn.count("b") == 2
    wait_for(lambda: pool.threads <= pool.size, what="the written-off thread rejoined or left")


def test_hung_items_hold_one_thread_each_at_most(items):
    pool = Pool(2)
    try:
        fn = items(hang={"h1", "h2", "h3"})
        reads = Deadlines(pool)
        for _ in range(4):
            reads.each(["a", "h1", "h2", "h3", "b"], fn, timeout=fn.timeout)
        assert sorted(reads.stuck()) == ["h1", "h2", "h3"]
        assert pool.written_off == 3 and fn.count("h1") == fn.count("h2") == fn.count("h3") == 1
        assert pool.threads <= pool.size + 3  # the pool's own, plus one blocked thread per hung item
        started = pool.started
        for _ in range(20):
            assert statuses(reads.each(["a", "h1", "h2", "h3", "b"], fn, timeout=fn.timeout)) == \
                [OK, BLOCKED, BLOCKED, BLOCKED, OK]
        assert pool.started == started  # no thread per read
        fn.release.set()
        wait_for(lambda: pool.threads <= pool.size, what="the written-off threads rejoined or left")
    finally:
        pool.close()


def test_no_thread_is_created_per_read(pool, items):
    reads = Deadlines(pool)
    fn = items()
    reads.each(["a", "b"], fn, timeout=LONG)
    started = pool.started
    for _ in range(50):
        assert statuses(reads.each(["a", "b"], fn, timeout=LONG)) == [OK, OK]
    assert pool.started == started == 1


def test_the_pool_is_bounded_and_queues_beyond_its_size():
    pool = Pool(3)
    try:
        gate = threading.Event()
        done = []
        for i in range(10):
            pool.submit(lambda i=i: (gate.wait(30), done.append(i)))
        assert pool.threads == 3
        gate.set()
        wait_for(lambda: len(done) == 10)
        assert pool.started == 3 and sorted(done) == list(range(10))
    finally:
        pool.close()


def test_the_budget_writes_off_the_item_running_and_skips_the_rest(pool, items):
    """c hangs past the whole read's budget (its own deadline is far off): a and b kept, c
    written off with the budget as its reason, d never started."""
    fn = items(hang={"c"})
    reads = Deadlines(pool)
    out = reads.each(["a", "b", "c", "d"], fn, timeout=LONG, budget=1.0)
    assert statuses(out) == [OK, OK, TIMEOUT, SKIPPED]
    assert out[2].reason == "did not finish before the whole read's 1s budget ran out"
    assert out[3].reason.startswith("not read: ") and out[3].value is None
    assert reads.stuck() == ["c"] and fn.count("d") == 0


def test_a_busy_pool_skips_what_no_worker_starts_within_the_budget(items):
    pool = Pool(1)
    gate = threading.Event()
    pool.submit(lambda: gate.wait(30))  # the only thread is busy
    try:
        fn = items()
        out = Deadlines(pool).each(["a"], fn, timeout=LONG, budget=0.1)
        assert statuses(out) == [SKIPPED] and out[0].reason.startswith("not read: ")
    finally:
        gate.set()
        pool.close()
    assert fn.calls == []  # the dropped read never ran, even once the thread was free


def test_a_closed_pool_runs_nothing(items):
    pool = Pool(2)
    reads = Deadlines(pool)
    fn = items()
    reads.each(["a"], fn, timeout=LONG)
    pool.close()
    out = reads.each(["a", "b"], fn, timeout=LONG)  # no budget: it must not wait for a worker
    assert statuses(out) == [SKIPPED, SKIPPED] and "shutting down" in out[0].reason
    assert reads.call("c", lambda: fn("c"), LONG).status == SKIPPED
    assert fn.count("a") == 1 and fn.count("b") == 0
    wait_for(lambda: pool.threads == 0)


def test_a_pool_closed_while_a_read_waits_in_its_queue_ends_the_read(items):
    pool = Pool(1)
    gate = threading.Event()
    pool.submit(lambda: gate.wait(30))  # the only thread is busy: the read queues
    box = {}
    reads = Deadlines(pool)
    t = threading.Thread(target=lambda: box.setdefault("out", reads.each(["a"], items(), timeout=LONG)),
                         daemon=True)
    t.start()
    try:
        wait_for(lambda: len(pool._jobs) == 1, what="the read queued")
        pool.close()
        t.join(START_HANG_GUARD_S)
        assert not t.is_alive(), "the read waited for a job the closed pool will never run"
        assert statuses(box["out"]) == [SKIPPED]
    finally:
        gate.set()


@pytest.mark.parametrize("size", [0, -1])
def test_a_pool_needs_a_thread(size):
    with pytest.raises(ValueError, match="at least one thread"):
        Pool(size)


# --- a read inside another read's item (a collector's devices inside the collectors' read) -----
class Outer:
    """The outer item: reads its inner items with its own Deadlines on the same pool, as a
    collector does."""

    def __init__(self, inner_fn, pool, budget=None):
        self.runs = 0
        self.threads: list[int] = []
        self.inner_fn = inner_fn
        self.inner = Deadlines(pool)
        self.budget = budget

    def __call__(self, item):
        self.runs += 1
        self.threads.append(threading.get_ident())
        out = self.inner.each(["a", "b", "c", "d"], self.inner_fn, timeout=self.inner_fn.timeout,
                              budget=self.budget)
        return [(o.status, o.value) for o in out]


def test_an_inner_read_runs_on_another_worker_of_the_same_pool(pool, items):
    fn = items()
    outer = Outer(fn, pool)
    out = Deadlines(pool).each(["x"], outer, timeout=LONG)
    assert out[0].value == [(OK, "A"), (OK, "B"), (OK, "C"), (OK, "D")]
    assert len({t for _, t in fn.calls}) == 1 and {t for _, t in fn.calls} != set(outer.threads)
    assert pool.started == 2


def test_a_hung_inner_item_costs_only_itself_and_the_outer_item_runs_once(pool, items):
    fn = items(hang={"c"})
    outer = Outer(fn, pool)
    reads = Deadlines(pool)
    out = reads.each(["x"], outer, timeout=LONG)
    assert out[0].status == OK and out[0].value == [(OK, "A"), (OK, "B"), (TIMEOUT, None), (OK, "D")]
    out = reads.each(["x"], outer, timeout=LONG)
    assert out[0].value == [(OK, "A"), (OK, "B"), (BLOCKED, None), (OK, "D")]
    assert outer.runs == 2 and fn.count("c") == 1 and pool.written_off == 1


def test_an_inner_budget_keeps_what_was_read_and_skips_the_rest(pool, items):
    fn = items(hang={"c"})
    fn.timeout = lambda item: LONG  # only the inner budget ends c's read
    outer = Outer(fn, pool, budget=1.0)
    out = Deadlines(pool).each(["x"], outer, timeout=LONG)
    assert out[0].status == OK
    assert [s for s, _ in out[0].value] == [OK, OK, TIMEOUT, SKIPPED]


def test_the_outer_deadline_holds_over_a_hung_inner_item(pool, items):
    fn = items(hang={"b"})
    fn.timeout = lambda item: LONG  # the inner read would wait for b: the outer deadline ends it
    outer = Outer(fn, pool)
    reads = Deadlines(pool)
    assert statuses(reads.each(["x"], outer, timeout=SHORT)) == [TIMEOUT]
    assert statuses(reads.each(["x"], outer, timeout=SHORT)) == [BLOCKED]
    assert outer.runs == 1 and reads.stuck() == ["x"]
