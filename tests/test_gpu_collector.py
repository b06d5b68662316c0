"""The GPU collector: every metric against the H200 capture, and failure isolation."""

from __future__ import annotations

import json
import logging
import time

import pytest
import requests

from exporter.catalog import Families, MetricSpec
from exporter.collector import Collector, Context
from exporter.collectors import collector_classes
from exporter.compose import compose
from exporter.config import load
from exporter.health import NodeGpuHealth
from exporter.nvml import backend as b
from exporter.nvml.fake import FakeBackend, field_ids
from exporter.nvml.session import NvmlSession
from exporter.profiles import PROFILES
from exporter.runner import Runner
from exporter.tools.simulate.nvml import fake_backend
from exporter.tools.simulate.nvml_scenarios import FAULTY_GPU, ONSET_S
from tests.helpers import (
    DEADLINE_MARGIN_S,
    FIXTURES,
    HANG_GUARD_S,
    START_HANG_GUARD_S,
    promtool_check_metrics,
    running_exporter,
    samples,
    scrape,
    test_pool,
    value,
    wait_for,
)

collector_classes()  # declares the config sections
from exporter.collectors.gpu import GpuCollector  # noqa: E402
from exporter.gpu.reader import DETAIL  # noqa: E402

CAPTURE = FIXTURES / "nvml" / "h200" / "nvml_capture.json"
CAP = json.loads(CAPTURE.read_text())
DEV = CAP["devices"][0]
FV = DEV["field_values"]


def ok(key: str):
    return DEV[key]["ok"]


def field(name: str):
    return FV[name]["value"]


def make(fake: FakeBackend | None = None, profile: str | None = None,
         **gpu_cfg) -> tuple[Context, GpuCollector]:
    gpu_cfg.setdefault("detail", "all")  # most tests check every series; the default is tested below
    overrides = {f"gpu.{k}": v for k, v in gpu_cfg.items()}
    if profile:
        overrides["node.instance_type"] = profile
    ctx = compose(load(None, overrides),
                  nvml=NvmlSession(fake, pool=test_pool()) if fake is not None
                  else NvmlSession.for_capture(str(CAPTURE), False, test_pool()))
    return ctx, GpuCollector(ctx)


def run(c: Collector, *others: Collector, deadline: float = 5.0) -> tuple[str, dict]:
    text = scrape(Runner([c, *others], deadline_s=deadline, pool=test_pool()))
    return text, samples(text)


def reading(c: GpuCollector) -> NodeGpuHealth:
    """What the GPU collector hands the verdict from one collection."""
    runner = Runner([c], deadline_s=5.0, pool=test_pool())
    runner.collect()
    return runner.readings[c.name]


@pytest.fixture(scope="module")
def capture_scrape() -> tuple[str, dict, NodeGpuHealth]:
    _, c = make()
    c.refresh_slow(timeout=10)
    runner = Runner([c], deadline_s=5.0, pool=test_pool())
    text = scrape(runner)
    return text, samples(text), runner.readings[c.name]


G0 = {"gpu": "0", "uuid": ok("nvmlDeviceGetUUID"), "pci_bus_id": ok("nvmlDeviceGetPciInfo")["busId"]}


def test_identity_and_driver(capture_scrape):
    _, ss, _ = capture_scrape
    assert value(ss, "gpu_info", **G0, model=ok("nvmlDeviceGetName"), serial=ok("nvmlDeviceGetSerial"),
                 vbios_version=ok("nvmlDeviceGetVbiosVersion"),
                 board_part_number=ok("nvmlDeviceGetBoardPartNumber")) == 1
    sysc = CAP["system"]
    assert value(ss, "gpu_driver_info", driver_version=sysc["nvmlSystemGetDriverVersion"]["ok"],
                 nvml_version=sysc["nvmlSystemGetNVMLVersion"]["ok"], cuda_driver_version="13.0") == 1
    assert value(ss, "gpu_devices") == 1
    assert ("gpu_devices_expected", frozenset()) not in ss  # no instance type, no config
    assert value(ss, "gpu_lost", **G0) == 0
    assert value(ss, "gpu_read_success", **G0) == 1
    assert value(ss, "gpu_health_exporter_collector_success", collector="gpu") == 1


