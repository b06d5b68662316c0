"""The one deadline mechanism: items read in order on a bounded pool, each under its own deadline."""

from __future__ import annotations

import threading
import time

import pytest

from exporter.deadline import BLOCKED, BUDGET, ERROR, OK, SKIPPED, TIMEOUT, DeadlineReader, Pool
from tests.helpers import wait_for


class Items:
    """fn for a reader: `hang` items block until released; every call is logged with its thread."""

    def __init__(self, hang=(), slow=None):
        self.hang, self.slow = set(hang), slow or {}
        self.release = threading.Event()
        self.calls: list[tuple[str, int]] = []

    def __call__(self, item):
        self.calls.append((item, threading.get_ident()))
        if item in self.hang:
            self.release.wait(30)
        if item in self.slow:
            time.sleep(self.slow[item])
        if item == "boom":
            raise OSError(5, "Input/output error", item)
        return item.upper()


def test_items_are_read_in_order_on_one_worker_not_the_caller():
    fn = Items()
    r = DeadlineReader(fn, 1.0, pool=Pool(3))
    out = r.read(["a", "b", "c"])
    assert [(o.status, o.value) for o in out] == [(OK, "A"), (OK, "B"), (OK, "C")]
    assert [c[0] for c in fn.calls] == ["a", "b", "c"]
    assert len({t for _, t in fn.calls}) == 1 and fn.calls[0][1] != threading.get_ident()


def test_an_error_is_that_item_s_outcome():
    out = DeadlineReader(Items(), 1.0, pool=Pool(2)).read(["a", "boom", "c"])
    assert [o.status for o in out] == [OK, ERROR, OK]
    assert isinstance(out[1].value, OSError)


def test_a_hung_read_costs_only_its_item_and_holds_one_thread_until_it_returns():
    pool = Pool(2)
    fn = Items(hang={"b"})
    r = DeadlineReader(fn, 0.2, pool=pool)
    t = time.monotonic()
    out = r.read(["a", "b", "c"])
    assert 0.2 <= time.monotonic() - t < 1.5
    assert [o.status for o in out] == [OK, TIMEOUT, OK] and out[2].value == "C"
    assert out[1].took >= 0.2
    assert r.stuck() == ["b"] and pool.written_off == 1
    # while it is blocked: not read again, no new wait, no second stuck thread
    for _ in range(3):
        t = time.monotonic()
        out = r.read(["a", "b", "c"])
        assert time.monotonic() - t < 0.15
        assert [o.status for o in out] == [OK, BLOCKED, OK]
    assert [c[0] for c in fn.calls].count("b") == 1
    assert pool.written_off == 1 and pool.threads <= pool.size + 1
    fn.release.set()
    wait_for(lambda: not r.stuck())
    assert [o.status for o in r.read(["a", "b", "c"])] == [OK, OK, OK]
    wait_for(lambda: pool.threads <= pool.size)


def test_no_thread_is_created_per_read():
    pool = Pool(4)
    r = DeadlineReader(Items(), 1.0, pool=pool)
    r.read(["a", "b"])
    started = pool.started
    names = {t.name for t in threading.enumerate()}
    for _ in range(50):
        assert [o.status for o in r.read(["a", "b"])] == [OK, OK]
    assert pool.started == started == 1
    assert {t.name for t in threading.enumerate()} == names


def test_the_pool_is_bounded_and_queues_beyond_its_size():
    pool = Pool(3)
    gate = threading.Event()
    done = []
    for i in range(10):
        pool.submit(lambda i=i: (gate.wait(5), done.append(i)))
    assert pool.threads == 3
    gate.set()
    wait_for(lambda: len(done) == 10)
    assert pool.started == 3


