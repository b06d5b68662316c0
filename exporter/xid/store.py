"""Event counts since boot, one count per event, and the state documents that keep them across
restarts. One store counts one catalog's events (EventCatalog): XIDs (XID_EVENTS, here) or NVSwitch
SXids (exporter.xid.sxid_state.SXID_EVENTS); what follows is the XID store's rule, an SXid store
counts every report (no merge window, exporter.xid.sxid).

Counting rule (see docs/xid.md): every report of the same XID on the same GPU (PCI address)
within `window_s` seconds (kernel clock) of the first report of an event is that event, whatever
source it came from and in whichever order the sources deliver it. So an NVML event and the
kernel-log line of the same XID count once, an XID 13 flood of one line per SM counts once, and
a bus loss reported by both an `Xid ... 79` line and a `fallen off the bus` line counts once.
Memory is bounded: at most a few open events per (GPU, XID) are remembered, older ones pruned.

State file (exporter.state.file reads and writes it): JSON in `state_dir`, keyed by the
boot id, written atomically under an advisory lock shared with `ack`. It holds the counts, the
last kernel-log sequence number processed (records up to it are not counted again
after a restart, even when the ring buffer still holds them), the open events (so a flood that
spans a restart is not counted twice), the PCI->GPU identities seen, and the acknowledgements.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporter.state import file as state_file
from exporter.state import versions
from exporter.state.values import (  # noqa: F401 - StateError, MAX_COUNT: re-exported
    MAX_COUNT,
    MAX_INDEX,
    MAX_UUID_CHARS,
    StateError,
    bounded,
    envelope,
    integer,
    mapping,
    optional,
    pci_key,
    seconds,
    sequence,
    show,
    text,
)
from exporter.xid.catalog import XID_MAX, XID_MIN, lookup, valid_xid
from exporter.xid.identities import MAX_IDENTITIES, GpuIdentities, Identity  # noqa: F401 - re-exported
from exporter.xid.nvlink import DECODED_XIDS

STATE_NAME = "xid-state.json"
ACKS_NAME = "xid-acks.json"
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
MAX_ACTION = 255
MAX_SOURCES, MAX_SOURCE_NAME_CHARS = 8, 32  # an open event's sources: kmsg, nvml


@dataclass(frozen=True)
class EventCatalog:
    """What an EventStore counts and its guards: one per family of driver reports."""

    valid: Callable[[int, int | str | None], bool]  # a code and qualifier the driver writes
    known: Callable[[int], bool]  # in the catalog: a listed device's are never refused by the guards
    window_s: float | None  # reports merged into one event within it; None: each report is an event
    decoded: frozenset[int] = frozenset()  # codes whose every line carries its own decode (_joins)
    max_keys_per_device: int = MAX_KEYS_PER_GPU
    max_series: int | None = None  # all devices together
    max_index: int | None = None  # the driver's device number printed with a report (nvswitch<N>)


XID_EVENTS = EventCatalog(
    lambda xid, action: valid_xid(xid) and (
        action is None or (isinstance(action, int) and 0 <= action <= MAX_ACTION)),
    lambda xid: lookup(xid) is not None, window_s=10.0, decoded=DECODED_XIDS)


def count_key(code: int, qualifier: int | str | None = None) -> str:
    """Key of a count within one device: the code, plus its qualifier (XID 154's recovery action
    code, an NVLink XID's decode, an SXid's severity)."""
    return f"{code}/{qualifier}" if qualifier is not None else str(code)


def code_of(key: str) -> int:
    return int(key.partition("/")[0])


def split_key(key: str) -> tuple[int, int | None]:
    """An XID count key's XID and action code."""
    xid, _, action = key.partition("/")
    return int(xid), (int(action) if action else None)


