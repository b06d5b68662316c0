"""NVSwitch collector: SXid counts since boot per switch, code and severity (docs/fabric.md).

The kernel log is read by the XID service's follower (one reader for XIDs and SXids, which
feeds the SXid counter when `nvswitch.enabled`); this collector only reads the SXid counts."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from exporter.attribution.ledger import SXID
from exporter.catalog import Families, define
from exporter.collector import Collector, Context
from exporter.collectors.attribution_series import (
    WORKLOAD_LABELS,
    PreparedSeries,
    last_seen,
    series_labels,
)
from exporter.config import CollectorSection, setting
from exporter.metric import Sample
from exporter.xid.parser import pci_label
from exporter.xid.sxid_catalog import check_fatal_tier, check_policy

if TYPE_CHECKING:
    from exporter.xid.service import XidService
    from exporter.xid.store import Ack


@dataclass
class NvswitchSection(CollectorSection):
    """NVSwitch SXid errors from the kernel log, counted since boot (docs/fabric.md)."""

    name: ClassVar[str] = "nvswitch"
    enabled: bool = setting(
        True, "Export SXid counts and let them drive the node verdict.")
    fatal_tier: str = setting(
        "reboot", "Tier of an SXid the driver reports as Fatal: reboot or replace.",
        check=check_fatal_tier, expected="reboot or replace")
    policy: dict[str, list[int]] = setting(
        {}, "Tier overrides: {tier: [sxid, ...]} with tiers replace, reboot, ignore. Listed SXids take "
        "that tier whatever their severity; the rest follow the severity (docs/fabric.md).",
        check=check_policy, expected="a mapping of tier to a list of SXids")

SXID_ERRORS = define(
    "gpu_nvswitch_sxid_errors_total", "counter",
    "NVSwitch SXid reports since the node booted, per switch (driver index nvidia-nvswitch<N> and PCI "
    "address), SXid code and the severity on the line (sxid_severity: fatal, non_fatal, correctable, "
    "unknown; not `severity`, which alerts use for routing); kept across exporter restarts. tier is the "
    "policy tier (reboot, replace, ignore, unknown).",
    ("switch", "pci_bus_id", "sxid", "sxid_severity", "tier"), collector="nvswitch")
SXID_WORKLOAD = define(
    "gpu_nvswitch_sxid_workload_last_seen_timestamp_seconds", "gauge",
    "Unix time of the last report of this SXid by this NVSwitch while this workload held one of the "
    "node's GPUs (an NVSwitch fault fails NVLink for all of them): a Slurm job (hpc_job) or a "
    "Kubernetes container (namespace, pod, container). Kept after the workload ended and across "
    "restarts, until every GPU it held is acknowledged (`ack`) or the node reboots. Join on "
    "(instance, pci_bus_id, sxid).",
    ("switch", "pci_bus_id", "sxid") + WORKLOAD_LABELS, unit="seconds", collector="nvswitch")
SXID_DROPPED = define(
    "gpu_health_exporter_sxid_reports_dropped_total", "counter",
    "SXid reports not counted: a code outside 10000-99999 or more than 256 series (a guard against a "
    "corrupted log).", collector="nvswitch")


class NvswitchCollector(Collector):
    name = "nvswitch"
    config_section = NvswitchSection
    prefix = "gpu_nvswitch_"
    docs_group = "NVSwitch SXids"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._workload_series = PreparedSeries()

    @property
    def service(self) -> XidService:
        return self.ctx.xid_service()

    def start(self) -> None:
        self.service.start()  # idempotent: the xid collector starts the same follower

    def _workload_samples(self, acks: tuple[Ack, ...], switches: dict[str, int]) -> Iterator[Sample]:
        for (pci, sxid, w), t in sorted(last_seen(self.service.hits(acks), SXID).items()):
            labels = dict(switch=str(switches.get(pci, "")), pci_bus_id=pci_label(pci), sxid=str(sxid),
                          **series_labels(w))
            yield Sample(SXID_WORKLOAD.name, labels, t)

    def collect(self, out: Families) -> None:
        snap = self.service.snapshot()
        out.declare(SXID_ERRORS)
        for x in snap.sxids:
            out.add(SXID_ERRORS, x.count, switch=x.switch, pci_bus_id=x.pci_bus_id, sxid=str(x.sxid),
                    sxid_severity=x.severity, tier=x.tier)
        out.declare(SXID_WORKLOAD)
        key = (snap.hits_version, len(snap.sxid_switches))
        out.add_samples(SXID_WORKLOAD, self._workload_series.get(
            key, lambda: self._workload_samples(snap.acks, dict(snap.sxid_switches))))
        out.add(SXID_DROPPED, snap.sxid_dropped)


COLLECTOR = NvswitchCollector
