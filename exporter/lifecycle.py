"""Process lifecycle: what the process sets up at start (one malloc arena, the open-file limit,
SIGHUP held), the signal wait, the validated reload (SIGHUP -> re-exec in place), the shutdown
with its watchdog, and the exit that joins no stuck thread."""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from exporter import reload_snapshot
from exporter.arguments import cli_overrides
from exporter.config import ConfigError, load

if TYPE_CHECKING:
    from exporter.collector import Context

log = logging.getLogger("exporter")


class Closeable(Protocol):  # the simulated node (exporter.tools.simulate.Simulation), closed last
    def close(self) -> None: ...


def limit_malloc_arenas(arenas: int = 1) -> None:
    """Keep glibc from giving each collector thread its own malloc arena.

    Every thread that allocates gets an arena of its own (up to 8 per core), and each keeps freed
    memory: with the collector, reader and HTTP threads that grew RSS from 37 to 47 MiB over
    1,800 scrapes of a simulated p5, against 36 to 38 MiB with one arena (docs/performance.md).
    Our threads mostly wait on I/O, so one arena costs no measurable time. mallopt(M_ARENA_MAX)
    must run before the threads start; where it is not glibc this does nothing.
    """
    import ctypes
    import ctypes.util

    if os.environ.get("MALLOC_ARENA_MAX"):
        return  # the operator chose
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-8, arenas)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


TRIM_EVERY_S = 60.0


class MallocTrim:
    """Hands the memory glibc's malloc holds freed back to the kernel (malloc_trim): once the
    first collection is done, then at most every `every_s`, from the main thread's signal wait.

    glibc gives freed memory back only from the top of the heap, above a threshold that grows
    with the largest block freed, so the start-up peak (NVML's init, the first collection and
    render) stayed resident: 59.5 to 69.6 MiB on a real H100 across runs, 57.6 to 58.1 MiB with
    the trim (docs/real-gpu.md). A trim takes about 0.1 ms. Where the C library is not glibc this
    does nothing."""

    def __init__(self, ready: threading.Event, every_s: float = TRIM_EVERY_S,
                 trim: Callable[[], Any] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.ready, self.every_s, self.clock = ready, every_s, clock
        self.trim = trim or _malloc_trim()
        self.last: float | None = None

    def tick(self) -> None:
        if not self.ready.is_set():
            return
        now = self.clock()
        if self.last is not None and now - self.last < self.every_s:
            return
        self.last = now
        self.trim()


def _malloc_trim() -> Callable[[], Any]:
    import ctypes

    try:
        return functools.partial(ctypes.CDLL(None).malloc_trim, 0)  # the process's own libc
    except (OSError, AttributeError):
        return lambda: None


def raise_fd_limit() -> None:
    """Lift the soft limit on open files to the hard one, as Go programs (node_exporter) do at
    start: the EFA counter files stay open, 37 per device with efa.counters all (1,184 on a p5),
    past the 1,024 soft limit that systemd and most shells set. Run at process start (the daemon
    and the one-shot commands), never by a collector's constructor."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 1 << 16 if hard == resource.RLIM_INFINITY else hard
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (OSError, ValueError):
        pass  # not allowed (a sandbox): a device whose files cannot be opened reports why


def hold_sighup() -> None:
    """Keep SIGHUP pending instead of letting it act, from here on and across the reload's exec.

    SIGHUP's default action ends the process, and a handler does not survive execve: with a
    handler, a SIGHUP that came between the reload's exec and the new handler (two reloads about
    a second apart) killed the exporter. A blocked signal stays pending, and both the mask and
    the pending set survive execve; `Signals.wait` takes SIGHUP with sigtimedwait once serving.
    Called first thing in serve(), before any thread starts, so every thread inherits the mask.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})