def _key(k: Any, where: str) -> str:
    """A count key: XID in range, optional recovery action code."""
    if not isinstance(k, str) or not re.fullmatch(r"\d{1,3}(/\d{1,3})?", k):
        raise StateError(f"{where}: count key {show(k)} is not XID[/ACTION]")
    xid, action = split_key(k)
    integer(xid, f"{where}: XID", XID_MIN, XID_MAX)
    if action is not None:
        integer(action, f"{where}: recovery action", 0, MAX_ACTION)
    return k


# The XID section's keys: at the state document's top level, where version 1 had them.
SECTION_KEYS = ("counts", "open", "gpus", "acks", "last_seq")


def validate_section(st: dict[str, Any]) -> None:
    """Raise StateError naming the first field of the state document's XID section (SECTION_KEYS)
    that is out of shape or range: every field the exporter reads (docs/xid.md, "What a state file
    must hold"). Numbers are integers or finite times in range, strings bounded and encodable, and
    each acknowledgement is of counts the section holds (its baseline is never above the count it
    acknowledges). The envelope is the state document's (exporter.xid.persistence.STATE_DOC)."""
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
        optional(ident, "uuid", lambda v, w: text(v, w, MAX_UUID_CHARS), f"gpus[{p}].")
        optional(ident, "index", lambda v, w: integer(v, w, 0, MAX_INDEX), f"gpus[{p}].")
    for i, a in enumerate(sequence(st.get("acks") or [], "acks")):
        _validate_ack(mapping(a, f"acks[{i}]"), f"acks[{i}]", counts)


def _validate_ack(a: dict[str, Any], where: str, counts: dict[str, Any] | None) -> None:
    """An acknowledgement; its baseline within `counts` (a state document's), or MAX_COUNT in the
    acks file, which holds no counts."""
    pci = pci_key(a.get("pci"), f"{where}.pci", OTHER)
    optional(a, "index", lambda v, w: integer(v, w, 0, MAX_INDEX), f"{where}.")
    optional(a, "xid", lambda v, w: integer(v, w, XID_MIN, XID_MAX), f"{where}.")
    optional(a, "uuid", lambda v, w: text(v, w, MAX_UUID_CHARS), f"{where}.")
    seconds(a.get("time"), f"{where}.time")
    optional(a, "mono", seconds, f"{where}.")
    if a.get("logged") not in (None, True, False):
        raise StateError(f"{where}.logged is {show(a['logged'])}; expected true or false")
    for k, v in mapping(a.get("baseline") or {}, f"{where}.baseline").items():
        _key(k, f"{where}.baseline")
        if a.get("xid") is not None and split_key(k)[0] != a["xid"]:
            raise StateError(f"{where}.baseline[{k}]: an acknowledgement of XID {a['xid']} has a "
                             f"baseline for another XID")
        # The counts at the ack are counts this file holds (at the address, or folded into the
        # shared bucket): a baseline above them would silence XIDs that were never acknowledged.
        integer(v, f"{where}.baseline[{k}]", 0, MAX_COUNT if counts is None else _held(counts, pci, k))


def _held(counts: dict[str, Any], pci: str, key: str) -> int:
    """The count a state document's `counts` hold for `key` at `pci` (or in the shared bucket)."""
    return max((c[0] for c in (counts.get(pci, {}).get(key), counts.get(OTHER, {}).get(key)) if c), default=0)


@dataclass
class Count:
    count: int = 0
    last_kernel_s: float = 0.0  # kernel clock (seconds since boot) of the last event
    last_wall: float = 0.0  # wall-clock time of the last event

    def to_json(self) -> list[float]:
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
    # time.monotonic() when taken (this boot's clock, as the file is this boot's): what clears
    # the attributions before it whatever the wall clock did; None in an ack written before
    mono: float | None = None

    def to_json(self) -> dict[str, Any]:
        d = {"pci": self.pci, "index": self.index, "uuid": self.uuid, "xid": self.xid,
             "time": self.time, "baseline": self.baseline}
        if self.mono is not None:
            d["mono"] = self.mono
        return {**d, "logged": True} if self.logged else d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Ack:
        return cls(str(d["pci"]), d.get("index"), str(d.get("uuid") or ""), d.get("xid"),
                   float(d["time"]), {str(k): int(v) for k, v in dict(d.get("baseline") or {}).items()},
                   d.get("logged") is True, None if d.get("mono") is None else float(d["mono"]))

    def ident(self) -> tuple[str, int | None, float]:
        return (self.pci, self.xid, round(self.time, 3))


