"""The verdict (health collector) as a derived collector: it gets the GPU collector's reading of
the same collection from the runner, whatever state the GPU collector is in."""

import pytest

from exporter.collectors.gpu import GpuCollector, GpuSection
from exporter.collectors.health import HealthCollector, HealthSection
from exporter.nvml.session import NvmlSession
from exporter.profiles import PROFILES
from exporter.runner import Runner
from exporter.tools.simulate.nvml import fake_backend
from exporter.tools.simulate.nvml_scenarios import FAULTY_GPU, ONSET_S
from tests.helpers import START_HANG_GUARD_S, samples, scrape, test_pool, value
from tests.test_xid_service import make_ctx

F = str(FAULTY_GPU)


def p5(tmp_path, scenarios=()):
    fake = fake_backend(PROFILES["p5.48xlarge"], scenarios)
    fake.advance_to(0)
    ctx = make_ctx(tmp_path, "", nvml=NvmlSession(fake, pool=test_pool()))
    return fake, ctx


@pytest.mark.parametrize(("scenario", "metric", "reason", "verdict"), [
    ("gpu-lost", "gpu_lost", "gpu_lost", "reboot_required"),
    ("gpu-ecc-dbe", "gpu_row_remap_pending", "row_remap_pending", "reset_required"),
])
def test_a_fault_read_in_this_collection_is_in_this_collection_s_verdict(tmp_path, scenario, metric,
                                                                         reason, verdict):
    fake, ctx = p5(tmp_path, [scenario])
    runner = Runner([HealthCollector(ctx), GpuCollector(ctx)], deadline_s=5, pool=test_pool())
    s = samples(scrape(runner))
    assert value(s, metric, gpu=F) == 0 and value(s, "gpu_health_verdict", gpu=F, verdict="healthy") == 1
    fake.advance_to(ONSET_S + 1)
    s = samples(scrape(runner))  # the first collection that reads the fault
    assert value(s, metric, gpu=F) == 1
    assert value(s, "gpu_health_reason", gpu=F, reason=reason) == 1
    assert value(s, "gpu_health_verdict", gpu=F, verdict=verdict) == 1
    assert value(s, "gpu_health_verdict", gpu="0", verdict="healthy") == 1
    assert runner.readings["health"].gpus[FAULTY_GPU].verdict == verdict
    runner.close()


def test_failed_gpu_collector_hands_the_verdict_nvml_unavailable(tmp_path):
    ctx = make_ctx(tmp_path, "")  # NVML init fails
    runner = Runner([GpuCollector(ctx), HealthCollector(ctx)], deadline_s=5, pool=test_pool())
    s = samples(scrape(runner))
    assert value(s, "gpu_health_exporter_collector_success", collector="gpu") == 0
    assert value(s, "gpu_health_exporter_collector_success", collector="health") == 1
    assert value(s, "gpu_node_health_reason", reason="nvml_unavailable") == 1
    assert value(s, "gpu_node_health_verdict", verdict="unknown") == 1  # never healthy, nor merely degraded
    runner.close()


def test_without_a_gpu_collector_the_verdict_lists_nvml_s_gpus(tmp_path):
    _, ctx = p5(tmp_path)
    runner = Runner([HealthCollector(ctx)], deadline_s=5, pool=test_pool())
    s = samples(scrape(runner))
    healthy = [dict(ls)["gpu"] for (n, ls), v in s.items()
               if n == "gpu_health_verdict" and dict(ls)["verdict"] == "healthy" and v == 1]
    assert sorted(healthy) == [str(i) for i in range(8)]
    assert value(s, "gpu_node_health_verdict", verdict="healthy") == 1
    assert runner.readings["health"].gpu_count is None  # no GPU reading: count not known
    runner.close()


# --- a GPU that does not answer: never healthy -------------------------------------------------

def _hung(tmp_path, unresponsive_s):
    fake, ctx = p5(tmp_path)
    ctx.config.section(HealthSection).unresponsive_seconds = unresponsive_s
    ctx.config.section(GpuSection).read_timeout_seconds = 0.3
    runner = Runner([HealthCollector(ctx), GpuCollector(ctx)], deadline_s=5, pool=test_pool())
    s = samples(scrape(runner))  # NVML opened and every GPU read once: healthy
    assert _gpu(s, gpu=F) == {"healthy"}
    return fake, ctx, runner


