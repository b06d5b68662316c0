"""Policy: which tier each XID lands in. Defaults below; the `xid.policy` config overrides them.

Tiers, most to least severe: replace, reboot, reset, nonfatal, application, ignore; `unknown` for
an XID that is in no tier (not in the catalog and not configured), so it stays visible. XID 154
without an explicit policy entry takes the tier of the recovery action it names (0x1 reset, 0x2
reboot). `nonfatal` is counted and ticketed by its rate (rules/xid.yml), never a node action.

The NVLink XIDs (74, 144-150) take the tier of their decode (exporter/xid/nvlink.py): a line that
says `Nonfatal` is `nonfatal`, whatever else it says; NVIDIA's IGNORE is `ignore`, RESET_GPU
`reset`, a report-if-repeated class or XID_154_EVAL (the XID 154 logged with it carries the
action) `nonfatal`; an undecodable line, or NVML's report without a line, keeps the code's own
(conservative) tier. The config overrides the decode per code (`reset: [149]`: every 149) or per
code and severity (`reboot: ["149/fatal"]`, `ignore: ["145/nonfatal"]`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from exporter.xid.nvlink import DECODED_XIDS, from_code

TIERS = ("replace", "reboot", "reset", "nonfatal", "application", "ignore")

DEFAULT_POLICY: dict[str, list[int]] = {
    # The set operators page on to replace the node: memory errors (row remap recorded/failed,
    # contained/uncontained uncorrectable). EC2 recommends replacing on repeated remapping. 54: the
    # board's auxiliary power is not connected (NVIDIA: CHECK_MECHANICALS; hands on the node).
    "replace": [54, 63, 64, 94, 95],
    # The GPU is unreachable (fallen off the bus) or the VM must restart: power cycle. 168: memory
    # capacity reduced by errors in the write-protected region (awslabs' health check reboots);
    # 173: the Grace-GPU C2C link failed (gpud reboots).
    "reboot": [79, 151, 160, 168, 173],
    # 74 and 144-150: undecodable events only; decoded ones follow NVIDIA's table (module docstring).
    "reset": [46, 48, 56, 57, 58, 61, 62, 65, 73, 74, 81, 109, 110, 119, 120, 122, 123, 136, 140,
              142, 143, 144, 145, 146, 147, 148, 149, 150, 155, 156, 158, 167, 169, 171, 172],
    # Counted, ticketed by its rate (rules/xid.yml GpuXidNonfatalRateHigh), never a node action: the
    # decoded NVLink events that say Nonfatal or that NVIDIA asks to report when they repeat.
    "nonfatal": [],
    # The job's fault, not the GPU's (NVIDIA: RESTART_APP, or sympathetic to another XID). 32 and 80
    # (push-buffer corruption / CRC mismatch) may come from the PCIe link, but NVIDIA's immediate
    # action is RESTART_APP: restart the job, no node action (a reset would be a false fatal).
    "application": [8, 11, 13, 25, 31, 32, 39, 40, 41, 43, 45, 60, 68, 69, 70, 71, 72, 75, 76, 77, 80, 82, 83,
                    84, 85, 86, 88, 89, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 126, 127, 128, 129,
                    130, 131, 132, 133, 134, 135, 137, 139, 159],
    "ignore": [14, 37, 38, 44, 66, 67, 92, 93, 106, 107, 108, 121, 141, 152, 153, 157, 161, 162, 163, 164,
               165],
}

# XID 154: recovery action code (NVML's field 230) -> tier, as the verdict reads the same value from
# NVML (exporter.xid.verdict.RECOVERY_REASON). 3 (drain P2P: drain the peer-to-peer work, then query
# again) and 5 (recover the IMEX domain) ask for no GPU reset: counted, never a node action; NVML's
# value keeps the GPU degraded while it stands.
ACTION_TIERS = {0: "ignore", 1: "reset", 2: "reboot", 3: "nonfatal", 4: "reset", 5: "nonfatal", 6: "reset",
                7: "reboot"}


def check_tiers(value: Any, tiers: tuple[str, ...], noun: str) -> str | None:
    """Config check of a policy {tier: [code, ...]}: known tiers, integer codes, no code in two
    tiers. Returns a description of what is expected, or None when fine."""
    if not isinstance(value, Mapping):
        return f"a mapping of tier to a list of {noun}s"
    from exporter.config import show  # bounded: the value may be anything a file holds

    seen: dict[int, str] = {}
    for tier, codes in value.items():
        if tier not in tiers:
            return f"tiers among {', '.join(tiers)} (got {show(tier)})"
        if not isinstance(codes, list):
            return f"a list of {noun} numbers under {tier!r} (got {type(codes).__name__} {show(codes)})"
        for i, x in enumerate(codes):
            if not isinstance(x, int) or isinstance(x, bool):
                return f"{noun} numbers under {tier!r} (item {i} is {type(x).__name__} {show(x)})"
            if not 0 < x < 100000:
                return f"{noun} numbers from 1 to 99999 under {tier!r} (item {i}, {show(x)}, is out of range)"
        for x in codes:
            if x in seen and seen[x] != tier:
                return f"each {noun} in one tier ({noun} {x} is under {seen[x]!r} and {tier!r})"
            seen[x] = tier
    return None


_SEVERITY_KEY = re.compile(r"(\d{1,3})/(fatal|nonfatal)")


def check_policy(value: Any) -> str | None:
    """Config check for `xid.policy`: XID numbers, and "CODE/fatal" or "CODE/nonfatal" for the
    NVLink XIDs NVIDIA's catalog decodes (74, 144-150)."""
    if isinstance(value, Mapping):
        plain: dict[Any, list[Any]] = {}
        for tier, codes in value.items():
            plain[tier] = codes
            if isinstance(codes, list) and any(isinstance(c, str) for c in codes):
                from exporter.config import show

                for i, c in enumerate(codes):
                    m = _SEVERITY_KEY.fullmatch(c) if isinstance(c, str) else None
                    if isinstance(c, str) and (m is None or int(m.group(1)) not in DECODED_XIDS):
                        return (f"XID numbers or \"XID/fatal\", \"XID/nonfatal\" for XIDs "
                                f"{', '.join(map(str, sorted(DECODED_XIDS)))} under {tier!r} "
                                f"(item {i} is {show(c)})")
                plain[tier] = [c for c in codes if not isinstance(c, str)]
        value = plain
    return check_tiers(value, TIERS, "XID")


