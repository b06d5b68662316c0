"""Kernel-log lines in the text forms people save, as /dev/kmsg records (pure: no I/O).

`check --kmsg-file` (and any reader of a regular file) takes a saved kernel log in whatever form
it was saved, or a mix of them, line by line (docs/xid.md, "Kernel logs `check` reads"):

| form | example |
|---|---|
| `/dev/kmsg` record (exporter.xid.kmsg) | `4,812,5123456789,-;NVRM: Xid (PCI:0000:53:00): 94, ...` |
| `dmesg` (monotonic) | `[ 5123.456789] NVRM: Xid ...` |
| `dmesg -T` | `[Sat Nov 28 15:05:13 2026] NVRM: Xid ...` |
| `dmesg --time-format iso` | `2026-11-28T15:05:13,123456+00:00 NVRM: Xid ...` |
| `dmesg -x` (facility and level first) | `kern  :warn  : [ 5123.456789] NVRM: Xid ...` |
| `journalctl -k` (short), syslog (RFC 3164) | `Nov 28 15:05:13 ip-10-0-0-1 kernel: NVRM: Xid ...` |
| `journalctl -k -o short-precise` | `Nov 28 15:05:13.123456 ip-10-0-0-1 kernel: NVRM: Xid ...` |
| `journalctl -k -o short-iso` (-precise) | `2026-11-28T15:05:13+0000 ip-1 kernel: NVRM: Xid ...` |
| `journalctl -k -o short-monotonic` | `[ 5123.456789] ip-10-0-0-1 kernel: NVRM: Xid ...` |
| syslog, RFC 3164 with a priority | `<4>Nov 28 15:05:13 host kernel: ...` |
| syslog, RFC 5424 | `<4>1 2026-11-28T15:05:13Z host kernel - - - ...` |

A syslog or journal line is the kernel's when its program is `kernel`; any other program's line is
user space (as a /dev/kmsg record of prio >= 8: read, never counted). The kernel's own
`[ 5123.456789]` stamp inside a syslog line is its time since boot. journalctl's `-- Boot ... --`
and `-- No entries --` lines are not lines of the log.
"""

from __future__ import annotations

import calendar
import re
import time
from dataclasses import dataclass

KERNEL_PRIO = 6  # a kernel record (facility 0, level info): counted like the device's
USER_PRIO = 14  # facility 1 (user), level info: read, never counted

_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct",
                                       "Nov", "Dec"), 1)}
_MONO = r"\[\s*(\d{1,12})(?:\.(\d{1,9}))?\]"
_MONO_RE = re.compile(_MONO + r" ?")
_DMESG_X_RE = re.compile(r"(\w+)\s*:\s*(\w+)\s*: ")  # dmesg -x: "kern  :warn  : "
# [Sat Nov 28 15:05:13 2026]
_CTIME_RE = re.compile(r"\[(?:\w{3}) (\w{3}) +(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) (\d{4})\] ?")
# 2026-11-28T15:05:13[.,]123456(Z|+00:00|+0000)
_ISO = r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?(Z|[+-]\d{2}:?\d{2})?"
_ISO_RE = re.compile(_ISO + r" ")
# Nov 28 15:05:13[.123456]
_BSD_RE = re.compile(r"(\w{3}) +(\d{1,2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))? ")
# after the time: "host program[pid]: message"; RFC 5424: "host program pid msgid sd message"
_HOST_PROG_RE = re.compile(r"(\S+) ([^\s:\[]+)(?:\[\d+\])?: ?")
_RFC5424_RE = re.compile(r"(\S+) (\S+) (\S+) (\S+) (-|\[.*?\]) ?")
_PRI_RE = re.compile(r"<(\d{1,3})>(1 )?")


@dataclass(frozen=True, slots=True)
class TextLine:
    """One text-form line: its message, whose it is, and its time as the line gives it."""

    message: str
    kernel: bool  # the kernel's line (not another program's)
    kernel_s: float | None  # seconds since boot, when the line says ([ 5123.456789])
    wall: float | None  # Unix time, when the line says
    form: str  # dmesg, dmesg-T, dmesg-iso, journal-short, journal-iso, journal-monotonic, syslog-5424


def _frac(digits: str | None) -> float:
    return int(digits) / 10 ** len(digits) if digits else 0.0


def _tz(s: str | None) -> float:
    """Seconds east of UTC of `Z`, `+00:00`, `-0500`; local time when absent."""
    if not s:
        return -float(time.localtime().tm_gmtoff)  # marker handled by _iso_wall
    if s == "Z":
        return 0.0
    sign = -1 if s[0] == "-" else 1
    digits = s[1:].replace(":", "")
    return sign * (int(digits[:2]) * 3600 + int(digits[2:4]) * 60)


def _iso_wall(m: re.Match[str], first: int = 1) -> float | None:
    y, mo, d, h, mi, sec = (int(m.group(first + i)) for i in range(6))
    frac, tz = m.group(first + 6), m.group(first + 7)
    try:
        if tz:
            return calendar.timegm((y, mo, d, h, mi, sec, 0, 0, 0)) - _tz(tz) + _frac(frac)
        return time.mktime((y, mo, d, h, mi, sec, 0, 0, -1)) + _frac(frac)
    except (ValueError, OverflowError):
        return None


