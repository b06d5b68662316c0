"""A few daemon threads that read devices in parallel.

Why: a sysfs read of EFA port counters sends admin commands to the device, and an admin command
that never completes blocks the read until the driver's timeout (seconds). Read serially, one
such device would hold up every other device and miss the collector's deadline; in parallel with
a per-device deadline only that device is reported down. Daemon threads, because a read stuck in
the kernel must never stop the exporter from exiting.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class Workers:
    def __init__(self, n: int, name: str = "efa-read") -> None:
        self.n = n
        self.name = name
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> Future:
        self._ensure_started()
        fut: Future = Future()
        self._q.put((fut, fn, arg))
        return fut

    def close(self) -> None:
        for _ in self._threads:
            self._q.put(None)

    def _ensure_started(self) -> None:
        if len(self._threads) >= self.n:
            return
        with self._lock:
            while len(self._threads) < self.n:
                t = threading.Thread(target=self._loop, name=f"{self.name}-{len(self._threads)}", daemon=True)
                t.start()
                self._threads.append(t)

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fut, fn, arg = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(arg))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting collector
                fut.set_exception(e)
