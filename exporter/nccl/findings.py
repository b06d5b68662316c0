"""What one report says about the job, the same whichever format it came in (pure).

- `behind`: per rank that reported, how many operations it is behind the most advanced rank of
  the same communicator, in the same reply: per communicator the sum over the operations of
  (highest count - its count), the largest over its communicators. Raw counts read on different
  nodes at different moments cannot be compared; the distance inside one snapshot can.
- `missing`: the ranks' processes that did not answer (unresponsive) or were declared dead,
  never a NOCOMM rank (its process answered without that communicator: torn down or not yet
  created).
- `errors`: ranks reporting an init or asynchronous error, or an abort.
- `ops_max`, `ops_min`: the most and least operations launched by a rank of the largest
  communicator (JSON only: text prints counts only where they differ).

A rank is known by its process: (host, pid). Its `rank` is its number in the largest
communicator it appears in (the world communicator of a data-parallel job)."""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.nccl.model import ERROR_KINDS, Communicator, Report

Peer = tuple[str, int]  # host, pid


@dataclass(frozen=True)
class Who:
    rank: int
    host: str
    pid: int
    gpu: int  # the NVML index in the process's own view (-1: unknown)


@dataclass
class Findings:
    version: str
    format: str
    ranks: dict[Peer, Who] = field(default_factory=dict)  # every rank seen, reporting or not
    behind: dict[Peer, int] = field(default_factory=dict)  # only ranks behind (> 0)
    missing: dict[Peer, str] = field(default_factory=dict)  # unresponsive or dead
    errors: dict[Peer, tuple[str, ...]] = field(default_factory=dict)
    counts: dict[Peer, tuple[int, ...]] = field(default_factory=dict)  # JSON: per OPS, largest comm
    ops_max: int | None = None
    ops_min: int | None = None
    reporting: int = 0  # ranks of the largest communicator that reported
    size: int = 0  # the largest communicator's size
    nodes: int = 0  # the nodes of the job the reply shows
    timeouts: int = 0
    collection_s: float = 0.0

    def hosts_of(self, nspids: set[int]) -> set[str]:
        """The host this node is in the reply, known by its processes' pids (in their namespace):
        the one host where most of them appear; empty when several tie (containers repeat small
        pids on every node): a pid alone would place other nodes' ranks here."""
        where: dict[str, int] = {}
        for w in self.ranks.values():
            if w.host and w.pid in nspids:
                where[w.host] = where.get(w.host, 0) + 1
        best = max(where.values(), default=0)
        hosts = {h for h, n in where.items() if n == best}
        return hosts if best and len(hosts) == 1 else set()

    def lowest_host(self) -> str:
        """The host of the lowest-numbered rank of the largest communicator ("" if unknown)."""
        known = sorted((w.rank, w.host) for w in self.ranks.values() if w.host)
        return known[0][1] if known else ""


def _order(c: Communicator) -> tuple[int, str]:
    return (-c.size, c.hash)


def summarise(report: Report) -> Findings:
    f = Findings(report.version, report.format, timeouts=report.timeouts, collection_s=report.collection_s)
    comms = sorted(report.communicators, key=_order)
    if report.format == "text":
        f.size, f.reporting = report.table
    elif comms:
        f.size, f.reporting = comms[0].size, len(comms[0].ranks)
    for c in comms:  # largest first: a process's rank is its rank there
        for r in c.ranks:
            f.ranks.setdefault((r.host, r.pid), Who(r.rank, r.host, r.pid, r.nvml_dev))
        for m in c.missing:
            f.ranks.setdefault((m.host, m.pid), Who(m.rank, m.host, m.pid, m.nvml_dev))
            if m.state and f.missing.get((m.host, m.pid)) != "dead":
                f.missing[(m.host, m.pid)] = m.state
    for host, pid in report.dead:
        f.missing[(host, pid)] = "dead"
    f.nodes = report.nodes if report.format == "text" else len({h for h, _pid in f.ranks if h})
    for c in comms:
        counted = [r for r in c.ranks if r.counts is not None]
        if counted:
            top = [max(col) for col in zip(*(r.counts for r in counted if r.counts), strict=True)]
            for r in counted:
                assert r.counts is not None
                lag = sum(t - n for t, n in zip(top, r.counts, strict=True))
                key = (r.host, r.pid)
                if lag > f.behind.get(key, 0):
                    f.behind[key] = lag
                f.counts.setdefault(key, r.counts)
        for r in c.ranks:
            if r.errors:
                f.errors[(r.host, r.pid)] = tuple(sorted(set(f.errors.get((r.host, r.pid), ()) + r.errors)))
    if comms and report.format == "json":
        sums = [sum(r.counts) for r in comms[0].ranks if r.counts is not None]
        if sums:
            f.ops_max, f.ops_min = max(sums), min(sums)
    for lag in report.lags:
        key = (lag.host, lag.pid)
        f.ranks.setdefault(key, Who(lag.rank, lag.host, lag.pid, lag.nvml_dev))
        f.behind[key] = max(f.behind.get(key, 0), lag.behind)
    for r, kind in report.error_ranks:
        f.ranks.setdefault((r.host, r.pid), Who(r.rank, r.host, r.pid, r.nvml_dev))
        f.errors[(r.host, r.pid)] = tuple(
            k for k in ERROR_KINDS if k == kind or k in f.errors.get((r.host, r.pid), ())
        )
    # a process that is gone is not behind: the others wait for it, which `missing` says
    for key in f.missing:
        f.behind.pop(key, None)
    return f
