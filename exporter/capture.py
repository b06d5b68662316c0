"""Recording a node's NVML surface and its kernel log's NVIDIA lines into one capture file.

The file has the format the fake backend replays (exporter/nvml/fake.py, the same as the
captures in tests/fixtures/nvml): `system` and `devices` with each call's result or NVML error
and its median latency, and every field value by NVML_FI_DEV_* name. It adds `kmsg`: the kernel
log's NVIDIA records (NVRM, nvidia, Xid, SXid lines) as /dev/kmsg records, which `--kmsg-file`
replays from the same file. Recorded through the backend interface, so a capture can be made of
the real library, of another capture, or of a simulated node (how the tests check it).

GPU Performance Monitoring (GPM) is recorded per device as the fake replays it: the support query,
a sample (its cost, or its error: Not Supported on an A100, In Use while a profiler holds the
counters), and the metrics the exporter reads over GPM_INTERVAL_S between two samples with the
cost of computing them. The values are what the GPU was doing during the capture; the fake replays
them as the GPU's steady activity.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from exporter.gpu.gpm import ACTIVITY_METRICS, TRAFFIC_METRICS
from exporter.nvml.backend import FABRIC_INFO, NvmlBackend, NvmlError
from exporter.nvml.fake import call_key, field_ids
from exporter.regular_file import open_regular

CAPTURE_FORMAT = "gpu-health-exporter capture 1"
REPS = 3  # calls per key; the median latency is kept
FIELD_BATCH = 64
GPM_INTERVAL_S = 1.0  # between the two GPM samples the recorded metrics are computed over
GPM_METRIC_IDS = sorted({mid for mid, *_ in (*ACTIVITY_METRICS, *TRAFFIC_METRICS)})

SYSTEM_CALLS = ("nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion", "nvmlSystemGetCudaDriverVersion",
                "nvmlDeviceGetCount")
# Calls without arguments: what the exporter reads, plus what nvml_capture.py recorded of the
# device's identity and state (a replay of a user's node should answer what theirs answered).
DEVICE_CALLS = (
    "nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetSerial", "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMinorNumber", "nvmlDeviceGetBoardPartNumber", "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetArchitecture", "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetEccMode",
    "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRowRemapperHistogram",
    "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetSupportedClocksEventReasons",
    "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetPerformanceState", "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetPersistenceMode", "nvmlDeviceGetMigMode", "nvmlDeviceGetGpuFabricInfo", FABRIC_INFO,
    "nvmlDeviceGetSupportedEventTypes", "nvmlDeviceGetInforomImageVersion", "nvmlDeviceGetComputeMode",
)


def device_calls() -> Iterator[tuple[str, tuple[int, ...]]]:
    """(function, arguments) of every per-device call recorded, as nvml_capture.py made them."""
    for fn in DEVICE_CALLS:
        yield fn, ()
    for et in (0, 1):  # corrected, uncorrected
        for ct in (0, 1):  # volatile, aggregate
            yield "nvmlDeviceGetTotalEccErrors", (et, ct)
            for loc in range(8):
                yield "nvmlDeviceGetMemoryErrorCounter", (et, ct, loc)
    for cause in (0, 1):
        yield "nvmlDeviceGetRetiredPages", (cause,)
    for fn, n in (("nvmlDeviceGetTemperature", 4), ("nvmlDeviceGetTemperatureThreshold", 12),
                  ("nvmlDeviceGetViolationStatus", 8), ("nvmlDeviceGetClockInfo", 4),
                  ("nvmlDeviceGetMaxClockInfo", 4)):
        for a in range(n):
            yield fn, (a,)
    for link in range(18):
        yield "nvmlDeviceGetNvLinkState", (link,)
        for c in range(5):
            yield "nvmlDeviceGetNvLinkErrorCounter", (link, c)


def _timed(fn: Callable[[], Any], reps: int = REPS) -> dict[str, Any]:
    """A call's result ({"ok": value} or {"error", "code"}) and its median latency."""
    times, out = [], {}
    for _ in range(reps):
        t = time.perf_counter()
        try:
            out = {"ok": fn()}
        except NvmlError as e:
            out = {"error": str(e), "code": e.code}
        times.append(time.perf_counter() - t)
        if "ok" not in out:
            break  # an error answers the same every time
    out["us_median"] = round(statistics.median(times) * 1e6, 1)
    return out


