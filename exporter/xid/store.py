"""XID counts since boot, one count per event, and the state file that keeps them across restarts.

Counting rule (see docs/xid.md): every report of the same XID on the same GPU (PCI address)
within `window_s` seconds (kernel clock) of the first report of an event is that event, whatever
source it came from and in whichever order the sources deliver it. So an NVML event and the
kernel-log line of the same XID count once, an XID 13 flood of one line per SM counts once, and
a bus loss reported by both an `Xid ... 79` line and a `fallen off the bus` line counts once.
Memory is bounded: at most a few open events per (GPU, XID) are remembered, older ones pruned.

State file: JSON in `state_dir`, keyed by the boot id, written atomically (temporary file,
fsync, rename, fsync of the directory) under an advisory lock shared with `ack`. It holds the
counts, the last kernel-log sequence number processed (records up to it are not counted again
after a restart, even when the ring buffer still holds them), the open events (so a flood that
spans a restart is not counted twice), the PCI->GPU identities seen, and the acknowledgements.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("exporter.xid.store")

STATE_VERSION = 1
STATE_NAME = "xid-state.json"
MAX_OPEN_PER_KEY = 4
MAX_KEYS = 4096
# Label cardinality guards: a node has at most 8-16 GPUs and a few dozen XIDs ever happen.
MAX_GPUS = 64
MAX_KEYS_PER_GPU = 128


def count_key(xid: int, action: int | None = None) -> str:
    """Key of a count within one GPU: the XID, plus XID 154's recovery action code."""
    return f"{xid}/{action}" if action is not None else str(xid)


def split_key(key: str) -> tuple[int, int | None]:
    xid, _, action = key.partition("/")
    return int(xid), (int(action) if action else None)


@dataclass
class Count:
    count: int = 0
    last_kernel_s: float = 0.0  # kernel clock (seconds since boot) of the last event
    last_wall: float = 0.0  # wall-clock time of the last event

    def to_json(self) -> list:
        return [self.count, round(self.last_kernel_s, 6), round(self.last_wall, 3)]

    @classmethod
    def from_json(cls, v: Any) -> Count:
        return cls(int(v[0]), float(v[1]), float(v[2]))


@dataclass
class OpenEvent:
    start_s: float  # kernel clock of the first report
    key: str  # count key it was counted under
    sources: set[str] = field(default_factory=set)


@dataclass
class Ack:
    pci: str
    index: int | None
    uuid: str
    xid: int | None  # None: every XID on that GPU
    time: float
    baseline: dict[str, int]  # count per count key at the time of the ack

    def to_json(self) -> dict:
        return {"pci": self.pci, "index": self.index, "uuid": self.uuid, "xid": self.xid,
                "time": self.time, "baseline": self.baseline}

    @classmethod
    def from_json(cls, d: dict) -> Ack:
        return cls(str(d["pci"]), d.get("index"), str(d.get("uuid") or ""), d.get("xid"),
                   float(d["time"]), {str(k): int(v) for k, v in dict(d.get("baseline") or {}).items()})

    def ident(self) -> tuple:
        return (self.pci, self.xid, round(self.time, 3))


@dataclass
class Identity:
    index: int | None
    uuid: str


