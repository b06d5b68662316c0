"""Which node of a job queries RAS (pure). A STATUS is a job-wide collective, so a job of N nodes
whose every node asked each interval would run N collectives per interval. The querier is chosen
from what any reply says, so every node chooses the same one without talking to the others:

- querier: the node hosting the lowest rank of the largest communicator (world rank 0) that
  answered, queries every interval (a node whose ranks are missing may be gone: the next one takes
  over as soon as its own reply says so);
- backup: the node of the lowest rank on another host, every `backup` intervals: it takes over
  within that when the querier's exporter is gone;
- standby: every other node, every max(`standby`, nodes) intervals: revalidates the choice (a new
  job, new hosts) at a cost of at most one more STATUS per interval, whatever the job's size.

About 1 + 1/backup + 1 STATUS per job per interval, cluster-wide. A node with no reply yet (a new
job) queries once. A text report (NCCL before 2.28.7) does not list healthy ranks, so it names no
querier: each of the job's N nodes (the table's "Nodes per comm") queries every N intervals, at a
phase of its own, and exports the job-wide view while its reply is fresh: about one STATUS per
interval too (docs/nccl.md, "Fleet cost")."""

from __future__ import annotations

from exporter.nccl.findings import Findings

QUERIER, BACKUP, STANDBY, UNKNOWN = "querier", "backup", "standby", "unknown"
# A text report names no querier: the job's nodes take turns, each every `nodes` intervals.
SHARED = "shared"


def role(f: Findings | None, local_hosts: set[str]) -> str:
    if f is None:
        return UNKNOWN
    if f.format != "json":
        return SHARED if f.nodes > 1 else UNKNOWN
    if not local_hosts:
        return UNKNOWN
    # only ranks that answered: a node whose ranks are missing or dead may be gone with its
    # exporter, and the job-wide view (which names them) is the querier's alone to export
    order = sorted((w.rank, w.host) for key, w in f.ranks.items() if w.host and key not in f.missing)
    if not order:
        return UNKNOWN
    first = order[0][1]
    if first in local_hosts:
        return QUERIER
    second = next((h for _r, h in order if h != first), "")
    return BACKUP if second in local_hosts else STANDBY


def every(r: str, f: Findings | None, backup: int, standby: int) -> int:
    """How many intervals between this node's queries in role `r`."""
    if r == BACKUP:
        return backup
    if r == SHARED and f is not None:
        return max(1, f.nodes)
    if r == STANDBY:
        nodes = len({w.host for w in f.ranks.values()}) if f is not None else 1
        return max(standby, nodes)
    return 1
