"""Decoding of the NVLink XIDs (pure): XID 74 (Hopper NVLink4, P5) and XIDs 144-150 (Blackwell
NVLink5, P6), by NVIDIA's XID catalog.

The driver writes the fields NVIDIA's decode needs after the XID number:
- XID 144-150: `<UNIT> <Fatal|Nonfatal> XC<n> i<n> Link <nn> (<intrinfo> <errorStatus> ...)`, e.g.
  `NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000 0x00000000 ...)`; the row of
  NVIDIA's "XID 144-150 Decode" sheet (exporter/xid/nvlink_table.py) whose unit, error status and
  interrupt-info bit pattern match gives the resolution (IGNORE, RESET_GPU or XID_154_EVAL);
- XID 74: `NVLink: fatal error detected on link 6(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)`, seven
  registers of which the first, third, fourth and fifth are valid on Hopper; NVIDIA's
  WORKFLOW_NVLINK_ERR names what each of their bits means (below).

The result, `Decoded`, is an outcome (what NVIDIA's table asks for) and the severity the line says.
It travels as a small integer (`code`), the count key's suffix in the store and the state file
(`149/9`), so the state file's format is unchanged and every event keeps its own decode.
The tier each decode lands in is the policy's business (exporter/xid/policy.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from exporter.xid.nvlink_table import ROWS

NVLINK4_XID = 74
NVLINK5_XIDS = frozenset(range(144, 151))
DECODED_XIDS = frozenset({NVLINK4_XID} | NVLINK5_XIDS)

# What NVIDIA's decode asks for. `ticket`: no action now, report it if it repeats (counted and
# ticketed by its rate); `xid154`: follow the recovery action of the XID 154 the driver logs with it.
OUTCOMES = ("undecoded", "ignore", "ticket", "xid154", "reset", "reboot")
SEVERITIES = ("", "fatal", "nonfatal")  # "": the line says neither
_RESOLUTION = {"IGNORE": "ignore", "RESET_GPU": "reset", "XID_154_EVAL": "xid154", "RESTART_BM": "reboot"}


@dataclass(frozen=True, slots=True)
class Decoded:
    outcome: str  # one of OUTCOMES
    severity: str  # one of SEVERITIES
    unit: str = ""  # the unit the line names (144-150), for the log; not part of `code`
    link: int | None = None

    @property
    def code(self) -> int:
        return OUTCOMES.index(self.outcome) * 4 + SEVERITIES.index(self.severity)

    @property
    def decoded(self) -> bool:
        return self.outcome != "undecoded"


def from_code(code: int) -> Decoded | None:
    """The decode a count key's suffix stands for (None: not a decode code)."""
    o, s = divmod(code, 4)
    if not 0 <= o < len(OUTCOMES) or s >= len(SEVERITIES):
        return None
    return Decoded(OUTCOMES[o], SEVERITIES[s])


# Any spacing, either order of the fields the driver has written; `Non-fatal`, `Nonfatal` and
# `NonFatal` alike.
_SEVERITY_RE = re.compile(r"(?<![A-Za-z])(non[- ]?fatal|fatal)(?![A-Za-z])", re.IGNORECASE)
_LINK_RE = re.compile(r"(?<![A-Za-z])link\s*#?\s*(-?\d{1,3})(?!\d)", re.IGNORECASE)
_HEXES_RE = re.compile(r"\(\s*(0x[0-9a-fA-F]{1,8}(?:[\s,]+0x[0-9a-fA-F]{1,8})*)")
_HEX_RE = re.compile(r"0x([0-9a-fA-F]{1,8})")
_UNIT_RE = re.compile(
    r"(?<![A-Za-z0-9_/])([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*(?:/[A-Z][A-Z0-9_]*)*)(?![A-Za-z0-9_/])")
_NOT_UNITS = re.compile(r"XC\d|NVLINK|NVRM|PCI|GPU|I\d+")


def severity_of(text: str) -> str:
    m = _SEVERITY_RE.search(text)
    if m is None:
        return ""
    return "fatal" if m.group(1).lower() == "fatal" else "nonfatal"


def registers(text: str) -> list[int]:
    """The hex values in the line's parenthesised list (empty when there is none)."""
    m = _HEXES_RE.search(text)
    return [int(h, 16) for h in _HEX_RE.findall(m.group(1))] if m else []


def link_of(text: str) -> int | None:
    m = _LINK_RE.search(text)
    return int(m.group(1)) if m else None


def unit_of(text: str) -> str:
    """The NVLink5 unit mnemonic the line names (`NETIR_LINK_EVT`, `RLW_RXPIPE`), "" when none."""
    for m in _UNIT_RE.finditer(text.split("(", 1)[0]):
        if not _NOT_UNITS.fullmatch(m.group(1)):
            return m.group(1)
    return ""


