"""`gpu-health-exporter capture --out FILE`: record this node's NVML surface and the kernel log's
NVIDIA lines into one file, which `--nvml-capture FILE --kmsg-file FILE` replay (docs/design.md,
"Capturing a node"). Uses the daemon's source options, so `--simulate` or `--nvml-capture` capture
a simulated node (as it is a minute in: the composition root plays its scenarios' onsets) or
re-record a capture."""

from __future__ import annotations

import argparse
import json
import os
import sys

from exporter.collector import Context
from exporter.collectors.xid import XidSection

HELP = "record this node's NVML answers and NVIDIA kernel-log lines into one file that --nvml-capture " \
       "and --kmsg-file replay"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, metavar="FILE", help="Where to write the capture (JSON).")


def run(args: argparse.Namespace, ctx: Context) -> int:  # a simulated node's onsets: played by cli.main
    # Here, not at the top: every process lists the subcommands (cli.build_parser), and the
    # recorder's imports (statistics, decimal, the fake NVML) are 1.6 MiB the daemon never uses.
    from exporter.capture import record

    session = ctx.nvml
    if not session.ensure():
        print(f"gpu-health-exporter capture: {session.error}", file=sys.stderr)
        return 2
    kmsg = ctx.config.paths.kmsg if ctx.config.section(XidSection).kmsg else None
    cap = record(session.backend, kmsg)
    tmp = f"{args.out}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(cap, f, indent=1)
        os.replace(tmp, args.out)
    except OSError as e:
        print(f"gpu-health-exporter capture: cannot write {args.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    note = f"; kernel log not read: {cap['kmsg_error']}" if "kmsg_error" in cap else ""
    print(f"captured {len(cap['devices'])} GPU(s) and {len(cap['kmsg'])} NVIDIA kernel-log record(s) "
          f"into {args.out}{note}; replay with --nvml-capture {args.out} --kmsg-file {args.out}")
    return 0
