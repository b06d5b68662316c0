"""The daemon's side of the active checks: the `active` collector exports the result files and
the verdict uses the valid ones (a DCGM failure by its category, bandwidth as degraded, an
expired result as absent)."""

import time

import pytest

from exporter.activecheck import findings, result
from exporter.activecheck.result import CheckResult, Finding
from exporter.collectors.active import ActiveCollector
from exporter.collectors.gpu import GpuCollector
from exporter.collectors.health import HealthCollector
from exporter.nvml.session import NvmlSession
from exporter.profiles import PROFILES
from exporter.runner import Runner
from exporter.tools.simulate.nvml import fake_backend
from exporter.xid.verdict import ALL_REASONS, RUNBOOK, ActiveReasons, GpuInput, judge
from tests.helpers import samples, scrape, test_pool, value
from tests.test_xid_service import make_ctx

DAY = 86400.0


def p5(tmp_path):
    fake = fake_backend(PROFILES["p5.48xlarge"], ())
    fake.advance_to(0)
    ctx = make_ctx(tmp_path, "", nvml=NvmlSession(fake, pool=test_pool()))
    runner = Runner([GpuCollector(ctx), ActiveCollector(ctx), HealthCollector(ctx)], deadline_s=5,
                    pool=test_pool())
    return ctx, runner


def put(ctx, r: CheckResult, age_s: float = 10.0) -> None:
    now = time.time()
    r.started_at, r.finished_at = now - age_s - 5, now - age_s
    r.valid_for_s = r.valid_for_s or DAY
    result.write(ctx.paths.state_dir, r)


def dcgm_fail(gpu: str, category: str, isolate: bool = False) -> CheckResult:
    f = Finding(gpu, "t", "fail", category, [11], isolate)
    return CheckResult("dcgm", "fail", "failed", findings=[f])


def node_reasons(s):
    return {dict(k)["reason"] for (n, k), v in s.items() if n == "gpu_node_health_reason" and v == 1}


def test_nothing_on_record_exports_nothing_and_changes_nothing(tmp_path):
    _, runner = p5(tmp_path)
    s = samples(scrape(runner))
    assert not any(n.startswith("gpu_health_active_") for n, _ in s)
    assert value(s, "gpu_node_health_verdict", verdict="healthy") == 1
    runner.close()


@pytest.mark.parametrize(("category", "isolate", "reason", "verdict"), [
    ("Hardware", False, "active_dcgm_hardware", "replace_required"),
    ("Deployment", True, "active_dcgm_hardware", "replace_required"),  # ISOLATE severity
    ("Integration", False, "active_dcgm_integration", "reboot_required"),
    ("Deployment", False, "active_dcgm_other", "degraded"),
    ("Performance", False, "active_dcgm_other", "degraded"),
])
def test_a_dcgm_failure_counts_as_its_category_says(tmp_path, category, isolate, reason, verdict):
    ctx, runner = p5(tmp_path)
    put(ctx, dcgm_fail("3", category, isolate))
    s = samples(scrape(runner))
    assert value(s, "gpu_health_reason", gpu="3", reason=reason) == 1
    assert value(s, "gpu_health_verdict", gpu="3", verdict=verdict) == 1
    assert value(s, "gpu_health_verdict", gpu="0", verdict="healthy") == 1
    assert value(s, "gpu_node_health_verdict", verdict=verdict) == 1
    assert value(s, "gpu_health_active_check_result", check="dcgm", result="fail") == 1
    assert value(s, "gpu_health_active_check_result", check="dcgm", result="pass") == 0
    assert value(s, "gpu_health_active_check_gpu_result", check="dcgm", gpu="3", result="fail") == 1
    runner.close()


def test_bandwidth_under_expected_is_degraded_never_replace(tmp_path):
    ctx, runner = p5(tmp_path)
    put(ctx, CheckResult("nccl", "fail", "busbw under", findings=[Finding("", "bus_bandwidth", "fail")],
                         measurements={"bus_bandwidth_bytes_per_second": 3.0e11, "size_bytes": 16 * 2**30,
                                       "nodes": 1, "expected_bus_bandwidth_bytes_per_second": 4.6e11}))
    s = samples(scrape(runner))
    assert node_reasons(s) == {"active_nccl_bandwidth"}
    assert value(s, "gpu_node_health_verdict", verdict="degraded") == 1
    labels = dict(size_bytes=str(16 * 2**30), nodes="1")
    assert value(s, "gpu_health_active_nccl_bus_bandwidth_bytes_per_second", **labels) == 3.0e11
    assert value(s, "gpu_health_active_nccl_expected_bus_bandwidth_bytes_per_second", **labels) == 4.6e11
    runner.close()


