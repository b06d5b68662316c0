"""The XID service: one per process (Context.xid), used by the xid and health collectors and
synchronously by `check` and `ack`.

It owns the count store, the state file, the kernel-log reader and parser, and the NVML event
watcher. In the daemon two background threads feed the store (kernel-log follower, NVML
events); `check`/`ack` call `load_state()` and `read_kmsg()` once instead.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from exporter.nvml.backend import EVENT_XID, Event
from exporter.xid.clock import KernelClock
from exporter.xid.kmsg import KmsgReader, Record
from exporter.xid.nvml_events import EVENT_NAMES, NvmlEventWatcher
from exporter.xid.parser import GpuAt, KernelLogParser, XidReport, pci_key, pci_label
from exporter.xid.policy import Policy
from exporter.xid.store import OTHER, StateFile, XidStore, read_boot_id
from exporter.xid.sxid import SxidReport, parse_sxid
from exporter.xid.sxid_catalog import SxidPolicy, describe
from exporter.xid.sxid_store import SxidStateFile, SxidStore
from exporter.xid.verdict import (
    FABRIC_GRACE_S,
    GPU_REASONS,
    GpuVerdict,
    NodeVerdict,
    SxidLine,
    gpu_reasons,
    node_verdict,
    worst,
    xid_lines,
)

log = logging.getLogger("exporter.xid")

RECOVERY_XID = 154
NVML_154_GRACE_S = 3.0  # hold NVML's XID 154 (no action code) so the kernel line, which has it, wins
STATE_WRITE_MIN_S = 1.0
STATE_WRITE_IDLE_S = 60.0  # write the sequence number now and then even without new events
KMSG_RETRY_S = 10.0
MALFORMED_LOG_S = 60.0


@dataclass
class KmsgStatus:
    ok: bool = False
    error: str = ""
    backlog_done: bool = False
    enabled: bool = True


class XidService:
    def __init__(self, ctx: Any, read_only: bool = False) -> None:
        self.ctx = ctx
        cfg = ctx.config.xid
        self.cfg = cfg
        self.policy = Policy(cfg.policy)
        self.store = XidStore(cfg.merge_window_seconds)
        self.clock = KernelClock()
        self.boot_id = read_boot_id(ctx.config.paths.procfs)
        self.kmsg_path = ctx.config.paths.kmsg
        sim = getattr(ctx, "simulation", None)
        # which kernel log the state's counts came from (a simulated node's root is a temp dir)
        simulated = sim is not None and self.kmsg_path == str(sim.root / "dev" / "kmsg")
        # (each set of scenario flags is its own kernel log, whose counts are kept apart)
        source_id = (f"simulated:{sim.profile.instance_type}:{','.join(sorted(sim.scenarios))}" if simulated
                     else self.kmsg_path)
        self.state = StateFile(ctx.config.paths.state_dir, self.boot_id, source_id, read_only=read_only)
        self.state.shared_acks = simulated
        self.store.is_listed = self.is_listed
        self._listed_session: Any = None  # the NVML session whose GPUs were last recorded
        # NVSwitch SXids: the same kernel-log records, their own counts and state file
        self.sxids = SxidStore()
        nvswitch = getattr(ctx.config, "nvswitch", None)  # the section the nvswitch collector declares
        self.sxid_enabled = nvswitch is None or nvswitch.enabled
        self.sxid_policy = SxidPolicy(nvswitch.policy, nvswitch.fatal_tier) if nvswitch else SxidPolicy()
        self.sxid_state = SxidStateFile(ctx.config.paths.state_dir, self.boot_id, source_id)
        self.sxid_skip: int | None = None  # records up to this seq had their SXids counted before
        self._sxid_written = 0
        self._sxid_last_write = 0.0
        self.reader = KmsgReader(self.kmsg_path)
        self.parser = KernelLogParser()
        self.kmsg = KmsgStatus(enabled=cfg.kmsg)
        self.skip_through: int | None = None  # kernel-log records up to this seq were counted before
        self.nvml_events: dict[tuple[str, str], int] = {}  # (pci key, event type name) -> count
        self.watcher: NvmlEventWatcher | None = None
        self._pending_154: list[tuple[float, str, float, float]] = []  # (due, pci, kernel_s, wall)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._written_version = -1
        self._last_write = 0.0
        self._written_seq: int | None = None
        self._state_loaded = False
        self._malformed_logged = 0
        self._malformed_at = -MALFORMED_LOG_S
        self.state_found = False

    # -- NVML --------------------------------------------------------------------------------------
    def session(self) -> Any:
        """The process's NVML session, or None when NVML is not usable."""
        s = self.ctx.nvml
        try:
            if not s.ensure():
                return None
        except Exception as e:  # noqa: BLE001 - NVML problems never take the XID counts down
            log.debug("NVML session unavailable: %s", e)
            return None
        self._note_listed(s)
        return s

    def _note_listed(self, s: Any) -> None:
        """Record the GPUs an initialised NVML session lists, for the cardinality guard."""
        if s.ok and self._listed_session is not s:
            self._listed_session = s
            for d in s.devices:
                k = pci_key(d.pci_bus_id)
                if k is not None:
                    self.store.identify(k, d.index, d.uuid)

    def is_listed(self, pci: str) -> bool:
        """Whether a GPU sits at `pci`: NVML lists it (now, or earlier this boot, as kept in the
        state file) or the driver named it in a `GPU at PCI` line. Never blocks on NVML."""
        ident = self.store.identities.get(pci)
        if ident is not None and (ident.index is not None or ident.uuid):
            return True
        s = self._listed_session
        return s is not None and s.by_pci(pci) is not None

    def gpu_labels(self, pci: str) -> tuple[str, str, str]:
        """(gpu, uuid, pci_bus_id) for a PCI key: from NVML when it lists the GPU, else from what
        this boot saw of it before (state file, `GPU at PCI` lines), else just the address."""
        if pci == OTHER:
            return "", "", OTHER
        s = self.session()
        dev = s.by_pci(pci) if s is not None else None
        if dev is not None:
            self.store.identify(pci, dev.index, dev.uuid)
            return str(dev.index), dev.uuid, dev.pci_bus_id or pci_label(pci)
        ident = self.store.identities.get(pci)
        if ident is not None:
            return ("" if ident.index is None else str(ident.index)), ident.uuid, pci_label(pci)
        return "", "", pci_label(pci)

    def on_nvml_event(self, ev: Event) -> None:
        s = self.session()
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
            self.store.identify(pci, ev.index, ev.uuid)
        for bit, name in EVENT_NAMES.items():
            if ev.event_type & bit:
                with self._lock:
                    self.nvml_events[(pci, name)] = self.nvml_events.get((pci, name), 0) + 1
        if ev.event_type & EVENT_XID:
            kernel_s, wall = self.clock.now(), time.time()
            if ev.data == RECOVERY_XID and self.kmsg.enabled:
                with self._lock:
                    self._pending_154.append((time.monotonic() + NVML_154_GRACE_S, pci, kernel_s, wall))
            else:
                self.store.report("nvml", pci, int(ev.data), kernel_s, wall)

    def tick(self) -> None:
        """Submit held NVML XID 154 events that are due; prune old open events."""
        now = time.monotonic()
        with self._lock:
            due = [p for p in self._pending_154 if p[0] <= now]
            self._pending_154 = [p for p in self._pending_154 if p[0] > now]
        for _, pci, kernel_s, wall in due:
            self.store.report("nvml", pci, RECOVERY_XID, kernel_s, wall)
        self.store.prune(self.clock.now())

    # -- state ----------------------------------------------------------------------------------------
    def load_state(self) -> None:
        with self.state.locked():
            data = self.state.read()
        self.state.take_recoveries(self.store)
        self.state.take_foreign_acks(self.store)
        if data is not None:
            self.store.merge_state(data)
            self.skip_through = self.store.last_seq
        self.state_found = data is not None
        sx = self.sxid_state.read()
        if sx is not None:
            self.sxids.load(sx)
            self.sxid_skip = self.sxids.last_seq
        self._sxid_written = self.sxids.version
        self._state_loaded = True
        self._written_version = self.store.version

    def refresh_acks(self) -> None:
        """Pick up acknowledgements written by `ack` since we last read or wrote the file."""
        if self.state.changed_on_disk():
            with self.state.locked():
                data = self.state.read()
            self.state.take_recoveries(self.store)
            if data is not None:
                self.store.merge_state(data, counts=False)

    def _flush_sxids(self, now: float, force: bool) -> None:
        if self.sxids.version == self._sxid_written and not (force and self.sxids.last_seq is not None):
            return
        if not force and now - self._sxid_last_write < STATE_WRITE_MIN_S:
            return
        self._sxid_last_write = now
        version = self.sxids.version
        if self.sxid_state.write(self.sxids):
            self._sxid_written = version

    def flush_state(self, force: bool = False) -> bool:
        now = time.monotonic()
        self._flush_sxids(now, force)
        dirty = self.store.version != self._written_version
        seq_moved = self.store.last_seq != self._written_seq
        idle_due = seq_moved and now - self._last_write >= STATE_WRITE_IDLE_S
        if not (dirty or (force and seq_moved) or idle_due):
            return False
        if not force and now - self._last_write < STATE_WRITE_MIN_S:
            return False
        self._last_write = now
        if self.state.write(self.store):
            self._written_version = self.store.snapshot_version
            self._written_seq = self.store.last_seq
            return True
        return False

    # -- kernel log --------------------------------------------------------------------------------
    def read_kmsg(self, live: bool = False, final: bool = False) -> int:
        """Process every kernel-log record available now; returns how many were read. Errors
        (no such file, permission denied without CAP_SYSLOG) are recorded, not raised."""
        if not self.kmsg.enabled:
            return 0
        n = 0
        try:
            if not self.reader.is_open:
                self.reader.open()
            for rec in self.reader.read_available(final):
                if n == 0 and self.reader.stats.records == 1:
                    self._note_first(rec)
                self.handle_record(rec, live)
                n += 1
        except OSError as e:
            self.reader.close()
            msg = f"cannot read {self.kmsg_path}: {e.strerror or e}"
            if self.kmsg.error != msg:
                hint = " (reading /dev/kmsg needs CAP_SYSLOG when kernel.dmesg_restrict=1)" \
                    if getattr(e, "errno", None) in (1, 13) else ""
                log.warning("%s%s", msg, hint)
            self.kmsg.ok, self.kmsg.error = False, msg
            self.reader.stats.errors += 1
            return n
        self.kmsg.ok, self.kmsg.error = True, ""
        self._log_malformed()
        return n

    def _log_malformed(self) -> None:
        """Log when malformed records were skipped since the last line (at most once a minute)."""
        st = self.reader.stats
        now = time.monotonic()
        if st.malformed > self._malformed_logged and now - self._malformed_at >= MALFORMED_LOG_S:
            log.warning("%s: %d malformed kernel-log record(s) skipped (%d in all), last: %r", self.kmsg_path,
                        st.malformed - self._malformed_logged, st.malformed, st.last_malformed)
            self._malformed_logged, self._malformed_at = st.malformed, now

    def _note_first(self, rec: Record) -> None:
        """Records we can prove we never saw: the ring wrapped before we (first) read it."""
        if not self.reader.device:
            return
        seen = self.skip_through if self.skip_through is not None else -1
        if rec.seq > seen + 1:
            self.reader.stats.missed += rec.seq - seen - 1

    def handle_record(self, rec: Record, live: bool = False) -> None:
        if live:
            self.clock.observe_live(rec.usec / 1e6)
        if not rec.kernel:  # prio >= 8: written from user space, not the driver
            self.store.last_seq = self.sxids.last_seq = rec.seq
            return
        if "SXid" in rec.message:
            self._handle_sxid(rec)
        parsed = self.parser.feed(rec.message)
        if parsed is not None:
            if isinstance(parsed, GpuAt):
                self.store.identify(parsed.pci, uuid=parsed.uuid)
            elif isinstance(parsed, XidReport) and (self.skip_through is None or rec.seq > self.skip_through):
                self.store.report("kmsg", parsed.pci, parsed.xid, rec.usec / 1e6, None, parsed.action,
                                  self.clock.wall)
        self.store.last_seq = self.sxids.last_seq = rec.seq

    def _handle_sxid(self, rec: Record) -> None:
        parsed = parse_sxid(rec.message)
        if isinstance(parsed, SxidReport) and (self.sxid_skip is None or rec.seq > self.sxid_skip):
            self.sxids.report(parsed.pci, parsed.switch, parsed.sxid, parsed.severity,
                              self.clock.wall(rec.usec / 1e6))

    # -- background ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        if not self._state_loaded:
            self.load_state()
        self._thread = threading.Thread(target=self._follow, name="kmsg-follow", daemon=True)
        self._thread.start()
        if self.cfg.nvml_events:
            self.watcher = NvmlEventWatcher(self._session_for_watcher, self.on_nvml_event)
            self.watcher.start()

    def _session_for_watcher(self) -> Any:
        s = self.ctx.nvml
        s.ensure()
        self._note_listed(s)  # the watcher starts with the follower: tell the guard early
        return s

    def _follow(self) -> None:
        poll = self.cfg.follow_poll_seconds
        while not self._stop.is_set():
            try:
                was_done = self.kmsg.backlog_done
                self.read_kmsg(live=was_done)
                if self.kmsg.ok:
                    self.kmsg.backlog_done = True
                self.tick()
                self.flush_state()
                if not self.kmsg.enabled or not self.kmsg.ok:
                    self._stop.wait(KMSG_RETRY_S if self.kmsg.enabled else poll)
                    continue
                self.reader.wait(poll)
            except Exception:  # noqa: BLE001 - keep following whatever one record did
                log.exception("kernel-log follower")
                self._stop.wait(1.0)
        self.flush_state(force=True)

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
            self.flush_state(force=True)  # the follower did not end in time: write from here
        self.reader.close()

    @property
    def follower_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


