"""Job health end to end (issues 34, 43): a simulated cluster of 20 nodes running 7 two-node and 6
one-node Slurm jobs, one per scenario of exporter/tools/simulate/job.py, scraped by one real Prometheus
every second with rules/job.yml rendered at that pace (`python -m exporter.tools.job_rules`, windows of
seconds instead of minutes), beside the other rule files as shipped (their alerts, pending or firing,
are the job rules' evidence), and routed by the real Alertmanager with the shipped config.

Each stall, straggler or slow job fires with the right `cause` on the right node (and GPU: a stuck
rank), reaches Alertmanager's job-owner receiver, and resolves when its job recovers (the NCCL hang,
the storage stalls and the slow job recover at job.RECOVER_AT_S) or ends (the exporters of the
lost-GPU, stuck-rank and straggler jobs stop: the job's series go). The checkpoint, the healthy job,
the memory-bound phase, the requeue and the pipeline stages never alert, nor does any job with
another cause or on another node. The scenarios' times are seconds after each node's start; at the
shipped windows the same detection takes minutes (docs/alerts.md, "Job health")."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest
import requests
import yaml

from exporter.tools import job_rules
from exporter.tools.simulate import job
from tests.helpers import (
    ROOT,
    guarded_env,
    refused_address,
    served_base,
    start_listening,
    stop_all,
    wait_until_serving,
)
from tests.rules_lint import copy_rules_at_global_interval

pytestmark = pytest.mark.slow

SCRAPE_S = 1
# The job-health rules at a 1 s scrape: the shipped 2-minute windows and 4-minute `for:` as seconds;
# states carried 8 s (8 evaluations: a loaded host delays the groups' evaluations by seconds).
SETTINGS = job_rules.Settings(interval="1s", window="5s", evidence_window="10s", stall_for="5s",
                              straggler_for="8s", slow_for="8s", keep_firing_for="3s", carry="8s",
                              baseline_window="60s", baseline_samples=5, baseline_interval="5s")
# job -> its two nodes' scenarios (the first node is the culprit where there is one)
JOBS = {
    "hang": ("job-nccl-hang", "job-nccl-hang"),
    "xid": ("job-xid79", "job-wait"),
    "storage": ("job-storage-stall", "job-wait"),
    "ckpt": ("job-checkpoint", "job-checkpoint"),
    "thermal": ("job-thermal-straggler", "job-healthy"),
    "efa": ("job-efa-degraded", "job-healthy"),
    "healthy": ("job-healthy", "job-healthy"),
    # issue 43's phases, one node each (a node of 4 GPUs is a job the straggler and slow rules judge)
    "memory": ("job-memory-bound",),
    "stuck": ("job-stuck-rank",),
    "requeue": ("job-requeue",),
    "pipeline": ("job-pipeline-stage",),
    "slow": ("job-slow",),
    "latency": ("job-storage-latency",),
}
# (alertname, job, instance, cause, gpu) each must fire, and nothing else
EXPECTED = {
    ("TrainingJobStalled", "hang", "hang-1", "application", ""),
    ("TrainingJobStalled", "hang", "hang-2", "application", ""),
    ("TrainingJobStalled", "xid", "xid-1", "hardware", ""),
    ("TrainingJobStalled", "storage", "storage-1", "storage", ""),
    ("TrainingJobStraggler", "thermal", "thermal-1", "hardware", str(job.CULPRIT_GPU)),
    ("TrainingJobStraggler", "efa", "efa-1", "network", ""),
    ("TrainingJobStalled", "stuck", "stuck-1", "application", str(job.CULPRIT_GPU)),
    ("TrainingJobSlow", "slow", "slow-1", "application", ""),
    ("TrainingJobStalled", "latency", "latency-1", "storage", ""),
}
ENDS = ("xid", "thermal", "efa", "stuck")  # jobs that end (their exporters stop) instead of recovering
# Within this many seconds of the stall's onset (the shipped rules: 10 minutes).
FIRE_WITHIN_S = 60


def _start_exporters(tmp_path) -> dict[str, tuple[subprocess.Popen, str]]:
    started = {}
    for name, scenarios in JOBS.items():
        for k, scenario in enumerate(scenarios, start=1):
            node = f"{name}-{k}"
            log = tmp_path / f"{node}.log"
            args = [sys.executable, "-m", "exporter", "--simulate", "p5.48xlarge", "--simulate.gpus", "4",
                    "--simulate.efa-devices", "2", "--simulate.lustre-osts", "2",
                    "--path.state-dir", str(tmp_path / node), "--listen", "127.0.0.1:0",
                    "--scenario", "slurm-job", "--scenario", scenario]
            with open(log, "a") as err:
                started[node] = (subprocess.Popen(args, env=guarded_env(), stdout=subprocess.DEVNULL,
                                                  stderr=err), log)
    out = {}
    for node, (proc, log) in started.items():
        base = served_base(log, proc, timeout=120)
        wait_until_serving(f"{base}/metrics", proc, 120, f"exporter {node}")
        out[node] = (proc, base.removeprefix("http://"))
    return out


def _start_prometheus(tmp_path, targets: dict[str, str], alertmanager: str) -> tuple[subprocess.Popen, str]:
    rules = tmp_path / "rules"
    # The job rules read the other files' alerts as evidence: those run at this test's pace.
    copy_rules_at_global_interval(rules)
    (rules / "job.yml").write_text(job_rules.render(SETTINGS))
    scrape = []
    for name in JOBS:  # one scrape job per Slurm job: each its own job id (the simulation's is 4242)
        scrape.append({
            "job_name": f"gpu-health-exporter-{name}",
            "static_configs": [{"targets": [addr], "labels": {"cluster": "c1", "__node_name": node}}
                               for node, addr in targets.items() if node.startswith(f"{name}-")],
            "relabel_configs": [{"source_labels": ["__node_name"], "target_label": "instance"}],
            "metric_relabel_configs": [{"source_labels": ["hpc_job"], "regex": "4242",
                                        "target_label": "hpc_job", "replacement": name}],
        })
    cfg = {"global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
           "rule_files": [str(rules / "*.yml")],
           "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
           "scrape_configs": scrape}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    proc, port = start_listening(
        [shutil.which("prometheus") or "prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", "--web.listen-address=127.0.0.1:0", "--log.level=warn"],
        tmp_path / "prometheus.log")
    url = f"http://127.0.0.1:{port}"
    wait_until_serving(url + "/-/ready", proc, 60, "prometheus")
    return proc, url + "/api/v1"


def _start_alertmanager(tmp_path, refused: str) -> tuple[subprocess.Popen, str]:
    cfg = yaml.safe_load((ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
    for rcv in cfg["receivers"]:  # nothing is delivered: the test reads Alertmanager's API
        for w in rcv.get("webhook_configs", []):
            w["url"] = f"http://{refused}/"
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(cfg))
    proc, port = start_listening(
        [shutil.which("prometheus-alertmanager") or "prometheus-alertmanager",
         f"--config.file={tmp_path / 'alertmanager.yml'}", f"--storage.path={tmp_path / 'am'}",
         "--web.listen-address=127.0.0.1:0", "--cluster.listen-address=", "--log.level=warn"],
        tmp_path / "alertmanager.log")
    wait_until_serving(f"http://127.0.0.1:{port}/api/v2/status", proc, 60, "alertmanager")
    return proc, f"127.0.0.1:{port}"


def _key(labels: dict[str, str]) -> tuple[str, str, str, str, str]:
    return (labels["alertname"], labels.get("training_job", ""), labels.get("instance", ""),
            labels.get("cause", ""), labels.get("gpu", ""))


def _in_alertmanager(am: str) -> dict[tuple, dict]:
    got = requests.get(f"http://{am}/api/v2/alerts", timeout=5).json()
    return {_key(a["labels"]): a for a in got if a["labels"]["alertname"].startswith("TrainingJob")}


def _firing_in_prometheus(api: str) -> set[tuple]:
    body = requests.get(f"{api}/query", params={"query": 'ALERTS{alertname=~"TrainingJob.*"}'},
                        timeout=5).json()
    return {_key(r["metric"]) for r in body["data"]["result"]}


def test_each_cause_fires_on_its_node_and_resolves(tmp_path):
    for tool in ("prometheus", "prometheus-alertmanager"):
        assert shutil.which(tool), f"{tool} is missing: install Debian's '{tool}' package"
    procs: list[subprocess.Popen] = []
    with refused_address() as refused:
        try:
            start = time.monotonic()
            exporters = _start_exporters(tmp_path)
            procs += [p for p, _ in exporters.values()]
            am_proc, am = _start_alertmanager(tmp_path, refused)
            procs.append(am_proc)
            prom, api = _start_prometheus(tmp_path, {n: a for n, (_, a) in exporters.items()}, am)
            procs.append(prom)

            seen: dict[tuple, float] = {}  # alert -> when Alertmanager first had it
            receivers: dict[tuple, list[str]] = {}

            def poll() -> dict[tuple, dict]:
                now = _in_alertmanager(am)
                for k, a in now.items():
                    seen.setdefault(k, time.monotonic())
                    receivers[k] = [r["name"] for r in a["receivers"]]
                return now

            # Every expected alert reaches Alertmanager within FIRE_WITHIN_S of the last node's stall.
            deadline = time.monotonic() + job.STALL_AT_S + FIRE_WITHIN_S
            while not EXPECTED <= set(seen):
                assert time.monotonic() < deadline, \
                    f"not fired in time: {EXPECTED - set(seen)}; seen {sorted(seen)}"
                poll()
                time.sleep(0.5)
            # The jobs that recover do so at RECOVER_AT_S; the others end now.
            for node, (proc, _) in exporters.items():
                if node.split("-")[0] in ENDS:
                    proc.terminate()
            # Everything resolves: Prometheus has no job alert left, Alertmanager none active.
            deadline = start + 120 + job.RECOVER_AT_S + FIRE_WITHIN_S
            while _firing_in_prometheus(api) or poll():
                assert time.monotonic() < deadline, f"not resolved: {sorted(_firing_in_prometheus(api))}"
                time.sleep(0.5)
        finally:
            stop_all(procs)
    assert set(seen) == EXPECTED, f"unexpected job alerts: {set(seen) - EXPECTED}"
    for k, names in receivers.items():
        assert names == ["job-owner"], (k, names)

