"""The GPU collector: NVML health of every GPU, one sick GPU never hiding the others.

Each GPU is read under its own deadline (gpu.read_timeout_seconds) by exporter.deadline: NVML
calls can block for tens of seconds on a sick GPU and cannot be interrupted, so reads run on a
worker of the process's pool (Context.pool) and a GPU whose read overruns is reported unread
(gpu_read_success 0) while the other GPUs are served; until its stuck call returns it is not
read again (one stuck thread per GPU at most). One worker reads the GPUs in turn and, when a GPU
overruns, another carries on with the rest.

Expensive counters (energy, throttle time, PCIe replays and errors, ECC mode, NVLink) are read
in the background, on the pool, at most every gpu.slow_interval_seconds (a scrape starts the
refresh when it is due), and served from the last reading.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from exporter import deadline
from exporter.catalog import Families
from exporter.collector import Collector, Context, Failed, ProblemLog
from exporter.config import CollectorSection, positive, setting
from exporter.gpu import metrics as m
from exporter.gpu.gpm import REASONS
from exporter.gpu.reader import DETAIL, GpuReader, Reading, check_detail
from exporter.health import GpuHealth, NodeGpuHealth
from exporter.metric import Sample
from exporter.node import expected_gpus
from exporter.nvml.backend import NvmlError
from exporter.nvml.session import DeviceIdentity, NvmlSession

GPU_READ_SHARE = 0.8  # of gpu.timeout_seconds: all GPUs' reads, so the collection ends in time


def _read_within_budget(v: dict[str, Any]) -> str | None:
    if v["read_timeout_seconds"] > v["timeout_seconds"] * GPU_READ_SHARE:
        return (f"key 'gpu.read_timeout_seconds' is {v['read_timeout_seconds']!r}; expected at most "
                f"{GPU_READ_SHARE:g} x gpu.timeout_seconds ({v['timeout_seconds'] * GPU_READ_SHARE:g}), the "
                "share of the collection the GPU reads get")
    return None


@dataclass
class GpuSection(CollectorSection):
    """GPU health from NVML (the real library, a capture, or the simulated node)."""

    name: ClassVar[str] = "gpu"
    checks: ClassVar[tuple[Callable[[Any], str | None], ...]] = (_read_within_budget,)
    enabled: bool = setting(True, "Run the GPU collector.")
    timeout_seconds: float = setting(
        4.0,
        "Deadline of the whole GPU collection in one scrape; past it the collector reports failure.",
        check=positive)
    read_timeout_seconds: float = setting(
        1.0,
        "How long one scrape waits for one GPU's NVML reads. A GPU that takes longer (a hung GPU) "
        "gets gpu_read_success 0 for that scrape and the other GPUs are served. At most 0.8 x "
        "timeout_seconds (a config error otherwise).",
        check=positive)
    slow_interval_seconds: float = setting(
        15.0,
        "How often the expensive counters (energy, throttle time, PCIe replays and errors, ECC mode, "
        "NVLink) are read in the background; scrapes serve the last reading.",
        check=positive)
    parallel: bool = setting(
        False,
        "Retired, ignored (kept so configs that set it still load): the GPUs are read one after "
        "another; reading them at once saved wall time but no CPU (docs/performance.md).")
    nvlink: bool = setting(True, "Read NVLink link state and error counters (slow cadence).")
    detail: str | list[str] = setting(
        [],
        "Opt-in series beyond the default (which has what the rules, dashboards, runbooks and the "
        "verdict use): a list of " + "; ".join(f"{k}: {v}" for k, v in DETAIL.items())
        + "; or all. nvlink_per_link costs 680 series on a p5 (8 GPUs x 18 links x 5); the link "
        "is named in the XID 74 log line either way.",
        check=check_detail, expected="a list of detail names, or all")

    def deadline_seconds(self) -> float | None:
        return self.timeout_seconds


# (labels and static facts it was built for, gpu_info, gpu_lost 0/1, gpu_read_success 0/1)
FixedSamples = tuple[tuple[Any, ...], Sample, tuple[Sample, ...], tuple[Sample, ...]]


class NoAnswer(str):
    """Why a GPU has no reading when its NVML calls did not answer within the read deadline."""


@dataclass
class _Gpu:
    """One GPU's reader, the lock its reads hold, and its last slow reading."""

    reader: GpuReader
    lock: threading.Lock = field(default_factory=threading.Lock)
    slow: Reading | None = None
    fixed: FixedSamples | None = None  # see GpuCollector._fixed