def _gpu(s, **want):
    return {dict(ls)["verdict"] for (n, ls), v in s.items()
            if n == "gpu_health_verdict" and v == 1 and dict(ls)["gpu"] == want["gpu"]}


def test_a_gpu_that_hangs_once_is_unknown_for_that_collection_then_healthy(tmp_path):
    fake, ctx, runner = _hung(tmp_path, 60.0)
    fake.hang(FAULTY_GPU, seconds=0.6)  # one stall, shorter than a scrape interval
    s = samples(scrape(runner))
    assert value(s, "gpu_read_success", gpu=F) == 0
    assert _gpu(s, gpu=F) == {"unknown"}  # never healthy beside gpu_read_success 0
    assert value(s, "gpu_health_reason", gpu=F, reason="gpu_not_answering") == 1
    assert value(s, "gpu_node_health_verdict", verdict="unknown") == 1
    assert _gpu(s, gpu="0") == {"healthy"}  # the GPUs that answered keep their own verdict
    fake.release()
    wait = samples(scrape(runner))
    for _ in range(20):  # the stuck call returns; the GPU is read again
        if value(wait, "gpu_read_success", gpu=F) == 1:
            break
        wait = samples(scrape(runner))
    assert _gpu(wait, gpu=F) == {"healthy"}
    assert value(wait, "gpu_node_health_verdict", verdict="healthy") == 1
    runner.close()


def test_a_gpu_that_hangs_for_good_escalates_to_reboot_required(tmp_path):
    import time

    fake, ctx, runner = _hung(tmp_path, 1.0)
    fake.hang(FAULTY_GPU, seconds=600)
    try:
        s = samples(scrape(runner))
        assert _gpu(s, gpu=F) == {"unknown"}
        deadline = time.monotonic() + START_HANG_GUARD_S
        while _gpu(s, gpu=F) != {"reboot_required"} and time.monotonic() < deadline:
            s = samples(scrape(runner))
        assert _gpu(s, gpu=F) == {"reboot_required"}
        assert value(s, "gpu_health_reason", gpu=F, reason="gpu_unresponsive") == 1
        assert value(s, "gpu_node_health_reason", reason="gpu_unresponsive") == 1
        assert value(s, "gpu_node_health_verdict", verdict="reboot_required") == 1
    finally:
        fake.release()
        runner.close()


def test_a_gpu_that_hangs_then_answers_again_is_healthy_again(tmp_path):
    import time

    fake, ctx, runner = _hung(tmp_path, 0.5)
    fake.hang(FAULTY_GPU, seconds=600)
    s = samples(scrape(runner))
    deadline = time.monotonic() + START_HANG_GUARD_S
    while _gpu(s, gpu=F) != {"reboot_required"} and time.monotonic() < deadline:
        s = samples(scrape(runner))
    assert _gpu(s, gpu=F) == {"reboot_required"}
    fake.release()
    deadline = time.monotonic() + START_HANG_GUARD_S
    while _gpu(s, gpu=F) != {"healthy"} and time.monotonic() < deadline:
        s = samples(scrape(runner))
    assert _gpu(s, gpu=F) == {"healthy"} and value(s, "gpu_read_success", gpu=F) == 1
    assert value(s, "gpu_node_health_verdict", verdict="healthy") == 1
    runner.close()


def test_a_gpu_whose_health_reads_fail_is_unknown(tmp_path):
    from exporter.nvml.backend import NVML_ERROR_UNKNOWN

    fake, ctx = p5(tmp_path)
    fake.fail(FAULTY_GPU, "nvmlDeviceGetFieldValues", NVML_ERROR_UNKNOWN)
    runner = Runner([HealthCollector(ctx), GpuCollector(ctx)], deadline_s=5, pool=test_pool())
    s = samples(scrape(runner))
    assert value(s, "gpu_read_success", gpu=F) == 0
    assert _gpu(s, gpu=F) == {"unknown"}
    assert value(s, "gpu_health_reason", gpu=F, reason="gpu_not_read") == 1
    runner.close()
