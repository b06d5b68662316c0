"""Pure functions: sysfs file text -> numbers, PCI identity -> is it EFA, listings -> what to read."""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.efa.naming import DEVICE, LIFESPAN_FILE, PORT, lookup

AMAZON_VENDOR = 0x1D0F
# efa_main.c PCI table: EFA0..EFA3 (0xefa4 is being added in 2026; the driver link catches it).
EFA_DEVICE_IDS = frozenset({0xEFA0, 0xEFA1, 0xEFA2, 0xEFA3})
EFA_DRIVER = "efa"

_RATE = re.compile(r"^\s*(\d{1,9}(?:\.\d{1,9})?)\s*Gb/sec", re.ASCII)


U64_DIGITS = 20  # 2**64 - 1 has 20 digits; a longer "counter" is a bad read, not a number


def parse_counter(text: str | bytes) -> int:
    """A hw_counters file: one unsigned 64-bit decimal and a newline (sysfs_emit "%llu\\n")."""
    s = text.strip()
    if not (s.isascii() and s.isdigit()) or len(s) > U64_DIGITS:
        raise ValueError(counter_error(text))
    return int(s)


def counter_error(text: str | bytes) -> str:
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    return f"not an unsigned decimal counter: {text[:40]!r}"


def parse_lifespan_seconds(text: str) -> float:
    """`lifespan`: the stats cache lifetime in milliseconds ("%d\\n")."""
    s = text.strip()
    if not (s.isascii() and s.lstrip("-").isdigit()) or len(s) > 11:  # an int, as "%d" prints it
        raise ValueError(f"not a lifespan in milliseconds: {text[:40]!r}")
    return int(s) / 1000.0


def parse_rate_bytes_per_second(text: str) -> float:
    """`ports/<p>/rate`, e.g. "100 Gb/sec (4X EDR)" -> 1.25e10 (promtool wants bytes, not bits)."""
    m = _RATE.match(text)
    if not m:
        raise ValueError(f"not a port rate like '100 Gb/sec (4X EDR)': {text[:40]!r}")
    return float(m.group(1)) * 1e9 / 8


def parse_hex_id(text: str) -> int:
    """A PCI `vendor` or `device` file: "0x1d0f\\n"."""
    return int(text.strip(), 16)


def is_efa(vendor: int | None, device: int | None, driver: str | None) -> bool:
    """EFA by PCI identity, or by the bound driver's name (for device ids newer than this table)."""
    if vendor == AMAZON_VENDOR and device in EFA_DEVICE_IDS:
        return True
    return driver == EFA_DRIVER


@dataclass(frozen=True)
class FileRead:
    where: str  # PORT or DEVICE: the directory the file sits in
    port: str  # the port for PORT reads, "" for DEVICE reads
    file: str


def plan_reads(port_files: dict[str, list[str]], device_files: list[str]) -> list[FileRead]:
    """Which counter files to read, each once.

    Linux 5.15+ splits the counters between ports/<p>/hw_counters (hardware stats) and the
    device-level hw_counters (driver stats). Kernels 5.4-5.14 show one combined list in both
    places with the same values, so a device-level file whose name is already in a port
    directory is skipped (and a device-scoped name listed under several ports is read once).
    `lifespan` is read only from the ports (it sets the hardware stats' cache); the device-level
    one is the same setting for software counters.
    """
    out: list[FileRead] = []
    seen: set[str] = set()
    for port in sorted(port_files, key=port_key):
        for f in sorted(port_files[port]):
            if f in seen and f != LIFESPAN_FILE and lookup(f, PORT).scope == DEVICE:
                continue
            out.append(FileRead(PORT, port, f))
            seen.add(f)
    for f in sorted(device_files):
        if f not in seen and f != LIFESPAN_FILE:
            out.append(FileRead(DEVICE, "", f))
    return out


def port_key(p: str) -> tuple[int, str]:
    return (int(p), p) if p.isdigit() else (1 << 30, p)
