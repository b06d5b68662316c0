"""Pure parsing of kernel-log messages into XID reports (no I/O, no clocks).

Variants handled (see docs/xid.md):
- `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=x, text` with or without pid=/name=
  (pid may be `'<unknown>'`), legacy without `PCI:` (`NVRM: Xid (0000:03:00): 14, ...`),
  MIG `NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, ...`, NVLink5 (`..., 149, NETIR_LINK_EVT Fatal ...`)
  and XID 74 (`..., 74, ..., NVLink: fatal error detected on link 6(0x10000, 0x0, ...)`), both
  decoded by NVIDIA's tables (exporter/xid/nvlink.py),
- XID 154 with its hex recovery-action code (`... to 0x2 (Node Reboot Required)`; R610 labels
  such as `0x2 (OS Reboot)`, `0x1 (PF FLR)` differ, so only the hex code is used),
- bus loss without an XID number, single line (`NVRM: GPU 0000:01:00.0: GPU has fallen off the
  bus.`) or spread over several records (`NVRM: The NVIDIA GPU 0000:b3:00.0` / `NVRM: (PCI ID:
  10de:26b5) installed in this system has` / `NVRM: fallen off the bus and is not responding to
  commands.`), reported as XID 79,
- the `NVRM: GPU at PCI:0000:00:06: GPU-<uuid>` line that maps a PCI address to a GPU UUID.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.nvml.session import pci_key as session_pci_key
from exporter.xid.catalog import valid_xid
from exporter.xid.nvlink import DECODED_XIDS, decode

BUS_LOSS_XID = 79
RECOVERY_ACTION_XID = 154

_PCI = r"[0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(" + _PCI + r")(?:\s+GPU-I:(\d+))?[^)]*\):\s*(\d+)(.*)$")
_PID_RE = re.compile(r",\s*pid=('?[^,']*'?)")
_NAME_RE = re.compile(r",\s*name=([^,]*)")
_ACTION_RE = re.compile(r"\bto\s+0x([0-9a-fA-F]+)")
_ANY_HEX_RE = re.compile(r"0x([0-9a-fA-F]+)")
_GPU_AT_RE = re.compile(r"NVRM: GPU at (?:PCI:)?(" + _PCI + r"):\s+(GPU-[0-9a-fA-F-]{1,92})(?![0-9a-fA-F-])")
# The bus-loss notices also come without the PCI domain (`NVRM: GPU 18:00.0: ...`, gpud's tests): domain 0.
_PCI_ANY = r"(?:[0-9a-fA-F]{1,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
_BUS_LOSS_ONE_RE = re.compile(r"NVRM: GPU (?:at PCI:)?(" + _PCI_ANY + r"):\s+GPU has fallen off the bus")
_BUS_LOSS_START_RE = re.compile(r"NVRM: The NVIDIA GPU (" + _PCI_ANY + r")(?![0-9a-fA-F:])")
_FALLEN = "fallen off the bus"


def pci_key(addr: str) -> str | None:
    """Canonical key for a PCI address in any form the kernel or NVML writes
    (`0000:3b:00`, `0000:3b:00.0`, `00000000:3B:00.0`): 8-digit domain, lowercase."""
    k = session_pci_key(addr)
    return None if k is None else f"{k[0]:08x}:{k[1]:02x}:{k[2]:02x}"


def pci_label(key: str) -> str:
    """NVML's pci_bus_id form (`00000000:3B:00.0`) for a canonical key."""
    return key.upper() + ".0"


@dataclass(frozen=True, slots=True)
class XidReport:
    """One kernel-log line reporting an XID (or a bus loss, reported as XID 79)."""

    pci: str  # canonical key (pci_key)
    xid: int
    pid: str | None = None
    name: str | None = None
    gpu_instance: int | None = None  # MIG GPU instance (GPU-I:NN)
    # XID 154: the recovery action it changed to; XIDs 74, 144-150: the decode's code
    # (exporter.xid.nvlink.Decoded.code)
    action: int | None = None
    text: str = ""
    form: str = "xid"  # xid | bus_loss | bus_loss_multiline


@dataclass(frozen=True, slots=True)
class GpuAt:
    """`NVRM: GPU at PCI:...: GPU-<uuid>`: which GPU sits at a PCI address."""

    pci: str
    uuid: str


@dataclass(frozen=True, slots=True)
class BusLossStart:
    """First record of the multi-line bus-loss report; the rest arrives in later records."""

    pci: str
    complete: bool  # the whole text was in this one record


