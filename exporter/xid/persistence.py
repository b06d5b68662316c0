"""Keeping the XID and SXid counts across restarts within a boot: loads the state document into
the stores, identities and attribution ledger, writes it from snapshots (never changing a store
to do so), and folds in the acknowledgements `ack` writes to the acks file while the daemon runs.

The daemon's state is one document, `xid-state.json` (version 2, STATE_DOC), of three sections
each validated on its own: the XID counts, open events, identities and acks (at the top level,
where version 1 had them: exporter.xid.store), `sxid` (exporter.xid.sxid_state) and `workload`
(exporter.xid.attribution_state). A section out of shape is dropped and the file set aside as
corrupt; the other sections load. The SXid and workload sections were files of their own up to
version 1 (`sxid-state.json`, `workload-state.json`): such a file is read when the document has
no section of its kind, then renamed `<name>.migrated-<time>` once the document holding it is
written (when the document already holds it, a crash came between the two steps: the document
wins and the file is renamed). Something other than a regular file at an old path is logged and
left alone. `ack` writes only the acks file (AcksDocument), a second writer kept apart, which
the daemon reads: so no write merges with the file on disk.

Writes are rate-limited (STATE_WRITE_MIN_S) and the sequence numbers are written now and then
even without new events (STATE_WRITE_IDLE_S). What the daemon holds is written back whenever the
file on disk is not what it last wrote (set aside as corrupt, removed, replaced by another boot's
or another log's): at the next flush, and so on shutdown and reload, which flush last.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exporter.attribution.ledger import AttributionLedger
from exporter.state import versions
from exporter.state.file import StateFile, set_aside
from exporter.state.values import StateError, envelope
from exporter.xid.attribution_state import WORKLOAD_DOC
from exporter.xid.follower import KmsgFollower
from exporter.xid.identities import GpuIdentities
from exporter.xid.store import (
    ACKS_DOC,
    SECTION_KEYS,
    STATE_NAME,
    XID_DOC,
    Ack,
    AcksFile,
    EventStore,
    take_acks,
    validate_section,
)
from exporter.xid.sxid_state import SXID_DOC

log = logging.getLogger("exporter.xid.persistence")

STATE_WRITE_MIN_S = 1.0
STATE_WRITE_IDLE_S = 60.0  # write the sequence numbers now and then even without new events


class StateDocument:
    """`xid-state.json`, written by the daemon alone: its three sections."""

    name = STATE_NAME
    schema = versions.XID

    @staticmethod
    def validate(doc: Any) -> None:
        envelope(doc, versions.XID)  # the sections: keep_valid_sections

    @staticmethod
    def keep_valid_sections(doc: dict[str, Any]) -> list[str]:
        dropped = []
        for key, check in (("xid", validate_section), ("sxid", SXID_DOC.section),
                           ("workload", WORKLOAD_DOC.section)):
            try:
                if key == "xid":
                    check(doc)
                elif doc.get(key) is not None:
                    check(doc[key])
            except StateError as e:
                dropped.append(f"section {key}: {e}")
                for k in SECTION_KEYS if key == "xid" else (key,):
                    doc.pop(k, None)
        return dropped


STATE_DOC = StateDocument()


def _regular(path: Path) -> bool:
    """True when a regular file is at `path` (never following a symlink). Anything else there is
    logged naming the path, and left alone: never read, renamed or replaced."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as e:
        log.warning("old state file %s cannot be looked at (%s); left alone", path, e.strerror or e)
        return False
    if not stat.S_ISREG(mode):
        log.error("old state file %s is not a regular file; left alone (never read)", path)
        return False
    return True