class EventStore:
    """One catalog's counts per (PCI key, count key), the dedupe ledger and the acks. Thread-safe.
    Knows nothing of NVML or the state file: the caller says whether an address is a device it
    lists (`listed`), and its document (XID_DOC, SXID_DOC) dumps a snapshot to write it.
    `window_s`: the merge window (default the catalog's)."""

    def __init__(self, catalog: EventCatalog, window_s: float | None = None) -> None:
        self.catalog = catalog
        self.window_s = catalog.window_s if window_s is None else window_s
        self.lock = threading.RLock()
        self.counts: dict[str, dict[str, Count]] = {}
        self.indices: dict[str, int] = {}  # PCI key -> the driver's device number (nvidia-nvswitch<N>)
        self.open: dict[tuple[str, int], deque[OpenEvent]] = {}
        self.acks: list[Ack] = []
        # Acks whose baseline is above the counts held: `ack` counted records not read here yet.
        # Each is added once the counts reach it (so a forged baseline never silences a GPU,
        # and the state file written always validates); until then it waits, bounded.
        self.waiting: list[Ack] = []
        self.unknown: set[str] = set()  # addresses with series of their own that were not listed
        self.reports: dict[str, int] = {}  # raw reports per source
        self.merged: dict[str, int] = {}  # reports that joined an existing event, per source
        self.dropped = 0  # new events refused by the cardinality guards
        self.version = 0  # bumps on every change worth writing (counts, acks)

    # -- counting --------------------------------------------------------------------------------
    def report(self, source: str, pci: str, code: int, kernel_s: float, wall: float | None,
               qualifier: int | str | None = None, wall_of: Callable[[float], float] | None = None,
               listed: bool = False, index: int | None = None) -> bool:
        """One report of a code. Returns True when it is a new event (counted; under OTHER when
        the address is beyond the guards), False when it belongs to an event already counted or
        a guard refused it.
        `wall` (or `wall_of(kernel_s)`, computed only for a new event) is the event's wall-clock
        time; `listed`: a device NVML lists sits at `pci` (its catalog codes are never refused by
        the guards); `index`: the driver's number for the device, kept per address."""
        cat = self.catalog
        with self.lock:
            self.reports[source] = self.reports.get(source, 0) + 1
            k = (pci, code)
            q = self.open.get(k)
            key = count_key(code, qualifier)
            if q is not None and self.window_s is not None:
                for ev in q:
                    if abs(kernel_s - ev.start_s) <= self.window_s and self._joins(ev, code, key):
                        ev.sources.add(source)
                        self.merged[source] = self.merged.get(source, 0) + 1
                        if ev.key != key and qualifier is not None:
                            self._rekey(pci, ev, key)
                        return False
            if not cat.valid(code, qualifier) or (
                    index is not None and not 0 <= index <= (cat.max_index or 0)):
                self.dropped += 1  # not a report the driver writes: a corrupted line or event
                return False
            pci = self._series_pci(pci, listed)
            if self._series_full(pci, key, code, listed):
                self.dropped += 1  # a garbage flood must not become unbounded series
                return False
            if self.window_s is not None:
                if q is None:
                    if len(self.open) >= MAX_KEYS:
                        self._prune(kernel_s, force=True)
                    q = self.open[k] = deque(maxlen=MAX_OPEN_PER_KEY)
                q.append(OpenEvent(kernel_s, key, {source}))
            if index is not None and pci != OTHER:
                self.indices[pci] = index
            c = self.counts.setdefault(pci, {}).setdefault(key, Count())
            c.count += 1
            if kernel_s >= c.last_kernel_s:
                c.last_kernel_s = kernel_s
                c.last_wall = wall if wall is not None else (wall_of(kernel_s) if wall_of else time.time())
            self.version += 1
            return True

    def _joins(self, ev: OpenEvent, code: int, key: str) -> bool:
        """Whether a report within the window is that open event. For the decoded NVLink XIDs
        (74, 144-150) each line carries its own decode: a line decoded otherwise is an event of its
        own (a Nonfatal line must not swallow a Fatal one), while a report without a decode (NVML's)
        joins any, and a decoded line joins the event NVML's report opened."""
        if code not in self.catalog.decoded or ev.key == key:
            return True
        return "/" not in key or "/" not in ev.key

    def _rekey(self, pci: str, ev: OpenEvent, key: str) -> None:
        """Move an event counted without its code (NVML's report was first: no NVLink decode, no
        XID 154 action) to the code its kernel line gives. An event counted with a code keeps it."""
        if "/" in ev.key:
            return
        where = pci if ev.key in self.counts.get(pci, {}) else OTHER
        per = self.counts.get(where, {})
        old = per.get(ev.key)
        if old is None or old.count < 1 or any(a.pci == where and ev.key in a.baseline for a in self.acks):
            return  # an ack's baseline holds the count: it stays where it is
        old.count -= 1
        if old.count == 0:
            del per[ev.key]
        c = per.setdefault(key, Count())
        c.count += 1
        if old.last_kernel_s >= c.last_kernel_s:
            c.last_kernel_s, c.last_wall = old.last_kernel_s, old.last_wall
        ev.key = key
        self.version += 1

    def _series_full(self, pci: str, key: str, code: int, listed: bool) -> bool:
        """A new series for `key` at `pci` would pass a cardinality guard (a listed device's
        catalog codes pass the per-device one)."""
        per_device = self.counts.get(pci) or {}
        if key in per_device:
            return False
        cat = self.catalog
        if len(per_device) >= cat.max_keys_per_device and not (listed and cat.known(code)):
            return True
        return cat.max_series is not None and sum(map(len, self.counts.values())) >= cat.max_series

    def counted_under(self, pci: str) -> str:
        """The PCI key `pci`'s events are counted under: its own, or OTHER beyond the guards."""
        with self.lock:
            return pci if pci in self.counts else OTHER

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
        if self.window_s is None:
            return
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

    def snapshot(self) -> dict[str, dict[str, Count]]:
        with self.lock:
            return {p: {k: Count(c.count, c.last_kernel_s, c.last_wall) for k, c in ks.items()}
                    for p, ks in self.counts.items()}

    def add_ack(self, ack: Ack) -> bool:
        """Add an acknowledgement; False when it is known already, or waits (see take_acks)."""
        with self.lock:
            known = next((a for a in self.acks if a.ident() == ack.ident()), None)
            if known is not None:
                known.logged = known.logged or ack.logged  # another daemon run logged it
                return False
            if not self._covered(ack):
                if all(a.ident() != ack.ident() for a in self.waiting):
                    self.waiting = [*self.waiting, ack][-MAX_ACKS:]
                return False
            self.acks.append(ack)
            if len(self.acks) > MAX_ACKS:  # the oldest go: the newest per GPU are the ones that matter
                self.acks.sort(key=lambda a: a.time)
                del self.acks[: len(self.acks) - MAX_ACKS]
            self.version += 1
            return True

    def _covered(self, ack: Ack) -> bool:
        """The counts held reach the ack's baseline (at its address, or in the shared bucket)."""
        def held(key: str) -> int:
            return max((c.count for c in (self.counts.get(ack.pci, {}).get(key),
                                          self.counts.get(OTHER, {}).get(key)) if c), default=0)
        return all(n <= held(k) for k, n in ack.baseline.items())

    def take_waiting(self) -> list[Ack]:
        """The waiting acks the counts reach now, added; those that were added."""
        with self.lock:
            waiting, self.waiting = self.waiting, []
            return [a for a in waiting if self.add_ack(a)]

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
                xid = code_of(key)
                base = max((a.baseline.get(key, 0) for a in self.acks
                            if a.pci == pci and (a.xid is None or a.xid == xid)), default=0)
                if c.count > base:
                    out[key] = c
            return out

    def merge(self, counts: dict[str, Any], opened: list[list[Any]], listed: Callable[[str], bool],
              indices: dict[str, int] | None = None) -> None:
        """Take a validated state document's `counts`, `open` events (same boot) and device
        `indices`: counts by fold_counts (what is known stays; merging the same document twice
        counts nothing twice), open events not known yet (so a flood spanning a restart is one
        event), the index of each address with counts of its own."""
        with self.lock:
            changed = fold_counts(self.counts, counts, listed, self.unknown, self.catalog)
            for p, n in (indices or {}).items():
                if p in self.counts and self.indices.get(p) != n:
                    self.indices[p] = n
                    changed = True
            if changed:
                self.version += 1
            for p, x, key, start_s, sources in opened:
                if (str(p), int(x)) not in self.open and len(self.open) >= MAX_KEYS:
                    continue
                q = self.open.setdefault((str(p), int(x)), deque(maxlen=MAX_OPEN_PER_KEY))
                if not any(ev.start_s == float(start_s) for ev in q):
                    q.append(OpenEvent(float(start_s), str(key), set(sources)))


