"""Run one diagnostic tool under a deadline, in its own process group.

A tool that hangs (dcgmi waiting on a sick GPU, all_reduce_perf stuck in a collective) is killed
with its whole process group at its deadline: SIGTERM, then SIGKILL after KILL_GRACE_S. mpirun
and nv-hostengine's children are in that group, so nothing it started outlives the check. Output
(stdout and stderr together) is kept up to MAX_OUTPUT_BYTES, its start and its end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

KILL_GRACE_S = 5.0
MAX_OUTPUT_BYTES = 4 << 20


@dataclass
class ToolRun:
    argv: list[str]
    exit_code: int | None  # None: killed at its deadline, or never started
    output: str
    duration_s: float
    timed_out: bool = False
    error: str = ""  # it could not be started

    def tail(self, n: int = 2000) -> str:
        return self.output[-n:]


def find(name: str) -> str | None:
    """The tool's path: `name` when it is a path to an executable, else looked up on PATH."""
    if os.sep in name:
        return name if os.access(name, os.X_OK) and os.path.isfile(name) else None
    return shutil.which(name)


def _kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End a process started in its own session and everything in its group, and reap it."""
    _kill_group(proc, signal.SIGTERM)
    try:
        proc.wait(KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        _kill_group(proc, signal.SIGKILL)
        proc.wait()


def _capped(data: bytes) -> str:
    if len(data) > MAX_OUTPUT_BYTES:
        half = MAX_OUTPUT_BYTES // 2
        data = data[:half] + b"\n[... output cut ...]\n" + data[-half:]
    return data.decode("utf-8", "replace")


def run(argv: Sequence[str], timeout_s: float, env: dict[str, str] | None = None) -> ToolRun:
    """Run `argv` for at most `timeout_s` seconds (then its process group is killed)."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)
    except OSError as e:
        return ToolRun(list(argv), None, "", 0.0, error=f"cannot start {argv[0]}: {e.strerror or e}")
    try:
        out, _ = proc.communicate(timeout=max(0.0, timeout_s))
        return ToolRun(list(argv), proc.returncode, _capped(out), time.monotonic() - start)
    except subprocess.TimeoutExpired:
        pass
    _kill_group(proc, signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        _kill_group(proc, signal.SIGKILL)
        try:
            out, _ = proc.communicate(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:  # a child that left the group still holds the pipe
            proc.kill()
            if proc.stdout is not None:
                proc.stdout.close()
            proc.wait()
            out = b""
    _kill_group(proc, signal.SIGKILL)  # whatever of the group ignored SIGTERM
    return ToolRun(list(argv), None, _capped(out or b""), time.monotonic() - start, timed_out=True)
