"""Health verdict collector: per-GPU and node verdicts with their reasons, from the XIDs since
boot (less acknowledgements) and the GPU collector's NVML state (exporter.health)."""

from __future__ import annotations

import time

from exporter.catalog import Families, define
from exporter.collector import Collector, Context
from exporter.config import Key, declare_section, non_negative
from exporter.node import expected_gpus
from exporter.xid.service import evaluate, xid_service
from exporter.xid.verdict import VERDICTS

G = ("gpu", "uuid", "pci_bus_id")

declare_section("health", "The per-GPU and node health verdict (docs/xid.md).", {
    "enabled": Key(bool, True, "Export the verdict."),
    "wait_for_gpu_seconds": Key((int, float), 1.0,
                                "How long a collection waits for the GPU collector's reading of the same "
                                "scrape before using its previous one.", check=non_negative),
})

VERDICT = define(
    "gpu_health_verdict", "gauge",
    "1 for the GPU's current verdict (healthy, degraded, reset_required, reboot_required, "
    "replace_required), 0 for the others.", G + ("verdict",), collector="health")
REASON = define(
    "gpu_health_reason", "gauge",
    "1 per active reason behind the GPU's verdict (bounded set, see docs/xid.md).", G + ("reason",),
    collector="health")
NODE_VERDICT = define(
    "gpu_node_health_verdict", "gauge",
    "1 for the node's current verdict (the worst of its GPUs' and its own), 0 for the others.",
    ["verdict"], collector="health")
NODE_REASON = define(
    "gpu_node_health_reason", "gauge",
    "1 per active reason behind the node's verdict.", ["reason"], collector="health")


class HealthCollector(Collector):
    name = "health"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.service = xid_service(ctx)
        self._used = None  # the GPU reading the previous verdict was computed from
        self._first = True

    def _gpu_health(self):  # noqa: ANN202 - NodeGpuHealth or None
        """This scrape's GPU reading when it comes within wait_for_gpu_seconds, else the last one.
        The GPU collector runs in parallel and publishes a new object per collection, so "new"
        means "not the object the previous verdict used"."""
        deadline = time.monotonic() + self.ctx.config.health.wait_for_gpu_seconds
        h = self.ctx.shared.get("gpu_health")
        # None after the first collection: no GPU collector runs, do not wait for one
        while h is self._used and (h is not None or self._first) and time.monotonic() < deadline:
            time.sleep(0.005)
            h = self.ctx.shared.get("gpu_health")
        self._used, self._first = h, False
        return h

    def collect(self, out: Families) -> None:
        self.service.refresh_acks()
        nv = evaluate(self.service, self._gpu_health(), expected_gpus(self.ctx))
        for g in nv.gpus:
            labels = dict(gpu=g.gpu, uuid=g.uuid, pci_bus_id=g.pci_bus_id)
            for v in VERDICTS:
                out.add(VERDICT, 1 if v == g.verdict else 0, verdict=v, **labels)
            for r in g.reasons:
                out.add(REASON, 1, reason=r, **labels)
        for v in VERDICTS:
            out.add(NODE_VERDICT, 1 if v == nv.verdict else 0, verdict=v)
        out.declare(REASON)
        out.declare(NODE_REASON)
        for r in nv.reasons:
            out.add(NODE_REASON, 1, reason=r)


COLLECTOR = HealthCollector
