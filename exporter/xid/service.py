"""The XID service: the process-wide XID/SXid objects, built once by the composition root
(exporter.compose.xid_service) and handed to the collectors and commands through the Context, and the
background work that drives them in the daemon.

Parts, one job each:
- identities (exporter.xid.identities): which GPU sits at a PCI address, bounded;
- XidCounter (exporter.xid.counter): kernel-log records and NVML events -> XID events;
- SxidCounter (exporter.xid.counter): kernel-log records -> SXid reports, the same path with
  the SXid parser, catalog and store;
- KmsgFollower (exporter.xid.follower): one kernel-log reader feeding both counters;
- XidPersistence (exporter.xid.persistence): the state files, written from snapshots.

Collectors and commands read it through `snapshot()` (an immutable view as of one moment),
`hits()`, the GPU accessors and `write_ack()`, never through its parts. In the daemon, whoever must
act on a change without waiting for a scrape subscribes with `on_change(fn)`: `fn()` is called (on
the thread that saw it; it must not block) when a kernel-log read or an NVML event changed the
counts, when an acknowledgement `ack` wrote was taken, and when the NVML watcher found a GPU lost.
The follower takes acks at its own cadence (`xid.follow_poll_seconds`), so an ack counts within
that, scraped or not.

`xid.enabled: false` builds no XID counter (no XID is counted, no NVML event watcher) and
`nvswitch.enabled: false` no SXid counter; the state file is still read for the verdict. This
module runs the follower and the NVML event watcher in the daemon (`start`/`stop`); one-shot
commands call `one_shot()` instead.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from exporter.attribution.fault import FaultAttribution
from exporter.attribution.ledger import Attribution, acks_key
from exporter.xid.clock import KernelClock
from exporter.xid.counter import SxidCounter, XidCounter
from exporter.xid.follower import KmsgFollower
from exporter.xid.identities import GpuIdentities, Identity
from exporter.xid.kmsg import ReaderStats
from exporter.xid.nvml_events import NvmlEventWatcher, WatcherStatus
from exporter.xid.persistence import XidPersistence
from exporter.xid.policy import Policy
from exporter.xid.store import Ack, EventStore, split_key
from exporter.xid.sxid_catalog import SxidPolicy
from exporter.xid.verdict import SxidLine, XidLine, sxid_lines, xid_lines

log = logging.getLogger("exporter.xid")

KMSG_RETRY_S = 10.0


@dataclass(frozen=True)
class KmsgView:
    path: str
    enabled: bool
    ok: bool
    error: str
    stats: ReaderStats  # a copy
    last_seq: int | None  # the last record whose reports are counted (this run or an earlier one)

    def unparseable(self) -> str:
        """Why the kernel log read is no evidence: a line that names an XID or SXid report could not
        be read (its fault may be missing from the counts), or not one of its lines was in a form we
        read (/dev/kmsg records, dmesg, journalctl -k, syslog: exporter.xid.textlog). "Healthy" from it
        would be a guess, whatever the state file says. Empty when it can be trusted. (`check`'s
        exit 3, and the Kubernetes condition's Unknown.)"""
        st = self.stats
        if not (self.enabled and self.ok):
            return ""
        if st.unparsed_faults:
            return (f"kernel log {self.path}: {st.unparsed_faults} line(s) name an XID or SXid report "
                    f"that could not be read, so faults may be missing from the counts; last: "
                    f"{st.last_unparsed_fault[:120]!r}")
        if st.records or not st.malformed:
            return ""
        return (f"kernel log {self.path}: none of its {st.malformed} line(s) is a kernel-log line in a "
                f"form `check` reads (/dev/kmsg records, dmesg, dmesg -T, journalctl -k short, "
                f"short-iso, short-precise, syslog); last line not parsed: {st.last_malformed[:80]!r}")


@dataclass(frozen=True)
class StateView:
    """The XID state: its state file and the acks file `ack` writes (`ok` and the error counts
    are both files'; `problem` the state file's, `acks_problem` the acks file's)."""

    path: str
    found: bool  # a state file for this boot and kernel log was read
    ok: bool
    problem: str
    recoveries: int
    read_errors: int
    write_errors: int
    acks_path: str = ""
    acks_problem: str = ""


# (XID lines per PCI key, counts per PCI key, acks, SXid lines, switches): XidService._lines
Lines = tuple[dict[str, tuple[XidLine, ...]], dict[str, dict[str, int]], tuple[Ack, ...],
              tuple[SxidLine, ...], dict[str, int]]


@dataclass(frozen=True)
class XidSnapshot:
    """The XID and SXid state as of one moment, as the collectors and commands read it: copies of
    the stores that nothing changes afterwards (the lines and counts are shared by the snapshots
    taken while the stores did not change: read them, never change them)."""

    xids: Mapping[str, tuple[XidLine, ...]]  # per PCI key with counts: its XIDs by (xid, tier), acks applied
    counts: Mapping[str, Mapping[str, int]]  # per PCI key: count key -> count
    acks: tuple[Ack, ...]
    reports: Mapping[str, int]  # raw reports per source
    merged: Mapping[str, int]  # reports that joined an event already counted, per source
    dropped: int  # new events refused by the cardinality guards
    nvml_events: Mapping[tuple[str, str], int]  # (PCI key, event type) -> count
    sxids: tuple[SxidLine, ...]  # empty when SXids are not counted
    sxid_switches: Mapping[str, int]  # switch PCI key -> nvidia-nvswitch<N> index
    sxid_dropped: int
    kmsg: KmsgView
    state: StateView
    watcher: tuple[bool, WatcherStatus] | None  # (alive, status) of the NVML event watcher, if one runs
    hits_version: Hashable  # changes whenever hits() may answer differently for these acks


class XidService:
    def __init__(self, cfg: Any, *, kmsg_path: str, policy: Policy, sxid_policy: SxidPolicy,
                 clock: KernelClock, identities: GpuIdentities, store: EventStore, sxids: EventStore,
                 counter: XidCounter | None, sxid_counter: SxidCounter | None,
                 attribution: FaultAttribution, follower: KmsgFollower, persistence: XidPersistence) -> None:
        """The parts, built by the composition root (exporter.compose.xid_service): `cfg` is the
        config's xid section; no XID counter when XIDs are not counted (`xid.enabled: false`),
        no SXid counter when SXids are not (`nvswitch.enabled: false`)."""
        self.cfg = cfg
        self.kmsg_path = kmsg_path
        self.policy, self.sxid_policy, self.clock = policy, sxid_policy, clock
        self.identities, self.store, self.sxids = identities, store, sxids
        self.counter, self.sxid_counter = counter, sxid_counter
        self.xid_enabled = counter is not None
        self.sxid_enabled = sxid_counter is not None
        self.attribution = attribution
        self.follower = follower
        self.state, self.acks_file = persistence.state, persistence.acks
        self.persistence = persistence
        self.watcher: NvmlEventWatcher | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._log_acks = False  # the daemon's log is the trail of acks; one-shot commands print
        # (store versions, what snapshot() builds from them)
        self._lines_cache: tuple[tuple[int, int], Lines] | None = None
        self._listeners: list[Callable[[], None]] = []

    # -- what the collectors and commands read -----------------------------------------------------
    def _lines(self) -> Lines:
        """(XID lines, counts, acks, SXid lines, switches): rebuilt only when the stores changed
        (three readers a scrape). The key is read first, so what is kept is never older than it."""
        key = (self.store.version, self.sxids.version)
        cached = self._lines_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        counts = self.store.snapshot()
        unacked = {p: self.store.unacked(p) for p in counts}
        lines: Lines = ({p: tuple(xid_lines(ks, unacked[p], self.policy)) for p, ks in counts.items()},
                 {p: {k: c.count for k, c in ks.items()} for p, ks in counts.items()},
                 tuple(self.store.acks_snapshot()),
                 tuple(sxid_lines(self.sxids, self.sxid_policy)) if self.sxid_enabled else (),
                 dict(self.sxids.indices))
        self._lines_cache = (key, lines)
        return lines

    def snapshot(self) -> XidSnapshot:
        xids, counts, acks, sxids, switches = self._lines()
        with self.store.lock:
            reports, merged, dropped = dict(self.store.reports), dict(self.store.merged), self.store.dropped
        st, ak, status, w = self.state.status, self.acks_file.status, self.follower.status, self.watcher
        return XidSnapshot(
            xids=xids, counts=counts, acks=acks, reports=reports, merged=merged, dropped=dropped,
            nvml_events=self.nvml_events, sxids=sxids, sxid_switches=switches,
            sxid_dropped=self.sxids.dropped,
            kmsg=KmsgView(self.kmsg_path, status.enabled, status.ok, status.error,
                          dataclasses.replace(self.follower.reader.stats), self.last_seq),
            state=StateView(str(self.state.path), self.persistence.found, st.ok and ak.ok, st.problem,
                            self.state.recoveries, st.read_errors + ak.read_errors,
                            st.write_errors + ak.write_errors, str(self.acks_file.path),
                            ak.problem if not ak.ok else ""),
            watcher=None if w is None else (w.alive, dataclasses.replace(w.status)),
            hits_version=(self.attribution.ledger.version, acks_key(list(acks)), self.identities.version))

    def hits(self, acks: tuple[Ack, ...]) -> list[Attribution]:
        """The workloads faults hit (those `acks` cleared left out), oldest first."""
        return list(self.attribution.ledger.visible(list(acks)))

    @property
    def nvml_events(self) -> dict[tuple[str, str], int]:
        return self.counter.nvml_event_counts() if self.counter is not None else {}

    def session(self) -> Any:
        return self.identities.session()

    def gpu_labels(self, pci: str) -> tuple[str, str, str]:
        return self.identities.labels(pci)

    def identify(self, pci: str, index: int | None = None, uuid: str = "") -> None:
        """A GPU reading names the GPU at `pci` (labels and the guards use it)."""
        self.identities.identify(pci, index, uuid)

    def identity(self, pci: str) -> Identity | None:
        return self.identities.get(pci)

    def gpu_at_index(self, index: int) -> str | None:
        """The PCI key of GPU `index` as known this boot (NVML earlier, or the state file)."""
        return self.identities.by_index(index)

    def is_listed(self, pci: str) -> bool:
        return self.identities.is_listed(pci)

    def kernel_now(self) -> float:
        return self.clock.now()

    def write_ack(self, ack: Ack) -> str:
        """Add `ack` to the acks file, which the daemon folds in (the store stays as read).
        Returns "" when written, else the problem: the acks file's, or the XID state file's when
        its path is no regular file (nothing the daemon folds in would be kept)."""
        if self.state.disabled:
            return self.state.status.problem or "unreadable"
        if self.persistence.write_ack(ack):
            return ""
        return self.acks_file.status.problem or "unwritable"

    # -- one pass (one-shot commands; the background loop) -------------------------------------------
    @property
    def last_seq(self) -> int | None:
        """The last kernel-log record whose reports are counted (this run or an earlier one)."""
        return self.follower.counted_through()

    def load_state(self) -> None:
        self.persistence.load()

    def ensure_loaded(self) -> None:
        with self._start_lock:
            if not self.persistence.loaded:
                self.load_state()

    def read_kmsg(self, live: bool = False) -> int:
        return self.follower.read(live)

    def flush_state(self, force: bool = False) -> bool:
        return self.persistence.flush(force)

    def refresh_acks(self) -> list[Ack]:
        """Take acknowledgements `ack` wrote since we last looked. The daemon logs every ack
        once: those written while it runs and those written while it was down (the state file
        marks the ones logged, so a restart does not log them again)."""
        new = self.persistence.take_acks()
        self._log_unlogged_acks(None if self._log_acks else new)
        return new

    def _log_unlogged_acks(self, among: list[Ack] | None = None) -> None:
        for a in self.store.take_unlogged_acks(among):
            gpu, _, bus_id = self.identities.labels(a.pci, ask_nvml=False)
            gpu = gpu or ("" if a.index is None else str(a.index))
            if a.xid is not None:
                what, tiers = f"XID {a.xid}", self.policy.tier(a.xid)
            else:
                what = "all XIDs"
                tiers = ",".join(sorted({self.policy.tier(*split_key(k)) for k in a.baseline})) or "none"
            log.info("acknowledged %s on GPU %s (PCI %s): tier %s, counts at the ack %s", what, gpu or "-",
                     bus_id, tiers, ", ".join(f"{k} x{n}" for k, n in sorted(a.baseline.items())) or "none")

    # -- change notification (the daemon) ----------------------------------------------------------------
    def on_change(self, fn: Callable[[], None]) -> None:
        """Call `fn()` whenever what the verdict is made of changes (see the module's docstring)."""
        self._listeners.append(fn)

    def _changed(self) -> None:
        for fn in list(self._listeners):
            try:
                fn()
            except Exception:  # noqa: BLE001 - a listener must not stop the follower or the watcher
                log.exception("XID change listener")

    def _versions(self) -> tuple[int, int]:
        return self.store.version, self.sxids.version

    def _on_nvml_event(self, ev: Any) -> None:
        assert self.counter is not None  # the watcher runs only with a counter
        before = self._versions()
        self.counter.on_nvml_event(ev)
        if self._versions() != before:
            self._changed()

    # -- background ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the kernel-log follower (when something counts) and the NVML event watcher
        (when XIDs are counted and `xid.nvml_events`). Idempotent."""
        with self._start_lock:
            if self._thread is not None:
                return
            if not self.persistence.loaded:
                self.load_state()
            # From here the daemon holds what the file held and writes it back whenever the file
            # is not what it holds: a corrupt file set aside now loses nothing (no recovery).
            if self.xid_enabled:
                self.state.hold()
            for c in (self.counter, self.sxid_counter):
                if c is not None:
                    c.log_from_now()  # the daemon's log is the trail of every counted event
            self._log_acks = True
            self._log_unlogged_acks()  # those written while no daemon ran
            self._thread = threading.Thread(target=self._follow, name="kmsg-follow", daemon=True)
            self._thread.start()
            if self.counter is not None and self.cfg.nvml_events:
                self.watcher = NvmlEventWatcher(self._session_for_watcher, self._on_nvml_event,
                                                on_lost=self._changed)
                self.watcher.start()

    def _session_for_watcher(self) -> Any:
        s = self.identities.nvml
        s.ensure()
        self.identities.note_listed(s)  # the watcher starts with the follower: tell the guard early
        return s

    def _follow(self) -> None:
        poll = self.cfg.follow_poll_seconds
        status = self.follower.status
        retry_at = 0.0  # monotonic: the next try of a kernel log that could not be read
        while not self._stop.is_set():
            try:
                before = self._versions()
                if time.monotonic() >= retry_at:
                    self.follower.read(live=status.backlog_done)
                    if status.ok:
                        status.backlog_done = True
                    elif status.enabled:
                        retry_at = time.monotonic() + KMSG_RETRY_S
                if self.counter is not None:
                    self.counter.tick()
                # acks at this cadence even while the kernel log cannot be read (unprivileged pods)
                acked = bool(self._listeners) and bool(self.refresh_acks())
                if acked or self._versions() != before:
                    self._changed()
                self.persistence.flush()
                if not status.enabled or not status.ok:
                    self._stop.wait(poll)
                    continue
                self.follower.reader.wait(poll)
            except Exception:  # noqa: BLE001 - keep following whatever one record did
                log.exception("kernel-log follower")
                self._stop.wait(1.0)
        self.persistence.flush(force=True)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the threads and flush the state file within about `timeout_s`. The NVML event
        thread may be blocked in NVML: it is given a short while, then left (a daemon thread)."""
        if self._stop.is_set():
            return
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        if self.watcher is not None:
            self.watcher.stop(min(1.0, timeout_s / 4))
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))  # it flushes as it ends
        if self._thread is not None and self._thread.is_alive():
            self.persistence.flush(force=True)  # the follower did not end in time: write from here
        if self.counter is not None:
            self.counter.flush_logs()  # lines still waiting for NVML to name their GPU
        self.follower.close()

    @property
    def follower_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


class _WithXid(Protocol):  # exporter.collector.Context, which imports this module
    def xid_service(self) -> XidService: ...


def one_shot(ctx: _WithXid) -> XidService:
    """The service for a one-shot command: state loaded, kernel-log backlog read (`check` builds
    its Context read-only, exporter.compose: a corrupt state file is left for the daemon)."""
    svc = ctx.xid_service()
    svc.session()  # the GPUs NVML lists, before counting (the cardinality guard spares them)
    svc.load_state()
    svc.read_kmsg()
    svc.persistence.take_acks()  # the acks the backlog's counts now reach
    return svc
