"""The alert scenario matrix, end to end with the real programs: one simulated node (exporter) per
row of tests/alert_matrix.py, all scraped by one real Prometheus (2 s scrape and evaluation, the
rules of rules/ time-compressed 7.5x) that sends to one real Alertmanager (the shipped routing,
compressed the same way) whose receivers are webhooks on 127.0.0.1. Each row injects its fault and
the test asserts exactly which notifications arrive for that node (receiver, alertname, severity,
node labels), that nothing resolves while the fault lasts, that the rows that must not notify
notify nothing, and measures the time from the fault to the first notification. When every row is
done, every node's exporter is restarted one after another (a rollout while the pages are active):
nothing may notify after it, and Prometheus' `prometheus_rule_evaluation_failures_total` must still
be 0 at the end of the run. The table goes
into docs/alerts.md (between the alert-matrix markers); test_doc_table_lists_the_matrix checks,
cheaply, that the table there still lists the rows defined here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import yaml

from tests.alert_matrix import (
    DOWN_S,
    KILL_S,
    ROLLOUT_EXEMPT,
    ROWS,
    SCRAPE_S,
    SPEEDUP,
    Row,
    compressed_alertmanager,
    compressed_rules,
    doc_rows,
    expected_text,
    row_label,
    write_doc,
)
from tests.helpers import ROOT, free_port, wait_until_serving

DEADLINE_S = 420
QUIET_S = 40  # after an action: how long nothing more may arrive (5 minutes at a 15 s scrape)
SEVERITY = {"pager": "critical", "ticket": "warning"}


def test_doc_table_lists_the_matrix():
    """docs/alerts.md's generated table has exactly the matrix's rows with their expectations."""
    assert doc_rows() == [(row_label(r), expected_text(r)) for r in ROWS]


class _Hook(BaseHTTPRequestHandler):
    received: list[tuple[float, str, dict]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.received.append((time.time(), self.path.strip("/"), json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


class _Node:
    """One row's simulated node: the exporter on a fixed port (kept across restarts)."""

    def __init__(self, row: Row, index: int, tmp: Path) -> None:
        self.row, self.instance = row, f"node-{index:02d}"
        self.port = free_port()
        self.state = tmp / self.instance
        self.state.mkdir()
        self.proc: subprocess.Popen | None = None
        self.action_at: float | None = None
        self.done = not row.action

    def start(self) -> None:
        args = [sys.executable, "-m", "exporter", "--simulate", "p5.48xlarge",
                "--collectors", self.row.collectors, "--path.state-dir", str(self.state),
                "--listen", f"127.0.0.1:{self.port}"]
        for s in self.row.scenarios:
            args += ["--scenario", s]
        log = (self.state / "exporter.log").open("a")
        self.proc = subprocess.Popen(args, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log,
                                     stderr=subprocess.STDOUT)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def _events(instance: str) -> list[tuple[float, str, dict]]:
    """(arrival time, receiver, alert) for every alert of `instance` in every notification."""
    return [(t, receiver, a) for t, receiver, body in list(_Hook.received) for a in body["alerts"]
            if a["labels"].get("instance") == instance]


def _notified(node: _Node) -> set[tuple[str, str]]:
    return {(r, a["labels"]["alertname"]) for _, r, a in _events(node.instance) if a["status"] == "firing"}


def _act(node: _Node) -> None:
    """Once the row's page has fully arrived: restart or kill its exporter, then watch."""
    deadline = time.monotonic() + DEADLINE_S / 2
    while not set(node.row.expect) <= _notified(node):
        if time.monotonic() > deadline:
            node.done = True
            return
        time.sleep(0.5)
    time.sleep(3)  # let the group's last notification out
    node.action_at = time.time()
    if node.row.action == "kill":
        node.stop(signal.SIGKILL)
        time.sleep(KILL_S)
    elif node.row.action == "down":
        node.stop()
        time.sleep(DOWN_S)
    else:
        node.stop()
    node.start()
    time.sleep(QUIET_S)
    node.done = True


def _query(api: str, expr: str) -> float | None:
    r = requests.get(f"{api}/query", params={"query": expr}, timeout=10).json()
    assert r["status"] == "success", (expr, r)
    res = r["data"]["result"]
    return float(res[0]["value"][1]) if res else None