def fold_counts(into: dict[str, dict[str, Count]], counts: dict[str, Any], listed: Callable[[str], bool],
                unknown: set[str], catalog: EventCatalog = XID_EVENTS) -> bool:
    """Merge a state document's `counts` into `into` by the one limit rule (docs/xid.md, "Limits"),
    never losing a count: an address gets counts of its own when `into` has them already, a GPU
    is at it (`listed`), or fewer than MAX_UNKNOWN_GPUS such addresses (`unknown`, updated) have
    them; any other address is folded into OTHER. Folded counts are summed within the document,
    then every count is merged by the larger value, so merging the same document twice does not
    count twice. Returns True when `into` changed."""
    bounded: dict[str, dict[str, Count]] = {}
    for p, ks in counts.items():
        p = str(p)
        if p != OTHER and p not in into and not listed(p):
            if p in unknown or len(unknown) < MAX_UNKNOWN_GPUS:
                unknown.add(p)
            else:
                p = OTHER
        mine = bounded.setdefault(p, {})
        for k, v in dict(ks).items():
            c, cur = Count.from_json(v), mine.get(k)
            if cur is not None:  # only OTHER gathers several addresses
                c = Count(cur.count + c.count, max(cur.last_kernel_s, c.last_kernel_s),
                          max(cur.last_wall, c.last_wall))
            elif len(mine) >= catalog.max_keys_per_device and not catalog.known(code_of(k)):
                continue
            mine[k] = c
    changed = False
    for p, ks in bounded.items():
        for k, c in ks.items():
            cur = into.get(p, {}).get(k)
            if cur is None or c.count > cur.count:
                into.setdefault(p, {})[k] = c
                changed = True
    return changed


