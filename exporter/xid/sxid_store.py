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

import errno
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.regular_file import NotRegularFile
from exporter.xid.state_values import StateError, integer, mapping, pci_key, seconds, sequence, show, text
from exporter.xid.store import (
    CORRUPT_KEEP,
    MAX_BOOT_ID_CHARS,
    MAX_COUNT,
    MAX_SEQ,
    MAX_SOURCE_CHARS,
    MAX_STATE_BYTES,
    OTHER,
    encodable,
    identity_on_disk,
    read_state_file,
    set_aside,
    write_json_atomic,
)
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


def validate_state(st: Any) -> None:
    """Raise StateError naming the first field of an SXid state document out of shape or range
    (the XID state file's rules, exporter.xid.state_values)."""
    if not isinstance(st, dict) or st.get("version") != STATE_VERSION:
        raise StateError(f"not a version-{STATE_VERSION} SXid state document")
    for key, check in (("boot_id", lambda v, w: text(v, w, MAX_BOOT_ID_CHARS)),
                       ("kmsg", lambda v, w: text(v, w, MAX_SOURCE_CHARS)),
                       ("last_seq", lambda v, w: integer(v, w, 0, MAX_SEQ))):
        if st.get(key) is not None:
            check(st[key], key)
    counts = sequence(st.get("counts") or [], "counts")
    if len(counts) > MAX_SERIES:
        raise StateError(f"counts: {len(counts)} entries; at most {MAX_SERIES} expected")
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


class SxidStateFile:
    """`sxid-state.json`: read for this boot and kernel log, written atomically. Never raises;
    `problem` says what went wrong last ("" when fine)."""

    def __init__(self, state_dir: str, boot_id: str, source: str) -> None:
        self.path = Path(state_dir) / STATE_NAME
        self.boot_id = boot_id
        self.source = encodable(source)
        self.problem = ""
        self.errors = 0
        self.disabled = False  # the path is not a regular file: not read nor written this run
        self._written: tuple | None = None  # the file as we last wrote it
        self._behind = False  # the file was set aside or is not ours: the next flush writes
        self.read_only = False  # `check`: a corrupt file is reported but left for the daemon

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
            if e.errno == errno.EFBIG:
                self._corrupt(f"larger than {MAX_STATE_BYTES} bytes")
            else:
                self._fail("unreadable", f"cannot read: {e.strerror or e}")
            return None
        try:
            st = json.loads(raw.decode("utf-8"))  # not UTF-8 is corrupt too, never a crash
            validate_state(st)
        except (ValueError, RecursionError) as e:
            self._corrupt(show(str(e), 300))
            return None
        if not self.boot_id or st.get("boot_id") != self.boot_id or st.get("kmsg") != self.source:
            self._behind = True
            return None  # another boot or another kernel log: start over
        self.problem = ""
        return st

    def _corrupt(self, why: str) -> None:
        """Set the file aside (SXids are counted from the kernel log again) for a human."""
        if self.read_only:
            self._fail("corrupt", f"corrupt, ignored ({why}); left in place for the daemon")
            return
        try:
            aside = set_aside(self.path, CORRUPT_KEEP)
        except OSError as err:
            self._fail("corrupt", f"corrupt, ignored ({why}) and cannot be set aside: {err.strerror or err}")
            return
        self._behind = True
        self.problem = "corrupt"
        self.errors += 1
        log.error("SXid state file %s: corrupt (%s); set aside as %s (SXids are counted from the kernel "
                  "log)", self.path, why, aside.name)

    def behind(self) -> bool:
        """True when the file on disk is not the one we last wrote (set aside, removed, replaced)."""
        return not self.disabled and (self._behind or identity_on_disk(self.path) != self._written)

    def write(self, store: SxidStore) -> bool:
        if self.disabled:
            return False
        data = store.to_state(self.boot_id, self.source)
        try:
            write_json_atomic(self.path, data)  # only the daemon writes it
            self._written, self._behind = identity_on_disk(self.path), False
        except OSError as e:
            self._fail("unwritable", f"cannot write (counts kept in memory): {e.strerror or e}")
            return False
        self.problem = ""
        return True
