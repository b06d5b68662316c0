"""GPU activity from NVML GPM: the interval arithmetic, the per-GPU reader against the fake
NVML (support, MIG, a profiler holding the counters, failures, a GPU lost and back), and the
simulated nodes end to end (a p5 measured and busy, a p4d not measured and saying why)."""

from __future__ import annotations

import ctypes
import logging
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.collectors import collector_classes
from exporter.config import load
from exporter.gpu.activity import MIB, ActivityCounters
from exporter.gpu.gpm import GpmReader
from exporter.gpu.reader import GpuReader, Reading
from exporter.nvml import backend as nv
from exporter.profiles import PROFILES
from exporter.runner import Runner
from exporter.tools.simulate.nvml import fake_backend
from exporter.tools.simulate.nvml_scenarios import FAULTY_GPU, IDLE_UTIL
from exporter.tools.simulate.nvml_synth import TRAINING_LEVELS, activity_levels
from exporter.web.landing import summarise
from tests.helpers import promtool_check_metrics, samples, scrape, test_pool, value

collector_classes()  # declares the config sections
from exporter.collectors.gpu import GpuCollector  # noqa: E402
from exporter.compose import compose  # noqa: E402
from exporter.nvml.session import NvmlSession  # noqa: E402

SM, OCC, TENSOR, DRAM = nv.GPM_SM_UTIL, nv.GPM_SM_OCCUPANCY, nv.GPM_ANY_TENSOR_UTIL, nv.GPM_DRAM_BW_UTIL
NVLINK_TX = nv.GPM_NVLINK_TOTAL_TX_PER_SEC
DEFAULT_SET = ("gpu_sm_active_seconds_total", "gpu_sm_occupancy_seconds_total",
               "gpu_tensor_active_seconds_total", "gpu_dram_active_seconds_total")


# --- the interval arithmetic ------------------------------------------------------------------

def counters() -> ActivityCounters:
    return ActivityCounters([SM, TENSOR], [NVLINK_TX])


def test_first_sample_is_a_baseline_and_counts_nothing():
    c = counters()
    assert not c.add(100.0, {SM: 80.0})
    assert c.totals == {SM: 0.0, TENSOR: 0.0, NVLINK_TX: 0.0}
    assert c.add(110.0, {SM: 80.0, TENSOR: 25.0, NVLINK_TX: 2.0})
    assert c.totals[SM] == 8.0 and c.totals[TENSOR] == 2.5
    assert c.totals[NVLINK_TX] == 2.0 * MIB * 10


def test_a_gpu_reset_between_samples_drops_the_interval_and_rebaselines():
    c = counters()
    c.start(0.0)
    c.add(10.0, {SM: 50.0, TENSOR: 10.0})
    before = dict(c.totals)
    # counters reset under the samples: NVML's difference is negative or past 100 %
    assert not c.add(20.0, {SM: -3.0e6, TENSOR: 10.0})
    assert not c.add(30.0, {SM: 50.0, TENSOR: 4.0e9})
    assert not c.add(40.0, {SM: math.nan})
    assert c.totals == before and c.dropped == 3
    assert c.baseline == 40.0  # the later sample is the next baseline
    assert c.add(50.0, {SM: 100.4, TENSOR: -0.2})  # rounding past the ends is clamped, not dropped
    assert c.totals[SM] == before[SM] + 10.0 and c.totals[TENSOR] == before[TENSOR]


def test_a_clock_that_does_not_advance_counts_nothing():
    c = counters()
    c.start(5.0)
    assert not c.add(5.0, {SM: 90.0})
    assert not c.add(4.0, {SM: 90.0})
    assert c.totals[SM] == 0.0


def test_a_long_gap_counts_whole_at_its_average():
    c = counters()
    c.start(0.0)
    c.add(15.0, {SM: 60.0})
    c.add(15.0 + 3600.0, {SM: 20.0})  # an hour without a scrape: the hour's average
    assert c.totals[SM] == 9.0 + 720.0


def test_a_metric_nvml_could_not_compute_counts_nothing_for_it_only():
    c = counters()
    c.start(0.0)
    assert c.add(10.0, {SM: None, TENSOR: 30.0})
    assert c.totals[SM] == 0.0 and c.totals[TENSOR] == 3.0


