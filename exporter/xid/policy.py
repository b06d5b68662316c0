"""Policy: which tier each XID lands in. Defaults below; the `xid.policy` config overrides them.

Tiers, most to least severe: replace, reboot, reset, application, ignore; `unknown` for an XID
that is in no tier (not in the catalog and not configured), so it stays visible. XID 154 without
an explicit policy entry takes the tier of the recovery action it names (0x1 reset, 0x2 reboot).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TIERS = ("replace", "reboot", "reset", "application", "ignore")

DEFAULT_POLICY: dict[str, list[int]] = {
    # The set operators page on to replace the node: memory errors (row remap recorded/failed,
    # contained/uncontained uncorrectable). EC2 recommends replacing on repeated remapping.
    "replace": [63, 64, 94, 95],
    # The GPU is unreachable (fallen off the bus) or the VM must restart: power cycle.
    "reboot": [79, 151, 160],
    "reset": [32, 46, 48, 56, 57, 58, 61, 62, 65, 73, 74, 81, 109, 110, 119, 120, 122, 123, 136, 140,
              143, 144, 145, 146, 147, 148, 149, 150, 155, 156, 158, 171, 172],
    # The job's fault, not the GPU's.
    "application": [8, 13, 31, 43, 45, 68, 69, 80, 137],
    "ignore": [38, 92, 121, 157, 161],
}

# XID 154: recovery action code -> tier.
ACTION_TIERS = {0: "ignore", 1: "reset", 2: "reboot", 3: "reset", 4: "reset", 5: "reset", 6: "reset",
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


def check_policy(value: Any) -> str | None:
    """Config check for `xid.policy`."""
    return check_tiers(value, TIERS, "XID")


class Policy:
    """Tier lookup. `overrides` moves the XIDs it lists; the others keep their default tier."""

    def __init__(self, overrides: Mapping[str, list[int]] | None = None) -> None:
        self.tiers: dict[int, str] = {}
        for tier, xids in DEFAULT_POLICY.items():
            for x in xids:
                self.tiers[x] = tier
        self.explicit: set[int] = set()
        for tier, xids in (overrides or {}).items():
            for x in xids:
                self.tiers[x] = tier
                self.explicit.add(x)

    def tier(self, xid: int, action: int | None = None) -> str:
        if xid == 154 and xid not in self.explicit:
            return ACTION_TIERS.get(action, "unknown") if action is not None else "reset"
        return self.tiers.get(xid, "unknown")
