"""NVSwitch SXid counts: their event catalog and the state document's section that keeps them.

The counts are an EventStore of SXID_EVENTS (exporter.xid.store), per (switch PCI key,
`SXID/severity`): severity is part of the key because the same code can be reported fatal or
non-fatal. Each report line is one count, with no merge window (continuation lines are never
reports, see exporter.xid.sxid), and the store keeps the nvidia-nvswitch<N> number seen at each
address. Across restarts the counts come back from the `sxid` section of the state document
(exporter.xid.persistence), together with the last kernel-log sequence number it covers, so
records still in the ring buffer are not counted twice. Up to version 1 they were a file of
their own, `sxid-state.json`, which is migrated when read.
"""

from __future__ import annotations

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
from exporter.xid.store import MAX_UNKNOWN_GPUS, OTHER, Count, EventCatalog, EventStore, code_of, count_key
from exporter.xid.sxid import SEVERITIES
from exporter.xid.sxid_catalog import CATALOG

STATE_NAME = "sxid-state.json"
MAX_SERIES = 256  # label cardinality guard: 4-6 switches, a few dozen codes ever seen
MAX_SWITCH = 63
# Switch PCI addresses with series of their own (an HGX board has 4, an NVL72 tray 2); reports
# from further addresses (a corrupted log) share pci_bus_id="other": the store's bound on
# addresses no GPU is at (exporter.xid.store.MAX_UNKNOWN_GPUS).
MAX_SWITCHES = MAX_UNKNOWN_GPUS
SXID_MIN, SXID_MAX = 10000, 99999  # the driver prints %05d; every defined code is >= 10000


SXID_EVENTS = EventCatalog(
    lambda sxid, severity: SXID_MIN <= sxid <= SXID_MAX and severity in SEVERITIES,
    lambda sxid: sxid in CATALOG, window_s=None, max_keys_per_device=MAX_SERIES, max_series=MAX_SERIES,
    max_index=MAX_SWITCH)


def by_report(store: EventStore) -> dict[tuple[str, int, str], Count]:
    """An SXid store's counts keyed (switch PCI key, SXid, severity), in that order."""
    return {(p, code_of(k), k.partition("/")[2]): c
            for p, ks in store.snapshot().items() for k, c in ks.items()}


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

    def dump(self, store: EventStore, last_seq: int | None) -> dict[str, Any]:
        """The body as of now (a snapshot; changes nothing)."""
        with store.lock:  # counts and switches of one moment (the lock is reentrant)
            return {"counts": [[p, x, s, c.count, round(c.last_wall, 3)]
                               for (p, x, s), c in by_report(store).items()],
                    "switches": dict(store.indices), "last_seq": last_seq}

    def load(self, doc: dict[str, Any], store: EventStore) -> int | None:
        """Take a validated document into `store` (by the store's merge rule); returns its last_seq."""
        counts: dict[str, dict[str, list[float]]] = {}
        for p, x, s, n, wall in doc.get("counts") or []:
            row = counts.setdefault(p, {}).setdefault(count_key(x, s), [0, 0.0, 0.0])
            row[0], row[2] = row[0] + n, max(row[2], float(wall))  # a row twice (hand-edited): summed
        store.merge(counts, [], lambda p: False, doc.get("switches") or {})
        return doc.get("last_seq")


SXID_DOC = SxidDocument()

