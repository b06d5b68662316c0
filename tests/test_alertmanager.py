"""deploy/alertmanager/alertmanager.yml: checked by the real amtool, routes tested label set by label
set, and inhibition tested on a real Alertmanager started on 127.0.0.1."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import requests
import yaml

from tests.helpers import (
    HANG_GUARD_S,
    ROOT,
    START_HANG_GUARD_S,
    refused_address,
    start_listening,
    wait_until_serving,
)
from tests.rules_lint import alerts

CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is missing: install Debian's 'prometheus-alertmanager' package"
    return path


def _amtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([_tool("amtool"), *args], capture_output=True, text=True, timeout=HANG_GUARD_S)


def test_amtool_check_config():
    r = _amtool("check-config", str(CONFIG))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


NODE = ["cluster=c1", "instance=gpu-node-1"]
FS = ["scope=filesystem", "fsname=fsx1"]


@pytest.mark.parametrize("labels, receiver", [
    (["alertname=GpuXidReplaceNow", "severity=critical", "node_action=replace", *NODE], "pager"),
    (["alertname=GpuLost", "severity=critical", "node_action=reboot", *NODE], "pager"),
    (["alertname=GpuNodeRebootRequired", "severity=critical", "node_action=reboot", *NODE], "pager"),
    (["alertname=EfaDevicesBelowExpected", "severity=critical", *NODE], "pager"),
    (["alertname=GpuRowRemapPending", "severity=warning", *NODE], "ticket"),
    (["alertname=EfaReceiveDrops", "severity=warning", "device=rdmap16s27", *NODE], "ticket"),
    (["alertname=SomethingInformational", "severity=info", *NODE], "blackhole"),
    (["alertname=LustreClientEvicted", "severity=warning", *FS, *NODE], "ticket"),
    (["alertname=HypotheticalFsOutage", "severity=critical", *FS, *NODE], "pager"),
    (["alertname=NoSeverity", *NODE], "ticket"),  # a rule without severity still reaches a human
    # job health goes to the job's owner, never the pager or the node's ticket
    (["alertname=TrainingJobStalled", "severity=warning", "notify=job_owner", "cause=hardware",
      "training_job=1001", "hpc_job=1001", *NODE], "job-owner"),
    (["alertname=TrainingJobStraggler", "severity=warning", "notify=job_owner", "cause=network",
      "training_job=llama", "namespace=team-a", *NODE], "job-owner"),
    (["alertname=TrainingJobSlow", "severity=warning", "notify=job_owner", "cause=storage",
      "training_job=1001", "hpc_job=1001", *NODE], "job-owner"),
])
def test_amtool_routes(labels, receiver):
    r = _amtool("config", "routes", "test", f"--config.file={CONFIG}", f"--verify.receivers={receiver}",
                *labels)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == [receiver]


def test_amtool_routes_reports_a_wrong_receiver():
    r = _amtool("config", "routes", "test", f"--config.file={CONFIG}", "--verify.receivers=pager",
                "severity=warning", *NODE)
    assert r.returncode != 0


def test_every_severity_in_rules_is_routed():
    cfg = yaml.safe_load(CONFIG.read_text())
    routed = {m for route in cfg["route"]["routes"] for m in route["matchers"]}
    for name, rule in alerts().items():
        assert f'severity="{rule["labels"]["severity"]}"' in routed, name
    assert cfg["route"]["group_by"] == ["cluster", "instance"]
    inhibit = cfg["inhibit_rules"][0]
    assert "instance" in inhibit["equal"]
    assert inhibit["source_matchers"] == ['node_action=~"replace|reboot"']
    sources = {n for n, r in alerts().items() if r["labels"].get("node_action") in ("replace", "reboot")}
    assert {"GpuXidReplaceNow", "GpuNodeReplaceRequired", "GpuLost", "GpuNodeRebootRequired",
            "GpuXidRebootRequired"} <= sources
    for name in sources:  # a source that could be a warning would mute its own node's tickets
        assert alerts()[name]["labels"]["severity"] == "critical", name


def _route_of(labels: list[str]) -> list[str]:
    """The route tree path (receiver, repeat_interval) amtool picks, from `routes show` with
    --verify: amtool's routes test prints only the receiver, so the repeat interval is read from the
    config route it matched (the first matching child, as Alertmanager does)."""
    cfg = yaml.safe_load(CONFIG.read_text())
    want = dict(label.split("=", 1) for label in labels)

    def matches(route: dict) -> bool:
        for m in route.get("matchers", []):
            k, op, v = re.match(r'(\w+)(=~|!=|=)"?(.*?)"?$', m).groups()
            got = want.get(k, "")
            ok = re.fullmatch(v, got) if op == "=~" else (got == v) if op == "=" else got != v
            if not ok:
                return False
        return True

    route, repeat = cfg["route"], cfg["route"]["repeat_interval"]
    while True:
        child = next((r for r in route.get("routes", []) if matches(r)), None)
        if child is None:
            return [route.get("receiver", cfg["route"]["receiver"]), repeat]
        route, repeat = child, child.get("repeat_interval", repeat)


@pytest.mark.parametrize("labels, receiver, repeat", [
    (["alertname=GpuXidReplaceNow", "severity=critical", "node_action=replace", *NODE], "pager", "72h"),
    (["alertname=GpuLost", "severity=critical", "node_action=reboot", *NODE], "pager", "72h"),
    (["alertname=EfaDevicesBelowExpected", "severity=critical", *NODE], "pager", "1h"),
    (["alertname=GpuRowRemapPending", "severity=warning", *NODE], "ticket", "24h"),
])
def test_replace_and_reboot_pages_repeat_rarely(labels, receiver, repeat):
    """A node waiting for a replacement or a reboot is re-paged every 3 days, not hourly (AMP caps
    repeat_interval at 5 days); amtool agrees on the receiver."""
    r = _amtool("config", "routes", "test", f"--config.file={CONFIG}", f"--verify.receivers={receiver}",
                *labels)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _route_of(labels) == [receiver, repeat]


def _config_for_test(tmp_path: Path, refused: str) -> Path:
    """The shipped config with receivers pointing at `refused`, a closed local address: nothing is
    delivered, the test reads Alertmanager's API."""
    cfg = yaml.safe_load(CONFIG.read_text())
    dead = f"http://{refused}/"
    for rcv in cfg["receivers"]:
        for w in rcv.get("webhook_configs", []):
            w["url"] = dead
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _alert(name: str, severity: str, instance: str, **labels: str) -> dict:
    now = datetime.now(timezone.utc)
    return {"labels": {"alertname": name, "severity": severity, "cluster": "c1", "instance": instance,
                       **labels},
            "annotations": {"summary": f"{name}."},
            "startsAt": now.isoformat(), "endsAt": (now + timedelta(hours=1)).isoformat()}


