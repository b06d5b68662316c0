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


def _import_flat(text: str) -> tuple[dict[str, str], int]:
    """{"section.key": value} of an `import` file and its malformed lines (see parse_import)."""
    malformed = 0
    stack: list[tuple[int, str]] = []
    flat: dict[str, str] = {}
    for raw in text.splitlines():
        if not raw.strip():
            continue
        m = _KV.match(raw)
        if not m:
            malformed += 1
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
    return flat, malformed


def parse_import(text: str) -> Import:
    """Parse an `import` file. It is YAML-like but not guaranteed YAML (flags lists, units after
    numbers, keys with dashes), so it is read line by line: `key: value` under the section
    opened by the nearest less-indented `key:` line. (The collector reads only the fields it
    exports, with import_fields.)"""
    out = Import()
    flat, out.malformed = _import_flat(text)
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
# A file system can have hundreds of OSTs, each with a stats and an import file read every
# scrape, so only the lines the exported series come from are parsed: one regular-expression
# search a stats file, string searches in an import file. `malformed` for these files counts
# those lines that do not parse; the other lines are not looked at.

def stats_fields(text: str, names: tuple[str, ...]) -> tuple[dict[str, tuple[int, str, int | None]], int]:
    """{name: (count, unit, sum)} of the stats lines of `names` (sum None when the line has no
    min/max/sum), as parse_stats reads them, and how many of those lines do not parse."""
    pattern = _STATS_LINES.get(names)
    if pattern is None:
        pattern = _STATS_LINES[names] = _stats_lines(names)
    out = {name: (int(count), _UNITS.get(unit) or _unit(unit), int(total) if total else None)
           for name, count, unit, total in pattern.findall(text)}
    bad = 0
    if len(out) < len(names):
        for name in names:
            if name not in out and name in text:  # indented, odd spacing, damaged: line by line
                found, n = _stats_line_by_line(text, name)
                if found is not None:
                    out[name] = found
                bad += n
    return out, bad


_UNITS: dict[str, str] = {}  # unit as printed -> normalised (the few spellings seen)


def _unit(unit: str) -> str:
    norm = unit.lower()
    norm = UNIT_ALIASES.get(norm, norm)
    if len(_UNITS) < 64:
        _UNITS[unit] = norm
    return norm


def _stats_lines(names: tuple[str, ...]) -> re.Pattern[str]:
    """The lines of `names` as the kernel prints them, at the start of a line (never the first:
    a header or the `name=` line comes first). One search a file."""
    alt = "|".join(map(re.escape, names))
    return re.compile(rf"\n({alt}) +(\d{{1,20}}) samples \[([A-Za-z_]+)\]"
                      r"(?: -?\d{1,20} -?\d{1,20} (-?\d{1,20})(?: \d{1,40})?)? *(?=\n|\Z)", re.ASCII)


_STATS_LINES: dict[tuple[str, ...], re.Pattern[str]] = {}


def _stats_line_by_line(text: str, name: str) -> tuple[tuple[int, str, int | None] | None, int]:
    """The last line of `name` that parses (as parse_stats would) and the number that do not."""
    found, bad = None, 0
    for raw in text.splitlines():
        line = raw.strip()
        if line.partition(" ")[0].partition("\t")[0] != name:
            continue
        m = _STAT_LINE.match(line)
        if m is None:
            bad += 1
            continue
        unit = m["unit"].lower()
        found = (int(m["count"]), UNIT_ALIASES.get(unit, unit), None if m["sum"] is None else int(m["sum"]))
    return found, bad


def seconds(unit: str, total: int | None) -> float | None:
    """A stats sum in seconds when the counter measures time (see Counter.seconds)."""
    scale = TIME_UNITS.get(unit)
    return None if scale is None or total is None else total * scale


# The kernel's import layout up to rpcs.timeouts, with the conditions import_fields' searches check:
# the lines before `state:` indented by 4 (none of them `state:`, `connection:` or `rpcs:`), then
# the first `connection:` section (no `rpcs:` before it) with connection_attempts among its
# 7-indented lines, then the first `rpcs:` section with inflight and then timeouts among its
# 7-indented lines. Groups: the text after `state:`, `connection_attempts:`, `inflight:`, `timeouts:`.
_SEC = r" {7}(?:[^ \n][^\n]*)?\n"  # a line of a section (7 spaces then not a space, or nothing)
_KERNEL_IMPORT = re.compile(
    r"import:\n(?:    (?!state:|connection:\n|rpcs:\n)[^\n]*\n)*?    state:([^\n]*)\n"
    r"(?:(?!    (?:connection|rpcs):\n)[^\n]*\n)*?    connection:\n"
    rf"(?:(?! {{7}}connection_attempts:){_SEC})*? {{7}}connection_attempts:([^\n]*)\n"
    r"(?:(?!    rpcs:\n)[^\n]*\n)*?    rpcs:\n"
    rf"(?:(?! {{7}}(?:inflight|timeouts):){_SEC})*? {{7}}inflight:([^\n]*)\n"
    rf"(?:(?! {{7}}timeouts:){_SEC})*? {{7}}timeouts:([^\n]*)\n")
