"""One result file per check in <state_dir>/active/, written atomically (exporter.state.file).

A result says what one run of one check found: its outcome (RESULTS), when it started and
finished, the tool's exit code, per-GPU findings and measurements, and when the check last
passed (carried over from the file it replaces, for the "no pass for N days" alert). A result
is valid for `valid_for_s` after it finished; past that the verdict treats it as absent.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from exporter.state.file import read_state_file, write_json_atomic

log = logging.getLogger("exporter.activecheck")

CHECKS = ("nvml", "efa", "dcgm", "nccl")  # the order the suite runs them in; a bounded label
RESULTS = ("pass", "warn", "fail", "skip", "timeout", "error")
GPU_STATUSES = ("pass", "warn", "fail", "skip")
SUBDIR = "active"
VERSION = 1
MAX_RESULT_BYTES = 1 << 20


@dataclass
class Finding:
    """One test's outcome on one GPU ("" when the tool did not say which)."""

    gpu: str
    test: str
    status: str  # GPU_STATUSES
    category: str = ""  # DCGM's category (Deployment, Hardware, Integration, Performance, Custom)
    error_ids: list[int] = field(default_factory=list)
    isolate: bool = False  # DCGM gave an error of ISOLATE severity for it
    message: str = ""


@dataclass
class CheckResult:
    check: str
    result: str  # RESULTS
    reason: str = ""
    started_at: float = 0.0  # Unix time
    finished_at: float = 0.0
    exit_code: int | None = None
    tool: str = ""
    findings: list[Finding] = field(default_factory=list)
    measurements: dict[str, float] = field(default_factory=dict)
    valid_for_s: float = 86400.0
    last_pass_at: float | None = None
    output_tail: str = ""  # the tool's last output, for a post-mortem

    @property
    def duration_s(self) -> float:
        return max(0.0, self.finished_at - self.started_at)

    def age_s(self, now: float) -> float:
        return max(0.0, now - self.finished_at)

    def valid(self, now: float) -> bool:
        """Whether it still says something about the node: finished less than valid_for_s ago
        (and not in the future: a clock stepped back makes it unknowable, so absent)."""
        return self.finished_at <= now + 60 and now - self.finished_at < self.valid_for_s


def path_of(state_dir: str | os.PathLike[str], check: str) -> Path:
    return Path(state_dir, SUBDIR, f"{check}.json")


def to_json(r: CheckResult) -> dict[str, Any]:
    return {"version": VERSION, **asdict(r)}


def _number(d: dict[str, Any], key: str, nullable: bool = False) -> Any:
    v = d.get(key)
    if v is None and nullable:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{key}: expected a finite number, got {v!r}")
    return v


def from_json(d: Any) -> CheckResult:
    """A result from its file's JSON; ValueError naming the key when it is not one."""
    if not isinstance(d, dict):
        raise ValueError("not a JSON object")
    if d.get("version") != VERSION:
        raise ValueError(f"version: expected {VERSION}, got {d.get('version')!r}")
    if d.get("check") not in CHECKS:
        raise ValueError(f"check: expected one of {', '.join(CHECKS)}, got {d.get('check')!r}")
    if d.get("result") not in RESULTS:
        raise ValueError(f"result: expected one of {', '.join(RESULTS)}, got {d.get('result')!r}")
    findings = []
    for i, f in enumerate(d.get("findings") or []):
        if not isinstance(f, dict) or f.get("status") not in GPU_STATUSES:
            raise ValueError(f"findings[{i}]: expected an object with a status in {', '.join(GPU_STATUSES)}")
        ids = f.get("error_ids") or []
        if not isinstance(ids, list) or not all(isinstance(x, int) for x in ids):
            raise ValueError(f"findings[{i}].error_ids: expected a list of integers")
        findings.append(Finding(str(f.get("gpu", "")), str(f.get("test", "")), f["status"],
                                str(f.get("category", "")), ids, bool(f.get("isolate")),
                                str(f.get("message", ""))))
    meas = d.get("measurements") or {}
    if not isinstance(meas, dict):
        raise ValueError("measurements: expected an object")
    exit_code = d.get("exit_code")
    if exit_code is not None and (isinstance(exit_code, bool) or not isinstance(exit_code, int)):
        raise ValueError(f"exit_code: expected an integer or null, got {exit_code!r}")
    return CheckResult(
        check=d["check"], result=d["result"], reason=str(d.get("reason", "")),
        started_at=_number(d, "started_at"), finished_at=_number(d, "finished_at"),
        exit_code=exit_code, tool=str(d.get("tool", "")), findings=findings,
        measurements={str(k): _number(meas, k) for k in meas},
        valid_for_s=_number(d, "valid_for_s"), last_pass_at=_number(d, "last_pass_at", nullable=True),
        output_tail=str(d.get("output_tail", "")))


def read(state_dir: str | os.PathLike[str], check: str) -> CheckResult | None:
    """The check's last result; None when there is none. Raises ValueError/OSError naming the
    file when it cannot be read or is not a result."""
    import json

    p = path_of(state_dir, check)
    try:
        raw = read_state_file(p, MAX_RESULT_BYTES)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise OSError(f"{p}: {e.strerror or e}") from e
    try:
        r = from_json(json.loads(raw))
    except ValueError as e:  # JSONDecodeError is one
        raise ValueError(f"{p}: {e}") from e
    if r.check != check:
        raise ValueError(f"{p}: check: holds {r.check!r}, not {check!r}")
    return r


NO_VERDICT = ("skip", "timeout", "error")  # a run that could not make the check: nothing about the node


def write(state_dir: str | os.PathLike[str], r: CheckResult) -> bool:
    """Write `r` as the check's result, carrying over when it last passed. A `skip` says nothing
    about the node, so it never replaces a result that is still valid; nor does a `timeout` or an
    `error` replace a valid `fail` (a failure is not hidden by a later run that could not make the
    check: a dcgmi that hangs on the GPU that failed). Returns whether it was written; raises
    OSError."""
    try:
        old = read(state_dir, r.check)
    except (OSError, ValueError) as e:
        log.warning("replacing an unreadable result: %s", e)
        old = None
    if old is not None:
        if old.valid(r.finished_at) and (r.result == "skip" and old.result != "skip"
                                         or r.result in NO_VERDICT and old.result == "fail"):
            return False
        if r.last_pass_at is None:
            r.last_pass_at = old.last_pass_at
    if r.result == "pass":
        r.last_pass_at = r.finished_at
    write_json_atomic(path_of(state_dir, r.check), to_json(r))
    return True
