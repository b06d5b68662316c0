"""The real NVML backend over pynvml (nvidia-ml-py).

pynvml is imported lazily, so the exporter starts (and reports the reason) on hosts without it.
Results are converted to plain Python with the same rules as the capture tool's `plain()`, so the
fake and the real backend hand collectors the same shapes; pynvml.NVMLError becomes NvmlError
with NVML's return code.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Sequence
from typing import Any

from exporter.nvml.backend import (
    FABRIC_INFO,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_UNINITIALIZED,
    NVML_ERROR_UNKNOWN,
    Event,
    FieldValue,
    GpmValue,
    NvmlBackend,
    NvmlError,
)

# nvmlValueType_t -> the union member holding the value (as the capture tool reads it).
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def plain(v: Any) -> Any:
    """pynvml results as plain Python: structs -> dicts of their fields, arrays -> lists,
    bytes -> str (exactly the capture tool's conversion)."""
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, ctypes.Array):
        return [plain(x) for x in v]
    if hasattr(v, "_fields_"):
        d = {}
        for f in v._fields_:
            name = f[0]
            try:
                d[name] = plain(getattr(v, name))
            except Exception as e:  # noqa: BLE001 - unions etc., as the capture records them
                d[name] = repr(e)
        return d
    return repr(v)


class PynvmlBackend(NvmlBackend):
    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}
        self._handle_to_index: dict[int, int] = {}
        self._fns: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _err(self, e: Exception) -> NvmlError:
        code = getattr(e, "value", NVML_ERROR_UNKNOWN)
        return NvmlError(int(code) if isinstance(code, int) else NVML_ERROR_UNKNOWN, str(e))

    def init(self) -> None:
        try:
            import pynvml
        except ImportError as e:
            raise NvmlError(NVML_ERROR_LIBRARY_NOT_FOUND,
                            f"the pynvml module (nvidia-ml-py) is not installed: {e}") from e
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise self._err(e) from e
        except OSError as e:  # a broken libnvidia-ml.so
            raise NvmlError(NVML_ERROR_LIBRARY_NOT_FOUND, f"cannot load libnvidia-ml.so: {e}") from e
        self._nvml = pynvml
        self._handles.clear()
        self._fns.clear()

    def shutdown(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
            self._nvml = None
            self._handles.clear()

    def _n(self) -> Any:
        if self._nvml is None:
            raise NvmlError(NVML_ERROR_UNINITIALIZED)
        return self._nvml

    def _handle(self, index: int) -> Any:
        h = self._handles.get(index)
        if h is None:
            n = self._n()
            with self._lock:
                try:
                    h = n.nvmlDeviceGetHandleByIndex(index)
                except n.NVMLError as e:
                    raise self._err(e) from e
                self._handles[index] = h
                self._handle_to_index[ctypes.cast(h, ctypes.c_void_p).value or 0] = index
        return h

    def system(self, fn: str) -> Any:
        n = self._n()
        f = getattr(n, fn, None)
        if f is None:
            raise NvmlError(NVML_ERROR_FUNCTION_NOT_FOUND, f"{fn} is not in this pynvml")
        try:
            return plain(f())
        except n.NVMLError as e:
            raise self._err(e) from e

    def device_count(self) -> int:
        return int(self.system("nvmlDeviceGetCount"))

    def call(self, index: int, fn: str, *args: int) -> Any:
        n = self._n()
        f = self._fns.get(fn)
        if f is None:
            f = getattr(n, fn, None)
            if f is None:
                raise NvmlError(NVML_ERROR_FUNCTION_NOT_FOUND, f"{fn} is not in this pynvml")
            self._fns[fn] = f
        h = self._handles.get(index) or self._handle(index)
        if fn == FABRIC_INFO:
            return self._fabric_info(n, h)
        try:
            return plain(f(h, *args))
        except n.NVMLError as e:
            raise self._err(e) from e
        except TypeError as e:  # the binding's signature differs (older/newer nvidia-ml-py)
            raise NvmlError(NVML_ERROR_INVALID_ARGUMENT, f"{fn}: {e}") from e

    def _fabric_info(self, n: Any, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetGpuFabricInfoV with the newest struct this binding and driver agree on
        (v3, then v2), else the deprecated v1 call. The binding allocates nothing: the caller
        builds the versioned struct and passes a pointer (a bare struct would go by value)."""
        for cls_name in ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t"):
            cls = getattr(n, cls_name, None)
            if cls is None:
                continue
            info = cls()  # its __init__ sets .version
            try:
                n.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
            except n.NVMLError as e:
                if getattr(e, "value", None) in (NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
                                                 NVML_ERROR_FUNCTION_NOT_FOUND):
                    continue  # an older driver: try the older struct or call
                raise self._err(e) from e
            return _fabric_dict(info, cls_name[len("c_nvmlGpuFabricInfo_"):-2])
        cls = getattr(n, "c_nvmlGpuFabricInfo_t", None)
        if cls is None:
            raise NvmlError(NVML_ERROR_FUNCTION_NOT_FOUND, "no GPU fabric info in this pynvml")
        info = cls()
        try:
            n.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info))
        except n.NVMLError as e:
            raise self._err(e) from e
        return _fabric_dict(info, "v1")

    def field_values(self, index: int, field_ids: Sequence[int]) -> list[FieldValue]:
        n = self._n()
        h = self._handle(index)
        try:
            values = n.nvmlDeviceGetFieldValues(h, list(field_ids))
        except n.NVMLError as e:
            raise self._err(e) from e
        out = []
        get = ctypes.Structure.__getattribute__  # skips pynvml's per-attribute str conversion
        for fid, v in zip(field_ids, values, strict=False):
            ret = int(get(v, "nvmlReturn"))
            value = None
            if ret == 0:
                member = _VALUE_MEMBER.get(int(get(v, "valueType")))
                value = getattr(get(v, "value"), member) if member else None
            out.append(FieldValue(int(fid), ret, value))
        return out

    def event_set_create(self) -> Any:
        n = self._n()
        try:
            return n.nvmlEventSetCreate()
        except n.NVMLError as e:
            raise self._err(e) from e

    def register_events(self, index: int, event_types: int, event_set: Any) -> None:
        n = self._n()
        try:
            n.nvmlDeviceRegisterEvents(self._handle(index), event_types, event_set)
        except n.NVMLError as e:
            raise self._err(e) from e

    def event_wait(self, event_set: Any, timeout_ms: int) -> Event:
        n = self._n()
        try:
            ed = n.nvmlEventSetWait_v2(event_set, timeout_ms)
        except n.NVMLError as e:
            raise self._err(e) from e
        uuid = ""
        try:
            uuid = plain(n.nvmlDeviceGetUUID(ed.device))
        except n.NVMLError:
            pass
        index = self._handle_to_index.get(ctypes.cast(ed.device, ctypes.c_void_p).value or 0, -1)
        if index < 0 and uuid:
            for i, h in list(self._handles.items()):
                try:
                    if plain(n.nvmlDeviceGetUUID(h)) == uuid:
                        index = i
                        break
                except n.NVMLError:
                    continue
        return Event(index=index, uuid=uuid, event_type=int(ed.eventType), data=int(ed.eventData),
                     gpu_instance_id=int(ed.gpuInstanceId), compute_instance_id=int(ed.computeInstanceId))

    def event_set_free(self, event_set: Any) -> None:
        n = self._n()
        try:
            n.nvmlEventSetFree(event_set)
        except n.NVMLError as e:
            raise self._err(e) from e

    def mig_device_uuids(self, index: int) -> list[str]:
        n = self._n()
        h = self._handle(index)
        try:
            current, _pending = n.nvmlDeviceGetMigMode(h)
            if current != 1:  # NVML_DEVICE_MIG_ENABLE
                return []
            out = []
            for i in range(int(n.nvmlDeviceGetMaxMigDeviceCount(h))):
                try:
                    mig = n.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
                except n.NVMLError as e:
                    if getattr(e, "value", None) == NVML_ERROR_NOT_FOUND:
                        continue  # no instance in this slot
                    raise
                out.append(plain(n.nvmlDeviceGetUUID(mig)))
            return out
        except n.NVMLError as e:
            err = self._err(e)
            if err.not_supported:
                return []  # not a MIG-capable GPU
            raise err from e


    # --- GPM --------------------------------------------------------------------------------
    def _gpm(self, fn: str) -> Any:
        """A GPM function of the binding; Function Not Found where the binding predates GPM (a
        driver that predates it answers the same from the library)."""
        f = getattr(self._n(), fn, None)
        if f is None:
            raise NvmlError(NVML_ERROR_FUNCTION_NOT_FOUND, f"{fn} is not in this pynvml")
        return f

    def gpm_query_device_support(self, index: int) -> bool:
        n, f = self._n(), self._gpm("nvmlGpmQueryDeviceSupport")
        try:
            return bool(f(self._handle(index)).isSupportedDevice)
        except n.NVMLError as e:
            raise self._err(e) from e

    def gpm_sample_alloc(self) -> Any:
        n, f = self._n(), self._gpm("nvmlGpmSampleAlloc")
        try:
            return f()
        except n.NVMLError as e:
            raise self._err(e) from e

    def gpm_sample_get(self, index: int, sample: Any) -> float:
        n, f = self._n(), self._gpm("nvmlGpmSampleGet")
        h = self._handles.get(index) or self._handle(index)
        try:
            f(h, sample)
        except n.NVMLError as e:
            raise self._err(e) from e
        return time.monotonic()

    def gpm_metrics_get(self, sample1: Any, sample2: Any, metric_ids: Sequence[int]) -> list[GpmValue]:
        n, f = self._n(), self._gpm("nvmlGpmMetricsGet")
        req = n.c_nvmlGpmMetricsGet_t()
        req.version = n.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(metric_ids)
        req.sample1, req.sample2 = sample1, sample2
        for i, mid in enumerate(metric_ids):
            req.metrics[i].metricId = mid
        try:
            f(req)
        except n.NVMLError as e:
            raise self._err(e) from e
        get = ctypes.Structure.__getattribute__  # skips pynvml's per-attribute str conversion
        out = []
        for i, mid in enumerate(metric_ids):
            m = req.metrics[i]
            ret = int(get(m, "nvmlReturn"))
            out.append(GpmValue(mid, ret, float(get(m, "value")) if ret == 0 else None))
        return out

    def gpm_sample_free(self, sample: Any) -> None:
        n = self._n()
        f = getattr(n, "nvmlGpmSampleFree", None)
        if f is not None:
            try:
                f(sample)
            except n.NVMLError as e:
                raise self._err(e) from e


def _fabric_dict(info: Any, api: str) -> dict[str, Any]:
    """A fabric info struct as the capture records it; `state` masked to the C type's one byte
    (pynvml declares it c_uint, the three bytes after it are padding)."""
    return {"api": api, "state": int(info.state) & 0xFF, "status": int(info.status),
            "cliqueId": int(info.cliqueId), "clusterUuid": bytes(info.clusterUuid).hex(),
            "healthMask": int(getattr(info, "healthMask", 0)),
            "healthSummary": int(getattr(info, "healthSummary", 0))}
