"""Read items under deadlines on one bounded pool of threads: the mechanism every read that can
block uses (the collectors themselves, NVML calls per GPU, EFA devices, Lustre files).

Why threads at all: a read blocked in the kernel or a driver (an NVML call on a sick GPU, a sysfs
read waiting on an EFA admin command, a Lustre stats file whose client waits on its server)
cannot be interrupted. So the items are read on a worker while the caller watches the item in
progress; past that item's deadline the caller writes the worker off (it stays blocked in the
read and rejoins the pool, or leaves, once the read returns) and the items after it go to
another worker. Until that read returns the item is not read again: a hung item costs its
deadline once, holds at most one thread, and the other items are served.

Why one worker per read rather than one per item: the reads are short system calls that each
release the GIL; several threads reading at once hand the GIL back and forth on every call,
which on a 2-CPU node costs more than the reads. A read of N items is one hand-over to a worker
and one back.

A read inside another reader's item (a collector's devices, read inside the collectors' chain)
runs right there, in that item's worker, and the outer chain's watcher holds each inner item to
its own deadline too: one hand-over per collection, not one per collector. When an inner item
overruns, the watcher writes that worker off and runs the outer item again on another worker;
the inner read then returns at once what it had read, TIMEOUT for the overrun item and BLOCKED
for it later.

Pool: `size` threads at most do work; they are started on demand and then kept (no thread is
created per scrape once the pool has grown to what a scrape needs). A written-off thread does
not count against `size`. Threads are daemons: a read stuck in the kernel never holds up exit.

    pool = default_pool()                       # the process's pool (or Pool(n) of one's own)
    reader = DeadlineReader(read_device, timeout=2.0, key=lambda d: d.path, pool=pool)
    outcomes = reader.read(devices, budget=3.2)  # outcomes[i] is devices[i]'s, in order
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

# a scrape needs 1 (the collectors' chain; their reads run inline in it), a GPU slow refresh 2
DEFAULT_POOL_SIZE = 5
POLL_S = 0.05  # how often a watcher looks at a chain it has no deadline for yet (not started, or an
# inline read may start inside its item): a deadline is seen that much late at most

# Outcome statuses
OK = "ok"
ERROR = "error"  # the read raised: `value` is the exception
BLOCKED = "blocked"  # an earlier read of this item is still blocked: not read again
TIMEOUT = "timeout"  # the read overran its own deadline: abandoned to its worker
BUDGET = "budget"  # the read was still running when the whole read's budget ran out: abandoned
SKIPPED = "skipped"  # never started: the items before it used up the budget (or no worker ran it)


class Outcome(NamedTuple):
    status: str
    value: Any = None  # fn's result (OK) or the exception (ERROR)
    took: float = 0.0  # seconds from the item's start to its result (or to its abandonment)

    @property
    def ok(self) -> bool:
        return self.status == OK


class Job:
    """A function run once on a pool worker, then `on_done` (neither when the pool closes first)."""

    __slots__ = ("fn", "on_done", "finished", "written_off")

    def __init__(self, fn: Callable[[], object], on_done: Callable[[], object] | None = None) -> None:
        self.fn = fn
        self.on_done = on_done
        self.finished = False  # set under the pool's lock once fn has returned (or never will run)
        self.written_off = False


class Pool:
    """At most `size` daemon threads running jobs in the order submitted; see the module doc."""

    def __init__(self, size: int = DEFAULT_POOL_SIZE, name: str = "worker") -> None:
        if size < 1:
            raise ValueError(f"a pool needs at least one thread, not {size}")
        self.size = size
        self.name = name
        self._cond = threading.Condition(threading.Lock())
        self._jobs: deque[Job] = deque()
        self._idle = 0  # threads waiting for a job
        # threads that finished a job and will look at the queue before waiting: a job submitted
        # meanwhile (the caller woken by the job's end submits the next) needs no new thread
        self._returning = 0
        self._live = 0  # threads counted against size (not written off)
        self.threads = 0  # threads alive (written-off ones included)
        self.written_off = 0  # threads left blocked past a deadline, ever
        self.started = 0  # threads started, ever
        self.closed = False

    def submit(self, fn: Callable[[], object], on_done: Callable[[], object] | None = None) -> Job:
        """Run `fn` on a worker, then `on_done`; when the pool is closed neither runs (the job is
        `finished` at once)."""
        job = Job(fn, on_done)
        with self._cond:
            if self.closed:
                job.finished = True
                return job
            self._jobs.append(job)
            if self._idle:
                self._idle -= 1
                self._cond.notify()
            elif len(self._jobs) > self._returning and self._live < self.size:
                self._start()
        return job

    def write_off(self, job: Job) -> bool:
        """Stop counting the thread running `job` (blocked past a deadline) against the pool's
        size; a queued job may then get a new thread. False when the job has already finished."""
        with self._cond:
            if job.finished or job.written_off:
                return False
            job.written_off = True
            self._live -= 1
            self.written_off += 1
            if len(self._jobs) > self._idle + self._returning and not self.closed:
                self._start()
            return True

    def close(self) -> None:
        """Let idle threads leave; queued jobs never run. Blocked ones leave when their read returns."""
        with self._cond:
            self.closed = True
            for job in self._jobs:
                job.finished = True
            self._jobs.clear()
            self._idle = 0
            self._cond.notify_all()

    def _start(self) -> None:
        self._live += 1
        self.threads += 1
        self.started += 1
        threading.Thread(target=self._loop, name=f"{self.name}-{self.started}", daemon=True).start()

    def _loop(self) -> None:
        cond = self._cond
        returning = False
        while True:
            with cond:
                if returning:
                    self._returning -= 1
                while not self._jobs:
                    if self.closed:
                        self._live -= 1
                        self.threads -= 1
                        return
                    self._idle += 1
                    cond.wait()  # woken by submit (which took this thread off _idle) or close
                job = self._jobs.popleft()
            try:
                job.fn()
            except BaseException:  # noqa: BLE001, S110 - the job reports its own errors; the thread lives on
                pass
            with cond:
                job.finished = True
                leave = job.written_off and (self._live >= self.size or self.closed)
                if leave:
                    self.threads -= 1
                else:
                    if job.written_off:
                        self._live += 1  # back in the pool
                    self._returning += 1
                    returning = True
            if job.on_done is not None:
                try:
                    job.on_done()
                except BaseException:  # noqa: BLE001, S110 - a callback's failure must not end the worker
                    pass
            if leave:
                return


_default: Pool | None = None
_default_lock = threading.Lock()


def default_pool() -> Pool:
    """The process's pool, shared by the runner and every collector that reads under deadlines
    (a new one if the last was closed)."""
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = Pool(DEFAULT_POOL_SIZE, "worker")
        return _default


_local = threading.local()  # .chain, .item: the chain and item this worker thread is running


class _Abandoned(BaseException):  # noqa: N818 - not an error: unwinds a written-off worker
    """Raised in a worker whose chain the watcher gave up on, once its blocked inner read returns."""


@dataclass
class _Inner:
    """An item of a read run inline inside a chain's item (a collector's device read inside the
    collectors' chain)."""
    reader: DeadlineReader
    key: Hashable
    item: Any  # the outer item the inline read belongs to
    start: float
    limit: float  # monotonic deadline of this inner item
    status: str  # what it is when it overruns: TIMEOUT (its own deadline) or BUDGET (the read's)
    end: float  # the inline read's budget end


