"""Command line: serve the metrics (default), or run a subcommand (check, ack)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import logging
import os
import pkgutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from exporter import __version__, collectors, commands, logs, reload_snapshot
from exporter.collector import Context
from exporter.collectors import kubernetes as kubernetes_flags
from exporter.collectors import workload as workload_flags
from exporter.compose import compose
from exporter.config import DEFAULT_PORT, ConfigError, load
from exporter.deadline import Pool
from exporter.nvml.session import NvmlSession
from exporter.profiles import SIMULATED

if TYPE_CHECKING:
    from exporter.simulate import SimulatedSources, Simulation

log = logging.getLogger("exporter")

SIM_PLAY_S = 60.0  # one-shot commands on a simulated node: the node as it is this long after start

# --simulate.NAME: the simulated node's shape (exporter.simulate.Shape)
SHAPE_FLAGS = {
    "gpus": "GPUs (0 to 16; default: the profile's)",
    "efa_devices": "EFA devices (0 to 64, at most the instance family's PCI layout: 32 on p5; "
                   "default: the profile's)",
    "lustre_osts": "OSTs of its FSx for Lustre mount (1 to 4096; default: 8)",
}

PATH_FLAGS = {
    "sysfs": "Root of sysfs (EFA counters, Lustre sysfs files).",
    "procfs": "Root of procfs (mounts, Lustre procfs files, boot id).",
    "debugfs": "Root of debugfs (Lustre client stats on 2.12+).",
    "kmsg": "Kernel log device to read XIDs from (or a file of /dev/kmsg records).",
    "state-dir": "Directory for the state file that keeps XID counts across restarts.",
}


def add_source_options(p: argparse.ArgumentParser) -> None:
    """Options shared by the daemon and the one-shot commands: where every source reads from."""
    p.add_argument("--config", metavar="FILE", help="YAML configuration file (see docs/configuration.md).")
    p.add_argument("--log.level", "--log-level", dest="log_level", metavar="LEVEL",
                   choices=["debug", "info", "warn", "warning", "error"],
                   help="Log level: debug, info, warn, error (overrides log_level in the config).")
    p.add_argument("--log.format", dest="log_format", choices=logs.FORMATS,
                   help="Log line format: logfmt (default) or json, one record a line "
                        "(overrides log_format).")
    p.add_argument("--simulate", metavar="PROFILE", choices=SIMULATED,
                   help="Run against a simulated node: fake NVML and generated sysfs/procfs/debugfs "
                        "trees and kernel log. One of: " + ", ".join(SIMULATED) + ".")
    p.add_argument("--scenario", metavar="NAME", action="append", default=[],
                   help="Inject a fault scenario into the simulated node (repeatable); "
                        "--list-scenarios shows them.")
    for name, doc in SHAPE_FLAGS.items():
        p.add_argument(f"--simulate.{name.replace('_', '-')}", dest=f"simulate_{name}", metavar="N", type=int,
                       help=f"With --simulate, the simulated node's {doc}, for benchmarks at other sizes; "
                            "the expected counts follow.")
    p.add_argument("--nvml-capture", metavar="FILE",
                   help="Use the fake NVML backend replaying this capture (made by `capture`).")
    p.add_argument("--nvml-latencies", action="store_true",
                   help="With the fake backend: sleep each call's captured latency, to model real NVML cost.")
    p.add_argument("--kmsg-file", metavar="FILE",
                   help="Replay a file of /dev/kmsg records (a saved log), or a capture's kernel-log "
                        "records, instead of the device.")
    for name, doc in PATH_FLAGS.items():
        p.add_argument(f"--path.{name}", dest=f"path_{name.replace('-', '_')}", metavar="PATH", help=doc)
    workload_flags.add_flags(p)
    kubernetes_flags.add_flags(p)
    p.add_argument("--collectors", metavar="LIST",
                   help="Comma-separated collectors to run, and only those (default: those enabled in the "
                        "config); the same as --collector.disable-defaults with --collector.NAME for each.")


def add_collector_options(p: argparse.ArgumentParser) -> None:
    """node_exporter's --collector.NAME / --no-collector.NAME for every registered collector."""
    for name, cls in collectors.collector_classes().items():
        p.add_argument(f"--collector.{name}", dest=f"collector_{name}", action=argparse.BooleanOptionalAction,
                       help=f"Enable (or with --no-, disable) the {name} collector ({cls.docs_group}); "
                            f"overrides {name}.enabled.")
    p.add_argument("--collector.disable-defaults", dest="collector_disable_defaults", action="store_true",
                   help="Disable every collector but those enabled with --collector.NAME.")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-health-exporter",
        description="Per-node Prometheus exporter for GPU (NVML), XID, EFA and FSx for Lustre health. "
                    "Without a subcommand it serves /metrics.",
        epilog="Subcommands: " + ", ".join(
            f"'{n}' ({m.HELP})" for n, m in _commands().items()) + ". Run SUBCOMMAND --help for theirs.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--web.listen-address", "--listen", dest="listen", metavar="HOST:PORT",
                   help=f"Address to serve on (default 0.0.0.0:{DEFAULT_PORT}).")
    p.add_argument("--web.telemetry-path", dest="telemetry_path", metavar="PATH",
                   help="Path under which to serve the metrics (default /metrics).")
    p.add_argument("--web.config.file", dest="web_config_file", metavar="FILE",
                   help="Web config file (exporter-toolkit format: TLS, basic auth); "
                        "see docs/configuration.md.")
    p.add_argument("--list-scenarios", action="store_true",
                   help="List the simulation's fault scenarios and exit.")
    add_source_options(p)
    add_collector_options(p)
    return p


