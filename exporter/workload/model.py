"""What a workload is, as the workload source reports it and fault attribution records it.

The contract between the workload source (exporter/workload/: the Slurm mapping directory, the
cgroups of NVML's processes, the kubelet's pod-resources API) and the fault attribution (XID and
SXid counts, the state file, `check`): a reading maps each GPU, by UUID, to the workloads holding
it at the time of the reading."""

from __future__ import annotations

from dataclasses import dataclass

# Label names are dcgm-exporter's, so queries written against it carry over.
SLURM_LABELS = ("hpc_job",)
POD_LABELS = ("namespace", "pod", "container")


@dataclass(frozen=True, order=True)
class Workload:
    """One Slurm job (`hpc_job` set) or one Kubernetes container (`namespace`, `pod`,
    `container` set); the other fields are empty."""

    hpc_job: str = ""
    namespace: str = ""
    pod: str = ""
    container: str = ""

    @property
    def kind(self) -> str:
        return "slurm" if self.hpc_job else "pod"

    def labels(self) -> dict[str, str]:
        """The workload's own labels: {hpc_job} for a job, {namespace, pod, container} for a pod."""
        names = SLURM_LABELS if self.hpc_job else POD_LABELS
        return {n: getattr(self, n) for n in names}

    def describe(self) -> str:
        """A short human form for log lines, `check` and drain reasons."""
        if self.hpc_job:
            return f"slurm job {self.hpc_job}"
        return f"pod {self.namespace}/{self.pod} container {self.container}"


@dataclass(frozen=True)
class WorkloadReading:
    """One reading of the workload source: `at` (the wall-clock time it was taken, seconds since
    the epoch) and, for each GPU UUID the source could see, the workloads holding it (an empty
    tuple: seen idle). A GPU missing from `by_uuid` was not observed by this reading."""

    at: float
    by_uuid: dict[str, tuple[Workload, ...]]
