"""GPU activity from NVML's GPU Performance Monitoring (GPM), for one GPU: whether it can be
measured, one sample per collection, and the counters of exporter.gpu.activity.

GPM exists on Hopper and newer (H100, H200, B200) with driver 525.60.13 or newer; not on A100.
Whether a GPU is measured, and why not, is a bounded reason (REASONS). A GPU that cannot be
measured is asked again every REPROBE_S (MIG mode changes with a GPU reset, a driver update with a
restart); counters held by a profiler are tried again at every collection, since the profiler
may stop at any time. Two samples are allocated once per GPU and alternate: the newer one of an
interval is the older one of the next.
"""

from __future__ import annotations

import time
from typing import Any

from exporter.gpu import metrics as m
from exporter.gpu.activity import ActivityCounters
from exporter.nvml import backend as nv
from exporter.nvml.backend import NvmlBackend, NvmlError

REPROBE_S = 600.0
MEASURED = "measured"
SAMPLE_FAILED = "sample_failed"
# reason -> what it means (the log line); the gauge's `reason` label takes only these values.
REASONS = {
    MEASURED: "measured",
    "gpu_not_supported": "not measured: the GPU has no GPM (NVML GPU Performance Monitoring needs Hopper "
                         "or newer; A100 has none)",
    "driver_too_old": "not measured: the NVIDIA driver or nvidia-ml-py has no GPM functions (driver "
                      "525.60.13 or newer)",
    "mig_mode": "not measured: MIG mode is enabled (GPM of the whole GPU is not read in MIG mode)",
    "counters_in_use": "not measured: the performance counters are held by another client (DCGM's "
                       "profiling module, Nsight); measured again once it lets go",
    "no_permission": "not measured: NVML refused GPM (insufficient permissions)",
    SAMPLE_FAILED: "sample failed (the next successful sample covers the interval)",
}
EXPORTED = (MEASURED, SAMPLE_FAILED)  # reasons under which the counters are served

# (GPM metric id, metric, extra labels, gpu.detail that adds it or None: default)
ACTIVITY_METRICS: tuple[tuple[int, Any, dict[str, str], str | None], ...] = (
    (nv.GPM_SM_UTIL, m.SM_ACTIVE, {}, None),
    (nv.GPM_SM_OCCUPANCY, m.SM_OCCUPANCY, {}, None),
    (nv.GPM_ANY_TENSOR_UTIL, m.TENSOR_ACTIVE, {}, None),
    (nv.GPM_DRAM_BW_UTIL, m.DRAM_ACTIVE, {}, None),
    (nv.GPM_FP64_UTIL, m.PIPE_ACTIVE, {"pipe": "fp64"}, "activity_pipes"),
    (nv.GPM_FP32_UTIL, m.PIPE_ACTIVE, {"pipe": "fp32"}, "activity_pipes"),
    (nv.GPM_FP16_UTIL, m.PIPE_ACTIVE, {"pipe": "fp16"}, "activity_pipes"),
)
TRAFFIC_METRICS: tuple[tuple[int, Any, dict[str, str], str | None], ...] = (
    (nv.GPM_NVLINK_TOTAL_TX_PER_SEC, m.NVLINK_BYTES, {"direction": "tx"}, "activity_traffic"),
    (nv.GPM_NVLINK_TOTAL_RX_PER_SEC, m.NVLINK_BYTES, {"direction": "rx"}, "activity_traffic"),
    (nv.GPM_PCIE_TX_PER_SEC, m.PCIE_BYTES, {"direction": "tx"}, "activity_traffic"),
    (nv.GPM_PCIE_RX_PER_SEC, m.PCIE_BYTES, {"direction": "rx"}, "activity_traffic"),
)

_UNSUPPORTED = {nv.NVML_ERROR_NOT_SUPPORTED: "gpu_not_supported",
                nv.NVML_ERROR_FUNCTION_NOT_FOUND: "driver_too_old",
                nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "driver_too_old",
                nv.NVML_ERROR_NO_PERMISSION: "no_permission"}
_IN_USE = (nv.NVML_ERROR_IN_USE, nv.NVML_ERROR_INSUFFICIENT_RESOURCES)


