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
import errno
import fcntl
import json
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.regular_file import NotRegularFile, open_regular, read_regular
from exporter.xid.catalog import XID_MAX, XID_MIN, lookup, valid_xid
from exporter.xid.identities import MAX_IDENTITIES, Identity  # noqa: F401 - Identity: re-exported
from exporter.xid.state_values import (  # noqa: F401 - StateError: re-exported
    MAX_INDEX,
    MAX_SEQ,
    MAX_UUID_CHARS,
    StateError,
    integer,
    mapping,
    pci_key,
    seconds,
    sequence,
    show,
    text,
)

log = logging.getLogger("exporter.xid.store")

STATE_VERSION = 1
STATE_NAME = "xid-state.json"
CORRUPT_KEEP = 5  # corrupt state files set aside that are kept for a human (oldest removed)
MAX_OPEN_PER_KEY = 4
MAX_KEYS = 4096
# Label cardinality guards. A GPU NVML lists is never subject to them for a catalog XID (its
# series are bounded by the catalog); addresses NVML does not list (a GPU lost before start, or
# a corrupted log) get MAX_UNKNOWN_GPUS series of their own, then share the OTHER bucket.
MAX_UNKNOWN_GPUS = 16
# Every map keyed by what the kernel log or a state file says is bounded (docs/xid.md "Limits"):
# identities (exporter.xid.identities.MAX_IDENTITIES), unknown addresses (above), acks.
MAX_ACKS = 1024
MAX_KEYS_PER_GPU = 128  # per GPU (or the bucket): XIDs outside the catalog beyond this are dropped
OTHER = "other"  # the shared bucket of PCI addresses beyond MAX_UNKNOWN_GPUS
MAX_ADDRESSES = MAX_IDENTITIES + MAX_UNKNOWN_GPUS + 1  # count keys a state file may hold (+ OTHER)
# Bounds of a sane state file: an XID a second for 30 years is under 1e9.
MAX_COUNT = 10**9
MAX_ACTION = 255
MAX_BOOT_ID_CHARS = 64  # a boot id is 36
MAX_SOURCE_CHARS = 4096  # the kernel log's path (PATH_MAX) or a simulated node's name
MAX_SOURCES, MAX_SOURCE_NAME_CHARS = 8, 32  # an open event's sources: kmsg, nvml


def count_key(xid: int, action: int | None = None) -> str:
    """Key of a count within one GPU: the XID, plus XID 154's recovery action code."""
    return f"{xid}/{action}" if action is not None else str(xid)


def split_key(key: str) -> tuple[int, int | None]:
    xid, _, action = key.partition("/")
    return int(xid), (int(action) if action else None)


def _remove_stale_temps(path: Path) -> None:
    """Temporary files of `path` left by a writer killed mid-write. Writers of a state file are
    serialised (the lock, or one daemon), so any found before writing are stale."""
    prefix = f".{path.name}."
    try:
        names = [n for n in os.listdir(path.parent) if n.startswith(prefix) and n.endswith(".tmp")]
    except OSError:
        return
    for n in names:
        with contextlib.suppress(OSError):
            os.unlink(path.parent / n)  # a symlink is removed, never followed
            log.info("removed stale temporary file %s (a write was interrupted)", path.parent / n)


