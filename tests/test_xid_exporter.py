"""The daemon end to end on a simulated node: scenario records appended to the followed kernel
log after start show up in /metrics with their verdict, NVML + kernel log count once, and the
scrape passes promtool."""

import time

import requests

from tests.helpers import START_HANG_GUARD_S, promtool_check_metrics, running_exporter, samples, value


def test_live_xids_and_verdict_on_a_simulated_node():
    args = ["--simulate", "p5.48xlarge", "--scenario", "xid-13-flood", "--scenario", "xid-79-bus-loss",
            "--scenario", "gpu-row-remap-pending", "--scenario", "xid-31-backlog"]
    with running_exporter(*args) as url:
        first = requests.get(url + "/metrics", timeout=10).text
        assert value(first, "gpu_xid_errors_total", gpu="4", xid="31", tier="application") == 1  # backlog
        deadline = time.monotonic() + START_HANG_GUARD_S
        while True:
            text = requests.get(url + "/metrics", timeout=10).text
            s = samples(text)
            names = {(n, dict(ls).get("gpu"), dict(ls).get("xid")) for n, ls in s}
            want = {("gpu_xid_errors_total", "0", "13"), ("gpu_xid_errors_total", "5", "79"),
                    ("gpu_xid_errors_total", "3", "63")}
            if want <= names and value(s, "gpu_health_exporter_xid_reports_total", source="nvml") >= 1:
                break
            assert time.monotonic() < deadline, "scenario XIDs did not show up"
            time.sleep(0.3)
        assert promtool_check_metrics(text) == ""
        assert value(s, "gpu_xid_errors_total", gpu="0", xid="13", tier="application") == 1  # 396 lines
        assert value(s, "gpu_xid_errors_total", gpu="5", xid="79", tier="reboot") == 1  # 5 lines
        assert value(s, "gpu_xid_errors_total", gpu="3", xid="63", tier="replace") == 1  # NVML + kernel
        assert value(s, "gpu_health_verdict", gpu="3", verdict="replace_required") == 1
        assert value(s, "gpu_health_reason", gpu="3", reason="row_remap_pending") == 1
        assert value(s, "gpu_health_verdict", gpu="5", verdict="reboot_required") == 1
        assert value(s, "gpu_health_verdict", gpu="0", verdict="healthy") == 1
        assert value(s, "gpu_node_health_verdict", verdict="replace_required") == 1
        assert value(s, "gpu_health_exporter_collector_success", collector="xid") == 1
        assert value(s, "gpu_health_exporter_nvml_event_watcher_up") == 1
