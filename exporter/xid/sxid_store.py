"""NVSwitch SXid counts since boot, one count per report, kept across restarts.

Counts are per (switch PCI key, SXid, severity): severity is part of the key because the same
code can be reported fatal or non-fatal. Each report line is one count (continuation lines are
never reports, see exporter.xid.sxid). Across restarts the counts come back from the `sxid`
section of the state document (exporter.xid.persistence), together with the last kernel-log
sequence number it covers, so records still in the ring buffer are not counted twice. Up to
version 1 they were a file of their own, `sxid-state.json`, which is migrated when read.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from exporter.state import versions
from exporter.state.values import (
    MAX_COUNT,
    MAX_SEQ,
    StateError,
    bounded,
    envelope,
    integer,
    mapping,
    optional,
    pci_key,
    seconds,
    show,
)
from exporter.xid.store import OTHER
from exporter.xid.sxid import SEVERITIES

STATE_NAME = "sxid-state.json"
STATE_VERSION = versions.SXID.version  # what this exporter writes; older ones are migrated
MAX_SERIES = 256  # label cardinality guard: 4-6 switches, a few dozen codes ever seen
MAX_SWITCH = 63
# Switch PCI addresses with series of their own (an HGX board has 4, an NVL72 tray 2); reports
# from further addresses (a corrupted log) share pci_bus_id="other".
MAX_SWITCHES = 16
SXID_MIN, SXID_MAX = 10000, 99999  # the driver prints %05d; every defined code is >= 10000


@dataclass
class SxidCount:
    count: int = 0
    last_wall: float = 0.0  # unix time of the last report


class SxidStore:
    """Thread-safe counts and the switch index seen at each PCI address."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[tuple[str, int, str], SxidCount] = {}
        self.switches: dict[str, int] = {}  # PCI key -> nvidia-nvswitch<N> index
        self.dropped = 0
        self.version = 0

    def report(self, pci: str, switch: int, sxid: int, severity: str, wall: float) -> bool:
        """Count one report; False when the cardinality guard or a nonsense code refused it."""
        with self.lock:
            if not (SXID_MIN <= sxid <= SXID_MAX and severity in SEVERITIES and 0 <= switch <= MAX_SWITCH):
                self.dropped += 1
                return False
            if pci not in self.switches and len(self.switches) >= MAX_SWITCHES:
                pci = OTHER
            key = (pci, sxid, severity)
            c = self.counts.get(key)
            if c is None:
                if len(self.counts) >= MAX_SERIES:
                    self.dropped += 1
                    return False
                c = self.counts[key] = SxidCount()
            c.count += 1
            c.last_wall = max(c.last_wall, wall)
            if pci != OTHER:
                self.switches[pci] = switch
            self.version += 1
            return True

    def snapshot(self) -> dict[tuple[str, int, str], SxidCount]:
        with self.lock:
            return {k: SxidCount(c.count, c.last_wall) for k, c in self.counts.items()}

    def merge(self, switches: dict[str, int], counts: list[list[Any]]) -> None:
        """Take a validated document's switches and counts by the XID counts' rule (fold_counts):
        an address beyond MAX_SWITCHES is folded into OTHER (summed within the document), then
        each count takes the larger value, so what is known stays and nothing counts twice."""
        with self.lock:
            for p, n in switches.items():
                if p in self.switches or len(self.switches) < MAX_SWITCHES:
                    self.switches[p] = n
            loaded: dict[tuple[str, int, str], SxidCount] = {}
            for p, x, s, n, wall in counts:
                key = (p if p in self.switches else OTHER, x, s)  # beyond the limit: folded
                cur = loaded.get(key)
                loaded[key] = SxidCount(n, float(wall)) if cur is None else \
                    SxidCount(cur.count + n, max(cur.last_wall, float(wall)))
            for key, c in loaded.items():
                cur = self.counts.get(key)
                if cur is None or c.count > cur.count:
                    self.counts[key] = c
            self.version += 1  # what readers cached of the counts and switches is stale


def validate_state(st: Any) -> None:
    """Raise StateError naming the first field of an old `sxid-state.json` out of shape or range."""
    envelope(st, versions.SXID)
    validate_section(st)


def validate_section(st: Any) -> None:
    """Raise StateError naming the first field of an SXid section (the `sxid` key of the state
    document, or an old file's body) out of shape or range (exporter.state.values)."""
    mapping(st, "sxid")
    optional(st, "last_seq", lambda v, w: integer(v, w, 0, MAX_SEQ))
    counts = bounded(st.get("counts") or [], "counts", MAX_SERIES)
    for i, row in enumerate(counts):
        if not isinstance(row, list) or len(row) != 5:
            raise StateError(f"counts[{i}] is {show(row)}; expected [pci, sxid, severity, count, unix time]")
        pci_key(row[0], f"counts[{i}]", OTHER)
        integer(row[1], f"counts[{i}] SXid", SXID_MIN, SXID_MAX)
        if row[2] not in SEVERITIES:
            raise StateError(f"counts[{i}] severity is {show(row[2])}; expected one of "
                             + ", ".join(SEVERITIES))
        integer(row[3], f"counts[{i}] count", 0, MAX_COUNT)
        seconds(row[4], f"counts[{i}] unix time")
    switches = mapping(st.get("switches") or {}, "switches")
    if len(switches) > MAX_SERIES:
        raise StateError(f"switches: {len(switches)} entries; at most {MAX_SERIES} expected")
    for k, v in switches.items():
        integer(v, f"switches[{pci_key(k, 'switches')}]", 0, MAX_SWITCH)


class SxidDocument:
    """The SXid section of the state document (exporter.xid.persistence): SXid counts, switch
    indices and the kernel-log sequence number they cover. As a document of its own it is the
    old `sxid-state.json` (written up to this version 1), read once to migrate it."""

    name = STATE_NAME
    schema = versions.SXID
    validate = staticmethod(validate_state)
    section = staticmethod(validate_section)

    def dump(self, store: SxidStore, last_seq: int | None) -> dict[str, Any]:
        """The body as of now (a snapshot; changes nothing)."""
        with store.lock:
            return {"counts": [[p, x, s, c.count, round(c.last_wall, 3)]
                               for (p, x, s), c in store.counts.items()],
                    "switches": dict(store.switches), "last_seq": last_seq}

    def load(self, doc: dict[str, Any], store: SxidStore) -> int | None:
        """Take a validated document into `store`; returns its last_seq."""
        store.merge(doc.get("switches") or {}, doc.get("counts") or [])
        return doc.get("last_seq")


SXID_DOC = SxidDocument()

