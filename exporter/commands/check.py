"""`gpu-health-exporter check`: a one-shot health check that needs no running daemon.

Reads NVML once (through the GPU collector), the kernel-log backlog, the daemon's state file
(read only) and the active checks' valid results (it never runs a check: `active` does), then
prints the verdict per GPU and for the node as a table or JSON. Exit status:
0 healthy, 1 degraded, 2 action required (reset, reboot or replace), 3 could not check (NVML
unusable, or neither the kernel log nor a state file for this boot could be read) unless what
could be read already shows that action is required. Exit 3 always comes with the node verdict
`unknown`, never with another verdict. A tool error is never a node fault: a configuration or
command-line error, a kernel log none of whose lines is a record (`dmesg -T` output given to
--kmsg-file), or any error of the check itself exits 3, verdict `unknown`, the reason under
`problems` (exit 2 is only ever "this node needs action", so a wrapper may drain on it alone).

The expected GPU count needs the instance type: config, else the DMI product name, else one
IMDS request with the configured timeout (the check starts no background lookup). IMDS is asked
only when that answer is used: not when the config gives node.expected_gpus, not when NVML is
unusable, not when the DMI identity says the host is not on EC2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

from exporter.attribution.ledger import XID, Attribution
from exporter.attribution.text import describe
from exporter.collector import Context
from exporter.collectors.gpu import GpuSection
from exporter.node import instance_type
from exporter.xid.parser import pci_key, pci_label
from exporter.xid.service import KmsgView, XidService, XidSnapshot, one_shot

log = logging.getLogger("exporter.check")

HELP = ("one-shot health check without a daemon: per-GPU and node verdict; exit 0 healthy, 1 degraded, "
        "2 action required, 3 could not check (verdict unknown: also a configuration error)")

EXIT = {"healthy": 0, "degraded": 1, "unknown": 3}
EXIT_ACTION, EXIT_UNKNOWN = 2, 3
READ_ONLY_STATE = True  # a corrupt state file is reported, left in place for the daemon (cli.main)
USAGE_EXIT = EXIT_UNKNOWN  # a command-line error (cli.main): the check was not made
UNKNOWN = "unknown"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="Print JSON instead of a table.")


def verdict(ctx: Context) -> tuple[Any, list[str]]:
    """Run the GPU and health collectors once, as the daemon does (the runner hands the GPU
    reading to the verdict); (NodeVerdict or None, problems)."""
    from exporter import collectors
    from exporter.runner import Runner

    runner = Runner.from_config(collectors.build(ctx, only=["gpu", "active", "health"]), ctx.config, ctx.pool)
    try:
        runner.collect()
    finally:
        runner.close()
    problems = []
    gpu = runner.status.get("gpu")
    health = runner.readings.get("gpu")
    if gpu is None:
        problems.append("the GPU collector is not available")
    elif health is None:
        problems.append(f"the GPU read failed: {gpu.error}")
    elif health.nvml_error:
        problems.append(f"NVML: {health.nvml_error}")
    else:
        problems += unread_gpus(health, ctx.config.section(GpuSection).read_timeout_seconds)
    nv = runner.readings.get("health")
    if nv is None:
        problems.append(f"the verdict failed: {runner.status['health'].error}")
    return nv, problems


def unread_gpus(health: Any, timeout_s: float) -> list[str]:
    """A problem per GPU whose health could not be read: it is `unknown`, never `healthy`."""
    out = []
    for i, g in sorted(health.gpus.items()):
        if g.lost:
            continue
        if g.unanswered_s is not None:
            out.append(f"GPU {i} ({g.pci_bus_id}): NVML did not answer within {timeout_s:g}s "
                       "(gpu.read_timeout_seconds); its health is unknown (a hung NVML call is a common "
                       "first sign of a GPU about to fall off the bus)")
        elif not g.read_ok:
            out.append(f"GPU {i} ({g.pci_bus_id}): its health-critical NVML reads failed; its health is "
                       "unknown")
    return out


def needs_instance_type(ctx: Context) -> bool:
    """Whether the check will use the instance type (the expected GPU count): not when the config
    gives the count, and not when NVML is unusable (the answer can only be 3, so IMDS is not asked
    for a number nothing reads)."""
    if ctx.config.node.expected_gpus is not None:
        return False
    return bool(ctx.nvml.ensure())


def gather(ctx: Context) -> tuple[Any, XidService, list[str]]:
    svc = one_shot(ctx)  # read-only: exporter.cli builds this command's Context with READ_ONLY_STATE
    nv, problems = verdict(ctx)
    snap = svc.snapshot()
    if snap.state.problem in ("corrupt", "newer_version", "unreadable"):
        problems.append(f"state file {snap.state.path} is {snap.state.problem}: XID counts come from "
                        "the kernel log alone and may be incomplete")
    if snap.state.acks_problem in ("corrupt", "newer_version", "unreadable"):
        problems.append(f"acks file {snap.state.acks_path} is {snap.state.acks_problem}: acknowledgements "
                        "recorded only there are not applied, so an acknowledged GPU may show its XIDs again")
    k = snap.kmsg
    if k.enabled and not k.ok and not snap.state.found:  # the state alone has the counts
        problems.append(f"kernel log: {k.error} and no state file for this boot")
    unparsed = unparseable_kmsg(k)
    if unparsed:
        problems.append(unparsed)
    return nv, svc, problems


def unparseable_kmsg(k: KmsgView) -> str:
    """Why the kernel log read is no evidence (KmsgView.unparseable); empty when it is."""
    return k.unparseable()


def exit_status(verdict: str, could_not_check: bool) -> int:
    code = EXIT.get(verdict, EXIT_ACTION)
    if could_not_check and code != EXIT_ACTION:
        return EXIT_UNKNOWN
    return code


def node_verdict(nv: Any, code: int) -> str:
    """The one node verdict printed: `unknown` whenever the check could not be made (exit 3)."""
    return UNKNOWN if code == EXIT_UNKNOWN else nv.verdict


def node_wide(problems: list[str]) -> bool:
    """A problem that leaves every GPU's verdict in doubt (NVML unusable, the kernel log or state
    unread), not only one GPU's (unread_gpus: those begin with "GPU <index> (")."""
    return any(not p.startswith("GPU ") for p in problems)