class Signals:
    """SIGTERM and SIGINT stop the exporter; SIGHUP (held pending since start-up, see
    hold_sighup) asks it to reload its configuration. A SIGHUP that arrives while a reload is
    under way stays pending and is taken by the restarted process: a second reload, never a kill."""

    POLL_S = 0.25  # how soon a SIGTERM caught on another thread ends the wait

    def __init__(self) -> None:
        self._event = threading.Event()
        self._last = signal.SIGTERM

    def install(self) -> Signals:
        """Take SIGTERM and SIGINT from here on (the process's handlers: the daemon calls this
        once it serves, not the constructor)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handler)
        hold_sighup()
        return self

    def _handler(self, signum: int, _frame: Any) -> None:
        self._last = signal.Signals(signum)
        self._event.set()

    def wait(self, tick: Callable[[], Any] | None = None) -> signal.Signals:
        """The next signal; `tick` runs every POLL_S meanwhile (on this, the main, thread)."""
        while not self._event.is_set():
            if tick is not None:
                tick()
            info = signal.sigtimedwait({signal.SIGHUP}, self.POLL_S)
            # CPython returns an empty siginfo (si_signo 0), not None, when the wait was interrupted
            # (EINTR: SIGCONT after a SIGSTOP, SIGCHLD) and its timeout has passed meanwhile.
            if info is not None and info.si_signo == signal.SIGHUP:
                return signal.SIGHUP
        self._event.clear()
        return self._last


def shutdown(ctx: Context, server: Any, runner: Any, timeout_s: float, then: Any = None,
             simulation: Closeable | None = None) -> None:
    """Stop within `timeout_s` whatever a source is doing: the XID state file is flushed first,
    then the server and collectors are stopped. A watchdog ends the process at the deadline if a
    step is stuck (a read blocked in NVML or the kernel cannot be interrupted); then() runs at the
    end either way (re-exec on reload). The process exits through exit_now(), never through the
    interpreter's exit, which would join pool threads stuck in such reads."""
    done = threading.Event()

    def watchdog() -> None:
        if done.wait(timeout_s):
            return
        stuck = sorted({t.name.rstrip("0123456789_-") for t in threading.enumerate()
                        if t is not threading.current_thread() and t.is_alive()})
        log.error("shutdown did not finish within %gs (threads still busy: %s); exiting now",
                  timeout_s, ", ".join(stuck) or "none")
        (then or exit_now)()

    threading.Thread(target=watchdog, name="shutdown-watchdog", daemon=True).start()
    deadline = time.monotonic() + timeout_s
    if ctx.xid is not None:  # flush its counts before anything else can hang
        ctx.xid.stop(max(0.1, (deadline - time.monotonic()) * 0.5))
    server.shutdown()
    runner.close()
    ctx.identity.close()
    ctx.pool.close()  # idle workers leave; one blocked in a read leaves when it returns
    if simulation is not None:
        simulation.close()
    done.set()
    log.info("shut down cleanly")
    if then is not None:
        then()


def exit_now(code: int = 0) -> None:
    """Flush output and leave without the interpreter's exit handlers (which join every pool
    thread, also one blocked in an NVML call or a kernel read for minutes)."""
    logging.shutdown()
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            f.flush()
    os._exit(code)


def reexec() -> None:
    """Start again in this process (same pid, for systemd and the kubelet) with the same
    arguments, so the new configuration is read the one way it is read at start."""
    logging.shutdown()
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            f.flush()
    os.execv(sys.executable, [sys.executable, "-m", "exporter", *sys.argv[1:]])


def reload_is_valid(args: argparse.Namespace) -> bool:
    """SIGHUP: validate the configuration before giving anything up (a bad edit must not take the
    exporter down) and hand the validated bytes to the exec'd process. False (logged): keep
    serving the running configuration."""
    from exporter.web.webconfig import load_web_config

    try:
        with reload_snapshot.recording() as validated:
            load_web_config(load(args.config, cli_overrides(args)).web.config_file)
        # the exec'd process starts from these validated bytes (config, web config, TLS
        # files), not from files that may have changed since: an edit between this check
        # and the exec must neither stop it nor run unvalidated
        reload_snapshot.hand_over(validated)
    except (ConfigError, ValueError) as e:
        log.error("SIGHUP: not reloading, the configuration is invalid (still serving the running "
                  "one): %s", e)
        return False
    except OSError as e:  # no memory file for the hand-over
        log.error("SIGHUP: not reloading (still serving the running configuration): %s", e)
        return False
    return True
