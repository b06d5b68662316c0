"""The one deadline primitive: items read on a bounded pool of threads, each under its own
deadline. Every read that can block goes through it: the collectors (the runner), a
collector's devices (GPUs, EFA devices, Lustre files, workload kinds), Lustre's mount probes and
NVML's GPU identities.

A read blocked in the kernel or a driver (an NVML call on a sick GPU, a sysfs read waiting on an
EFA admin command, statvfs of a Lustre mount whose servers are gone) cannot be interrupted. So
`read(items)` hands the items to a pool worker, which reads them in order, and the caller waits
for the item in progress until its deadline. Past it, the caller writes that worker off (it stays
blocked in the read and rejoins the pool, or leaves, once the read returns), reports the item
TIMEOUT and hands the items after it to another worker. Until that read returns the item is not
read again (BLOCKED): a hung item costs its deadline once and holds one thread at most.

One worker per read, not one per item: the reads are short system calls that each release the
GIL, and threads reading at once would hand the GIL back and forth on every call. A read costs
one hand-over to a worker and one back. `handover` bounds how long a slow item (within its
deadline) holds up the ones after it (the runner's collectors); `lanes` splits the items
between that many workers reading at once (None: one each; GPUs read at once, mounts probed at
once). A read inside an item of another read (a collector's devices) is just another read: the
item's worker waits for it like any caller.

The pool: `size` threads at most do work; they are started on demand and kept (no thread per
read once the pool has grown). A written-off thread does not count against `size`. Threads are
daemons: a read stuck in the kernel never holds up exit. The composition root (exporter.cli)
creates the pool and closes it at shutdown; a closed pool runs nothing (reads return SKIPPED).

    reader = DeadlineReader(read_device, 2.0, key=lambda d: d.path, pool=pool)
    outcomes = reader.read(devices, budget=3.2)  # outcomes[i] is devices[i]'s, in order
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

# A scrape's reads at once: the collectors' worker and the devices' worker of the collector it
# runs, one more pair while a slow collector has handed the rest over or while the GPUs' slow
# counters are refreshed in the background. Past that, reads wait their turn.
DEFAULT_POOL_SIZE = 5
POLL_S = 0.05  # how often a caller looks at a read no worker has started yet (a busy pool)

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
    limit: float = 0.0  # the item's own deadline, in seconds (0 when it was never started)

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def reason(self) -> str:
        """Why there is no value, in words for a log line or a reading's error ("" when OK): one
        wording for every caller, instead of each turning statuses into text."""
        if self.status == OK:
            return ""
        if self.status == ERROR:
            return f"{type(self.value).__name__}: {self.value}"
        if self.status == TIMEOUT:
            return f"did not finish within its {self.limit:g}s deadline"
        if self.status == BUDGET:
            return f"did not finish before the whole read's budget ran out (own deadline {self.limit:g}s)"
        if self.status == BLOCKED:
            return (f"an earlier read is still blocked past its {self.limit:g}s deadline; not read again "
                    "until it returns")
        return "not read: the items before it used up the time budget (or no thread was free to read it)"


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


class _Chain:
    """Items read in order by one worker. `end` may be moved down by the caller (hand-over)."""

    __slots__ = ("items", "idx", "fn", "lock", "results", "pos", "end", "since", "started",
                 "cancelled", "done", "job")

    def __init__(self, items: list[Any], idx: list[int], fn: Callable[[Any], Any]) -> None:
        self.items = items
        self.idx = idx  # the caller's position of each item
        self.fn = fn
        self.lock = threading.Lock()
        self.results: list[tuple[int, str, Any, float]] = []  # (chain position, status, value, took)
        self.pos = 0  # the item being read
        self.end = len(items)
        self.since = 0.0  # when the item being read started
        self.started = False
        self.cancelled = False  # written off (or never started): its results are not wanted
        self.done = False
        self.job: Job | None = None

    def run(self) -> None:
        fn, lock, results = self.fn, self.lock, self.results
        monotonic = time.monotonic
        try:
            with lock:
                if self.cancelled:
                    return
                self.started, self.since = True, monotonic()
                i, since = self.pos, self.since
            while True:
                try:
                    status, value = OK, fn(self.items[i])
                except Exception as e:  # noqa: BLE001 - reported as the item's outcome
                    status, value = ERROR, e
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
    - `handover`: when an item has run this long (within its deadline), the items after it go
      to another worker, so a slow item delays the rest by `handover` at most.
    - `lanes`: split the items into this many chains read at once (None: one chain per item).

    One `read` at a time (the callers serialise: one collection, one collector).
    """

    def __init__(self, fn: Callable[[Any], Any], timeout: float | Callable[[Any], float], *,
                 pool: Pool, key: Callable[[Any], Hashable] = lambda item: item,
                 handover: float | None = None, lanes: int | None = 1) -> None:
        self.fn = fn
        self._timeout = timeout if callable(timeout) else (lambda _item, t=float(timeout): t)
        self.key = key
        self.pool = pool
        self.handover = handover
        self.lanes = lanes
        self._stuck: dict[Hashable, _Chain] = {}  # key -> the chain left blocked reading it
        self.abandoned = 0  # reads written off, ever

    def stuck(self) -> list[Hashable]:
        """Keys whose abandoned read has not returned yet."""
        return [k for k, ch in list(self._stuck.items()) if not ch.done]  # may run beside a read

    def read(self, items: Sequence[Any], budget: float | None = None) -> list[Outcome]:
        """Each item's outcome, in order; every item's read starts within `budget` seconds (from
        now) or is SKIPPED, and one running when the budget ends is abandoned (BUDGET)."""
        end = time.monotonic() + budget if budget is not None else float("inf")
        out: list[Outcome | None] = [None] * len(items)
        self._stuck = {k: ch for k, ch in self._stuck.items() if not ch.done}
        todo = []
        for i, item in enumerate(items):
            if self.key(item) in self._stuck:
                out[i] = Outcome(BLOCKED, limit=self._timeout(item))
            else:
                todo.append(i)
        wake = threading.Event()  # set when a worker is done with a chain
        n = len(todo) if self.lanes is None else min(max(1, self.lanes), len(todo))
        active = [self._submit(items, todo[j * len(todo) // n:(j + 1) * len(todo) // n], wake)
                  for j in range(n)]
        while active:
            wake.clear()
            now = time.monotonic()
            nxt = end  # when to look again
            still: list[_Chain] = []
            for ch in active:
                rest: list[int] = []
                with ch.lock:
                    for pos, status, value, took in ch.results:
                        out[ch.idx[pos]] = Outcome(status, value, took, self._timeout(ch.items[pos]))
                    ch.results.clear()
                    if ch.done:
                        continue
                    if not ch.started:
                        if now >= end or ch.job.finished:  # no worker took it in time, or none will
                            ch.cancelled = True
                        else:
                            still.append(ch)
                            nxt = min(nxt, now + POLL_S)
                        continue
                    pos, since = ch.pos, ch.since
                    own = self._timeout(ch.items[pos])
                    limit = since + own
                    if now >= limit or now >= end:
                        ch.cancelled = True
                        status = TIMEOUT if now >= limit else BUDGET
                        out[ch.idx[pos]] = Outcome(status, None, now - since, own)
                        rest = ch.idx[pos + 1:ch.end]
                    else:
                        still.append(ch)
                        nxt = min(nxt, limit)
                        if self.handover is not None and pos + 1 < ch.end:
                            if now >= since + self.handover:
                                rest = ch.idx[pos + 1:ch.end]
                                ch.end = pos + 1  # it ends with the slow item; the rest go on elsewhere
                            else:
                                nxt = min(nxt, since + self.handover)
                if ch.cancelled:
                    self._stuck[self.key(ch.items[pos])] = ch
                    self.abandoned += 1
                    self.pool.write_off(ch.job)
                if rest and now < end:
                    still.append(self._submit(items, rest, wake))
                    nxt = min(nxt, now + POLL_S)
            active = still
            if active:
                wake.wait(None if nxt == float("inf") else max(nxt - time.monotonic(), 0.0005))
        return [o if o is not None else Outcome(SKIPPED) for o in out]

    def _submit(self, items: Sequence[Any], idx: list[int], wake: threading.Event) -> _Chain:
        ch = _Chain([items[i] for i in idx], idx, self.fn)
        ch.job = self.pool.submit(ch.run, wake.set)  # woken once the worker is free again
        if ch.job.finished:  # a closed pool: nothing will run it
            ch.cancelled = ch.done = True
        return ch
