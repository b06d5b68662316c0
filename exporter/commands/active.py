"""`gpu-health-exporter active`: run the opt-in active checks (docs/active-checks.md).

Runs the checks it finds (nvml, efa, dcgm, nccl; active.run, or --checks) within a total
budget, each under its own deadline, and writes one result file per check to
<paths.state_dir>/active/, which the daemon exports and its verdict uses. A missing tool is
`skip`, never `fail`; a check that hangs is killed with its process group (`timeout`).

Exit status, as `check`'s: 0 nothing found (every check passed, warned or was skipped), 1
degraded (a failure whose reason is degraded: bandwidth under expected, a setting off), 2
action required (a DCGM hardware or integration failure), 3 could not check (a check timed out
or errored and none failed; a configuration error). With --reuse-pass SECONDS it exits 0 at
once, running nothing, when every selected check passed (or was skipped) that recently: the
Slurm prolog's cached pass.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

from exporter import node
from exporter.activecheck import findings, result, tool
from exporter.activecheck.settings import ActiveSection
from exporter.activecheck.suite import Node, Suite
from exporter.collector import Context

HELP = ("run the opt-in active checks (NVML, DCGM diag, nccl-tests, EFA) within a time budget and record "
        "their results for the daemon; exit 0 pass, 1 degraded, 2 action required, 3 could not check")
USAGE_EXIT = 3
EXIT = {"healthy": 0, "degraded": 1, "unknown": 3}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checks", metavar="LIST",
                   help="Comma-separated checks to run (default: active.run): " + ", ".join(result.CHECKS))
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="Total budget (default: active.budget_seconds).")
    p.add_argument("--dcgm-level", type=int, choices=(1, 2, 3, 4),
                   help="dcgmi diag level (default: active.dcgm_level).")
    p.add_argument("--reuse-pass", type=float, metavar="SECONDS",
                   help="Run nothing and exit 0 when every selected check passed (or was skipped) within "
                        "this many seconds.")
    p.add_argument("--json", action="store_true", help="Print the results as JSON.")
    p.set_defaults(invoked_at=time.monotonic())  # the command's parser is built as it starts


def selected(args: argparse.Namespace, ctx: Context) -> list[str]:
    names = ([c.strip() for c in args.checks.split(",") if c.strip()] if args.checks
             else list(ctx.config.section(ActiveSection).run))
    bad = [c for c in names if c not in result.CHECKS]
    if bad:
        raise ValueError(f"--checks: unknown check {', '.join(bad)}; expected some of "
                         + ", ".join(result.CHECKS))
    return names


def recent_pass(state_dir: str, checks: list[str], max_age_s: float, now: float) -> bool:
    """Whether every check's last result is a pass or skip that finished within max_age_s and
    is still valid."""
    for c in checks:
        try:
            r = result.read(state_dir, c)
        except (OSError, ValueError):
            return False
        if (r is None or r.result not in ("pass", "skip") or not 0 <= now - r.finished_at < max_age_s
                or not r.valid(now)):  # an expired pass is absent, whatever --reuse-pass allows
            return False
    return True


def exit_status(results: list[result.CheckResult]) -> int:
    lvl = findings.level(findings.reasons(results, time.time()))
    if lvl != "healthy":
        return EXIT.get(lvl, 2)
    return 3 if any(r.result in ("timeout", "error") for r in results) else 0


def run(args: argparse.Namespace, ctx: Context) -> int:
    cfg = ctx.config.section(ActiveSection)
    try:
        checks = selected(args, ctx)
    except ValueError as e:
        print(f"gpu-health-exporter active: {e}", file=sys.stderr)
        return USAGE_EXIT
    state_dir = ctx.paths.state_dir
    if args.reuse_pass is not None and recent_pass(state_dir, checks, args.reuse_pass, time.time()):
        print(f"active checks: a pass within {args.reuse_pass:g}s is on record ({', '.join(checks)}); "
              "nothing run")
        return 0
    if args.dcgm_level is not None:
        cfg.dcgm_level = args.dcgm_level
    if any(c in ("nccl", "efa") for c in checks):
        ctx.identity.lookup_now()  # the expected figures need the instance type
    prof = node.profile(ctx)
    efa_expected = ctx.config.efa.expected_devices if hasattr(ctx.config, "efa") else None
    if efa_expected is None and prof is not None:
        efa_expected = prof.efa_devices
    target = Node(node.instance_type(ctx), node.expected_gpus(ctx), efa_expected, ctx.nvml, ctx.pool)
    try:
        with interruptible():
            # the budget bounds the command from its invocation (a prolog or a Job sizes its own
            # timeout by it): loading the config, NVML and the instance type are part of it
            spent = time.monotonic() - args.invoked_at
            results = Suite(cfg, target, state_dir, args.budget, spent_s=spent).run(checks)
    except Interrupted as e:
        # the running tool's process group was killed on the way out (exporter.activecheck.tool)
        print(f"gpu-health-exporter active: interrupted by {e.signame}; the running check was stopped and "
              "not recorded", file=sys.stderr)
        return 128 + e.signum
    report(results, args.json)
    return exit_status(results)


class Interrupted(BaseException):
    """SIGTERM or SIGINT while the checks ran (a BaseException, as KeyboardInterrupt, so that no
    `except Exception` on the way swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.signame = signal.Signals(signum).name


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGTERM and SIGINT raise Interrupted while the suite runs: the prolog's `timeout`,
    Slurm's PrologTimeout or a Job's deadline then end the diagnostic the command started in its
    own session instead of leaving it on the GPUs."""
    def handler(signum: int, _frame: object) -> None:
        def raise_it() -> None:
            raise Interrupted(signum)
        tool.interrupt(raise_it)  # held while a tool starts: its process group must be known

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def report(results: list[result.CheckResult], as_json: bool) -> None:
    if as_json:
        doc: list[dict[str, Any]] = [result.to_json(r) for r in results]
        print(json.dumps(doc, indent=1))
        return
    for r in results:
        print(f"{r.check:5} {r.result:7} {r.duration_s:7.1f}s  {r.reason}")