_NOT_7 = re.compile(r"\n(?! {7}[^ ])")  # a line not indented by exactly 7 spaces
_NOT_4 = re.compile(r"\n(?! {4})")  # a line indented by fewer than 4


def import_fields(text: str) -> tuple[str | None, int | None, int | None, int | None, int]:
    """(state, connection_attempts, inflight, timeouts, malformed) of an `import` file, as
    parse_import reads those fields; malformed counts those of them present whose value is not
    a number.

    In the kernel's layout (`import:`, the import's keys indented by 4, a section's by 7 right
    under its `section:` line, each key once) the keys are found with string searches; a file
    that looks otherwise around them (other indents, tabs, other lines between a section and its
    keys, a key printed twice) is read line by line with parse_import's rules."""
    if (text.startswith("import:\n") and text.isascii() and "\r" not in text and "\x0b" not in text
            and "\x0c" not in text and "\x1c" not in text and "\x1d" not in text and "\x1e" not in text):
        # (no line break but \n: parse_import splits lines with str.splitlines())
        m = _KERNEL_IMPORT.match(text)
        if m is not None:
            # The kernel's order (state, connection section, rpcs section), each key the first of its
            # kind where the searches below would find it: the same fields and checks, one pass.
            s, a, i, t = m.start(1), m.start(2) + 1, m.start(3) + 1, m.start(4) + 1
            if (text.find("state:", s) < 0 and text.find("connection_attempts:", a) < 0
                    and text.find("inflight:", i) < 0 and text.find("timeouts:", t) < 0):
                state, av, iv, tv = m[1].strip(), m[2][1:].strip(), m[3][1:].strip(), m[4][1:].strip()
                if state and av and iv and tv:
                    if av.isdigit() and iv.isdigit() and tv.isdigit() and len(av) <= 20 and len(iv) <= 20 \
                            and len(tv) <= 20:
                        return state.split()[0].upper(), int(av), int(iv), int(tv), 0
                    return _import_values(state, av, iv, tv)
        if text[-1] != "\n":
            text += "\n"
        s = text.find("\n    state:")
        c = text.find("\n    connection:\n")
        r = text.find("\n    rpcs:\n")
        if s > 0 and c > 0 and r > 0 and _NOT_4.search(text, 7, s) is None:
            end = _NOT_7.search(text, c + 16)  # the connection section ends at a line not at 7
            a = text.find("\n       connection_attempts:", c + 15, end.start() if end else len(text))
            end = _NOT_7.search(text, r + 10)
            i = text.find("\n       inflight:", r + 9, end.start() if end else len(text))
            t = text.find("\n       timeouts:", r + 9, end.start() if end else len(text))
            # each key's last time: nothing like it after (the line-by-line rules keep the last)
            if (a > 0 and i > 0 and t > 0 and text.find("state:", s + 11) < 0
                    and text.find("connection_attempts:", a + 29) < 0 and text.find("inflight:", i + 18) < 0
                    and text.find("timeouts:", t + 18) < 0):
                state = text[s + 11:text.find("\n", s + 11)].strip()
                av = text[a + 29:text.find("\n", a + 29)].strip()
                iv = text[i + 18:text.find("\n", i + 18)].strip()
                tv = text[t + 18:text.find("\n", t + 18)].strip()
                if state and av and iv and tv:  # (an empty one is a section line, not a value)
                    if av.isdigit() and iv.isdigit() and tv.isdigit() and len(av) <= 20 and len(iv) <= 20 \
                            and len(tv) <= 20:
                        return state.split()[0].upper(), int(av), int(iv), int(tv), 0
                    return _import_values(state, av, iv, tv)
    flat, _ = _import_flat(text)
    return _import_values(flat.get("import.state"), flat.get("connection.connection_attempts"),
                          flat.get("rpcs.inflight"), flat.get("rpcs.timeouts"))


def _import_values(state: str | None, attempts: str | None, inflight: str | None, timeouts: str | None
                   ) -> tuple[str | None, int | None, int | None, int | None, int]:
    bad = 0
    a = i = t = None
    if attempts is not None and (a := _int_value(attempts)) is None:
        bad += 1
    if inflight is not None and (i := _int_value(inflight)) is None:
        bad += 1
    if timeouts is not None and (t := _int_value(timeouts)) is None:
        bad += 1
    return (state.split()[0].upper() if state else None), a, i, t, bad


def _int_value(value: str) -> int | None:
    if value.isdigit() and value.isascii():
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