class _Chain:
    """Items read in order by one worker. `end` may be moved down by the watcher (hand-over)."""

    __slots__ = ("items", "idx", "fn", "wake", "lock", "results", "pos", "end", "since", "started",
                 "cancelled", "done", "job", "inner", "first_since")

    def __init__(self, items: list[Any], idx: list[int], fn: Callable[[Any], Any],
                 wake: threading.Event, first_since: float | None = None) -> None:
        self.items = items
        self.idx = idx  # the caller's position of each item
        self.fn = fn
        self.wake = wake
        self.lock = threading.Lock()
        self.results: list[tuple[int, str, Any, float]] = []  # (chain position, status, value, took)
        self.pos = 0  # the item being read
        self.end = len(items)
        self.since = 0.0  # when the item being read started
        self.started = False
        self.cancelled = False
        self.done = False
        self.job: Job | None = None
        # set by a DeadlineReader read run inline by this chain's item: the item inside it being
        # read, which the watcher holds to its own deadline (see DeadlineReader._read_inline)
        self.inner: _Inner | None = None
        self.first_since = first_since  # the first item's start, when it is a restarted one

    def run(self) -> None:
        fn, lock, results = self.fn, self.lock, self.results
        monotonic = time.monotonic
        try:
            with lock:
                if self.cancelled:
                    return
                self.started, self.since = True, self.first_since or monotonic()
                i, since = self.pos, self.since
            while True:
                _local.chain, _local.item = self, self.items[i]
                try:
                    status, value = OK, fn(self.items[i])
                except _Abandoned:
                    return  # the watcher gave up on this worker while an inner read was blocked
                except Exception as e:  # noqa: BLE001 - reported as the item's outcome
                    status, value = ERROR, e
                finally:
                    _local.chain = _local.item = None
                now = monotonic()
                with lock:
                    if self.cancelled:
                        return  # written off while this read was blocked: its result is stale
                    results.append((i, status, value, now - since))
                    i += 1
                    if i >= self.end:
                        self.pos = i
                        return
                    self.pos, self.since, since = i, now, now
        finally:
            with lock:
                self.done = True


