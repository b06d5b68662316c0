"""The GPU collector: NVML health of every GPU, one sick GPU never hiding the others.

Each GPU is read under its own deadline (gpu.read_timeout_seconds): NVML calls can block for
tens of seconds on a sick GPU and cannot be interrupted, so reads run on worker threads and a
GPU whose read overruns is reported unread (gpu_read_success 0) while the other GPUs are
served; until its stuck call returns it is not read again (one stuck thread per GPU at most).
With gpu.parallel the GPUs are read concurrently, one task each; without it one task reads
them in turn and, when a GPU overruns, a fresh task carries on with the GPUs after it.

Expensive counters (energy, throttle time, PCIe replays and errors, ECC mode, NVLink) are read
by a background thread every gpu.slow_interval_seconds and served from the last reading.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field, replace

from exporter.catalog import Families
from exporter.collector import Collector, Context, Failed, ProblemLog
from exporter.config import Key, declare_check, declare_section, positive
from exporter.gpu import metrics as m
from exporter.gpu.reader import DETAIL, GpuReader, Reading, check_detail
from exporter.health import GpuHealth, NodeGpuHealth
from exporter.node import expected_gpus
from exporter.nvml.backend import NvmlError
from exporter.nvml.session import DeviceIdentity, NvmlSession

declare_section("gpu", "GPU health from NVML (the real library, a capture, or the simulated node).", {
    "enabled": Key(bool, True, "Run the GPU collector."),
    "timeout_seconds": Key(
        (int, float), 4.0,
        "Deadline of the whole GPU collection in one scrape; past it the collector reports failure.",
        check=positive),
    "read_timeout_seconds": Key(
        (int, float), 1.0,
        "How long one scrape waits for one GPU's NVML reads. A GPU that takes longer (a hung GPU) "
        "gets gpu_read_success 0 for that scrape and the other GPUs are served. At most 0.8 x "
        "timeout_seconds (a config error otherwise).",
        check=positive),
    "slow_interval_seconds": Key(
        (int, float), 15.0,
        "How often the expensive counters (energy, throttle time, PCIe replays and errors, ECC mode, "
        "NVLink) are read in the background; scrapes serve the last reading.",
        check=positive),
    "parallel": Key(
        bool, False,
        "Read the GPUs concurrently (one task per GPU) instead of one after another; see "
        "docs/performance.md for why the default is off."),
    "nvlink": Key(bool, True, "Read NVLink link state and error counters (slow cadence)."),
    "detail": Key(
        (str, list), [],
        "Opt-in series beyond the default (which has what the rules, dashboards, runbooks and the "
        "verdict use): a list of " + "; ".join(f"{k}: {v}" for k, v in DETAIL.items())
        + "; or all. nvlink_per_link costs 680 series on a p5 (8 GPUs x 18 links x 5); the link "
        "is named in the XID 74 log line either way.",
        check=check_detail, expected="a list of detail names, or all"),
})


GPU_READ_SHARE = 0.8  # of gpu.timeout_seconds: all GPUs' reads, so the collection ends in time


def _read_within_budget(v: dict) -> str | None:
    if v["read_timeout_seconds"] > v["timeout_seconds"] * GPU_READ_SHARE:
        return (f"key 'gpu.read_timeout_seconds' is {v['read_timeout_seconds']!r}; expected at most "
                f"{GPU_READ_SHARE:g} x gpu.timeout_seconds ({v['timeout_seconds'] * GPU_READ_SHARE:g}), the "
                "share of the collection the GPU reads get")
    return None


declare_check("gpu", _read_within_budget)


@dataclass
class _Gpu:
    """One GPU's reader, the lock its reads hold, and its reads in flight."""

    reader: GpuReader
    lock: threading.Lock = field(default_factory=threading.Lock)
    stuck: Future | None = None  # a read that overran its deadline and may still be in NVML
    slow: Reading | None = None
    slow_future: Future | None = None


@dataclass
class _Chain:
    """Progress of a serial pass: which GPU it is reading since when; `cancelled` stops it."""

    current: int | None = None
    since: float = 0.0
    cancelled: bool = False


