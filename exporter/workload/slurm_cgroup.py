"""Slurm jobs without a prolog: the processes NVML reports on each GPU, mapped to their job
through /proc/PID/cgroup (under the configurable procfs root).

Slurm puts every step's processes in a cgroup named after the job, at the root of the hierarchy
where slurmstepd keeps its jobs, and only there is a path trusted (a job id anywhere else can be
forged: an unprivileged user can create `x_slurmstepd.scope/job_4242` under their own
`user@UID.service`, which systemd delegates to them):
- cgroup v2: `/system.slice/slurmstepd.scope/job_<id>/...`, on the unified line (`0::`); with
  --enable-multiple-slurmd the scope is `<node>_slurmstepd.scope`;
- cgroup v1: `/slurm/uid_<uid>/job_<id>/...` on a controller's line (`/slurm` is CgroupPrepend's
  default).
The roots are `workload.slurm_cgroup_roots` (default `/system.slice` for v2 and `/slurm` for v1;
add another CgroupPrepend, or the cgroup root of a slurmd not run by systemd). A path must start
at one of them: nothing under `/user.slice`, `user@UID.service` or any other subtree matches.

A GPU allocated to a job with no process running on it cannot be seen this way: a GPU with no
process gets no job. A containerised exporter needs the host's PID namespace (hostPID) so that
NVML's PIDs are its own. `parse_cgroup` is pure; the rest reads NVML and procfs."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

from exporter.nvml.backend import NvmlBackend, NvmlError
from exporter.nvml.session import DeviceIdentity
from exporter.workload.model import Workload

DEFAULT_ROOTS = ("/system.slice", "/slurm")
_V2 = re.compile(r"/(?:[^/]+_)?slurmstepd\.scope/job_([0-9]{1,20})(?:/|$)")  # below a root
_V1 = re.compile(r"/uid_[0-9]{1,10}/job_([0-9]{1,20})(?:/|$)")
PROCESS_CALLS = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses")
MAX_CGROUP_BYTES = 64 * 1024


def parse_cgroup(text: str, roots: Sequence[str] = DEFAULT_ROOTS) -> str | None:
    """The Slurm job id in a /proc/PID/cgroup file's text (`hier:controllers:path` lines), else
    None: a v2 path (the `0::` line) or a v1 path (a controller's line) that starts at one of
    `roots` with slurmstepd's job directory right below it."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        unified = hier == "0" and controllers == ""
        pattern = _V2 if unified else _V1
        for root in roots:
            root = "/" + root.strip("/") if root.strip("/") else ""
            if root and not path.startswith(root + "/"):
                continue
            m = pattern.match(path, len(root))
            if m:
                return m.group(1)
    return None


def gpu_pids(backend: NvmlBackend, index: int) -> set[int]:
    """PIDs of the processes NVML reports on GPU `index` (compute and graphics; on a MIG GPU,
    those of all its instances). Raises NvmlError when neither list can be read."""
    pids: set[int] = set()
    errors: list[NvmlError] = []
    for fn in PROCESS_CALLS:
        try:
            procs = backend.call(index, fn)
        except NvmlError as e:
            errors.append(e)
            continue
        pids.update(int(p["pid"]) for p in procs or () if isinstance(p, dict) and "pid" in p)
    if len(errors) == len(PROCESS_CALLS):
        raise errors[0]
    return pids


def check_procfs(procfs: str) -> None:
    """Raise RuntimeError when procfs hides other users' processes (mounted with hidepid, or
    systemd's ProtectProc=invisible): their jobs could not be told from ended processes, so every
    GPU would look idle. PID 1 is root's: visible only when the others are."""
    if not os.path.exists(f"{procfs}/1"):
        raise RuntimeError(f"{procfs} does not show other users' processes (hidepid, or systemd's "
                           "ProtectProc=invisible): the Slurm cgroup kind cannot see the jobs' processes")


def job_of_pid(procfs: str, pid: int, roots: Sequence[str] = DEFAULT_ROOTS) -> str | None:
    """The job of process `pid` from {procfs}/PID/cgroup; None when it is in no job (or gone)."""
    try:
        fd = os.open(f"{procfs}/{pid}/cgroup", os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        return None  # exited since NVML listed it
    try:
        data = os.read(fd, MAX_CGROUP_BYTES)
    except ProcessLookupError:
        return None
    finally:
        os.close(fd)
    return parse_cgroup(data.decode("utf-8", "replace"), roots)


def jobs_by_uuid(backend: NvmlBackend, procfs: str, gpus: Sequence[DeviceIdentity],
                 skip: Iterable[int] = (), roots: Sequence[str] = DEFAULT_ROOTS,
                 ) -> tuple[dict[str, tuple[Workload, ...]], list[str]]:
    """Each GPU's jobs (by UUID) from its processes; a GPU whose processes NVML cannot list is
    not observed (a problem), nor are the GPUs in `skip` (lost)."""
    out: dict[str, tuple[Workload, ...]] = {}
    problems: list[str] = []
    cache: dict[int, str | None] = {}
    skip = set(skip)
    for g in gpus:
        if not g.uuid or g.index in skip:
            continue
        try:
            pids = gpu_pids(backend, g.index)
        except NvmlError as e:
            problems.append(f"GPU {g.index}: NVML cannot list its processes: {e}")
            continue
        jobs: set[str] = set()
        for pid in pids:
            if pid not in cache:
                cache[pid] = job_of_pid(procfs, pid, roots)
            job = cache[pid]
            if job:
                jobs.add(job)
        out[g.uuid] = tuple(Workload(hpc_job=j) for j in sorted(jobs))
    return out, problems
