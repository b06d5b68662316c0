"""The one deadline primitive: reads that can block, run on a bounded pool of threads, each read
under its own deadline. Everything that can block goes through it: the runner's collectors, a
collector's devices (GPUs, EFA devices, Lustre files and mount probes, workload kinds) and
NVML's GPU identities.

A read blocked in the kernel or a driver (an NVML call on a sick GPU, a sysfs read waiting on an
EFA admin command, statvfs of a Lustre mount whose servers are gone) cannot be interrupted. So
the read runs on a pool worker and the caller waits for it until its deadline. Past it the
caller writes that worker off (it stays in the read and rejoins the pool, or leaves, once the
read returns) and reports TIMEOUT. Until that read returns, the item (its `key`) is not read
again (BLOCKED): a hung item costs its deadline once and holds one thread at most.

    reads = Deadlines(pool)
    o = reads.call("statvfs /fsx", lambda: os.statvfs("/fsx"), 1.0)
    outcomes = reads.each(devices, read_device, key=lambda d: d.path, timeout=2.0, budget=3.2)

`each` reads the items in order on one worker (a write-off moves the rest to another), not a
worker per item: one hand-over to a worker and one back per call. A hand-over per item (`call`
for each) cost 6x the CPU or more of reading 32 short files in one `each`: 1.48 against 0.22 ms
(`.venv/bin/python bench/bench_deadline.py`, 2026-11-28, a loaded 2-core host; reruns 2.03
against 0.35 and 1.87 against 0.15 ms; 32 = a p5's EFA devices).
Items are never read at once (no lanes) and a slow item does not hand the rest over early:
reading a p5's 8 GPUs at once saved wall time but no CPU, 3.53 against 3.65 ms per collection
(`bench/bench_gpu.py --scrapes 300 --skip-whole`, simulated p5 with captured NVML latencies,
2026-11-28: 3.3 against 6.0 ms median wall), and on the real H200 read as 8 GPUs at once was
slower (docs/real-gpu.md). Waiting is on a Condition the worker notifies, never polling.

The pool: `size` threads at most do work; they are started on demand and kept. A written-off
thread does not count against `size`. Threads are daemons: a read stuck in the kernel never
holds up exit. The composition root creates the one pool and closes it at shutdown; a closed
pool runs nothing (reads come back SKIPPED at once).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

# A scrape's reads at once: the collectors' worker, the devices' worker of the collector it runs,
# and the GPUs' slow counters refreshed in the background; one spare. Past that, reads queue.
DEFAULT_POOL_SIZE = 5

# Outcome statuses
OK = "ok"
ERROR = "error"  # the read raised: `value` is the exception
TIMEOUT = "timeout"  # past its own deadline or the whole read's budget: written off
BLOCKED = "blocked"  # an earlier read of this key is still blocked: not read again
SKIPPED = "skipped"  # never started: the budget was used up, or the pool is closed


class Outcome(NamedTuple):
    status: str
    value: Any = None  # the result (OK) or the exception (ERROR)
    took: float = 0.0  # seconds it ran; for TIMEOUT and BLOCKED at least its deadline
    reason: str = ""  # why there is no value, in words for a log line or a reading's error

    @property
    def ok(self) -> bool:
        return self.status == OK


class Job:
    """A function run once on a pool worker, then `on_done` (at once when the pool closes first)."""

    __slots__ = ("fn", "on_done", "finished", "written_off")

    def __init__(self, fn: Callable[[], object], on_done: Callable[[], object] | None) -> None:
        self.fn = fn
        self.on_done = on_done
        self.finished = False  # set under the pool's lock once fn has returned (or never will run)
        self.written_off = False


def _call(cb: Callable[[], object] | None) -> None:
    if cb is not None:
        try:
            cb()
        except BaseException:  # noqa: BLE001, S110 - a callback's failure must not end a worker
            pass


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
        """Run `fn` on a worker, then `on_done`; on a closed pool `fn` never runs (`on_done` does)."""
        job = Job(fn, on_done)
        with self._cond:
            if not self.closed:
                self._jobs.append(job)
                if self._idle:
                    self._idle -= 1
                    self._cond.notify()
                elif len(self._jobs) > self._returning and self._live < self.size:
                    self._start()
                return job
            job.finished = True
        _call(on_done)
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
        """Let idle threads leave; queued jobs never run (their `on_done` does, so no caller waits
        for them). Blocked threads leave when their read returns."""
        with self._cond:
            self.closed = True
            dropped = list(self._jobs)
            for job in dropped:
                job.finished = True
            self._jobs.clear()
            self._idle = 0
            self._cond.notify_all()
        for job in dropped:
            _call(job.on_done)

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
            _call(job.fn)  # the job reports its own errors; the thread lives on
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
            _call(job.on_done)
            if leave:
                return


class _Run:
    """Items read in order by one worker; the caller looks at `done` and `since` under `cond`."""

    def __init__(self, fn: Callable[[Any], Any], items: list[Any], cond: threading.Condition) -> None:
        self.fn, self.items, self.cond = fn, items, cond
        self.done: list[tuple[str, Any, float]] = []  # (status, value, took) of the items read
        self.since: float | None = None  # when the item being read started; None: not started
        self.dropped = False  # written off (or never started in time): its results are not wanted
        self.ended = False  # its worker is done with it, or no worker will run it

    def __call__(self) -> None:
        with self.cond:
            if self.dropped:
                return
            since = self.since = time.monotonic()
            self.cond.notify_all()
        for item in self.items:
            try:
                status, value = OK, self.fn(item)
            except Exception as e:  # noqa: BLE001 - reported as the item's outcome
                status, value = ERROR, e
            now = time.monotonic()
            with self.cond:
                if self.dropped:
                    return  # written off while this read was blocked: its result is stale
                self.done.append((status, value, now - since))
                since = self.since = now
                # No notify: the caller wakes at the start, at the end, or when the item in
                # progress may have overrun. A wake-up per item cost the EFA collector's 32
                # devices +1.1 ms of server CPU a scrape (the GIL handed back and forth:
                # bench/bench_efa.py --baseline-checkout, 2026-11-28).

    def end(self) -> None:
        with self.cond:
            self.ended = True
            self.cond.notify_all()


def _same(item: Hashable) -> Hashable:
    return item


def _overran(limit: float) -> str:
    """TIMEOUT's and then BLOCKED's reason, in the same words: a problem log says it once."""
    return f"did not finish within its {limit:g}s deadline; not read again until that read returns"


class Deadlines:
    """Reads under deadlines on `pool`, with the keys whose read is still blocked; see the module
    doc. One call at a time (each caller has its own: a collector, the runner)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._stuck: dict[Hashable, _Run] = {}  # key -> the run left blocked reading it
        self.abandoned = 0  # reads written off, ever

    def stuck(self) -> list[Hashable]:
        """Keys whose written-off read has not returned yet."""
        return [k for k, run in list(self._stuck.items()) if not run.ended]  # may run beside a read

    def call(self, key: Hashable, fn: Callable[[], Any], timeout: float) -> Outcome:
        """`fn()` under `timeout` seconds; `key` names what it reads (not read while blocked)."""
        return self.each([key], lambda _key: fn(), timeout=timeout)[0]

    def each(self, items: Sequence[Any], fn: Callable[[Any], Any], *,
             key: Callable[[Any], Hashable] = _same, timeout: float | Callable[[Any], float],
             budget: float | None = None) -> list[Outcome]:
        """`fn(item)` of each item, in order, each within `timeout` seconds from its start (a
        number, or a function of the item); with a `budget`, the whole read ends within it: the
        item running then is written off (TIMEOUT), those not started are SKIPPED."""
        limit = timeout if callable(timeout) else (lambda _item, t=float(timeout): t)
        end = time.monotonic() + budget if budget is not None else float("inf")
        self._stuck = {k: run for k, run in self._stuck.items() if not run.ended}
        out: list[Outcome | None] = [None] * len(items)
        todo = []
        for i, item in enumerate(items):
            if key(item) in self._stuck:
                out[i] = Outcome(BLOCKED, None, limit(item), _overran(limit(item)))
            else:
                todo.append(i)
        skipped = "not read: the items before it used up the time budget (or no thread was free to read it)"
        cond = threading.Condition(threading.Lock())
        while todo and not self.pool.closed:
            run = _Run(fn, [items[i] for i in todo], cond)
            job = self.pool.submit(run, run.end)
            stuck = None
            with cond:
                n = 0  # the items of this run taken
                while True:
                    for status, value, took in run.done[n:]:
                        reason = f"{type(value).__name__}: {value}" if status == ERROR else ""
                        out[todo[n]] = Outcome(status, value, took, reason)
                        n += 1
                    if n == len(todo) or run.ended:
                        break
                    now = time.monotonic()
                    if run.since is None:  # queued behind a busy pool: wait for a worker
                        if now >= end:
                            run.dropped = True
                            break
                        cond.wait(None if end == float("inf") else end - now)
                        continue
                    own = limit(items[todo[n]])
                    due = min(run.since + own, end)
                    if now < due:
                        cond.wait(due - now)
                        continue
                    run.dropped = True
                    stuck = items[todo[n]]
                    why = _overran(own) if now >= run.since + own else \
                        f"did not finish before the whole read's {budget:g}s budget ran out"
                    out[todo[n]] = Outcome(TIMEOUT, None, now - run.since, why)
                    n += 1
                    break
            if stuck is not None:
                self._stuck[key(stuck)] = run
                self.abandoned += 1
                self.pool.write_off(job)
            todo = todo[n:]
            if stuck is None or time.monotonic() >= end:
                break  # all read, or no worker ran the rest (closed pool, budget used up queued)
        if self.pool.closed:
            skipped = "not read: the exporter is shutting down (its thread pool is closed)"
        return [o if o is not None else Outcome(SKIPPED, reason=skipped) for o in out]