def _commands() -> dict[str, Any]:
    out = {}
    for mod in pkgutil.iter_modules(commands.__path__):
        out[mod.name] = importlib.import_module(f"{commands.__name__}.{mod.name}")
    return out


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


def setup_logging(level: str, fmt: str = "logfmt") -> None:
    logs.setup(level, fmt)


def cannot_start(args: argparse.Namespace, why: str) -> int:
    """The daemon cannot start: say why and return exit status 2. With `--log.format` on the
    command line the message is a log record in that format (a log pipeline reads it like any
    other); otherwise plain text for the person at the terminal (the config file's log_format
    may be what could not be read)."""
    if args.log_format:
        setup_logging("error", args.log_format)
        log.error("cannot start: %s", why)
    else:
        print(f"gpu-health-exporter: {why}", file=sys.stderr)
    return 2


def build_context(args: argparse.Namespace) -> tuple[Context, Simulation | None]:
    """Load the config (file, then the simulated node's roots, then CLI flags) and build the
    sources' backends: the composition root. `--simulate` prepares the simulated node, which
    hands its sources in here once (exporter.simulate.SimulatedSources). Returns the Context
    and the simulated node (None on a real node), which the caller starts, plays and closes."""
    collectors.discover()  # the collectors add their config sections to the schema
    simulation = simulated_node(args)
    try:
        sources = simulation.prepare(args.nvml_latencies) if simulation is not None else None
        # the simulated node's roots; a replayed capture's node is not this machine: no IMDS
        layer = sources.config() if sources else {"instance.imds": False} if args.nvml_capture else {}
        cfg = load(args.config, {**layer, **cli_overrides(args)})
    except Exception:
        if simulation is not None:
            simulation.close()
        raise
    pool = Pool()  # every read under a deadline (exporter.deadline); closed by shutdown()
    if args.nvml_capture:  # a capture's GPUs (on the simulated node's trees with --simulate)
        nvml = NvmlSession.for_capture(args.nvml_capture, args.nvml_latencies, pool)
    else:
        nvml = NvmlSession(make=sources.nvml, pool=pool) if sources else NvmlSession.real(pool)
    source, acks_file = xid_source(cfg, args, sources)
    ctx = compose(cfg, nvml=nvml, statvfs=sources.statvfs if sources else os.statvfs,
                  imds_url=sources.imds_url if sources else None, pool=pool, xid_source=source,
                  xid_acks_file=acks_file)
    return ctx, simulation


