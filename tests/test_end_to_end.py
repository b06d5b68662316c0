"""The whole path on one simulated node, with the real programs: the exporter serves a simulated
p5.48xlarge with faults injected, the real Prometheus scrapes it and evaluates rules/, and the
real Alertmanager routes the alerts with deploy/alertmanager/alertmanager.yml to a pager webhook
(here a small HTTP server on 127.0.0.1)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests
import yaml

from tests.helpers import ROOT, free_port, running_exporter


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is missing: install Debian's prometheus and prometheus-alertmanager packages"
    return path


class _Webhook(BaseHTTPRequestHandler):
    received: list[tuple[str, dict]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Webhook.received.append((self.path, json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def _wait(what: str, check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_simulated_faults_page_through_prometheus_and_alertmanager(tmp_path):
    _Webhook.received = []
    hook = ThreadingHTTPServer(("127.0.0.1", 0), _Webhook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    hook_url = f"http://127.0.0.1:{hook.server_port}"

    am_cfg = yaml.safe_load((ROOT / "deploy/alertmanager/alertmanager.yml").read_text())
    am_cfg["route"]["group_wait"] = "1s"
    for r in am_cfg["receivers"]:
        for w in r.get("webhook_configs", []):
            w["url"] = f"{hook_url}/{r['name']}"
    (tmp_path / "am.yml").write_text(yaml.safe_dump(am_cfg))
    am_port = free_port()
    prom_port = free_port()
    procs = []
    try:
        with running_exporter("--simulate", "p5.48xlarge", "--scenario", "xid-63",
                              "--scenario", "gpu-lost") as url:
            target = url.removeprefix("http://")
            procs.append(subprocess.Popen(
                [_tool("prometheus-alertmanager"), f"--config.file={tmp_path / 'am.yml'}",
                 f"--storage.path={tmp_path / 'am-data'}", f"--web.listen-address=127.0.0.1:{am_port}",
                 "--cluster.listen-address="],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            prom_cfg = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                           "external_labels": {"cluster": "e2e"}},
                "rule_files": [str(p) for p in sorted((ROOT / "rules").glob("*.yml"))],
                "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
                "scrape_configs": [{"job_name": "gpu-health-exporter",
                                    "static_configs": [{"targets": [target]}]}],
            }
            (tmp_path / "prom.yml").write_text(yaml.safe_dump(prom_cfg))
            procs.append(subprocess.Popen(
                [_tool("prometheus"), f"--config.file={tmp_path / 'prom.yml'}",
                 f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

            def firing():
                try:
                    r = requests.get(f"http://127.0.0.1:{prom_port}/api/v1/alerts", timeout=2).json()
                except requests.ConnectionError:
                    return None
                got = {(a["labels"]["alertname"], a["labels"].get("gpu")) for a in r["data"]["alerts"]
                       if a["state"] == "firing"}
                return got if {("GpuXidReplaceNow", "2"), ("GpuLost", "3")} <= got else None

            alerts = _wait("GpuXidReplaceNow on GPU 2 and GpuLost on GPU 3 firing in Prometheus", firing)
            # Only the faulted GPUs alert, each by its tier: GPU 2's XID 63 is replace-now, GPU 3's
            # fall off the bus is XID 79 (reboot tier); the six healthy GPUs raise nothing.
            xid_alerts = {(name, gpu) for name, gpu in alerts if name.startswith("GpuXid")}
            assert xid_alerts == {("GpuXidReplaceNow", "2"), ("GpuXidRebootRequired", "3")}
            assert {gpu for _, gpu in alerts if gpu is not None} == {"2", "3"}

            def paged():
                names = set()
                for path, body in _Webhook.received:
                    if path == "/pager":
                        names |= {(a["labels"]["alertname"], a["labels"].get("gpu"))
                                  for a in body["alerts"] if a["status"] == "firing"}
                return names if {("GpuXidReplaceNow", "2"), ("GpuLost", "3")} <= names else None

            pages = _wait("the pager webhook to receive both alerts from Alertmanager", paged)
            assert all(path != "/blackhole" for path, _ in _Webhook.received)
            assert ("GpuXidReplaceNow", "2") in pages
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        hook.shutdown()
