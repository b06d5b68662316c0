"""The verdict on the exporter's own Kubernetes Node (opt-in: `kubernetes.enabled`).

A derived collector that depends on the verdict (`health`) and the GPU collector's reading of the
same collection: it turns them into the `Desired` condition and actions (exporter.kube.condition)
and hands that to the writer thread (exporter.kube.writer), which talks to the API server. The
collection never waits for the API server: `derive` only offers and reads the writer's state. What
it exports is the writer's: up, the last success, the errors by kind. Nodes that leave it off build
none of it and export none of its series."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from exporter.catalog import Families, define
from exporter.collector import Context, Derived
from exporter.collectors.gpu import GpuSection
from exporter.config import CollectorSection, non_negative, positive, setting
from exporter.kube import client as kube
from exporter.kube.condition import Desired, cannot_tell, desired
from exporter.kube.writer import Options, Writer

NAME = "kubernetes"


@dataclass
class KubernetesSection(CollectorSection):
    """Keep the verdict on this node's Kubernetes Node object: the `GpuHealthy` condition, and
    optionally a NoSchedule taint and HyperPod's replacement label (docs/deploy.md, "The GpuHealthy
    node condition"). Off by default; the Kubernetes overlays turn it on with the RBAC it needs."""

    name: ClassVar[str] = NAME
    enabled: bool = setting(False, "Write the GpuHealthy condition on this node's Node object.")
    api_url: str = setting(
        "", "API server URL (https://HOST:PORT). Empty: in-cluster, from KUBERNETES_SERVICE_HOST and "
        "KUBERNETES_SERVICE_PORT.")
    token_file: str = setting(
        kube.TOKEN_FILE, "Bearer token file, read again when it changes (projected service-account "
        "tokens rotate).", path=True)
    ca_file: str = setting(
        kube.CA_FILE, "CA bundle that signs the API server's certificate. Empty: the system's CAs.",
        path=True)
    node_name: str = setting(
        "", "This node's Node name. Empty: the NODE_NAME environment variable (the DaemonSet sets it "
        "from spec.nodeName through the downward API).")
    heartbeat_seconds: float = setting(
        300.0, "The condition is written when it changes and at least this often (lastHeartbeatTime).",
        check=positive)
    request_timeout_seconds: float = setting(
        5.0, "Connect and read timeout of each API call (made on the writer's thread, never a scrape's).",
        check=positive)
    retry_max_seconds: float = setting(
        60.0, "Longest wait between retries after a failed call (the wait doubles from 1 s).",
        check=positive)
    taint: bool = setting(
        False, "Add the NoSchedule taint gpu-health-exporter/action-required on reset, reboot and "
        "replace verdicts; removed when the verdict clears (ack). Needs get and patch on nodes.")
    hyperpod_label: bool = setting(
        False, "Set sagemaker.amazonaws.com/node-health-status=UnschedulablePendingReplacement on "
        "replace verdicts, which asks SageMaker HyperPod to replace the node; removed when the verdict "
        "clears, if this exporter set it. Needs get and patch on nodes.")
    retry_min_seconds: float = setting(
        1.0, "First wait before a retry after a failed call.", check=non_negative)


# The opt-in actions as flags too, so a Kubernetes overlay's component turns one on together with
# the RBAC it needs (deploy/kubernetes/components/node-actions) without replacing the config file.
FLAGS = ("taint", "hyperpod_label")


def add_flags(p: argparse.ArgumentParser) -> None:
    keys = KubernetesSection.keys()
    for key in FLAGS:
        p.add_argument(f"--kubernetes.{key.replace('_', '-')}", dest=f"kubernetes_{key}",
                       action=argparse.BooleanOptionalAction,
                       help=f"{keys[key].doc} Overrides kubernetes.{key}.")


def flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    out = {f"kubernetes.{k}": getattr(args, f"kubernetes_{k}", None) for k in FLAGS}
    return {k: v for k, v in out.items() if v is not None}


