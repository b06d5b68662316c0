"""`fi_info -p efa` to the EFA devices libfabric can open.

Each device shows as one or more blocks `provider: efa / fabric: ... / domain: rdmapXsY-rdm`
(and `-dgrm`, and again under fabric `efa-direct` on libfabric 2.x), so devices are the
distinct domain names less their endpoint suffix. With no EFA device fi_info prints
`fi_getinfo: -61 (No data available)` and exits non-zero: zero devices, not a tool failure.
"""

from __future__ import annotations

import re

DOMAIN = re.compile(r"^\s*(?:\[[^\]]*\]<std\w+>:)?\s*domain:\s*(\S+?)(?:-rdm|-dgrm)?\s*$")
PROVIDER = re.compile(r"provider:\s*efa\b")
NO_DATA = re.compile(r"fi_getinfo:\s*-?61\b|No data available")


def devices(text: str) -> set[str] | None:
    """The EFA devices in fi_info's output; None when it is neither a listing nor fi_info's
    "no such provider" answer (garbage: the check reports an error)."""
    found: set[str] = set()
    in_efa = False
    for line in text.splitlines():
        if "provider:" in line:
            in_efa = bool(PROVIDER.search(line))
            continue
        m = DOMAIN.match(line)
        if m and in_efa:
            found.add(m.group(1))
    if found:
        return found
    return set() if NO_DATA.search(text) else None