class XidPersistence:
    """The daemon's state document, built here from where it lives (`state_dir`), the boot and the
    kernel log its counts come from (`source`); `acks_kind`: the acks file's kind (the simulated
    node shares acks across its kernel logs, exporter.tools.simulate.acks); `read_only` (`check`)."""

    def __init__(self, state_dir: str, boot_id: str, source: str, store: EventStore,
                 identities: GpuIdentities, sxids: EventStore, follower: KmsgFollower,
                 ledger: AttributionLedger, *,
                 read_only: bool = False, acks_kind: type[AcksFile] = AcksFile, write_xids: bool = True,
                 sxids_enabled: bool = True) -> None:
        self.state = StateFile(state_dir, boot_id, source, read_only, doc=STATE_DOC)
        self.acks = acks_kind(state_dir, boot_id, source, read_only)  # written by `ack` alone; read here
        # the files of version 1, read once into the document (SXid's only when SXids are counted)
        self.old = {key: StateFile(state_dir, boot_id, source, read_only, doc=doc)
                    for key, doc in (("sxid", SXID_DOC), ("workload", WORKLOAD_DOC))
                    if key != "sxid" or sxids_enabled}
        self.read_only = read_only
        self.store = store
        self.identities = identities
        self.sxids = sxids
        self.follower = follower  # owns the kernel-log sequence numbers the document records
        self.ledger = ledger
        self.write_xids = write_xids  # False when XIDs are not counted: the XID section is kept as read
        self.sxids_enabled = sxids_enabled  # False: the SXid section is neither read nor changed
        self.loaded = False
        self.found = False  # an XID section for this boot and kernel log was read
        self._lock = threading.Lock()  # one flush or intake at a time
        self._kept: dict[str, Any] = {}  # sections written back as read (those not counted here)
        self._to_rename: list[StateFile] = []  # old files read, renamed once the document is written
        self._written: tuple[int, int, int] | None = None  # the versions last written
        self._written_seq: tuple[int | None, int | None] = (None, None)
        self._last_write = 0.0

    def _versions(self) -> tuple[int, int, int]:
        return self.store.version + self.identities.version, self.sxids.version, self.ledger.version

    def _seqs(self) -> tuple[int | None, int | None]:
        return self.follower.counted_through("xid"), self.follower.counted_through("sxid")

    def load(self) -> None:
        """Read the state document (and the old files it lacks) into the stores and the ledger
        (again: what is known stays)."""
        with self._lock:
            with self.state.locked():
                data = self.state.read() or {}
                acks = self.acks.read()
            self.found = "counts" in data
            if self.found:
                self.follower.resume("xid", XID_DOC.load(data, self.store, self.identities))
            if not self.write_xids:
                self._kept.update({k: data[k] for k in SECTION_KEYS if k in data})
            if acks is not None:
                ACKS_DOC.load(acks, self.store)
            if self.sxids_enabled:
                self._load_section(data, "sxid",
                                   lambda sx: self.follower.resume("sxid", SXID_DOC.load(sx, self.sxids)))
            elif data.get("sxid") is not None:
                self._kept["sxid"] = data["sxid"]
            self._load_section(data, "workload", lambda w: WORKLOAD_DOC.load(w, self.ledger))
            self._written = self._versions()
            self.loaded = True

    def _load_section(self, data: dict[str, Any], key: str, take: Callable[[dict[str, Any]], None]) -> None:
        """A section from the document, or else from its old file (renamed once written)."""
        old = self.old[key]
        if data.get(key) is not None:
            take(data[key])
            if not self.read_only:
                self._rename(old)  # the document won: the old file was left by a crash
            return
        if not _regular(old.path):
            return
        body = old.read()
        if body is not None:
            take(body)
        if not self.read_only and os.path.lexists(old.path) and old not in self._to_rename:
            self._to_rename.append(old)  # not set aside as corrupt or a newer version's

    def _rename(self, old: StateFile) -> None:
        """Rename an old file that is in the document now `<name>.migrated-<time>` (never removed)."""
        if not _regular(old.path):
            return
        try:
            aside = set_aside(old.path, None, "migrated")
        except OSError as e:
            log.warning("old state file %s: cannot be renamed (%s); left in place, the state file "
                        "wins over it at the next start", old.path, e.strerror or e)
            return
        log.info("old state file %s is in %s now: renamed %s", old.path, self.state.path, aside.name)

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
        """The state document's body as of now: its sections."""
        doc = XID_DOC.dump(self.store, self.identities, self.follower.counted_through("xid")) \
            if self.write_xids else {}
        return {**doc, **self._kept, "workload": WORKLOAD_DOC.dump(self.ledger),
                **({"sxid": SXID_DOC.dump(self.sxids, self.follower.counted_through("sxid"))}
                   if self.sxids_enabled else {})}

    def write_ack(self, ack: Ack) -> bool:
        """Add `ack` to the acks file (`ack`, the file's one writer): what the file holds stays."""
        def add(on_disk: dict[str, Any] | None) -> dict[str, Any]:
            held = [Ack.from_json(a) for a in (on_disk or {}).get("acks") or []]
            return ACKS_DOC.dump([*held, ack])
        return self.acks.update(add)

    def flush(self, force: bool = False) -> bool:
        """Write the document when what it holds changed (at most once a STATE_WRITE_MIN_S unless
        `force`); True when it was written."""
        with self._lock:
            now = time.monotonic()
            self.ledger.prune(self.store.acks_snapshot())  # the attributions the acks cleared go
            versions_, seqs = self._versions(), self._seqs()
            dirty = versions_ != self._written or self.state.behind() or bool(self._to_rename)
            seq_moved = seqs != self._written_seq
            idle_due = seq_moved and now - self._last_write >= STATE_WRITE_IDLE_S
            if not (dirty or (force and seq_moved) or idle_due):
                return False
            if not force and now - self._last_write < STATE_WRITE_MIN_S:
                return False
            self._last_write = now
            if not self.state.write(self.snapshot()):
                return False
            self._written, self._written_seq = versions_, seqs
            for old in self._to_rename:  # what they held is in the document on disk now
                self._rename(old)
            self._to_rename.clear()
            return True
