"""Every panel proven against the real Prometheus: two simulated clusters, a healthy one and a faulty
one, scraped at 1 s with rules/ loaded and `cluster` and `instance` (the node name) attached by
relabelling as a shipped scrape config does. Each panel's queries run with the dashboard variables
substituted per cluster, as Grafana would run them:

- on the faulty cluster every panel returns data, except the few listed in EMPTY_ON_PURPOSE;
- on the healthy cluster no panel shows a series of the faulty cluster, a cluster that does not
  exist shows nothing at all (a selector without the cluster matcher would leak), and one node
  selected shows no other node;
- the lost GPU is in the lost/missing panel within one scrape of Prometheus first seeing it.

Prints, per dashboard, the panels with data on the faulty cluster / panels."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
import requests
import yaml

from dashboards.build import dashboards
from exporter.tools import job_rules
from tests.helpers import ROOT, START_HANG_GUARD_S, served_base, start_listening, stop_all, wait_until_serving
from tests.rules_lint import copy_rules_at_global_interval

pytestmark = pytest.mark.slow

SCRAPE_S = 1
NODES = {  # node name -> (cluster, simulated fault scenarios)
    "healthy-node-1": ("healthy", []),
    "faulty-node-1": ("faulty", ["xid-94", "gpu-lost", "efa-retrans-timeouts", "efa-counters-unreadable",
                                 "lustre-eviction", "sxid-fatal", "gpu-idle-allocation", "slurm-job"]),
    "faulty-node-2": ("faulty", ["gpu-row-remap-pending", "gpu-recovery-action-reboot", "gpu-ecc-sbe-storm",
                                 "lustre-debugfs-missing", "sxid-nonfatal-burst", "gpu-fabric-manager-down",
                                 "ec2-scheduled-reboot", "gpu-thermal-slowdown", "gpu-gpm-in-use"]),
}
LOST = ("faulty-node-1", "3")  # gpu-lost: GPU 3 falls off the bus
# (dashboard, panel title) -> why it may be empty on the faulty cluster. A new panel gets data by
# adding the scenario of its fault to a faulty node above, or is listed here with the reason.
EMPTY_ON_PURPOSE = {
    ("gpu-health-job", "Job alerts firing"): "no job stalls or straggles here (test_job_health_live.py)",
    ("gpu-health-job", "Stragglers now"): "the faulty node's job has no straggler (test_job_health_live.py)",
    ("gpu-health-job", "Throttling and slowdowns"):
        "the thermal slowdown is on faulty-node-2, which runs no job",
    ("gpu-health-fsx", "Imports not connected"):
        "the FSx eviction's import recovers to FULL, and no listed fault keeps one disconnected",
    # The NCCL RAS row reads the nccl collector, off by default and fed by a job's RAS server:
    # tests/test_nccl_live.py serves it to a real Prometheus and names the culprit from it.
    **{("gpu-health-job", panel): "the nccl collector is off (opt-in): test_nccl_live.py"
       for panel in ("NCCL collective progress", "Collectives launched per GPU", "Ranks behind (NCCL RAS)",
                     "The rank the job waits for")},
    # A baseline is the median of the job's last hour, counted after 10 minutes of the job; this
    # test runs a minute. tests/test_job_health_live.py renders the rules with short windows.
    **{("gpu-health-job", panel): "a job's baseline needs 10 minutes of it: test_job_health_live.py"
       for panel in ("Throughput per node against its baseline",
                     "GPUs whose share of the work moved most from their baseline")},
    ("gpu-health-node", "Active checks"):
        "no `active` run wrote results on these nodes (opt-in): tests/test_active_collector.py",
}
# Grafana's $__rate_interval at a 1 s scrape is 4 s; 10 s leaves room for a loaded CI.
RATE_INTERVAL = "10s"


def _start_exporters(tmp_path) -> dict[str, tuple[subprocess.Popen, str]]:
    """Every simulated node at once (each startup imports and builds its node: slow in series)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = {}
    started = {}
    for name, (_, scenarios) in NODES.items():
        args = [sys.executable, "-m", "exporter", "--simulate", "p5.48xlarge",
                "--path.state-dir", str(tmp_path / name), "--listen", "127.0.0.1:0"]
        args += [a for s in scenarios for a in ("--scenario", s)]
        log = tmp_path / f"{name}.log"
        with open(log, "a") as err:
            started[name] = (subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=err), log)
    for name, (proc, log) in started.items():
        base = served_base(log, proc)
        wait_until_serving(f"{base}/metrics", proc, 60, f"exporter {name}")
        out[name] = (proc, base.removeprefix("http://"))
    return out


