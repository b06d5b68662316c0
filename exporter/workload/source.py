"""The workload source: which Slurm jobs and Kubernetes containers hold each GPU, from the kinds
configured (section `workload`):

- `slurm_mapping`: the Slurm job mapping directory (exporter.workload.slurm_mapping);
- `slurm_cgroup`: NVML's processes and their Slurm cgroups (exporter.workload.slurm_cgroup);
- `kubelet`: the kubelet's pod-resources API (exporter.workload.kubelet).

The interface fault attribution uses (exporter.workload.model has the types):

- `WorkloadSource.read(gpus) -> WorkloadReading`: a fresh reading of the GPUs `gpus` (the NVML
  session's `devices`), taken now under the source's own deadline (`workload.timeout_seconds`):
  safe to call from any thread (the XID follower when it counts an XID). Concurrent callers
  share one reading in flight. A kind that fails, hangs or misses the deadline observes no GPU,
  so those GPUs are missing from the reading (not observed), never reported idle.
- `WorkloadSource.latest`: the last reading taken (by a scrape or by `read`), None before the
  first.
- The `workload` collector (exporter.collectors.workload) returns each scrape's reading from its
  `collect`, so a `Derived` collector gets it with `depends_on = ("workload",)`.
- `Context.workload` is the process's one source (None when no kind is configured).
- `WorkloadSource.listeners`: called with every reading taken (the composition root,
  exporter.compose, passes fault attribution's history, exporter.attribution.history.WorkloadHistory.observe).

A GPU in a reading is observed by every configured kind; its workloads are the union of theirs,
sorted, at most `workload.max_per_gpu` (the rest counted in `Observation.overflow`). The one rule
for what a GPU holds (exporter.workload.model.admit) is applied here, so the series and fault
attribution see the same thing: a GPU holding a workload whose ids cannot be labels (too long,
not printable single-line text) is not observed, and says so, never idle."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from exporter import deadline
from exporter.nvml.backend import NvmlError
from exporter.nvml.session import DeviceIdentity, NvmlSession
from exporter.workload import kubelet, slurm_cgroup, slurm_mapping
from exporter.workload.model import MAX_LABEL_CHARS, Workload, WorkloadReading, admit

log = logging.getLogger("exporter.workload")

KUBELET_SHARE = 0.8  # of the source's deadline: the List call's own timeout, so it ends in time


@dataclass
class Observation:
    """One reading and what went wrong: `problems` per kind (a kind with a problem observed
    some or none of the GPUs), `overflow` per GPU UUID (workloads beyond max_per_gpu)."""

    reading: WorkloadReading
    problems: dict[str, list[str]] = field(default_factory=dict)
    overflow: dict[str, int] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)  # kinds that observed no GPU


KindResult = tuple[dict[str, tuple[Workload, ...]], list[str]]


class Kind:
    """One way of finding workloads. `read` returns (workloads by GPU UUID for the GPUs it
    observed, problems) or raises when it observed nothing."""

    name = ""

    def read(self, gpus: Sequence[DeviceIdentity]) -> KindResult:
        raise NotImplementedError

    def close(self) -> None:
        pass


class SlurmMappingKind(Kind):
    """The job mapping directory (exporter.workload.slurm_mapping). A directory that does not
    exist means no job for `missing_grace_s` after start (/run is emptied at boot and the first
    prolog creates it); past that it is a problem and no GPU is observed: a configured directory
    that never appears is a prolog that is not installed, not a node with every GPU idle."""

    name = "slurm_mapping"

    def __init__(self, path: str, nvml: NvmlSession | None = None, missing_grace_s: float = 900.0,
                 mono: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.nvml = nvml
        self.missing_grace_s = missing_grace_s
        self._mono = mono
        self._since = mono()
        self._warned_odd = False

    def read(self, gpus: Sequence[DeviceIdentity]) -> KindResult:
        try:
            found = slurm_mapping.read_dir(self.path)
        except OSError as e:
            raise OSError(f"Slurm job mapping directory {self.path}: {e.strerror or e}") from None
        if found.missing:
            waited = self._mono() - self._since
            if waited < self.missing_grace_s:
                return {g.uuid: () for g in gpus if g.uuid}, []
            return {}, [f"Slurm job mapping directory {self.path} does not exist {waited:.0f}s after start "
                        f"(workload.slurm_job_mapping_missing_seconds: {self.missing_grace_s:g}): is the "
                        "prolog installed (deploy/slurm/prolog.sh)? The GPUs' jobs are unknown"]
        if found.odd and not self._warned_odd:
            self._warned_odd = True
            where, jid = found.odd[0]
            log.warning("Slurm job mapping file %s holds %r, not of a Slurm job id's shape (123, 123_4, "
                        "123+1): taken as the job's id as dcgm-exporter takes any line (said once)",
                        where, jid)
        mig = self._mig_parents(gpus) if any(isinstance(g, str) and g.lower().startswith("mig-")
                                             for g in (*found.jobs, *found.bad)) else {}
        return slurm_mapping.by_uuid(found, gpus, mig)

    def _mig_parents(self, gpus: Sequence[DeviceIdentity]) -> dict[str, str]:
        """MIG device UUID -> its GPU's UUID, from NVML (empty without it: MIG-named files then
        match no GPU, a problem, never a guess)."""
        out: dict[str, str] = {}
        if self.nvml is None or not self.nvml.ensure():
            return out
        for g in gpus:
            if not g.uuid:
                continue
            try:
                for m in self.nvml.backend.mig_device_uuids(g.index):
                    out[str(m).lower()] = g.uuid
            except NvmlError:
                continue
        return out


class SlurmCgroupKind(Kind):
    name = "slurm_cgroup"

    def __init__(self, nvml: NvmlSession, procfs: str,
                 roots: Sequence[str] = slurm_cgroup.DEFAULT_ROOTS) -> None:
        self.nvml, self.procfs, self.roots = nvml, procfs, tuple(roots)

    def read(self, gpus: Sequence[DeviceIdentity]) -> KindResult:
        if not self.nvml.ensure():
            raise RuntimeError(f"NVML is not available for the processes on the GPUs: {self.nvml.error}")
        slurm_cgroup.check_procfs(self.procfs)
        return slurm_cgroup.jobs_by_uuid(self.nvml.backend, self.procfs, gpus, skip=self.nvml.lost,
                                         roots=self.roots)


class KubeletKind(Kind):
    name = "kubelet"

    def __init__(self, nvml: NvmlSession, socket_path: str, resources: Sequence[str],
                 timeout_s: float, dra_drivers: Sequence[str] = kubelet.DEFAULT_DRA_DRIVERS) -> None:
        self.nvml = nvml
        self.resources = list(resources)
        self.dra_drivers = list(dra_drivers)
        self.client = kubelet.KubeletClient(socket_path, timeout_s)
        self._index: kubelet.GpuIndex | None = None
        self._index_of: tuple[str, ...] = ()
        self._index_at = 0.0

    def read(self, gpus: Sequence[DeviceIdentity]) -> KindResult:
        listing = self.client.list()
        index = self._gpu_index(gpus)
        out, unmatched = kubelet.assign(listing.devices, gpus, self.resources, index, listing.claims,
                                        self.dra_drivers)
        if unmatched and time.monotonic() - self._index_at > 60:  # MIG reconfigured since: read again
            index = self._gpu_index(gpus, True)
            out, unmatched = kubelet.assign(listing.devices, gpus, self.resources, index, listing.claims,
                                            self.dra_drivers)
        return out, unmatched

    def _gpu_index(self, gpus: Sequence[DeviceIdentity], fresh: bool = False) -> kubelet.GpuIndex:
        key = tuple(g.uuid for g in gpus)
        if self._index is None or fresh or key != self._index_of:
            if self.nvml.ensure():
                self._index = kubelet.gpu_index(self.nvml.backend, gpus)
            else:  # UUIDs still match; minors and MIG devices wait for NVML
                self._index = kubelet.GpuIndex({g.uuid.lower(): g.uuid for g in gpus if g.uuid}, {},
                                               {g.index: g.uuid for g in gpus if g.uuid}, {})
            self._index_of, self._index_at = key, time.monotonic()
        return self._index

    def close(self) -> None:
        self.client.close()


class WorkloadSource:
    """The configured kinds, read under one deadline; see the module docstring."""

    def __init__(self, kinds: Sequence[Kind], timeout_s: float, max_per_gpu: int, pool: deadline.Pool,
                 clock: Callable[[], float] = time.time, mono: Callable[[], float] = time.monotonic,
                 listeners: Sequence[Callable[[WorkloadReading], Any]] = ()) -> None:
        self.kinds = list(kinds)
        self.timeout_s = timeout_s
        self.max_per_gpu = max_per_gpu
        self._clock = clock
        self._mono = mono
        self._inflight_mono = 0.0  # when the reading in flight started
        self._reads = deadline.Deadlines(pool)
        self._lock = threading.Lock()
        self._inflight: Future[Observation] | None = None
        self.latest: WorkloadReading | None = None
        self.last: Observation | None = None
        # told every reading, the scrape's and a fresh one alike (fault attribution's history)
        self.listeners = tuple(listeners)

    def read(self, gpus: Sequence[DeviceIdentity]) -> WorkloadReading:
        """A fresh reading (see the module docstring)."""
        return self.observe(gpus).reading

    def observe(self, gpus: Sequence[DeviceIdentity], not_before: float | None = None) -> Observation:
        """A fresh reading with its problems and overflow; joins a reading in flight, unless
        that one started before monotonic time `not_before` (a live fault's reading must start
        after the fault): then it waits for that one to end and takes its own."""
        while True:
            with self._lock:
                fut = self._inflight
                owner = fut is None
                if fut is None:
                    fut = self._inflight = Future()
                    started = self._inflight_mono = self._mono()
                stale = not owner and not_before is not None and self._inflight_mono < not_before
            if not stale:
                break
            try:  # the owner clears _inflight before it hands its result over: no spin after this
                fut.result(timeout=self.timeout_s + 1.0)
            except FutureTimeout:
                return self._nothing("the reading in flight did not end in time")
            except Exception:  # noqa: BLE001 - its outcome is not ours; a reading of our own follows
                pass
        if not owner:
            try:
                return fut.result(timeout=self.timeout_s + 1.0)
            except Exception as e:  # the owner's failure or its overrun: this caller observed nothing
                why = "the reading in flight did not end in time" if isinstance(e, FutureTimeout) else repr(e)
                return self._nothing(why)
        try:
            obs = self._observe(gpus, started)
        except BaseException as e:  # a written-off worker unwinds here too: never leave joiners waiting
            with self._lock:
                self._inflight = None
            fut.set_exception(e if isinstance(e, Exception) else RuntimeError("abandoned"))
            raise
        with self._lock:
            self._inflight = None
        fut.set_result(obs)
        return obs

    def _nothing(self, why: str) -> Observation:
        return Observation(WorkloadReading(self._clock(), {}, self._mono()),
                           {k.name: [why] for k in self.kinds}, failed=[k.name for k in self.kinds])

    def _observe(self, gpus: Sequence[DeviceIdentity], mono: float) -> Observation:
        at = self._clock()
        gpus = list(gpus)
        outcomes = self._reads.each(self.kinds, lambda k: k.read(gpus), key=lambda k: k.name,
                                    timeout=self.timeout_s, budget=self.timeout_s)
        problems: dict[str, list[str]] = {}
        failed: list[str] = []
        results: list[dict[str, tuple[Workload, ...]]] = []
        for kind, o in zip(self.kinds, outcomes, strict=True):
            if o.ok:
                found, kind_problems = o.value
                results.append(found)
                if kind_problems:
                    problems[kind.name] = kind_problems
                continue
            failed.append(kind.name)
            results.append({})
            problems[kind.name] = [_why(o)]
        observed = set.intersection(*(set(r) for r in results)) if results else set()
        by_uuid: dict[str, tuple[Workload, ...]] = {}
        overflow: dict[str, int] = {}
        index = {g.uuid: g.index for g in gpus}
        for uuid in sorted(observed):
            held = admit(w for r in results for w in r[uuid])
            if held is None:  # the one rule: shown and attributed alike, so neither
                problems.setdefault(_kind_of(results, self.kinds, uuid), []).append(
                    f"GPU {index.get(uuid, uuid)}: a workload id that is not printable single-line text "
                    f"of at most {MAX_LABEL_CHARS} characters; the GPU's workloads are unknown")
                continue
            if len(held) > self.max_per_gpu:
                overflow[uuid] = len(held) - self.max_per_gpu
                held = held[:self.max_per_gpu]
            by_uuid[uuid] = held
        obs = Observation(WorkloadReading(at, by_uuid, mono), problems, overflow, failed)
        self.latest, self.last = obs.reading, obs
        for listener in self.listeners:
            listener(obs.reading)
        return obs

    def close(self) -> None:
        for k in self.kinds:
            try:
                k.close()
            except Exception:  # noqa: BLE001 - shutdown goes on
                log.exception("closing workload kind %s", k.name)


def _kind_of(results: list[dict[str, tuple[Workload, ...]]], kinds: Sequence[Kind], uuid: str) -> str:
    """The kind whose reading of GPU `uuid` holds a workload the rule refuses."""
    for kind, r in zip(kinds, results, strict=True):
        if admit(r.get(uuid, ())) is None:
            return kind.name
    return kinds[0].name


def _why(o: deadline.Outcome) -> str:
    """The outcome's own reason (exporter.deadline.Outcome.reason), except that an error the
    sources raise with their own words (the socket or file they name) keeps those words."""
    if isinstance(o.value, (OSError, RuntimeError, kubelet.KubeletError)):  # o is not OK: its exception
        return str(o.value)
    return o.reason

