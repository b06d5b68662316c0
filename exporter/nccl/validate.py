"""Field checks shared by both parsers: a value becomes a label only through these."""

from __future__ import annotations

import ipaddress
import re

from exporter.nccl.model import MAX_DEV, MAX_PID, ReplyError

_VERSION = re.compile(r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})")


def host(v: object, where: str) -> str:
    """An IP address in its canonical form; "" for NCCL's "unknown"."""
    if v == "unknown":
        return ""
    if not isinstance(v, str) or len(v) > 45:
        raise ReplyError(f"{where}: host {v!r:.60} is not an IP address")
    try:
        return str(ipaddress.ip_address(v))
    except ValueError:
        raise ReplyError(f"{where}: host {v!r:.60} is not an IP address") from None


def pid(v: int, where: str) -> int:
    if v != -1 and not 0 < v <= MAX_PID:
        raise ReplyError(f"{where}: pid {v} out of range")
    return v


def dev(v: int, where: str) -> int:
    if not -1 <= v <= MAX_DEV:
        raise ReplyError(f"{where}: device {v} out of range")
    return v


def version(v: object, where: str) -> str:
    """X.Y.Z from NCCL's version string (a build suffix after it is dropped)."""
    m = _VERSION.match(v) if isinstance(v, str) and len(v) <= 64 else None
    if m is None:
        raise ReplyError(f"{where}: NCCL version {v!r:.60} is not X.Y.Z")
    return ".".join(str(int(x)) for x in m.groups())