def gpu_verdict(g: Any, code: int, problems: list[str] | None = None) -> str:
    """A GPU's verdict as printed: when the check could not be made (exit 3) for a reason of the
    whole node, a GPU known only from its kernel-log lines, or whose XIDs could not be read, is not
    `healthy`; a worse reading stays. A GPU NVML read while another did not answer keeps its own."""
    doubt = code == EXIT_UNKNOWN and (problems is None or node_wide(problems))
    return UNKNOWN if doubt and g.verdict == "healthy" else g.verdict


def details(nv: Any, ctx: Context) -> dict[str, str]:
    """A sentence for each node reason whose numbers an operator needs (reason -> text)."""
    out = {}
    if "gpu_count_below_expected" in nv.reasons:
        if ctx.config.node.expected_gpus is not None:
            why = f"node.expected_gpus in the config says {nv.expected_gpus}"
        else:
            src = {"config": "node.instance_type in the config", "dmi": "the DMI product name",
                   "imds": "instance metadata"}.get(ctx.identity.instance_type_source() or "", "?")
            why = f"a {instance_type(ctx)} has {nv.expected_gpus} (instance type from {src})"
        out["gpu_count_below_expected"] = (f"NVML shows {nv.gpu_count} GPU(s), {nv.expected_gpus} expected: "
                                           + why)
    return out


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts)) if ts else ""


def attributions(svc: XidService, snap: XidSnapshot) -> dict[str, list[Attribution]]:
    """The workloads faults hit, per GPU PCI key (those acks cleared left out), oldest first."""
    out: dict[str, list[Attribution]] = {}
    for r in svc.hits(snap.acks):
        out.setdefault(r.pci, []).append(r)
    return out


def _hit_json(r: Attribution) -> dict[str, Any]:
    event = {"event": r.kind, r.kind: r.code}
    if r.kind != XID:
        event["switch_pci_bus_id"] = pci_label(r.switch)
    return {**event, "time": _iso(r.time), "workload_known": r.workloads is not None,
            "workloads": [{"kind": w.kind, **w.labels()} for w in r.workloads or ()]}


def _hit_text(r: Attribution) -> str:
    event = f"XID {r.code}" if r.kind == XID else f"SXid {r.code} (NVSwitch {pci_label(r.switch)})"
    return f"{event} at {_iso(r.time)}: {describe(r.workloads)}"


def to_json(nv: Any, svc: XidService, problems: list[str], code: int, ctx: Context) -> dict[str, Any]:
    snap = svc.snapshot()
    k, st = snap.kmsg, snap.kmsg.stats
    hits = attributions(svc, snap)
    return {
        "node": {"verdict": node_verdict(nv, code), "reasons": nv.reasons, "details": details(nv, ctx),
                 "exit_status": code, "instance_type": instance_type(ctx),
                 "instance_type_source": ctx.identity.instance_type_source(), "gpu_count": nv.gpu_count,
                 "expected_gpus": nv.expected_gpus},
        "gpus": [{
            "gpu": int(g.gpu) if g.gpu.isdigit() else None, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id,
            "verdict": gpu_verdict(g, code, problems), "reasons": g.reasons, "fabric_state": g.fabric_state,
            # undecoded: events of an NVLink XID NVIDIA's decode table could not read (docs/xid.md)
            "xids": [{"xid": x.xid, "count": x.count, "tier": x.tier, "last_seen": _iso(x.last_seen),
                      "acknowledged": x.acknowledged, "meaning": x.meaning, "undecoded": x.undecoded}
                     for x in g.xids],
            # the workloads on this GPU when each fault was counted, kept after they ended
            "workloads_hit": [_hit_json(r) for r in hits.get(pci_key(g.pci_bus_id) or "", [])],
        } for g in nv.gpus],
        "nvswitch_sxids": [{"switch": int(x.switch) if x.switch.isdigit() else None,
                            "pci_bus_id": x.pci_bus_id, "sxid": x.sxid, "severity": x.severity,
                            "tier": x.tier, "count": x.count, "last_seen": _iso(x.last_seen),
                            "meaning": x.meaning} for x in nv.sxids],
        "sources": {
            "kmsg": {"path": k.path, "ok": k.ok, "error": k.error,
                     "records": st.records, "missed_records": st.missed, "overwrites": st.overwrites},
            "state_file": {"path": snap.state.path, "found": snap.state.found, "problem": snap.state.problem},
            "acks_file": {"path": snap.state.acks_path, "problem": snap.state.acks_problem},
        },
        "problems": problems,
    }


