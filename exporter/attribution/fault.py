"""FaultAttribution: the workloads a counted event hit, into the ledger.

- A live event (it happened while this daemon ran, and was counted at most LIVE_S after it, on
  the monotonic clock) is attributed from a reading of the workload source that started at or
  after the event: the last reading heard when it did and observed the GPU(s), else a fresh one
  it asks for (never one that was in flight when the event happened). That reading sees the GPU
  as the event left it: a job started since the last scrape is on it, one that died of the event
  is not gone yet (its epilog runs seconds later). Without such a reading the answer is unknown:
  it could not tell.
- Any other event (the kernel-log backlog, however recent; an event counted late) is attributed
  from the history (exporter.attribution.history: a set seen on both sides of it, else unknown).
  A record logged a second before the daemon started is backlog too: the daemon was not there to
  read the GPU when it happened, and a job may have taken the GPU since (its first reading would
  name that job).
- An SXid is attributed, on every GPU the node lists, to that GPU's workloads at its time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from exporter.attribution.history import WorkloadHistory
from exporter.attribution.ledger import SXID, XID, Attribution, AttributionLedger
from exporter.workload.model import Workload, WorkloadReading

if TYPE_CHECKING:
    from exporter.nvml.session import NvmlSession
    from exporter.workload.source import WorkloadSource

log = logging.getLogger("exporter.workload")

# An event counted at most this long after it happened is live. On /dev/kmsg a record is counted
# within milliseconds (a followed file: 0.2 s; NVML's XID 154 waits 3 s for its kernel line);
# older ones are the start-up backlog, whose GPUs are not as those events left them.
LIVE_S = 5.0

Answer = tuple[Workload, ...] | None


class FaultAttribution:
    """Attributes counted events: the GPU's identity (`identities`: PCI key -> index, UUID, as the
    XID service knows them), a reading after the event or the history (`history`), the answer to
    the ledger.

    `fresh(not_before)` (given by the composition root when a workload source is configured) takes
    a reading that starts at or after monotonic time `not_before` and returns it (None when it
    could not); it also reaches the history through the source's listeners. `kernel_offset` is the
    kernel clock's offset from time.monotonic() (exporter.xid.clock.KernelClock.offset_s).
    `started`: the monotonic time the daemon started (default: when this is built, at start-up);
    an event before it is never live."""

    def __init__(self, history: WorkloadHistory, identities: Any,
                 ledger: AttributionLedger | None = None,
                 kernel_offset: Callable[[], float] = lambda: 0.0,
                 fresh: Callable[[float], WorkloadReading | None] | None = None,
                 mono: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 started: float | None = None) -> None:
        self.history = history
        self.identities = identities
        self.ledger = ledger or AttributionLedger()
        self.fresh = fresh
        self.kernel_offset = kernel_offset
        self._mono = mono
        self._wall = wall
        self.started = mono() if started is None else started

    def event_mono(self, wall: float, kernel_s: float | None) -> float:
        """The monotonic time of an event: its kernel-log time less the kernel clock's offset;
        without one (an event from elsewhere), from its wall time against the wall clock now."""
        if kernel_s is not None:
            return kernel_s - self.kernel_offset()
        return self._mono() - (self._wall() - wall)

    def xid(self, pci: str, xid: int, wall: float, kernel_s: float | None = None) -> Attribution:
        """Record an XID counted on the GPU at `pci`, at unix time `wall` and kernel-log time
        `kernel_s`; returns the record."""
        mono = self.event_mono(wall, kernel_s)
        uuid = self.identities.labels(pci, ask_nvml=False)[1]
        answers = self._answers([uuid] if uuid else [], mono)
        rec = Attribution(pci, XID, xid, "", wall, answers.get(uuid) if uuid else None, mono)
        self.ledger.add(rec)
        return rec

    def sxid(self, switch: str, sxid: int, wall: float, kernel_s: float | None = None) -> list[Attribution]:
        """Record an SXid reported by the NVSwitch at PCI key `switch` against every GPU the node
        lists (an NVSwitch fault fails NVLink for all of them); returns the records."""
        mono = self.event_mono(wall, kernel_s)
        gpus = [(pci, ident["uuid"]) for pci, ident in sorted(self.identities.to_state().items())
                if ident.get("index") is not None and ident.get("uuid")]  # not a line's stray address
        answers = self._answers([uuid for _, uuid in gpus], mono)
        out = []
        for pci, uuid in gpus:
            rec = Attribution(pci, SXID, sxid, switch, wall, answers.get(uuid), mono)
            self.ledger.add(rec)
            out.append(rec)
        return out

    def _answers(self, uuids: list[str], mono: float) -> dict[str, Answer]:
        if not uuids:
            return {}
        if mono < self.started or self._mono() - mono > LIVE_S:  # backlog: the GPU now is not as it left it
            return {u: self.history.at(u, mono) for u in uuids}
        reading = self._reading_after(uuids, mono)
        if reading is None:
            return {u: None for u in uuids}  # could not tell
        return {u: self.history.admit(reading.by_uuid[u]) if u in reading.by_uuid else None for u in uuids}

    def _reading_after(self, uuids: list[str], mono: float) -> WorkloadReading | None:
        """A reading that started at or after `mono` and observed the GPUs: the last heard (one
        event of a burst asked for it) or a fresh one."""
        latest = self.history.latest
        if latest is not None and latest.mono is not None and latest.mono >= mono \
                and all(u in latest.by_uuid for u in uuids):
            return latest
        if self.fresh is None:
            return None
        try:
            reading = self.fresh(mono)
        except Exception as e:  # noqa: BLE001 - the source's trouble never stops the counting
            log.debug("fresh workload reading failed: %s", e)
            return None
        if reading is None or reading.mono is None or reading.mono < mono:
            return None
        return reading


def fresh_reading(source: WorkloadSource, nvml: NvmlSession) -> Callable[[float], WorkloadReading | None]:
    """A reading of the workload source `source` that starts at or after a monotonic time, of
    the GPUs the NVML session lists (None while NVML is not initialised: the source needs the
    list, and this never initialises it)."""
    def read(not_before: float) -> WorkloadReading | None:
        if nvml.ok:
            return source.observe(list(nvml.devices), not_before=not_before).reading
        return None
    return read