SIM_PLAY_S = 60.0


def play_simulated_onsets(ctx: Any) -> None:
    """On a simulated node, move its sources and its fake NVML past the scenarios' onsets, so a
    one-shot command sees what the daemon sees a few seconds in."""
    if getattr(ctx, "simulation", None) is None:
        return
    ctx.simulation.advance(SIM_PLAY_S)
    if ctx.nvml.ensure():
        advance = getattr(ctx.nvml.backend, "advance_to", None)
        if advance is not None:
            advance(SIM_PLAY_S)


def one_shot(ctx: Any, read_only: bool = False) -> XidService:
    """The service for a one-shot command: state loaded, kernel-log backlog read (`read_only`:
    a corrupt state file is left for the daemon to set aside). On a simulated node the
    scenarios' onsets are played first so their records exist."""
    play_simulated_onsets(ctx)
    svc = ctx.xid
    svc.state.read_only = read_only
    svc.session()  # the GPUs NVML lists, before counting (the cardinality guard spares them)
    svc.load_state()
    svc.read_kmsg(final=True)
    return svc


def sxid_lines(service: XidService) -> list[SxidLine]:
    """The SXid counts since boot with their policy tier, as exported and judged."""
    out = []
    for (pci, sxid, severity), c in sorted(service.sxids.snapshot().items()):
        switch = service.sxids.switches.get(pci)
        out.append(SxidLine("" if switch is None else str(switch), OTHER if pci == OTHER else pci_label(pci),
                            sxid, severity,
                            service.sxid_policy.tier(sxid, severity), c.count, c.last_wall, describe(sxid)))
    return out


