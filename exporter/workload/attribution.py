"""Fault attribution: which workloads held a GPU when an XID or SXid was counted on it, kept after
the workload is gone (the job usually dies of the XID and its epilog removes its mapping seconds
later, before any alert is evaluated).

Parts, one job each:
- WorkloadHistory: what the workload source observed on each GPU lately. Whatever produces
  WorkloadReadings (the workload collector) calls `observe(reading)`; the composition root
  (exporter.cli) builds one history and hands it to that producer and to the XID service.
- AttributionLedger: the attributed events, the last few per GPU, with what an ack clears.
- FaultAttribution: asks the history about the GPU(s) of a counted event and records the answer.

Semantics (docs/xid.md, "Who the fault hit"):
- An observation of a GPU stands from the reading that made it until the next reading that
  observed that GPU, at most STAND_S (a source that stops answering does not keep a job on a GPU
  for ever). An event is attributed to the workloads of the observation standing at its time;
  a live event (counted at most LIVE_S after it happened) also to those of the readings taken
  between it and its counting, one of which it asks the source for: the GPU as the event left it
  (a job started since the last reading is on it; one that died of the event is not gone yet).
  An empty set is "no workload" (the GPU was observed idle).
- An event before the first observation of its GPU that is still remembered (the kernel-log
  backfill at start-up, an XID older than the job) is "unknown": never the current workload.
- An SXid is attributed, on every GPU the node lists, to that GPU's workloads at its time.
- An acknowledgement of a GPU (`ack`) clears its attributions up to the ack's time (`ack --xid X`
  only those of XID X); later events stay.
"""

from __future__ import annotations

import bisect
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from exporter.metric import Sample
from exporter.workload.model import Workload, WorkloadReading

log = logging.getLogger("exporter.workload")

KEEP_S = 3600.0  # observations older than this (once a newer one stands) are forgotten
STAND_S = 900.0  # an observation stands at most this long when no newer reading observed the GPU
MAX_SEGMENTS = 256  # per GPU: changes of its workload set remembered (a job every 15 s for an hour)
MAX_GPUS = 64  # GPU UUIDs remembered (an 8-GPU node uses 8; MIG-heavy nodes more)
MAX_WORKLOADS = 16  # workloads remembered on one GPU at one time (more are dropped, counted)
MAX_PER_GPU = 8  # attributed events kept per GPU (distinct event and workload set; oldest go first)
MERGE_S = 10.0  # an "unknown" within this of a recorded attribution of the same event is that event
# An event counted at most this long after it happened is live: it asks the source for a reading
# (FaultAttribution), and the readings taken between it and its counting saw the GPU as the event
# left it. On /dev/kmsg a record is counted within milliseconds (a followed file: 0.2 s); older
# ones are the start-up backlog, whose GPUs are not as those events left them.
LIVE_S = 5.0
MAX_LABEL_CHARS = 253  # a Kubernetes name's limit; Slurm job ids are far shorter
_BAD_CHARS = re.compile(r"[\x00-\x1f\x7f]")

XID, SXID = "xid", "sxid"


def valid_label(v: Any) -> bool:
    """A label value fit for a series, a log line and the state file: a string of at most
    MAX_LABEL_CHARS characters, no control characters, encodable as UTF-8."""
    if not isinstance(v, str) or len(v) > MAX_LABEL_CHARS or _BAD_CHARS.search(v):
        return False
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (JSON can carry one as an escape)
        return False
    return True


def valid_workload(w: Any) -> bool:
    """A Slurm job (hpc_job only) or a container (namespace, pod, container; no hpc_job)."""
    if not isinstance(w, Workload):
        return False
    fields = (w.hpc_job, w.namespace, w.pod, w.container)
    if not all(valid_label(f) for f in fields):
        return False
    return bool(w.hpc_job) and not (w.namespace or w.pod or w.container) or \
        not w.hpc_job and bool(w.pod)


def describe(workloads: tuple[Workload, ...] | None) -> str:
    """`workloads: slurm job 42, ...`, `no workload (the GPU was idle)` or `workload unknown`."""
    if workloads is None:
        return "workload unknown (the GPU was not observed then)"
    if not workloads:
        return "no workload (the GPU was idle)"
    return "workloads: " + ", ".join(w.describe() for w in workloads)


@dataclass
class _Segment:
    workloads: tuple[Workload, ...]
    first: float  # unix time of the first reading that observed this set
    last: float  # and of the last one