def simulated_node(args: argparse.Namespace) -> Simulation | None:
    """The simulated node `--simulate` asks for, with its scenarios and shape; None without it."""
    shape = {name: getattr(args, f"simulate_{name}") for name in SHAPE_FLAGS}
    if not args.simulate:
        given = ["--scenario"] * bool(args.scenario) + [
            f"--simulate.{name.replace('_', '-')}" for name, v in shape.items() if v is not None]
        if given:
            raise ConfigError(f"command line: {given[0]} needs --simulate PROFILE")
        return None
    from exporter.simulate import Shape, Simulation

    return Simulation(args.simulate, args.scenario, shape=Shape(**shape))


def xid_source(cfg: Any, args: argparse.Namespace,
               sources: SimulatedSources | None) -> tuple[str | None, Any]:
    """Which kernel log the XID service's counts come from, and its acks file's kind: the
    simulated node's unless a flag names another (each set of scenario flags its own, its acks
    file the node's), a replayed capture (its file, not the temporary copy of its records), else
    paths.kmsg (None, and the product's acks file: None)."""
    if sources is not None and not (args.kmsg_file or args.path_kmsg):
        return sources.kmsg_source, sources.xid_acks_file
    replay = args.kmsg_file and cfg.paths.kmsg != args.kmsg_file
    return (os.path.abspath(args.kmsg_file) if replay else None), None


