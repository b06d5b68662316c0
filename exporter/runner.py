"""Runs the collectors for a scrape: one shared in-flight collection, per-collector deadlines,
per-collector success and duration metrics, and errors logged when a source's state changes.

The collectors run one after another on a worker of the pool the composition root hands it
(exporter.deadline), each under its own deadline: past it the collector fails that scrape,
its worker is written off and the ones after it go on, on another worker, so a hung collector
never takes the others' families down (it delays them by its deadline once: while its read is
stuck it is not started again, and fails at once); derived
collectors (exporter.collector.Derived, the verdict) run after the sources, with the readings
the sources returned in the same collection."""

from __future__ import annotations

import functools
import logging
import platform
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from exporter import __version__, deadline
from exporter.buildinfo import build_info
from exporter.catalog import Families, define
from exporter.collection import RUNNER_PART, Collection
from exporter.collector import Collector, Derived, Failed
from exporter.config import Config

log = logging.getLogger("exporter.runner")

COLLECTOR_SUCCESS = define(
    "gpu_health_exporter_collector_success", "gauge",
    "1 if the collector's last collection succeeded within its deadline, else 0.",
    ["collector"], collector="exporter")
COLLECTOR_DURATION = define(
    "gpu_health_exporter_collector_duration_seconds", "gauge",
    "Wall time the collector took in the last collection (the deadline when it missed it).",
    ["collector"], unit="seconds", collector="exporter")
BUILD_INFO = define(
    "gpu_health_exporter_build_info", "gauge",
    "Always 1; the exporter's version, the git revision and branch it was built from (\"unknown\" when "
    "neither the checkout nor the build recorded them; see exporter/buildinfo.py) and the Python it runs on.",
    ["version", "revision", "branch", "python_version"], collector="exporter")
SCRAPES = define(
    "gpu_health_exporter_scrapes_total", "counter",
    "Scrapes of /metrics served.", collector="exporter")
COLLECTIONS = define(
    "gpu_health_exporter_collections_total", "counter",
    "Collections run; concurrent scrapes share one collection, so this can be below scrapes.",
    collector="exporter")


@dataclass
class CollectorStatus:
    ok: bool | None = None  # None until the first collection
    error: str = ""
    duration: float = 0.0


@dataclass(frozen=True)
class Outcome:
    """One collector's result in one collection."""

    ok: bool
    error: str
    took: float
    reading: Any = None


def _layers(derived: list[Derived]) -> list[list[Derived]]:
    """The derived collectors in the order their inputs allow: a layer's collectors depend only
    on sources and on the layers before it (the Kubernetes writer on the verdict, the verdict on
    the GPU collector). A dependency cycle is a programming error."""
    names = {c.name for c in derived}
    done: set[str] = set()
    out = []
    pending = list(derived)
    while pending:
        layer = [c for c in pending if all(d in done or d not in names for d in c.depends_on)]
        if not layer:
            raise ValueError("derived collectors depend on each other in a cycle: "
                             + ", ".join(c.name for c in pending))
        out.append(layer)
        done.update(c.name for c in layer)
        pending = [c for c in pending if c.name not in done]
    return out


