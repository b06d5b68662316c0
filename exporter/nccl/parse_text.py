"""The text STATUS report (every NCCL since 2.24; the only one before 2.28.7), parsed strictly.

Text prints what JSON lists in full only for outliers (small groups of ranks), so a text
`Report` holds the communicators' sizes, the missing ranks, the ranks behind in a MISMATCH block
and the ranks with errors, not every rank's counts. A rank number at or above its
communicator's size (the garbage walk of NVIDIA/nccl#1762, before 2.29.2) discards the report.
Lines this parser does not know are skipped; the lines it reads must match exactly."""

from __future__ import annotations

import re

from exporter.nccl import validate
from exporter.nccl.model import MAX_COUNT, MAX_RANKS, Communicator, Lag, Missing, Rank, ReplyError, Report

_HEAD = re.compile(r"NCCL version (\S+) compiled with CUDA \S+")
_COLLECTION = re.compile(r"Communicators\.\.\. \((\d{1,6}\.\d{1,3})s\)")
_ROW = re.compile(r"\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+|\d+-\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(\S+)")
_ENTRY = re.compile(r"#(\d+)-(\d+) \(([0-9a-f]{16})\) (INCOMPLETE|ERROR|MISMATCH)")
_DETAIL = re.compile(
    r"  Rank (\d+) (?:has launched up to operation (\d+) |has status (\w+) |has not launched any operations "
    r"|reported (.+?) )?-- (?:GPU (\d+)(?: \(NVML (\d+)\))? managed by process (\d+) on node (\S+)"
    r"|\[process information not found\])"
)
_PROCESS = re.compile(r"  Process (\d+) on node (\S+) managing GPUs? (\d+)(?:,\d+)*(?: \(NVML \S+\))?")
_GROUP_OPS = re.compile(
    r"  (\d+) ranks? (?:has|have) (?:launched up to operation (\d+)|not launched any operations)"
)
_GROUP_OTHER = re.compile(r"  (\d+) ranks? (?:has|have) status \w+|  (\d+) ranks? reported (.+)")
_OLD_MISSING = re.compile(r"  The missing ranks?: ([\d,]+)")
_TIMEOUTS = re.compile(r"  Encountered (\d+) communication timeouts? while gathering communicator data")
_OPS_HEADER = re.compile(r"  Communicator ranks have different (\w+) operation counts")
_ERR_HEADER = re.compile(r"  (Initialization|Asynchronous) errors? on \d+ ranks?")


def _sections(text: str) -> tuple[list[str], list[str], list[str]]:
    """(header lines, Errors lines, Warnings lines)."""
    lines = text.split("\n")
    try:
        e = lines.index("Errors")
        w = lines.index("Warnings")
    except ValueError:
        raise ReplyError("no Errors or Warnings section (truncated?)") from None
    if not e < w or lines[e + 1 : e + 2] != ["======"] or lines[w + 1 : w + 2] != ["========"]:
        raise ReplyError("Errors and Warnings sections out of shape")
    return lines[:e], lines[e + 2 : w], lines[w + 2 :]


def _entries(lines: list[str]) -> list[tuple[str, list[str]]]:
    """Entries of a section: a header line, then its indented lines up to a blank line."""
    out: list[tuple[str, list[str]]] = []
    for line in lines:
        if not line:
            continue
        if line.startswith("  ") and out:
            out[-1][1].append(line)
        else:
            out.append((line, []))
    return out


class _Block:
    """What one `#G-I (hash) WORD` entry adds to its communicator."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.missing: list[tuple[int, str, int, int, int]] = []  # rank, host, pid, cuda, nvml
        self.behind: dict[int, tuple[str, int, int, int]] = {}  # rank -> host, pid, nvml, behind
        self.errors: list[tuple[Rank, str]] = []

    def rank_no(self, v: str) -> int:
        r = int(v)
        if r >= self.size:
            raise ReplyError(f"rank {r} not below its communicator's size {self.size} (NVIDIA/nccl#1762)")
        return r


def _ident(m: re.Match[str], where: str) -> tuple[str, int, int, int]:
    """host, pid, cuda dev, nvml dev of a detail line (unknown: "", -1, -1, -1)."""
    if m.group(7) is None:
        return "", -1, -1, -1
    cuda = validate.dev(int(m.group(5)), where)
    nvml = validate.dev(int(m.group(6)), where) if m.group(6) is not None else cuda
    return validate.host(m.group(8), where), validate.pid(int(m.group(7)), where), cuda, nvml


def _ops_block(block: _Block, lines: list[str], where: str) -> None:
    """One per-op MISMATCH block: every named rank's distance to the highest count listed."""
    counts: list[tuple[int, int, str, int, int]] = []  # count, rank, host, pid, nvml
    highest = 0
    current: int | None = None  # the count of the group whose rank lines follow
    for line in lines:
        g = _GROUP_OPS.fullmatch(line)
        if g is not None:
            current = int(g.group(2) or 0)
            highest = max(highest, current)
            continue
        d = _DETAIL.fullmatch(line)
        if d is None or d.group(3) or d.group(4):
            continue
        rank = block.rank_no(d.group(1))
        if d.group(2) is not None:
            count = int(d.group(2))
        elif "has not launched any operations" in line:
            count = 0
        elif current is not None:
            count = current
        else:
            raise ReplyError(f"{where}: a rank line before any count")
        if count > MAX_COUNT:
            raise ReplyError(f"{where}: count out of range")
        highest = max(highest, count)
        host, pid, _cuda, nvml = _ident(d, where)
        counts.append((count, rank, host, pid, nvml))
    for count, rank, host, pid, nvml in counts:
        old = block.behind.get(rank)
        block.behind[rank] = (host, pid, nvml, (old[3] if old else 0) + highest - count)