def evaluate(service: XidService, health: Any, expected: int | None,
             fabric_grace_s: float = FABRIC_GRACE_S) -> NodeVerdict:
    """The node and per-GPU verdicts from the service's XID and SXid counts and the GPU
    collector's health (fabric registration judged once `fabric_grace_s` of uptime have passed)."""
    rows: dict[str, tuple[str, str, str, Any]] = {}
    s = service.session()
    if health is not None and health.gpus:
        for h in health.gpus.values():
            k = pci_key(h.pci_bus_id)
            if k is not None:
                rows[k] = (str(h.index), h.uuid, h.pci_bus_id, h)
                service.store.identify(k, h.index, h.uuid)
    elif s is not None:
        for d in s.devices:
            k = pci_key(d.pci_bus_id)
            if k is not None:
                rows[k] = (str(d.index), d.uuid, d.pci_bus_id, None)
    counts = service.store.snapshot()
    for k in counts:
        if k not in rows:
            rows[k] = (*service.gpu_labels(k), None)
    gpus = []
    for k, (gpu, uuid, bus_id, h) in rows.items():
        lines = xid_lines(counts.get(k, {}), service.store.unacked(k), service.policy)
        lost = s is not None and gpu.isdigit() and int(gpu) in s.lost
        reasons = gpu_reasons(h, lines, lost, service.clock.now(), fabric_grace_s)
        gpus.append(GpuVerdict(gpu, uuid, bus_id, worst([GPU_REASONS[r] for r in reasons]), reasons, lines,
                               h.fabric_state if h is not None else None))
    gpus.sort(key=lambda g: (not g.gpu.isdigit(), int(g.gpu) if g.gpu.isdigit() else 0, g.pci_bus_id))
    return node_verdict(gpus, health, expected, sxid_lines(service) if service.sxid_enabled else [])
