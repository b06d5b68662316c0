"""Devices read one after another on a worker thread, each under its own deadline.

Why a thread at all: a sysfs read of EFA port counters sends admin commands to the device, and an
admin command that never completes blocks the read until the driver's timeout (seconds). Read in
the collector's own thread, one such device would hold up every other device and miss the
collector's deadline. So a `Chain` of devices is read on a worker while the collector watches the
device in progress: past its deadline the chain is cancelled (its thread stays blocked in the
kernel and stops once the read returns) and the devices after it go to a fresh chain.

Why one thread rather than one per device: the reads are short system calls, each of which
releases the GIL; several threads reading at once hand the GIL back and forth on every call,
which on a 2-CPU node cost more than the reads themselves (see docs/performance.md). Threads are
daemons, because a read stuck in the kernel must never stop the exporter from exiting.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any


class Chain:
    """Reads `items` in order with `fn` on a worker; `results[i]` is items[i]'s result."""

    def __init__(self, items: Sequence[Any], fn: Callable[[Any], Any], wake: threading.Event) -> None:
        self.items = items
        self.fn = fn
        self.results: dict[int, Any] = {}
        self.current: int | None = None  # index being read (None before the first and when done)
        self.since = 0.0  # monotonic time the current read started
        self.cancelled = False
        self.done = threading.Event()  # set when the worker has left the chain (finished or cancelled)
        self._wake = wake
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            with self._lock:
                if self.cancelled or not self.items:
                    return
                self.current, self.since = 0, time.monotonic()
            for i, item in enumerate(self.items):
                r = self.fn(item)
                with self._lock:
                    if self.cancelled:
                        return  # written off while this read was blocked: its result is stale
                    self.results[i] = r
                    if i + 1 < len(self.items):
                        self.current, self.since = i + 1, time.monotonic()
                    else:
                        self.current = None
        finally:
            self.done.set()
            self._wake.set()

    def cancel_if_stuck(self, timeout: float, now: float, hard_stop: bool) -> int | None:
        """Cancel the chain when its current read has run `timeout` (or at once with `hard_stop`);
        returns the index it is stuck on, whose read is abandoned. Items after it are not read."""
        with self._lock:
            if self.done.is_set():
                return None
            if self.current is None:
                if hard_stop:  # no thread ever took it (a closed pool): give up, nothing was read
                    self.cancelled = True
                    self.done.set()
                return None
            if not hard_stop and now - self.since < timeout:
                return None
            self.cancelled = True
            return self.current

    def next_deadline(self, timeout: float) -> float:
        return self.since + timeout


class Pool:
    """Daemon threads running chains; a thread whose chain is blocked in the kernel stays with it,
    and a new thread is started when no idle one is left."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self.threads = 0
        self.closed = False

    def submit(self, chain: Chain) -> None:
        with self._lock:
            if self.closed:  # shutting down: no thread will run it
                chain.cancel_if_stuck(0.0, 0.0, hard_stop=True)
                return
            if self._idle > 0:
                self._idle -= 1
            else:
                self.threads += 1
                threading.Thread(target=self._loop, name=f"{self.name}-{self.threads}", daemon=True).start()
        self._q.put(chain)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._idle = 0
            n = self.threads
        for _ in range(n):
            self._q.put(None)

    def _loop(self) -> None:
        while True:
            chain = self._q.get()
            if chain is None:
                return
            chain.run()
            with self._lock:
                self._idle += 1