class GpuCollector(Collector):
    name = "gpu"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        cfg = ctx.config.gpu
        self.budget = cfg.timeout_seconds * GPU_READ_SHARE
        self.read_timeout = cfg.read_timeout_seconds  # at most the budget (the config checks it)
        self.slow_interval = cfg.slow_interval_seconds
        self.parallel = cfg.parallel
        self.nvlink = cfg.nvlink
        self.detail = frozenset(DETAIL) if cfg.detail == "all" else frozenset(cfg.detail)
        self.session: NvmlSession = ctx.nvml
        self.gpus: dict[int, _Gpu] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._stop = threading.Event()
        self._slow_thread: threading.Thread | None = None
        self.problems = ProblemLog(self.log)
        self._stuck_msg = (f"NVML did not answer within {self.read_timeout:g}s; the GPU is not read again "
                           "until that call returns, the other GPUs are served")

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._slow_thread = threading.Thread(target=self._slow_loop, name="gpu-slow", daemon=True)
        self._slow_thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _ready(self) -> NvmlSession | None:
        """The NVML session when usable, with a reader per GPU; None when NVML is unavailable."""
        s = self.session
        if not s.ensure():
            return None
        if self._pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self.gpus = {d.index: _Gpu(GpuReader(s.backend, d.index, self.nvlink,
                                                                  self.detail)) for d in s.devices}
                    for d in s.devices:
                        self.gpus[d.index].reader.labels = identity_labels(d)
                    # Each GPU can hold one stuck thread at most; the rest do the work.
                    self._pool = ThreadPoolExecutor(max_workers=2 * len(self.gpus) + 2,
                                                    thread_name_prefix="gpu-read")
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

    def _blocked(self, i: int) -> bool:
        g = self.gpus[i]
        if g.stuck is not None and g.stuck.done():
            g.stuck = None
        return g.stuck is not None

    # --- all GPUs, each under its deadline ----------------------------------------------------
    def _read_all(self) -> dict[int, Reading | str]:
        """Each GPU's reading, or why there is none ("blocked ..." for a GPU that overran)."""
        results: dict[int, Reading | str] = {}
        todo = []
        for i in self.gpus:
            if self._blocked(i):
                results[i] = self._stuck_msg
            else:
                todo.append(i)
        assert self._pool is not None
        if self.parallel:
            futs = {i: self._pool.submit(self._read_fast, i) for i in todo}
            wait_futures(futs.values(), timeout=self.read_timeout)
            for i, f in futs.items():
                if f.done():
                    results[i] = f.result()
                else:
                    self.gpus[i].stuck = f
                    results[i] = self._stuck_msg
            return results
        end = time.monotonic() + self.budget
        while todo:
            chain = _Chain()
            out: dict[int, Reading] = {}
            fut = self._pool.submit(self._chain, todo, chain, out)
            while True:
                wait_futures([fut], timeout=self.read_timeout / 4)
                if fut.done():
                    todo = []
                    break
                cur, since = chain.current, chain.since
                now = time.monotonic()
                if cur is not None and (now - since >= self.read_timeout or now >= end):
                    chain.cancelled = True  # it stops after the GPU it is stuck on
                    self.gpus[cur].stuck = fut
                    results[cur] = self._stuck_msg
                    todo = todo[todo.index(cur) + 1:]
                    break
            results.update(out)
            todo = [i for i in todo if i not in out]
            if todo and time.monotonic() >= end:  # several slow GPUs used up the collector's time
                for i in todo:
                    results[i] = "not read: the GPUs before it used up gpu.timeout_seconds"
                break
        return results

    def _chain(self, order: list[int], chain: _Chain, out: dict[int, Reading]) -> None:
        for i in order:
            if chain.cancelled:
                return
            chain.current, chain.since = i, time.monotonic()
            r = self._read_fast(i)
            if chain.cancelled:
                return
            out[i] = r
        chain.current = None

    # --- slow cadence -----------------------------------------------------------------------
    def refresh_slow(self, timeout: float | None = None) -> None:
        """Read the expensive counters of every GPU that is not lost or blocked; wait up to
        `timeout` for them (the background loop and tests call this)."""
        s = self._ready()
        if s is None or self._pool is None:
            return
        futs = []
        for i, g in self.gpus.items():
            if i in s.lost or self._blocked(i) or (g.slow_future is not None and not g.slow_future.done()):
                continue
            g.slow_future = self._pool.submit(self._read_slow, i)
            futs.append(g.slow_future)
        if futs:
            wait_futures(futs, timeout=timeout)

    def _slow_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh_slow(timeout=self.slow_interval)
            except Exception:  # noqa: BLE001 - the loop must survive; the scrape reports failures
                self.log.exception("slow GPU read failed")
            self._stop.wait(self.slow_interval)

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
        results = self._read_all()
        for d in s.devices:
            self._emit(out, s, d, results.get(d.index, "not read"), health)
        return health

    def _emit(self, out: Families, s: NvmlSession, d: DeviceIdentity, r: Reading | str,
              health: NodeGpuHealth) -> None:
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
                relabelled = replace(r, labels=labels, groups={}, static=[])
                for spec, value, extra in r.samples:
                    relabelled.add(spec, value, **extra)
                r = relabelled
        st = g.reader.static
        out.add(m.INFO, 1, **labels, model=st.model or d.name, serial=st.serial,
                vbios_version=st.vbios_version, board_part_number=st.board_part_number)
        out.add(m.LOST, 1 if lost else 0, **labels)
        ok = isinstance(r, Reading) and r.ok and not lost
        out.add(m.READ_SUCCESS, 1 if ok else 0, **labels)
        gh = GpuHealth(index=i, uuid=d.uuid, pci_bus_id=d.pci_bus_id, lost=lost)
        health.gpus[i] = gh
        if lost:
            return
        self.problems.report(f"GPU {i}", "; ".join(r.errors) if isinstance(r, Reading) else r)
        if isinstance(r, Reading):
            for spec, samples in r.all_groups():
                out.add_samples(spec, samples)
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


def identity_labels(d: DeviceIdentity) -> dict[str, str]:
    return {"gpu": str(d.index), "uuid": d.uuid, "pci_bus_id": d.pci_bus_id}


COLLECTOR = GpuCollector