# A decoded NVLink XID's outcome -> tier, where the line does not say Nonfatal (which is
# `nonfatal` whatever the outcome). `undecoded` is absent: it keeps the code's own tier.
OUTCOME_TIERS = {"ignore": "ignore", "ticket": "nonfatal", "xid154": "nonfatal", "reset": "reset",
                 "reboot": "reboot"}


class Policy:
    """Tier lookup. `overrides` moves the XIDs it lists (and, for the NVLink XIDs, "XID/severity"
    entries move that severity of them); the others keep their default tier."""

    def __init__(self, overrides: Mapping[str, list[int | str]] | None = None) -> None:
        self.tiers: dict[int, str] = {}
        for tier, xids in DEFAULT_POLICY.items():
            for x in xids:
                self.tiers[x] = tier
        self.explicit: set[int] = set()
        self.by_severity: dict[tuple[int, str], str] = {}
        for tier, entries in (overrides or {}).items():
            for entry in entries:
                if isinstance(entry, str):
                    code, _, severity = entry.partition("/")
                    self.by_severity[(int(code), severity)] = tier
                else:
                    self.tiers[entry] = tier
                    self.explicit.add(entry)

    def tier(self, xid: int, action: int | None = None) -> str:
        if xid == 154 and xid not in self.explicit:
            return ACTION_TIERS.get(action, "unknown") if action is not None else "reset"
        if xid in DECODED_XIDS and action is not None:
            return self.decoded_tier(xid, action)
        return self.tiers.get(xid, "unknown")

    def decoded_tier(self, xid: int, code: int) -> str:
        """The tier of an NVLink XID event by its decode (`code`, exporter.xid.nvlink)."""
        d = from_code(code)
        if d is None:
            return self.tiers.get(xid, "unknown")
        pinned = self.by_severity.get((xid, d.severity))
        if pinned is not None:
            return pinned
        if xid in self.explicit:
            return self.tiers[xid]
        if d.severity == "nonfatal":
            return "nonfatal"  # never a node action, decoded or not
        return OUTCOME_TIERS.get(d.outcome) or self.tiers.get(xid, "unknown")

    def undecoded(self, xid: int, action: int | None) -> bool:
        """An event of a decoded XID (74, 144-150) that NVIDIA's table could not decode: NVML's
        report without a kernel line, or a line whose fields match no row."""
        if xid not in DECODED_XIDS:
            return False
        d = from_code(action) if action is not None else None
        return d is None or not d.decoded
