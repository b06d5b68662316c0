"""The NVML backend interface.

Collectors never import pynvml. They talk to an `NvmlBackend`, whose values are plain Python
(ints, floats, strings, lists, dicts), exactly what `gpu-health-exporter capture` records:
pynvml structs become dicts of their fields, tuples become lists, bytes become str. The real
backend (pynvml_backend) converts; the fake (fake) replays a capture. Both raise `NvmlError`
with NVML's own return codes, so collectors handle Not Supported, GPU is lost and timeouts the
same way whichever backend runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# NVML return codes (nvml.h nvmlReturn_t) that the exporter treats specially.
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_IN_USE = 19  # GPM: the counters are held by another client (DCGM profiling, Nsight)
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_UNKNOWN = 999

ERROR_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_IRQ_ISSUE: "Interrupt request issue",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    NVML_ERROR_IN_USE: "In use by another client",
    NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient resources",
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


# NVML event types (nvml.h nvmlEventType*) the exporter registers for. Never the clock-change
# event (0x10): it fires every ~100 ms on an idle GPU.
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID = 0x8  # XID critical error; Event.data is the XID
EVENT_GPU_UNAVAILABLE = 0x4000
EVENT_RECOVERY_ACTION = 0x8000


# GPU fabric state: call(index, FABRIC_INFO) answers a dict {api (v3, v2 or v1), state, status,
# cliqueId, clusterUuid (hex), healthMask, healthSummary} the way the capture records it. The
# real backend picks the versioned struct (nvmlDeviceGetGpuFabricInfoV needs one allocated by
# the caller); the fake replays the capture's entry of that name. NOT_SUPPORTED where the GPU
# has no fabric support; SUCCESS with state 0 is the same answer on drivers that say so.
FABRIC_INFO = "nvmlDeviceGetGpuFabricInfoV"


# GPU Performance Monitoring (GPM, Hopper and newer): nvmlGpmMetricId_t values the exporter reads.
# Ratios are percent (0-100) over the interval between two samples, traffic MiB/s.
GPM_SM_UTIL = 2
GPM_SM_OCCUPANCY = 3
GPM_ANY_TENSOR_UTIL = 5
GPM_DRAM_BW_UTIL = 10
GPM_FP64_UTIL = 11
GPM_FP32_UTIL = 12
GPM_FP16_UTIL = 13
GPM_PCIE_TX_PER_SEC = 20
GPM_PCIE_RX_PER_SEC = 21
GPM_NVLINK_TOTAL_RX_PER_SEC = 60
GPM_NVLINK_TOTAL_TX_PER_SEC = 61


class NvmlError(Exception):
    """An NVML call failed with return code `code` (nvml.h)."""

    def __init__(self, code: int, message: str | None = None) -> None:
        self.code = code
        super().__init__(message or ERROR_STRINGS.get(code, f"NVML error {code}"))

    @property
    def not_supported(self) -> bool:
        return self.code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND)

    @property
    def gpu_lost(self) -> bool:
        return self.code == NVML_ERROR_GPU_IS_LOST


@dataclass(frozen=True)
class FieldValue:
    """One result of nvmlDeviceGetFieldValues: `ret` is the per-field NVML return code."""

    field_id: int
    ret: int
    value: int | float | None


@dataclass(frozen=True)
class GpmValue:
    """One metric of nvmlGpmMetricsGet: `ret` is the per-metric NVML return code."""

    metric_id: int
    ret: int
    value: float | None


@dataclass(frozen=True)
class Event:
    """One NVML event (nvmlEventData_t): `data` is the XID for XID critical errors."""

    index: int  # GPU index as the backend enumerates them
    uuid: str
    event_type: int
    data: int
    gpu_instance_id: int = 0xFFFFFFFF
    compute_instance_id: int = 0xFFFFFFFF


class NvmlBackend(ABC):
    """What the exporter needs from NVML. Devices are addressed by index."""

    @abstractmethod
    def init(self) -> None:
        """nvmlInit; raises NvmlError (LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED, ...)."""

    @abstractmethod
    def shutdown(self) -> None: ...

    @abstractmethod
    def system(self, fn: str) -> Any:
        """A system-level call by its NVML name, e.g. system("nvmlSystemGetDriverVersion")."""

    @abstractmethod
    def device_count(self) -> int: ...

    @abstractmethod
    def call(self, index: int, fn: str, *args: int) -> Any:
        """A device call by its NVML name: call(0, "nvmlDeviceGetTotalEccErrors", 0, 1)."""

    @abstractmethod
    def field_values(self, index: int, field_ids: Sequence[int]) -> list[FieldValue]:
        """One nvmlDeviceGetFieldValues batch; per-field failures are in FieldValue.ret."""

    # Events (nvmlEventSet*). The event set is opaque to callers.
    @abstractmethod
    def event_set_create(self) -> Any: ...

    @abstractmethod
    def register_events(self, index: int, event_types: int, event_set: Any) -> None: ...

    @abstractmethod
    def event_wait(self, event_set: Any, timeout_ms: int) -> Event:
        """Wait for the next event; raises NvmlError(TIMEOUT) when none came in time."""

    @abstractmethod
    def event_set_free(self, event_set: Any) -> None: ...

    # GPU Performance Monitoring (nvmlGpm*). Samples are opaque to callers. Backends without GPM
    # answer Function Not Found, as a driver without the symbols does.
    def gpm_query_device_support(self, index: int) -> bool:
        """nvmlGpmQueryDeviceSupport: whether GPU `index` has GPM (isSupportedDevice)."""
        raise NvmlError(NVML_ERROR_FUNCTION_NOT_FOUND, "nvmlGpmQueryDeviceSupport")

    def gpm_sample_alloc(self) -> Any:
        raise NvmlError(NVML_ERROR_FUNCTION_NOT_FOUND, "nvmlGpmSampleAlloc")

    def gpm_sample_get(self, index: int, sample: Any) -> float:
        """nvmlGpmSampleGet into `sample`; returns when it was taken (seconds, on a monotonic
        clock of this backend's own: intervals are differences of these)."""
        raise NvmlError(NVML_ERROR_FUNCTION_NOT_FOUND, "nvmlGpmSampleGet")

    def gpm_metrics_get(self, sample1: Any, sample2: Any, metric_ids: Sequence[int]) -> list[GpmValue]:
        """nvmlGpmMetricsGet over the interval from `sample1` to `sample2`; per-metric failures
        are in GpmValue.ret."""
        raise NvmlError(NVML_ERROR_FUNCTION_NOT_FOUND, "nvmlGpmMetricsGet")

    def gpm_sample_free(self, sample: Any) -> None:
        """nvmlGpmSampleFree."""

    def mig_device_uuids(self, index: int) -> list[str]:
        """The UUIDs (MIG-...) of GPU `index`'s MIG devices, [] when MIG is off (the workload
        source matches the kubelet's MIG device ids to their GPU with them). A backend that
        cannot enumerate MIG devices raises FUNCTION_NOT_FOUND."""
        raise NvmlError(NVML_ERROR_FUNCTION_NOT_FOUND, "MIG devices cannot be listed by this backend")