def take_acks(store: EventStore, acks: list[dict[str, Any]]) -> list[Ack]:
    """A validated document's acks added to `store` (those its counts do not reach yet wait);
    those that were new."""
    return [ack for ack in map(Ack.from_json, acks) if store.add_ack(ack)]


class XidDocument:
    """The XID section of `xid-state.json`, the daemon's state document (exporter.xid.persistence.
    STATE_DOC, which checks it with validate_section): counts, open events, GPU identities, the
    acks it folded in and the kernel-log sequence number its counts cover."""

    def dump(self, store: EventStore, identities: GpuIdentities, last_seq: int | None) -> dict[str, Any]:
        """The body of the document as of now (a snapshot; changes nothing). The store holds only
        acks its counts reach (EventStore.add_ack), so the file written always validates."""
        with store.lock:
            counts = {p: {k: c.to_json() for k, c in ks.items()} for p, ks in store.counts.items()}
            opened = [[p, x, ev.key, round(ev.start_s, 6), sorted(ev.sources)]
                      for (p, x), q in store.open.items() for ev in q]
            acks = [a.to_json() for a in store.acks]
        return {"written": round(time.time(), 3), "counts": counts, "open": opened,
                "gpus": identities.to_state(), "acks": acks, "last_seq": last_seq}

    def load(self, doc: dict[str, Any], store: EventStore, identities: GpuIdentities) -> int | None:
        """Take a validated document into the identities and the store; returns its last_seq."""
        identities.load(doc.get("gpus") or {})
        store.merge(doc.get("counts") or {}, doc.get("open") or [], identities.is_listed)
        take_acks(store, doc.get("acks") or [])  # after the counts their baselines are of
        return doc.get("last_seq")


