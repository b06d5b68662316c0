"""The attributed events, the last few per GPU, and what an acknowledgement clears."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from exporter.attribution.history import MAX_GPUS
from exporter.workload.model import Workload


class AckLike(Protocol):
    """What clears a record: an acknowledgement (exporter.xid.store.Ack) of a GPU's XIDs (all
    of them when `xid` is None), taken at wall time `time` and monotonic time `mono` (None:
    written before acks had it)."""

    @property
    def pci(self) -> str: ...
    @property
    def xid(self) -> int | None: ...
    @property
    def time(self) -> float: ...
    @property
    def mono(self) -> float | None: ...

MAX_PER_GPU = 8  # attributed events kept per GPU (distinct event and workload set; oldest go first)
MERGE_S = 10.0  # an "unknown" within this of a recorded attribution of the same event is that event

XID, SXID = "xid", "sxid"


@dataclass(frozen=True)
class Attribution:
    """An attributed event on one GPU: the last `kind` event `code` (an XID, or an SXid reported
    by the NVSwitch at `switch`) with these workloads, at unix time `time` (for display) and
    monotonic time `mono` of this boot (for ordering against acks; None in a record written
    before it was kept: the wall time then)."""

    pci: str  # the GPU's PCI key (exporter.xid.parser.pci_key)
    kind: str  # XID or SXID
    code: int
    switch: str  # the NVSwitch's PCI key for an SXid, "" for an XID
    time: float
    workloads: tuple[Workload, ...] | None  # None: unknown; (): the GPU was idle
    mono: float | None = None

    @property
    def event(self) -> tuple[str, str, int, str]:
        return (self.pci, self.kind, self.code, self.switch)

    def cleared_by(self, acks: Iterable[AckLike]) -> bool:
        """An ack of this GPU taken after the event (of every XID, or of this XID) clears it:
        compared on the monotonic clock when both have it, whatever the wall clock did."""
        return any(a.pci == self.pci and _after(a, self)
                   and (a.xid is None or (self.kind == XID and a.xid == self.code)) for a in acks)


def _after(ack: AckLike, rec: Attribution) -> bool:
    if ack.mono is not None and rec.mono is not None:
        return ack.mono >= rec.mono
    return ack.time >= rec.time


def _apart(a: Attribution, b: Attribution) -> float:
    if a.mono is not None and b.mono is not None:
        return abs(a.mono - b.mono)
    return abs(a.time - b.time)


class AttributionLedger:
    """The attributed events, at most MAX_PER_GPU per GPU (a repeat of an event with the same
    workloads updates its time; beyond the bound the oldest earlier one that names no workload goes
    first, else the oldest: an unknown or idle event does not push a job's out). Thread-safe."""

    def __init__(self, per_gpu: int = MAX_PER_GPU) -> None:
        self.per_gpu = per_gpu
        self.lock = threading.Lock()
        self._by_gpu: dict[str, list[Attribution]] = {}
        self.version = 0  # bumps on every change worth writing

    def add(self, rec: Attribution) -> None:
        with self.lock:
            recs = self._by_gpu.get(rec.pci)
            if recs is None:
                if len(self._by_gpu) >= MAX_GPUS:
                    return
                recs = self._by_gpu[rec.pci] = []
            if rec.workloads is None and any(r.event == rec.event and r.workloads is not None
                                             and _apart(r, rec) <= MERGE_S for r in recs):
                return  # counted again by a one-shot command, attributed by the daemon already
            same = next((r for r in recs if r.event == rec.event and r.workloads == rec.workloads), None)
            if same is not None:
                if _order(same) >= _order(rec):
                    return
                recs.remove(same)
            recs.append(rec)
            recs.sort(key=_order)
            while len(recs) > self.per_gpu:  # the oldest that names no workload goes first
                recs.remove(next((r for r in recs if not r.workloads and r is not rec), recs[0]))
            self.version += 1

    def visible(self, acks: Iterable[AckLike] = ()) -> list[Attribution]:
        """Every record no ack has cleared, oldest first."""
        acks = list(acks)
        with self.lock:
            recs = [r for rs in self._by_gpu.values() for r in rs]
        return sorted((r for r in recs if not r.cleared_by(acks)), key=lambda r: (_order(r), r.pci))

    def prune(self, acks: Iterable[AckLike]) -> None:
        """Forget the records acks have cleared (before writing them out)."""
        acks = list(acks)
        with self.lock:
            for pci, recs in list(self._by_gpu.items()):
                kept = [r for r in recs if not r.cleared_by(acks)]
                if len(kept) != len(recs):
                    self.version += 1
                    if kept:
                        self._by_gpu[pci] = kept
                    else:
                        del self._by_gpu[pci]

    def records(self) -> list[Attribution]:
        with self.lock:
            return [r for rs in self._by_gpu.values() for r in rs]


def _order(r: Attribution) -> tuple[float, float]:
    # records of this boot in the order they happened; those without a monotonic time (written
    # before it was kept) first, by wall time
    return (0.0, r.time) if r.mono is None else (1.0, r.mono)


def acks_key(acks: list[AckLike]) -> tuple[int, float, float]:
    """What of the acks decides which records they clear: acks are only added (the oldest go
    past MAX_ACKS), so their number and newest times change whenever one is."""
    return (len(acks), max((a.time for a in acks), default=0.0),
            max((a.mono or 0.0 for a in acks), default=0.0))
