"""What the workload source observed on each GPU lately, for the events counted too late for a
reading after them (the backlog).

An event is attributed from the history only when it is bracketed: a reading at or before it
and one at or after it saw the same non-empty set of workloads on its GPU, with no reading
between them that saw anything else and no gap over STAND_S. A workload seen on both sides held
the GPU throughout (ids are not reused while the history remembers them). Anything else is
unknown: an idle GPU on both sides could have run a job that started and died between the
readings (the job killed in its first seconds), and a change between the readings leaves it open
which side the event was on. Ordered by each reading's monotonic time, so a wall-clock step
neither drops readings nor reorders them."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from exporter.workload.model import MAX_WORKLOADS, Workload, WorkloadReading, admit

KEEP_S = 3600.0  # observations older than this (once a newer one stands) are forgotten
STAND_S = 900.0  # two readings further apart than this bracket nothing
MAX_SEGMENTS = 256  # per GPU: changes of its workload set remembered (a job every 15 s for an hour)
MAX_GPUS = 64  # GPU UUIDs remembered (an 8-GPU node uses 8; MIG-heavy nodes more)

__all__ = ["KEEP_S", "MAX_GPUS", "MAX_SEGMENTS", "MAX_WORKLOADS", "STAND_S", "WorkloadHistory"]


@dataclass
class _Segment:
    workloads: tuple[Workload, ...] | None  # None: a reading saw a workload it could not keep
    first: float  # monotonic time of the first reading that observed this set
    last: float  # and of the last one


class WorkloadHistory:
    """Per GPU UUID, the workload sets the source observed and when (monotonic). Thread-safe:
    readings come from the collector's thread, questions from the kernel-log follower's."""

    def __init__(self, keep_s: float = KEEP_S, stand_s: float = STAND_S) -> None:
        self.keep_s = keep_s
        self.stand_s = stand_s
        self.lock = threading.Lock()
        self._gpus: dict[str, list[_Segment]] = {}
        self.rejected = 0  # GPUs refused by the limits, GPU sets refused by the rule (model.admit)
        self.latest: WorkloadReading | None = None  # the last reading heard

    def observe(self, reading: WorkloadReading) -> None:
        """Take one reading of the workload source (GPUs missing from it are not observed by it)."""
        at = float(reading.when)
        if at != at or at in (float("inf"), float("-inf")):
            return
        with self.lock:
            if self.latest is None or at >= self.latest.when:
                self.latest = reading
            for uuid, workloads in reading.by_uuid.items():
                ws = self.admit(workloads)
                segs = self._gpus.get(uuid)
                if segs is None:
                    if not isinstance(uuid, str) or not 0 < len(uuid) <= 256 or len(self._gpus) >= MAX_GPUS:
                        self.rejected += 1
                        continue
                    segs = self._gpus[uuid] = []
                if segs and at < segs[-1].last:
                    continue  # taken before the last one heard (never for a wall-clock step)
                if segs and segs[-1].workloads == ws and at - segs[-1].last <= self.stand_s:
                    segs[-1].last = at
                else:
                    segs.append(_Segment(ws, at, at))
                self._prune(segs, at)

    def admit(self, workloads: Iterable[Workload]) -> tuple[Workload, ...] | None:
        """The workload source's rule (model.admit), again: a reading built elsewhere obeys it too."""
        ws = admit(workloads)
        if ws is None or len(ws) > MAX_WORKLOADS:
            self.rejected += 1
            return None
        return ws

    def _prune(self, segs: list[_Segment], now: float) -> None:
        # A segment is needed while an event in it may still be attributed: until KEEP_S after
        # its last reading.
        while len(segs) > 1 and segs[0].last < now - self.keep_s:
            del segs[0]
        del segs[:-MAX_SEGMENTS]

    def at(self, uuid: str, t: float) -> tuple[Workload, ...] | None:
        """The workloads on GPU `uuid` at monotonic time `t` when bracketed (module docstring),
        else None (unknown)."""
        with self.lock:
            segs = self._gpus.get(uuid)
            if not segs:
                return None
            i = bisect.bisect_right([s.first for s in segs], t) - 1
            if i < 0 or t > segs[i].last or not segs[i].workloads:
                return None
            return segs[i].workloads