class DeadlineReader:
    """Reads items with `fn` under deadlines on `pool`: see the module doc.

    - `timeout`: seconds an item's read may take from its start (a number, or a function of the
      item); past it the item's outcome is TIMEOUT and its worker is written off.
    - `key(item)`: what identifies an item across reads (a device path, a GPU index): an item
      whose earlier read is still blocked gets BLOCKED at once and is not read again.
    - `handover`: when an item has run this long (but is within its deadline), the items after
      it go to another worker, so a slow item delays the rest by `handover` at most (the
      collectors' chain uses it; without it they wait until the slow item's deadline).
    - `lanes`: split the items into this many chains read at once (GPUs read concurrently).

    One `read` at a time (the callers serialise: one collection, one collector).
    """

    def __init__(self, fn: Callable[[Any], Any], timeout: float | Callable[[Any], float], *,
                 key: Callable[[Any], Hashable] = lambda item: item, pool: Pool | None = None,
                 handover: float | None = None, lanes: int = 1) -> None:
        self.fn = fn
        self._timeout = timeout if callable(timeout) else (lambda _item, t=float(timeout): t)
        self.key = key
        self.pool = pool if pool is not None else default_pool()
        self.handover = handover
        self.lanes = max(1, lanes)
        self._stuck: dict[Hashable, _Chain] = {}  # key -> the chain left blocked reading it
        self.abandoned = 0  # reads written off, ever
        self.inline = True  # run inside a chain's item: read there, the chain's watcher watching
        # An inline read whose worker was given up on: the outcomes it had (and the overrun item's),
        # for the same outer item's restart: (outer item, budget end, key -> outcome)
        self._partial: dict[Hashable, Outcome] = {}
        self._resume: tuple[Any, float, dict[Hashable, Outcome]] | None = None

    def stuck(self) -> list[Hashable]:
        """Keys whose abandoned read has not returned yet."""
        return [k for k, ch in list(self._stuck.items()) if not ch.done]  # may run beside a read

    def read(self, items: Sequence[Any], budget: float | None = None) -> list[Outcome]:
        """Each item's outcome, in order; every item's read starts within `budget` seconds (from
        now) or is SKIPPED, and one running when the budget ends is abandoned (BUDGET).

        Called inside an item of another reader's chain (a collector run by the runner), the
        items are read right there, in that worker, and the outer chain's watcher holds each to
        its deadline: no hand-over to another thread. When one overruns, the watcher writes that
        worker off and starts the outer item again on another worker; this read then returns
        at once what it had read, the overrun item's TIMEOUT (or BUDGET) and BLOCKED for it
        afterwards."""
        ch = getattr(_local, "chain", None)
        if ch is not None and self.inline and self.lanes == 1:
            return self._read_inline(ch, _local.item, items, budget)
        now = time.monotonic()
        end = now + budget if budget is not None else float("inf")
        out: list[Outcome | None] = [None] * len(items)
        todo: list[int] = []
        for i, item in enumerate(items):
            ch = self._stuck.get(self.key(item))
            if ch is not None:
                if not ch.done:
                    out[i] = Outcome(BLOCKED)
                    continue
                del self._stuck[self.key(item)]
            todo.append(i)
        for k in [k for k, ch in self._stuck.items() if ch.done]:
            del self._stuck[k]
        wake = threading.Event()
        n = min(self.lanes, len(todo))
        active = [self._submit(items, todo[j * len(todo) // n:(j + 1) * len(todo) // n], wake)
                  for j in range(n)]
        while active:
            wake.clear()
            now = time.monotonic()
            nxt = end
            still: list[_Chain] = []
            restart: tuple[list[int], float] | None = None
            for ch in active:
                with ch.lock:
                    for pos, status, value, took in ch.results:
                        out[ch.idx[pos]] = Outcome(status, value, took)
                    ch.results.clear()
                    if ch.done:
                        continue
                    if not ch.started:
                        if now >= end or (ch.job is not None and ch.job.finished):
                            # no worker took it in time (a busy pool), or none ever will (closed)
                            ch.cancelled = True
                            continue
                        still.append(ch)
                        nxt = min(nxt, now + POLL_S)  # look again once it has started
                        continue
                    pos, since = ch.pos, ch.since
                    item = ch.items[pos]
                    limit = since + self._timeout(item)
                    inner = ch.inner
                    if inner is not None and now >= inner.limit and now < limit and now < end:
                        # an inline read inside this item overran: write the worker off and run
                        # the item again elsewhere (from its own start, so its deadline holds)
                        ch.cancelled = True
                        inner.reader._give_up_inner(ch, inner, now)
                        restart = (ch.idx[pos:ch.end], since)
                        ch.end = pos + 1
                        rest = []
                    elif now >= limit or now >= end:
                        ch.cancelled = True
                        out[ch.idx[pos]] = Outcome(TIMEOUT if now >= limit else BUDGET, None, now - since)
                        rest = ch.idx[pos + 1:ch.end]
                        ch.end = pos + 1
                    elif self.handover is not None and now >= since + self.handover and pos + 1 < ch.end:
                        rest = ch.idx[pos + 1:ch.end]
                        ch.end = pos + 1  # it ends with the slow item; the rest go on elsewhere
                    else:
                        rest = []
                        if self.handover is not None and pos + 1 < ch.end:
                            nxt = min(nxt, since + self.handover)
                    if not ch.cancelled:
                        # an inline read may start inside the item: look again at least every
                        # POLL_S (an overrun inside it is seen that much late at most)
                        nxt = min(nxt, limit, inner.limit if inner is not None else now + POLL_S)
                        still.append(ch)
                if restart is not None:
                    if ch.job is not None:
                        self.pool.write_off(ch.job)
                    still.append(self._submit(items, restart[0], wake, restart[1]))
                    nxt = min(nxt, now + POLL_S)  # look again once it has started
                    restart = None
                    continue
                if ch.cancelled and ch.started:
                    self._stuck[self.key(ch.items[ch.pos])] = ch
                    self.abandoned += 1
                    if ch.job is not None:
                        self.pool.write_off(ch.job)
                if rest and now < end:
                    still.append(self._submit(items, rest, wake))
                    nxt = min(nxt, now + POLL_S)
            active = still
            if active:
                wake.wait(None if nxt == float("inf") else max(nxt - time.monotonic(), 0.0005))
        return [o if o is not None else Outcome(SKIPPED) for o in out]

    def _read_inline(self, ch: _Chain, outer: Any, items: Sequence[Any],
                     budget: float | None) -> list[Outcome]:
        monotonic = time.monotonic
        resume, self._resume = self._resume, None
        if resume is not None and resume[0] is outer:  # this outer item's restart
            end, done = resume[1], resume[2]
        else:
            end, done = (monotonic() + budget if budget is not None else float("inf")), {}
        partial = self._partial = {}
        out: list[Outcome] = []
        fn, timeout, lock = self.fn, self._timeout, ch.lock
        for item in items:
            key = self.key(item)
            o = done.get(key)
            if o is not None:
                out.append(o)
                continue
            stuck = self._stuck.get(key)
            if stuck is not None:
                if not stuck.done:
                    out.append(Outcome(BLOCKED))
                    continue
                del self._stuck[key]
            start = monotonic()
            if start >= end:
                out.append(Outcome(SKIPPED))
                continue
            limit = start + timeout(item)
            inner = _Inner(self, key, outer, start, min(limit, end), TIMEOUT if limit <= end else BUDGET, end)
            with lock:
                if ch.cancelled:
                    raise _Abandoned
                ch.inner = inner
            try:
                status, value = OK, fn(item)
            except Exception as e:  # noqa: BLE001 - reported as the item's outcome
                status, value = ERROR, e
            took = monotonic() - start
            with lock:
                ch.inner = None
                if ch.cancelled:
                    raise _Abandoned
            o = partial[key] = Outcome(status, value, took)
            out.append(o)
        self._partial = {}
        return out

    def _give_up_inner(self, ch: _Chain, inner: _Inner, now: float) -> None:
        """The watcher's side: `inner` overran; `ch`'s worker is written off (the caller holds
        ch.lock and cancels it) and the outer item will start again."""
        self._stuck[inner.key] = ch
        self.abandoned += 1
        done = dict(self._partial)
        done[inner.key] = Outcome(inner.status, None, now - inner.start)
        self._resume = (inner.item, inner.end, done)

    def _submit(self, items: Sequence[Any], idx: list[int], wake: threading.Event,
                first_since: float | None = None) -> _Chain:
        ch = _Chain([items[i] for i in idx], idx, self.fn, wake, first_since)
        ch.job = self.pool.submit(ch.run, wake.set)  # woken once the worker is free again
        if ch.job.finished:  # a closed pool: nothing will run it
            ch.cancelled = ch.done = True
        return ch