UP = define(
    "gpu_health_exporter_kubernetes_up", "gauge",
    "1 if the last call to the Kubernetes API server (writing the GpuHealthy condition, the taint or "
    "label) succeeded, else 0 (also before the first). Present only with kubernetes.enabled.",
    collector=NAME)
LAST_SUCCESS = define(
    "gpu_health_exporter_kubernetes_last_success_timestamp_seconds", "gauge",
    "Unix time the Node was last written successfully (0: not yet).", unit="seconds", collector=NAME)
ERRORS = define(
    "gpu_health_exporter_kubernetes_errors_total", "counter",
    "Failed calls to the Kubernetes API server, by kind: config, connection, timeout, unauthorized, "
    "forbidden, not_found, conflict, server, other.", ["kind"], collector=NAME)


class KubernetesCollector(Derived):
    name = NAME
    config_section = KubernetesSection
    prefix = "gpu_health_exporter_kubernetes_"
    docs_group = "Kubernetes node condition"
    depends_on = ("health", "gpu")

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        sec: KubernetesSection = ctx.config.section(KubernetesSection)
        self.sec = sec
        self.writer = Writer(self._client, Options(
            taint=sec.taint, hyperpod_label=sec.hyperpod_label, heartbeat_s=sec.heartbeat_seconds,
            retry_min_s=sec.retry_min_seconds, retry_max_s=sec.retry_max_seconds))

    def _client(self) -> kube.Client:
        node = self.sec.node_name or os.environ.get("NODE_NAME", "")
        if not node:
            raise kube.ApiError("config", "no node name: set kubernetes.node_name or NODE_NAME (the "
                                "DaemonSet sets it from spec.nodeName)")
        ep = kube.endpoint(self.sec.api_url, self.sec.token_file, self.sec.ca_file)
        t = self.sec.request_timeout_seconds
        return kube.Client(ep, node, t, t)

    def start(self) -> None:
        self.writer.start()
        if self.ctx.xid is not None:
            # An XID, an ack or a lost GPU reaches the Node within seconds, scraped or not.
            self.ctx.xid.on_change(self.writer.poke)

    def bind_collect(self, collect: Any) -> None:
        self.writer.collect = collect

    def close(self) -> None:
        self.writer.close()

    def derive(self, out: Families, inputs: Mapping[str, Any]) -> Desired:
        want = self.judge(inputs.get("health"), inputs.get("gpu"))
        self.writer.offer(want)
        st = self.writer.state
        out.add(UP, 1 if st.up else 0)
        out.add(LAST_SUCCESS, st.last_success)
        for kind, n in sorted(st.errors.items()):
            out.add(ERRORS, n, kind=kind)
        return want

    def judge(self, nv: Any, gpu: Any) -> Desired:
        """The Desired of this collection: the verdict, unless the exporter could not tell
        (`check`'s exit-3 causes)."""
        svc = self.ctx.xid
        if svc is None:
            return cannot_tell("VerdictUnavailable", "the XID service is not configured")
        problems: list[tuple[str, str]] = []
        if gpu is None and self.ctx.config.section(GpuSection).enabled:
            problems.append(("GpuReadFailed", "the GPU collector gave no reading in this collection"))
        elif gpu.nvml_error:
            problems.append(("NvmlUnavailable", f"NVML: {gpu.nvml_error}"))
        snap = svc.snapshot()
        k = snap.kmsg
        unparsed = k.unparseable()
        if unparsed:
            problems.append(("KernelLogUnparsable", unparsed))
        elif k.enabled and not k.ok and not snap.state.found:
            if k.error:
                problems.append(("KernelLogUnreadable", f"kernel log {k.path}: {k.error}, and no state file "
                                 "for this boot"))
            else:  # the follower has not read it yet (the daemon's first collection)
                problems.append(("KernelLogNotRead", f"kernel log {k.path} not read yet, and no state file "
                                 "for this boot"))
        return desired(nv, problems, svc.hits(snap.acks))


COLLECTOR = KubernetesCollector
