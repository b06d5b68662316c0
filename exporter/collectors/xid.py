"""XID collector: per-GPU XID counts since boot (kernel log + NVML events, one count per event),
the acknowledgements (`ack`) as facts, and the health of those sources. The work happens in the
process's XID service (exporter.xid.service, built by the composition root; its background
threads are started here); collect() only reads the counts."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from exporter.attribution.ledger import XID
from exporter.catalog import Families, define
from exporter.collector import Collector, Context
from exporter.collectors.attribution_series import (
    WORKLOAD_LABELS,
    PreparedSeries,
    last_seen,
    series_labels,
)
from exporter.config import CollectorSection, positive, setting
from exporter.metric import Sample
from exporter.xid.policy import check_policy

if TYPE_CHECKING:
    from exporter.xid.service import XidService
    from exporter.xid.store import Ack

G = ("gpu", "uuid", "pci_bus_id")

@dataclass
class XidSection(CollectorSection):
    """XIDs from the kernel log and NVML events, counted since boot (docs/xid.md)."""

    name: ClassVar[str] = "xid"
    enabled: bool = setting(
        True, "Count XIDs.")
    kmsg: bool = setting(
        True, "Read the kernel log (paths.kmsg): the whole ring buffer at start, then follow it.")
    nvml_events: bool = setting(
        True, "Watch NVML events (XID critical errors; DBE, GPU unavailable and recovery action where "
        "supported) in a background thread.")
    merge_window_seconds: float = setting(
        10.0, "Reports of the same XID on the same GPU within this many seconds of an event's first report "
        "are that event (NVML + kernel log, XID 13 floods, multi-line reports).", check=positive)
    follow_poll_seconds: float = setting(
        0.2, "How often a regular file given as the kernel log is checked for appended records (the device"
        " itself wakes us at once).", check=positive)
    policy: dict[str, list[int | str]] = setting(
        {}, "Tier overrides: {tier: [xid, ...]} with tiers replace, reboot, reset, nonfatal, application, "
        "ignore. Listed XIDs move to that tier; the rest keep the defaults in docs/xid.md. For the NVLink "
        "XIDs NVIDIA's catalog decodes (74, 144-150), \"XID/fatal\" or \"XID/nonfatal\" moves only the "
        "events whose line says that severity.",
        check=check_policy, expected="a mapping of tier to a list of XIDs")

XID_ERRORS = define(
    "gpu_xid_errors_total", "counter",
    "XID events per GPU and XID since the node booted (kernel log and NVML events, one count per event; "
    "kept across exporter restarts). tier is the policy tier. A GPU NVML does not list has gpu=\"\".",
    G + ("xid", "tier"), collector="xid")
XID_UNDECODED = define(
    "gpu_xid_undecoded_total", "counter",
    "Events of an NVLink XID (74, 144-150) whose fields NVIDIA's decode table could not read (NVML's "
    "report without a kernel line, a line in a form not known, a row the table lacks): counted in "
    "gpu_xid_errors_total at the XID's own conservative tier. Present only for such XIDs.",
    G + ("xid",), collector="xid")
XID_LAST_SEEN = define(
    "gpu_xid_last_seen_timestamp_seconds", "gauge",
    "Unix time of the last event of this XID on this GPU.", G + ("xid", "tier"), unit="seconds",
    collector="xid")
XID_WORKLOAD = define(
    "gpu_xid_workload_last_seen_timestamp_seconds", "gauge",
    "Unix time of the last event of this XID on this GPU while this workload held it: a Slurm job "
    "(hpc_job) or a Kubernetes container (namespace, pod, container), as the workload source observed "
    "them then. Kept after the workload ended and across exporter restarts, until the GPU is "
    "acknowledged (`ack`) or the node reboots; at most 8 events per GPU. An XID on an idle GPU, or "
    "from before the source observed the GPU, has none. Join on (instance, pci_bus_id, xid).",
    G + ("xid",) + WORKLOAD_LABELS, unit="seconds", collector="xid")
NVML_EVENTS = define(
    "gpu_nvml_events_total", "counter",
    "NVML events received by the exporter since it started, by type (xid, double_bit_ecc, "
    "gpu_unavailable, recovery_action).", G + ("event_type",), collector="xid")
KMSG_UP = define(
    "gpu_health_exporter_kmsg_up", "gauge",
    "1 if the kernel log (paths.kmsg) is being read, 0 if it cannot be (see the log; /dev/kmsg needs "
    "CAP_SYSLOG when kernel.dmesg_restrict=1).", collector="xid")
KMSG_RECORDS = define(
    "gpu_health_exporter_kmsg_records_total", "counter",
    "Kernel-log records read since the exporter started.", collector="xid")
KMSG_OVERWRITES = define(
    "gpu_health_exporter_kmsg_overwrites_total", "counter",
    "Times reading /dev/kmsg returned EPIPE: the kernel overwrote records before they were read.",
    collector="xid")
KMSG_MISSED = define(
    "gpu_health_exporter_kmsg_missed_records_total", "counter",
    "Kernel-log records never seen (sequence gaps: overwritten before start or while behind). "
    "Non-zero means counts since boot rely on the state file and may be incomplete.", collector="xid")
KMSG_SEQ = define(
    "gpu_health_exporter_kmsg_last_sequence", "gauge",
    "Sequence number of the last kernel-log record processed.", collector="xid")
REPORTS = define(
    "gpu_health_exporter_xid_reports_total", "counter",
    "XID reports seen per source (kmsg lines, NVML events) before merging into events.",
    ["source"], collector="xid")
MERGED = define(
    "gpu_health_exporter_xid_reports_merged_total", "counter",
    "XID reports that belonged to an event already counted (floods, the other source's report).",
    ["source"], collector="xid")
KMSG_MALFORMED = define(
    "gpu_health_exporter_kmsg_malformed_records_total", "counter",
    "Kernel-log records that are not `prio,seq,usec,flags;message` and were skipped (logged when the "
    "count grows).", collector="xid")
DROPPED = define(
    "gpu_health_exporter_xid_events_dropped_total", "counter",
    "New XID events not counted: an XID number out of range (1-999), or a new XID outside the catalog "
    "on a GPU that already has 128 XID series (guards against unbounded label cardinality from a "
    "corrupted log). Catalog XIDs of GPUs NVML lists are never dropped; addresses NVML does not list "
    "get 16 series of their own, then share pci_bus_id=\"other\".", collector="xid")
WATCHER_UP = define(
    "gpu_health_exporter_nvml_event_watcher_up", "gauge",
    "1 while the NVML event thread is waiting on an event set with at least one GPU, else 0.",
    collector="xid")
WATCHER_GPUS = define(
    "gpu_health_exporter_nvml_event_gpus", "gauge",
    "GPUs in the NVML event set (registered) and left out because they are lost (excluded).",
    ["state"], collector="xid")
WATCHER_REBUILDS = define(
    "gpu_health_exporter_nvml_event_set_rebuilds_total", "counter",
    "Times the NVML event set was rebuilt without a lost GPU.", collector="xid")
WATCHER_ERRORS = define(
    "gpu_health_exporter_nvml_event_watcher_errors_total", "counter",
    "Unexpected failures of the NVML event thread (it logs them and restarts).", collector="xid")
ACKED = define(
    "gpu_xid_acknowledged_timestamp_seconds", "gauge",
    "Unix time of the last `gpu-health-exporter ack` of this GPU: xid=\"all\" for a whole-GPU ack, else the "
    "XID acknowledged. XIDs counted up to then stop driving the GPU's verdict; alerts read this to resolve "
    "an acknowledged page. Kept in the state file; present for every GPU ever acked this boot.",
    G + ("xid",), unit="seconds", collector="xid")
STATE_OK = define(
    "gpu_health_exporter_state_file_ok", "gauge",
    "1 if the XID state file was last read and written without trouble, 0 if it is corrupt, unreadable "
    "or unwritable (counts are kept in memory and from the kernel log), or if the acks file `ack` writes "
    "is (until a good one is read again: an acknowledgement may be lost; see the log).", collector="xid")
STATE_RECOVERIES = define(
    "gpu_health_exporter_state_file_recoveries_total", "counter",
    "Corrupt XID state files set aside this boot (kept across restarts in the new state file). Counts "
    "were rebuilt from the kernel log: an XID recorded only in the old file may be missing; the old "
    "file is kept beside the state file as xid-state.json.corrupt-<time>.", collector="xid")
STATE_ERRORS = define(
    "gpu_health_exporter_state_file_errors_total", "counter",
    "XID state and acks file failures by operation (read: corrupt or unreadable; write).", ["operation"],
    collector="xid")


class XidCollector(Collector):
    name = "xid"
    config_section = XidSection
    prefix = "gpu_"
    docs_group = "XIDs"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._workload_series = PreparedSeries()

    @property
    def service(self) -> XidService:
        return self.ctx.xid_service()

    def start(self) -> None:
        self.service.start()

    def _workload_samples(self, acks: tuple[Ack, ...]) -> Iterator[Sample]:
        svc = self.service
        gpus: dict[str, tuple[str, str, str]] = {}  # a few GPUs, up to 8 events x workloads each
        for (pci, xid, w), t in sorted(last_seen(svc.hits(acks), XID).items()):
            gpu, uuid, bus_id = gpus.get(pci) or gpus.setdefault(pci, svc.gpu_labels(pci))
            labels = dict(gpu=gpu, uuid=uuid, pci_bus_id=bus_id, xid=str(xid), **series_labels(w))
            yield Sample(XID_WORKLOAD.name, labels, t)

    def close(self) -> None:
        self.service.stop()

    def collect(self, out: Families) -> None:
        svc = self.service
        svc.refresh_acks()  # an ack shows from the next scrape
        snap = svc.snapshot()
        out.declare(XID_ERRORS)
        for pci, lines in sorted(snap.xids.items()):
            gpu, uuid, bus_id = svc.gpu_labels(pci)
            for line in lines:  # counted whether acknowledged or not: acks matter to the verdict only
                labels = dict(gpu=gpu, uuid=uuid, pci_bus_id=bus_id, xid=str(line.xid), tier=line.tier)
                out.add(XID_ERRORS, line.count, **labels)
                out.add(XID_LAST_SEEN, line.last_seen, **labels)
                if line.undecoded:
                    out.add(XID_UNDECODED, line.undecoded, gpu=gpu, uuid=uuid, pci_bus_id=bus_id,
                            xid=str(line.xid))
        acks = snap.acks
        out.declare(XID_WORKLOAD)
        out.add_samples(XID_WORKLOAD, self._workload_series.get(snap.hits_version,
                                                                lambda: self._workload_samples(acks)))
        out.declare(ACKED)
        acked: dict[tuple[str, str], float] = {}
        for a in acks:
            key = (a.pci, "all" if a.xid is None else str(a.xid))
            acked[key] = max(acked.get(key, 0.0), a.time)
        for (pci, xid), t in sorted(acked.items()):
            gpu, uuid, bus_id = svc.gpu_labels(pci)
            out.add(ACKED, t, gpu=gpu, uuid=uuid, pci_bus_id=bus_id, xid=xid)
        for (pci, etype), n in sorted(snap.nvml_events.items()):
            gpu, uuid, bus_id = svc.gpu_labels(pci)
            out.add(NVML_EVENTS, n, gpu=gpu, uuid=uuid, pci_bus_id=bus_id, event_type=etype)
        k, st = snap.kmsg, snap.kmsg.stats
        out.add(KMSG_UP, 1 if k.enabled and k.ok else 0)
        out.add(KMSG_RECORDS, st.records)
        out.add(KMSG_OVERWRITES, st.overwrites)
        out.add(KMSG_MISSED, st.missed)
        out.add(KMSG_MALFORMED, st.malformed)
        if k.last_seq is not None:
            out.add(KMSG_SEQ, k.last_seq)
        for source in ("kmsg", "nvml"):
            out.add(REPORTS, snap.reports.get(source, 0), source=source)
            out.add(MERGED, snap.merged.get(source, 0), source=source)
        out.add(DROPPED, snap.dropped)
        if snap.watcher is not None:
            alive, ws = snap.watcher
            out.add(WATCHER_UP, 1 if alive and ws.state == "watching" else 0)
            out.add(WATCHER_GPUS, ws.registered, state="registered")
            out.add(WATCHER_GPUS, ws.excluded, state="excluded")
            out.add(WATCHER_REBUILDS, ws.rebuilds)
            out.add(WATCHER_ERRORS, ws.errors)
        ss = snap.state
        out.add(STATE_OK, 1 if ss.ok else 0)
        out.add(STATE_RECOVERIES, ss.recoveries)
        out.add(STATE_ERRORS, ss.read_errors, operation="read")
        out.add(STATE_ERRORS, ss.write_errors, operation="write")


COLLECTOR = XidCollector
