"""Deployment files: the example config is valid, the manifests parse and mount what the
collectors read, and the Prometheus scrape config passes the real promtool."""

import subprocess

import yaml

from exporter.cli import build_context, build_parser
from tests.helpers import ROOT, promtool

DEPLOY = ROOT / "deploy"


def test_example_config_is_valid():
    args = build_parser().parse_args(["--config", str(DEPLOY / "config.example.yaml")])
    ctx = build_context(args)
    assert ctx.config.listen == "0.0.0.0:9858"


def test_daemonset_mounts_every_source_and_config_is_valid(tmp_path):
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "daemonset.yaml").read_text()))
    kinds = {d["kind"]: d for d in docs}
    assert {"Namespace", "ConfigMap", "DaemonSet", "PodMonitor"} <= set(kinds)
    pod = kinds["DaemonSet"]["spec"]["template"]["spec"]
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert {"/host/sys", "/host/proc", "/dev/kmsg", "/var/lib/gpu-health-exporter"} <= mounts
    assert "SYSLOG" in pod["containers"][0]["securityContext"]["capabilities"]["add"]
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(kinds["ConfigMap"]["data"]["config.yaml"])
    ctx = build_context(build_parser().parse_args(["--config", str(cfg_file)]))
    assert ctx.config.paths.sysfs == "/host/sys"


def test_prometheus_scrape_config_passes_promtool():
    r = subprocess.run([promtool(), "check", "config", "--syntax-only",
                        str(DEPLOY / "prometheus" / "scrape.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