def cli_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Config keys set by command-line flags (they win over the file)."""
    overrides: dict[str, Any] = {}
    if getattr(args, "listen", None):
        overrides["listen"] = args.listen
    if getattr(args, "web_config_file", None):
        overrides["web.config_file"] = args.web_config_file
    if getattr(args, "telemetry_path", None):
        overrides["web.telemetry_path"] = args.telemetry_path
    if args.log_level:
        overrides["log_level"] = args.log_level
    if args.log_format:
        overrides["log_format"] = args.log_format
    overrides.update({f"{name}.enabled": on for name, on in enabled_by_flags(args).items()})
    for name in PATH_FLAGS:
        v = getattr(args, f"path_{name.replace('-', '_')}")
        if v:
            overrides[f"paths.{name.replace('-', '_')}"] = v
    if args.kmsg_file:
        overrides["paths.kmsg"] = kmsg_replay_path(args.kmsg_file)
    overrides.update(workload_flags.flag_overrides(args))
    overrides.update(kubernetes_flags.flag_overrides(args))
    return overrides


def kmsg_replay_path(path: str) -> str:
    """`--kmsg-file` takes a file of /dev/kmsg records, or a capture made by `capture` (its
    kernel-log records are written to a file of records, one per capture file, and that is read).
    That file lives in a private directory (0700, ours): another user cannot plant or swap it."""
    import hashlib
    import stat
    import tempfile

    from exporter.capture import kmsg_of_capture

    text = kmsg_of_capture(path)
    if text is None:
        return path
    base = os.path.join(tempfile.gettempdir(), f"gpu-health-exporter-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(base, 0o700)
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        base = tempfile.mkdtemp(prefix="gpu-health-exporter-")  # not ours: a fresh private one
    name = hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:16]
    out = os.path.join(base, f"kmsg-{name}.txt")
    fd, tmp = tempfile.mkstemp(dir=base, prefix=".kmsg-", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, out)
    return out


def enabled_by_flags(args: argparse.Namespace) -> dict[str, bool]:
    """Collectors switched on or off by --collectors, --collector.disable-defaults and
    --[no-]collector.NAME (node_exporter's rules: disable-defaults turns off every collector not
    named with --collector.NAME; --collectors LIST is that for the collectors listed)."""
    known = collectors.collector_classes()
    out: dict[str, bool] = {}
    only = selected(args)
    if only is not None or getattr(args, "collector_disable_defaults", False):
        out = {name: name in (only or ()) for name in known}
    for name in known:
        on = getattr(args, f"collector_{name}", None)
        if on is not None:
            out[name] = on
    return out


def selected(args: argparse.Namespace) -> list[str] | None:
    if not args.collectors:
        return None
    names = [n.strip() for n in args.collectors.split(",") if n.strip()]
    known = collectors.collector_classes()
    for n in names:
        if n not in known:
            raise ConfigError(f"command line: unknown collector {n!r} in --collectors; expected some of "
                              + ", ".join(known))
    return names


def serve(args: argparse.Namespace) -> int:
    hold_sighup()  # before anything else (no thread exists yet): see there
    from exporter.webconfig import load_web_config

    try:
        ctx, simulation = build_context(args)
        web = load_web_config(ctx.config.web.config_file)
    except (ConfigError, ValueError) as e:
        return cannot_start(args, str(e))
    reload_snapshot.release()  # loaded: the next reload reads the files again
    from exporter.runner import Runner
    from exporter.server import Server, limits_from_config

    cfg = ctx.config
    setup_logging(cfg.log_level, cfg.log_format)
    limit_malloc_arenas()
    built = collectors.build(ctx)
    runner = Runner.from_config(built, cfg, ctx.pool)
    host, _, port = cfg.listen.rpartition(":")
    path = cfg.web.telemetry_path
    try:
        server = Server(runner, host.strip("[]"), int(port), web, limits_from_config(cfg),
                        telemetry_path=path)
    except OSError as e:
        return cannot_start(args, f"cannot listen on {cfg.listen}: {e.strerror or e}")
    signals = Signals()
    if simulation is not None:
        simulation.start()
    ctx.identity.start()  # the IMDS lookup, if config leaves something to ask (never from a scrape)
    runner.start()
    server.start()
    log.info("serving %s%s with collectors %s%s", served_url(server.tls, host, server.port, path),
             " (basic auth)" if web.users else "", ",".join(c.name for c in built),
             f" (simulated {simulation.profile.instance_type} under {simulation.root})"
             if simulation else "")
    reload = False
    trim = MallocTrim(runner.ready)
    while True:
        sig = signals.wait(tick=trim.tick)
        if sig != signal.SIGHUP:
            break
        try:  # validate before giving anything up: a bad edit must not take the exporter down
            with reload_snapshot.recording() as validated:
                load_web_config(load(args.config, cli_overrides(args)).web.config_file)
            # the exec'd process starts from these validated bytes (config, web config, TLS
            # files), not from files that may have changed since: an edit between this check
            # and the exec must neither stop it nor run unvalidated
            reload_snapshot.hand_over(validated)
        except (ConfigError, ValueError) as e:
            log.error("SIGHUP: not reloading, the configuration is invalid (still serving the running "
                      "one): %s", e)
            continue
        except OSError as e:  # no memory file for the hand-over
            log.error("SIGHUP: not reloading (still serving the running configuration): %s", e)
            continue
        reload = True
        break
    timeout = cfg.shutdown_timeout_seconds
    if reload:
        log.info("SIGHUP: the configuration is valid; restarting in place (same pid) to apply it, "
                 "after flushing state (at most %gs)", timeout)
    else:
        log.info("%s: shutting down, state file first (at most %gs)", signal.Signals(sig).name, timeout)
    shutdown(ctx, server, runner, timeout, then=_reexec if reload else None, simulation=simulation)
    return 0


def hold_sighup() -> None:
    """Keep SIGHUP pending instead of letting it act, from here on and across the reload's exec.

    SIGHUP's default action ends the process, and a handler does not survive execve: with a
    handler, a SIGHUP that came between the reload's exec and the new handler (two reloads about
    a second apart) killed the exporter. A blocked signal stays pending, and both the mask and
    the pending set survive execve; `Signals.wait` takes SIGHUP with sigtimedwait once serving.
    Called first thing in serve(), before any thread starts, so every thread inherits the mask.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})


