"""deploy/prometheus and deploy/amp: the configs pass the real promtool, the scrape job puts `cluster` and
a node-name `instance` on the stored series of a real Prometheus scraping a simulated node, and the AMP
rule upload creates one rule groups namespace per rule file, then replaces it."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import requests
import yaml

from tests.helpers import (
    HANG_GUARD_S,
    ROOT,
    START_HANG_GUARD_S,
    promtool,
    refused_address,
    running_exporter,
    start_listening,
    wait_for,
    wait_until_serving,
)

PROM = ROOT / "deploy" / "prometheus"
UPLOAD = ROOT / "deploy" / "amp" / "upload-rules.sh"
RULE_FILES = sorted((ROOT / "rules").glob("*.yml"))


@pytest.mark.parametrize("name", ["scrape.yml", "remote-write-amp.yml", "sharded-scrape.yml"])
def test_promtool_check_config(name):
    r = subprocess.run([promtool(), "check", "config", str(PROM / name)], capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_scrape_config_has_alerting_region_and_cluster_relabel():
    cfg = yaml.safe_load((PROM / "scrape.yml").read_text())
    assert cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    (job,) = cfg["scrape_configs"]
    assert all(sd.get("region") for sd in job["ec2_sd_configs"])  # never a metadata lookup at start
    assert {"target_label": "cluster", "replacement": "my-training-cluster"} in job["relabel_configs"]


def test_sharded_scrape_keeps_one_shard_of_nodes_by_node_name():
    """The sharded example is scrape.yml's job plus a hashmod of (cluster, instance) after `instance`
    is set, kept for this shard only; the shard number is an external label too."""
    cfg = yaml.safe_load((PROM / "sharded-scrape.yml").read_text())
    (job,) = cfg["scrape_configs"]
    (plain,) = yaml.safe_load((PROM / "scrape.yml").read_text())["scrape_configs"]
    relabel = job["relabel_configs"]
    assert relabel[:len(plain["relabel_configs"])] == plain["relabel_configs"]
    hashmod, keep = relabel[-2:]
    assert hashmod["action"] == "hashmod" and hashmod["source_labels"] == ["cluster", "instance"]
    assert hashmod["modulus"] >= 2 and keep == {"source_labels": [hashmod["target_label"]],
                                                "regex": cfg["global"]["external_labels"]["shard"],
                                                "action": "keep"}
    assert cfg["rule_files"] == yaml.safe_load((PROM / "scrape.yml").read_text())["rule_files"]


def test_remote_write_to_amp_is_sigv4_signed():
    (rw,) = yaml.safe_load((PROM / "remote-write-amp.yml").read_text())["remote_write"]
    assert rw["url"].startswith("https://aps-workspaces.") and rw["url"].endswith("/api/v1/remote_write")
    assert rw["sigv4"]["region"] in rw["url"]


def _query(api: str, q: str) -> list[dict]:
    r = requests.get(f"{api}/query", params={"query": q}, timeout=10)
    r.raise_for_status()
    return r.json()["data"]["result"]


@pytest.mark.slow
def test_stored_series_carry_cluster_and_node_name(tmp_path):
    """The shipped job, its EC2 discovery left out (it would call AWS), against a file target the way
    slurm-targets.sh writes it: every stored series has cluster and instance = the node name."""
    assert shutil.which("prometheus"), "prometheus is missing: install Debian's 'prometheus' package"
    with refused_address() as alertmanager:
        up, gpus, unlabelled = _scrape_stored(tmp_path, alertmanager)
    assert [s["metric"] for s in up] == [{"__name__": "up", "job": "gpu-health-exporter",
                                          "cluster": "my-training-cluster", "instance": "gpunode1"}]
    assert [(s["metric"], s["value"][1]) for s in gpus] == [
        ({"cluster": "my-training-cluster", "instance": "gpunode1"}, "8")]
    assert unlabelled == []


def _scrape_stored(tmp_path, alertmanager: str) -> tuple[list, list, list]:
    cfg = yaml.safe_load((PROM / "scrape.yml").read_text())
    (job,) = cfg["scrape_configs"]
    del job["ec2_sd_configs"]
    job.update({"scrape_interval": "1s", "scrape_timeout": "1s"})
    job["file_sd_configs"] = [{"files": [str(tmp_path / "targets" / "*.json")], "refresh_interval": "1s"}]
    cfg["global"].update({"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"})
    cfg["rule_files"] = []
    cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [alertmanager]
    (tmp_path / "targets").mkdir()
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    with running_exporter("--simulate", "p5.48xlarge") as url:
        target = url.removeprefix("http://")
        (tmp_path / "targets" / "slurm.json").write_text(json.dumps(
            [{"targets": [target], "labels": {"instance": "gpunode1"}}]))
        proc, port = start_listening(
            [shutil.which("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", "--web.listen-address=127.0.0.1:0",
             "--log.level=warn"], tmp_path / "prometheus.log")
        api = f"http://127.0.0.1:{port}/api/v1"
        # its API answers 503 until the TSDB is open (a loaded host: seconds after it listens)
        wait_until_serving(f"http://127.0.0.1:{port}/-/ready", proc, 60, "prometheus")

        def stored() -> tuple | None:
            try:
                up = _query(api, 'up{job="gpu-health-exporter"}')
                gpus = _query(api, 'count by (cluster, instance) (gpu_info)')
            except requests.ConnectionError:
                return None
            return (up, gpus) if up and gpus else None
        try:
            up, gpus = wait_for(stored, START_HANG_GUARD_S, "a stored scrape of the exporter", proc,
                                tmp_path / "prometheus.log")
            return up, gpus, _query(api, '{job="gpu-health-exporter", cluster=""}')
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _fake_aws(tmp_path, namespaces_exist: bool):
    """An `aws` stand-in (the real CLI would call AWS) that records its arguments; describe answers
    as AMP does for an existing or a missing namespace."""
    log = tmp_path / "aws.log"
    aws = tmp_path / "aws"
    aws.write_text(f"#!/bin/sh\necho \"$*\" >> {log}\n"
                   f"case \"$2\" in describe-*) exit {0 if namespaces_exist else 254};; esac\n")
    aws.chmod(0o755)
    return aws, log


@pytest.mark.parametrize("exists,verb", [(False, "create-rule-groups-namespace"),
                                         (True, "put-rule-groups-namespace")])
def test_amp_upload_one_namespace_per_rule_file(tmp_path, exists, verb):
    aws, log = _fake_aws(tmp_path, exists)
    r = subprocess.run([str(UPLOAD), "ws-1234", "us-west-2"], env={"AWS": str(aws), "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr
    calls = [c.split() for c in log.read_text().splitlines() if f" {verb} " in f" {c} "]
    assert sorted(c[c.index("--name") + 1] for c in calls) == sorted(
        f"gpu-health-exporter-{f.stem}" for f in RULE_FILES)
    for c in calls:
        assert c[c.index("--region") + 1] == "us-west-2" and c[c.index("--workspace-id") + 1] == "ws-1234"
        data = c[c.index("--data") + 1]
        assert data.startswith("fileb://") and data.removeprefix("fileb://") in map(str, RULE_FILES)


def test_amp_accepts_the_rule_files_as_they_are():
    """AMP's rule groups namespace takes a plain Prometheus rule file: what promtool checks."""
    r = subprocess.run([promtool(), "check", "rules", *map(str, RULE_FILES)], capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stdout + r.stderr