def _start_prometheus(tmp_path, targets: dict[str, str]) -> tuple[subprocess.Popen, str]:
    rules = tmp_path / "rules"
    copy_rules_at_global_interval(rules)  # every group at the scrape's pace
    # The job-health groups at the scrape's pace (their shipped windows are minutes long).
    (rules / "job.yml").write_text(job_rules.render(job_rules.Settings(
        interval=f"{SCRAPE_S}s", window=RATE_INTERVAL, evidence_window=RATE_INTERVAL, carry="5s")))
    cfg = {
        "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
        "rule_files": [str(rules / "*.yml")],
        "scrape_configs": [{
            "job_name": "gpu-health-exporter",
            # Per target: its cluster, and its node name in a hidden label that relabelling makes
            # `instance` (as service discovery's node name does in the shipped configs).
            "static_configs": [
                {"targets": [addr], "labels": {"cluster": NODES[name][0], "__node_name": name}}
                for name, addr in targets.items()],
            "relabel_configs": [{"source_labels": ["__node_name"], "target_label": "instance"}],
        }],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    proc, port = start_listening(
        [shutil.which("prometheus") or "prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", "--web.listen-address=127.0.0.1:0",
         "--log.level=warn"], tmp_path / "prometheus.log")
    url = f"http://127.0.0.1:{port}"
    wait_until_serving(url + "/-/ready", proc, 60, "prometheus")
    return proc, url + "/api/v1"


def _instant(api: str, expr: str, at: float | None = None) -> list[dict]:
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    r = requests.get(f"{api}/query", params=params, timeout=10)
    body = r.json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def _range(api: str, expr: str, end: float) -> list[dict]:
    r = requests.get(f"{api}/query_range", timeout=10,
                     params={"query": expr, "start": end - 30, "end": end, "step": SCRAPE_S})
    body = r.json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def _substitute(expr: str, cluster: str, instance: str) -> str:
    return (expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__range_s", "3600")
            .replace("$__range", "1h").replace("$cluster", cluster)
            .replace("$instance", instance).replace("$gpu", ".*").replace("$job", ".*"))


def _panels(model: dict) -> list[dict]:
    return [p for p in model["panels"] if p["type"] != "row"]


def _run_panel(api: str, panel: dict, cluster: str, instance: str, now: float) -> list[dict]:
    """Every series the panel's queries return, as Grafana would ask (instant or range)."""
    out = []
    for t in panel["targets"]:
        expr = _substitute(t["expr"], cluster, instance)
        out += _instant(api, expr, now) if t.get("instant") else _range(api, expr, now)
    return out


def _instances(cluster: str) -> list[str]:
    return [n for n, (c, _) in NODES.items() if c == cluster]


def _selections(name: str, cluster: str) -> list[str]:
    """The `instance` values to try: All for the fleet-wide dashboards, each node for the node one."""
    return _instances(cluster) if name == "gpu-health-node" else [".+"]


def _wait_for_faults(api: str) -> None:
    """Until Prometheus has every injected fault and a few rate intervals of samples."""
    wanted = {
        "targets up": 'count(up{job="gpu-health-exporter"} == 1) == 3',
        "GPU lost": 'gpu_lost{instance="faulty-node-1"} == 1',
        "XID 94": 'gpu_xid_errors_total{instance="faulty-node-1", xid="94"}',
        "remap pending": 'gpu_row_remap_pending{instance="faulty-node-2"} == 1',
        "recovery action": 'gpu_recovery_action{instance="faulty-node-2"} == 2',
        "corrected ECC rising": "gpu:gpu_ecc_corrected_errors:rate5m"
                                '{instance="faulty-node-2"} > 0',
        "EFA retransmit timeouts":
            'rate(efa_retrans_timeout_events_total{instance="faulty-node-1"}[10s]) > 0',
        "EFA device down": 'efa_device_up{instance="faulty-node-1"} == 0',
        "FSx eviction": 'lustre_client_import_evictions_total{instance="faulty-node-1"} > 0',
        "Lustre source down": 'lustre_client_source_up{instance="faulty-node-2"} == 0',
        "fatal SXid": 'gpu_nvswitch_sxid_errors_total{instance="faulty-node-1", tier="reboot"}',
        "non-fatal SXids": 'gpu_nvswitch_sxid_errors_total{instance="faulty-node-2", tier="ignore"}',
        "fabric not registered": 'gpu_fabric_state{instance="faulty-node-2", state="in_progress"} == 1',
        "EC2 event": 'ec2_scheduled_event_start_timestamp_seconds{instance="faulty-node-2"}',
        "alerts firing": 'ALERTS{alertstate="firing", cluster="faulty"}',
        "GPU activity": 'instance:gpu_sm_active:ratio5m_avg{instance="faulty-node-2"} > 0',
        "allocated GPUs idle": 'gpu:gpu_allocated_idle:ratio5m{instance="faulty-node-1"}',
        "activity not measured":
            'gpu_activity_measured{instance="faulty-node-2", reason="counters_in_use"} == 0',
        f"{RATE_INTERVAL} of samples":
            f'count_over_time(up{{instance="faulty-node-2"}}[{RATE_INTERVAL}]) >= 8',
    }
    deadline = time.monotonic() + START_HANG_GUARD_S
    while True:
        missing = [k for k, e in wanted.items() if not _instant(api, e)]
        if not missing:
            return
        assert time.monotonic() < deadline, f"faults not seen by Prometheus: {missing}"
        time.sleep(0.5)


def _lost_gpu_within_one_scrape(api: str, lost_panel: dict) -> None:
    """The first sample in which Prometheus saw the GPU lost, and the panel evaluated one scrape
    interval later (as Grafana would on its next refresh): the GPU is in it."""
    node, gpu = LOST
    samples = _instant(api, f'gpu_lost{{instance="{node}", gpu="{gpu}"}}[5m]')[0]["values"]
    t0 = min(float(t) for t, v in samples if float(v) == 1)
    rows = _run_panel(api, lost_panel, "faulty", ".+", t0 + SCRAPE_S)
    assert any(r["metric"].get("instance") == node and r["metric"].get("gpu") == gpu for r in rows), rows


def test_every_panel_on_two_clusters(tmp_path, capsys):
    assert shutil.which("prometheus"), "prometheus is missing: install Debian's 'prometheus' package"
    models = dashboards()
    exporters = _start_exporters(tmp_path)
    prom = None
    try:
        prom, api = _start_prometheus(tmp_path, {n: addr for n, (_, addr) in exporters.items()})
        _wait_for_faults(api)
        now = time.time()

        empty: dict[tuple[str, str], None] = {}
        lines = []
        for name, model in models.items():
            panels = _panels(model)
            with_data = 0
            for panel in panels:
                series = [s for inst in _selections(name, "faulty")
                          for s in _run_panel(api, panel, "faulty", inst, now)]
                if series:
                    with_data += 1
                else:
                    empty[(name, panel["title"])] = None
                # Healthy cluster: nothing of the faulty one.
                for inst in _selections(name, "healthy"):
                    for s in _run_panel(api, panel, "healthy", inst, now):
                        labels = s["metric"]
                        assert labels.get("cluster", "healthy") == "healthy", (name, panel["title"], labels)
                        assert labels.get("instance", "healthy-node-1") in _instances("healthy"), \
                            (name, panel["title"], labels)
                # A cluster that does not exist: nothing but constant fallbacks (`or vector(0)`).
                for s in _run_panel(api, panel, "no-such-cluster", ".+", now):
                    values = s.get("values") or [s["value"]]
                    assert not s["metric"] and all(float(v) == 0 for _, v in values), \
                        (name, panel["title"], s)
                # One node of the faulty cluster selected: no other node's series.
                for s in _run_panel(api, panel, "faulty", "faulty-node-2", now):
                    assert s["metric"].get("instance", "faulty-node-2") == "faulty-node-2", \
                        (name, panel["title"], s["metric"])
            lines.append(f"{name}: {with_data}/{len(panels)} panels with data on the faulty cluster")
        with capsys.disabled():
            print("\n" + "\n".join(lines))
            for key in empty:
                print(f"  empty on the faulty cluster: {key[0]} / {key[1]}: {EMPTY_ON_PURPOSE.get(key, '?')}")
        assert set(empty) == set(EMPTY_ON_PURPOSE), f"empty panels on the faulty cluster: {sorted(empty)}"

        fleet = next(p for p in _panels(models["gpu-health-fleet"]) if p["title"] == "Lost and missing GPUs")
        _lost_gpu_within_one_scrape(api, fleet)
    finally:
        procs = [p for p, _ in exporters.values()] + ([prom] if prom else [])
        stop_all(procs)
