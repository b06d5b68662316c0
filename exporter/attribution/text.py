"""Attribution answers as text for log lines, `check` and drain reasons."""

from __future__ import annotations

from exporter.attribution.ledger import Attribution
from exporter.workload.model import Workload


def describe(workloads: tuple[Workload, ...] | None) -> str:
    """`workloads: slurm job 42, ...`, `no workload (the GPU was idle)` or `workload unknown`."""
    if workloads is None:
        return "workload unknown (no reading of the GPU could tell)"
    if not workloads:
        return "no workload (the GPU was idle)"
    return "workloads: " + ", ".join(w.describe() for w in workloads)


def describe_sxid(recs: list[Attribution]) -> str:
    """One phrase for an SXid's records across the node's GPUs (for its log line)."""
    workloads = tuple(sorted({w for r in recs for w in r.workloads or ()}))
    unknown = sum(r.workloads is None for r in recs)
    if workloads:
        return describe(workloads) + (f" (unknown on {unknown} GPU(s))" if unknown else "")
    if unknown or not recs:
        return f"workload unknown ({unknown} of {len(recs)} GPU(s) could not be told)"
    return "no workload (the GPUs were idle)"
