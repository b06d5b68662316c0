"""Keeping the XID and SXid counts across restarts within a boot: loads the state files into the
stores and identities, writes them from snapshots (never changing a store to do so), and folds
in the acknowledgements `ack` writes to the acks file while the daemon runs.

Each file has one writer: the daemon writes the XID state file (counts, open events, identities,
the acks it folded in, the last kernel-log sequence number: exporter.xid.store's XidDocument),
the SXid and workload state files; `ack` writes only the acks file (AcksDocument), which the
daemon reads. So no write merges with the file on disk. Writes are rate-limited
(STATE_WRITE_MIN_S) and the sequence number is written now and then even without new events
(STATE_WRITE_IDLE_S). What the daemon holds is written back whenever the file on disk is not
what it last wrote (set aside as corrupt, removed, replaced by another boot's or another log's):
at the next flush, and so on shutdown and reload, which flush last.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from exporter.attribution.ledger import AttributionLedger
from exporter.state.file import StateFile as DocumentFile
from exporter.xid.attribution_state import WORKLOAD_DOC
from exporter.xid.follower import KmsgFollower
from exporter.xid.identities import GpuIdentities
from exporter.xid.store import ACKS_DOC, XID_DOC, Ack, AcksFile, StateFile, XidStore, take_acks
from exporter.xid.sxid_store import SXID_DOC, SxidStateFile, SxidStore

STATE_WRITE_MIN_S = 1.0
STATE_WRITE_IDLE_S = 60.0  # write the sequence number now and then even without new events


class XidPersistence:
    """The daemon's state files, built here from where they live (`state_dir`), the boot and the
    kernel log their counts come from (`source`); `acks_kind`: the acks file's kind (the simulated
    node shares acks across its kernel logs, exporter.simulate.acks); `read_only` (`check`)."""

    def __init__(self, state_dir: str, boot_id: str, source: str, store: XidStore, identities: GpuIdentities,
                 sxids: SxidStore, follower: KmsgFollower, ledger: AttributionLedger, *,
                 read_only: bool = False, acks_kind: type[AcksFile] = AcksFile, write_xids: bool = True,
                 sxids_enabled: bool = True) -> None:
        self.state = StateFile(state_dir, boot_id, source, read_only)
        self.acks = acks_kind(state_dir, boot_id, source, read_only)  # written by `ack` alone; read here
        self.sxid_state = SxidStateFile(state_dir, boot_id, source, read_only)
        # which workloads each fault hit (exporter.attribution); a bad file costs no count
        self.workload = DocumentFile(state_dir, boot_id, source, doc=WORKLOAD_DOC)
        self.store = store
        self.identities = identities
        self.sxids = sxids
        self.follower = follower  # owns the kernel-log sequence number each file records
        self.ledger = ledger
        self.write_xids = write_xids  # False when XIDs are not counted: the file is only read
        self.sxids_enabled = sxids_enabled  # False: the SXid state is neither read nor written
        self.loaded = False
        self.found = False  # a state file for this boot and kernel log was read
        self._lock = threading.Lock()  # one flush or intake at a time
        self._written_version = -1
        self._written_seq: int | None = None
        self._last_write = 0.0
        self._sxid_written = 0
        self._sxid_last_write = 0.0
        self._workload_written = -1

    def _version(self) -> int:
        return self.store.version + self.identities.version

    def load(self) -> None:
        """Read the state files into the stores and the ledger (again: what is known stays)."""
        with self._lock:
            with self.state.locked():
                data = self.state.read()
                acks = self.acks.read()
            if data is not None:
                self.follower.resume("xid", XID_DOC.load(data, self.store, self.identities))
            if acks is not None:
                ACKS_DOC.load(acks, self.store)
            self.found = data is not None
            if self.sxids_enabled:
                sx = self.sxid_state.read()
                if sx is not None:
                    self.follower.resume("sxid", SXID_DOC.load(sx, self.sxids))
            self._sxid_written = self.sxids.version
            data = self.workload.read()
            if data is not None:
                WORKLOAD_DOC.load(data, self.ledger)
            self._workload_written = self.ledger.version
            self._written_version = self._version()
            self.loaded = True

    def take_acks(self) -> list[Ack]:
        """Acknowledgements `ack` wrote since we last read the acks file; returns the new ones.
        On the scrape path: never waits for a flush in progress (which may wait for `ack`'s lock)
        nor for the file's lock; the acks held stay and the news is taken at a later look."""
        if not self._lock.acquire(blocking=False):
            return []
        try:
            new = self.store.take_waiting()  # counted since: their baselines are reached
            data = self.acks.read_news()
            if data is not None:
                new += ACKS_DOC.load(data, self.store)
            # The XID state file changed under us: corrupt (set aside here), or written by an
            # older `ack` in a rolling upgrade (its acks are taken; its counts never are).
            data = self.state.read_news()
            if data is not None:
                new += take_acks(self.store, data.get("acks") or [])
            return new
        finally:
            self._lock.release()

    def snapshot(self) -> dict[str, Any]:
        """The XID state document's body as of now."""
        return XID_DOC.dump(self.store, self.identities, self.follower.counted_through("xid"))

    def write_ack(self, ack: Ack) -> bool:
        """Add `ack` to the acks file (`ack`, the file's one writer): what the file holds stays."""
        def add(on_disk: dict[str, Any] | None) -> dict[str, Any]:
            held = [Ack.from_json(a) for a in (on_disk or {}).get("acks") or []]
            return ACKS_DOC.dump([*held, ack])
        return self.acks.update(add)

    def flush(self, force: bool = False) -> bool:
        """Write what changed (at most once a STATE_WRITE_MIN_S unless `force`); True when the
        XID state file was written."""
        with self._lock:
            now = time.monotonic()
            if self.sxids_enabled:
                self._flush_sxids(now, force)
            self._flush_workload()
            if not self.write_xids:
                return False
            version, seq = self._version(), self.follower.counted_through("xid")
            dirty = version != self._written_version or self.state.behind()
            seq_moved = seq != self._written_seq
            idle_due = seq_moved and now - self._last_write >= STATE_WRITE_IDLE_S
            if not (dirty or (force and seq_moved) or idle_due):
                return False
            if not force and now - self._last_write < STATE_WRITE_MIN_S:
                return False
            self._last_write = now
            if self.state.write(self.snapshot()):
                self._written_version, self._written_seq = version, seq
                return True
            return False

    def _flush_sxids(self, now: float, force: bool) -> None:
        seq = self.follower.counted_through("sxid")
        if self.sxids.version == self._sxid_written and not self.sxid_state.behind() \
                and not (force and seq is not None):
            return
        if not force and now - self._sxid_last_write < STATE_WRITE_MIN_S:
            return
        self._sxid_last_write = now
        version = self.sxids.version
        if self.sxid_state.write(SXID_DOC.dump(self.sxids, seq)):
            self._sxid_written = version

    def _flush_workload(self) -> None:
        """Write the attributions when they changed, those the acks cleared dropped first."""
        self.ledger.prune(self.store.acks_snapshot())
        version = self.ledger.version
        if version != self._workload_written and self.workload.write(WORKLOAD_DOC.dump(self.ledger)):
            self._workload_written = version