def test_the_budget_stops_the_read_and_skips_the_rest():
    """a and b return at once, c runs past the budget (released only after the read returned):
    the outcomes do not depend on how fast a loaded host runs a and b."""
    fn = Items(hang={"c"})
    try:
        t = time.monotonic()
        out = DeadlineReader(fn, 30.0, pool=Pool(2)).read(["a", "b", "c", "d"], budget=0.5)
        assert time.monotonic() - t >= 0.5
        assert [o.status for o in out] == [OK, OK, BUDGET, SKIPPED]
    finally:
        fn.release.set()


def test_handover_lets_the_items_after_a_slow_one_go_on_while_it_keeps_its_deadline():
    fn = Items(slow={"slow": 0.5})
    r = DeadlineReader(fn, 2.0, pool=Pool(3), handover=0.05)
    t = time.monotonic()
    out = r.read(["a", "slow", "c"])
    took = time.monotonic() - t
    assert [o.status for o in out] == [OK, OK, OK]
    assert 0.5 <= took < 1.5 and out[1].took >= 0.5
    c_thread = next(t for i, t in fn.calls if i == "c")
    slow_thread = next(t for i, t in fn.calls if i == "slow")
    assert c_thread != slow_thread  # c did not wait behind the slow read


def test_lanes_read_at_once():
    fn = Items(slow={"a": 0.3, "b": 0.3})
    t = time.monotonic()
    out = DeadlineReader(fn, 2.0, pool=Pool(3), lanes=2).read(["a", "b"])
    assert time.monotonic() - t < 0.55
    assert [o.status for o in out] == [OK, OK]
    assert len({t for _, t in fn.calls}) == 2


def test_a_closed_pool_runs_nothing_and_the_read_returns_at_once():
    pool = Pool(2)
    r = DeadlineReader(Items(), 1.0, pool=pool)
    r.read(["a"])
    pool.close()
    t = time.monotonic()
    assert [o.status for o in r.read(["a", "b"], budget=1.0)] == [SKIPPED, SKIPPED]
    assert time.monotonic() - t < 0.5
    wait_for(lambda: pool.threads == 0)


def test_a_busy_pool_skips_what_no_worker_starts_within_the_budget():
    pool = Pool(1)
    gate = threading.Event()
    pool.submit(lambda: gate.wait(5))
    try:
        t = time.monotonic()
        out = DeadlineReader(Items(), 1.0, pool=pool).read(["a"], budget=0.2)
        assert out[0].status == SKIPPED and time.monotonic() - t < 1.0
    finally:
        gate.set()


@pytest.mark.parametrize("size", [0, -1])
def test_a_pool_needs_a_thread(size):
    with pytest.raises(ValueError, match="at least one thread"):
        Pool(size)


# --- a read inside another reader's item (a collector's devices inside the collectors' chain) ----
class Outer:
    """The outer item: reads its inner items with `inner` (a DeadlineReader on the same pool), as a
    collector does."""

    def __init__(self, inner_fn, pool, timeout=0.2, budget=None):
        self.runs = 0
        self.threads: list[int] = []
        self.inner = DeadlineReader(inner_fn, timeout, pool=pool)
        self.budget = budget

    def __call__(self, item):
        self.runs += 1
        self.threads.append(threading.get_ident())
        return [(o.status, o.value) for o in self.inner.read(["a", "b", "c", "d"], self.budget)]


def test_an_inner_read_is_one_hand_over_to_another_worker_of_the_same_pool():
    fn = Items()
    pool = Pool(3)
    outer = Outer(fn, pool)
    out = DeadlineReader(outer, 2.0, pool=pool).read(["x"])
    assert out[0].value == [(OK, "A"), (OK, "B"), (OK, "C"), (OK, "D")]
    inner_threads = {t for _, t in fn.calls}
    assert len(inner_threads) == 1 and inner_threads != set(outer.threads)
    assert pool.started == 2