def table(nv: Any, problems: list[str], code: int, ctx: Context, svc: XidService | None = None) -> str:
    count = "?" if nv.gpu_count is None else str(nv.gpu_count)
    expected = "?" if nv.expected_gpus is None else str(nv.expected_gpus)
    lines = [f"node {instance_type(ctx) or '(instance type unknown)'}: {node_verdict(nv, code).upper()}"
             f" (exit {code}); GPUs {count}/{expected}; reasons: {', '.join(nv.reasons) or 'none'}"]
    lines += [f"  {reason}: {text}" for reason, text in details(nv, ctx).items()]
    lines.append("")
    rows = [("GPU", "PCI BUS ID", "UUID", "VERDICT", "REASONS", "XIDS SINCE BOOT (xid x count tier)")]
    for g in nv.gpus:
        xids = ", ".join(f"{x.xid} x{x.count} {x.tier}" + (f" ({x.undecoded} undecoded)" * bool(x.undecoded))
                         + (" (acked)" if x.acknowledged else "") for x in g.xids) or "-"
        rows.append((g.gpu or "-", g.pci_bus_id, g.uuid or "-", gpu_verdict(g, code, problems),
                     ",".join(g.reasons) or "-", xids))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1])
    if nv.sxids:
        lines.append("")
        lines.append("NVSwitch SXids since boot (switch pci sxid x count severity tier): " + ", ".join(
            f"{x.switch or '?'} {x.pci_bus_id} {x.sxid} x{x.count} {x.severity} {x.tier}" for x in nv.sxids))
    hits = attributions(svc, svc.snapshot()) if svc is not None else {}
    if hits:
        lines.append("")
        lines.append("Workloads the faults hit (kept after they ended; `ack` clears a GPU's):")
        for g in nv.gpus:
            lines += [f"  GPU {g.gpu or '-'} ({g.pci_bus_id}) {_hit_text(r)}"
                      for r in hits.get(pci_key(g.pci_bus_id) or "", [])]
    for p in problems:
        lines.append(f"could not check fully: {p}")
    return "\n".join(lines)


def unknown(problems: list[str], code: int, as_json: bool) -> None:
    """What is printed when there is no verdict to give: the JSON document (so a caller parsing
    it gets the reason), or one line."""
    if as_json:
        print(json.dumps({
            "node": {"verdict": UNKNOWN, "reasons": [], "exit_status": code},
            "gpus": [], "sources": {}, "problems": problems,
        }, indent=2))
    else:
        print(f"node: {UNKNOWN.upper()} (exit {code}); could not check: " + "; ".join(problems))


def could_not_start(args: argparse.Namespace, problem: str) -> int:
    """A bad configuration or command line: nothing was checked, exit 3 (never 2, which a
    wrapper reads as "drain this node")."""
    unknown([problem], EXIT_UNKNOWN, getattr(args, "json", False))
    return EXIT_UNKNOWN


def failed(args: argparse.Namespace, e: Exception) -> int:
    """Any error of the check's own (a bug, hostile input; exporter.cli calls this): exit 3 with
    the reason, never a traceback's exit 1, which reads "degraded" and does not drain."""
    log.debug("check failed", exc_info=e)  # the traceback at --log.level debug
    problem = f"the check failed: {type(e).__name__}: {str(e)[:300]}"
    print(f"gpu-health-exporter check: could not check: {problem}", file=sys.stderr)
    unknown([problem], EXIT_UNKNOWN, args.json)
    return EXIT_UNKNOWN


def run(args: argparse.Namespace, ctx: Context) -> int:
    """The check (an error of its own goes to failed(), through exporter.cli: exit 3)."""
    if needs_instance_type(ctx):
        ctx.identity.lookup_now()
    nv, svc, problems = gather(ctx)
    if nv is None:
        print("gpu-health-exporter check: could not check: " + "; ".join(problems), file=sys.stderr)
        unknown(problems, EXIT_UNKNOWN, args.json)
        return EXIT_UNKNOWN
    code = exit_status(nv.verdict, bool(problems))
    if args.json:
        print(json.dumps(to_json(nv, svc, problems, code, ctx), indent=2))
    else:
        print(table(nv, problems, code, ctx, svc))
    return code
