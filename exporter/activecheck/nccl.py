"""nccl-tests `all_reduce_perf` text output to rows, and the check's verdict on it.

The table's data rows are `size count type redop root` then, out-of-place and in-place, `time
algbw busbw #wrong` (nccl-tests src/common.cu at v2.19.6). Launchers prefix lines (OpenMPI
`[1,0]<stdout>:`, srun --label `0: `, Intel MPI `[0] `, pdsh `host: `) and logs interleave
timestamp lines, so a row is found by its shape wherever it starts in the line, and numbers
are read by whitespace, not column (large values fall back to %e). The footer's "Avg bus
bandwidth" is the mean over every size and both placements, so a sweep from 8 B reports a tiny
average on a healthy node: the check is judged by busbw at one fixed large size only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter.activecheck.result import CheckResult, Finding

TYPES = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16",
         "f8e4m3", "f8e5m2", "fp8_e4m3", "fp8_e5m2", "int", "char"}
REDOPS = {"sum", "prod", "max", "min", "avg", "none", "mulsum"}
ERRORS = re.compile(r"Test (?:NCCL |CUDA )?failure|Test timeout|NCCL WARN .*(?:error|failed)", re.I)
# "Group N" since nccl-tests 2.10 or so; older builds print "#   Rank  0 Pid 1234 on host device ..."
RANK = re.compile(r"#\s*Rank\s+\d+\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device")
OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)\s*(\w+)")
INVALID_USAGE = "'invalid usage"  # ncclInvalidUsage's message, as `Test NCCL failure` quotes it
AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*(\S+)(?:\s+(FAILED))?")


@dataclass(frozen=True)
class Row:
    size: int  # bytes
    busbw_oop: float  # GB/s (10^9 bytes per second, as nccl-tests prints)
    busbw_ip: float
    wrong: int | None  # #wrong of both placements together; None: not checked (N/A)

    @property
    def busbw(self) -> float:
        """The better placement's: the check asks whether the node can reach the bandwidth."""
        return max(self.busbw_oop, self.busbw_ip)


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    hosts: set[str] = field(default_factory=set)  # from "# Rank N ... on HOST device"
    errors: list[str] = field(default_factory=list)  # "Test NCCL failure ..." lines
    out_of_bounds: int | None = None
    avg_failed: bool = False  # NCCL_TESTS_MIN_BW set and the average under 0.9 of it

    def at(self, size: int) -> Row | None:
        return next((r for r in self.rows if r.size == size), None)


def _float(s: str) -> float | None:
    """A finite number (a nan or inf busbw would compare as no shortfall), else None."""
    try:
        v = float(s)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _wrong(s: str) -> int | None:
    return int(s) if s.isdigit() else None


def row(tokens: list[str]) -> Row | None:
    """A data row found anywhere in a line's tokens (after any launcher prefix)."""
    for i in range(len(tokens) - 12):
        if not (tokens[i].isdigit() and tokens[i + 1].isdigit() and tokens[i + 2] in TYPES
                and tokens[i + 3] in REDOPS and re.fullmatch(r"-?\d+", tokens[i + 4])):
            continue
        rest = tokens[i + 5:]
        oop = _float(rest[2]) if len(rest) > 2 else None
        ip = _float(rest[6]) if len(rest) > 6 else None
        if oop is None or ip is None or _float(rest[0]) is None or _float(rest[4]) is None:
            continue
        w1, w2 = _wrong(rest[3]), _wrong(rest[7]) if len(rest) > 7 else None
        wrong = None if w1 is None and w2 is None else (w1 or 0) + (w2 or 0)
        return Row(int(tokens[i]), oop, ip, wrong)
    return None


def parse(text: str) -> Report:
    rep = Report()
    for line in text.splitlines():
        if "#" in line:
            m = RANK.search(line)
            if m:
                rep.hosts.add(m.group(1))
                continue
            m = OOB.search(line)
            if m:
                rep.out_of_bounds = int(m.group(1))
                continue
            m = AVG.search(line)
            if m:
                rep.avg_failed = bool(m.group(2))
                continue
        if ERRORS.search(line):
            rep.errors.append(line.strip()[:300])
            continue
        r = row(line.replace(":", ": ").split())  # a 12-digit size fills its column: "<stdout>:137438953472"
        if r is not None:
            rep.rows.append(r)
    return rep


