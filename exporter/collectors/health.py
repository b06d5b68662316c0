"""Health verdict collector: per-GPU and node verdicts with their reasons, from the XIDs since
boot (less acknowledgements) and the GPU collector's reading of the same collection
(exporter.health). It is a derived collector: the runner starts it when the GPU collector has
finished and hands it that reading (exporter.collector.Derived says what it gets when the GPU
collector failed, missed its deadline or is not enabled)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter.catalog import Families, define
from exporter.collector import Context, Derived
from exporter.config import Key, declare_section, non_negative
from exporter.node import expected_gpus
from exporter.xid.service import evaluate
from exporter.xid.verdict import VERDICTS, NodeVerdict

G = ("gpu", "uuid", "pci_bus_id")

declare_section("health", "The per-GPU and node health verdict (docs/xid.md).", {
    "enabled": Key(bool, True, "Export the verdict."),
    "fabric_grace_seconds": Key((int, float), 300.0,
                                "Seconds after boot before a GPU whose NVLink fabric registration has not "
                                "completed counts against the verdict (docs/fabric.md).", check=non_negative),
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


class HealthCollector(Derived):
    name = "health"
    # Inputs, by collector name: "gpu" -> NodeGpuHealth (None when the GPU collector did not
    # hand one over in this collection).
    depends_on = ("gpu",)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.service = ctx.xid

    def derive(self, out: Families, inputs: Mapping[str, Any]) -> NodeVerdict:
        """Returns the verdict it exported (`check` prints it)."""
        self.service.refresh_acks()
        nv = evaluate(self.service, inputs["gpu"], expected_gpus(self.ctx),
                      self.ctx.config.health.fabric_grace_seconds)
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
        return nv


COLLECTOR = HealthCollector
