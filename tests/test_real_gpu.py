"""On a real NVIDIA GPU: the pynvml backend answers the calls the collector makes with the same
shapes the fake replays from the H200 capture, and the collector serves the real GPUs.

Marked real_gpu; skipped (with NVML's own reason) where NVML cannot initialise, which is every
GPU-less machine and CI. bench/real_gpu.sh runs them on a GPU node; with $OUT set, the
comparison is written to $OUT/real_vs_fake.json.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors import collector_classes
from exporter.compose import compose
from exporter.config import load
from exporter.gpu.reader import FAST_FIELDS, SLOW_FIELDS
from exporter.nvml.backend import NVML_ERROR_TIMEOUT, NvmlError
from exporter.nvml.fake import FakeBackend
from exporter.nvml.pynvml_backend import PynvmlBackend
from exporter.nvml.session import NvmlSession
from exporter.runner import Runner
from tests.helpers import FIXTURES, promtool_check_metrics, samples, scrape, test_pool, value

pytestmark = pytest.mark.real_gpu

CAPTURE = FIXTURES / "nvml" / "h200" / "nvml_capture.json"

# The calls the collector makes (static, every scrape, slow cadence); NVLink separately.
CALLS: list[tuple] = [
    ("nvmlDeviceGetName",), ("nvmlDeviceGetUUID",), ("nvmlDeviceGetSerial",), ("nvmlDeviceGetPciInfo",),
    ("nvmlDeviceGetVbiosVersion",), ("nvmlDeviceGetBoardPartNumber",),
    *[("nvmlDeviceGetTemperatureThreshold", t) for t in range(4)],
    ("nvmlDeviceGetMaxClockInfo", 1), ("nvmlDeviceGetMaxClockInfo", 2),
    ("nvmlDeviceGetMaxPcieLinkGeneration",), ("nvmlDeviceGetMaxPcieLinkWidth",),
    ("nvmlDeviceGetSupportedClocksEventReasons",), ("nvmlDeviceGetTemperature", 0),
    ("nvmlDeviceGetCurrentClocksEventReasons",), ("nvmlDeviceGetPowerUsage",),
    ("nvmlDeviceGetEnforcedPowerLimit",), ("nvmlDeviceGetUtilizationRates",), ("nvmlDeviceGetMemoryInfo",),
    ("nvmlDeviceGetClockInfo", 1), ("nvmlDeviceGetClockInfo", 2), ("nvmlDeviceGetPerformanceState",),
    ("nvmlDeviceGetRowRemapperHistogram",), ("nvmlDeviceGetCurrPcieLinkGeneration",),
    ("nvmlDeviceGetCurrPcieLinkWidth",), ("nvmlDeviceGetEccMode",), ("nvmlDeviceGetRemappedRows",),
    *[("nvmlDeviceGetTotalEccErrors", et, ct) for et in (0, 1) for ct in (0, 1)],
    ("nvmlDeviceGetRetiredPagesPendingStatus",), ("nvmlDeviceGetTotalEnergyConsumption",),
    ("nvmlDeviceGetPcieReplayCounter",),
]


@pytest.fixture(scope="module")
def real() -> PynvmlBackend:
    be = PynvmlBackend()
    try:
        be.init()
    except NvmlError as e:
        pytest.skip(f"NVML is not available on this host: {e}")
    yield be
    be.shutdown()


@pytest.fixture(scope="module")
def fake() -> FakeBackend:
    f = FakeBackend.from_file(CAPTURE)
    f.init()
    return f


def outcome(be, fn: str, *args: int) -> tuple[str, object]:  # noqa: ANN001
    try:
        return "ok", be.call(0, fn, *args)
    except NvmlError as e:
        return "error", e.code


def shape(v: object) -> object:
    """What must agree between backends: the type, a dict's keys, a list's length."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, dict):
        return ("dict", sorted(v))
    if isinstance(v, list):
        return ("list", len(v))
    return type(v).__name__


def _write(name: str, data: object) -> None:
    out = os.environ.get("OUT")
    if out:
        text = data if isinstance(data, str) else json.dumps(data, indent=1, default=repr)
        Path(out, name).write_text(text)


def test_calls_agree_with_the_fake(real, fake):
    report, mismatches = {}, []
    for c in CALLS:
        r_kind, r_val = outcome(real, *c)
        f_kind, f_val = outcome(fake, *c)
        key = "/".join(map(str, c))
        report[key] = {"real": [r_kind, r_val], "fake": [f_kind, f_val]}
        if r_kind != f_kind:
            mismatches.append(f"{key}: real {r_kind} {r_val!r}, fake {f_kind} {f_val!r}")
        elif r_kind == "ok" and shape(r_val) != shape(f_val):
            mismatches.append(f"{key}: real {shape(r_val)}, fake {shape(f_val)}")
        elif r_kind == "error" and r_val != f_val:
            mismatches.append(f"{key}: real NVML error {r_val}, fake {f_val}")
    _write("real_vs_fake.json", report)
    assert not mismatches, "\n".join(mismatches)


def test_field_values_agree_with_the_fake(real, fake):
    ids = sorted(set(FAST_FIELDS) | set(SLOW_FIELDS))
    rv = {v.field_id: v for v in real.field_values(0, ids)}
    fv = {v.field_id: v for v in fake.field_values(0, ids)}
    _write("real_vs_fake_fields.json", {i: [rv[i].ret, rv[i].value, fv[i].ret, fv[i].value] for i in ids})
    mismatches = []
    for i in ids:
        if rv[i].ret != fv[i].ret:
            mismatches.append(f"field {i}: real ret {rv[i].ret}, fake ret {fv[i].ret}")
        elif rv[i].ret == 0 and not isinstance(rv[i].value, (int, float)):
            mismatches.append(f"field {i}: real value {rv[i].value!r}")
    assert not mismatches, "\n".join(mismatches)


