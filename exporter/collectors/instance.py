"""Instance identity as one `_info` metric (config first, then IMDSv2 found in the background), and
the EC2 scheduled maintenance events IMDSv2 announces (polled in the background, never on the
scrape path; docs/fabric.md)."""

from __future__ import annotations

from exporter import imds
from exporter.catalog import Families, define
from exporter.collector import Collector, Context

INSTANCE_INFO = define(
    "gpu_health_exporter_instance_info", "gauge",
    "Always 1; the EC2 identity of this node (config, else IMDSv2; empty while unknown). Absent "
    "until at least the instance type, id or zone is known.",
    ("instance_type", "instance_id", "availability_zone"), collector="instance")
IMDS_SUCCESS = define(
    "gpu_health_exporter_imds_lookup_success", "gauge",
    "1 once the background IMDSv2 lookup has succeeded, 0 while it fails and retries "
    "(for example a container behind a metadata hop limit of 1). Absent when IMDS is not used.",
    collector="instance")

EVENT_START = define(
    "ec2_scheduled_event_start_timestamp_seconds", "gauge",
    "Unix time from which an active EC2 scheduled maintenance event may start (NotBefore), one series "
    "per event: code instance-reboot, system-reboot, system-maintenance, instance-retirement or "
    "instance-stop. Absent when there is none (or IMDS is off).", ("code", "event_id"), unit="seconds",
    collector="instance")
EVENT_END = define(
    "ec2_scheduled_event_end_timestamp_seconds", "gauge",
    "Unix time by which an active EC2 scheduled event ends (NotAfter); absent when EC2 gives none "
    "(instance-stop).", ("code", "event_id"), unit="seconds", collector="instance")
EVENTS_SUCCESS = define(
    "gpu_health_exporter_imds_events_lookup_success", "gauge",
    "1 if the last poll of IMDSv2 events/maintenance/scheduled worked (no event series then means no "
    "event), 0 while it fails (the last answer's events stay exported). Absent when not polled.",
    collector="instance")


class InstanceCollector(Collector):
    name = imds.SECTION
    config_section = imds.InstanceSection
    prefix = "ec2_"
    docs_group = "EC2 instance and scheduled events"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.poller: imds.ImdsPoller[list[imds.ScheduledEvent]] | None = None
        self.events: list[imds.ScheduledEvent] = []  # the last good answer

    def start(self) -> None:
        self.poller = imds.events_poller(self.ctx.identity, self._publish_events)

    def _publish_events(self, events: list[imds.ScheduledEvent]) -> None:
        self.events = events  # replaced whole: a scrape sees one answer or the next

    def close(self) -> None:
        if self.poller is not None:
            self.poller.close()

    def collect(self, out: Families) -> None:
        ident = self.ctx.identity.current()
        if ident.instance_type or ident.instance_id or ident.availability_zone:
            out.add(INSTANCE_INFO, 1, instance_type=ident.instance_type or "",
                    instance_id=ident.instance_id or "", availability_zone=ident.availability_zone or "")
        lookup = self.ctx.identity.lookup  # started by the composition root, if IMDS is asked
        if lookup is not None:
            out.add(IMDS_SUCCESS, 1 if lookup.succeeded.is_set() else 0)
        out.declare(EVENT_START)
        for ev in self.events:
            out.add(EVENT_START, ev.not_before, code=ev.code, event_id=ev.event_id)
            if ev.not_after is not None:
                out.add(EVENT_END, ev.not_after, code=ev.code, event_id=ev.event_id)
        if self.poller is not None:
            out.add(EVENTS_SUCCESS, 1 if self.poller.ok else 0)


COLLECTOR = InstanceCollector