def test_a_gpu_lost_and_back_keeps_its_totals_and_starts_a_new_baseline():
    c = counters()
    c.start(0.0)
    c.add(10.0, {SM: 50.0})
    c.forget()
    assert not c.add(500.0, {SM: 50.0})  # the first sample after the loss: a baseline only
    assert c.totals[SM] == 5.0
    assert c.add(510.0, {SM: 50.0})
    assert c.totals[SM] == 10.0


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(st.tuples(st.floats(-1.0, 400.0),
                          st.one_of(st.none(), st.just(math.nan), st.floats(-1e9, 1e9))), max_size=30))
def test_counters_never_decrease_and_never_outrun_the_clock(steps):
    c = counters()
    t = 0.0
    c.start(t)
    for dt, v in steps:
        before = c.totals[SM]
        t += dt
        c.add(t, {SM: v})
        assert c.totals[SM] >= before
        assert c.totals[SM] <= max(t, 0.0) + 1e-9  # seconds of activity within the seconds elapsed


# --- the reader against the fake NVML --------------------------------------------------------

def gpm(profile: str = "p5.48xlarge", scenarios=(), index: int = 0, detail=frozenset()):
    fake = fake_backend(PROFILES[profile], scenarios)
    fake.init()
    fake.advance_to(0.0)
    return fake, GpmReader(fake, index, detail)


def read(reader: GpmReader) -> Reading:
    r = Reading(labels={"gpu": "0", "uuid": "GPU-x", "pci_bus_id": "0"})
    reader.read(r)
    return r


def metric(r: Reading, name: str) -> float | None:
    hits = [v for spec, v, _ in r.samples if spec.name == name]
    return hits[0] if hits else None


def test_the_first_collection_exports_zero_then_the_interval():
    fake, reader = gpm()
    r = read(reader)
    assert r.activity == "measured"
    assert [metric(r, n) for n in DEFAULT_SET] == [0.0, 0.0, 0.0, 0.0]
    fake.advance_to(15.0)
    r = read(reader)
    levels = fake.gpm_levels(0)
    assert math.isclose(metric(r, "gpu_sm_active_seconds_total"), levels[SM] / 100 * 15)
    assert math.isclose(metric(r, "gpu_tensor_active_seconds_total"), levels[TENSOR] / 100 * 15)
    assert metric(r, "gpu_pipe_active_seconds_total") is None  # opt-in
    assert metric(r, "gpu_activity_measured") == 1


def test_a_sample_that_fails_once_loses_nothing():
    fake, reader = gpm()
    read(reader)
    fake.advance_to(10.0)
    read(reader)
    fake.fail(0, "nvmlGpmSampleGet", nv.NVML_ERROR_UNKNOWN)
    fake.advance_to(20.0)
    r = read(reader)
    assert r.activity == "sample_failed" and metric(r, "gpu_activity_measured") == 0
    assert metric(r, "gpu_sm_active_seconds_total") is not None  # still served, unchanged
    fake.fail(0, "nvmlGpmSampleGet", 0)
    fake.advance_to(30.0)
    r = read(reader)
    assert r.activity == "measured"
    assert math.isclose(metric(r, "gpu_sm_active_seconds_total"), fake.gpm_levels(0)[SM] / 100 * 30)


def test_activity_follows_the_levels_over_the_interval():
    fake, reader = gpm()
    read(reader)
    fake.advance_to(10.0)
    fake.set_gpm_levels(0, {SM: 0.0})
    fake.advance_to(20.0)
    r = read(reader)
    assert math.isclose(metric(r, "gpu_sm_active_seconds_total"), TRAINING_LEVELS[SM] / 100 * 10,
                        rel_tol=0.02)


def test_a_gpu_lost_and_back_continues_its_counters():
    fake = fake_backend(PROFILES["p5.48xlarge"])
    fake.init()
    fake.advance_to(0.0)
    reader = GpuReader(fake, 0)
    reader.read_fast()
    fake.advance_to(10.0)
    before = metric(reader.read_fast(), "gpu_sm_active_seconds_total")
    fake.lose(0)
    fake.advance_to(100.0)
    try:
        reader.read_fast()
        raise AssertionError("a lost GPU must raise")
    except nv.NvmlError as e:
        assert e.gpu_lost
    fake.restore(0)
    fake.advance_to(200.0)
    assert metric(reader.read_fast(), "gpu_sm_active_seconds_total") == before  # a new baseline
    fake.advance_to(210.0)
    after = metric(reader.read_fast(), "gpu_sm_active_seconds_total")
    assert math.isclose(after - before, fake.gpm_levels(0)[SM] / 100 * 10)