class XidStore:
    """Counts per (PCI key, count key), the dedupe ledger, identities, acks. Thread-safe."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self.lock = threading.RLock()
        self.counts: dict[str, dict[str, Count]] = {}
        self.open: dict[tuple[str, int], deque[OpenEvent]] = {}
        self.identities: dict[str, Identity] = {}
        self.acks: list[Ack] = []
        self.last_seq: int | None = None  # last kernel-log record processed
        self.reports: dict[str, int] = {}  # raw reports per source
        self.merged: dict[str, int] = {}  # reports that joined an existing event, per source
        self.dropped = 0  # new events refused by the cardinality guards
        self.version = 0  # bumps on every change worth writing (counts, identities, acks)
        self.snapshot_version = -1  # the version the last to_state() captured

    # -- counting --------------------------------------------------------------------------------
    def report(self, source: str, pci: str, xid: int, kernel_s: float, wall: float | None,
               action: int | None = None, wall_of: Callable[[float], float] | None = None) -> bool:
        """One report of an XID. Returns True when it is a new event (counted), False when it
        belongs to an event already counted. `wall` (or `wall_of(kernel_s)`, computed only for a
        new event) is the event's wall-clock time."""
        with self.lock:
            self.reports[source] = self.reports.get(source, 0) + 1
            k = (pci, xid)
            q = self.open.get(k)
            if q is not None:
                for ev in q:
                    if abs(kernel_s - ev.start_s) <= self.window_s:
                        ev.sources.add(source)
                        self.merged[source] = self.merged.get(source, 0) + 1
                        return False
            else:
                if len(self.open) >= MAX_KEYS:
                    self._prune(kernel_s, force=True)
                q = self.open[k] = deque(maxlen=MAX_OPEN_PER_KEY)
            key = count_key(xid, action)
            per_gpu = self.counts.get(pci)
            if (per_gpu is None and len(self.counts) >= MAX_GPUS) or \
                    (per_gpu is not None and key not in per_gpu and len(per_gpu) >= MAX_KEYS_PER_GPU):
                self.dropped += 1  # a garbage flood must not become unbounded series
                return False
            q.append(OpenEvent(kernel_s, key, {source}))
            c = self.counts.setdefault(pci, {}).setdefault(key, Count())
            c.count += 1
            if kernel_s >= c.last_kernel_s:
                c.last_kernel_s = kernel_s
                c.last_wall = wall if wall is not None else (wall_of(kernel_s) if wall_of else time.time())
            self.version += 1
            return True

    def _prune(self, now_s: float, force: bool = False) -> None:
        horizon = now_s - 2 * self.window_s
        for k in list(self.open):
            q = self.open[k]
            while q and q[0].start_s < horizon:
                q.popleft()
            if not q:
                del self.open[k]
        if force and len(self.open) >= MAX_KEYS:  # pathological: drop the oldest half
            for k in sorted(self.open, key=lambda k: self.open[k][-1].start_s)[: len(self.open) // 2]:
                del self.open[k]

    def prune(self, now_s: float) -> None:
        with self.lock:
            self._prune(now_s)

    def identify(self, pci: str, index: int | None = None, uuid: str = "") -> None:
        with self.lock:
            cur = self.identities.get(pci)
            if cur is None:
                self.identities[pci] = Identity(index, uuid)
                self.version += 1
                return
            if index is not None and cur.index != index:
                cur.index = index
                self.version += 1
            if uuid and cur.uuid != uuid:
                cur.uuid = uuid
                self.version += 1

    def snapshot(self) -> dict[str, dict[str, Count]]:
        with self.lock:
            return {p: {k: Count(c.count, c.last_kernel_s, c.last_wall) for k, c in ks.items()}
                    for p, ks in self.counts.items()}

    def add_ack(self, ack: Ack) -> None:
        with self.lock:
            if ack.ident() not in {a.ident() for a in self.acks}:
                self.acks.append(ack)
                self.version += 1

    def unacked(self, pci: str) -> dict[str, Count]:
        """Counts on `pci` above the highest acknowledged baseline for each count key."""
        with self.lock:
            out = {}
            for key, c in self.counts.get(pci, {}).items():
                xid = split_key(key)[0]
                base = max((a.baseline.get(key, 0) for a in self.acks
                            if a.pci == pci and (a.xid is None or a.xid == xid)), default=0)
                if c.count > base:
                    out[key] = c
            return out

    # -- state (de)serialisation ------------------------------------------------------------------
    def to_state(self, boot_id: str) -> dict:
        with self.lock:
            self.snapshot_version = self.version
            return {
                "version": STATE_VERSION,
                "boot_id": boot_id,
                "written": round(time.time(), 3),
                "last_seq": self.last_seq,
                "counts": {p: {k: c.to_json() for k, c in ks.items()} for p, ks in self.counts.items()},
                "open": [[p, x, ev.key, round(ev.start_s, 6), sorted(ev.sources)]
                         for (p, x), q in self.open.items() for ev in q],
                "gpus": {p: {"index": i.index, "uuid": i.uuid} for p, i in self.identities.items()},
                "acks": [a.to_json() for a in self.acks],
            }

    def merge_state(self, st: dict, counts: bool = True) -> bool:
        """Take a state file's content (same boot). Counts take the larger value per key so no
        count already known is lost; acks are unioned. With counts=False only acks and
        identities are taken (the daemon's periodic merge: its own counts are the truth, and a
        count `ack` wrote from records the daemon is about to read must not be added twice).
        Returns True when something changed."""
        with self.lock:
            before = self.version
            if not counts:
                for a in st.get("acks") or []:
                    self.add_ack(Ack.from_json(a))
                return self.version != before
            for p, ks in dict(st.get("counts") or {}).items():
                for k, v in dict(ks).items():
                    c = Count.from_json(v)
                    split_key(k)  # validates the key
                    cur = self.counts.setdefault(str(p), {}).get(k)
                    if cur is None or c.count > cur.count:
                        self.counts[str(p)][k] = c
                        self.version += 1
            for p, x, key, start_s, sources in st.get("open") or []:
                q = self.open.setdefault((str(p), int(x)), deque(maxlen=MAX_OPEN_PER_KEY))
                if not any(ev.start_s == float(start_s) for ev in q):
                    q.append(OpenEvent(float(start_s), str(key), set(sources)))
            for p, ident in dict(st.get("gpus") or {}).items():
                if p not in self.identities:
                    self.identities[str(p)] = Identity(ident.get("index"), str(ident.get("uuid") or ""))
                    self.version += 1
            for a in st.get("acks") or []:
                self.add_ack(Ack.from_json(a))
            seq = st.get("last_seq")
            if seq is not None and not isinstance(seq, int):
                raise ValueError("last_seq is not an integer")
            if seq is not None and (self.last_seq is None or seq > self.last_seq):
                self.last_seq = seq
            return self.version != before


def read_boot_id(procfs: str) -> str:
    """The kernel's boot id (<procfs>/sys/kernel/random/boot_id); '' when unreadable."""
    try:
        return Path(procfs, "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@dataclass
class StateStatus:
    ok: bool = True  # the last read and write of the state file worked
    problem: str = ""  # "", "missing", "corrupt", "unreadable", "unwritable", "other_boot", "no_boot_id"
    read_errors: int = 0
    write_errors: int = 0
    writes: int = 0


class StateFile:
    """The state file in `state_dir`. Never raises: problems are logged once and recorded in
    `status` (exported as metrics)."""

    def __init__(self, state_dir: str, boot_id: str, kmsg: str = "") -> None:
        self.kmsg = kmsg  # the kernel log the counts came from; a state of another log is not ours
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_NAME
        self.boot_id = boot_id
        self.status = StateStatus()
        self._mtime: float | None = None
        self._logged: set[str] = set()

    def _problem(self, kind: str, msg: str, *, write: bool) -> None:
        self.status.ok = False
        self.status.problem = kind
        if write:
            self.status.write_errors += 1
        else:
            self.status.read_errors += 1
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("state file %s: %s", self.path, msg)

    @contextlib.contextmanager
    def locked(self):  # noqa: ANN201 - an advisory lock shared by the daemon, check and ack
        fd = None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.dir / (STATE_NAME + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            fd = None  # a read-only state dir: go on without the lock
        try:
            yield
        finally:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def read(self) -> dict | None:
        """The state for this boot, or None (missing, corrupt, another boot)."""
        try:
            st = os.stat(self.path)
            text = self.path.read_text()
        except FileNotFoundError:
            self.status.problem = "missing"
            return None
        except OSError as e:
            self._problem("unreadable", f"cannot read: {e.strerror or e}", write=False)
            return None
        self._mtime = st.st_mtime
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
                raise ValueError("not a version-1 state document")
            XidStore().merge_state(data)  # validate every field before anyone uses it
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
            self._problem("corrupt", f"corrupt, set aside as {STATE_NAME}.corrupt (counts start from "
                          f"the kernel log): {e}", write=False)
            with contextlib.suppress(OSError):
                os.replace(self.path, self.path.with_name(STATE_NAME + ".corrupt"))
            return None
        if not self.boot_id:
            self.status.problem = "no_boot_id"
            return None
        if data.get("boot_id") != self.boot_id:
            self.status.problem = "other_boot"  # a new boot: start over from the kernel log
            return None
        if self.kmsg and data.get("kmsg") not in (None, self.kmsg):
            self.status.problem = "other_source"  # counts of another kernel log (a replay)
            return None
        return data

    def changed_on_disk(self) -> bool:
        """True when someone else (ack) wrote the file since we last read or wrote it."""
        try:
            m = os.stat(self.path).st_mtime
        except OSError:
            return False
        return m != self._mtime

    def write(self, store: XidStore, merge_counts: bool = False) -> bool:
        """Merge what is on disk (acks written by `ack`; counts too with merge_counts), then
        write atomically."""
        with self.locked():
            on_disk = self.read()
            if on_disk is not None:
                store.merge_state(on_disk, counts=merge_counts)
            data = store.to_state(self.boot_id)
            data["kmsg"] = self.kmsg
            tmp = self.path.with_name(f".{STATE_NAME}.{os.getpid()}.tmp")
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
                with open(tmp, "w") as f:
                    json.dump(data, f, separators=(",", ":"))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
                with contextlib.suppress(OSError):
                    dfd = os.open(self.dir, os.O_RDONLY)
                    try:
                        os.fsync(dfd)
                    finally:
                        os.close(dfd)
                self._mtime = os.stat(self.path).st_mtime
            except OSError as e:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                self._problem("unwritable", f"cannot write (counts kept in memory): {e.strerror or e}",
                              write=True)
                return False
        self.status.ok = True
        self.status.problem = ""
        self.status.writes += 1
        return True
