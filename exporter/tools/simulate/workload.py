"""The simulated node's workloads, so the quick start shows gpu_workload_info:

- `slurm-job`: Slurm job 4242 holds every GPU: the mapping directory
  root/run/slurm/dcgm_job_mapping is written as deploy/slurm/prolog.sh writes it, and the exporter
  is pointed at it (workload.slurm_job_mapping_dir).
- `k8s-pods`: two training pods hold half of the GPUs each (by UUID, as the NVIDIA device plugin
  names them), served by a tiny kubelet pod-resources v1 server on a unix socket under the root
  (workload.kubelet_socket), in a process of its own as a kubelet is
  (exporter.tools.simulate.podresources_server); it also lists a non-GPU device, which is not a GPU's
  workload.

Each scenario can run with the other; both start holding the GPUs at once."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from exporter.tools.simulate import job
from exporter.tools.simulate.kmsg import gpu_uuid
from exporter.tools.simulate.podresources_server import PodResourcesServer
from exporter.tools.simulate.source import SimSource

SLURM_JOB = "4242"
PODS = (("training", "llama-pretrain-0", "trainer"), ("training", "llama-pretrain-1", "trainer"))


def pod_resources(uuids: list[str]) -> list[tuple[str, str, str, str, list[str]]]:
    """(namespace, pod, container, resource, device ids) the simulated kubelet lists."""
    half = (len(uuids) + 1) // 2
    out = [(*PODS[0], "nvidia.com/gpu", uuids[:half]), (*PODS[1], "nvidia.com/gpu", uuids[half:])]
    out.append(("training", "llama-pretrain-0", "trainer", "vpc.amazonaws.com/efa", ["efa0"]))
    return [x for x in out if x[4]]


class WorkloadSimSource(SimSource):
    name = "workload"
    scenarios = {
        "slurm-job": "Slurm job 4242 holds every GPU (a mapping directory as the prolog writes it)",
        "k8s-pods": "two pods hold half the GPUs each (a kubelet pod-resources server on a unix socket)",
    }

    def __init__(self, root: Path, profile: Any, scenarios: set[str]) -> None:
        super().__init__(root, profile, scenarios)
        self.server: PodResourcesServer | None = None
        # exporter/tools/simulate/job.py: the mapping goes and comes back
        self.requeue = "job-requeue" in scenarios
        self._mapped = False

    @property
    def mapping_dir(self) -> Path:
        return self.root / "run/slurm/dcgm_job_mapping"

    @property
    def socket(self) -> Path:
        return self.root / "var/lib/kubelet/pod-resources/kubelet.sock"

    def build(self) -> None:
        uuids = [gpu_uuid(self.profile, i) for i in range(self.profile.gpus)]
        if "slurm-job" in self.active:
            self.mapping_dir.mkdir(parents=True, exist_ok=True)
            self._map(True)
        if "k8s-pods" in self.active:
            if importlib.util.find_spec("google.protobuf") is None:  # not a node's dependency
                raise ValueError("--scenario k8s-pods: the simulated kubelet needs protobuf, which the "
                                 "`simulate` extra installs: pip install 'gpu-health-exporter[simulate]'")
            self.socket.parent.mkdir(parents=True, exist_ok=True)
            self.server = PodResourcesServer(str(self.socket), pod_resources(uuids))

    def _map(self, held: bool) -> None:
        """Write the mapping as the prolog does (held), or remove it as the epilog does."""
        for i in range(self.profile.gpus):
            path = self.mapping_dir / str(i)
            if held:
                path.write_text(SLURM_JOB + "\n")
            else:
                path.unlink(missing_ok=True)
        self._mapped = held

    def advance(self, elapsed_s: float) -> None:
        if self.requeue and "slurm-job" in self.active and job.released(elapsed_s) == self._mapped:
            self._map(not self._mapped)

    def settings(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if "slurm-job" in self.active:
            out["workload.slurm_job_mapping_dir"] = str(self.mapping_dir)
        if "k8s-pods" in self.active:
            out["workload.kubelet_socket"] = str(self.socket)
        return out

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


SOURCE = WorkloadSimSource