def _local_wall(year: int, month: int, day: int, h: int, mi: int, sec: int,
                frac: float = 0.0) -> float | None:
    try:
        return time.mktime((year, month, day, h, mi, sec, 0, 0, -1)) + frac
    except (ValueError, OverflowError):
        return None


def _bsd_wall(m: re.Match[str], now: float) -> float | None:
    """`Nov 28 15:05:13` has no year: this year's, unless that is more than a day ahead (last year's)."""
    month = _MONTHS.get(m.group(1))
    if month is None:
        return None
    year = time.localtime(now).tm_year
    args = (month, int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)), _frac(m.group(6)))
    wall = _local_wall(year, *args)
    if wall is not None and wall > now + 86400:
        wall = _local_wall(year - 1, *args)
    return wall


def _mono(m: re.Match[str]) -> float:
    return int(m.group(1)) + _frac(m.group(2))


def _after_host(rest: str, kernel_s: float | None, wall: float | None, form: str) -> TextLine | None:
    """`host program[pid]: message` (syslog, journal): the kernel's when the program is `kernel`."""
    m = _HOST_PROG_RE.match(rest)
    if m is None:
        return None
    message = rest[m.end():]
    kernel = m.group(2) == "kernel"
    if kernel:
        km = _MONO_RE.match(message)  # the kernel's own stamp, kept by some syslog daemons
        if km is not None:
            kernel_s, message = _mono(km), message[km.end():]
    return TextLine(message, kernel, kernel_s, wall, form)


def parse_line(line: str, now: float | None = None) -> TextLine | None:
    """The line in one of the text forms above; None when it is in none of them."""
    now = time.time() if now is None else now
    line = line.rstrip("\r\n")
    pri_kernel: bool | None = None
    pm = _PRI_RE.match(line)
    if pm is not None:  # syslog with its priority: the facility says whose it is
        pri_kernel = int(pm.group(1)) < 8
        line = line[pm.end():]
        if pm.group(2):  # RFC 5424: <pri>1 timestamp host app procid msgid sd message
            im = re.match(_ISO + r" ", line)
            if im is None:
                return None
            rm = _RFC5424_RE.match(line[im.end():])
            if rm is None:
                return None
            message = line[im.end() + rm.end():]
            kernel = pri_kernel and rm.group(2) == "kernel"
            return TextLine(message, bool(kernel), None, _iso_wall(im), "syslog-5424")
    xm = _DMESG_X_RE.match(line)
    facility_kernel: bool | None = None
    if xm is not None and xm.group(1) in ("kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news"):
        facility_kernel = xm.group(1) == "kern"
        line = line[xm.end():]
    m = _MONO_RE.match(line)
    if m is not None:
        rest = line[m.end():]
        hm = _HOST_PROG_RE.match(rest)
        if hm is not None and hm.group(2) == "kernel" and " " not in hm.group(1):  # short-monotonic
            return TextLine(rest[hm.end():], True, _mono(m), None, "journal-monotonic")
        return TextLine(rest, facility_kernel is not False, _mono(m), None, "dmesg")
    m = _CTIME_RE.match(line)
    if m is not None:
        month = _MONTHS.get(m.group(1))
        if month is None:
            return None
        wall = _local_wall(int(m.group(6)), month, int(m.group(2)), int(m.group(3)), int(m.group(4)),
                           int(m.group(5)))
        return TextLine(line[m.end():], facility_kernel is not False, None, wall, "dmesg-T")
    m = _ISO_RE.match(line)
    if m is not None:  # journalctl short-iso ("host kernel: ..."), else dmesg --time-format iso
        wall, rest = _iso_wall(m), line[m.end():]
        got = _after_host(rest, None, wall, "journal-iso")
        if got is None:
            return TextLine(rest, facility_kernel is not False and pri_kernel is not False, None, wall,
                            "dmesg-iso")
        return got if pri_kernel is not False else TextLine(got.message, False, got.kernel_s, wall, got.form)
    m = _BSD_RE.match(line)
    if m is not None:
        got = _after_host(line[m.end():], None, _bsd_wall(m, now), "journal-short")
        if got is not None and pri_kernel is False:
            return TextLine(got.message, False, got.kernel_s, got.wall, got.form)
        return got
    return None


def is_marker(line: str) -> bool:
    """journalctl's own lines (`-- Boot 3f2a... --`, `-- No entries --`, `-- Logs begin at ...`)."""
    return line.startswith("-- ")


_XID_WORD = re.compile(r"\bS?Xid\b")


def looks_like_fault(text: str) -> bool:
    """A line or message that names an XID or SXid report (`NVRM: Xid (...)`, `nvidia-nvswitchN: SXid
    (...)`): one the parsers must read, or the log cannot be trusted. Cheap when it does not."""
    return "Xid" in text and _XID_WORD.search(text) is not None
