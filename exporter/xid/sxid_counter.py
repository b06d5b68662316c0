"""The SXid counter: counts NVSwitch SXid reports from kernel-log records into the SXid store
(one count per report line, continuations never: exporter.xid.sxid), logs each counted report
once, and lists the counts with their policy tier, as exported and judged."""

from __future__ import annotations

import logging
from typing import Any

from exporter.attribution.text import describe_sxid
from exporter.xid.clock import KernelClock
from exporter.xid.kmsg import Record
from exporter.xid.parser import pci_label
from exporter.xid.store import OTHER
from exporter.xid.sxid import SxidReport, parse_sxid
from exporter.xid.sxid_catalog import SxidPolicy, describe
from exporter.xid.sxid_store import SxidStore
from exporter.xid.verdict import SxidLine

log = logging.getLogger("exporter.sxid")


class SxidCounter:
    def __init__(self, store: SxidStore, policy: SxidPolicy, clock: KernelClock,
                 attribution: Any = None) -> None:
        self.store = store
        self.policy = policy
        self.clock = clock
        self.log_events = False  # the daemon logs each counted report; one-shot commands print them
        self.attribution = attribution  # FaultAttribution: records the workloads each report hit

    def log_from_now(self) -> None:
        """Log each counted report from now on (the daemon, once it runs: its log is the trail)."""
        self.log_events = True

    def handle_record(self, rec: Record, new: bool = True) -> None:
        """One kernel-log record; `new`: not counted by an earlier run."""
        if rec.kernel and new and "SXid" in rec.message:
            parsed = parse_sxid(rec.message)
            wall = rec.wall if rec.wall is not None else self.clock.wall(rec.usec / 1e6)
            if not isinstance(parsed, SxidReport):  # a continuation line, or not an SXid report
                return
            counted = self.store.report(parsed.pci, parsed.switch, parsed.sxid, parsed.severity, wall)
            hit = ""
            if counted and self.attribution is not None:
                hit = describe_sxid(self.attribution.sxid(parsed.pci, parsed.sxid, wall, rec.usec / 1e6))
            if counted and self.log_events:
                log.warning("SXid %05d counted on NVSwitch %d (PCI %s): severity %s, tier %s%s; %s; %s",
                            parsed.sxid, parsed.switch, pci_label(parsed.pci), parsed.severity,
                            self.policy.tier(parsed.sxid, parsed.severity),
                            f", link {parsed.link}" if parsed.link is not None else "", hit or "-",
                            parsed.text[:160])


def sxid_lines(store: SxidStore, policy: SxidPolicy) -> list[SxidLine]:
    """The SXid counts since boot with their policy tier, as exported and judged."""
    out = []
    switches = dict(store.switches)
    for (pci, sxid, severity), c in sorted(store.snapshot().items()):
        switch = switches.get(pci)
        label = OTHER if pci == OTHER else pci_label(pci)
        out.append(SxidLine("" if switch is None else str(switch), label, sxid, severity,
                            policy.tier(sxid, severity), c.count, c.last_wall, describe(sxid)))
    return out
