"""The whole path on one simulated node with the real programs: the exporter serves a simulated p5
with faults, the real Prometheus scrapes it and evaluates rules/, and the real Alertmanager routes
the firing alerts with deploy/alertmanager/alertmanager.yml to webhooks (a small HTTP server on
127.0.0.1 standing in for the pager and the ticket system). Every rule evaluates without error on
the exporter's actual series, the faults raise the alerts meant for them (pending or firing, with
the labels the rules and Alertmanager rely on), an application-tier XID raises none, and the
critical ones reach the pager."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests
import yaml

from dashboards.build import dashboards
from exporter.rules import DEFAULT_RUNBOOK_BASE
from tests.helpers import ROOT, START_HANG_GUARD_S, running_exporter, start_listening, wait_until_serving
from tests.rules_lint import RULES_DIR, rule_files

SCENARIOS = ["xid-63", "xid-13-flood", "gpu-row-remap-pending", "gpu-thermal-slowdown", "efa-device-missing",
             "lustre-import-disconnected", "lustre-lbug"]

EXPECTED = {  # alertname -> labels the alert must carry (besides instance and job)
    "GpuXidReplaceNow": {"gpu": "2", "xid": "63", "tier": "replace", "severity": "critical",
                         "node_action": "replace"},
    "GpuNodeReplaceRequired": {"verdict": "replace_required"},
    "GpuRowRemapPending": {"gpu": "3", "severity": "warning"},
    "GpuHwSlowdownActive": {"gpu": "3", "reason": "hw_thermal"},
    "EfaDevicesBelowExpected": {"severity": "critical"},
    "LustreImportNotConnected": {"component": "osc", "state": "DISCONN", "scope": "filesystem"},
    "LustreClientUnhealthy": {"status": "lbug", "node_action": "reboot"},
}
PAGED = {("GpuXidReplaceNow", "2"), ("GpuNodeReplaceRequired", None), ("LustreClientUnhealthy", None)}


class _Webhook(BaseHTTPRequestHandler):
    received: list[tuple[str, dict]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Webhook.received.append((self.path, json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def _start_alertmanager(tmp_path, hook_url: str) -> tuple[subprocess.Popen, str]:
    """The shipped Alertmanager config, its receivers pointed at `hook_url`/<receiver>."""
    cfg = yaml.safe_load((ROOT / "deploy/alertmanager/alertmanager.yml").read_text())
    # Test pace: the first notification of a group after 1 s, and an alert that joins the group
    # later (the node verdict follows the XID by a scrape) within 1 s rather than the shipped 5 m.
    cfg["route"]["group_wait"] = "1s"
    cfg["route"]["group_interval"] = "1s"
    for r in cfg["receivers"]:
        for w in r.get("webhook_configs", []):
            w["url"] = f"{hook_url}/{r['name']}"
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(cfg))
    proc, port = start_listening(
        [shutil.which("prometheus-alertmanager") or "prometheus-alertmanager",
         f"--config.file={tmp_path / 'alertmanager.yml'}", f"--storage.path={tmp_path / 'am-data'}",
         "--web.listen-address=127.0.0.1:0", "--cluster.listen-address="], tmp_path / "alertmanager.log")
    return proc, f"127.0.0.1:{port}"


def _paged() -> set[tuple[str, str | None]]:
    return {(a["labels"]["alertname"], a["labels"].get("gpu"))
            for path, body in _Webhook.received if path == "/pager"
            for a in body["alerts"] if a["status"] == "firing"}


def dashboard_queries() -> list[str]:
    return [t["expr"].replace("$__rate_interval", "1m").replace("$instance", ".*").replace("$cluster", ".*")
            .replace("$gpu", ".*").replace("$__range_s", "3600").replace("$__range", "1h")
            for d in dashboards().values() for p in d["panels"] if p["type"] != "row" for t in p["targets"]]


def _start_prometheus(tmp_path, target: str, alertmanager: str) -> tuple[subprocess.Popen, str]:
    rules = tmp_path / "rules"
    rules.mkdir()
    for src in RULES_DIR.glob("*.yml"):  # every group at the 1 s evaluation (gpu-ecc-baseline: 5m)
        doc = yaml.safe_load(src.read_text())
        for g in doc["groups"]:
            g.pop("interval", None)
        (rules / src.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                      "external_labels": {"cluster": "e2e"}},
           "rule_files": [str(rules / "*.yml")],
           "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
           "scrape_configs": [{"job_name": "gpu-health-exporter", "static_configs": [{"targets": [target]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    proc, port = start_listening(
        [shutil.which("prometheus") or "prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", "--web.listen-address=127.0.0.1:0",
         "--log.level=warn"], tmp_path / "prometheus.log")
    return proc, f"http://127.0.0.1:{port}/api/v1"


def _get(url: str, **params: str) -> dict | list | None:
    """The `data` of a Prometheus API answer; None while Prometheus is not ready yet (not listening,
    or 503 while it starts)."""
    try:
        r = requests.get(url, params=params, timeout=5)
    except requests.ConnectionError:
        return None
    return r.json()["data"] if r.ok else None


def _unix(rfc3339: str) -> float:
    """Prometheus' RFC 3339 timestamps (nanoseconds, Z or an offset) as Unix time."""
    m = re.fullmatch(r"(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", rfc3339)
    assert m, rfc3339
    whole = datetime.fromisoformat(m[1] + ("+00:00" if m[3] == "Z" else m[3])).timestamp()
    return whole + float(f"0.{m[2] or 0}")