def _comm_entry(block: _Block, word: str, lines: list[str], where: str) -> None:
    if word == "INCOMPLETE":
        for line in lines:
            d = _DETAIL.fullmatch(line)
            old = _OLD_MISSING.fullmatch(line)
            if d is not None:
                host, pid, cuda, nvml = _ident(d, where)
                block.missing.append((block.rank_no(d.group(1)), host, pid, cuda, nvml))
            elif old is not None:  # 2.24/2.25: numbers only
                block.missing += [(block.rank_no(r), "", -1, -1, -1) for r in old.group(1).split(",") if r]
    elif word == "ERROR":
        kind = "init"
        for line in lines:
            h = _ERR_HEADER.fullmatch(line)
            if h is not None:
                kind = "init" if h.group(1) == "Initialization" else "async"
                continue
            d = _DETAIL.fullmatch(line)
            if d is not None:
                host, pid, cuda, nvml = _ident(d, where)
                block.errors.append((Rank(block.rank_no(d.group(1)), host, pid, cuda, nvml), kind))
    else:  # MISMATCH: a status block, then one block per op
        op_lines: list[str] | None = None
        for line in [*lines, ""]:
            if (
                _OPS_HEADER.fullmatch(line)
                or line == "  Communicator ranks have different collective operation counts"
            ):
                if op_lines is not None:
                    _ops_block(block, op_lines, where)
                op_lines = []
            elif line.startswith("  Communicator ranks have different status"):
                if op_lines is not None:
                    _ops_block(block, op_lines, where)
                op_lines = None
            elif op_lines is not None:
                op_lines.append(line)
        if op_lines:
            _ops_block(block, op_lines, where)


def parse(data: bytes) -> Report:
    """The report in `data` (the bytes after STATUS up to EOF); raises ReplyError."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ReplyError("the text report is not ASCII") from None
    if not text.endswith("\n"):
        raise ReplyError("the text report does not end in a newline (truncated?)")
    head, errors, warnings = _sections(text)
    m = _HEAD.fullmatch(head[0]) if head else None
    if m is None:
        raise ReplyError("no `NCCL version` line")
    version = validate.version(m.group(1), "header")
    at = next((i for i, line in enumerate(head) if _COLLECTION.fullmatch(line)), None)
    if at is None:
        raise ReplyError("no `Communicators... (T s)` line")
    collection = float(_COLLECTION.fullmatch(head[at]).group(1))  # type: ignore[union-attr]
    sizes: dict[int, int] = {}
    table = (0, 0)
    nodes = 0
    for line in head[at:]:
        r = _ROW.fullmatch(line)
        if r is not None:
            size = int(r.group(5))
            if not 0 < size <= MAX_RANKS or int(r.group(1)) in sizes:
                raise ReplyError(f"table row {line.strip()!r:.80}: bad size or repeated group")
            sizes[int(r.group(1))] = size
            comms_in_group = max(1, int(r.group(2)))
            table = max(table, (size, min(size, int(r.group(6)) // comms_in_group)))
            nodes = max(nodes, min(int(r.group(3)), MAX_RANKS))
    blocks: dict[tuple[int, int, str], _Block] = {}
    dead: set[tuple[str, int]] = set()
    procs: list[tuple[str, int, int]] = []  # the missing processes the Errors section lists
    timeouts = 0
    for section, entries in (("Errors", _entries(errors)), ("Warnings", _entries(warnings))):
        for header, lines in entries:
            where = f"{section} {header[:40]!r}"
            if header in ("DEAD", "INCOMPLETE"):
                for line in lines:
                    p = _PROCESS.fullmatch(line)
                    if p is not None:
                        who = (validate.host(p.group(2), where), validate.pid(int(p.group(1)), where))
                        procs.append((*who, validate.dev(int(p.group(3)), where)))
                        if header == "DEAD":
                            dead.add(who)
                continue
            if header == "TIMEOUT":
                timeouts += sum(int(t.group(1)) for line in lines if (t := _TIMEOUTS.fullmatch(line)))
                continue
            e = _ENTRY.fullmatch(header)
            if e is None:
                continue  # INCOMPLETE (process list) and entries this parser does not read
            group = int(e.group(1))
            if group not in sizes:
                raise ReplyError(f"{where}: group {group} is not in the table")
            key = (group, int(e.group(2)), e.group(3))
            block = blocks.setdefault(key, _Block(sizes[group]))
            _comm_entry(block, e.group(4), lines, where)
    comms: list[Communicator] = []
    lags: list[Lag] = []
    errs: list[tuple[Rank, str]] = []
    for (_g, _i, h), b in blocks.items():
        if len(procs) == 1 and len(b.missing) == 1 and b.missing[0][2] == -1:
            # 2.24/2.25 print missing ranks by number only: one rank, one missing process: the same
            host, pid, gpu = procs[0]
            b.missing = [(b.missing[0][0], host, pid, gpu, gpu)]
        missing = tuple(
            Missing(r, host, pid, cuda, nvml, (host, pid) not in dead, (host, pid) in dead)
            for r, host, pid, cuda, nvml in b.missing
        )
        comms.append(Communicator(h, b.size, (), missing))
        lags += [
            Lag(h, r, host, pid, nvml, behind) for r, (host, pid, nvml, behind) in b.behind.items() if behind
        ]
        errs += b.errors
    return Report(
        version,
        "text",
        tuple(comms),
        collection,
        timeouts,
        tuple(lags),
        tuple(errs),
        frozenset(dead),
        table,
        nodes,
    )
