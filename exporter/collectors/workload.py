"""Workload collector: which Slurm job or Kubernetes container holds each GPU, as join series
(`gpu_workload_info`), never as labels on other series (each job would multiply them).

Off unless a kind is configured: `workload.slurm_job_mapping_dir`, `workload.slurm_cgroup`,
`workload.kubelet_socket` (or the --workload.* flags). The reading (exporter.workload.source)
runs under `workload.timeout_seconds`, after the GPU collector, and is this collector's return
value, so fault attribution gets it (`depends_on = ("workload",)`) in the same collection.

A kind that cannot be read at all fails the collection (collector_success 0, the reason on the
landing page); a kind that could not observe some GPUs (a bad mapping file, a device id that
matches no GPU, a GPU whose processes NVML cannot list) sets its
gpu_health_exporter_workload_source_up to 0, and those GPUs get no series."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from exporter.catalog import Families, define
from exporter.collector import Collector, Context, Failed, ProblemLog
from exporter.config import CollectorSection, non_negative, positive, setting
from exporter.metric import Sample
from exporter.workload.kubelet import DEFAULT_DRA_DRIVERS, DEFAULT_RESOURCES, DEFAULT_SOCKET
from exporter.workload.model import MAX_WORKLOADS, Workload, WorkloadReading
from exporter.workload.source import (
    KUBELET_SHARE,
    Kind,
    KubeletKind,
    SlurmCgroupKind,
    SlurmMappingKind,
    WorkloadSource,
)

if TYPE_CHECKING:
    from exporter.config import Config
    from exporter.deadline import Pool
    from exporter.nvml.session import NvmlSession


def _per_gpu(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_WORKLOADS:
        return f"an integer from 1 to {MAX_WORKLOADS} (what fault attribution keeps per GPU)"
    return None


def _roots(v: Any) -> str | None:
    if not v or not all(isinstance(x, str) and x.startswith("/") and len(x) <= 256 and x.isprintable()
                        for x in v):
        return "a non-empty list of absolute cgroup paths (/system.slice, /slurm)"
    return None


def _names(v: Any) -> str | None:
    if not v or not all(isinstance(x, str) and x and len(x) <= 253 for x in v):
        return "a non-empty list of resource names (shell patterns such as nvidia.com/mig-*)"
    return None


@dataclass
class WorkloadSection(CollectorSection):
    """Which Slurm job or Kubernetes pod holds each GPU (docs/deploy.md, 'Workloads'). Nothing is
    read, and no series exported, until at least one kind is configured."""

    name: ClassVar[str] = "workload"
    enabled: bool = setting(
        True, "Run the workload collector once a kind (slurm_job_mapping_dir, slurm_cgroup, "
        "kubelet_socket) is configured; without one it does not run.")
    slurm_job_mapping_dir: str | None = setting(
        None, "Slurm job mapping directory in dcgm-exporter's format (one file per GPU: named by its index, "
        "`N` or `N.M` for a MIG instance, or its UUID, `GPU-...` or `MIG-...`; one job id a line), as "
        "written by deploy/slurm/prolog.sh and HyperPod's lifecycle scripts: /run/slurm/dcgm_job_mapping "
        "(--workload.slurm-job-mapping-dir; docs/xid.md lists the forms each producer writes).")
    slurm_job_mapping_missing_seconds: float = setting(
        900.0, "How long after start a configured job mapping directory may not exist (no job has run "
        "since boot) before that is a problem of the slurm_mapping source (its GPUs unknown, "
        "gpu_health_exporter_workload_source_up 0). Create the directory at boot (deploy/slurm/"
        "tmpfiles.conf) to keep a node idle since boot quiet.", check=non_negative)
    slurm_cgroup: bool = setting(
        False, "Slurm without a prolog: each GPU's jobs from the cgroups (paths.procfs/PID/cgroup) of the "
        "processes NVML reports on it; a GPU with no process gets no job. Needs the host PID namespace "
        "(--workload.slurm-cgroup).")
    slurm_cgroup_roots: list[str] = setting(
        ["/system.slice", "/slurm"], "Where slurmstepd keeps its jobs' cgroups: a process is a job's only "
        "when its cgroup path starts at one of these with the job's directory right below (v2 "
        "`/system.slice/[<node>_]slurmstepd.scope/job_<id>`, v1 `/slurm/uid_<uid>/job_<id>`); nothing "
        "under user@UID.service or another delegated subtree counts. Add your CgroupPrepend, or the "
        "cgroup root of a slurmd not run by systemd.", check=_roots,
        expected="a list of absolute cgroup paths")
    kubelet_socket: str | None = setting(
        None, f"The kubelet's pod-resources socket, {DEFAULT_SOCKET} (--workload.kubelet-socket). "
        "Mount its directory, not the socket, so a kubelet restart is seen.")
    kubelet_resource_names: list[str] = setting(
        DEFAULT_RESOURCES, "Kubernetes resource names (shell patterns) whose devices are GPUs.",
        check=_names, expected="a list of resource names")
    kubelet_dra_drivers: list[str] = setting(
        DEFAULT_DRA_DRIVERS, "DRA drivers (shell patterns) whose claimed devices are GPUs: pod-resources' "
        "dynamic_resources (Kubernetes 1.34 and later); gpu.nvidia.com is NVIDIA's DRA driver.",
        check=_names, expected="a list of DRA driver names")
    max_per_gpu: int = setting(
        8, f"Workloads exported (and attributed) per GPU at most, 1 to {MAX_WORKLOADS}; the rest are "
        "counted in gpu_health_exporter_workload_overflow.", check=_per_gpu)
    timeout_seconds: float = setting(
        2.0, "Deadline of one reading of every kind (the kubelet's List gets 0.8 of it).", check=positive)

    def __post_init__(self) -> None:
        if not (self.slurm_job_mapping_dir or self.slurm_cgroup or self.kubelet_socket):
            self.enabled = False  # disabled by default: nothing to read

    def deadline_seconds(self) -> float | None:
        return self.timeout_seconds


# The flags, node_exporter style: --workload.<key with dashes>.
FLAGS = {"slurm_job_mapping_dir": "DIR", "kubelet_socket": "PATH"}


def add_flags(p: argparse.ArgumentParser) -> None:
    keys = WorkloadSection.keys()
    for key, metavar in FLAGS.items():
        p.add_argument(f"--workload.{key.replace('_', '-')}", dest=f"workload_{key}", metavar=metavar,
                       help=keys[key].doc)
    p.add_argument("--workload.slurm-cgroup", dest="workload_slurm_cgroup",
                   action=argparse.BooleanOptionalAction, help=keys["slurm_cgroup"].doc)


def flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    out = {f"workload.{k}": getattr(args, f"workload_{k}", None) for k in (*FLAGS, "slurm_cgroup")}
    return {k: v for k, v in out.items() if v is not None}


def from_config(config: Config, nvml: NvmlSession, pool: Pool,
                listeners: Sequence[Callable[[WorkloadReading], Any]] = ()) -> WorkloadSource | None:
    """The workload source of the config's `workload` section; None when no kind is configured
    (or the collector is disabled). The composition root builds it (fault attribution reads it
    too); the collector builds its own only when it was not handed one."""
    sec = config.find(WorkloadSection)
    if sec is None or not sec.enabled:
        return None
    kinds: list[Kind] = []
    if sec.slurm_job_mapping_dir:
        kinds.append(SlurmMappingKind(sec.slurm_job_mapping_dir, nvml, sec.slurm_job_mapping_missing_seconds))
    if sec.slurm_cgroup:
        kinds.append(SlurmCgroupKind(nvml, config.paths.procfs, sec.slurm_cgroup_roots))
    if sec.kubelet_socket:
        kinds.append(KubeletKind(nvml, sec.kubelet_socket, sec.kubelet_resource_names,
                                 sec.timeout_seconds * KUBELET_SHARE, sec.kubelet_dra_drivers))
    if not kinds:
        return None
    return WorkloadSource(kinds, sec.timeout_seconds, sec.max_per_gpu, pool, listeners=listeners)


WORKLOAD_INFO = define(
    "gpu_workload_info", "gauge",
    "Always 1; one series per GPU per workload holding it: a Slurm job has `hpc_job` (and no "
    "namespace, pod, container), a Kubernetes container `namespace`, `pod`, `container` (and no "
    "hpc_job), label names as dcgm-exporter's. None for an idle GPU or one not observed. Join on "
    "`gpu` with the info series on the left, since a GPU can have several: "
    "`gpu_workload_info * on(gpu) group_left() (gpu_lost == 1)` names the workloads of lost GPUs.",
    ("gpu", "uuid", "hpc_job", "namespace", "pod", "container"), collector="workload")
SOURCE_UP = define(
    "gpu_health_exporter_workload_source_up", "gauge",
    "1 if the workload source kind (slurm_mapping, slurm_cgroup, kubelet) observed every GPU in the "
    "last collection, 0 if it could not observe some (a bad mapping file, a device id that matches "
    "no GPU, a GPU whose processes NVML cannot list; the log and landing page say which).",
    ("source",), collector="workload")
OVERFLOW = define(
    "gpu_health_exporter_workload_overflow", "gauge",
    "Workloads holding the GPU beyond workload.max_per_gpu, neither exported nor attributed; absent "
    "when none.", ("gpu", "uuid"), collector="workload")


class WorkloadCollector(Collector):
    name = "workload"
    config_section = WorkloadSection
    prefix = "gpu_workload_"
    docs_group = "Workloads (Slurm jobs and Kubernetes pods on each GPU)"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        source = ctx.workload if ctx.workload is not None else from_config(ctx.config, ctx.nvml, ctx.pool)
        if source is None:
            raise ValueError("the workload collector needs a kind configured")
        self.source: WorkloadSource = source
        self.problems = ProblemLog(self.log)
        # reused: the same workloads scrape after scrape
        self._samples: dict[tuple[str, str, Workload], Sample] = {}

    def close(self) -> None:
        self.source.close()

    def collect(self, out: Families) -> Any:
        nvml = self.ctx.nvml
        if not nvml.ensure():
            raise Failed(f"no GPU list: {nvml.error}", None)
        gpus = list(nvml.devices)  # a GPU without a UUID (lost at start) is never observed
        obs = self.source.observe(gpus)
        for kind in self.source.kinds:
            if kind.name not in obs.failed:  # a failed kind is the collector's failure, logged by the runner
                self.problems.report(kind.name, "; ".join(obs.problems.get(kind.name, [])))
        if obs.failed:
            raise Failed("; ".join(f"{k}: {p}" for k in obs.failed for p in obs.problems[k]), obs.reading)
        index = {g.uuid: str(g.index) for g in gpus}
        by_uuid = obs.reading.by_uuid
        samples = [self._sample(str(g.index), g.uuid, w) for g in gpus for w in by_uuid.get(g.uuid, ())]
        out.declare(WORKLOAD_INFO)
        out.add_samples(WORKLOAD_INFO, samples)
        for kind in self.source.kinds:
            out.add(SOURCE_UP, 0 if obs.problems.get(kind.name) else 1, source=kind.name)
        for uuid, n in obs.overflow.items():
            out.add(OVERFLOW, n, gpu=index[uuid], uuid=uuid)
        return obs.reading

    def _sample(self, gpu: str, uuid: str, w: Workload) -> Sample:
        key = (gpu, uuid, w)
        s = self._samples.get(key)
        if s is None:
            if len(self._samples) > 4096:
                self._samples.clear()  # workloads come and go: keep the cache bounded
            s = self._samples[key] = Sample(WORKLOAD_INFO.name, {"gpu": gpu, "uuid": uuid, **w.labels()}, 1.0)
        return s


COLLECTOR = WorkloadCollector
