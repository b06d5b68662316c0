"""The command line's arguments: the daemon's parser, the options every command shares (where
each source reads from), the subcommands found in exporter.commands, and the config keys the
flags set (they win over the file)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pkgutil
from typing import Any

from exporter import __version__, collectors, commands, logs
from exporter.collectors import kubernetes as kubernetes_flags
from exporter.collectors import workload as workload_flags
from exporter.config import DEFAULT_PORT, ConfigError
from exporter.profiles import SIMULATED

# --simulate.NAME: the simulated node's shape (exporter.tools.simulate.Shape)
SHAPE_FLAGS = {
    "gpus": "GPUs (0 to 16; default: the profile's)",
    "efa_devices": "EFA devices (0 to 64, at most the instance family's PCI layout: 32 on p5; "
                   "default: the profile's)",
    "lustre_osts": "OSTs of its FSx for Lustre mount (1 to 4096; default: 8)",
    "nccl_ras_port": "NCCL job's shared fake RAS server, its port on 127.0.0.1 (`python -m "
                     "exporter.tools.simulate.nccl_ras`; with --scenario nccl-job)",
    "nccl_node": "place in that NCCL job (0: the first node)",
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
        epilog="Subcommands: " + ", ".join(f"'{n}' ({m.HELP})" for n, m in command_modules().items())
               + ". Run SUBCOMMAND --help for theirs.",
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


def command_modules() -> dict[str, Any]:
    """The one-shot subcommands: every module of exporter.commands (the daemon is exporter.serve)."""
    out = {}
    for mod in pkgutil.iter_modules(commands.__path__):
        out[mod.name] = importlib.import_module(f"{commands.__name__}.{mod.name}")
    return out


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