class WorkloadHistory:
    """Per GPU UUID, the workload sets the source observed and when. Thread-safe: readings come
    from the collector's thread, questions from the kernel-log follower's."""

    def __init__(self, keep_s: float = KEEP_S, stand_s: float = STAND_S) -> None:
        self.keep_s = keep_s
        self.stand_s = stand_s
        self.lock = threading.Lock()
        self._gpus: dict[str, list[_Segment]] = {}
        self.rejected = 0  # workloads or GPUs refused by the limits or as malformed

    def observe(self, reading: WorkloadReading) -> None:
        """Take one reading of the workload source (GPUs missing from it are not observed by it)."""
        at = float(reading.at)
        if not math.isfinite(at):
            return
        with self.lock:
            for uuid, workloads in reading.by_uuid.items():
                ws = self._clean(workloads)
                segs = self._gpus.get(uuid)
                if segs is None:
                    if not valid_label(uuid) or not uuid or len(self._gpus) >= MAX_GPUS:
                        self.rejected += 1
                        continue
                    segs = self._gpus[uuid] = []
                if segs and at < segs[-1].last:
                    continue  # older than what we know: a late reading tells nothing new
                if segs and segs[-1].workloads == ws and at - segs[-1].last <= self.stand_s:
                    segs[-1].last = at
                else:
                    segs.append(_Segment(ws, at, at))
                self._prune(segs, at)

    def _clean(self, workloads: Iterable[Workload]) -> tuple[Workload, ...]:
        given = tuple(workloads)
        ok = sorted({w for w in given if valid_workload(w)})
        dropped = sum(not valid_workload(w) for w in given)
        if len(ok) > MAX_WORKLOADS:
            dropped += len(ok) - MAX_WORKLOADS
            ok = ok[:MAX_WORKLOADS]
        self.rejected += max(0, dropped)
        return tuple(ok)

    def _prune(self, segs: list[_Segment], now: float) -> None:
        # A segment is needed while an event in it may still be attributed: until KEEP_S after
        # the next segment began (or its own stand ended).
        while len(segs) > 1 and min(segs[1].first, segs[0].last + self.stand_s) < now - self.keep_s:
            del segs[0]
        del segs[:-MAX_SEGMENTS]

    def at(self, uuid: str, t: float, until: float | None = None) -> tuple[Workload, ...] | None:
        """The workloads on GPU `uuid` at unix time `t`: those of the last observation at or
        before `t` (if at most STAND_S old), with those of every observation after `t` up to
        `until` (the readings taken between a live event and its counting). () when observed
        idle; None when unknown (no such observation: before the first remembered observation of
        that GPU, or long after the last)."""
        with self.lock:
            segs = self._gpus.get(uuid)
            if not segs:
                return None
            i = bisect.bisect_right([s.first for s in segs], t) - 1
            standing = segs[i].workloads if i >= 0 and t <= segs[i].last + self.stand_s else None
            later = [s.workloads for s in segs[i + 1:] if until is not None and s.first <= until]
            if not later:
                return standing
            return tuple(sorted({w for ws in (standing or (), *later) for w in ws}))

    def observed_since(self, uuid: str, t: float) -> bool:
        """Whether a reading at or after `t` observed GPU `uuid`."""
        with self.lock:
            segs = self._gpus.get(uuid)
            return bool(segs) and segs[-1].last >= t


@dataclass(frozen=True)
class Attribution:
    """An attributed event on one GPU: the last `kind` event `code` (an XID, or an SXid reported
    by the NVSwitch at `switch`) with these workloads, at unix time `time`."""

    pci: str  # the GPU's PCI key (exporter.xid.parser.pci_key)
    kind: str  # XID or SXID
    code: int
    switch: str  # the NVSwitch's PCI key for an SXid, "" for an XID
    time: float
    workloads: tuple[Workload, ...] | None  # None: unknown; (): the GPU was idle

    @property
    def event(self) -> tuple[str, str, int, str]:
        return (self.pci, self.kind, self.code, self.switch)

    def cleared_by(self, acks: Iterable[Any]) -> bool:
        """An ack of this GPU at or after the event (of every XID, or of this XID) clears it."""
        return any(a.pci == self.pci and a.time >= self.time
                   and (a.xid is None or (self.kind == XID and a.xid == self.code)) for a in acks)


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
                                             and abs(r.time - rec.time) <= MERGE_S for r in recs):
                return  # counted again by a one-shot command, attributed by the daemon already
            same = next((r for r in recs if r.event == rec.event and r.workloads == rec.workloads), None)
            if same is not None:
                if same.time >= rec.time:
                    return
                recs.remove(same)
            recs.append(rec)
            recs.sort(key=lambda r: r.time)
            while len(recs) > self.per_gpu:  # the oldest that names no workload goes first
                recs.remove(next((r for r in recs if not r.workloads and r is not rec), recs[0]))
            self.version += 1

    def visible(self, acks: Iterable[Any] = ()) -> list[Attribution]:
        """Every record no ack has cleared, oldest first."""
        acks = list(acks)
        with self.lock:
            recs = [r for rs in self._by_gpu.values() for r in rs]
        return sorted((r for r in recs if not r.cleared_by(acks)), key=lambda r: (r.time, r.pci))

    def prune(self, acks: Iterable[Any]) -> None:
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