class GpmReader:
    """GPU `index`'s activity. Not thread-safe: its GpuReader runs one read at a time."""

    def __init__(self, backend: NvmlBackend, index: int, detail: frozenset[str] = frozenset(),
                 clock: Any = time.monotonic) -> None:
        self.backend = backend
        self.index = index
        self.clock = clock  # when to probe again; intervals use the backend's sample times
        chosen = [t for t in (*ACTIVITY_METRICS, *TRAFFIC_METRICS) if t[3] is None or t[3] in detail]
        self.metrics = tuple((mid, spec, labels) for mid, spec, labels, _ in chosen)
        self.ids = [mid for mid, _, _ in self.metrics]
        ratio_ids = {t[0] for t in ACTIVITY_METRICS}
        self.counters = ActivityCounters([i for i in self.ids if i in ratio_ids],
                                         [i for i in self.ids if i not in ratio_ids])
        self.reason = ""  # "" until probed
        self.error = ""  # the NVML error behind the reason, when there was one
        self._probe_due = 0.0
        self._samples: list[Any] = []  # [older, newer] once allocated

    # --- whether GPM works on this GPU ------------------------------------------------------
    def _probe(self) -> str:
        """The reason GPM cannot be used on this GPU, or MEASURED; allocates the samples."""
        self._probe_due = self.clock() + REPROBE_S
        self.error = ""
        try:
            if not self.backend.gpm_query_device_support(self.index):
                return "gpu_not_supported"
            mig = self._mig_mode()
            if mig:
                return "mig_mode"
            if not self._samples:
                self._samples = [self.backend.gpm_sample_alloc(), self.backend.gpm_sample_alloc()]
        except NvmlError as e:
            if e.gpu_lost:
                raise
            self.error = str(e)
            return _UNSUPPORTED.get(e.code, SAMPLE_FAILED)
        return MEASURED

    def _mig_mode(self) -> bool:
        try:
            mode = self.backend.call(self.index, "nvmlDeviceGetMigMode")
        except NvmlError as e:
            if e.gpu_lost:
                raise
            return False  # no MIG on this GPU (Not Supported) or unreadable: sample and see
        return bool(mode and mode[0])

    # --- one collection -----------------------------------------------------------------------
    def read(self, r: Any) -> None:
        """Sample the GPU and add its counters and gpu_activity_measured to Reading `r`; raises
        NvmlError(GPU_IS_LOST) when the GPU is lost (the caller then calls counters.forget())."""
        self._read()
        r.activity = self.reason
        r.activity_error = self.error
        if self.reason in EXPORTED:
            totals = self.counters.totals
            for mid, spec, labels in self.metrics:
                r.add(spec, totals[mid], **labels)
        r.add(m.ACTIVITY_MEASURED, 1 if self.reason == MEASURED else 0, reason=self.reason)

    def _read(self) -> None:
        if not self._samples or self.reason not in (MEASURED, SAMPLE_FAILED, "counters_in_use"):
            if self.reason not in ("", SAMPLE_FAILED) and self.clock() < self._probe_due:
                return
            self.reason = self._probe()
            if self.reason != MEASURED:
                self.counters.forget()
                return
        older, newer = self._samples
        try:
            t = self.backend.gpm_sample_get(self.index, newer)
            if self.counters.baseline is not None:
                values = self.backend.gpm_metrics_get(older, newer, self.ids)
                self.counters.add(t, {v.metric_id: v.value for v in values if v.ret == 0})
            else:
                self.counters.start(t)
        except NvmlError as e:
            if e.gpu_lost:
                raise
            self.error = str(e)
            if e.code in _IN_USE:
                self.reason = "counters_in_use"
                self.counters.forget()  # the holder may have reprogrammed them
            elif e.code in _UNSUPPORTED:  # e.g. MIG enabled since the probe: ask again why
                why = self._probe()
                self.reason = _UNSUPPORTED[e.code] if why == MEASURED else why
                self.error = self.error or str(e)
                self.counters.forget()
            else:
                self.reason = SAMPLE_FAILED  # the older sample stays the baseline
            return
        self._samples = [newer, older]
        self.reason, self.error = MEASURED, ""
