"""What a command starts from: the config its command line names (file, the simulated node's
roots, flags) and the backends (NVML, the kernel log, the simulated node's), composed into the
Context by exporter.compose. The daemon (exporter.serve) and the one-shot commands (exporter.cli)
start here."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from exporter import collectors
from exporter.arguments import SHAPE_FLAGS, cli_overrides
from exporter.collector import Context
from exporter.compose import compose
from exporter.config import ConfigError, load
from exporter.deadline import Pool
from exporter.nvml.session import NvmlSession

if TYPE_CHECKING:
    from exporter.tools.simulate import SimulatedSources, Simulation


def build_context(args: argparse.Namespace, read_only: bool = False) -> tuple[Context, Simulation | None]:
    """Load the config (file, then the simulated node's roots, then CLI flags) and build the
    sources' backends. `--simulate` prepares the simulated node, which hands its sources in here
    once (exporter.tools.simulate.SimulatedSources). `read_only` (`check`): a corrupt state file is
    reported, left in place for the daemon. Returns the Context and the simulated node (None on
    a real node), which the caller starts, plays and closes."""
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
                  xid_acks_file=acks_file, read_only=read_only)
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
    from exporter.tools.simulate import Simulation
    from exporter.tools.simulate.source import Shape

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