def _rule_failures(prom_port: int) -> float:
    """prometheus_rule_evaluation_failures_total over every rule group, from Prometheus' own /metrics."""
    text = requests.get(f"http://127.0.0.1:{prom_port}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("prometheus_rule_evaluation_failures_total"))


def _after(node: _Node, since: float) -> list[str]:
    """The node's notifications after `since`, but those that only carry an alert the row means to
    resolve (Alertmanager sends the group's firing alerts with a resolved one)."""
    out = []
    for t, _, body in list(_Hook.received):
        mine = [a for a in body["alerts"] if a["labels"].get("instance") == node.instance]
        if t <= since or not mine:
            continue
        if any(a["status"] == "resolved" and a["labels"]["alertname"] in node.row.resolves for a in mine):
            continue
        out += [f"{a['status']} {a['labels']['alertname']}" for a in mine]
    return out


def _rollout(nodes: list[_Node]) -> float:
    """Restart every node's exporter, one after another (a DaemonSet's rolling update): each is
    stopped, started and serving before the next. Returns when the rollout began."""
    began = time.time()
    for n in nodes:
        n.stop()
        n.start()
        wait_until_serving(f"http://127.0.0.1:{n.port}/metrics", n.proc, 120, f"exporter {n.row.name}")
    return began


def _fault_time(api: str, node: _Node, run_s: float) -> float | None:
    row = node.row
    if row.fault_at:  # over the whole run: the last scrape may have failed, the node restarted
        at = row.fault_at.format(row=node.instance)
        return _query(api, f"min(min_over_time(({at})[{int(run_s) + 5}s:1s]))")
    if row.fault_when:
        cond = row.fault_when.format(row=node.instance)
        return _query(api, f"min(min_over_time(timestamp({cond})[{int(run_s) + 5}s:1s]))")
    return None


@pytest.mark.slow
def test_alert_matrix(tmp_path):
    for tool in ("prometheus", "prometheus-alertmanager"):
        assert shutil.which(tool), f"{tool} is missing: install Debian's prometheus / prometheus-alertmanager"
    _Hook.received = []
    hook = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(
        compressed_alertmanager(f"http://127.0.0.1:{hook.server_port}")))
    am_port = free_port()
    am = subprocess.Popen(
        ["prometheus-alertmanager", f"--config.file={tmp_path / 'alertmanager.yml'}",
         f"--storage.path={tmp_path / 'am-data'}", f"--web.listen-address=127.0.0.1:{am_port}",
         "--cluster.listen-address=", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    nodes = [_Node(row, i, tmp_path) for i, row in enumerate(ROWS, 1)]
    compressed_rules(tmp_path / "rules")
    prom_port = free_port()
    every = f"{SCRAPE_S}s"
    cfg = {"global": {"scrape_interval": every, "scrape_timeout": every, "evaluation_interval": every,
                      "external_labels": {"cluster": "e2e"}},
           "rule_files": [str(tmp_path / "rules" / "*.yml")],
           "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
           "scrape_configs": [{"job_name": "gpu-health-exporter", "file_sd_configs": [
               {"files": [str(tmp_path / "sd" / "*.json")], "refresh_interval": "1s"}]}]}
    (tmp_path / "sd").mkdir()

    def discover(n: _Node) -> None:
        """Put the node's target into service discovery (as a node joins the fleet)."""
        tmp = tmp_path / f"{n.instance}.json.tmp"
        tmp.write_text(json.dumps([{"targets": [f"127.0.0.1:{n.port}"], "labels": {"instance": n.instance}}]))
        tmp.rename(tmp_path / "sd" / f"{n.instance}.json")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    prom = None
    api = f"http://127.0.0.1:{prom_port}/api/v1"
    actions = []
    try:
        wait_until_serving(f"http://127.0.0.1:{am_port}/api/v2/status", am, 20, "alertmanager")
        prom = subprocess.Popen(
            ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}",
             "--log.level=warn",
             f"--rules.alert.resend-delay={int(60 // SPEEDUP)}s"],
            stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
        wait_until_serving(f"{api}/status/buildinfo", prom, 30, "prometheus")
        # Prometheus watches before the nodes start: each fault happens a few seconds into its node's
        # life (scenario onsets), the ECC row's history starts with its node.
        # One at a time (18 Python start-ups at once starve 2 cores), the longest rows first.
        t0 = time.time()
        for n in sorted(nodes, key=lambda n: not (n.row.action or n.row.fault_when)):
            n.start()
            wait_until_serving(f"http://127.0.0.1:{n.port}/metrics", n.proc, 120, f"exporter {n.row.name}")
            discover(n)
        for n in nodes:
            if n.row.action:
                th = threading.Thread(target=_act, args=(n,), daemon=True)
                th.start()
                actions.append(th)
        # Until every paging row has what it expects, every action row is done, and the ECC row
        # (the slowest: 75 s of compressed history first) has had its chance.
        while time.time() - t0 < DEADLINE_S:
            complete = all(set(n.row.expect) <= _notified(n) for n in nodes) and all(n.done for n in nodes)
            if complete:
                break
            time.sleep(1)
        time.sleep(3)  # stragglers: anything unexpected still on its way
        # The rollout: every exporter restarted while the pages are active; then as long again as
        # after an action for anything that should not come.
        rollout_at = _rollout(nodes)
        time.sleep(QUIET_S)
        run_s = time.time() - t0
        results, problems = {}, []
        for n in nodes:
            events = _events(n.instance)
            exempt = any(s in ROLLOUT_EXEMPT for s in n.row.scenarios)
            if exempt:  # its simulated counters started over at the rollout: judged before it only
                events = [e for e in events if e[0] <= rollout_at]
            firing = [(t, r, a) for t, r, a in events if a["status"] == "firing"]
            got = {(r, a["labels"]["alertname"]) for _, r, a in firing}
            fault = _fault_time(api, n, run_s)
            wanted = [t for t, r, a in firing if (r, a["labels"]["alertname"]) in set(n.row.expect)]
            secs = min(wanted) - fault if wanted and fault else None
            results[n.row.name] = {
                "observed": "; ".join(f"{r}: {', '.join(sorted(a for rr, a in got if rr == r))}"
                                      for r in sorted({r for r, _ in got})) or "nothing",
                "seconds": secs}
            if got != set(n.row.expect):
                problems.append(f"{n.row.name}: notified {sorted(got)}, expected {sorted(n.row.expect)}")
            resolved = [a["labels"]["alertname"] for _, _, a in events if a["status"] == "resolved"
                        and a["labels"]["alertname"] not in n.row.resolves]
            if resolved:
                problems.append(f"{n.row.name}: resolved while the fault lasts: {resolved}")
            for _, r, a in firing:
                lab = a["labels"]
                if lab.get("severity") != SEVERITY.get(r) or lab.get("cluster") != "e2e":
                    problems.append(f"{n.row.name}: {r} got {lab}")
            if n.row.action:
                late = [a["labels"]["alertname"] for t, _, a in events if n.action_at and t > n.action_at]
                if n.action_at is None:
                    problems.append(f"{n.row.name}: the {n.row.action} never happened (no page first)")
                elif late:
                    problems.append(f"{n.row.name}: notified again after the {n.row.action}: {late}")
            if not exempt:
                late = _after(n, rollout_at)
                if late:
                    problems.append(f"{n.row.name}: notified after the rollout of every node: {late}")
            if n.row.expect and secs is None:
                problems.append(f"{n.row.name}: no fault time or no notification (fault={fault})")
        failures = _rule_failures(prom_port)
        if failures:
            problems.append(f"prometheus_rule_evaluation_failures_total is {failures:g}, not 0: "
                            + (tmp_path / "prometheus.log").read_text()[-2000:])
        if problems:  # context for whoever reads the failure: scrapes this loaded machine missed
            missed = {n.instance: _query(api, f'sum(count_over_time((up{{instance="{n.instance}"}} == 0)'
                                              f'[{int(run_s)}s:{SCRAPE_S}s]))') for n in nodes}
            problems.append(f"failed scrapes per node ({SCRAPE_S} s timeout): {missed}")
        write_doc(results, f"Measured on a 2-core machine with the whole matrix running at once, "
                           f"{len(ROWS)} simulated nodes, in {run_s:.0f} s, ending with a rollout of every "
                           f"node's exporter while the pages were active; rule evaluation failures over "
                           f"the whole run: {failures:g}.")
        assert not problems, "\n".join(problems)
    finally:
        for n in nodes:
            n.stop()
        for p in (prom, am):
            if p is not None:
                p.terminate()
                p.wait(timeout=20)
        hook.shutdown()
        for th in actions:
            th.join(timeout=1)