def served_url(tls: bool, host: str, port: int, path: str) -> str:
    """The URL the endpoint answers on, with the port actually bound; for a wildcard address also
    the URL to open from this host (the quick start's banner is this log line)."""
    scheme = "https" if tls else "http"
    url = f"{scheme}://{host}:{port}{path}"
    if host.strip("[]") in ("", "0.0.0.0", "::"):
        url += f" (every address; from this host: {scheme}://localhost:{port}{path})"
    return url


class Signals:
    """SIGTERM and SIGINT stop the exporter; SIGHUP (held pending since start-up, see
    hold_sighup) asks it to reload its configuration. A SIGHUP that arrives while a reload is
    under way stays pending and is taken by the restarted process: a second reload, never a kill."""

    POLL_S = 0.25  # how soon a SIGTERM caught on another thread ends the wait

    def __init__(self) -> None:
        self._event = threading.Event()
        self._last = signal.SIGTERM
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handler)
        hold_sighup()

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
             simulation: Simulation | None = None) -> None:
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


def _reexec() -> None:
    """Start again in this process (same pid, for systemd and the kubelet) with the same
    arguments, so the new configuration is read the one way it is read at start."""
    logging.shutdown()
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            f.flush()
    os.execv(sys.executable, [sys.executable, "-m", "exporter", *sys.argv[1:]])


def console_main() -> None:
    """The `gpu-health-exporter` command: main(), then exit_now() (see there)."""
    hold_sighup()  # as early as this entry point allows; a one-shot command lets it act again
    exit_now(main())


def command_failed(mod: Any, args: argparse.Namespace, e: Exception) -> int:
    """An unexpected error of a one-shot command: its `failed(args, error)` answers (check exits
    3 with the reason, never a traceback's 1), else it propagates."""
    failed = getattr(mod, "failed", None)
    if failed is None:
        raise e
    return failed(args, e)


def main(argv: list[str] | None = None) -> int:
    reload_snapshot.take_over()  # what the reload that exec'd this process validated, if one did
    argv = list(sys.argv[1:] if argv is None else argv)
    cmds = _commands()
    if argv and argv[0] in cmds:
        # A one-shot command keeps SIGHUP's default action (a closed terminal ends it).
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
        mod = cmds[argv[0]]
        p = argparse.ArgumentParser(prog=f"gpu-health-exporter {argv[0]}", description=mod.HELP)
        add_source_options(p)
        mod.add_arguments(p)
        try:
            args = p.parse_args(argv[1:])
        except SystemExit as e:  # a usage error: the command's own status for it (check: 3)
            return getattr(mod, "USAGE_EXIT", 2) if e.code == 2 else int(e.code or 0)
        could_not_start = getattr(mod, "could_not_start", None)  # check: its own status and output
        try:
            selected(args)  # a usage error, as for the daemon
            ctx, simulation = build_context(args)
        except (ConfigError, ValueError) as e:
            print(f"gpu-health-exporter: {e}", file=sys.stderr)
            return could_not_start(args, str(e)) if could_not_start else 2
        except Exception as e:  # noqa: BLE001 - a command may answer its own failure (check: exit 3)
            return command_failed(mod, args, e)
        setup_logging(args.log_level or "warning", args.log_format or ctx.config.log_format)
        try:
            if simulation is not None:  # a one-shot command sees what the daemon sees a minute in:
                ctx.nvml.ensure()  # NVML found its GPUs at start, as the daemon's did
                simulation.play(SIM_PLAY_S)
            return mod.run(args, ctx)
        except Exception as e:  # noqa: BLE001 - as above
            return command_failed(mod, args, e)
        finally:
            ctx.pool.close()
            if simulation is not None:
                simulation.close()
    args = build_parser().parse_args(argv)
    if args.list_scenarios:
        from exporter.simulate import all_scenarios

        for name, doc in sorted(all_scenarios().items()):
            print(f"{name:32} {doc}")
        return 0
    return serve(args)