GB = 1e9  # nccl-tests' GB/s are 10^9 bytes per second
BANDWIDTH, COLLECTIVE = "bus_bandwidth", "collective"  # the findings' tests (exporter.activecheck.findings)


def _result(res: str, reason: str, test: str = "", meas: dict[str, float] | None = None,
            exit_code: int | None = None) -> CheckResult:
    findings = [Finding("", test, "fail")] if res == "fail" else []
    return CheckResult("nccl", res, reason, exit_code=exit_code, tool="all_reduce_perf",
                       findings=findings, measurements=meas or {})


def judge(text: str, exit_code: int | None, size: int, expected: Callable[[int | None], float | None],
          min_fraction: float) -> CheckResult:
    """The check's result from a finished all_reduce_perf run, judged by busbw at `size` bytes
    against `min_fraction` x expected(nodes) GB/s (None: bandwidth not judged; nodes is None when
    the output has no rank lines to count them by). Wrong values or
    NCCL/CUDA failures are `fail`; a run that produced no table (a launch that failed: mpirun
    short of slots) is `error`, a tool problem and never a node fault."""
    rep = parse(text)
    nodes = len(rep.hosts) or None
    if rep.errors:
        nccl_failures = [e for e in rep.errors if "Test NCCL failure" in e]
        if nccl_failures and all(INVALID_USAGE in e for e in nccl_failures) and \
                not any("CUDA failure" in e for e in rep.errors):
            # ncclInvalidUsage: the setup (NCCL_NET naming a missing plugin...), alike on every node
            return _result("error", f"nccl-tests could not run as configured: {nccl_failures[0]}",
                           exit_code=exit_code)
        return _result("fail", f"nccl-tests reported: {rep.errors[0]}", COLLECTIVE, exit_code=exit_code)
    if any(r.wrong for r in rep.rows) or (rep.out_of_bounds or 0) > 0:
        return _result("fail", "nccl-tests found wrong values in the reduction (#wrong or out of bounds "
                       "> 0)", COLLECTIVE, exit_code=exit_code)
    if not rep.rows:
        return _result("error", f"no result table in all_reduce_perf's output (exit {exit_code}): it did "
                       "not run", exit_code=exit_code)
    r = rep.at(size)
    if r is None:
        sizes = ", ".join(str(x.size) for x in rep.rows[-3:])
        return _result("error", f"no row for {size} bytes in the table (largest sizes: {sizes})",
                       exit_code=exit_code)
    meas = {"bus_bandwidth_bytes_per_second": r.busbw * GB, "size_bytes": float(size)}
    if nodes:
        meas["nodes"] = float(nodes)
    on = f"on {nodes} node(s)" if nodes else "on the nodes it ran on"
    if rep.avg_failed:  # exit 7: the average under 0.9 x NCCL_TESTS_MIN_BW, the run's own threshold
        return _result("fail", f"nccl-tests' average bus bandwidth is under NCCL_TESTS_MIN_BW (FAILED, "
                       f"exit {exit_code}); busbw {r.busbw:.1f} GB/s at {size} bytes {on}", BANDWIDTH, meas,
                       exit_code)
    if exit_code not in (0, None):
        return _result("error", f"all_reduce_perf exited {exit_code}", meas=meas, exit_code=exit_code)
    exp = expected(nodes)
    if exp is None:
        return _result("pass", f"busbw {r.busbw:.1f} GB/s at {size} bytes {on}; no expected "
                       "value to judge it by", meas=meas, exit_code=exit_code)
    meas["expected_bus_bandwidth_bytes_per_second"] = exp * GB
    floor = exp * min_fraction
    if r.busbw < floor:
        return _result("fail", f"busbw {r.busbw:.1f} GB/s at {size} bytes {on}, under "
                       f"{floor:.1f} ({min_fraction:g} x the expected {exp:g})", BANDWIDTH, meas, exit_code)
    return _result("pass", f"busbw {r.busbw:.1f} GB/s at {size} bytes {on} (expected "
                   f"{exp:g})", meas=meas, exit_code=exit_code)