class Runner:
    """Collects all collectors on demand. Concurrent callers share the collection in flight."""

    def __init__(self, collectors: Iterable[Collector], deadline_s: float,
                 deadlines: dict[str, float] | None = None, *, pool: deadline.Pool) -> None:
        self.collectors = list(collectors)
        self.deadline_s = deadline_s
        self.deadlines = deadlines or {}
        self.status = {c.name: CollectorStatus() for c in self.collectors}
        # collectors run one after another on a pool worker, not a thread each: most of a
        # collection is short system calls, which threads running at once would turn into GIL
        # hand-overs.
        self._reads = deadline.Deadlines(pool)
        self._lock = threading.Lock()
        self._inflight: Future[Collection] | None = None
        self.readings: dict[str, Any] = {}  # the last collection's readings (what dependants got)
        self._last: tuple[float, float, Collection] | None = None  # (started, finished, result)
        self.scrapes = 0
        self.collections = 0
        self._build = build_info()  # (revision, branch): read here, not on import
        self.ready = threading.Event()

    @classmethod
    def from_config(cls, collectors: Iterable[Collector], cfg: Config,
                    pool: deadline.Pool) -> Runner:
        """Each collector's deadline is its section's own (`deadline_seconds()`: its
        `timeout_seconds`) where it has one, else the top-level `collector_timeout_seconds`."""
        collectors = list(collectors)
        deadlines = {}
        for c in collectors:
            sec = cfg.find(c.config_section) if c.config_section else None
            if sec is not None and (own := sec.deadline_seconds()) is not None:
                deadlines[c.name] = own
        return cls(collectors, cfg.collector_timeout_seconds, deadlines, pool=pool)

    def start(self) -> None:
        for c in self.collectors:
            c.bind_collect(functools.partial(self.collect, scrape=False))
            c.start()

    def close(self) -> None:
        for c in self.collectors:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - shutdown must go on
                log.exception("closing collector %s", c.name)

    def collect(self, scrape: bool = True, arrived: float | None = None) -> Collection:
        """Return one complete collection; joins the one in flight when there is one. A caller
        that `arrived` (time.monotonic()) before the last collection finished gets that one (it
        is no older than the request): a server queueing requests for a few workers shares as a
        thread per request would, and a queue of requests costs one collection, not one per
        worker's turn. `scrape` False: not a /metrics scrape (the server's start-up collection)."""
        with self._lock:
            self.scrapes += scrape
            last = self._last
            if arrived is not None and last is not None and arrived <= last[1]:
                return last[2]
            fut = self._inflight
            owner = fut is None
            if fut is None:
                fut = self._inflight = Future()
        if not owner:
            return fut.result()
        start = time.monotonic()
        try:
            result = self._collect_all()
            fut.set_result(result)
        except BaseException as e:  # pragma: no cover - _collect_all catches collector errors
            fut.set_exception(e)
            with self._lock:
                self._inflight = None
            raise
        with self._lock:
            self._inflight = None
            self._last = (start, time.monotonic(), result)
        return result

    def _collect_all(self) -> Collection:
        """Sources one after another on a pool worker, each under its deadline, then the derived
        collectors with the sources' readings of this collection."""
        self.collections += 1
        outs: dict[str, Families] = {}
        sources = [c for c in self.collectors if not isinstance(c, Derived)]
        derived = [c for c in self.collectors if isinstance(c, Derived)]
        results: dict[str, Outcome] = {}
        for c, o in zip(sources, self._each([(c, None) for c in sources]), strict=True):
            results[c.name] = self._outcome(c, o, outs)
        for layer in _layers(derived):
            items = [(c, {d: results[d].reading if d in results else None
                          for d in c.depends_on}) for c in layer]
            for c, o in zip(layer, self._each(items), strict=True):
                results[c.name] = self._outcome(c, o, outs)
        metrics = Collection()
        own = Families()
        readings: dict[str, Any] = {}
        for c in self.collectors:
            res = results[c.name]
            self._record(c.name, res)
            readings[c.name] = res.reading
            own.add(COLLECTOR_SUCCESS, 1 if res.ok else 0, collector=c.name)
            own.add(COLLECTOR_DURATION, res.took, collector=c.name)
            if res.ok:
                metrics.add(c.name, outs[c.name])
        own.add(BUILD_INFO, 1, version=__version__, revision=self._build[0], branch=self._build[1],
                python_version=platform.python_version())
        own.add(SCRAPES, self.scrapes)
        own.add(COLLECTIONS, self.collections)
        metrics.add(RUNNER_PART, own)
        self.readings = readings
        self.ready.set()
        return metrics

    def _each(self, items: Sequence[tuple[Collector, Mapping[str, Any] | None]]) -> list[deadline.Outcome]:
        # No budget for the whole read: one would leave the collectors after a hung one unread.
        return self._reads.each(items, self._run, key=lambda item: item[0].name,
                                timeout=lambda item: self.deadlines.get(item[0].name, self.deadline_s))

    def _outcome(self, c: Collector, o: deadline.Outcome, outs: dict[str, Families]) -> Outcome:
        if o.ok:
            res: Outcome
            res, outs[c.name] = o.value
            return res
        missed = o.status in (deadline.TIMEOUT, deadline.BLOCKED)  # its duration is then its deadline
        return Outcome(False, o.reason, self.deadlines.get(c.name, self.deadline_s) if missed else o.took)

    @classmethod
    def _run(cls, item: tuple[Collector, Mapping[str, Any] | None]) -> tuple[Outcome, Families]:
        """One collector's run, into Families of its own: a run past its deadline (written off
        by exporter.deadline) leaves what it had added behind."""
        c, inputs = item
        out = Families()
        return cls._timed(c, out, inputs), out

    @staticmethod
    def _timed(c: Collector, out: Families, inputs: Mapping[str, Any] | None = None) -> Outcome:
        """Run one collector (a derived one with its `inputs`) and catch what it raises."""
        t = time.monotonic()
        try:
            reading = c.derive(out, inputs or {}) if isinstance(c, Derived) else c.collect(out)
            return Outcome(True, "", time.monotonic() - t, reading)
        except Failed as e:
            return Outcome(False, f"{e}", time.monotonic() - t, e.reading)
        except Exception as e:  # noqa: BLE001 - one broken source must not take the others down
            return Outcome(False, f"{type(e).__name__}: {e}", time.monotonic() - t)

    def _record(self, name: str, res: Outcome) -> None:
        ok, err, took = res.ok, res.error, res.took
        st = self.status[name]
        if not ok and (st.ok is not False or st.error != err):
            log.error("collector %s failed: %s", name, err)
        elif ok and st.ok is False:
            log.info("collector %s recovered", name)
        st.ok, st.error, st.duration = ok, err, took
