"""Health verdict collector: per-GPU and node verdicts with their reasons, from the XIDs since
boot (less acknowledgements) and the GPU collector's reading of the same collection
(exporter.health). It is a derived collector: the runner starts it when the GPU collector has
finished and hands it that reading (exporter.collector.Derived says what it gets when the GPU
collector failed, missed its deadline or is not enabled).

It gathers the verdict's inputs and exports what the verdict (exporter.xid.verdict.judge, pure)
says. The XID state it needs comes from the process's XID service (ctx.xid) whatever else is
enabled: the state file is loaded at start even when the xid and nvswitch collectors are off."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from exporter.catalog import Families, define
from exporter.collector import Derived
from exporter.config import CollectorSection, non_negative, setting
from exporter.node import expected_gpus
from exporter.xid.parser import pci_key
from exporter.xid.service import XidService
from exporter.xid.verdict import (
    FABRIC_GRACE_S,
    UNRESPONSIVE_S,
    VERDICTS,
    ActiveReasons,
    GpuInput,
    NodeVerdict,
    judge,
)

G = ("gpu", "uuid", "pci_bus_id")

@dataclass
class HealthSection(CollectorSection):
    """The per-GPU and node health verdict (docs/xid.md)."""

    name: ClassVar[str] = "health"
    enabled: bool = setting(
        True, "Export the verdict.")
    fabric_grace_seconds: float = setting(
        300.0, "Seconds after boot before a GPU whose NVLink fabric registration has not completed counts "
        "against the verdict (docs/fabric.md).", check=non_negative)
    unresponsive_seconds: float = setting(
        UNRESPONSIVE_S, "How long NVML may fail to answer for a GPU (its reads overrunning "
        "gpu.read_timeout_seconds) before its verdict goes from unknown (reason gpu_not_answering) to "
        "reboot_required (gpu_unresponsive); docs/xid.md, \"A GPU that does not answer\".",
        check=non_negative)

VERDICT = define(
    "gpu_health_verdict", "gauge",
    "1 for the GPU's current verdict (healthy, degraded, unknown, reset_required, reboot_required, "
    "replace_required), 0 for the others; unknown: NVML did not answer or its reads failed.",
    G + ("verdict",), collector="health")
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
    config_section = HealthSection
    prefix = "gpu_"
    docs_group = "GPU and node health verdicts"
    # Inputs, by collector name: "gpu" -> NodeGpuHealth (None when the GPU collector did not
    # hand one over in this collection); "active" -> ActiveReasons from the active checks' valid
    # results (None: the active collector is off or failed, so they add nothing).
    depends_on = ("gpu", "active")

    @property
    def service(self) -> XidService:
        return self.ctx.xid_service()

    def start(self) -> None:
        self.service.ensure_loaded()  # the verdict needs the state file whatever else runs

    def derive(self, out: Families, inputs: Mapping[str, Any]) -> NodeVerdict:
        """Returns the verdict it exported (`check` prints it)."""
        self.service.ensure_loaded()
        self.service.refresh_acks()
        cfg = self.ctx.config.section(HealthSection)
        nv = evaluate(self.service, inputs["gpu"], expected_gpus(self.ctx), cfg.fabric_grace_seconds,
                      cfg.unresponsive_seconds, inputs.get("active"))
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


def evaluate(service: XidService, health: Any, expected: int | None,
             fabric_grace_s: float = FABRIC_GRACE_S, unresponsive_s: float = UNRESPONSIVE_S,
             active: ActiveReasons | None = None) -> NodeVerdict:
    """Gather the verdict's inputs: the GPUs of the GPU collector's reading (else those NVML
    lists) and every address with XIDs, each with its XIDs less acks, and the SXids."""
    rows: dict[str, tuple[str, str, str, Any]] = {}
    s = service.session()
    if health is not None and health.gpus:
        for h in health.gpus.values():
            k = pci_key(h.pci_bus_id)
            if k is not None:
                rows[k] = (str(h.index), h.uuid, h.pci_bus_id, h)
                service.identify(k, h.index, h.uuid)
    elif s is not None:
        for d in s.devices:
            k = pci_key(d.pci_bus_id)
            if k is not None:
                rows[k] = (str(d.index), d.uuid, d.pci_bus_id, None)
    snap = service.snapshot()
    for k in snap.xids:
        if k not in rows:
            rows[k] = (*service.gpu_labels(k), None)
    gpus = [GpuInput(gpu, uuid, bus_id, h, list(snap.xids.get(k, ())),
                     s is not None and gpu.isdigit() and int(gpu) in s.lost)
            for k, (gpu, uuid, bus_id, h) in rows.items()]
    return judge(gpus, health, expected, list(snap.sxids), service.kernel_now(), fabric_grace_s,
                 unresponsive_s, active)


COLLECTOR = HealthCollector
