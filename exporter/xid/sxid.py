"""Pure parsing of NVSwitch SXid kernel-log messages (no I/O, no clocks).

Every SXid line comes from one driver macro (open-gpu-kernel-modules `NVSWITCH_PRINT_SXID`):

    nvidia-nvswitch<N>: SXid (PCI:<dddd>:<bb>:<dd>.<f>): <code %05d>, <body>

Bodies (docs/fabric.md lists them with examples):
- primary, per link: `Fatal|Non-fatal|Correctable, Link <NN> <desc>[ (First)]`,
- register-bus (PRI): `Fatal|Non-fatal, <desc>, instance=<i>, chiplet=<c>`,
- device level: `Fatal, <desc>` or free text without a severity token (`SOE HALTED`, `IO failure`),
- continuations of an error-log dump, repeating the code and address of the report they follow:
  `Severity <s> Engine instance <e> Sub-engine instance <s>`, `Data {0x..., ...}`, and the SOE
  halt dump `SOE HALT data[<i>] = 0x...`.

Only primary, PRI and device-level lines are reports; a continuation is never counted (counting
every line with `SXid ... NNNNN,` counts one event two to four times). The severity token on
the line is authoritative (the same code can be fatal or not, depending on containment); the
catalog is advice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.xid.parser import pci_key

SEVERITIES = ("fatal", "non_fatal", "correctable", "unknown")
_TOKEN = {"Fatal": "fatal", "Non-fatal": "non_fatal", "Non-Fatal": "non_fatal", "Correctable": "correctable"}

_SXID_RE = re.compile(
    r"nvidia-nvswitch(\d+): SXid \(PCI:([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\):"
    r"\s*(\d{1,6}),\s*(.*)$")
_LINK_RE = re.compile(r"^(Fatal|Non-fatal|Non-Fatal|Correctable), Link (\d+)\b\s*(.*?)(?: \(First\))?$")
_PRI_RE = re.compile(r"^(Fatal|Non-fatal|Non-Fatal), (.+), instance=(\d+), chiplet=(\d+)$")
_TOKEN_RE = re.compile(r"^(Fatal|Non-fatal|Non-Fatal|Correctable)(?:,\s*(.*))?$")
# A continuation is known by how it starts, whatever follows (`Data {...}p`, as one public log
# quotes it, is still the dump of the report before it, never a report of its own).
_CONTINUATION_RE = re.compile(r"^(?:Severity \d+ Engine instance\b|Data \{|.*\bdata\[\d+\] = )")


@dataclass(frozen=True, slots=True)
class SxidReport:
    """One NVSwitch error report (a primary, PRI or device-level line)."""

    switch: int  # the driver's nvswitch instance (nvidia-nvswitch<N>)
    pci: str  # canonical key of the switch's PCI address (exporter.xid.parser.pci_key)
    sxid: int
    severity: str  # one of SEVERITIES
    link: int | None = None  # NVSwitch port, for per-link errors
    text: str = ""
    form: str = "link"  # link | pri | device


@dataclass(frozen=True, slots=True)
class SxidContinuation:
    """A `Severity ...` or `Data {...}` line of the error-log dump following a report."""

    switch: int
    pci: str
    sxid: int


def parse_sxid(message: str) -> SxidReport | SxidContinuation | None:
    """Classify one kernel message; None when it is not an SXid line. Cheap when it is not."""
    if "SXid" not in message:
        return None
    m = _SXID_RE.search(message)
    if m is None:
        return None
    key = pci_key(m.group(2))
    if key is None:
        return None
    switch, code, body = int(m.group(1)), int(m.group(3)), m.group(4).strip()
    if _CONTINUATION_RE.match(body):
        return SxidContinuation(switch, key, code)
    lm = _LINK_RE.match(body)
    if lm:
        return SxidReport(switch, key, code, _TOKEN[lm.group(1)], int(lm.group(2)), lm.group(3)[:200])
    pm = _PRI_RE.match(body)
    if pm:
        return SxidReport(switch, key, code, _TOKEN[pm.group(1)], None, pm.group(2)[:200], "pri")
    tm = _TOKEN_RE.match(body)
    if tm:
        return SxidReport(switch, key, code, _TOKEN[tm.group(1)], None, (tm.group(2) or "")[:200], "device")
    return SxidReport(switch, key, code, "unknown", None, body[:200], "device")
