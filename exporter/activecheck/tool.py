"""Run one diagnostic tool under a deadline, in its own process group.

A tool that hangs (dcgmi waiting on a sick GPU, all_reduce_perf stuck in a collective) is killed
with its whole process group at its deadline: SIGTERM, then SIGKILL `grace_s` later. mpirun and
nv-hostengine's children are in that group, so nothing it started outlives the check. Output
(stdout and stderr together) is read as it comes and kept up to MAX_OUTPUT_BYTES, its start and
its end, so a tool that floods its output costs CPU, never memory.

The call returns by `timeout_s + grace_s` whatever the tool does: a child that left the group
(setsid) and keeps the pipe open is not waited for, nor is a process stuck in the kernel (D
state) that SIGKILL cannot end yet. A tool that exited is judged by its exit status and what it
printed even when such a child still holds the pipe (EXIT_EOF_WAIT_S later, reading stops), and
what it left in its group is ended.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

KILL_GRACE_S = 5.0
EXIT_EOF_WAIT_S = 0.5  # after the tool exited, how long its output may still come
REAP_WAIT_S = 0.5  # after SIGKILL, how long to wait to reap it (a D-state process may not die)
MAX_OUTPUT_BYTES = 4 << 20
CHUNK = 1 << 16


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


def _reap(proc: subprocess.Popen[bytes], wait_s: float) -> None:
    """Wait up to wait_s for it; one that is not reaped by then is left to subprocess's own
    reaping of abandoned children (a process in D state dies when the kernel lets it)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(wait_s)


def kill_group(proc: subprocess.Popen[bytes], grace_s: float = KILL_GRACE_S) -> None:
    """End a process started in its own session and everything in its group: SIGTERM, SIGKILL
    grace_s later; returns within grace_s + REAP_WAIT_S."""
    _kill_group(proc, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    _kill_group(proc, signal.SIGKILL)  # the leader, or whatever of its group ignored SIGTERM
    _reap(proc, REAP_WAIT_S)


class _Capture:
    """The start and the end of a stream, at most MAX_OUTPUT_BYTES in all."""

    def __init__(self) -> None:
        self.half = MAX_OUTPUT_BYTES // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.cut = False

    def add(self, data: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.half:  # trimmed now and then, not on every chunk
                del self.tail[:-self.half]
                self.cut = True

    def text(self) -> str:
        tail = self.tail
        if len(tail) > self.half:
            tail, self.cut = tail[-self.half:], True
        cut = b"\n[... output cut ...]\n" if self.cut else b""
        return bytes(self.head + cut + tail).decode("utf-8", "replace")


def _read_until(sel: selectors.BaseSelector, cap: _Capture, until: float,
                proc: subprocess.Popen[bytes] | None) -> bool:
    """Read into cap until EOF (True), the monotonic time `until`, or, with proc, until it has
    exited (False)."""
    while (left := until - time.monotonic()) > 0:
        if proc is not None and proc.poll() is not None:
            return False
        for key, _ in sel.select(min(left, 0.1)):
            data = os.read(key.fd, CHUNK)
            if not data:
                return True
            cap.add(data)
    return False


class _Start:
    """A signal handler that raises (`active`'s SIGTERM and SIGINT) must not raise inside Popen: the
    child is forked before Popen returns, and with the exception its pid would be lost, the tool
    left running on the GPUs. While a tool starts, `interrupt` holds the raise; `run` makes it once
    the tool's process group is known (tests/test_active_tools.py, a signal to `active`)."""

    starting = False
    held: Callable[[], None] | None = None


def interrupt(raise_it: Callable[[], None]) -> None:
    """For a signal handler: `raise_it()` now, or, while a tool is starting, as soon as it started."""
    if _Start.starting:
        _Start.held = raise_it
    else:
        raise_it()


def _raise_held() -> None:
    held, _Start.held = _Start.held, None
    if held is not None:
        held()


def run(argv: Sequence[str], timeout_s: float, env: dict[str, str] | None = None,
        grace_s: float = KILL_GRACE_S) -> ToolRun:
    """Run `argv` for at most `timeout_s` seconds (then its process group gets SIGTERM, and
    SIGKILL grace_s later). Returns within timeout_s + grace_s + REAP_WAIT_S + EXIT_EOF_WAIT_S."""
    start = time.monotonic()
    _Start.starting = True
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)
    except OSError as e:
        _Start.starting = False
        _raise_held()
        return ToolRun(list(argv), None, "", 0.0, error=f"cannot start {argv[0]}: {e.strerror or e}")
    try:
        _Start.starting = False
        _raise_held()
        return _supervise(proc, list(argv), start, timeout_s, grace_s)
    except BaseException:  # interrupted (SIGTERM, SIGINT): the tool must not outlive the command
        _kill_group(proc, signal.SIGKILL)
        _reap(proc, REAP_WAIT_S)
        raise


def _supervise(proc: subprocess.Popen[bytes], argv: list[str], start: float, timeout_s: float,
               grace_s: float) -> ToolRun:
    assert proc.stdout is not None
    cap = _Capture()
    deadline = start + max(0.0, timeout_s)
    with proc.stdout, selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        eof = _read_until(sel, cap, deadline, proc)
        if eof:  # it closed its output: wait for its exit, up to its deadline
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
        timed_out = proc.poll() is None
        if timed_out:
            _kill_group(proc, signal.SIGTERM)
            term_until = time.monotonic() + grace_s
            if not eof:
                eof = _read_until(sel, cap, term_until, proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, term_until - time.monotonic()))
        # what it left in its group: orphans on the GPUs, or (timed out) what ignored SIGTERM
        _kill_group(proc, signal.SIGKILL)
        _reap(proc, REAP_WAIT_S)
        if not eof:  # its last words, unless a child that left its group holds the pipe
            _read_until(sel, cap, time.monotonic() + EXIT_EOF_WAIT_S, None)
    code = None if timed_out else proc.returncode
    return ToolRun(argv, code, cap.text(), time.monotonic() - start, timed_out=timed_out)
