"""The NVML event watcher: a background thread waiting on an NVML event set.

Registers XID critical errors on every GPU, plus double-bit ECC, GPU unavailable and recovery
action events where nvmlDeviceGetSupportedEventTypes offers them; never clock-change events
(they fire every ~100 ms). Waits with a timeout so it can stop and keep its health fresh. When
the wait fails with GPU_IS_LOST (one lost GPU stalls the whole set), it finds the lost GPU(s),
marks them in the NVML session and rebuilds the set without them. Any other failure is counted,
logged and retried after a pause: the thread never dies silently.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter.nvml.backend import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_GPU_UNAVAILABLE,
    EVENT_RECOVERY_ACTION,
    EVENT_XID,
    Event,
    NvmlError,
)

if TYPE_CHECKING:
    from exporter.nvml.backend import NvmlBackend
    from exporter.nvml.session import NvmlSession

log = logging.getLogger("exporter.xid.nvml")

OPTIONAL_EVENTS = EVENT_DOUBLE_BIT_ECC | EVENT_GPU_UNAVAILABLE | EVENT_RECOVERY_ACTION
EVENT_NAMES = {EVENT_XID: "xid", EVENT_DOUBLE_BIT_ECC: "double_bit_ecc",
               EVENT_GPU_UNAVAILABLE: "gpu_unavailable", EVENT_RECOVERY_ACTION: "recovery_action"}


@dataclass
class WatcherStatus:
    state: str = "starting"  # starting | watching | no_gpus | nvml_unavailable | error | stopped
    registered: int = 0  # GPUs in the event set
    excluded: int = 0  # GPUs left out (lost)
    rebuilds: int = 0
    errors: int = 0
    events: int = 0
    last_error: str = ""


class NvmlEventWatcher:
    """Runs in its own thread; `on_event(event)` is called for every event received, `on_lost()`
    when a GPU is found lost (the event set's wait failed with GPU_IS_LOST, or a GPU-unavailable
    event)."""

    def __init__(self, session_factory: Callable[[], NvmlSession | None], on_event: Callable[[Event], None],
                 wait_ms: int = 1000, retry_s: float = 5.0,
                 on_lost: Callable[[], None] | None = None) -> None:
        self.session_factory = session_factory
        self.on_event = on_event
        self.on_lost = on_lost
        self.wait_ms = wait_ms
        self.retry_s = retry_s
        self.status = WatcherStatus()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._set: object | None = None  # the backend's event set handle
        self._backend: NvmlBackend | None = None
        self._registered: set[int] = set()  # GPUs in the current event set

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 3.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch()
            except Exception as e:  # noqa: BLE001 - counted, logged, retried: never die silently
                self.status.state = "error"
                self.status.errors += 1
                self.status.last_error = f"{type(e).__name__}: {e}"
                log.warning("NVML event watcher failed, retrying in %gs: %s", self.retry_s, e)
                self._free()
                self._stop.wait(self.retry_s)
        self._free()
        self.status.state = "stopped"

    def _lost(self) -> None:
        if self.on_lost is not None:
            try:
                self.on_lost()
            except Exception:  # noqa: BLE001 - a listener must not stop the watcher
                log.exception("on_lost listener")

    def _free(self) -> None:
        if self._set is not None and self._backend is not None:
            try:
                self._backend.event_set_free(self._set)
            except Exception:  # noqa: BLE001 - the set may be gone with the driver
                pass
        self._set = None

    def _build(self, session: NvmlSession) -> bool:
        """Create an event set with every GPU that is not lost; False when none could be added."""
        self._free()
        self._backend = session.backend
        self._set = session.backend.event_set_create()
        devices = list(session.devices)
        self._registered = {d.index for d in devices
                            if d.index not in session.lost and self._register(session, d.index)}
        self.status.registered = len(self._registered)
        self.status.excluded = len(devices) - len(self._registered)
        return bool(self._registered)

    def _register(self, session: NvmlSession, i: int) -> bool:
        """Add GPU i to the set: XIDs plus the optional types it supports, else XIDs alone (a type
        NVML refused). False when it cannot be added; a lost GPU is marked lost."""
        backend = session.backend
        try:
            supported = int(backend.call(i, "nvmlDeviceGetSupportedEventTypes") or 0)
        except NvmlError as e:
            if e.gpu_lost:
                session.mark_lost(i)
                return False
            supported = EVENT_XID
        err = None
        for mask in dict.fromkeys((EVENT_XID | (supported & OPTIONAL_EVENTS), EVENT_XID)):
            try:
                backend.register_events(i, mask, self._set)
                return True
            except NvmlError as e:
                if e.gpu_lost:
                    session.mark_lost(i)
                    return False
                err = e
        log.warning("GPU %d: cannot register NVML XID events: %s", i, err)
        return False

    def _find_lost(self, session: NvmlSession) -> list[int]:
        lost = [i for i in self._registered if i in session.lost]
        for dev in list(session.devices):
            if dev.index in session.lost:
                continue
            try:
                session.backend.call(dev.index, "nvmlDeviceGetUUID")
            except NvmlError as e:
                if e.gpu_lost:
                    session.mark_lost(dev.index)
                    lost.append(dev.index)
        return lost

    def _watch(self) -> None:
        session = self.session_factory()
        if session is None or not session.ensure():
            self.status.state = "nvml_unavailable"
            self.status.last_error = getattr(session, "error", "") or "NVML unavailable"
            self._stop.wait(self.retry_s)
            return
        if not self._build(session):
            self.status.state = "no_gpus"
            self._stop.wait(self.retry_s)
            return
        self.status.state = "watching"
        while not self._stop.is_set():
            try:
                ev = session.backend.event_wait(self._set, self.wait_ms)
            except NvmlError as e:
                if e.code == 10:  # NVML_ERROR_TIMEOUT: nothing happened
                    continue
                if e.gpu_lost:
                    lost = self._find_lost(session)
                    log.warning("NVML event wait: GPU is lost (%s); rebuilding the event set without it",
                                ", ".join(map(str, lost)) or "which one unknown")
                    self.status.rebuilds += 1
                    self._lost()
                    if not lost:  # cannot tell which: pause so we do not spin
                        self._stop.wait(1.0)
                    if not self._build(session):
                        self.status.state = "no_gpus"
                        self._stop.wait(self.retry_s)
                        return
                    continue
                raise
            self.status.events += 1
            if ev.event_type & EVENT_GPU_UNAVAILABLE:
                session.mark_lost(ev.index)
                self._lost()
            try:
                self.on_event(ev)
            except Exception:  # noqa: BLE001 - a bad event must not stop the watcher
                log.exception("handling NVML event %s", ev)
