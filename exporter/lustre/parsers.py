"""Pure parsers for the Lustre client files. Each takes the file's text and returns plain data;
a line that does not fit is skipped and counted in `malformed`, never fatal.

Formats: docs/lustre.md (from the Lustre client sources and the fixtures in tests/fixtures/lustre).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Units as the client prints them, folded onto one spelling: 2.10/2.12 print "regs" for what
# later releases call "reqs"; 2.15.52+ pluralise "usec"/"sec".
UNIT_ALIASES = {"regs": "reqs", "usec": "usecs", "sec": "secs", "page": "pages", "byte": "bytes"}
TIME_UNITS = {"usecs": 1e-6, "secs": 1.0}


@dataclass(frozen=True)
class Counter:
    """One stats line: `name count samples [unit] [min max sum [sumsq]]`."""

    name: str
    count: int
    unit: str  # normalised (see UNIT_ALIASES)
    min: int | None = None
    max: int | None = None
    sum: int | None = None
    sumsq: int | None = None  # unsigned, may exceed 2**63: Python ints hold it exactly

    def seconds(self) -> float | None:
        """The sum in seconds when the counter measures time ([usec(s)] or [sec(s)])."""
        scale = TIME_UNITS.get(self.unit)
        return None if scale is None or self.sum is None else self.sum * scale


@dataclass
class Stats:
    counters: dict[str, Counter] = field(default_factory=dict)
    # Header values as printed. snapshot_time is seconds since boot on 2.15.0-2.15.1 and wall
    # clock elsewhere, so it is never used as a timestamp; start_time is 0 on 2.15.0-2.15.1.
    snapshot_time: float | None = None
    start_time: float | None = None
    elapsed_time: float | None = None
    param: str | None = None  # the `name=` line of `lctl get_param` output
    malformed: int = 0

    def get(self, name: str) -> Counter | None:
        return self.counters.get(name)

    def reset_timestamp(self) -> float | None:
        """When the stats were created or last cleared (2.15.2+), else None. A start_time
        under 10**9 s cannot be wall clock (2.15.0-2.15.1 print 0)."""
        return self.start_time if self.start_time and self.start_time > 1e9 else None


# Numbers are 64-bit in the kernel: at most 20 digits. A longer one is a bad line, not a value
# (past 310 digits it would not even be a float).
_STAT_LINE = re.compile(
    r"^(?P<name>[A-Za-z_][\w.\-]*)\s+(?P<count>\d{1,20})\s+samples\s+\[(?P<unit>[A-Za-z_]+)\]"
    r"(?:\s+(?P<min>-?\d{1,20})\s+(?P<max>-?\d{1,20})\s+(?P<sum>-?\d{1,20})(?:\s+(?P<sumsq>\d{1,40}))?)?\s*$",
    re.ASCII)
_HEADER = re.compile(
    r"^(?P<name>snapshot_time|start_time|elapsed_time)\s*:?\s+(?P<value>\d{1,20}(?:\.\d{1,9})?)\s*"
    r"(?:\(?secs\.nsecs\)?)?\s*$", re.ASCII)
_PARAM = re.compile(r"^[\w.\-*]+=\s*$")


def parse_stats(text: str) -> Stats:
    """Parse a llite/osc/mdc/md_stats `stats` file, with a one- or three-line header and
    optionally the `lctl get_param` `name=` first line. Zero counters are absent."""
    out = Stats()
    for i, raw in enumerate(text.splitlines()):
        line = raw.strip()
        if not line:
            continue
        if i == 0 and _PARAM.match(line):
            out.param = line[:-1].rstrip("=")
            continue
        m = _STAT_LINE.match(line)
        if m:
            unit = m["unit"].lower()
            unit = UNIT_ALIASES.get(unit, unit)
            vals = [int(m[k]) if m[k] is not None else None for k in ("min", "max", "sum", "sumsq")]
            out.counters[m["name"]] = Counter(m["name"], int(m["count"]), unit, *vals)
            continue
        h = _HEADER.match(line)
        if h:
            setattr(out, h["name"], float(h["value"]))
            continue
        out.malformed += 1
    return out


@dataclass
class Import:
    """The fields of an osc/mdc `import` file the exporter uses (absent fields stay None)."""

    name: str | None = None
    target: str | None = None
    state: str | None = None
    current_connection: str | None = None
    connection_attempts: int | None = None
    idle_seconds: int | None = None  # 2.12+: seconds since the last reply
    inflight: int | None = None
    timeouts: int | None = None
    avg_waittime_usecs: int | None = None
    malformed: int = 0


_KV = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w\-]*)\s*:\s*(?P<value>.*?)\s*$")
_INT_PREFIX = re.compile(r"^(-?\d{1,20})(?!\d)", re.ASCII)  # a 64-bit value; longer is no value


def _int(value: str | None) -> int | None:
    m = _INT_PREFIX.match(value or "")
    return int(m.group(1)) if m else None


def parse_import(text: str) -> Import:
    """Parse an `import` file. It is YAML-like but not guaranteed YAML (flags lists, units after
    numbers, keys with dashes), so it is read line by line: `key: value` under the section
    opened by the nearest less-indented `key:` line."""
    out = Import()
    stack: list[tuple[int, str]] = []
    flat: dict[str, str] = {}
    for raw in text.splitlines():
        if not raw.strip():
            continue
        m = _KV.match(raw)
        if not m:
            out.malformed += 1
            continue
        indent = len(m["indent"].expandtabs())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key, value = m["key"], m["value"]
        if value == "":
            stack.append((indent, key))
            continue
        section = stack[-1][1] if stack else ""
        flat[f"{section}.{key}"] = value
    out.name = flat.get("import.name")
    out.target = flat.get("import.target")
    state = flat.get("import.state")
    out.state = state.split()[0].upper() if state else None
    out.current_connection = flat.get("connection.current_connection")
    out.connection_attempts = _int(flat.get("connection.connection_attempts"))
    out.idle_seconds = _int(flat.get("connection.idle"))
    out.inflight = _int(flat.get("rpcs.inflight"))
    out.timeouts = _int(flat.get("rpcs.timeouts"))
    out.avg_waittime_usecs = _int(flat.get("rpcs.avg_waittime"))
    return out


# -- the per-target files, read for the fields the collector exports ------------------------
# A file system can have hundreds of OSTs and each has a stats and an import file read every
# scrape, so these read only the lines the exported series come from, with string searches.

def stats_fields(text: str, names: tuple[str, ...]) -> tuple[dict[str, tuple[int, str, int | None]], int]:
    """{name: (count, unit, sum)} of the stats lines of `names` (sum None when the line has no
    min/max/sum), as parse_stats reads them, and how many of those lines do not parse. The
    other lines are not looked at (not counted as malformed either)."""
    out: dict[str, tuple[int, str, int | None]] = {}
    bad = 0
    for name in names:
        i = text.find(name)
        while i >= 0:
            end = i + len(name)
            start = text.rfind("\n", 0, i) + 1
            if (start == i or not text[start:i].strip()) and end < len(text) and text[end] in " \t":
                stop = text.find("\n", end)
                line = text[start:] if stop < 0 else text[start:stop]
                parsed = _stat_fields(line)
                if parsed is None:
                    bad += 1
                else:
                    out[name] = parsed  # the last good line wins, as in parse_stats
                i = len(text) if stop < 0 else stop
            i = text.find(name, i + 1)
    return out, bad


def _stat_fields(line: str) -> tuple[int, str, int | None] | None:
    tok = line.split()
    n = len(tok)
    if (n not in (4, 7, 8) or not line.isascii() or tok[2] != "samples" or not tok[1].isdigit()
            or len(tok[1]) > 20 or tok[3][:1] != "[" or tok[3][-1:] != "]"):
        return _stat_fields_slow(line)
    unit = tok[3][1:-1]
    if not unit.replace("_", "a").isalpha():
        return _stat_fields_slow(line)
    total = None
    if n > 4:
        for t in tok[4:7]:
            digits = t[1:] if t[:1] == "-" else t
            if not digits.isdigit() or len(digits) > 20:
                return _stat_fields_slow(line)
        if n == 8 and (not tok[7].isdigit() or len(tok[7]) > 40):
            return _stat_fields_slow(line)
        total = int(tok[6])
    unit = unit.lower()
    return int(tok[1]), UNIT_ALIASES.get(unit, unit), total


def _stat_fields_slow(line: str) -> tuple[int, str, int | None] | None:
    """The same from the full line pattern, for a line the quick split does not take (odd
    spacing, non-ASCII whitespace, a bad number)."""
    m = _STAT_LINE.match(line.strip())
    if m is None:
        return None
    unit = m["unit"].lower()
    return int(m["count"]), UNIT_ALIASES.get(unit, unit), None if m["sum"] is None else int(m["sum"])


def seconds(unit: str, total: int | None) -> float | None:
    """A stats sum in seconds when the counter measures time (see Counter.seconds)."""
    scale = TIME_UNITS.get(unit)
    return None if scale is None or total is None else total * scale


_INDENT4 = re.compile(r"\n {4}[^ ]")


def import_fields(text: str) -> tuple[str | None, int | None, int | None, int | None, int]:
    """(state, connection_attempts, inflight, timeouts, malformed lines) of an `import` file.

    A file laid out as the kernel prints it (`import:`, then every line indented by 4 spaces, the
    import's keys and sections, or by 7, a section's keys, with one colon a line) is read with
    string searches for those four keys: a 4-line belongs to the import, a 7-line to the section
    opened by the 4-line above it. Any other file (tabs, other indents, blank or colon-less lines,
    characters other than \\n that str.splitlines() breaks lines at) goes to parse_import."""
    body = text[7:]
    if (text.startswith("import:\n") and text.isascii() and "\r" not in body and "\x0b" not in body
            and "\x0c" not in body and "\x1c" not in body and "\x1d" not in body and "\x1e" not in body):
        if body.endswith("\n"):
            body = body[:-1]
        n = body.count("\n")
        if (body.count(":") == n and body.count("\n    ") == n and body.count("\n        ") == 0
                and body.count("\n     ") == body.count("\n       ")
                and "\n    :" not in body and "\n       :" not in body):
            state = _canon_value(body, "state", None)
            return (state.split()[0].upper() if state else None,
                    _int_value(_canon_value(body, "connection_attempts", "connection")),
                    _int_value(_canon_value(body, "inflight", "rpcs")),
                    _int_value(_canon_value(body, "timeouts", "rpcs")), 0)
    imp = parse_import(text)
    return imp.state, imp.connection_attempts, imp.inflight, imp.timeouts, imp.malformed


def _canon_value(body: str, key: str, section: str | None) -> str | None:
    """The value of the last `key: value` line of `section` (None: the import's own keys) in a
    body checked by import_fields; header lines (no value) do not count, as in parse_import."""
    needle = f"\n    {key}:" if section is None else f"\n       {key}:"
    header = f"\n    {section}:"
    pos = len(body)
    while (pos := body.rfind(needle, 0, pos)) >= 0:
        stop = body.find("\n", pos + 1)
        value = (body[pos + len(needle):] if stop < 0 else body[pos + len(needle):stop]).strip()
        if not value:
            continue  # a header, not a value
        if section is None:
            return value
        h = body.rfind(header, 0, pos)
        if h >= 0 and _INDENT4.search(body, h + 1, pos) is None:  # nearest 4-line is the header
            h_stop = body.find("\n", h + 1)
            if not body[h + len(header):h_stop].strip():
                return value
    return None


def _int_value(value: str | None) -> int | None:
    if value is not None and value.isdigit():
        return int(value) if len(value) <= 20 else None
    return _int(value)


@dataclass
class StateHistory:
    current: str | None = None
    history: list[tuple[int, str]] = field(default_factory=list)  # oldest first, as printed
    malformed: int = 0


_HIST = re.compile(r"^\s*-\s*\[\s*(?P<ts>\d{1,20})\s*,\s*(?P<state>[A-Za-z_]+)\s*\]\s*$")


def parse_state(text: str) -> StateHistory:
    """Parse an osc/mdc `state` file: `current_state:` and the ring of (epoch s, state)."""
    out = StateHistory()
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line == "state_history:":
            continue
        if line.startswith("current_state:"):
            out.current = line.partition(":")[2].strip().upper() or None
            continue
        m = _HIST.match(raw)
        if m:
            out.history.append((int(m["ts"]), m["state"].upper()))
        else:
            out.malformed += 1
    return out


HEALTHY, NOT_HEALTHY, LBUG = "healthy", "not_healthy", "lbug"
HEALTH_STATUSES = (HEALTHY, NOT_HEALTHY, LBUG)


def parse_health_check(text: str) -> str | None:
    """`healthy`, `not_healthy` or `lbug`; None when the text is none of them. The 2.15 debugfs
    copy prefixes `device X reported unhealthy` lines; 2.10/2.12 overwrite LBUG with NOT
    HEALTHY, so LBUG shows only on 2.12.53+."""
    words = text.upper()
    if "LBUG" in words:
        return LBUG
    if "NOT HEALTHY" in words or "UNHEALTHY" in words:
        return NOT_HEALTHY
    if text.strip().lower() == "healthy":
        return HEALTHY
    return None


_VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)*(?:[_\-.][\w.]+)?)")


def parse_version(text: str) -> str | None:
    """The client version from `version`: `2.15.4` (sysfs) or `lustre: 2.10.1` plus more lines
    (old procfs)."""
    for line in text.splitlines():
        line = line.strip()
        if line.lower().startswith(("kernel:", "build:")):
            continue
        m = _VERSION.search(line)
        if m:
            return m.group(1)
    return None


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    if not version:
        return None
    parts = re.findall(r"\d+", version.split("_")[0])
    return tuple(int(p) for p in parts[:3]) if parts else None


def parse_int(text: str) -> int | None:
    """A one-number tunable such as `max_rpcs_in_flight`."""
    return _int(text.strip())


@dataclass
class CacheInfo:
    max_mb: int | None = None
    used_mb: int | None = None
    malformed: int = 0


def parse_max_cached_mb(text: str) -> CacheInfo:
    """llite `max_cached_mb`: `users:`, `max_cached_mb:`, `used_mb:`, `unused_mb:`,
    `reclaim_count:` (2.15 adds read-ahead lines). Very old clients print one number."""
    out = CacheInfo()
    stripped = text.strip()
    if stripped.isascii() and stripped.isdigit() and len(stripped) <= 20:
        out.max_mb = int(stripped)
        return out
    for raw in text.splitlines():
        if not raw.strip():
            continue
        key, sep, value = raw.partition(":")
        if not sep or _int(value.strip()) is None:
            out.malformed += 1
            continue
        key = key.strip()
        if key == "max_cached_mb":
            out.max_mb = _int(value.strip())
        elif key == "used_mb":
            out.used_mb = _int(value.strip())
    return out
