"""Instance identity as one `_info` metric (config first, then IMDSv2 found in the background)."""

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


class InstanceCollector(Collector):
    name = imds.SECTION

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.lookup: imds.IdentityLookup | None = None

    def start(self) -> None:
        self.lookup = imds.ensure_lookup(self.ctx)

    def close(self) -> None:
        if self.lookup is not None:
            self.lookup.close()

    def collect(self, out: Families) -> None:
        ident = imds.identity(self.ctx)
        if ident.instance_type or ident.instance_id or ident.availability_zone:
            out.add(INSTANCE_INFO, 1, instance_type=ident.instance_type or "",
                    instance_id=ident.instance_id or "", availability_zone=ident.availability_zone or "")
        if self.lookup is not None:
            out.add(IMDS_SUCCESS, 1 if self.lookup.succeeded.is_set() else 0)


COLLECTOR = InstanceCollector