def validate_acks(doc: Any) -> None:
    """Raise StateError naming the first field of an acks document out of shape or range."""
    envelope(doc, versions.ACKS)
    for i, a in enumerate(bounded(doc.get("acks") or [], "acks", MAX_ACKS)):
        _validate_ack(mapping(a, f"acks[{i}]"), f"acks[{i}]", None)


class AcksDocument:
    """`xid-acks.json`, written by `ack` alone: the acknowledgements of this boot, which the daemon
    folds into its store (and its own document) when it reads the file. So each file has one
    writer of its counts, and nothing merges two writers' counts."""

    name = ACKS_NAME
    schema = versions.ACKS
    validate = staticmethod(validate_acks)

    def dump(self, acks: list[Ack]) -> dict[str, Any]:
        """The body: the newest MAX_ACKS of `acks`."""
        return {"acks": [a.to_json() for a in sorted(acks, key=lambda a: a.time)[-MAX_ACKS:]]}

    def load(self, doc: dict[str, Any], store: EventStore) -> list[Ack]:
        """Fold a validated document's acks into `store`; returns those that were new."""
        return take_acks(store, doc.get("acks") or [])


XID_DOC = XidDocument()
ACKS_DOC = AcksDocument()


class AcksFile(state_file.StateFile):
    """The acks file (`xid-acks.json`). Keyed by the boot and the kernel log as the XID state file
    is (the simulated node's is shared by its kernel logs: exporter.tools.simulate.acks).

    Its problems (unreadable, corrupt, a newer version's) are the XID state's: the daemon reports
    them with the XID state file's in gpu_health_exporter_state_file_ok and _errors_total, and
    `check` among its problems. One stays until a good acks file is read again (the next `ack`
    writes one) or the daemon restarts: the daemon never writes this file, so nothing else
    clears it, and an acknowledgement may have been lost with it."""

    def __init__(self, state_dir: str, boot_id: str, kmsg: str = "", read_only: bool = False) -> None:
        super().__init__(state_dir, boot_id, kmsg, read_only, doc=ACKS_DOC)

    def read(self) -> dict[str, Any] | None:
        data = super().read()
        if data is not None:  # a good file again: its earlier trouble is over
            self.status.ok, self.status.problem = True, ""
        return data

    def loss(self, newer: bool = False) -> str:
        """Acks are not counts: those the daemon already folded in stay (the XID state file keeps
        them); one recorded only in this file is not applied."""
        lost = "that file is not applied by this version" if newer else "the old file is lost"
        return ("acknowledgements the daemon already took stay (the XID state file keeps them); one "
                f"recorded only in {lost}: its GPU's XIDs drive its verdict again until it is "
                "acknowledged again (gpu-health-exporter ack)")