def record_gpm(backend: NvmlBackend, count: int, reps: int = REPS,
               interval_s: float = GPM_INTERVAL_S) -> list[dict[str, Any]]:
    """Each GPU's GPM entries: support, a sample, and the metrics over `interval_s` (one wait for
    all the GPUs: every first sample, the wait, every second sample)."""
    out: list[dict[str, Any]] = [{} for _ in range(count)]
    samples: dict[int, list[Any]] = {}

    def support(i: int) -> dict[str, int]:
        return {"version": 1, "isSupportedDevice": int(backend.gpm_query_device_support(i))}

    def sample(i: int, which: int) -> None:
        backend.gpm_sample_get(i, samples[i][which])

    try:
        for i in range(count):
            out[i]["nvmlGpmQueryDeviceSupport"] = _timed(functools.partial(support, i), reps)
            try:
                samples[i] = [backend.gpm_sample_alloc(), backend.gpm_sample_alloc()]
            except NvmlError as e:
                out[i]["nvmlGpmSampleGet"] = {"error": str(e), "code": e.code, "us_median": 0.0}
                continue
            out[i]["nvmlGpmSampleGet"] = _timed(functools.partial(sample, i, 0), reps)
        taken = [i for i in samples if "ok" in out[i]["nvmlGpmSampleGet"]]
        if taken:
            time.sleep(interval_s)
        for i in taken:
            second = _timed(functools.partial(sample, i, 1), reps)
            if "ok" not in second:
                out[i]["nvmlGpmSampleGet"] = second
                continue

            def metrics(i: int = i) -> dict[str, dict[str, float | None]]:
                values = backend.gpm_metrics_get(samples[i][0], samples[i][1], GPM_METRIC_IDS)
                return {str(v.metric_id): {"ret": v.ret, **({"value": v.value} if v.ret == 0 else {})}
                        for v in values}
            out[i]["nvmlGpmMetricsGet"] = _timed(metrics, reps)
    finally:
        for pair in samples.values():
            for smp in pair:
                try:
                    backend.gpm_sample_free(smp)
                except NvmlError:
                    pass
    return out


def record_nvml(backend: NvmlBackend, reps: int = REPS) -> dict[str, Any]:
    """Every system call, per-device call and field value of an initialised backend."""
    system = {fn: _timed(functools.partial(backend.system, fn), reps) for fn in SYSTEM_CALLS}
    devices = []
    names: dict[int, str] = {}
    for name, fid in sorted(field_ids().items()):
        names.setdefault(fid, name)  # some ids have two names: the first, as nvml_capture.py
    ids = sorted(names)
    for i in range(backend.device_count()):
        d: dict[str, Any] = {"index": i}
        for fn, args in device_calls():
            d[call_key(fn, args)] = _timed(functools.partial(backend.call, i, fn, *args), reps)
        fv: dict[str, dict[str, Any]] = {}
        for start in range(0, len(ids), FIELD_BATCH):
            chunk = ids[start:start + FIELD_BATCH]
            try:
                values = backend.field_values(i, chunk)
            except NvmlError as e:
                fv[f"batch{start}"] = {"error": str(e), "code": e.code}
                continue
            for v in values:
                fv[names[v.field_id]] = {"ret": v.ret, **({"value": v.value} if v.ret == 0 else {})}
        d["field_values"] = fv
        devices.append(d)
    for d, gpm in zip(devices, record_gpm(backend, len(devices), reps), strict=True):
        d.update(gpm)
    return {"system": system, "devices": devices}


NVIDIA_WORDS = ("NVRM", "nvidia", "Xid", "SXid")


def kmsg_nvidia_records(path: str) -> list[str]:
    """The kernel log's records (backlog) that mention the NVIDIA driver, as /dev/kmsg records."""
    from exporter.xid.kmsg import KmsgReader

    reader = KmsgReader(path)
    try:
        return [f"{r.prio},{r.seq},{r.usec},{r.flags};{r.message}" for r in reader.read_available()
                if any(w in r.message for w in NVIDIA_WORDS)]
    finally:
        reader.close()


def record(backend: NvmlBackend, kmsg_path: str | None) -> dict[str, Any]:
    """A whole capture: NVML (the backend initialised by the caller) plus the kernel log's lines;
    `kmsg_error` says why the kernel log could not be read, when it could not."""
    cap: dict[str, Any] = {"format": CAPTURE_FORMAT,
                           "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "host": {"machine": platform.machine(), "kernel": platform.release()}}
    cap.update(record_nvml(backend))
    cap["kmsg"] = []
    if kmsg_path:
        try:
            cap["kmsg"] = kmsg_nvidia_records(kmsg_path)
        except OSError as e:
            cap["kmsg_error"] = f"{kmsg_path}: {e.strerror or e}"
    return cap


def kmsg_of_capture(path: str | Path) -> str | None:
    """The kernel-log records a capture file holds, as the text of a file of /dev/kmsg records;
    None when `path` is not a capture (a plain file of records)."""
    p = Path(path)
    try:
        # non-blocking and regular files only: a FIFO given as --kmsg-file must not hang start-up
        # (the kernel-log reader then refuses it with a clear error)
        with os.fdopen(open_regular(p), "rb") as f:
            if f.read(1) != b"{":
                return None
            data = json.loads((b"{" + f.read()).decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("kmsg"), list):
        return None
    return "".join(f"{line}\n" for line in data["kmsg"] if isinstance(line, str))
