"""Command line: serve the metrics (default: exporter.serve), or run a one-shot subcommand
(exporter.commands: check, ack, capture). The parts live by concern: the arguments in
exporter.arguments, the process lifecycle (signals, reload, re-exec, shutdown) in
exporter.lifecycle, the object graph in exporter.compose; this module dispatches."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from exporter import logs, reload_snapshot
from exporter.arguments import add_source_options, build_parser, command_modules, selected
from exporter.config import ConfigError
from exporter.lifecycle import exit_now, hold_sighup, raise_fd_limit
from exporter.serve import serve
from exporter.startup import build_context

if TYPE_CHECKING:
    from exporter.collector import Context

log = logging.getLogger("exporter")

SIM_PLAY_S = 60.0  # one-shot commands on a simulated node: the node as it is this long after start


def setup_logging(level: str, fmt: str = "logfmt") -> None:
    logs.setup(level, fmt)


def console_main() -> None:
    """The `gpu-health-exporter` command: main(), then exit_now() (see there)."""
    hold_sighup()  # as early as this entry point allows; a one-shot command lets it act again
    exit_now(main())


def command_failed(mod: Any, args: argparse.Namespace, e: Exception) -> int:
    """An unexpected error of a one-shot command: its `failed(args, error)` answers (check exits
    3 with the reason, never a traceback's 1), else it propagates."""
    failed: Callable[[argparse.Namespace, Exception], int] | None = getattr(mod, "failed", None)
    if failed is None:
        raise e
    return failed(args, e)


def main(argv: list[str] | None = None) -> int:
    reload_snapshot.take_over()  # what the reload that exec'd this process validated, if one did
    argv = list(sys.argv[1:] if argv is None else argv)
    cmds = command_modules()
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
        raise_fd_limit()  # process start-up (exporter.lifecycle): EFA's counter files stay open
        try:
            selected(args)  # a usage error, as for the daemon
            ctx, simulation = build_context(args, read_only=getattr(mod, "READ_ONLY_STATE", False))
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
            run: Callable[[argparse.Namespace, Context], int] = mod.run
            return run(args, ctx)
        except Exception as e:  # noqa: BLE001 - as above
            return command_failed(mod, args, e)
        finally:
            ctx.pool.close()
            if simulation is not None:
                simulation.close()
    args = build_parser().parse_args(argv)
    if args.list_scenarios:
        from exporter.tools.simulate import all_scenarios

        for name, doc in sorted(all_scenarios().items()):
            print(f"{name:32} {doc}")
        return 0
    return serve(args)