def _open_temp(tmp: Path) -> int:
    """Create the temporary file, never following a symlink planted at its name."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(tmp, flags, 0o644)
    except FileExistsError:
        os.unlink(tmp)  # planted, or left by an earlier process with our pid: remove the name
        return os.open(tmp, flags, 0o644)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write `data` as JSON to `path` atomically: a temporary file created O_EXCL|O_NOFOLLOW,
    fsync, rename, fsync of the directory; stale temporary files removed first. Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with os.fdopen(_open_temp(tmp), "w") as f:
            json.dump(data, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


MAX_STATE_BYTES = 16 << 20  # far above any state within the limits (a few hundred KiB at most)


def read_state_file(path: str | os.PathLike, max_bytes: int = MAX_STATE_BYTES) -> bytes:
    """A state file's bytes: a regular file, its last component not a symbolic link (the state
    directory may be shared with other tools), at most `max_bytes` (more is an error)."""
    data = read_regular(path, max_bytes, follow=False)
    if len(data) > max_bytes:
        raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes", str(path))
    return data


def _key(k: Any, where: str) -> str:
    """A count key: XID in range, optional recovery action code."""
    if not isinstance(k, str) or not re.fullmatch(r"\d{1,3}(/\d{1,3})?", k):
        raise StateError(f"{where}: count key {show(k)} is not XID[/ACTION]")
    xid, action = split_key(k)
    integer(xid, f"{where}: XID", XID_MIN, XID_MAX)
    if action is not None:
        integer(action, f"{where}: recovery action", 0, MAX_ACTION)
    return k


def _optional(d: dict, key: str, check: Callable[[Any, str], Any], where: str) -> None:
    if d.get(key) is not None:
        check(d[key], f"{where}{key}")


def validate_state(st: Any) -> None:
    """Raise StateError naming the first field of a state document that is out of shape or range:
    every field the exporter reads (docs/xid.md, "What a state file must hold"). Numbers are integers or
    finite times in range, strings bounded and encodable, and each acknowledgement is of counts
    the file holds (its baseline is never above the count it acknowledges)."""
    if not isinstance(st, dict) or st.get("version") != STATE_VERSION:
        raise StateError(f"not a version-{STATE_VERSION} state document")
    _optional(st, "boot_id", lambda v, w: text(v, w, MAX_BOOT_ID_CHARS), "")
    _optional(st, "kmsg", lambda v, w: text(v, w, MAX_SOURCE_CHARS), "")
    _optional(st, "last_seq", lambda v, w: integer(v, w, 0, MAX_SEQ), "")
    _optional(st, "recoveries", lambda v, w: integer(v, w, 0, MAX_COUNT), "")
    _optional(st, "written", seconds, "")
    counts = mapping(st.get("counts") or {}, "counts")
    for p, ks in counts.items():
        pci_key(p, "counts", OTHER)
        for k, v in mapping(ks, f"counts[{p}]").items():
            where = f"counts[{p}][{k}]"
            _key(k, f"counts[{p}]")
            if not isinstance(v, list) or len(v) != 3:
                raise StateError(f"{where} is {show(v)}; expected [count, kernel seconds, unix time]")
            integer(v[0], f"{where} count", 0, MAX_COUNT)
            seconds(v[1], f"{where} kernel time")
            seconds(v[2], f"{where} unix time")
    for i, ev in enumerate(sequence(st.get("open") or [], "open")):
        if not isinstance(ev, list) or len(ev) != 5 or not isinstance(ev[4], list) \
                or not 0 < len(ev[4]) <= MAX_SOURCES:
            raise StateError(f"open[{i}] is {show(ev)}; expected [pci, xid, key, start, [sources]]")
        pci_key(ev[0], f"open[{i}]", OTHER)
        integer(ev[1], f"open[{i}] XID", XID_MIN, XID_MAX)
        if split_key(_key(ev[2], f"open[{i}]"))[0] != ev[1]:
            raise StateError(f"open[{i}]: count key {show(ev[2])} is not of XID {ev[1]}")
        seconds(ev[3], f"open[{i}] start")
        for s in ev[4]:
            text(s, f"open[{i}] source", MAX_SOURCE_NAME_CHARS)
    for p, ident in mapping(st.get("gpus") or {}, "gpus").items():
        pci_key(p, "gpus")
        mapping(ident, f"gpus[{p}]")
        _optional(ident, "uuid", lambda v, w: text(v, w, MAX_UUID_CHARS), f"gpus[{p}].")
        _optional(ident, "index", lambda v, w: integer(v, w, 0, MAX_INDEX), f"gpus[{p}].")
    for i, a in enumerate(sequence(st.get("acks") or [], "acks")):
        _validate_ack(mapping(a, f"acks[{i}]"), f"acks[{i}]", counts)


def _validate_ack(a: dict, where: str, counts: dict) -> None:
    pci = pci_key(a.get("pci"), f"{where}.pci", OTHER)
    _optional(a, "index", lambda v, w: integer(v, w, 0, MAX_INDEX), f"{where}.")
    _optional(a, "xid", lambda v, w: integer(v, w, XID_MIN, XID_MAX), f"{where}.")
    _optional(a, "uuid", lambda v, w: text(v, w, MAX_UUID_CHARS), f"{where}.")
    seconds(a.get("time"), f"{where}.time")
    if a.get("logged") not in (None, True, False):
        raise StateError(f"{where}.logged is {show(a['logged'])}; expected true or false")
    for k, v in mapping(a.get("baseline") or {}, f"{where}.baseline").items():
        _key(k, f"{where}.baseline")
        if a.get("xid") is not None and split_key(k)[0] != a["xid"]:
            raise StateError(f"{where}.baseline[{k}]: an acknowledgement of XID {a['xid']} has a "
                             f"baseline for another XID")
        # The counts at the ack are counts this file holds (at the address, or folded into the
        # shared bucket): a baseline above them would silence XIDs that were never acknowledged.
        held = max((c[0] for c in (counts.get(pci, {}).get(k), counts.get(OTHER, {}).get(k)) if c), default=0)
        integer(v, f"{where}.baseline[{k}]", 0, held)


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
    logged: bool = False  # a daemon logged it (kept in the file: logged once, across restarts)

    def to_json(self) -> dict:
        d = {"pci": self.pci, "index": self.index, "uuid": self.uuid, "xid": self.xid,
             "time": self.time, "baseline": self.baseline}
        return {**d, "logged": True} if self.logged else d

    @classmethod
    def from_json(cls, d: dict) -> Ack:
        return cls(str(d["pci"]), d.get("index"), str(d.get("uuid") or ""), d.get("xid"),
                   float(d["time"]), {str(k): int(v) for k, v in dict(d.get("baseline") or {}).items()},
                   d.get("logged") is True)

    def ident(self) -> tuple:
        return (self.pci, self.xid, round(self.time, 3))


class XidStore:
    """Counts per (PCI key, count key), the dedupe ledger and the acks. Thread-safe. Knows
    nothing of NVML or the state file: the caller says whether an address is a GPU it lists
    (`listed`), and reads `to_state()` (a snapshot) to write the state file."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self.lock = threading.RLock()
        self.counts: dict[str, dict[str, Count]] = {}
        self.open: dict[tuple[str, int], deque[OpenEvent]] = {}
        self.acks: list[Ack] = []
        self.unknown: set[str] = set()  # addresses with series of their own that were not listed
        self.last_seq: int | None = None  # last kernel-log record processed
        self.reports: dict[str, int] = {}  # raw reports per source
        self.merged: dict[str, int] = {}  # reports that joined an existing event, per source
        self.dropped = 0  # new events refused by the cardinality guards
        self.version = 0  # bumps on every change worth writing (counts, acks)

    # -- counting --------------------------------------------------------------------------------
    def report(self, source: str, pci: str, xid: int, kernel_s: float, wall: float | None,
               action: int | None = None, wall_of: Callable[[float], float] | None = None,
               listed: bool = False) -> bool:
        """One report of an XID. Returns True when it is a new event (counted; under OTHER when
        the address is beyond the guards), False when it belongs to an event already counted or
        a guard refused it.
        `wall` (or `wall_of(kernel_s)`, computed only for a new event) is the event's wall-clock
        time; `listed`: a GPU sits at `pci` (its catalog XIDs are never refused by the guards)."""
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
            if not valid_xid(xid) or (action is not None and not 0 <= action <= MAX_ACTION):
                self.dropped += 1  # not an XID the driver writes: a corrupted line or event
                return False
            key = count_key(xid, action)
            pci = self._series_pci(pci, listed)
            per_gpu = self.counts.get(pci)
            if per_gpu is not None and key not in per_gpu and len(per_gpu) >= MAX_KEYS_PER_GPU and \
                    not (lookup(xid) is not None and listed):
                self.dropped += 1  # a garbage flood must not become unbounded series
                return False
            if q is None:
                if len(self.open) >= MAX_KEYS:
                    self._prune(kernel_s, force=True)
                q = self.open[k] = deque(maxlen=MAX_OPEN_PER_KEY)
            q.append(OpenEvent(kernel_s, key, {source}))
            c = self.counts.setdefault(pci, {}).setdefault(key, Count())
            c.count += 1
            if kernel_s >= c.last_kernel_s:
                c.last_kernel_s = kernel_s
                c.last_wall = wall if wall is not None else (wall_of(kernel_s) if wall_of else time.time())
            self.version += 1
            return True

    def _series_pci(self, pci: str, listed: bool) -> str:
        """The PCI key an event is counted under: its own, unless it is a new address that is not
        listed and MAX_UNKNOWN_GPUS such addresses already have series (then OTHER)."""
        if pci in self.counts or listed:
            return pci
        if len(self.unknown) < MAX_UNKNOWN_GPUS:
            self.unknown.add(pci)
            return pci
        return OTHER

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

    def _bounded_counts(self, counts: dict, listed: Callable[[str], bool]) -> dict[str, dict[str, Count]]:
        """A state file's counts within the guards report() applies: an address beyond them
        (a file from before the limits, or edited) is folded into OTHER. Folded counts are
        summed within this document and then merged like any other (the larger count wins), so
        reading the same file twice does not count them twice."""
        out: dict[str, dict[str, Count]] = {}
        unknown = set(self.unknown)
        for p, ks in counts.items():
            p = str(p)
            if p != OTHER and p not in self.counts and not listed(p):
                if len(unknown) < MAX_UNKNOWN_GPUS or p in unknown:
                    unknown.add(p)
                else:
                    p = OTHER
            mine = out.setdefault(p, {})
            for k, v in dict(ks).items():
                c, cur = Count.from_json(v), mine.get(k)
                if cur is not None:  # only OTHER gathers several addresses
                    c = Count(cur.count + c.count, max(cur.last_kernel_s, c.last_kernel_s),
                              max(cur.last_wall, c.last_wall))
                elif len(mine) >= MAX_KEYS_PER_GPU and lookup(split_key(k)[0]) is None:
                    continue
                mine[k] = c
        self.unknown = unknown
        return out

    def prune(self, now_s: float) -> None:
        with self.lock:
            self._prune(now_s)

    def snapshot(self) -> dict[str, dict[str, Count]]:
        with self.lock:
            return {p: {k: Count(c.count, c.last_kernel_s, c.last_wall) for k, c in ks.items()}
                    for p, ks in self.counts.items()}

    def add_ack(self, ack: Ack) -> bool:
        """Add an acknowledgement; False when it is known already."""
        with self.lock:
            known = next((a for a in self.acks if a.ident() == ack.ident()), None)
            if known is not None:
                known.logged = known.logged or ack.logged  # another daemon run logged it
                return False
            self.acks.append(ack)
            if len(self.acks) > MAX_ACKS:  # the oldest go: the newest per GPU are the ones that matter
                self.acks.sort(key=lambda a: a.time)
                del self.acks[: len(self.acks) - MAX_ACKS]
            self.version += 1
            return True

    def take_unlogged_acks(self, among: list[Ack] | None = None) -> list[Ack]:
        """The acks (of `among`, default all) not logged yet, marked logged now (the next write
        keeps the mark)."""
        with self.lock:
            new = [a for a in (self.acks if among is None else among) if not a.logged]
            for a in new:
                a.logged = True
            if new:
                self.version += 1
            return new

    def acks_snapshot(self) -> list[Ack]:
        with self.lock:
            return list(self.acks)

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
        """A snapshot of the store as a state document (without `gpus`, which the identities
        add, and `recoveries`/`kmsg`, which the state file adds). Changes nothing."""
        with self.lock:
            return {
                "version": STATE_VERSION,
                "boot_id": boot_id,
                "written": round(time.time(), 3),
                "last_seq": self.last_seq,
                "counts": {p: {k: c.to_json() for k, c in ks.items()} for p, ks in self.counts.items()},
                "open": [[p, x, ev.key, round(ev.start_s, 6), sorted(ev.sources)]
                         for (p, x), q in self.open.items() for ev in q],
                "gpus": {},
                "acks": [a.to_json() for a in self.acks],
            }

    def merge_state(self, st: dict, counts: bool = True,
                    listed: Callable[[str], bool] = lambda pci: False) -> list[Ack]:
        """Take a state file's content (same boot). Counts take the larger value per key so no
        count already known is lost; acks are unioned. With counts=False only acks are taken
        (the daemon's periodic merge: its own counts are the truth, and a count `ack` wrote from
        records the daemon is about to read must not be added twice). `listed` says which
        addresses are GPUs (the guards spare them). Returns the acks that were new."""
        validate_state(st)
        new_acks = []
        with self.lock:
            for a in st.get("acks") or []:
                ack = Ack.from_json(a)
                if self.add_ack(ack):
                    new_acks.append(ack)
            if not counts:
                return new_acks
            for p, ks in self._bounded_counts(dict(st.get("counts") or {}), listed).items():
                for k, c in ks.items():
                    cur = self.counts.setdefault(p, {}).get(k)
                    if cur is None or c.count > cur.count:
                        self.counts[p][k] = c
                        self.version += 1
            for p, x, key, start_s, sources in st.get("open") or []:
                if (str(p), int(x)) not in self.open and len(self.open) >= MAX_KEYS:
                    continue
                q = self.open.setdefault((str(p), int(x)), deque(maxlen=MAX_OPEN_PER_KEY))
                if not any(ev.start_s == float(start_s) for ev in q):
                    q.append(OpenEvent(float(start_s), str(key), set(sources)))
            seq = st.get("last_seq")
            if seq is not None and (self.last_seq is None or seq > self.last_seq):
                self.last_seq = seq
            return new_acks