def decode(xid: int, text: str) -> Decoded | None:
    """The decode of an NVLink XID's text (None for an XID that has no decode table)."""
    if xid == NVLINK4_XID:
        return Decoded(decode_74(registers(text)), severity_of(text), link=link_of(text))
    if xid in NVLINK5_XIDS:
        unit = unit_of(text)
        regs = registers(text)
        outcome = decode_nvlink5(xid, unit, regs[0], regs[1]) if len(regs) >= 2 else "undecoded"
        return Decoded(outcome, severity_of(text), unit, link_of(text))
    return None


# -- XID 144-150 ------------------------------------------------------------------------------------
def _mask_value(pattern: str) -> tuple[int, int]:
    """(care mask, value) of a 32-character pattern, bit 31 first."""
    mask = value = 0
    for i, ch in enumerate(pattern):
        bit = 1 << (31 - i)
        if ch in "01":
            mask |= bit
            if ch == "1":
                value |= bit
    return mask, value


@dataclass(frozen=True, slots=True)
class _Rule:
    units: frozenset[str]
    patterns: tuple[tuple[int, int], ...]
    status: int
    outcome: str


@cache
def _rules(xid: int) -> tuple[_Rule, ...]:
    return tuple(
        _Rule(frozenset(u.strip().upper() for u in unit.split("/")),
              tuple(_mask_value(p) for p in (v1, v2) if len(p) == 32), status,
              _RESOLUTION.get(resolution, "undecoded"))
        for x, unit, v1, v2, status, resolution, _severity, _inv in ROWS if x == xid)


_RANK = {o: i for i, o in enumerate(OUTCOMES)}  # mildest first; undecoded below them all


def decode_nvlink5(xid: int, unit: str, intrinfo: int, status: int) -> str:
    """NVIDIA's resolution for one NVLink5 event: the rows whose error status and interrupt-info
    pattern match (and whose unit does, when the line names one). Rows that disagree: the most
    severe (never a milder answer than the table allows). No row: `undecoded`."""
    parts = {u for u in unit.upper().split("/") if u}  # the line may name a unit and its sub-unit
    found = [r.outcome for r in _rules(xid)
             if r.status == status and (not parts or parts & r.units)
             and any(intrinfo & mask == value for mask, value in r.patterns)]
    return max(found, key=_RANK.__getitem__) if found else "undecoded"


# -- XID 74 -----------------------------------------------------------------------------------------
# NVIDIA's WORKFLOW_NVLINK_ERR (XID catalog; quoted in NVIDIA/NVSentinel issue #364 and design
# 022-workflow-nvlink-err.md), by register index (0-based) -> {bit: outcome}:
# - register 0: bits 0, 23, 30 "can be safely ignored"; 1, 20 sympathetic (follow the other
#   XIDs; report if solo); 4, 5 ECC/parity (report if more than 2 on the same link); 8, 9, 12,
#   16, 17, 24, 28 possibly hardware (check and reseat the link, run diagnostics); 21, 22 marginal
#   signal integrity (check the link, field diagnostics); 27, 29 report if repeated;
# - register 2: 0, 1, 2, 6 ECC/parity; 13 not expected in production; 16-19 report if repeated;
# - register 3: 16, 17 sympathetic; 18 sympathetic "though a reset of the fabric is required";
# - register 4: 18, 19, 21, 22, 24, 25, 27, 28 ECC/parity; 20, 23, 26, 29 an ECC threshold
#   exceeded with no uncorrectable error: "continue operation".
# Registers 1, 5 and 6 are not valid for decoding. The link-down classes (hardware, signal
# integrity, fabric reset) map to reset, the report-if-repeated ones to ticket, the ignorable ones
# to ignore. A bit the workflow does not list ("report a bug") leaves the line undecoded.
def _bits(outcome: str, *bits: int) -> dict[int, str]:
    return dict.fromkeys(bits, outcome)


XID74_BITS: dict[int, dict[int, str]] = {
    0: {**_bits("ignore", 0, 23, 30), **_bits("ticket", 1, 20, 4, 5, 27, 29),
        **_bits("reset", 8, 9, 12, 16, 17, 24, 28, 21, 22)},
    2: _bits("ticket", 0, 1, 2, 6, 13, 16, 17, 18, 19),
    3: {**_bits("ticket", 16, 17), **_bits("reset", 18)},
    4: {**_bits("ticket", 18, 19, 21, 22, 24, 25, 27, 28), **_bits("ignore", 20, 23, 26, 29)},
}


def decode_74(regs: list[int]) -> str:
    """NVIDIA's resolution for one XID 74's registers: the most severe of its bits' classes; a
    line without its registers, with none of the valid ones set, or with a bit the workflow does
    not list is `undecoded`."""
    if len(regs) < 5:
        return "undecoded"
    seen: set[str] = set()
    for index, table in XID74_BITS.items():
        value = regs[index]
        for bit in range(32):
            if value >> bit & 1:
                seen.add(table.get(bit, "undecoded"))
    if not seen:
        return "undecoded"
    if "reset" in seen:
        return "reset"  # the link is down whatever else is set
    if "undecoded" in seen:
        return "undecoded"
    return max(seen, key=_RANK.__getitem__)