def test_a_hung_inner_item_costs_only_itself_and_the_outer_item_runs_once():
    fn = Items(hang={"c"})
    pool = Pool(3)
    outer = Outer(fn, pool, timeout=0.2)
    r = DeadlineReader(outer, 3.0, pool=pool)
    try:
        t = time.monotonic()
        out = r.read(["x"])
        assert 0.2 <= time.monotonic() - t < 1.5
        assert out[0].status == OK and out[0].value == [(OK, "A"), (OK, "B"), (TIMEOUT, None), (OK, "D")]
        assert [c[0] for c in fn.calls] == ["a", "b", "c", "d"]
        assert outer.runs == 1 and pool.written_off == 1 and outer.inner.stuck() == ["c"]
        t = time.monotonic()
        out = r.read(["x"])
        assert time.monotonic() - t < 0.15
        assert out[0].value == [(OK, "A"), (OK, "B"), (BLOCKED, None), (OK, "D")]
        assert [c[0] for c in fn.calls].count("c") == 1
    finally:
        fn.release.set()
    wait_for(lambda: not outer.inner.stuck())
    assert r.read(["x"])[0].value == [(OK, "A"), (OK, "B"), (OK, "C"), (OK, "D")]


def test_an_inner_budget_keeps_what_was_read_and_skips_the_rest():
    """The inner read's budget ends while c hangs (it is released only after the outer read
    returned): a and b kept, c abandoned, d skipped, and the outer item is OK within its own
    deadline. No figure a loaded host could miss: the items take no time of their own."""
    fn = Items(hang={"c"})
    pool = Pool(3)
    outer = Outer(fn, pool, timeout=30.0, budget=0.5)
    try:
        t = time.monotonic()
        out = DeadlineReader(outer, 30.0, pool=pool).read(["x"])
        assert time.monotonic() - t >= 0.5
        assert out[0].status == OK
        assert [s for s, _ in out[0].value] == [OK, OK, BUDGET, SKIPPED]
    finally:
        fn.release.set()


def test_the_outer_deadline_holds_over_hung_inner_items():
    fn = Items(hang={"b", "c"})
    pool = Pool(3)
    outer = Outer(fn, pool, timeout=0.3)
    try:
        t = time.monotonic()
        out = DeadlineReader(outer, 0.5, pool=pool).read(["x"])
        assert time.monotonic() - t < 1.2
        assert out[0].status == TIMEOUT and outer.runs == 1
    finally:
        fn.release.set()


def test_a_pool_closed_while_a_read_waits_in_its_queue_ends_the_read():
    pool = Pool(1)
    gate = threading.Event()
    pool.submit(lambda: gate.wait(5))  # the only thread is busy: the read's chain queues
    box = {}
    reader = DeadlineReader(Items(), 1.0, pool=pool)
    t = threading.Thread(target=lambda: box.setdefault("out", reader.read(["a"])), daemon=True)
    t.start()
    try:
        wait_for(lambda: len(pool._jobs) == 1)
        pool.close()
        t.join(2)
        assert not t.is_alive(), "the read waited for a job the closed pool will never run"
        assert [o.status for o in box["out"]] == [SKIPPED]
    finally:
        gate.set()


def test_each_outcome_carries_its_reason():
    """One wording for every caller: the item's own deadline in a TIMEOUT and a BLOCKED, the
    exception in an ERROR, nothing for OK."""
    fn = Items(hang={"b"})
    r = DeadlineReader(fn, 0.2, pool=Pool(2))
    try:
        out = r.read(["a", "b", "boom"])
        assert [o.reason for o in out] == [
            "", "did not finish within its 0.2s deadline", "OSError: [Errno 5] Input/output error: 'boom'"]
        assert r.read(["b"])[0].reason == ("an earlier read is still blocked past its 0.2s deadline; "
                                           "not read again until it returns")
    finally:
        fn.release.set()
    pool = Pool(1)
    pool.close()
    assert DeadlineReader(Items(), 1.0, pool=pool).read(["a"])[0].reason.startswith("not read:")