def test_nvlink_calls_where_present(real):
    name = real.call(0, "nvmlDeviceGetName")
    links = []
    for link in range(18):
        try:
            links.append((link, real.call(0, "nvmlDeviceGetNvLinkState", link)))
        except NvmlError as e:
            assert e.not_supported or e.code == 2, e  # PCIe parts: Not Supported / Invalid Argument
    # No assumption that a model has NVLink: a passthrough H100 in a VM answers every link with
    # Not Supported (seen on the lent H100 80GB HBM3), so only the answers' shape is checked.
    assert name
    for link, state in links:
        assert state in (0, 1)
        for c in range(4):
            assert isinstance(real.call(0, "nvmlDeviceGetNvLinkErrorCounter", link, c), int)


def test_session_identity_and_kernel_address_forms(real):
    s = NvmlSession(PynvmlBackend(), pool=test_pool())
    assert s.ensure(), s.error
    assert len(s.devices) == real.device_count() >= 1
    for d in s.devices:
        assert d.uuid.startswith("GPU-") and d.name
        _, bus, devfn = d.pci_bus_id.split(":")
        kernel = f"PCI:0000:{bus.lower()}:{devfn.split('.')[0]}"  # as NVRM prints it in XID lines
        assert s.by_pci(kernel) == d and s.by_pci(d.pci_bus_id) == d and s.by_uuid(d.uuid) == d
    assert s.driver_version and s.nvml_version
    s.close()


def test_events_can_be_registered_and_waited_on(real):
    es = real.event_set_create()
    try:
        real.register_events(0, 8, es)  # XID critical errors
        try:
            ev = real.event_wait(es, 200)
            assert ev.event_type == 8 and ev.index == 0
        except NvmlError as e:
            assert e.code == NVML_ERROR_TIMEOUT
    finally:
        real.event_set_free(es)


def test_collector_serves_the_real_gpus(real):
    collector_classes()
    from exporter.collectors.gpu import GpuCollector

    # No capture, no simulation: the real library; every detail level (gpu_clock_max_hertz is opt-in).
    ctx = compose(load(None, {"gpu.detail": "all"}))
    c = GpuCollector(ctx)
    runner = Runner([c], deadline_s=10, pool=test_pool())
    scrape(runner)
    c.refresh_slow(timeout=30)
    text = scrape(runner)
    _write("real_gpu_scrape.txt", text)
    ss = samples(text)
    n = real.device_count()
    assert value(ss, "gpu_health_exporter_collector_success", collector="gpu") == 1
    assert value(ss, "gpu_devices") == n
    for i in range(n):
        g = str(i)
        assert value(ss, "gpu_read_success", gpu=g) == 1 and value(ss, "gpu_lost", gpu=g) == 0
        assert 5 <= value(ss, "gpu_temperature_celsius", gpu=g, sensor="gpu") <= 110
        assert value(ss, "gpu_memory_total_bytes", gpu=g) > 8 * 2**30
        assert 0 < value(ss, "gpu_power_watts", gpu=g) <= value(ss, "gpu_power_limit_watts", gpu=g) * 1.5
        assert value(ss, "gpu_energy_joules_total", gpu=g) > 0
        assert value(ss, "gpu_ecc_mode_enabled", gpu=g) in (0, 1)
        assert value(ss, "gpu_clock_max_hertz", gpu=g, clock="sm") >= value(ss, "gpu_clock_hertz", gpu=g,
                                                                               clock="sm")
    if shutil.which("promtool"):
        assert promtool_check_metrics(text) == ""
    else:  # GPU nodes seldom have promtool: the scrape is saved to $OUT for checking elsewhere
        names = [f.name for f in text_string_to_metric_families(text)]
        assert len(names) == len(set(names)) > 25
    h = runner.readings["gpu"]
    assert h.count == n and not any(g.lost for g in h.gpus.values())
    runner.close()
    c.close()


def test_gpm_activity_on_the_real_gpus(real):
    """GPM: a Hopper or newer GPU (compute capability 9+) is measured, two samples a
    second apart give ratios in [0, 1]; an older GPU says gpu_not_supported; the capture records GPM
    with its cost per call (written to $OUT/gpm_capture.json for docs/real-gpu.md)."""
    import time

    from exporter.capture import record_gpm
    from exporter.gpu.gpm import GpmReader
    from exporter.gpu.reader import Reading

    for i in range(real.device_count()):
        cc = real.call(i, "nvmlDeviceGetCudaComputeCapability")
        reader = GpmReader(real, i)
        r = Reading(labels={"gpu": str(i), "uuid": "", "pci_bus_id": ""})
        reader.read(r)
        if cc[0] < 9:
            assert r.activity == "gpu_not_supported", (cc, r.activity, r.activity_error)
            continue
        assert r.activity in ("measured", "mig_mode", "counters_in_use"), (r.activity, r.activity_error)
        if r.activity != "measured":
            continue
        time.sleep(1.0)
        r = Reading(labels={"gpu": str(i), "uuid": "", "pci_bus_id": ""})
        reader.read(r)
        assert r.activity == "measured", r.activity_error
        for mid, total in reader.counters.totals.items():
            assert 0 <= total <= 1.5, (mid, total)  # seconds of activity within ~1 s
    _write("gpm_capture.json", record_gpm(real, real.device_count()))
