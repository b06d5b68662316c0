"""The counters: each turns what the follower reads into events in its store and logs each
counted event once. It does no I/O of its own.

- XidCounter: kernel-log records and NVML events -> XID events (one count per event,
  exporter.xid.store says how reports merge); it asks the identities whether an address is a
  GPU (the store's guards spare those) and which GPU it is (for the log line).
- SxidCounter: the same path for NVSwitch SXids with their own parser (exporter.xid.sxid),
  policy (exporter.xid.sxid_catalog) and store catalog (exporter.xid.sxid_state.SXID_EVENTS):
  one count per report line, continuations never.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from exporter.attribution.text import describe, describe_sxid
from exporter.nvml.backend import EVENT_XID, Event
from exporter.xid.catalog import lookup
from exporter.xid.clock import KernelClock
from exporter.xid.identities import GpuIdentities
from exporter.xid.kmsg import Record
from exporter.xid.nvlink import DECODED_XIDS
from exporter.xid.nvml_events import EVENT_NAMES
from exporter.xid.parser import GpuAt, KernelLogParser, XidReport, pci_key, pci_label
from exporter.xid.policy import Policy
from exporter.xid.store import OTHER, EventStore
from exporter.xid.sxid import SxidReport, parse_sxid
from exporter.xid.sxid_catalog import SxidPolicy

log = logging.getLogger("exporter.xid")
log_sxid = logging.getLogger("exporter.sxid")

RECOVERY_XID = 154
# Hold NVML's XID 154 (no action code) and NVLink XIDs (no fields to decode) so the kernel line,
# which has them, counts the event first and NVML's report joins it.
NVML_154_GRACE_S = 3.0
# The backlog is read before NVML is initialised (never from the follower thread: it may hang):
# a line for an address no GPU is known at yet waits this long for NVML to name the GPU.
LOG_HOLD_S = 10.0
MAX_HELD_LOGS = 256


# _log_event's arguments before `hold`: (source, pci, xid, action, text, other, hit)
_LogArgs = tuple[str, str, int, int | None, str, bool, str]


class XidCounter:
    def __init__(self, store: EventStore, identities: GpuIdentities, policy: Policy, clock: KernelClock,
                 kmsg_enabled: bool = True, attribution: Any = None) -> None:
        self.store = store
        self.identities = identities
        self.policy = policy
        self.clock = clock
        self.kmsg_enabled = kmsg_enabled  # NVML's XID 154 waits for the kernel line only if one comes
        self.parser = KernelLogParser()
        self.log_events = False  # the daemon logs each counted event; one-shot commands print them
        self.attribution = attribution  # FaultAttribution: records the workloads each event hit
        self.nvml_events: dict[tuple[str, str], int] = {}  # (pci key, event type name) -> count
        self._pending_154: list[tuple[float, str, int, float, float]] = []  # (due, pci, xid, kernel_s, wall)
        self._held_logs: list[tuple[float, _LogArgs]] = []  # (due, _log_event args): GPU not known yet
        self._lock = threading.Lock()

    # -- kernel log --------------------------------------------------------------------------------
    def log_from_now(self) -> None:
        """Log each counted event from now on (the daemon, once it runs: its log is the trail)."""
        self.log_events = True

    def handle_record(self, rec: Record, new: bool = True) -> None:
        """One kernel-log record; `new`: not counted by an earlier run (its identities still count)."""
        if rec.kernel:  # prio >= 8: written from user space, not the driver
            parsed = self.parser.feed(rec.message)
            if isinstance(parsed, GpuAt):
                self.identities.identify(parsed.pci, uuid=parsed.uuid)
            elif isinstance(parsed, XidReport) and new:
                self._count("kmsg", parsed.pci, parsed.xid, rec.usec / 1e6, rec.wall, parsed.action,
                            self.clock.wall, parsed.text)  # rec.wall: a text line's own time

    # -- NVML events ---------------------------------------------------------------------------------
    def on_nvml_event(self, ev: Event) -> None:
        s = self.identities.session()
        pci = None
        if s is not None and 0 <= ev.index < len(s.devices):
            pci = pci_key(s.devices[ev.index].pci_bus_id)
        if pci is None and s is not None and ev.uuid:
            dev = s.by_uuid(ev.uuid)
            pci = pci_key(dev.pci_bus_id) if dev else None
        if pci is None:
            log.warning("NVML event for GPU %d (%s) with no known PCI address: %s", ev.index, ev.uuid, ev)
            return
        if s is not None:
            self.identities.identify(pci, ev.index, ev.uuid)
        for bit, name in EVENT_NAMES.items():
            if ev.event_type & bit:
                with self._lock:
                    self.nvml_events[(pci, name)] = self.nvml_events.get((pci, name), 0) + 1
        if ev.event_type & EVENT_XID:
            kernel_s, wall = self.clock.now(), time.time()
            if (ev.data == RECOVERY_XID or ev.data in DECODED_XIDS) and self.kmsg_enabled:
                with self._lock:
                    self._pending_154.append((time.monotonic() + NVML_154_GRACE_S, pci, int(ev.data),
                                              kernel_s, wall))
            else:
                self._count("nvml", pci, int(ev.data), kernel_s, wall)

    def tick(self) -> None:
        """Submit held NVML XID 154 and NVLink XID events that are due; prune old open events."""
        now = time.monotonic()
        with self._lock:
            due = [p for p in self._pending_154 if p[0] <= now]
            self._pending_154 = [p for p in self._pending_154 if p[0] > now]
        for _, pci, xid, kernel_s, wall in due:
            self._count("nvml", pci, xid, kernel_s, wall)
        self.store.prune(self.clock.now())
        self.flush_logs(now)

    def flush_logs(self, now: float | None = None) -> None:
        """Log the held lines whose GPU NVML now names, or that waited long enough (all: `now`
        None, at shutdown)."""
        with self._lock:
            held, self._held_logs = self._held_logs, []
        ready = self._nvml_ready()
        for due, args in held:
            if now is None or ready or due <= now:
                self._log_event(*args, hold=False)
            else:
                with self._lock:
                    self._held_logs.append((due, args))

    def nvml_event_counts(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.nvml_events)

    # -- counting ------------------------------------------------------------------------------------
    def _count(self, source: str, pci: str, xid: int, kernel_s: float, wall: float | None,
               action: int | None = None, wall_of: Any = None, text: str = "") -> None:
        counted = self.store.report(source, pci, xid, kernel_s, wall, action, wall_of,
                                    listed=self.identities.is_listed(pci))
        if not counted:
            return
        other = self.store.counted_under(pci) == OTHER  # beyond the guards
        hit = ""
        if self.attribution is not None and not other:
            at = wall if wall is not None else (wall_of(kernel_s) if wall_of is not None else time.time())
            hit = describe(self.attribution.xid(pci, xid, at, kernel_s).workloads)
        if self.log_events:
            self._log_event(source, pci, xid, action, text, other, hit)

    def _nvml_ready(self) -> bool:
        s = self.identities.nvml
        return s is None or bool(getattr(s, "ok", True))

    def _log_event(self, source: str, pci: str, xid: int, action: int | None, text: str, other: bool,
                   hit: str = "", hold: bool = True) -> None:
        gpu, _, bus_id = self.identities.labels(pci, ask_nvml=False)
        if not gpu and hold and not self._nvml_ready():
            with self._lock:
                if len(self._held_logs) < MAX_HELD_LOGS:
                    self._held_logs.append((time.monotonic() + LOG_HOLD_S,
                                            (source, pci, xid, action, text, other, hit)))
                    return
        info = lookup(xid)
        # an NVLink XID NVIDIA's table could not decode keeps its conservative tier: say so
        undecoded = " (undecoded: the code's conservative tier)" if self.policy.undecoded(xid, action) else ""
        log.warning("XID %d counted on GPU %s (PCI %s): tier %s%s, from %s%s%s%s", xid, gpu or "-",
                    f"{pci_label(pci)}, counted under \"{OTHER}\"" if other else bus_id,
                    self.policy.tier(xid, action), undecoded, source, f"; {hit}" if hit else "",
                    f"; {info.meaning}" if info else "", f"; {text[:160]}" if text else "")


class SxidCounter:
    """Kernel-log records -> SXid reports in an EventStore of SXID_EVENTS, each counted report
    logged once."""

    def __init__(self, store: EventStore, policy: SxidPolicy, clock: KernelClock,
                 attribution: Any = None) -> None:
        self.store = store
        self.policy = policy
        self.clock = clock
        self.log_events = False  # the daemon logs each counted report; one-shot commands print them
        self.attribution = attribution  # FaultAttribution: records the workloads each report hit

    def log_from_now(self) -> None:
        """Log each counted report from now on (the daemon, once it runs: its log is the trail)."""
        self.log_events = True

    def handle_record(self, rec: Record, new: bool = True) -> None:
        """One kernel-log record; `new`: not counted by an earlier run."""
        if rec.kernel and new and "SXid" in rec.message:
            parsed = parse_sxid(rec.message)
            wall = rec.wall if rec.wall is not None else self.clock.wall(rec.usec / 1e6)
            if not isinstance(parsed, SxidReport):  # a continuation line, or not an SXid report
                return
            counted = self.store.report("kmsg", parsed.pci, parsed.sxid, rec.usec / 1e6, wall,
                                        parsed.severity, index=parsed.switch)
            hit = ""
            if counted and self.attribution is not None:
                hit = describe_sxid(self.attribution.sxid(parsed.pci, parsed.sxid, wall, rec.usec / 1e6))
            if counted and self.log_events:
                log_sxid.warning("SXid %05d counted on NVSwitch %d (PCI %s): severity %s, tier %s%s; %s; %s",
                            parsed.sxid, parsed.switch, pci_label(parsed.pci), parsed.severity,
                            self.policy.tier(parsed.sxid, parsed.severity),
                            f", link {parsed.link}" if parsed.link is not None else "", hit or "-",
                            parsed.text[:160])