def parse_xid(message: str) -> XidReport | None:
    m = _XID_RE.search(message)
    if not m:
        return None
    key = pci_key(m.group(1))
    if key is None:
        return None
    xid = int(m.group(3)) if len(m.group(3)) <= 3 else 0
    if not valid_xid(xid):
        return None  # not an XID the driver writes: a corrupted line
    rest = m.group(4)
    pid = name = None
    pm = _PID_RE.match(rest)
    if pm:
        pid = pm.group(1).strip("'")
        rest = rest[pm.end():]
        nm = _NAME_RE.match(rest)
        if nm:
            name = nm.group(1).strip()
            rest = rest[nm.end():]
    text = rest.lstrip(", ").strip()
    action = None
    if xid == RECOVERY_ACTION_XID:  # the code after "to", else the line's last hex code
        code = _ACTION_RE.findall(text)[:1] or _ANY_HEX_RE.findall(text)[-1:]
        if code:
            action = int(code[0], 16)
    elif xid in DECODED_XIDS:  # NVLink: the decode by NVIDIA's table (exporter/xid/nvlink.py)
        decoded = decode(xid, text)
        action = decoded.code if decoded is not None else None
    gi = int(m.group(2)) if m.group(2) else None
    return XidReport(key, xid, pid or None, name or None, gi, action, text[:200])


def xid_header(message: str) -> str:
    """The "NVRM: Xid (PCI:...): N" a readable XID line starts with ("" when it does not start with
    one): a line with the same header and no further digit after it is the same GPU and XID."""
    m = _XID_RE.search(message)
    if m is None or m.start() != 0 or parse_xid(message) is None:
        return ""
    return message[:m.end(3)]


def parse_message(message: str) -> XidReport | GpuAt | BusLossStart | None:
    """Classify one kernel message. Cheap for the common case (no `NVRM`)."""
    if "NVRM" not in message:
        return None
    if "Xid" in message:
        return parse_xid(message)
    m = _GPU_AT_RE.search(message)
    if m:
        key = pci_key(m.group(1))
        return GpuAt(key, m.group(2)) if key else None
    m = _BUS_LOSS_ONE_RE.search(message)
    if m:
        key = pci_key(m.group(1))
        if key is None:
            return None
        return XidReport(key, BUS_LOSS_XID, text="GPU has fallen off the bus", form="bus_loss")
    m = _BUS_LOSS_START_RE.search(message)
    if m:
        key = pci_key(m.group(1))
        return BusLossStart(key, _FALLEN in message) if key else None
    return None


class KernelLogParser:
    """Turns a stream of kernel messages into XID reports and PCI->UUID mappings.

    The only state is the pending multi-line bus-loss report: `The NVIDIA GPU <addr>` followed,
    within `max_lines` NVRM records, by `fallen off the bus`. Memory is constant.
    """

    def __init__(self, max_lines: int = 4) -> None:
        self.max_lines = max_lines
        self._pending: str | None = None
        self._pending_left = 0
        # Fast path for floods: the previous XID line's header ("NVRM: Xid (PCI:...): 13") and report.
        # A line with the same header is the same GPU and XID; only those matter for counting.
        self._header = ""
        self._report: XidReport | None = None

    def feed(self, message: str) -> XidReport | GpuAt | None:
        if "NVRM" not in message:
            return None
        h = self._header
        if h and self._pending is None and message.startswith(h) and \
                (len(message) == len(h) or not message[len(h)].isdigit()):
            return self._report
        parsed = parse_message(message)
        # XID 154 and the NVLink XIDs carry a code of their own in each line: never the fast path
        if isinstance(parsed, XidReport) and parsed.form == "xid" and parsed.action is None and \
                parsed.xid != RECOVERY_ACTION_XID and parsed.xid not in DECODED_XIDS:
            m = _XID_RE.search(message)
            if m is not None and m.start() == 0:
                self._header, self._report = message[:m.end(3)], parsed
        elif parsed is not None:
            self._header = ""
        if isinstance(parsed, BusLossStart):
            if parsed.complete:
                self._pending = None
                return XidReport(parsed.pci, BUS_LOSS_XID, text="GPU has fallen off the bus",
                                 form="bus_loss_multiline")
            self._pending, self._pending_left = parsed.pci, self.max_lines
            return None
        if parsed is None and self._pending is not None:
            if _FALLEN in message:
                pci, self._pending = self._pending, None
                return XidReport(pci, BUS_LOSS_XID, text="GPU has fallen off the bus",
                                 form="bus_loss_multiline")
            self._pending_left -= 1
            if self._pending_left <= 0:
                self._pending = None
            return None
        return parsed
