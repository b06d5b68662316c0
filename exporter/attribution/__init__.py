"""Fault attribution: which workloads held a GPU when an XID or SXid was counted on it, kept after
the workload is gone (the job usually dies of the XID and its epilog removes its mapping seconds
later, before any alert is evaluated). docs/xid.md, "Who the fault hit".

One job a module:
- history: WorkloadHistory, what the workload source observed on each GPU lately (the backlog's
  answers);
- ledger: Attribution and AttributionLedger, the attributed events and what an ack clears;
- fault: FaultAttribution, which asks for a reading taken after a live event (or the history
  for the backlog) and records the answer in the ledger;
- text: the answers as log and `check` text.

It depends on the workload model only; the XID service (exporter.xid) uses it, the attribution
state file lives with the other state files (exporter.xid.attribution_state), and the series are
the collectors' (exporter.collectors.attribution_series).

Time: readings and events are ordered by the monotonic clock of this boot (a reading's `mono`,
an event's kernel-log time less the kernel clock's offset, an ack's `mono`), never by the wall
clock, which can step; wall time is kept for display only."""