def test_a100_is_not_supported_without_sampling():
    fake, reader = gpm("p4d.24xlarge")
    calls = fake.calls_made
    r = read(reader)
    assert r.activity == "gpu_not_supported"
    assert metric(r, "gpu_sm_active_seconds_total") is None
    assert metric(r, "gpu_activity_measured") == 0
    fake.advance_to(10.0)
    read(reader)
    assert fake.calls_made == calls + 1  # one support query; not asked again every collection


def test_mig_mode_profiler_and_an_old_driver_say_why():
    _, reader = gpm(scenarios=["gpu-mig-mode"], index=FAULTY_GPU)
    assert read(reader).activity == "mig_mode"
    fake, reader = gpm(scenarios=["gpu-gpm-in-use"], index=FAULTY_GPU)
    r = read(reader)
    assert r.activity == "counters_in_use" and "In use" in r.activity_error
    assert metric(r, "gpu_sm_active_seconds_total") is None
    fake.fail(FAULTY_GPU, "nvmlGpmSampleGet", 0)  # the profiler lets go: measured at the next collection
    fake.advance_to(5.0)
    assert read(reader).activity == "measured"
    fake, reader = gpm()
    del fake.devices[0]["nvmlGpmQueryDeviceSupport"]  # a driver (or capture) without GPM
    assert read(reader).activity == "driver_too_old"


def test_mig_enabled_while_running_says_so_at_once():
    fake, reader = gpm()
    assert read(reader).activity == "measured"
    fake.set_value(0, "nvmlDeviceGetMigMode", [1, 1])  # enabled, and the GPU reset
    fake.fail(0, "nvmlGpmSampleGet", nv.NVML_ERROR_NOT_SUPPORTED)
    fake.advance_to(5.0)
    r = read(reader)
    assert r.activity == "mig_mode" and metric(r, "gpu_sm_active_seconds_total") is None
    assert metric(r, "gpu_activity_measured") == 0


def test_detail_adds_the_pipes_and_the_traffic():
    fake, reader = gpm(detail=frozenset(["activity_pipes", "activity_traffic"]))
    read(reader)
    fake.advance_to(2.0)
    r = read(reader)
    pipes = {extra["pipe"] for spec, _, extra in r.samples if spec.name == "gpu_pipe_active_seconds_total"}
    assert pipes == {"fp16", "fp32", "fp64"}
    nvlink = [v for spec, v, extra in r.samples if spec.name == "gpu_nvlink_bytes_total"]
    assert len(nvlink) == 2 and min(nvlink) > 0


# --- the collector and the simulated nodes ------------------------------------------------------

def node(profile: str, scenarios=()) -> tuple:
    fake = fake_backend(PROFILES[profile], scenarios)
    ctx = compose(load(None, {"node.instance_type": profile}), nvml=NvmlSession(fake, pool=test_pool()))
    c = GpuCollector(ctx)
    fake.init()
    fake.advance_to(0.0)
    return fake, c, Runner([c], deadline_s=5.0, pool=test_pool())


def test_simulated_p5_is_busy_training_with_ratios_in_0_1_and_clean_exposition():
    fake, _, runner = node("p5.48xlarge")
    first = samples(scrape(runner))
    fake.advance_to(15.0)
    text = scrape(runner)
    assert promtool_check_metrics(text) == ""
    second = samples(text)
    for gpu in map(str, range(8)):
        for name in DEFAULT_SET:
            assert value(first, name, gpu=gpu) == 0.0
            ratio = (value(second, name, gpu=gpu) - value(first, name, gpu=gpu)) / 15.0
            assert 0.0 <= ratio <= 1.0, (name, gpu, ratio)
        assert (value(second, "gpu_sm_active_seconds_total", gpu=gpu) / 15.0) > 0.5  # visibly busy
        assert value(second, "gpu_activity_measured", gpu=gpu, reason="measured") == 1
    series = sum(1 for (n, _) in second if n in DEFAULT_SET)
    assert series == 32


