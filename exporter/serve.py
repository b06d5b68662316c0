"""The daemon (`gpu-health-exporter` without a subcommand): the rest of the composition root.
exporter.compose.build_context builds the Context; this builds the collectors, the runner, the
server and the signal wait on it, starts them, waits for a signal and stops (or reloads) through
exporter.lifecycle. The one-shot subcommands are exporter.commands (this is beside them, not
among them: it imports the composition root, which imports the arguments, which list them)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from exporter import collectors, logs, reload_snapshot
from exporter.config import ConfigError
from exporter.lifecycle import (
    MallocTrim,
    Signals,
    hold_sighup,
    limit_malloc_arenas,
    raise_fd_limit,
    reexec,
    reload_is_valid,
    shutdown,
)
from exporter.startup import build_context

log = logging.getLogger("exporter")


def serve(args: argparse.Namespace) -> int:
    hold_sighup()  # before anything else (no thread exists yet): see there
    from exporter.web.webconfig import load_web_config

    try:
        ctx, simulation = build_context(args)
        web = load_web_config(ctx.config.web.config_file)
    except (ConfigError, ValueError) as e:
        return cannot_start(args, str(e))
    reload_snapshot.release()  # loaded: the next reload reads the files again
    from exporter.runner import Runner
    from exporter.web.server import Server, limits_from_config

    cfg = ctx.config
    logs.setup(cfg.log_level, cfg.log_format)
    limit_malloc_arenas()
    raise_fd_limit()  # before the collectors open their files (EFA keeps its counter files open)
    built = collectors.build(ctx)
    runner = Runner.from_config(built, cfg, ctx.pool)
    host, _, port = cfg.listen.rpartition(":")
    path = cfg.web.telemetry_path
    try:
        server = Server(runner, host.strip("[]"), int(port), web, limits_from_config(cfg),
                        telemetry_path=path)
    except OSError as e:
        return cannot_start(args, f"cannot listen on {cfg.listen}: {e.strerror or e}")
    signals = Signals().install()
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
        if reload_is_valid(args):
            reload = True
            break
    timeout = cfg.shutdown_timeout_seconds
    if reload:
        log.info("SIGHUP: the configuration is valid; restarting in place (same pid) to apply it, "
                 "after flushing state (at most %gs)", timeout)
    else:
        log.info("%s: shutting down, state file first (at most %gs)", signal.Signals(sig).name, timeout)
    shutdown(ctx, server, runner, timeout, then=reexec if reload else None, simulation=simulation)
    return 0


def cannot_start(args: argparse.Namespace, why: str) -> int:
    """The daemon cannot start: say why and return exit status 2. With `--log.format` on the
    command line the message is a log record in that format (a log pipeline reads it like any
    other); otherwise plain text for the person at the terminal (the config file's log_format
    may be what could not be read)."""
    if args.log_format:
        logs.setup("error", args.log_format)
        log.error("cannot start: %s", why)
    else:
        print(f"gpu-health-exporter: {why}", file=sys.stderr)
    return 2


def served_url(tls: bool, host: str, port: int, path: str) -> str:
    """The URL the endpoint answers on, with the port actually bound; for a wildcard address also
    the URL to open from this host (the quick start's banner is this log line)."""
    scheme = "https" if tls else "http"
    url = f"{scheme}://{host}:{port}{path}"
    if host.strip("[]") in ("", "0.0.0.0", "::"):
        url += f" (every address; from this host: {scheme}://localhost:{port}{path})"
    return url
