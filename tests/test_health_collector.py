"""The verdict (health collector) as a derived collector: it gets the GPU collector's reading of
the same collection from the runner, whatever state the GPU collector is in."""

import pytest

from exporter.collectors.gpu import GpuCollector
from exporter.collectors.health import HealthCollector
from exporter.nvml.session import NvmlSession
from exporter.profiles import PROFILES
from exporter.runner import Runner
from exporter.simulate.nvml import fake_backend
from exporter.simulate.nvml_scenarios import FAULTY_GPU, ONSET_S
from tests.helpers import samples, scrape, value
from tests.test_xid_service import make_ctx

F = str(FAULTY_GPU)


def p5(tmp_path, scenarios=()):
    fake = fake_backend(PROFILES["p5.48xlarge"], scenarios)
    fake.advance_to(0)
    ctx = make_ctx(tmp_path, "", nvml=NvmlSession(fake))
    return fake, ctx


@pytest.mark.parametrize(("scenario", "metric", "reason", "verdict"), [
    ("gpu-lost", "gpu_lost", "gpu_lost", "reboot_required"),
    ("gpu-ecc-dbe", "gpu_row_remap_pending", "row_remap_pending", "reset_required"),
])
def test_a_fault_read_in_this_collection_is_in_this_collection_s_verdict(tmp_path, scenario, metric,
                                                                         reason, verdict):
    fake, ctx = p5(tmp_path, [scenario])
    runner = Runner([HealthCollector(ctx), GpuCollector(ctx)], deadline_s=5)
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
    runner = Runner([GpuCollector(ctx), HealthCollector(ctx)], deadline_s=5)
    s = samples(scrape(runner))
    assert value(s, "gpu_health_exporter_collector_success", collector="gpu") == 0
    assert value(s, "gpu_health_exporter_collector_success", collector="health") == 1
    assert value(s, "gpu_node_health_reason", reason="nvml_unavailable") == 1
    assert value(s, "gpu_node_health_verdict", verdict="degraded") == 1
    runner.close()


def test_without_a_gpu_collector_the_verdict_lists_nvml_s_gpus(tmp_path):
    _, ctx = p5(tmp_path)
    runner = Runner([HealthCollector(ctx)], deadline_s=5)
    s = samples(scrape(runner))
    healthy = [dict(ls)["gpu"] for (n, ls), v in s.items()
               if n == "gpu_health_verdict" and dict(ls)["verdict"] == "healthy" and v == 1]
    assert sorted(healthy) == [str(i) for i in range(8)]
    assert value(s, "gpu_node_health_verdict", verdict="healthy") == 1
    assert runner.readings["health"].gpu_count is None  # no GPU reading: count not known
    runner.close()