def merge_docs(mine: dict, disk: dict | None, counts: bool = False) -> tuple[dict, bool]:
    """Our state document merged with the one on disk (both validated, same boot): acks written
    by another process (`ack`) are kept; with `counts`, its counts, identities, open events and
    sequence number too (the larger count wins). Returns (document, whether the disk held acks
    ours lacks). Neither input is changed."""
    if disk is None:
        return mine, False
    out = dict(mine)
    known = {_ack_ident(a) for a in mine.get("acks") or []}
    extra = [a for a in disk.get("acks") or [] if _ack_ident(a) not in known]
    logged = {_ack_ident(a) for a in disk.get("acks") or [] if a.get("logged") is True}
    if extra or logged:  # and keep another run's mark that it logged an ack
        acks = sorted([*({**a, "logged": True} if _ack_ident(a) in logged else a
                         for a in mine.get("acks") or []), *extra], key=lambda a: a["time"])
        out["acks"] = acks[-MAX_ACKS:]
    if counts:
        merged = {p: dict(ks) for p, ks in (mine.get("counts") or {}).items()}
        for p, ks in (disk.get("counts") or {}).items():
            # An address the writer folded into OTHER (beyond the guards) is in OTHER already:
            # brought back on its own, it would be counted twice when the file is read again.
            if p not in merged and (OTHER in merged or len(merged) >= MAX_ADDRESSES):
                continue
            mk = merged.setdefault(p, {})
            for k, v in ks.items():
                if k not in mk or v[0] > mk[k][0]:
                    mk[k] = v
        out["counts"] = merged
        gpus = dict(mine.get("gpus") or {})
        for p, ident in (disk.get("gpus") or {}).items():
            if p not in gpus and len(gpus) < MAX_IDENTITIES:
                gpus[p] = ident
        out["gpus"] = gpus
        opened = list(mine.get("open") or [])
        seen = {(e[0], e[1], e[3]) for e in opened}
        room = max(0, MAX_KEYS - len(opened))
        out["open"] = opened + [e for e in disk.get("open") or [] if (e[0], e[1], e[3]) not in seen][:room]
        seqs = [q for q in (mine.get("last_seq"), disk.get("last_seq")) if q is not None]
        out["last_seq"] = max(seqs) if seqs else None
    return out, bool(extra)


