"""What a workload is, as the workload source reports it and fault attribution records it.

The contract between the workload source (exporter/workload/: the Slurm mapping directory, the
cgroups of NVML's processes, the kubelet's pod-resources API) and the fault attribution (XID and
SXid counts, the state file, `check`): a reading maps each GPU, by UUID, to the workloads holding
it at the time of the reading.

It also holds the one rule for what a GPU holds (`admit`), applied by the workload source to
every reading before the `gpu_workload_info` series and fault attribution see it: a workload is
kept only when every label value of it is printable single-line text of at most MAX_LABEL_CHARS
characters, and a GPU holding one that is not is unobserved (unknown), never idle. So the
workload a series shows is the workload attribution records, bounded the same way in both."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Label names are dcgm-exporter's, so queries written against it carry over.
SLURM_LABELS = ("hpc_job",)
POD_LABELS = ("namespace", "pod", "container")
MAX_LABEL_CHARS = 253  # a Kubernetes name's limit; job ids are bounded shorter by their reader
MAX_WORKLOADS = 16  # workloads on one GPU at one time, shown and attributed (workload.max_per_gpu <= this)


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
    the epoch: for display), `mono` (time.monotonic() when it started: what attribution orders
    readings and events by, since the wall clock can step) and, for each GPU UUID the source
    could see, the workloads holding it (an empty tuple: seen idle). A GPU missing from `by_uuid`
    was not observed by this reading. `mono` None (a reading built by hand): `at` stands for it."""

    at: float
    by_uuid: dict[str, tuple[Workload, ...]]
    mono: float | None = None

    @property
    def when(self) -> float:
        return self.at if self.mono is None else self.mono


def printable_line(v: Any) -> bool:
    """A string of printable characters only (no control, line or paragraph separator: no
    U+2028, NEL, tab or newline), encodable as UTF-8."""
    if not isinstance(v, str) or not v.isprintable():
        return False
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (JSON can carry one as an escape)
        return False
    return True


def valid_label(v: Any) -> bool:
    """A label value fit for a series, a log line and the state file: printable single-line
    text of at most MAX_LABEL_CHARS characters."""
    return isinstance(v, str) and len(v) <= MAX_LABEL_CHARS and printable_line(v)


def valid_workload(w: Any) -> bool:
    """A Slurm job (hpc_job only) or a container (namespace, pod, container; no hpc_job), every
    label a valid_label."""
    if not isinstance(w, Workload):
        return False
    if not all(valid_label(f) for f in (w.hpc_job, w.namespace, w.pod, w.container)):
        return False
    return bool(w.hpc_job) and not (w.namespace or w.pod or w.container) or \
        not w.hpc_job and bool(w.pod)


def admit(workloads: Iterable[Any]) -> tuple[Workload, ...] | None:
    """The one rule for what a GPU holds: its workloads sorted, or None (the GPU's holder is
    unknown) when one of them cannot be kept as labels (valid_workload). Never () for a GPU that
    holds something."""
    given = tuple(workloads)
    if not all(valid_workload(w) for w in given):
        return None
    return tuple(sorted(set(given)))