def test_memory_health_values(capture_scrape):
    _, ss, _ = capture_scrape
    for et, fsbe in (("corrected", "SBE"), ("uncorrected", "DBE")):
        for ct, short in (("volatile", "VOL"), ("aggregate", "AGG")):
            assert value(ss, "gpu_ecc_errors_total", **G0, error_type=et, counter=ct) == \
                ok(f"nvmlDeviceGetTotalEccErrors/{et}/{ct}") == field(f"NVML_FI_DEV_ECC_{fsbe}_{short}_TOTAL")
    cor, unc, pending, failure = ok("nvmlDeviceGetRemappedRows")
    assert value(ss, "gpu_remapped_rows_total", **G0, cause="correctable") == cor
    assert value(ss, "gpu_remapped_rows_total", **G0, cause="uncorrectable") == unc
    assert value(ss, "gpu_row_remap_pending", **G0) == pending
    assert value(ss, "gpu_row_remap_failure", **G0) == failure
    for k, v in ok("nvmlDeviceGetRowRemapperHistogram").items():
        assert value(ss, "gpu_row_remapper_banks", **G0, spare_rows=k) == v
    assert value(ss, "gpu_recovery_action", **G0) == field("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
    assert value(ss, "gpu_ecc_mode_enabled", **G0) == ok("nvmlDeviceGetEccMode")[0]
    # H200: retired pages are Not Supported, so no series at all
    assert DEV["nvmlDeviceGetRetiredPagesPendingStatus"]["code"] == b.NVML_ERROR_NOT_SUPPORTED
    assert not [k for k in ss if k[0].startswith("gpu_retired_pages")]


def test_thermal_and_clock_values(capture_scrape):
    _, ss, _ = capture_scrape
    temp = ok("nvmlDeviceGetTemperature/0")
    assert value(ss, "gpu_temperature_celsius", **G0, sensor="gpu") == temp
    assert value(ss, "gpu_temperature_celsius", **G0, sensor="memory") == field("NVML_FI_DEV_MEMORY_TEMP")
    for th, name in enumerate(("shutdown", "slowdown", "memory_max", "gpu_max")):
        assert value(ss, "gpu_temperature_threshold_celsius", **G0, threshold=name) == \
            ok(f"nvmlDeviceGetTemperatureThreshold/{th}")
    assert value(ss, "gpu_temperature_slowdown_margin_celsius", **G0) == \
        ok("nvmlDeviceGetTemperatureThreshold/1") - temp
    reasons = ok("nvmlDeviceGetCurrentClocksEventReasons")
    for bit, name in ((0x1, "idle"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"), (0x10, "sync_boost"),
                      (0x20, "sw_thermal"), (0x40, "hw_thermal"), (0x80, "hw_power_brake")):
        assert value(ss, "gpu_clock_event_active", **G0, reason=name) == (1 if reasons & bit else 0)
    assert value(ss, "gpu_clock_event_active", **G0, reason="idle") == 1  # the capture was idle
    for clk, name in ((1, "sm"), (2, "memory")):
        assert value(ss, "gpu_clock_hertz", **G0, clock=name) == ok(f"nvmlDeviceGetClockInfo/{clk}") * 1e6
        assert value(ss, "gpu_clock_max_hertz", **G0, clock=name) == \
            ok(f"nvmlDeviceGetMaxClockInfo/{clk}") * 1e6
    assert value(ss, "gpu_performance_state", **G0) == ok("nvmlDeviceGetPerformanceState")
    for reason, name in (("sw_power_cap", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP"),
                         ("thermal", "NVML_FI_DEV_PERF_POLICY_THERMAL"),
                         ("sync_boost", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST"),
                         ("sw_thermal", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN"),
                         ("hw_thermal", "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN"),
                         ("hw_power_brake", "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN")):
        assert value(ss, "gpu_throttle_seconds_total", **G0, reason=reason) == \
            pytest.approx(field(name) * 1e-9)


def test_power_memory_and_utilisation(capture_scrape):
    _, ss, _ = capture_scrape
    assert value(ss, "gpu_power_watts", **G0) == pytest.approx(ok("nvmlDeviceGetPowerUsage") / 1000)
    assert value(ss, "gpu_power_limit_watts", **G0) == \
        pytest.approx(ok("nvmlDeviceGetEnforcedPowerLimit") / 1000)
    assert value(ss, "gpu_energy_joules_total", **G0) == \
        pytest.approx(field("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION") / 1000)
    assert field("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == ok("nvmlDeviceGetTotalEnergyConsumption")
    util = ok("nvmlDeviceGetUtilizationRates")
    assert value(ss, "gpu_utilization_ratio", **G0, resource="gpu") == util["gpu"] / 100
    assert value(ss, "gpu_utilization_ratio", **G0, resource="memory") == util["memory"] / 100
    mem = ok("nvmlDeviceGetMemoryInfo")
    assert value(ss, "gpu_memory_used_bytes", **G0) == mem["used"]
    assert value(ss, "gpu_memory_total_bytes", **G0) == mem["total"]


def test_pcie_and_no_nvlink_on_a_pcie_gpu(capture_scrape):
    _, ss, _ = capture_scrape
    assert value(ss, "gpu_pcie_replays_total", **G0) == ok("nvmlDeviceGetPcieReplayCounter")
    assert value(ss, "gpu_pcie_link_generation", **G0) == ok("nvmlDeviceGetCurrPcieLinkGeneration")
    assert value(ss, "gpu_pcie_link_generation_max", **G0) == ok("nvmlDeviceGetMaxPcieLinkGeneration")
    assert value(ss, "gpu_pcie_link_width", **G0) == ok("nvmlDeviceGetCurrPcieLinkWidth")
    assert value(ss, "gpu_pcie_link_width_max", **G0) == ok("nvmlDeviceGetMaxPcieLinkWidth")
    for t, name in (("receiver_error", "RECEIVER_ERROR"), ("bad_tlp", "BAD_TLP"), ("lane", "LANE_ERROR"),
                    ("correctable", "CORRECTABLE_ERRORS"), ("fatal", "FATAL_ERROR")):
        assert value(ss, "gpu_pcie_errors_total", **G0, type=t) == field(f"NVML_FI_DEV_PCIE_COUNT_{name}")
    assert value(ss, "gpu_pcie_errors_total", **G0, type="l0_to_recovery") == \
        field("NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER")
    assert not [k for k in ss if k[0].startswith("gpu_nvlink")]


def test_capture_scrape_is_promtool_clean_and_publishes_health(capture_scrape):
    text, _, h = capture_scrape
    assert promtool_check_metrics(text) == ""
    assert h.count == 1 and h.nvml_error == ""
    g = h.gpus[0]
    assert (g.uuid, g.lost, g.row_remap_pending, g.row_remap_failure, g.recovery_action) == \
        (G0["uuid"], False, False, False, 0)
    assert g.ecc_uncorrected_volatile == ok("nvmlDeviceGetTotalEccErrors/uncorrected/volatile")


def test_unsupported_reads_are_not_repeated():
    fake = FakeBackend.from_file(CAPTURE)
    batches: list[list[int]] = []
    orig = fake.field_values
    fake.field_values = lambda index, ids: (batches.append(list(ids)), orig(index, ids))[1]
    _, c = make(fake)
    run(c)
    retired = {29, 30, 31}  # Not Supported on the H200 (capture ret 3)
    assert retired <= set(batches[0])
    n, batches[:] = fake.calls_made, []
    run(c)
    per_scrape = fake.calls_made - n
    run(c)
    assert fake.calls_made - n == 2 * per_scrape <= 2 * 16  # 1 field batch + ~14 calls, nothing Not Supported
    assert len(batches) == 2 and not retired & set(batches[0]) and batches[0] == batches[1]


# --- the simulated node -----------------------------------------------------------------------------
def sim(scenarios=(), **gpu_cfg) -> tuple[FakeBackend, Context, GpuCollector]:
    fake = fake_backend(PROFILES["p5.48xlarge"], scenarios)
    fake.advance_to(0)
    ctx, c = make(fake, profile="p5.48xlarge", **gpu_cfg)
    return fake, ctx, c


def test_simulated_p5_serves_eight_gpus_with_nvlink():
    _, _, c = sim()
    c.refresh_slow(timeout=10)
    text, ss = run(c)
    assert value(ss, "gpu_devices") == 8 and value(ss, "gpu_devices_expected") == 8
    assert sum(1 for (n, _ls), v in ss.items() if n == "gpu_read_success" and v == 1) == 8
    assert len({dict(ls)["uuid"] for (n, ls) in ss if n == "gpu_info"}) == 8
    assert sum(1 for (n, _ls), v in ss.items() if n == "gpu_nvlink_up" and v == 1) == 8 * 18
    assert value(ss, "gpu_nvlink_errors_total", gpu="7", link="17", type="crc_flit") == 0
    assert promtool_check_metrics(text) == ""


def test_nvlink_per_gpu_by_default_sums_the_links():
    fake, _, c = sim(["gpu-nvlink-errors"], detail=[])
    fake.advance_to(10)
    c.refresh_slow(timeout=10)
    _, ss = run(c)
    f = str(FAULTY_GPU)
    per_link = sum(fake.get(FAULTY_GPU, f"nvmlDeviceGetNvLinkErrorCounter/{link}/2") for link in range(18))
    assert value(ss, "gpu_nvlink_errors_total", gpu=f, link="all", type="crc_flit") == per_link == 200
    assert sum(1 for (n, _) in ss if n == "gpu_nvlink_errors_total") == 8 * 4
    # link 7 of the faulty GPU is down: its GPU's link="all" says so, the others' are up
    assert value(ss, "gpu_nvlink_up", gpu=f, link="all") == 0
    assert sum(v for (n, _), v in ss.items() if n == "gpu_nvlink_up") == 7
    assert sum(1 for (n, _) in ss if n == "gpu_nvlink_up") == 8
    # the opt-in detail is neither exported nor read
    for name in ("gpu_pcie_errors_total", "gpu_throttle_seconds_total", "gpu_clock_max_hertz"):
        assert not [k for k in ss if k[0] == name], name
    assert {dict(ls)["reason"] for (n, ls) in ss if n == "gpu_clock_event_active"} == {
        "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"}
    assert {dict(ls)["threshold"] for (n, ls) in ss if n == "gpu_temperature_threshold_celsius"} == {
        "slowdown", "memory_max"}
    not_read = {field_ids()[f]
                for f in ("NVML_FI_DEV_PERF_POLICY_THERMAL", "NVML_FI_DEV_PCIE_COUNT_LANE_ERROR")}
    assert not not_read & set(c.gpus[0].reader.slow_fields)


def test_gpu_lost_keeps_the_other_gpus(caplog):
    fake, ctx, c = sim(["gpu-lost"])
    _, ss = run(c)
    assert value(ss, "gpu_lost", gpu=str(FAULTY_GPU)) == 0
    fake.advance_to(ONSET_S + 1)
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            _, ss = run(c)
    assert value(ss, "gpu_lost", gpu=str(FAULTY_GPU)) == 1
    assert value(ss, "gpu_read_success", gpu=str(FAULTY_GPU)) == 0
    assert ("gpu_temperature_celsius", frozenset({("gpu", str(FAULTY_GPU))})) not in ss
    assert not [k for k in ss if k[0] == "gpu_power_watts" and ("gpu", str(FAULTY_GPU)) in k[1]]
    for i in set(range(8)) - {FAULTY_GPU}:
        assert value(ss, "gpu_lost", gpu=str(i)) == 0 and value(ss, "gpu_read_success", gpu=str(i)) == 1
        assert value(ss, "gpu_temperature_celsius", gpu=str(i), sensor="gpu") > 0
    assert value(ss, "gpu_health_exporter_collector_success", collector="gpu") == 1
    assert reading(c).gpus[FAULTY_GPU].lost
    assert ctx.nvml.lost == {FAULTY_GPU}
    lost_logs = [r for r in caplog.records if "is lost" in r.getMessage()]
    assert len(lost_logs) == 1  # logged when it happens, not every scrape
    fake.restore(FAULTY_GPU)
    _, ss = run(c)
    assert value(ss, "gpu_lost", gpu=str(FAULTY_GPU)) == 0 and ctx.nvml.lost == set()


def test_gpu_lost_mid_scrape():
    fake, ctx, c = sim()
    # the GPU falls off between the field batch and the calls of this very scrape
    orig = fake.call

    def call(index, fn, *args):
        if index == 5 and fn == "nvmlDeviceGetMemoryInfo":
            fake.lose(5)
        return orig(index, fn, *args)

    fake.call = call
    _, ss = run(c)
    assert value(ss, "gpu_lost", gpu="5") == 1 and value(ss, "gpu_read_success", gpu="5") == 0
    assert value(ss, "gpu_read_success", gpu="4") == 1 and value(ss, "gpu_read_success", gpu="6") == 1
    c.refresh_slow(timeout=5)  # the slow reader leaves the lost GPU alone
    _, ss = run(c)
    assert not [k for k in ss if k[0] == "gpu_energy_joules_total" and ("gpu", "5") in k[1]]
    assert value(ss, "gpu_energy_joules_total", gpu="4") > 0


RECOVERABLE = [b.NVML_ERROR_NO_PERMISSION, b.NVML_ERROR_TIMEOUT, b.NVML_ERROR_IRQ_ISSUE,
               b.NVML_ERROR_RESET_REQUIRED, b.NVML_ERROR_UNKNOWN, b.NVML_ERROR_UNINITIALIZED]
UNSUPPORTED = [b.NVML_ERROR_NOT_SUPPORTED, b.NVML_ERROR_FUNCTION_NOT_FOUND, b.NVML_ERROR_INVALID_ARGUMENT]


@pytest.mark.parametrize("code", RECOVERABLE + UNSUPPORTED + [b.NVML_ERROR_GPU_IS_LOST])
def test_one_call_raising_each_nvml_error(code):
    fake, _, c = sim()
    fake.fail(2, "nvmlDeviceGetPowerUsage", code)
    _, ss = run(c)
    power_2 = [k for k in ss if k[0] == "gpu_power_watts" and ("gpu", "2") in k[1]]
    assert not power_2
    if code == b.NVML_ERROR_GPU_IS_LOST:
        assert value(ss, "gpu_lost", gpu="2") == 1 and value(ss, "gpu_read_success", gpu="2") == 0
    else:
        assert value(ss, "gpu_lost", gpu="2") == 0
        assert value(ss, "gpu_read_success", gpu="2") == (1 if code in UNSUPPORTED else 0)
        # the rest of GPU 2 is still read
        assert value(ss, "gpu_temperature_celsius", gpu="2", sensor="gpu") > 0
        assert value(ss, "gpu_ecc_errors_total", gpu="2", error_type="corrected", counter="volatile") == 0
    for i in (0, 1, 3, 7):
        assert value(ss, "gpu_read_success", gpu=str(i)) == 1
        assert value(ss, "gpu_power_watts", gpu=str(i)) > 0
    assert value(ss, "gpu_health_exporter_collector_success", collector="gpu") == 1


@pytest.mark.parametrize("code", [b.NVML_ERROR_UNKNOWN, b.NVML_ERROR_GPU_IS_LOST])
def test_field_batch_failures(code):
    fake, _, c = sim()
    fake.fail(6, "nvmlDeviceGetFieldValues", code)
    fake.set_error(1, "NVML_FI_DEV_MEMORY_TEMP", b.NVML_ERROR_UNKNOWN)  # one field of a batch
    _, ss = run(c)
    assert value(ss, "gpu_read_success", gpu="6") == 0
    assert value(ss, "gpu_lost", gpu="6") == (1 if code == b.NVML_ERROR_GPU_IS_LOST else 0)
    assert value(ss, "gpu_read_success", gpu="1") == 0
    assert value(ss, "gpu_ecc_errors_total", gpu="1", error_type="corrected", counter="volatile") == 0
    assert value(ss, "gpu_read_success", gpu="0") == 1


@pytest.mark.parametrize("parallel", [False, True])
def test_hung_call_hits_the_per_gpu_deadline(parallel, caplog):
    # The collector's and the scrape's deadlines are hang guards: only the 1 s per-GPU deadline
    # keeps the scrape short of a call that hangs for HANG_GUARD_S.
    fake, _, c = sim(read_timeout_seconds=1.0, timeout_seconds=START_HANG_GUARD_S, parallel=parallel)
    run(c)
    fake.hang(FAULTY_GPU, "nvmlDeviceGetPowerUsage", seconds=HANG_GUARD_S)
    try:
        t = time.monotonic()
        with caplog.at_level(logging.WARNING):
            _, ss = run(c, deadline=START_HANG_GUARD_S)
        assert time.monotonic() - t < DEADLINE_MARGIN_S
        assert value(ss, "gpu_health_exporter_collector_success", collector="gpu") == 1
        assert value(ss, "gpu_read_success", gpu=str(FAULTY_GPU)) == 0
        for i in set(range(8)) - {FAULTY_GPU}:
            assert value(ss, "gpu_read_success", gpu=str(i)) == 1, i
            assert value(ss, "gpu_power_watts", gpu=str(i)) > 0
        # while the call is still stuck, the GPU is skipped at once: no second read waits its
        # deadline and is written off
        assert c._fast.abandoned == 1
        _, ss = run(c, deadline=START_HANG_GUARD_S)
        assert c._fast.abandoned == 1 and c._fast.stuck() == [FAULTY_GPU]
        assert value(ss, "gpu_read_success", gpu=str(FAULTY_GPU)) == 0
        assert value(ss, "gpu_read_success", gpu="7") == 1
        c.refresh_slow(timeout=1)  # the slow reader skips the blocked GPU and does not block
        warnings = [r for r in caplog.records if f"GPU {FAULTY_GPU}:" in r.getMessage()]
        assert len(warnings) == 1
    finally:
        fake.release()
    wait_for(lambda: not c._fast.stuck(), what="the released call to return")
    _, ss = run(c)
    assert value(ss, "gpu_read_success", gpu=str(FAULTY_GPU)) == 1


def test_whole_gpu_hang_in_scenario():
    fake, _, c = sim(["gpu-nvml-hang"], read_timeout_seconds=0.2)
    run(c)  # the exporter started before the GPU hung
    fake.advance_to(ONSET_S + 0.5)
    try:
        _, ss = run(c)
        assert value(ss, "gpu_read_success", gpu=str(FAULTY_GPU)) == 0
        assert value(ss, "gpu_read_success", gpu=str(FAULTY_GPU + 1)) == 1
    finally:
        fake.release()


class _Other(Collector):
    name = "other_for_test"
    SPEC = None

    def collect(self, out: Families) -> None:
        out.add(self.SPEC, 1)


# the test's own metric, never declared in the product's catalog
_Other.SPEC = MetricSpec("gpu_health_exporter_test_other_up", "gauge", "test only", (), "", "test")


def test_nvml_missing_fails_the_collector_with_one_log_line(caplog, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML at all, whatever the host has
    ctx = compose(load(None, {"node.instance_type": "p5.48xlarge"}))
    c = GpuCollector(ctx)
    other = _Other(ctx)
    runner = Runner([c, other], deadline_s=5, pool=test_pool())
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            ss = samples(scrape(runner))
    h = runner.readings["gpu"]  # handed over with the failure, for the verdict
    assert value(ss, "gpu_health_exporter_collector_success", collector="gpu") == 0
    assert value(ss, "gpu_health_exporter_collector_success", collector="other_for_test") == 1
    assert value(ss, "gpu_health_exporter_test_other_up") == 1
    failed = [r for r in caplog.records if "gpu" in r.getMessage() and "NVML" in r.getMessage()]
    assert len(failed) == 1, [r.getMessage() for r in caplog.records]
    assert "not installed" in failed[0].getMessage() or "Library Not Found" in failed[0].getMessage()
    assert h.nvml_error and h.expected == 8 and h.count == 0


def test_scenarios_show_in_metrics():
    fake, ctx, c = sim(["gpu-row-remap-pending", "gpu-thermal-slowdown", "gpu-pcie-degraded",
                        "gpu-recovery-action-reboot", "gpu-ecc-sbe-storm", "gpu-nvlink-errors"])
    c.refresh_slow(timeout=10)
    _, ss = run(c)
    f = str(FAULTY_GPU)
    assert value(ss, "gpu_row_remap_pending", gpu=f) == 1 and value(ss, "gpu_row_remap_pending", gpu="0") == 0
    assert value(ss, "gpu_remapped_rows_total", gpu=f, cause="uncorrectable") == 1
    assert value(ss, "gpu_clock_event_active", gpu=f, reason="hw_thermal") == 1
    assert value(ss, "gpu_temperature_slowdown_margin_celsius", gpu=f) < 0
    assert value(ss, "gpu_pcie_link_width", gpu=f) < value(ss, "gpu_pcie_link_width_max", gpu=f)
    assert value(ss, "gpu_recovery_action", gpu=f) == 2
    assert value(ss, "gpu_nvlink_up", gpu=f, link="7") == 0
    h = reading(c).gpus[FAULTY_GPU]
    assert h.row_remap_pending and h.recovery_action == 2
    sbe0 = value(ss, "gpu_ecc_errors_total", gpu=f, error_type="corrected", counter="volatile")
    fake.advance_to(10)
    c.refresh_slow(timeout=10)
    _, ss = run(c)
    assert value(ss, "gpu_ecc_errors_total", gpu=f, error_type="corrected", counter="volatile") >= sbe0 + 100
    assert value(ss, "gpu_throttle_seconds_total", gpu=f, reason="hw_thermal") == pytest.approx(8.0)
    assert value(ss, "gpu_nvlink_errors_total", gpu=f, link="5", type="crc_flit") == 200


def test_field_ids_used_exist_in_the_binding():
    from exporter.gpu.reader import FAST_FIELDS, SLOW_FIELDS

    known = set(field_ids().values())
    assert set(FAST_FIELDS) <= known and set(SLOW_FIELDS) <= known


# --- the real exporter process --------------------------------------------------------------------
def _get(url: str, want: str, timeout: float = 10.0) -> str:
    """/metrics once `want` is in it (the slow reading lands shortly after start)."""
    deadline = time.monotonic() + timeout
    while True:
        text = requests.get(url + "/metrics", timeout=5).text
        if want in text or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


def test_exporter_simulated_p5_is_promtool_clean():
    with running_exporter("--simulate", "p5.48xlarge", "--collectors", "gpu") as url:
        text = _get(url, "gpu_energy_joules_total{")
    assert promtool_check_metrics(text) == ""
    ss = samples(text)
    assert value(ss, "gpu_devices") == 8 and value(ss, "gpu_devices_expected") == 8
    assert sum(v for (n, _), v in ss.items() if n == "gpu_read_success") == 8
    assert sum(1 for (n, _) in ss if n == "gpu_energy_joules_total") == 8
    assert value(ss, "gpu_health_exporter_collector_success", collector="gpu") == 1


def test_exporter_replays_a_capture():
    with running_exporter("--nvml-capture", str(CAPTURE), "--collectors", "gpu") as url:
        text = _get(url, "gpu_energy_joules_total{")
    assert promtool_check_metrics(text) == ""
    ss = samples(text)
    assert value(ss, "gpu_info", model="NVIDIA H200", serial=ok("nvmlDeviceGetSerial")) == 1
    assert value(ss, "gpu_temperature_celsius", sensor="gpu") == ok("nvmlDeviceGetTemperature/0")
    assert value(ss, "gpu_row_remapper_banks", spare_rows="max") == \
        ok("nvmlDeviceGetRowRemapperHistogram")["max"]


@pytest.mark.parametrize("detail", [frozenset(), frozenset(DETAIL)])
def test_reader_samples_carry_exactly_their_metrics_labels(detail):
    """Samples are served as prepared Samples (no per-sample label check at
    scrape time), so every one must carry exactly its metric's labels."""
    from exporter.gpu.metrics import G
    from exporter.gpu.reader import GpuReader

    fake = fake_backend(PROFILES["p5.48xlarge"], ["gpu-thermal-slowdown"])
    fake.init()
    reader = GpuReader(fake, FAULTY_GPU, detail=detail)
    readings = [reader.read_fast(), reader.read_slow()]
    seen = set()
    for r in readings:
        assert r.ok, r.errors
        for spec, _value, extra in r.samples:
            assert (*G, *extra) == spec.labels, spec.name
            seen.add(spec.name)
    from exporter.catalog import all_specs

    by_collector = {s.name for s in all_specs() if s.collector == "gpu"}
    emitted_by_the_collector = {"gpu_info", "gpu_driver_info", "gpu_devices", "gpu_devices_expected",
                                "gpu_lost", "gpu_read_success"}
    not_on_hopper = {"gpu_retired_pages_total", "gpu_retired_pages_pending",
                     "gpu_fabric_health_problem", "gpu_fabric_info"}  # H100: no health mask, no clique
    opt_in = {s.name for s in all_specs() if s.collector == "gpu" and s.detail.startswith("`gpu.detail`")}
    assert seen == by_collector - emitted_by_the_collector - not_on_hopper - (opt_in if not detail else set())


def test_exporter_scenario_gpu_lost_end_to_end():
    args = ("--simulate", "p5.48xlarge", "--scenario", "gpu-lost", "--collectors", "gpu")
    with running_exporter(*args) as url:
        requests.get(url + "/metrics", timeout=10)  # the first scrape starts NVML (and the fault clock)
        text = _get(url, f'gpu_lost{{gpu="{FAULTY_GPU}"', timeout=0)
        assert value(samples(text), "gpu_lost", gpu=str(FAULTY_GPU)) == 0
        deadline = time.monotonic() + ONSET_S + 10
        while value(samples(text), "gpu_lost", gpu=str(FAULTY_GPU)) == 0 and time.monotonic() < deadline:
            time.sleep(0.3)
            text = requests.get(url + "/metrics", timeout=10).text
    ss = samples(text)
    assert value(ss, "gpu_lost", gpu=str(FAULTY_GPU)) == 1
    assert sum(v for (n, _), v in ss.items() if n == "gpu_read_success") == 7
    assert promtool_check_metrics(text) == ""


def test_packaged_nvml_data_matches_the_test_fixtures():
    """The simulated node and --nvml-latencies use the copies shipped in exporter/data."""
    from exporter.nvml.fake import DATA

    assert (DATA / "nvml_h200.json").read_bytes() == CAPTURE.read_bytes()
    assert (DATA / "nvml_field_cost_h100.json").read_bytes() == \
        (FIXTURES / "nvml" / "timing-h100" / "field_cost.json").read_bytes()


def test_gpu_hung_at_start_does_not_hold_up_the_others():
    fake = fake_backend(PROFILES["p5.48xlarge"])
    fake.hang(2, seconds=HANG_GUARD_S)
    ctx = compose(load(None, {"gpu.read_timeout_seconds": 0.2, "node.instance_type": "p5.48xlarge"}),
                  nvml=NvmlSession(fake, identity_timeout_s=0.3, pool=test_pool()))
    c = GpuCollector(ctx)
    try:
        t = time.monotonic()
        _, ss = run(c, deadline=START_HANG_GUARD_S)  # a hang guard: the GPU's deadlines bound it
        assert time.monotonic() - t < DEADLINE_MARGIN_S
        assert value(ss, "gpu_health_exporter_collector_success", collector="gpu") == 1
        assert value(ss, "gpu_read_success", gpu="2", uuid="") == 0
        assert sum(v for (n, _), v in ss.items() if n == "gpu_read_success") == 7
    finally:
        fake.release()
    # the released identity call returns on its own thread: GPU 2 is read once it has
    wait_for(lambda: value(run(c)[1], "gpu_read_success", gpu="2") == 1, what="GPU 2 read after release")
    _, ss = run(c)
    assert value(ss, "gpu_read_success", gpu="2") == 1
    uuid = fake.call(2, "nvmlDeviceGetUUID")
    assert value(ss, "gpu_temperature_celsius", gpu="2", uuid=uuid, sensor="gpu") > 0
    assert ctx.nvml.by_uuid(uuid).index == 2


def test_many_slow_gpus_still_end_the_scrape_in_time():
    fake, _, c = sim(read_timeout_seconds=0.5, timeout_seconds=1.0)
    run(c)
    for i in range(8):
        fake.slow_down(i, 0.03)  # ~0.45 s per GPU read: each under its deadline, 8 of them are not
    # The scrape's deadline is a hang guard; the collector's own 1 s budget is what ends it: it
    # succeeds with the last GPU unread (without the budget all eight would be read, in ~3.6 s).
    _, ss = run(c, deadline=START_HANG_GUARD_S)
    assert value(ss, "gpu_health_exporter_collector_success", collector="gpu") == 1
    assert value(ss, "gpu_read_success", gpu="0") == 1
    assert value(ss, "gpu_read_success", gpu="7") == 0
    for i in range(8):
        fake.slow_down(i, 0.0)