def _ack_ident(a: dict) -> tuple:
    return (a.get("pci"), a.get("xid"), round(float(a.get("time") or 0), 3))


def read_boot_id(procfs: str) -> str:
    """The kernel's boot id (<procfs>/sys/kernel/random/boot_id); '' when unreadable."""
    try:
        raw = read_state_file(Path(procfs, "sys/kernel/random/boot_id"), 4096)
        return raw.decode("ascii", "replace").strip()
    except OSError:
        return ""


def file_identity(st: os.stat_result) -> tuple:
    """What tells one version of a file from another without reading it."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def identity_on_disk(path: Path) -> tuple | None:
    """The file_identity of what is at `path` now (not following a symlink); None when nothing."""
    try:
        return file_identity(os.lstat(path))
    except OSError:
        return None


def encodable(s: str) -> str:
    """`s` as UTF-8 can encode it (a path's undecodable bytes, held as lone surrogates, replaced)."""
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def set_aside(path: Path, keep: int) -> Path:
    """Rename a corrupt state file to `<name>.corrupt-<UTC time>[.n]` for a human, keeping the
    newest `keep` of them. Raises OSError when it cannot be renamed."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = next(p for n in range(1000) if not (p := path.with_name(
        f"{path.name}.corrupt-{stamp}" + (f".{n}" if n else ""))).exists())
    os.replace(path, aside)
    for p in sorted(path.parent.glob(f"{path.name}.corrupt*"))[:-keep]:
        with contextlib.suppress(OSError):
            p.unlink()
    return aside


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

    def __init__(self, state_dir: str, boot_id: str, kmsg: str = "", read_only: bool = False) -> None:
        self.kmsg = encodable(kmsg)  # the kernel log the counts came from; a state of another log is not ours
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_NAME
        self.boot_id = boot_id
        # read_only (`check`): a corrupt file is reported but left in place for the daemon, which
        # sets it aside and records the recovery.
        self.read_only = read_only
        self.status = StateStatus()
        # corrupt state files set aside this boot: read from the file, plus those set aside here
        self.recoveries = 0
        # The simulated node: runs with other scenario flags read other kernel logs (their counts
        # are kept apart) of the same node, whose acknowledgements must not be lost.
        self.shared_acks = False
        self.foreign: dict | None = None
        # Set once the caller holds what the file held and writes it back (the daemon once it
        # runs): a corrupt file set aside from then on loses nothing, so it is no recovery.
        self.holds = False
        self._ident: tuple | None = None  # the file as we last read or wrote it (file_identity)
        self._written: tuple | None = None  # the file as we last wrote it
        self._behind = False  # what is on disk is not what we hold: the next flush writes
        self._bad: tuple | None = None  # a file found corrupt that could not be set aside: not re-read
        self._logged: set[str] = set()
        self._stale = False  # the last write kept acks from disk the reader has not taken yet
        # The path is not a regular file (a FIFO, a link...): nothing is read from or written
        # to it for the rest of the run; counts are kept in memory (logged once, an error).
        self.disabled = False

    def _refuse(self, e: OSError) -> None:
        """The state path is not a regular file: log it once and carry on without persistence."""
        self.disabled = True
        self.status.ok, self.status.problem = False, "unreadable"
        self.status.read_errors += 1
        if "not_regular" not in self._logged:
            self._logged.add("not_regular")
            log.error("state file %s is %s: XID counts are not persisted (kept in memory only) until "
                      "it is removed and the exporter restarted", self.path, e.strerror)

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
            fd = open_regular(self.dir / (STATE_NAME + ".lock"), os.O_RDWR | os.O_CREAT, follow=False)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            if fd is not None:
                os.close(fd)
            fd = None  # a read-only state dir (or no regular lock file): go on without the lock
        try:
            yield
        finally:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def read(self) -> dict | None:
        """The state for this boot, or None (missing, corrupt, another boot)."""
        if self.disabled:
            return None
        try:
            ident = file_identity(os.lstat(self.path))  # a dangling symlink is a symlink, not missing
            if ident == self._bad:  # the same corrupt file as before: its verdict stands
                return None
            raw = read_state_file(self.path)
        except NotRegularFile as e:
            self._refuse(e)
            return None
        except FileNotFoundError:
            self.status.problem = "missing"
            return None
        except OSError as e:
            if e.errno == errno.EFBIG:  # beyond any state within the limits: corrupt
                self._corrupt(StateError(f"larger than {MAX_STATE_BYTES} bytes"), ident)
                return None
            self._problem("unreadable", f"cannot read: {e.strerror or e}", write=False)
            return None
        self._ident = ident
        try:
            data = json.loads(raw.decode("utf-8"))
            validate_state(data)  # every field, before anyone uses it
        except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError included
            self._corrupt(e, ident)
            return None
        if not self.boot_id:
            self.status.problem = "no_boot_id"
            return None
        if data.get("boot_id") != self.boot_id:
            self.status.problem = "other_boot"  # a new boot: start over from the kernel log
            self._behind = True
            return None
        self.recoveries = max(self.recoveries, data.get("recoveries", 0))
        if self.kmsg and data.get("kmsg") not in (None, self.kmsg):
            self.status.problem = "other_source"  # counts of another kernel log (a replay)
            self._behind = True
            if self.shared_acks:
                self.foreign = data  # its acknowledgements still apply (see shared_acks)
            return None
        return data

    def take_foreign(self) -> dict | None:
        """A state file of another kernel log of this node (shared_acks), whose acks apply."""
        foreign, self.foreign = self.foreign, None
        return foreign

    def _corrupt(self, e: Exception, ident: tuple) -> None:
        why = show(str(e) if isinstance(e, StateError) else f"{type(e).__name__}: {e}", 300)
        if self.read_only:
            self._bad = ident
            self._problem("corrupt", f"corrupt ({why}); left in place for the daemon", write=False)
            return
        try:
            aside = set_aside(self.path, CORRUPT_KEEP)
        except OSError as err:
            self._bad = ident  # not read again (16 MiB a scrape) until it changes
            self._problem("corrupt", f"corrupt ({why}) and cannot be set aside: {err.strerror or err}",
                          write=False)
            return
        self._behind = True  # what we hold goes back to disk at the next flush
        self.status.ok, self.status.problem = False, "corrupt"
        self.status.read_errors += 1
        if self.holds:  # the daemon holds every count the file held: nothing was lost
            log.error("state file %s: corrupt (%s); set aside as %s and written again from the counts "
                      "held in memory (nothing lost)", self.path, why, aside.name)
            return
        self.recoveries += 1
        # Always logged (not once per kind): each recovery may have lost counts.
        log.error("state file %s: corrupt (%s); set aside as %s. XID counts are rebuilt from the "
                  "kernel log: an XID recorded only in the old file (ring buffer wrapped since) is lost; "
                  "inspect %s (gpu_health_exporter_state_file_recoveries_total counts these)",
                  self.path, why, aside.name, aside)

    def changed_on_disk(self) -> bool:
        """True when someone else (ack) wrote the file since we last read or wrote it (or our last
        write kept acks from it that we have not read)."""
        if self._stale:
            return True
        now = identity_on_disk(self.path)
        return now is not None and now != self._ident and now != self._bad

    def behind(self) -> bool:
        """True when the file on disk is not the one we last wrote (set aside, removed, replaced,
        another boot's, written by `ack`): the holder writes what it holds back."""
        return not self.disabled and (self._behind or identity_on_disk(self.path) != self._written)

    def read_news(self) -> dict | None:
        """The file's content when it changed since we last read it (see changed_on_disk)."""
        if not self.changed_on_disk():
            return None
        with self.locked():
            data = self.read()
        self._stale = False
        return data

    def write(self, state: dict | XidStore, merge_counts: bool = False) -> bool:
        """Write a state document (a snapshot: XidStore.to_state() plus the identities; a store
        is snapshotted here), merged with what is on disk: acks written by `ack` (counts too
        with merge_counts) and a foreign file's acks (shared_acks). Atomic; changes no store."""
        if self.disabled:
            return False
        doc = state if isinstance(state, dict) else state.to_state(self.boot_id)
        with self.locked():
            on_disk = self.read()
            if self.disabled:
                return False
            data, extra = merge_docs(doc, on_disk, counts=merge_counts)
            if self.foreign is not None:
                data, more = merge_docs(data, self.foreign)
                extra = extra or more
            data = {**data, "boot_id": self.boot_id, "kmsg": self.kmsg, "recoveries": self.recoveries}
            try:
                write_json_atomic(self.path, data)
                self._ident = self._written = identity_on_disk(self.path)
                self._behind = False
            except OSError as e:
                self._problem("unwritable", f"cannot write (counts kept in memory): {e.strerror or e}",
                              write=True)
                return False
            self._stale = self._stale or extra  # acks we wrote but have not taken: read_news has news
        self.status.ok = True
        self.status.problem = ""
        self.status.writes += 1
        return True