class FaultAttribution:
    """Attributes counted events: the GPU's identity (`identities`: PCI key -> index, UUID, as the
    XID service knows them) asks the history (`history`) and the answer goes to the ledger.

    `fresh` (set by the composition root when a workload source is configured) takes a reading
    now, which reaches the history through the source's listeners. A live event (counted at most
    LIVE_S after it happened) whose GPU no reading has observed since asks for one before it is
    attributed, on the thread that counted it, under the source's own deadline."""

    def __init__(self, history: WorkloadHistory, identities: Any,
                 ledger: AttributionLedger | None = None) -> None:
        self.history = history
        self.identities = identities
        self.ledger = ledger or AttributionLedger()
        self.fresh: Callable[[], Any] | None = None

    def xid(self, pci: str, xid: int, wall: float) -> Attribution:
        """Record an XID counted on the GPU at `pci` at unix time `wall`; returns the record."""
        uuid = self.identities.labels(pci, ask_nvml=False)[1]
        until = self._refresh([uuid] if uuid else [], wall)
        rec = Attribution(pci, XID, xid, "", wall, self.history.at(uuid, wall, until) if uuid else None)
        self.ledger.add(rec)
        return rec

    def sxid(self, switch: str, sxid: int, wall: float) -> list[Attribution]:
        """Record an SXid reported by the NVSwitch at PCI key `switch` against every GPU the node
        lists (an NVSwitch fault fails NVLink for all of them); returns the records."""
        gpus = [(pci, ident["uuid"]) for pci, ident in sorted(self.identities.to_state().items())
                if ident.get("index") is not None and ident.get("uuid")]  # not a line's stray address
        until = self._refresh([uuid for _, uuid in gpus], wall)
        out = []
        for pci, uuid in gpus:
            rec = Attribution(pci, SXID, sxid, switch, wall, self.history.at(uuid, wall, until))
            self.ledger.add(rec)
            out.append(rec)
        return out

    def _refresh(self, uuids: list[str], wall: float) -> float | None:
        """For a live event: a reading since it (asked for unless one of the same burst did),
        and the time up to which readings saw the GPUs as it left them. None otherwise."""
        if time.time() - wall > LIVE_S:
            return None  # the backlog: what is on the GPU now is not what the event hit
        if self.fresh is not None and uuids and not all(self.history.observed_since(u, wall) for u in uuids):
            try:
                self.fresh()
            except Exception as e:  # noqa: BLE001 - the source's trouble never stops the counting
                log.debug("fresh workload reading failed: %s", e)
        return time.time()  # after the fresh reading: it is one of them


def fresh_reading(source: Any, nvml: Any) -> Callable[[], Any]:
    """A reading of the workload source `source` now, of the GPUs the NVML session lists (none
    while NVML is not initialised: the source needs the list, and this never initialises it)."""
    def read() -> Any:
        if getattr(nvml, "ok", False):
            return source.read(list(nvml.devices))
        return None
    return read


def describe_sxid(recs: list[Attribution]) -> str:
    """One phrase for an SXid's records across the node's GPUs (for its log line)."""
    workloads = tuple(sorted({w for r in recs for w in r.workloads or ()}))
    unknown = sum(r.workloads is None for r in recs)
    if workloads:
        return describe(workloads) + (f" (unknown on {unknown} GPU(s))" if unknown else "")
    if unknown or not recs:
        return f"workload unknown ({unknown} of {len(recs)} GPU(s) not observed then)"
    return "no workload (the GPUs were idle)"


def last_seen(records: Iterable[Attribution], kind: str) -> dict[tuple[str, int, Workload], float]:
    """The exported attribution series of `kind`: per (the GPU's PCI key for an XID, the
    NVSwitch's for an SXid; code; workload) the time of the last such event. Unknown and idle
    attributions have no series (no workload is ever invented)."""
    out: dict[tuple[str, int, Workload], float] = {}
    for r in records:
        if r.kind != kind:
            continue
        for w in r.workloads or ():
            key = (r.pci if kind == XID else r.switch, r.code, w)
            out[key] = max(out.get(key, 0.0), r.time)
    return out


WORKLOAD_LABELS = ("hpc_job", "namespace", "pod", "container")


def series_labels(w: Workload) -> dict[str, str]:
    """All four workload labels of an attribution series (those of the other kind empty)."""
    return {n: getattr(w, n) for n in WORKLOAD_LABELS}


class PreparedSeries:
    """The samples of an attribution series, rebuilt only when what they are made of changes (the
    ledger, the acks, the GPUs' labels): a scrape then costs one key comparison, not a label set
    per sample (up to 8 per GPU, each with its workloads)."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._samples: tuple[Sample, ...] = ()

    def get(self, key: tuple, build: Callable[[], Iterable[Sample]]) -> tuple[Sample, ...]:
        if key != self._key:
            self._samples = tuple(build())
            self._key = key
        return self._samples


def acks_key(acks: list[Any]) -> tuple[int, float]:
    """What of the acks decides which records they clear: acks are only added (the oldest go
    past MAX_ACKS), so their number and newest time change whenever one is."""
    return len(acks), max((a.time for a in acks), default=0.0)