def test_live_alertmanager_inhibits_a_replaced_or_rebooting_nodes_warnings(tmp_path):
    with refused_address() as refused:
        _inhibition(tmp_path, refused)


def _inhibition(tmp_path: Path, refused: str) -> None:
    proc, port = start_listening(
        [_tool("prometheus-alertmanager"), f"--config.file={_config_for_test(tmp_path, refused)}",
         f"--storage.path={tmp_path / 'data'}", "--web.listen-address=127.0.0.1:0",
         "--cluster.listen-address=", "--log.level=warn"], tmp_path / "alertmanager.log")
    url = f"http://127.0.0.1:{port}/api/v2"
    try:
        wait_until_serving(f"{url}/status", proc, 60, "alertmanager")  # a deadline: slow on a loaded host
        posted = [
            # node 1: replace now (and a lost GPU)
            _alert("GpuXidReplaceNow", "critical", "gpu-node-1", node_action="replace", gpu="3", xid="95"),
            _alert("GpuRowRemapPending", "warning", "gpu-node-1", gpu="5"),
            _alert("EfaReceiveDrops", "warning", "gpu-node-1", device="rdmap16s27"),
            _alert("GpuLost", "critical", "gpu-node-1", node_action="reboot", gpu="3"),
            # its exporter killed for 15 minutes meanwhile (tests/rules/outage.test.yml)
            _alert("GpuHealthExporterDown", "warning", "gpu-node-1", job="gpu-health-exporter"),
            # node 2: only a warning
            _alert("GpuRowRemapPending", "warning", "gpu-node-2", gpu="5"),
            # node 3: a lost GPU; its exporter is down too (the latch keeps GpuLost firing)
            _alert("GpuLost", "critical", "gpu-node-3", node_action="reboot", gpu="1"),
            _alert("GpuHealthExporterDown", "warning", "gpu-node-3", job="gpu-health-exporter"),
            # ... and the job it hit stalls: its owner is told all the same (no node-level inhibition)
            _alert("TrainingJobStalled", "warning", "gpu-node-3", notify="job_owner", cause="hardware",
                   training_job="1001", hpc_job="1001"),
            # node 4: reboot required; an FSx eviction seen from it (grouped per file system)
            _alert("GpuNodeRebootRequired", "critical", "gpu-node-4", node_action="reboot",
                   verdict="reboot_required"),
            _alert("LustreClientEvicted", "warning", "gpu-node-4", scope="filesystem", fsname="fsx1"),
        ]
        assert requests.post(f"{url}/alerts", json=posted, timeout=5).ok
        muted = [("GpuRowRemapPending", "gpu-node-1"), ("EfaReceiveDrops", "gpu-node-1"),
                 ("GpuHealthExporterDown", "gpu-node-1"),
                 ("GpuHealthExporterDown", "gpu-node-3"), ("LustreClientEvicted", "gpu-node-4")]
        deadline = time.monotonic() + START_HANG_GUARD_S
        while True:
            got = requests.get(f"{url}/alerts", timeout=5).json()
            state = {(a["labels"]["alertname"], a["labels"]["instance"]): a for a in got}
            if len(state) == len(posted) and all(state[k]["status"]["inhibitedBy"] for k in muted):
                break
            assert time.monotonic() < deadline, got
            time.sleep(0.2)
        fp = {k: a["fingerprint"] for k, a in state.items()}
        sources = {
            "gpu-node-1": {fp[("GpuXidReplaceNow", "gpu-node-1")], fp[("GpuLost", "gpu-node-1")]},
            "gpu-node-3": {fp[("GpuLost", "gpu-node-3")]},
            "gpu-node-4": {fp[("GpuNodeRebootRequired", "gpu-node-4")]},
        }
        # A node's warnings are muted by its own replace or reboot alerts (GpuLost, reboot required) ...
        for key in muted:
            assert state[key]["status"]["state"] == "suppressed", key
            assert set(state[key]["status"]["inhibitedBy"]) <= sources[key[1]], key
        # ... its critical alerts still page, and another node's warning is untouched.
        for key in [("GpuXidReplaceNow", "gpu-node-1"), ("GpuLost", "gpu-node-1"), ("GpuLost", "gpu-node-3"),
                    ("GpuNodeRebootRequired", "gpu-node-4"), ("GpuRowRemapPending", "gpu-node-2"),
                    ("TrainingJobStalled", "gpu-node-3")]:
            assert state[key]["status"]["state"] == "active", key
            assert not state[key]["status"]["inhibitedBy"], key
        assert [r["name"] for r in state[("GpuXidReplaceNow", "gpu-node-1")]["receivers"]] == ["pager"]
        assert [r["name"] for r in state[("GpuRowRemapPending", "gpu-node-2")]["receivers"]] == ["ticket"]
        assert [r["name"] for r in state[("TrainingJobStalled", "gpu-node-3")]["receivers"]] == ["job-owner"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_amp_definition_matches_and_passes_amtool(tmp_path):
    """The AMP alert manager definition nests a config amtool accepts, with SNS receivers only, and
    the same routes and inhibition as alertmanager.yml."""
    amp = yaml.safe_load((CONFIG.parent / "amp-alertmanager-definition.yml").read_text())
    assert set(amp) == {"alertmanager_config"}
    inner = tmp_path / "amp.yml"
    inner.write_text(amp["alertmanager_config"])
    r = _amtool("check-config", str(inner))
    assert r.returncode == 0, r.stdout + r.stderr
    got, want = yaml.safe_load(amp["alertmanager_config"]), yaml.safe_load(CONFIG.read_text())
    assert got["route"] == want["route"] and got["inhibit_rules"] == want["inhibit_rules"]
    for rcv in got["receivers"]:
        assert set(rcv) <= {"name", "sns_configs"}, rcv
    r = _amtool("config", "routes", "test", f"--config.file={inner}", "--verify.receivers=pager",
                "severity=critical", *NODE)
    assert r.returncode == 0, r.stdout + r.stderr
