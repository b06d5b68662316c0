"""NVSwitch SXid counts since boot, one count per report, kept across restarts.

Counts are per (switch PCI key, SXid, severity): severity is part of the key because the same
code can be reported fatal or non-fatal. Each report line is one count (continuation lines are
never reports, see exporter.xid.sxid). Across restarts the counts come back from
`sxid-state.json` in `state_dir` (same boot id and kernel log as the XID state file), together
with the last kernel-log sequence number it covers, so records still in the ring buffer are not
counted twice. A separate file from the XID state: SXids have their own code range and a state
file of an older exporter without SXids simply leaves them to be counted from the kernel log.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.regular_file import NotRegularFile
from exporter.xid.store import _PCI_KEY_RE, OTHER, read_state_file, write_json_atomic
from exporter.xid.sxid import SEVERITIES

log = logging.getLogger("exporter.xid.sxid")

STATE_NAME = "sxid-state.json"
STATE_VERSION = 1
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
    """Thread-safe counts, the switch index seen at each PCI address and the last record read."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[tuple[str, int, str], SxidCount] = {}
        self.switches: dict[str, int] = {}  # PCI key -> nvidia-nvswitch<N> index
        self.last_seq: int | None = None
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

    def to_state(self, boot_id: str, source: str) -> dict:
        with self.lock:
            return {"version": STATE_VERSION, "boot_id": boot_id, "kmsg": source, "last_seq": self.last_seq,
                    "counts": [[p, x, s, c.count, round(c.last_wall, 3)]
                               for (p, x, s), c in self.counts.items()],
                    "switches": dict(self.switches)}

    def load(self, st: dict) -> None:
        """Take a validated state document (validate_state first)."""
        with self.lock:
            for p, n in (st.get("switches") or {}).items():
                if p in self.switches or len(self.switches) < MAX_SWITCHES:
                    self.switches[p] = n
            loaded: dict[tuple[str, int, str], SxidCount] = {}
            for p, x, s, n, wall in st.get("counts") or []:
                key = (p if p in self.switches else OTHER, x, s)  # beyond the limit: folded
                cur = loaded.get(key)
                loaded[key] = SxidCount(n, float(wall)) if cur is None else \
                    SxidCount(cur.count + n, max(cur.last_wall, float(wall)))
            for key, c in loaded.items():
                cur = self.counts.get(key)
                if cur is None or c.count > cur.count:
                    self.counts[key] = c
            seq = st.get("last_seq")
            if seq is not None and (self.last_seq is None or seq > self.last_seq):
                self.last_seq = seq


def _is_int(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def validate_state(st: Any) -> None:
    """Raise ValueError naming the first field of an SXid state document out of shape."""
    if not isinstance(st, dict) or st.get("version") != STATE_VERSION:
        raise ValueError(f"not a version-{STATE_VERSION} SXid state document")
    if st.get("last_seq") is not None and not _is_int(st["last_seq"], 0, 2**63 - 1):
        raise ValueError(f"last_seq is {st['last_seq']!r}; expected a non-negative integer")
    counts = st.get("counts") or []
    if not isinstance(counts, list) or len(counts) > MAX_SERIES:
        raise ValueError(f"counts: expected a list of at most {MAX_SERIES} entries")
    for i, row in enumerate(counts):
        ok = isinstance(row, list) and len(row) == 5 and isinstance(row[0], str) \
            and (row[0] == OTHER or _PCI_KEY_RE.fullmatch(row[0]) is not None) \
            and _is_int(row[1], SXID_MIN, SXID_MAX) and row[2] in SEVERITIES and _is_int(row[3], 0, 10**9) \
            and isinstance(row[4], (int, float)) and not isinstance(row[4], bool) and row[4] >= 0
        if not ok:
            raise ValueError(f"counts[{i}] is {row!r}; expected [pci, sxid, severity, count, unix time]")
    switches = st.get("switches") or {}
    if not isinstance(switches, dict) or not all(isinstance(k, str) and _PCI_KEY_RE.fullmatch(k)
                                                 and _is_int(v, 0, MAX_SWITCH) for k, v in switches.items()):
        raise ValueError("switches: expected a mapping of PCI key to switch index")


class SxidStateFile:
    """`sxid-state.json`: read for this boot and kernel log, written atomically. Never raises;
    `problem` says what went wrong last ("" when fine)."""

    def __init__(self, state_dir: str, boot_id: str, source: str) -> None:
        self.path = Path(state_dir) / STATE_NAME
        self.boot_id = boot_id
        self.source = source
        self.problem = ""
        self.errors = 0
        self.disabled = False  # the path is not a regular file: not read nor written this run

    def _fail(self, kind: str, msg: str) -> None:
        if self.problem != kind:
            log.warning("SXid state file %s: %s", self.path, msg)
        self.problem = kind
        self.errors += 1

    def read(self) -> dict | None:
        if self.disabled:
            return None
        try:
            raw = read_state_file(self.path)
        except NotRegularFile as e:
            self.disabled = True
            log.error("SXid state file %s is %s: SXid counts are not persisted (kept in memory only)",
                      self.path, e.strerror)
            self.problem = "unreadable"
            self.errors += 1
            return None
        except FileNotFoundError:
            return None
        except OSError as e:
            self._fail("unreadable", f"cannot read: {e.strerror or e}")
            return None
        try:
            st = json.loads(raw.decode("utf-8"))  # not UTF-8 is corrupt too, never a crash
            validate_state(st)
        except (ValueError, RecursionError) as e:
            self._fail("corrupt", f"corrupt, ignored (SXids are counted from the kernel log): {e}")
            return None
        if not self.boot_id or st.get("boot_id") != self.boot_id or st.get("kmsg") != self.source:
            return None  # another boot or another kernel log: start over
        self.problem = ""
        return st

    def write(self, store: SxidStore) -> bool:
        if self.disabled:
            return False
        data = store.to_state(self.boot_id, self.source)
        try:
            write_json_atomic(self.path, data)  # only the daemon writes it
        except OSError as e:
            self._fail("unwritable", f"cannot write (counts kept in memory): {e.strerror or e}")
            return False
        self.problem = ""
        return True
