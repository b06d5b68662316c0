"""Reading one GPU through the NVML backend into the Samples a scrape serves
(no threads: the collector runs the reads).

Three kinds of reads: static values once (identity, thresholds, maximum clocks and link
widths), health-critical values every scrape (one nvmlDeviceGetFieldValues batch plus the
calls that have no field, all a few microseconds each), and expensive counters on a slow
cadence (energy ~3 ms, throttle time ~0.65 ms per reason, PCIe replay ~0.18 ms, NVLink).

Not Supported, Function Not Found and Invalid Argument (a link or sensor the part lacks, a binding
of another signature) are remembered per GPU and the read skipped afterwards
(re-probed every REPROBE_S, since some answers change, e.g. remapped rows under MIG);
GPU is lost propagates as NvmlError so the caller marks the GPU lost; any other NVML error
marks the reading failed and the other reads go on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from exporter.catalog import MetricSpec
from exporter.gpu import metrics as m
from exporter.gpu.fabric import FabricInfo, decode
from exporter.gpu.gpm import GpmReader
from exporter.metric import Sample
from exporter.nvml.backend import (
    FABRIC_INFO,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    NvmlBackend,
    NvmlError,
)

REPROBE_S = 600.0
MAX_NVLINKS = 18  # NVML_NVLINK_MAX_LINKS
_UNSUPPORTED = (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_INVALID_ARGUMENT)

Labels = dict[str, str]

# Health-critical fields read every scrape: field id -> (metric, extra labels, scale).
FAST_FIELDS: dict[int, tuple[MetricSpec, Labels, float]] = {
    3: (m.ECC_ERRORS, {"error_type": "corrected", "counter": "volatile"}, 1),  # ECC_SBE_VOL_TOTAL
    4: (m.ECC_ERRORS, {"error_type": "uncorrected", "counter": "volatile"}, 1),  # ECC_DBE_VOL_TOTAL
    5: (m.ECC_ERRORS, {"error_type": "corrected", "counter": "aggregate"}, 1),  # ECC_SBE_AGG_TOTAL
    6: (m.ECC_ERRORS, {"error_type": "uncorrected", "counter": "aggregate"}, 1),  # ECC_DBE_AGG_TOTAL
    82: (m.TEMPERATURE, {"sensor": "memory"}, 1),  # MEMORY_TEMP
    142: (m.REMAPPED_ROWS, {"cause": "correctable"}, 1),  # REMAPPED_COR
    143: (m.REMAPPED_ROWS, {"cause": "uncorrectable"}, 1),  # REMAPPED_UNC
    144: (m.REMAP_PENDING, {}, 1),  # REMAPPED_PENDING
    145: (m.REMAP_FAILURE, {}, 1),  # REMAPPED_FAILURE
    230: (m.RECOVERY_ACTION, {}, 1),  # GET_GPU_RECOVERY_ACTION
    29: (m.RETIRED_PAGES, {"cause": "single_bit"}, 1),  # RETIRED_SBE (pre-Ampere)
    30: (m.RETIRED_PAGES, {"cause": "double_bit"}, 1),  # RETIRED_DBE
    31: (m.RETIRED_PENDING, {}, 1),  # RETIRED_PENDING
}

# Expensive counters read on the slow cadence.
NS = 1e-9
SLOW_FIELDS: dict[int, tuple[MetricSpec, Labels, float]] = {
    83: (m.ENERGY, {}, 1e-3),  # TOTAL_ENERGY_CONSUMPTION, mJ
    94: (m.PCIE_REPLAYS, {}, 1),  # PCIE_REPLAY_COUNTER
    74: (m.THROTTLE, {"reason": "sw_power_cap"}, NS),  # PERF_POLICY_POWER / CLOCKS_EVENT_REASON_SW_POWER_CAP
    75: (m.THROTTLE, {"reason": "thermal"}, NS),  # PERF_POLICY_THERMAL
    76: (m.THROTTLE, {"reason": "sync_boost"}, NS),  # PERF_POLICY_SYNC_BOOST
    269: (m.THROTTLE, {"reason": "sw_thermal"}, NS),  # CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN
    270: (m.THROTTLE, {"reason": "hw_thermal"}, NS),  # CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN
    271: (m.THROTTLE, {"reason": "hw_power_brake"}, NS),  # CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN
    169: (m.PCIE_ERRORS, {"type": "l0_to_recovery"}, 1),
    173: (m.PCIE_ERRORS, {"type": "correctable"}, 1),
    174: (m.PCIE_ERRORS, {"type": "naks_received"}, 1),
    175: (m.PCIE_ERRORS, {"type": "receiver_error"}, 1),
    176: (m.PCIE_ERRORS, {"type": "bad_tlp"}, 1),
    177: (m.PCIE_ERRORS, {"type": "naks_sent"}, 1),
    178: (m.PCIE_ERRORS, {"type": "bad_dllp"}, 1),
    179: (m.PCIE_ERRORS, {"type": "non_fatal"}, 1),
    180: (m.PCIE_ERRORS, {"type": "fatal"}, 1),
    181: (m.PCIE_ERRORS, {"type": "unsupported_request"}, 1),
    182: (m.PCIE_ERRORS, {"type": "lcrc"}, 1),
    183: (m.PCIE_ERRORS, {"type": "lane"}, 1),
}

# nvmlClocksEventReason* bits -> reason label
CLOCK_REASONS = {0x1: "idle", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
                 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake"}
THRESHOLDS = {0: "shutdown", 1: "slowdown", 2: "memory_max", 3: "gpu_max"}
NVLINK_COUNTERS = {0: "replay", 1: "recovery", 2: "crc_flit", 3: "crc_data"}  # nvmlNvLinkErrorCounter_t

# gpu.detail: opt-in series beyond the default (what rules, dashboards, runbooks and the verdict
# use). Each names what it adds; a value not selected is not read either, where it has its own call.
DETAIL = {
    "nvlink_per_link": "gpu_nvlink_up and gpu_nvlink_errors_total per link (default: per GPU, link=\"all\")",
    "pcie_errors": "gpu_pcie_errors_total by type (12 per GPU)",
    "throttle_time": "gpu_throttle_seconds_total by reason",
    "limits": "the shutdown and gpu_max temperature thresholds and gpu_clock_max_hertz (static; slowdown "
              "and memory_max, which the node dashboard draws, are default)",
    "routine_clock_events": "gpu_clock_event_active for idle, sync_boost and sw_power_cap (normal under "
                            "load; the thermal, slowdown and power-brake reasons are default)",
    "activity_pipes": "gpu_pipe_active_seconds_total for the FP64, FP32 and FP16 pipes (3 per GPU with GPM)",
    "activity_traffic": "gpu_nvlink_bytes_total and gpu_pcie_bytes_total by direction from GPM (4 per GPU "
                        "with GPM; throughput, not health)",
}
ROUTINE_CLOCK_REASONS = 0x1 | 0x4 | 0x10  # idle, sw_power_cap, sync_boost
DEFAULT_THRESHOLDS = ("slowdown", "memory_max")


def check_detail(v: object) -> str | None:
    """gpu.detail: all, or a list of DETAIL names."""
    if v == "all" or (isinstance(v, list) and all(d in DETAIL for d in v)):
        return None
    return "all, or a list of: " + ", ".join(DETAIL)


DETAIL_METRICS = {"pcie_errors": m.PCIE_ERRORS, "throttle_time": m.THROTTLE}


@dataclass
class Reading:
    """The samples of one read of one GPU and how it went. Samples are built as the
    Samples the scrape serves (with the GPU's `labels`), grouped by metric, so
    serving them costs nothing per sample."""

    labels: Labels = field(default_factory=dict)
    groups: dict[str, tuple[MetricSpec, list[Sample]]] = field(default_factory=dict)
    static: list[tuple[MetricSpec, list[Sample]]] = field(default_factory=list)  # shared, read once
    ok: bool = True
    lost: bool = False
    errors: list[str] = field(default_factory=list)
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    recovery_action: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    fabric: FabricInfo | None = None  # None: not read or not supported
    activity: str = ""  # GPM: "measured" or why not (exporter.gpu.gpm.REASONS); "" not read
    activity_error: str = ""  # the NVML error behind it, if any
    # label dicts with extra labels, by (metric, extra values): shared by the GPU's readings while
    # its labels stay the same, so a scrape builds none
    label_cache: dict[tuple[str, ...], Labels] = field(default_factory=dict)

    def add(self, spec: MetricSpec, value: float | None, **extra: str) -> None:
        if value is None:
            return
        group = self.groups.get(spec.name)
        if group is None:
            group = self.groups[spec.name] = (spec, [])
        labels = self.labels
        if extra:
            key = (spec.name, *extra.values())
            cached = self.label_cache.get(key)
            if cached is None:
                cached = self.label_cache[key] = {**self.labels, **extra}
            labels = cached
        group[1].append(Sample(spec.name, labels, float(value)))

    def all_groups(self) -> list[tuple[MetricSpec, list[Sample]]]:
        return [*self.groups.values(), *self.static]

    @property
    def samples(self) -> list[tuple[MetricSpec, float, Labels]]:
        """(metric, value, labels other than the GPU's) of every sample; for tests and tools."""
        return [(spec, s.value, {k: v for k, v in s.labels.items() if k not in self.labels})
                for spec, lst in self.all_groups() for s in lst]

    def fail(self, why: str) -> None:
        self.ok = False
        self.errors.append(why)


@dataclass
class Static:
    model: str = ""
    serial: str = ""
    vbios_version: str = ""
    board_part_number: str = ""
    thresholds: dict[str, int] = field(default_factory=dict)
    clock_max_mhz: dict[str, int] = field(default_factory=dict)
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    supported_reasons: int = 0
    nvlinks: list[int] = field(default_factory=list)
    complete: bool = False


class GpuReader:
    """Reads GPU `index`. Not thread-safe: the collector runs one read of a GPU at a time."""

    def __init__(self, backend: NvmlBackend, index: int, nvlink: bool = True,
                 detail: frozenset[str] = frozenset()) -> None:
        """`detail`: the gpu.detail extras (DETAIL) to read and export."""
        self.backend = backend
        self.index = index
        self.nvlink = nvlink
        self.nvlink_per_link = "nvlink_per_link" in detail
        self.limits = "limits" in detail
        self.clock_reasons = {bit: name for bit, name in CLOCK_REASONS.items()
                              if "routine_clock_events" in detail or not bit & ROUTINE_CLOCK_REASONS}
        left_out = {DETAIL_METRICS[d].name for d in DETAIL_METRICS if d not in detail}
        self.slow_fields = {f: v for f, v in SLOW_FIELDS.items() if v[0].name not in left_out}
        self.static = Static()
        self.labels: Labels = {}  # the GPU's labels, set by the collector
        self._label_cache: tuple[Labels, dict[tuple[str, ...], Labels]] = ({}, {})  # (for labels, cache)
        self._static_groups: tuple[Static, Labels, list[tuple[MetricSpec, list[Sample]]]] | None = None
        self.unsupported: set[Any] = set()
        self._probed = time.monotonic()
        self.gpm = GpmReader(backend, index, detail)

    # --- plumbing -------------------------------------------------------------------------
    def _cache(self) -> dict[tuple[str, ...], Labels]:
        if self._label_cache[0] is not self.labels:
            self._label_cache = (self.labels, {})
        return self._label_cache[1]

    def _call(self, r: Reading, fn: str, *args: int) -> Any:
        key = (fn, args)
        if key in self.unsupported:
            return None
        try:
            return self.backend.call(self.index, fn, *args)
        except NvmlError as e:
            if e.gpu_lost:
                raise
            if e.code in _UNSUPPORTED:
                self.unsupported.add(key)
            else:
                r.fail(f"{fn}{list(args) if args else ''}: {e}")
            return None

    def _fields(self, r: Reading, table: dict[int, tuple[MetricSpec, Labels, float]]) -> dict[int, Any]:
        ids = [f for f in table if f not in self.unsupported]
        if not ids:
            return {}
        try:
            values = self.backend.field_values(self.index, ids)
        except NvmlError as e:
            if e.gpu_lost:
                raise
            if e.code in _UNSUPPORTED:  # no field API at all (very old driver)
                self.unsupported.update(ids)
            else:
                r.fail(f"nvmlDeviceGetFieldValues: {e}")
            return {}
        out = {}
        for fv in values:
            if fv.ret == 0:
                out[fv.field_id] = fv.value
                spec, labels, scale = table[fv.field_id]
                if fv.value is not None:
                    r.add(spec, fv.value * scale, **labels)
            elif fv.ret == NVML_ERROR_GPU_IS_LOST:
                raise NvmlError(NVML_ERROR_GPU_IS_LOST)
            elif fv.ret in _UNSUPPORTED:
                self.unsupported.add(fv.field_id)
            else:
                r.fail(f"field {fv.field_id}: {NvmlError(fv.ret)}")
        return out

    def _maybe_reprobe(self) -> None:
        if time.monotonic() - self._probed > REPROBE_S:
            self.unsupported.clear()
            self._probed = time.monotonic()

    # --- static ---------------------------------------------------------------------------
    def read_static(self) -> None:
        """Identity, thresholds, maximum clocks and links: once (again only if it failed)."""
        r = Reading()
        s = Static()
        s.model = self._call(r, "nvmlDeviceGetName") or ""
        s.serial = self._call(r, "nvmlDeviceGetSerial") or ""
        s.vbios_version = self._call(r, "nvmlDeviceGetVbiosVersion") or ""
        s.board_part_number = self._call(r, "nvmlDeviceGetBoardPartNumber") or ""
        for t, name in THRESHOLDS.items():
            v = self._call(r, "nvmlDeviceGetTemperatureThreshold", t)
            if v is not None:
                s.thresholds[name] = v
        for clk, name in ((1, "sm"), (2, "memory")):
            v = self._call(r, "nvmlDeviceGetMaxClockInfo", clk)
            if v is not None:
                s.clock_max_mhz[name] = v
        s.pcie_gen_max = self._call(r, "nvmlDeviceGetMaxPcieLinkGeneration")
        s.pcie_width_max = self._call(r, "nvmlDeviceGetMaxPcieLinkWidth")
        reasons = self._call(r, "nvmlDeviceGetSupportedClocksEventReasons")
        s.supported_reasons = reasons if reasons is not None else sum(CLOCK_REASONS)
        if self.nvlink:
            for link in range(MAX_NVLINKS):
                if self._call(r, "nvmlDeviceGetNvLinkState", link) is not None:
                    s.nvlinks.append(link)
        s.complete = r.ok
        self.static = s

    def _ensure_static(self) -> None:
        if not self.static.complete:
            self.read_static()

    def static_groups(self) -> list[tuple[MetricSpec, list[Sample]]]:
        """The samples of the static values, built once (again when identity labels change)."""
        cached = self._static_groups
        if cached is not None and cached[0] is self.static and cached[1] is self.labels:
            return cached[2]
        r = Reading(labels=self.labels, label_cache=self._cache())
        s = self.static
        for name, v in s.thresholds.items():
            if self.limits or name in DEFAULT_THRESHOLDS:
                r.add(m.THRESHOLD, v, threshold=name)
        if self.limits:
            for name, v in s.clock_max_mhz.items():
                r.add(m.CLOCK_MAX, v * 1e6, clock=name)
        r.add(m.PCIE_GEN_MAX, s.pcie_gen_max)
        r.add(m.PCIE_WIDTH_MAX, s.pcie_width_max)
        groups = list(r.groups.values())
        self._static_groups = (self.static, self.labels, groups)
        return groups

    # --- every scrape ---------------------------------------------------------------------
    def read_fast(self) -> Reading:
        """The health-critical values and the GPU's activity; raises NvmlError(GPU_IS_LOST) when
        the GPU is lost."""
        try:
            return self._read_fast()
        except NvmlError:
            self.gpm.counters.forget()  # lost before its sample: the next interval starts anew
            raise

    def _read_fast(self) -> Reading:
        self._ensure_static()
        self._maybe_reprobe()
        r = Reading(labels=self.labels, label_cache=self._cache())
        fv = self._fields(r, FAST_FIELDS)
        if 144 in fv:
            r.remap_pending = bool(fv[144])
        if 145 in fv:
            r.remap_failure = bool(fv[145])
        if 230 in fv:
            r.recovery_action = int(fv[230])
        if 4 in fv:
            r.ecc_uncorrected_volatile = int(fv[4])
        if 6 in fv:
            r.ecc_uncorrected_aggregate = int(fv[6])
        temp = self._call(r, "nvmlDeviceGetTemperature", 0)
        r.add(m.TEMPERATURE, temp, sensor="gpu")
        slowdown = self.static.thresholds.get("slowdown")
        if temp is not None and slowdown is not None:
            r.add(m.SLOWDOWN_MARGIN, slowdown - temp)
        reasons = self._call(r, "nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is not None:
            for bit, name in self.clock_reasons.items():
                if self.static.supported_reasons & bit:
                    r.add(m.CLOCK_EVENT, 1 if reasons & bit else 0, reason=name)
        power = self._call(r, "nvmlDeviceGetPowerUsage")
        r.add(m.POWER, None if power is None else power / 1000)
        limit = self._call(r, "nvmlDeviceGetEnforcedPowerLimit")
        r.add(m.POWER_LIMIT, None if limit is None else limit / 1000)
        util = self._call(r, "nvmlDeviceGetUtilizationRates")
        if util:
            for k in ("gpu", "memory"):
                v = util.get(k)
                r.add(m.UTILIZATION, None if v is None else v / 100, resource=k)
        mem = self._call(r, "nvmlDeviceGetMemoryInfo")
        if mem:
            r.add(m.MEMORY_USED, mem.get("used"))
            r.add(m.MEMORY_TOTAL, mem.get("total"))
        for clk, name in ((1, "sm"), (2, "memory")):
            v = self._call(r, "nvmlDeviceGetClockInfo", clk)
            r.add(m.CLOCK, None if v is None else v * 1e6, clock=name)
        r.add(m.PSTATE, self._call(r, "nvmlDeviceGetPerformanceState"))
        hist = self._call(r, "nvmlDeviceGetRowRemapperHistogram")
        if hist:
            for k in ("max", "high", "partial", "low", "none"):
                r.add(m.REMAPPER_BANKS, hist.get(k), spare_rows=k)
        r.add(m.PCIE_GEN, self._call(r, "nvmlDeviceGetCurrPcieLinkGeneration"))
        r.add(m.PCIE_WIDTH, self._call(r, "nvmlDeviceGetCurrPcieLinkWidth"))
        self._read_fabric(r)
        self.gpm.read(r)
        r.static = self.static_groups()
        return r

    def _read_fabric(self, r: Reading) -> None:
        """Fabric registration: absent when Not Supported (no call, or state 0)."""
        raw = self._call(r, FABRIC_INFO)
        if not isinstance(raw, dict):
            return
        f = decode(raw)
        if not f.supported:
            return
        r.fabric = f
        r.add(m.FABRIC_STATE, 1, state=f.state)  # the current state only: 8 series on a p5, not 24
        r.add(m.FABRIC_STATUS, f.status)
        if f.clique_id or f.cluster_uuid:  # multi-node NVLink only; all zero on Hopper says nothing
            r.add(m.FABRIC_INFO, 1, clique_id=str(f.clique_id), cluster_uuid=f.cluster_uuid)
        for problem, present in f.health.items():
            r.add(m.FABRIC_HEALTH, 1 if present else 0, problem=problem)

    # --- slow cadence ---------------------------------------------------------------------
    def read_slow(self) -> Reading:
        """Energy, throttle time, PCIe replays and errors, ECC mode, NVLink."""
        self._ensure_static()  # the links to read
        r = Reading(labels=self.labels, label_cache=self._cache())
        self._fields(r, self.slow_fields)
        ecc = self._call(r, "nvmlDeviceGetEccMode")
        if ecc:
            r.add(m.ECC_MODE, 1 if ecc[0] else 0)
        totals: dict[str, int] = {}
        states: list[int] = []
        for link in self.static.nvlinks:
            state = self._call(r, "nvmlDeviceGetNvLinkState", link)
            up = None if state is None else (1 if state else 0)
            for c, name in NVLINK_COUNTERS.items():
                v = self._call(r, "nvmlDeviceGetNvLinkErrorCounter", link, c)
                if self.nvlink_per_link:
                    r.add(m.NVLINK_ERRORS, v, link=str(link), type=name)
                elif v is not None:
                    totals[name] = totals.get(name, 0) + v
            if self.nvlink_per_link:
                r.add(m.NVLINK_UP, up, link=str(link))
            elif up is not None:
                states.append(up)
        if states:
            r.add(m.NVLINK_UP, min(states), link="all")
        for name, v in totals.items():
            r.add(m.NVLINK_ERRORS, v, link="all", type=name)
        return r