def test_idle_allocation_is_near_zero_with_memory_held():
    fake, _, runner = node("p5.48xlarge", ["gpu-idle-allocation"])
    first = samples(scrape(runner))
    fake.advance_to(60.0)
    second = samples(scrape(runner))
    for gpu in map(str, range(8)):
        ratio = (value(second, "gpu_sm_active_seconds_total", gpu=gpu)
                 - value(first, "gpu_sm_active_seconds_total", gpu=gpu)) / 60.0
        assert ratio < 0.05
        assert math.isclose(ratio, activity_levels(IDLE_UTIL)[SM] / 100, rel_tol=1e-3)
        used = value(second, "gpu_memory_used_bytes", gpu=gpu)
        assert used > 0.5 * value(second, "gpu_memory_total_bytes", gpu=gpu)


def test_simulated_p4d_exports_no_activity_and_says_why(caplog):
    fake, _, runner = node("p4d.24xlarge")
    with caplog.at_level(logging.INFO, logger="exporter.gpu"):
        for t in (0.0, 15.0, 30.0):
            fake.advance_to(t)
            text = scrape(runner)
    assert promtool_check_metrics(text) == ""
    ss = samples(text)
    assert not any(n in DEFAULT_SET for n, _ in ss)
    for gpu in map(str, range(8)):
        assert value(ss, "gpu_activity_measured", gpu=gpu, reason="gpu_not_supported") == 0
    assert value(ss, "gpu_read_success", gpu="0") == 1  # the rest of the GPU reading goes on
    logged = [r.getMessage() for r in caplog.records if "activity" in r.getMessage()]
    assert len(logged) == 8 and all("no GPM" in m for m in logged)  # once per GPU, not per scrape
    problems = summarise(runner.collect(), None).problems["gpu"]
    assert any("activity not measured (gpu_not_supported)" in p for p in problems), problems


def test_the_pynvml_backend_fills_and_reads_the_binding_structs():
    """The real backend against nvidia-ml-py's own structs (no GPU here): the request it builds for
    nvmlGpmMetricsGet, each metric's return code and value read back, the support flag, and a
    binding without GPM answering Function Not Found (driver_too_old)."""
    import types

    import pynvml

    from exporter.nvml.backend import GpmValue
    from exporter.nvml.pynvml_backend import PynvmlBackend

    seen = {}

    def metrics_get(req):  # what libnvidia-ml does with the request
        seen.update(version=req.version, n=req.numMetrics)
        for i in range(req.numMetrics):
            req.metrics[i].value = 10.0 * req.metrics[i].metricId
        req.metrics[1].nvmlReturn = nv.NVML_ERROR_NOT_SUPPORTED
        return req

    def support(handle):
        s = pynvml.c_nvmlGpmSupport_t()
        s.isSupportedDevice = 1
        return s

    binding = types.SimpleNamespace(
        NVMLError=pynvml.NVMLError, c_nvmlGpmMetricsGet_t=pynvml.c_nvmlGpmMetricsGet_t,
        NVML_GPM_METRICS_GET_VERSION=pynvml.NVML_GPM_METRICS_GET_VERSION, nvmlGpmMetricsGet=metrics_get,
        nvmlGpmQueryDeviceSupport=support, nvmlDeviceGetHandleByIndex=lambda i: ctypes.c_void_p(0x1000 + i))
    b = PynvmlBackend()
    b._nvml = binding
    s1, s2 = pynvml.c_nvmlGpmSample_t(), pynvml.c_nvmlGpmSample_t()
    assert b.gpm_metrics_get(s1, s2, [SM, TENSOR, DRAM]) == [
        GpmValue(SM, 0, 20.0), GpmValue(TENSOR, nv.NVML_ERROR_NOT_SUPPORTED, None), GpmValue(DRAM, 0, 100.0)]
    assert seen == {"version": pynvml.NVML_GPM_METRICS_GET_VERSION, "n": 3}
    assert b.gpm_query_device_support(0) is True
    del binding.nvmlGpmQueryDeviceSupport
    try:
        b.gpm_query_device_support(0)
        raise AssertionError("a binding without GPM must answer Function Not Found")
    except nv.NvmlError as e:
        assert e.code == nv.NVML_ERROR_FUNCTION_NOT_FOUND


def test_gpm_on_every_profile_follows_the_gpu_generation():
    """H100, H200 and B200 profiles measure activity; the A100 profiles answer as an A100 does."""
    for name, profile in PROFILES.items():
        fake, reader = gpm(name)
        want = "gpu_not_supported" if "A100" in profile.gpu_model else "measured"
        assert read(reader).activity == want, name