def test_transitions_fail_then_pass_then_fail_expired(tmp_path):
    ctx, runner = p5(tmp_path)
    put(ctx, dcgm_fail("1", "Hardware"))
    s = samples(scrape(runner))
    assert value(s, "gpu_node_health_verdict", verdict="replace_required") == 1
    put(ctx, CheckResult("dcgm", "pass", "ok", findings=[Finding("1", "memory", "pass", "Hardware")]))
    s = samples(scrape(runner))
    assert value(s, "gpu_node_health_verdict", verdict="healthy") == 1
    assert value(s, "gpu_health_active_check_result", check="dcgm", result="pass") == 1
    last_pass = value(s, "gpu_health_active_check_last_pass_timestamp_seconds", check="dcgm")
    expired = dcgm_fail("1", "Hardware")
    expired.valid_for_s = 60.0
    put(ctx, expired, age_s=120.0)  # failed, but longer ago than it counts for
    s = samples(scrape(runner))
    assert value(s, "gpu_node_health_verdict", verdict="healthy") == 1  # absent, not a fault...
    assert ("gpu_health_active_check_result", frozenset({("check", "dcgm"), ("result", "pass")})) not in s
    assert value(s, "gpu_health_active_check_valid", check="dcgm") == 0  # ...and not a pass either
    assert value(s, "gpu_health_active_check_age_seconds", check="dcgm") >= 120
    assert value(s, "gpu_health_active_check_last_pass_timestamp_seconds", check="dcgm") == last_pass
    runner.close()


def test_an_expired_pass_is_not_healthy_evidence(tmp_path):
    now = time.time()
    old_pass = CheckResult("dcgm", "pass", finished_at=now - 2 * DAY, valid_for_s=DAY)
    assert findings.reasons([old_pass], now) == ActiveReasons()
    ctx, runner = p5(tmp_path)
    put(ctx, old_pass, age_s=2 * DAY)
    s = samples(scrape(runner))
    assert value(s, "gpu_health_active_check_valid", check="dcgm") == 0
    assert not any(n == "gpu_health_active_check_result" for n, _ in s)
    runner.close()


def test_a_failure_on_a_gpu_nvml_does_not_list_is_the_node_s(tmp_path):
    gpus = [GpuInput("0", "GPU-a", "00000000:53:00.0", None, [])]
    nv = judge(gpus, None, None, active=ActiveReasons({"7": frozenset({"active_dcgm_hardware"})}))
    assert nv.verdict == "replace_required" and nv.reasons == ["active_dcgm_hardware"]
    assert nv.gpus[0].verdict == "healthy"


def test_skip_timeout_error_and_warn_add_no_reason():
    now = time.time()
    rs = [CheckResult(c, res, finished_at=now, findings=[Finding("0", "t", "warn", "Hardware")])
          for c, res in (("dcgm", "warn"), ("nccl", "timeout"), ("efa", "error"), ("nvml", "skip"))]
    assert findings.level(findings.reasons(rs, now)) == "healthy"


def test_an_unreadable_result_file_is_reported_not_fatal(tmp_path):
    ctx, runner = p5(tmp_path)
    d = tmp_path / "state" / "active"
    d.mkdir(parents=True)
    (d / "nccl.json").write_text("{not json")
    s = samples(scrape(runner))
    assert value(s, "gpu_health_exporter_active_result_read_success", check="nccl") == 0
    assert value(s, "gpu_health_exporter_collector_success", collector="active") == 1
    assert value(s, "gpu_node_health_verdict", verdict="healthy") == 1
    runner.close()


def test_every_active_reason_has_a_level_and_a_runbook():
    for r in ("active_dcgm_hardware", "active_dcgm_integration", "active_dcgm_other", "active_nvml",
              "active_nccl_bandwidth", "active_nccl_failed", "active_efa"):
        assert r in ALL_REASONS and RUNBOOK[r] == "GpuActiveCheckFailed"
    assert ALL_REASONS["active_nccl_bandwidth"] == "degraded"
