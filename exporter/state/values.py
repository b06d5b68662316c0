"""The checks every value read from a state file passes (every document: XID, acks, SXid,
workload), as strict as the config's: the right type, in range, numbers finite and within sane
bounds, strings bounded and encodable (UTF-8 without lone surrogates, no control characters), so
that nothing read back can fail a scrape, a JSON dump or a date conversion later. A failed check
raises StateError naming the field; the file is then set aside (docs/xid.md, "What a state file
must hold").

One style for every document's validator: `envelope` checks the fields they share, then each
field is one call here with where it sits (`counts[3] count`), so every message names the key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from exporter.state.versions import Schema
from exporter.state.versions import StateError as StateError  # re-exported: the validators raise it

# A unix time or kernel uptime beyond this (year 2286) is no real time: time.gmtime and the
# exposition would overflow long before a value like 1e300.
MAX_TIME_S = 1e10
MAX_SEQ = 2**63 - 1  # /dev/kmsg sequence numbers are u64; Python's JSON has no other bound
MAX_UUID_CHARS = 96  # NVML's UUID buffer (NVML_DEVICE_UUID_V2_BUFFER_SIZE)
MAX_INDEX = 1023  # a GPU index
MAX_COUNT = 10**9  # a count: an event a second for 30 years is under 1e9
MAX_BOOT_ID_CHARS = 64  # a boot id is 36
MAX_SOURCE_CHARS = 4096  # the kernel log's path (PATH_MAX) or a simulated node's name
PCI_KEY_RE = re.compile(r"[0-9a-f]{8}:[0-9a-f]{2}:[0-9a-f]{2}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def show(v: Any, limit: int = 80) -> str:
    """A value for an error message, never longer than `limit` (a 12 MB string is a field too)."""
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + f"... ({len(r)} characters)"


def integer(v: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise StateError(f"{where} is {show(v)}; expected an integer from {lo} to {hi}")
    return v


def seconds(v: Any, where: str) -> float:
    """A time in seconds (unix time or kernel uptime): finite, from 0 to MAX_TIME_S."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or not 0 <= v <= MAX_TIME_S:
        raise StateError(f"{where} is {show(v)}; expected a time in seconds from 0 to {MAX_TIME_S:g}")
    return float(v)


def text(v: Any, where: str, max_chars: int) -> str:
    """A string of at most `max_chars` that UTF-8 can encode, without control characters."""
    if not isinstance(v, str):
        raise StateError(f"{where} is {show(v)}; expected a string")
    if len(v) > max_chars:
        raise StateError(f"{where} is {len(v)} characters long; at most {max_chars} expected")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise StateError(f"{where} is {show(v)}; not encodable as UTF-8 (a lone surrogate)") from None
    if _CONTROL.search(v):
        raise StateError(f"{where} is {show(v)}; control characters are not expected")
    return v


def storable_uuid(uuid: str) -> str:
    """`uuid` when a state file may hold it, else "" (a GPU's identity from NVML or a kernel line
    is written to the state file: what the exporter writes, it must accept when it reads)."""
    try:
        return text(uuid, "uuid", MAX_UUID_CHARS)
    except StateError:
        return ""


def mapping(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise StateError(f"{where} is {show(v)}; expected a mapping")
    return v


def sequence(v: Any, where: str) -> list[Any]:
    if not isinstance(v, list):
        raise StateError(f"{where} is {show(v)}; expected a list")
    return v


def pci_key(p: Any, where: str, other: str | None = None) -> str:
    """A PCI address key (dddddddd:bb:dd), or `other` (the shared bucket) when given."""
    if not isinstance(p, str) or not (p == other or PCI_KEY_RE.fullmatch(p)):
        raise StateError(f"{where}: {show(p)} is not a PCI address key (dddddddd:bb:dd)")
    return p


def optional(d: dict[str, Any], key: str, check: Callable[[Any, str], Any], where: str = "") -> None:
    """`check(d[key], where + key)` when `d` has `key` (and it is not null)."""
    if d.get(key) is not None:
        check(d[key], f"{where}{key}")


def envelope(st: Any, schema: Schema) -> dict[str, Any]:
    """A document of this exporter's version of `schema` whose shared fields (the envelope
    exporter.state.file adds: boot_id, kmsg, recoveries; and last_seq, written) are in shape."""
    if not isinstance(st, dict) or st.get("version") != schema.version:
        raise StateError(f"not a version-{schema.version} {schema.what} state document")
    optional(st, "boot_id", lambda v, w: text(v, w, MAX_BOOT_ID_CHARS))
    optional(st, "kmsg", lambda v, w: text(v, w, MAX_SOURCE_CHARS))
    optional(st, "recoveries", lambda v, w: integer(v, w, 0, MAX_COUNT))
    optional(st, "last_seq", lambda v, w: integer(v, w, 0, MAX_SEQ))
    optional(st, "written", seconds)
    return st


def bounded(v: Any, where: str, most: int) -> list[Any]:
    """A list of at most `most` entries."""
    if len(sequence(v, where)) > most:
        raise StateError(f"{where}: {len(v)} entries; at most {most} expected")
    return list(v)