class GpuCollector(Collector):
    name = "gpu"
    config_section = GpuSection
    prefix = "gpu_"
    docs_group = "GPU (NVML)"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        cfg = ctx.config.section(GpuSection)
        self.budget = cfg.timeout_seconds * GPU_READ_SHARE
        self.read_timeout = cfg.read_timeout_seconds  # at most the budget (the config checks it)
        self.slow_interval = cfg.slow_interval_seconds
        self.nvlink = cfg.nvlink
        self.detail = frozenset(DETAIL) if cfg.detail == "all" else frozenset(cfg.detail)
        self.session: NvmlSession = ctx.nvml
        self.gpus: dict[int, _Gpu] = {}
        self.pool = ctx.pool
        self._fast = deadline.Deadlines(self.pool)
        # a slow read holds its GPU's lock: one that hangs is left to its deadline like a fast one
        self._slow = deadline.Deadlines(self.pool)
        self._slow_lock = threading.Lock()  # one refresh at a time
        self._slow_due = 0.0  # monotonic time the next background refresh is due
        self._started = False
        self._closed = False
        self._init_lock = threading.Lock()
        self.problems = ProblemLog(self.log)
        self._activity: dict[int, str] = {}  # GPU index -> its last activity reason (logged on change)
        # GPU index -> monotonic time its NVML calls first overran the read deadline; cleared when
        # it answers again (the verdict's gpu_not_answering / gpu_unresponsive, exporter.health)
        self._unanswered_since: dict[int, float] = {}

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._started = True  # scrapes now keep the slow reading fresh
        self._refresh_in_background()

    def close(self) -> None:
        self._closed = True

    def _ready(self) -> NvmlSession | None:
        """The NVML session when usable, with a reader per GPU; None when NVML is unavailable."""
        s = self.session
        if not s.ensure():
            return None
        if not self.gpus:
            with self._init_lock:
                if not self.gpus:
                    gpus = {d.index: _Gpu(GpuReader(s.backend, d.index, self.nvlink, self.detail))
                            for d in s.devices}
                    for d in s.devices:
                        gpus[d.index].reader.labels = identity_labels(d)
                    self.gpus = gpus
        return s

    # --- one GPU ----------------------------------------------------------------------------
    def _read_fast(self, i: int) -> Reading:
        g = self.gpus[i]
        with g.lock:
            try:
                r = g.reader.read_fast()
            except NvmlError as e:
                r = Reading(ok=False, lost=e.gpu_lost, errors=[str(e)])
        return r

    def _read_slow(self, i: int) -> None:
        g = self.gpus[i]
        with g.lock:
            try:
                g.slow = g.reader.read_slow()
            except NvmlError as e:
                g.slow = Reading(ok=False, lost=e.gpu_lost, errors=[str(e)])

    # --- all GPUs, each under its deadline ----------------------------------------------------
    def _read_all(self) -> dict[int, Reading | str]:
        """Each GPU's reading, or why there is none (NVML did not answer in time, or the GPUs
        before it used up the budget)."""
        order = list(self.gpus)
        results: dict[int, Reading | str] = {}
        for i, o in zip(order, self._fast.each(order, self._read_fast, timeout=self.read_timeout,
                                               budget=self.budget), strict=True):
            if o.ok:
                results[i] = o.value
            elif o.status == deadline.ERROR:
                results[i] = Reading(ok=False, errors=[o.reason])
            elif o.status == deadline.SKIPPED:
                results[i] = o.reason
            else:  # TIMEOUT, BLOCKED: NVML did not answer in time (the verdict's unanswered time)
                results[i] = NoAnswer(f"NVML: {o.reason}")
        return results

    # --- slow cadence -----------------------------------------------------------------------
    def refresh_slow(self, timeout: float | None = None) -> None:
        """Read the expensive counters of every GPU that is not lost or blocked; wait up to
        `timeout` for them (scrapes start it in the background; tests and benches call it)."""
        s = self._ready()
        if s is None:
            return
        with self._slow_lock:
            self._slow_due = time.monotonic() + self.slow_interval
            blocked = set(self._fast.stuck()) | set(self._slow.stuck())
            todo = [i for i in self.gpus if i not in s.lost and i not in blocked]
            if todo:
                self._slow.each(todo, self._read_slow, timeout=self.budget, budget=timeout)

    def _refresh_in_background(self) -> None:
        if self._closed or not self._slow_lock.acquire(blocking=False):
            return
        try:
            self._slow_due = time.monotonic() + self.slow_interval
        finally:
            self._slow_lock.release()

        def refresh() -> None:
            try:
                self.refresh_slow(timeout=self.slow_interval)
            except Exception:  # noqa: BLE001 - the next scrape tries again; scrapes report failures
                self.log.exception("slow GPU read failed")

        self.pool.submit(refresh)

    # --- the scrape ---------------------------------------------------------------------------
    def collect(self, out: Families) -> NodeGpuHealth:
        """Returns the GPUs' health facts, the verdict's input (also when NVML is unusable)."""
        expected = expected_gpus(self.ctx)
        s = self._ready()
        if s is None:
            err = self.session.error
            raise Failed(err, NodeGpuHealth(expected=expected, nvml_error=err))
        out.add(m.DRIVER_INFO, 1, driver_version=s.driver_version, nvml_version=s.nvml_version,
                cuda_driver_version=s.cuda_driver_version)
        out.add(m.COUNT, len(s.devices))
        if expected is not None:
            out.add(m.EXPECTED, expected)
        health = NodeGpuHealth(count=len(s.devices), expected=expected)
        if self._started and time.monotonic() >= self._slow_due:
            self._refresh_in_background()
        results = self._read_all()
        for spec in (m.INFO, m.LOST, m.READ_SUCCESS):  # first, as when each GPU added its own
            out.declare(spec)
        fixed: tuple[list[Sample], list[Sample], list[Sample]] = ([], [], [])
        for d in s.devices:
            self._emit(out, s, d, results.get(d.index, "not read"), health, fixed)
        out.add_samples(m.INFO, fixed[0])
        out.add_samples(m.LOST, fixed[1])
        out.add_samples(m.READ_SUCCESS, fixed[2])
        return health

    def _fixed(self, g: _Gpu, labels: dict[str, str], d: DeviceIdentity
               ) -> tuple[Sample, tuple[Sample, ...], tuple[Sample, ...]]:
        """gpu_info, gpu_lost 0/1 and gpu_read_success 0/1 of a GPU: the same Samples every
        scrape while its labels and static facts stay the same."""
        st = g.reader.static
        key = (labels, st.model or d.name, st.serial, st.vbios_version, st.board_part_number)
        cached = g.fixed
        if cached is None or cached[0][0] is not labels or cached[0][1:] != key[1:]:
            full = {**labels, "model": str(key[1]), "serial": str(key[2]), "vbios_version": str(key[3]),
                    "board_part_number": str(key[4])}
            info = Sample(m.INFO.name, {k: full[k] for k in m.INFO.labels}, 1.0)
            lost = tuple(Sample(m.LOST.name, {k: labels[k] for k in m.LOST.labels}, v) for v in (0.0, 1.0))
            read = tuple(Sample(m.READ_SUCCESS.name, {k: labels[k] for k in m.READ_SUCCESS.labels}, v)
                         for v in (0.0, 1.0))
            cached = g.fixed = (key, info, lost, read)
        return cached[1], cached[2], cached[3]

    def _emit(self, out: Families, s: NvmlSession, d: DeviceIdentity, r: Reading | str,
              health: NodeGpuHealth, fixed: tuple[list[Sample], list[Sample], list[Sample]]) -> None:
        i = d.index
        g = self.gpus[i]
        if isinstance(r, Reading) and r.lost:
            if i not in s.lost:
                self.log.error("GPU %d (%s, %s) is lost: %s", i, d.pci_bus_id, d.uuid, r.errors[0])
            s.mark_lost(i)
        elif isinstance(r, Reading) and i in s.lost:
            s.clear_lost(i)
            self.log.info("GPU %d answers again", i)
        if isinstance(r, Reading) and not r.lost and not d.uuid:  # unidentified at start
            d = s.refresh_identity(i)
        lost = i in s.lost
        labels = g.reader.labels
        if labels.get("uuid") != d.uuid or labels.get("pci_bus_id") != d.pci_bus_id:
            labels = g.reader.labels = identity_labels(d)
            if isinstance(r, Reading) and r.labels is not labels:  # read before the identity was known
                relabelled = replace(r, labels=labels, groups={}, static=[], label_cache={})
                for spec, value, extra in r.samples:
                    relabelled.add(spec, value, **extra)
                r = relabelled
        info, lost_s, read_s = self._fixed(g, labels, d)
        ok = isinstance(r, Reading) and r.ok and not lost
        fixed[0].append(info)
        fixed[1].append(lost_s[lost])
        fixed[2].append(read_s[ok])
        gh = GpuHealth(index=i, uuid=d.uuid, pci_bus_id=d.pci_bus_id, lost=lost, read_ok=ok)
        health.gpus[i] = gh
        gh.unanswered_s = self._answered(i, r)
        if lost:
            return
        self.problems.report(f"GPU {i}", "; ".join(r.errors) if isinstance(r, Reading) else r)
        if isinstance(r, Reading):
            for spec, samples in r.all_groups():
                out.add_samples(spec, samples)
            if r.activity and r.activity != self._activity.get(i):
                self._activity[i] = r.activity
                self.log.info("GPU %d activity (SM, tensor, DRAM): %s%s", i,
                              REASONS.get(r.activity, r.activity),
                              f" ({r.activity_error})" if r.activity_error else "")
            gh.row_remap_pending, gh.row_remap_failure = r.remap_pending, r.remap_failure
            gh.recovery_action = r.recovery_action
            gh.ecc_uncorrected_volatile = r.ecc_uncorrected_volatile
            gh.ecc_uncorrected_aggregate = r.ecc_uncorrected_aggregate
            if r.fabric is not None:
                gh.fabric_state, gh.fabric_status = r.fabric.state, r.fabric.status
                gh.fabric_problems = tuple(p for p, present in r.fabric.health.items() if present)
        slow = g.slow
        if slow is not None and not slow.lost and slow.labels is labels:
            for spec, samples in slow.all_groups():  # the same Sample objects every scrape
                out.add_samples(spec, samples)


    def _answered(self, i: int, r: Reading | str) -> float | None:
        """Seconds GPU `i` has not answered NVML (its read overran the deadline, this time or an
        earlier one still stuck), None when it answered. Logged once when it starts and ends."""
        if isinstance(r, NoAnswer):
            since = self._unanswered_since.setdefault(i, time.monotonic())
            return time.monotonic() - since
        began = self._unanswered_since.pop(i, None)
        if began is not None and isinstance(r, Reading):
            self.log.info("GPU %d answers NVML again after %.0fs without an answer", i,
                          time.monotonic() - began)
        return None


def identity_labels(d: DeviceIdentity) -> dict[str, str]:
    return {"gpu": str(d.index), "uuid": d.uuid, "pci_bus_id": d.pci_bus_id}


COLLECTOR = GpuCollector