def _wait_for_alerts(proc: subprocess.Popen, api: str, timeout: float = 180.0) -> dict[str, list[dict]]:
    """The active alerts by name, once Prometheus has what the test needs, however long a loaded
    machine takes to get there (the deadline only bounds a failure):

    1. its first scrape of the exporter (up == 1 is queryable);
    2. an evaluation of every rule group after that: an evaluation from before the first scrape
       leaves GpuHealthExporterAbsent pending (absent(up)), and a group evaluated late under load
       can still show it next to alerts from the scraped series;
    3. every EXPECTED alert active, and none about the exporter itself: a pending one (a collector
       that missed one deadline under load) clears at the next evaluation; a lasting one fails."""
    deadline = time.monotonic() + timeout
    seen_up = None
    alerts: dict[str, list[dict]] = {}
    while True:
        assert proc.poll() is None, f"prometheus exited {proc.returncode}"
        if seen_up is None:
            if _get(f"{api}/query", query='up{job="gpu-health-exporter"} == 1'):
                seen_up = time.time()
        else:
            groups = (_get(f"{api}/rules") or {}).get("groups", [])
            if groups and all(_unix(g["lastEvaluation"]) > seen_up for g in groups):
                alerts = {}
                for a in _get(f"{api}/alerts")["alerts"]:
                    alerts.setdefault(a["labels"]["alertname"], []).append(a)
                own = {n for n in alerts if n.startswith("GpuHealthExporter")}
                if set(EXPECTED) <= set(alerts) and not own:
                    return alerts
        assert time.monotonic() < deadline, (
            "no scrape of the exporter" if seen_up is None else
            f"missing {set(EXPECTED) - set(alerts)}; got {sorted(alerts)}")
        time.sleep(0.5)


def test_rules_on_a_simulated_node(tmp_path):
    assert shutil.which("prometheus"), "prometheus is missing: install Debian's 'prometheus' package"
    assert shutil.which("prometheus-alertmanager"), "install Debian's 'prometheus-alertmanager' package"
    _Webhook.received = []
    hook = ThreadingHTTPServer(("127.0.0.1", 0), _Webhook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    am, am_addr = _start_alertmanager(tmp_path, f"http://127.0.0.1:{hook.server_port}")
    # Before Prometheus starts: a firing alert sent to an Alertmanager not listening yet is resent
    # only after Prometheus' resend delay (1 minute).
    try:
        wait_until_serving(f"http://{am_addr}/-/ready", am, 60, "alertmanager")
    except BaseException:
        am.kill()
        raise
    args = ["--simulate", "p5.48xlarge"] + [a for s in SCENARIOS for a in ("--scenario", s)]
    with running_exporter(*args, "--path.state-dir", str(tmp_path / "state")) as url:
        proc, api = _start_prometheus(tmp_path, url.removeprefix("http://"), am_addr)
        try:
            alerts = _wait_for_alerts(proc, api)
            rules = requests.get(f"{api}/rules", timeout=5).json()["data"]["groups"]
            # The dashboard's queries run on the same series without error.
            for expr in dashboard_queries():
                r = requests.get(f"{api}/query", params={"query": expr}, timeout=5)
                assert r.ok and r.json()["status"] == "success", (expr, r.text)
            # Alertmanager routes the critical alerts to the pager, through the shipped config.
            deadline = time.monotonic() + START_HANG_GUARD_S
            while not PAGED <= _paged():
                assert time.monotonic() < deadline, f"pager got {_paged()}, wanted {PAGED}"
                time.sleep(0.5)
        finally:
            for p in (proc, am):
                p.terminate()
                p.wait(timeout=10)
            hook.shutdown()

    assert all(path in ("/pager", "/ticket") for path, _ in _Webhook.received)  # info is never sent

    # Every rule of every file was loaded and evaluates without error on the exporter's series.
    loaded = {r["name"] for g in rules for r in g["rules"]}
    wanted = {r.get("alert") or r["record"] for f in rule_files()
              for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]}
    assert wanted <= loaded
    errors = {r["name"]: r.get("lastError") for g in rules for r in g["rules"] if r["health"] != "ok"}
    assert not errors, errors

    for name, labels in EXPECTED.items():
        matching = [a for a in alerts[name] if labels.items() <= a["labels"].items()]
        assert matching, f"{name}: no alert with {labels}: {alerts[name]}"
        for a in matching:
            assert a["labels"]["instance"] and a["labels"]["job"] == "gpu-health-exporter"
            assert a["annotations"]["runbook_url"] == f"{DEFAULT_RUNBOOK_BASE}#{name.lower()}"
            assert "{{" not in a["annotations"]["description"]
    # The XID 13 flood is application tier: no XID alert for GPU 0.
    for name in ("GpuXidReplaceNow", "GpuXidRebootRequired", "GpuXidResetRequired", "GpuXidUnknown"):
        assert all(a["labels"].get("gpu") != "0" for a in alerts.get(name, [])), alerts[name]
    # Nothing about the exporter itself is wrong on a healthy simulated node.
    assert not {n for n in alerts if n.startswith("GpuHealthExporter")}, sorted(alerts)
