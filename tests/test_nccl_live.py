"""NCCL RAS end to end: two simulated nodes of one Slurm job share one fake RAS server
(`python -m exporter.tools.simulate.nccl_ras`) whose rank on node 1's GPU 3 stops launching; a real
Prometheus scrapes both exporters every second with rules/nccl.yml at that pace (its 2-minute
window as 10 seconds) beside the other rule files, and the real Alertmanager routes the alert with
the shipped config. TrainingJobNcclStalled names the culprit's node (instance), GPU and rank,
within 3 minutes of the hang, and reaches the job owner's receiver. At the shipped windows the
same takes about 3 minutes (docs/nccl.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time

import pytest
import requests
import yaml

from exporter.tools.simulate.nccl_ras import ONSET_S
from tests.helpers import (
    guarded_env,
    refused_address,
    served_base,
    start_listening,
    stop_all,
    wait_for,
    wait_until_serving,
)
from tests.rules_lint import copy_rules_at_global_interval
from tests.test_job_health_live import _start_alertmanager

pytestmark = pytest.mark.slow

GPUS = 4
CULPRIT = ("node-1", "3", "7")  # instance, GPU, rank: node 1's ranks are 4..7
WITHIN_S = 180


def _fast(rules: str) -> str:
    """rules/nccl.yml at a 1 s evaluation: its 1-minute windows as 10 s, its 3-minute freshness 30 s."""
    for a, b in (
        ("[1m]", "[10s]"),
        ("for: 30s", "for: 2s"),
        ("keep_firing_for: 5m", "keep_firing_for: 3s"),
        ("< 180", "< 30"),
    ):
        assert a in rules, a
        rules = rules.replace(a, b)
    return rules


def _start_server(tmp_path) -> tuple[subprocess.Popen, int]:
    log = tmp_path / "ras.log"
    out = open(log, "w")  # noqa: SIM115 - the server's whole life
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter.tools.simulate.nccl_ras",
            "--nodes",
            "2",
            "--gpus",
            str(GPUS),
            "--scenario",
            "nccl-lagging-rank",
            "--culprit-node",
            "1",
        ],
        env=guarded_env(),
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    m = wait_for(
        lambda: re.search(r"listening on 127\.0\.0\.1:(\d+)", log.read_text()),
        60,
        "the fake RAS server",
        proc,
        log,
    )
    return proc, int(m.group(1))


def test_the_rank_the_job_waits_for_is_named_within_3_minutes(tmp_path):
    for tool in ("prometheus", "prometheus-alertmanager"):
        assert shutil.which(tool), f"{tool} is missing: install Debian's '{tool}' package"
    procs: list[subprocess.Popen] = []
    with refused_address() as refused:
        try:
            server, port = _start_server(tmp_path)
            procs.append(server)
            onset = time.monotonic() + ONSET_S
            targets = {}
            for k in range(2):
                log = tmp_path / f"node-{k}.log"
                with open(log, "a") as err:
                    p = subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "exporter",
                            "--simulate",
                            "p5.48xlarge",
                            "--simulate.gpus",
                            str(GPUS),
                            "--simulate.efa-devices",
                            "2",
                            "--simulate.lustre-osts",
                            "2",
                            "--path.state-dir",
                            str(tmp_path / f"state-{k}"),
                            "--listen",
                            "127.0.0.1:0",
                            "--scenario",
                            "slurm-job",
                            "--scenario",
                            "nccl-job",
                            "--simulate.nccl-ras-port",
                            str(port),
                            "--simulate.nccl-node",
                            str(k),
                        ],
                        env=guarded_env(),
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                    )
                procs.append(p)
                base = served_base(log, p, timeout=120)
                wait_until_serving(f"{base}/metrics", p, 120, f"exporter node-{k}")
                targets[f"node-{k}"] = base.removeprefix("http://")
            am_proc, am = _start_alertmanager(tmp_path, refused)
            procs.append(am_proc)
            rules = tmp_path / "rules"
            copy_rules_at_global_interval(rules)
            (rules / "nccl.yml").write_text(_fast((rules / "nccl.yml").read_text()))
            cfg = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules / "*.yml")],
                "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am]}]}]},
                "scrape_configs": [
                    {
                        "job_name": "gpu-health-exporter",
                        "static_configs": [
                            {"targets": [a], "labels": {"cluster": "c1", "__node_name": n}}
                            for n, a in targets.items()
                        ],
                        "relabel_configs": [{"source_labels": ["__node_name"], "target_label": "instance"}],
                    }
                ],
            }
            (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
            prom, prom_port = start_listening(
                [
                    shutil.which("prometheus") or "prometheus",
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    "--web.listen-address=127.0.0.1:0",
                    "--log.level=warn",
                ],
                tmp_path / "prometheus.log",
            )
            procs.append(prom)

            def named() -> list[dict]:
                got = requests.get(f"http://{am}/api/v2/alerts", timeout=5).json()
                return [a for a in got if a["labels"]["alertname"] == "TrainingJobNcclStalled"]

            alerts = wait_for(
                named,
                max(5.0, onset + WITHIN_S - time.monotonic()),
                "TrainingJobNcclStalled in Alertmanager",
                prom,
                tmp_path / "prometheus.log",
                interval=0.5,
            )
        finally:
            stop_all(procs)
    assert len(alerts) == 1, alerts
    labels = alerts[0]["labels"]
    assert (labels["instance"], labels["gpu"], labels["rank"]) == CULPRIT, labels
    assert labels["reason"] == "lagging_rank" and labels["cause"] == "application"
    assert labels["hpc_job"] == labels["training_job"] == "4242"
    assert [r["name"] for r in alerts[0]["receivers"]] == ["job-owner"]
    assert "node-1 GPU 3" in alerts[0]["annotations"]["description"]
