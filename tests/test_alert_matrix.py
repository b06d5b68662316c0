"""The alert scenario matrix, end to end with the real programs: one simulated node (exporter) per
row of tests/alert_matrix.py, all scraped by one real Prometheus (2 s scrape and evaluation, the
rules of rules/ time-compressed 7.5x) that sends to one real Alertmanager (the shipped routing,
compressed the same way) whose receivers are webhooks on 127.0.0.1. Each row injects its fault and
the test asserts exactly which notifications arrive for that node (receiver, alertname, severity,
node labels), that the alerts a row mutes fire in Prometheus and are inhibited, that the rows that
must not notify notify nothing, and measures the time from the fault to the first notification.
Rows with an action restart or kill their exporter after the page. When every row is done, every
node's exporter is restarted one after another (a rollout while the pages are active). After an
action or the rollout no notification may arrive; after the rollout every page must be an alert
Prometheus activated before it (the rollout resolved none), and Prometheus'
`prometheus_rule_evaluation_failures_total` must be 0 at the end of the run.

Every server binds port 0. An exporter started again comes back on a new port, and the node's file
in service discovery follows it (as a pod's new address would); the node name stays its `instance`.
With UPDATE_DOCS=1 the run writes its table into docs/alerts.md (between the alert-matrix markers;
a plain test run leaves the tree as it found it); test_doc_table_lists_the_matrix checks, cheaply,
that the table there still lists the rows defined here. Time-driven semantics (a
node down 15 minutes, quiet periods, acks, escalation) are promtool cases in tests/rules/.
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
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import yaml

from tests.alert_matrix import (
    DOWN_S,
    ECC_INTERVALS,
    ROLLOUT_EXEMPT,
    ROWS,
    SCRAPE_S,
    SPEEDUP,
    Row,
    compress,
    compressed_alertmanager,
    compressed_rules,
    doc_rows,
    expected_text,
    row_label,
    seconds,
    write_doc,
)
from tests.helpers import ROOT, START_HANG_GUARD_S, served_base, start_listening, wait_for, wait_until_serving

DEADLINE_S = 180  # bounds a failing run; a passing one waits only for what it checks
SEVERITY = {"pager": "critical", "ticket": "warning"}


def test_doc_table_lists_the_matrix():
    """docs/alerts.md's generated table has exactly the matrix's rows with their expectations."""
    assert doc_rows() == [(row_label(r), expected_text(r)) for r in ROWS]


def test_compressed_rules_run_each_group_at_its_own_interval(tmp_path):
    """The matrix's Prometheus evaluates every group at its own interval / SPEEDUP (the ECC groups
    as strongly compressed as their windows), never at the global 2 s: time-to-page is measured at
    the groups' real intervals, which promtool cannot show."""
    compressed_rules(tmp_path)
    for src in sorted((ROOT / "rules").glob("*.yml")):
        copy = yaml.safe_load((tmp_path / src.name).read_text())
        got = {g["name"]: g.get("interval") for g in copy["groups"]}
        for g in yaml.safe_load(src.read_text())["groups"]:
            want = ECC_INTERVALS.get(g["name"]) or compress(g["interval"])
            assert got[g["name"]] == want, (g["name"], g["interval"], got[g["name"]])
            if g["name"] not in ECC_INTERVALS:
                assert seconds(want) == pytest.approx(seconds(g["interval"]) / SPEEDUP, abs=0.001)


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
    """One row's simulated node: its exporter, started on port 0, and its file in service discovery."""

    def __init__(self, row: Row, index: int, tmp: Path) -> None:
        self.row, self.instance = row, f"node-{index:02d}"
        self.state = tmp / self.instance
        self.state.mkdir()
        self.log = self.state / "exporter.log"
        self.sd = tmp / "sd" / f"{self.instance}.json"
        self.proc: subprocess.Popen | None = None
        self.action_at: float | None = None
        self.done = not row.action

    def spawn(self) -> int:
        """Start the exporter; returns where its log stood, for ready()."""
        args = [sys.executable, "-m", "exporter", "--simulate", "p5.48xlarge",
                "--collectors", self.row.collectors, "--path.state-dir", str(self.state),
                "--listen", "127.0.0.1:0"]
        for s in self.row.scenarios:
            args += ["--scenario", s]
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(args, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=out,
                                         stderr=subprocess.STDOUT)
        return offset

    def ready(self, offset: int) -> None:
        """Wait until the exporter serves, then point service discovery at its address."""
        base = served_base(self.log, self.proc, 120, after=offset)
        wait_until_serving(base + "/metrics", self.proc, 120, f"exporter {self.row.name}")
        tmp = self.sd.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": [base.removeprefix("http://")],
                                    "labels": {"instance": self.instance}}]))
        tmp.rename(self.sd)

    def start(self) -> None:
        self.ready(self.spawn())

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
    """Once the row's page has fully arrived: restart or kill its exporter."""
    try:
        wait_for(lambda: set(node.row.expect) <= _notified(node), DEADLINE_S / 2, f"{node.row.name}'s page",
                 interval=0.5)
    except AssertionError:
        node.done = True  # judged at the end: the page never came
        return
    node.action_at = time.time()
    if node.row.action == "kill":
        node.stop(signal.SIGKILL)
        time.sleep(DOWN_S)  # the outage itself: 2 minutes at SPEEDUP
    else:
        node.stop()
    node.start()
    node.done = True


def _query(api: str, expr: str) -> float | None:
    r = requests.get(f"{api}/query", params={"query": expr}, timeout=10).json()
    assert r["status"] == "success", (expr, r)
    res = r["data"]["result"]
    return float(res[0]["value"][1]) if res else None


def _unix(rfc3339: str) -> float:
    """Prometheus' RFC 3339 times (UTC, up to nanoseconds) as Unix time, to the microsecond."""
    return datetime.fromisoformat(rfc3339[:26].rstrip("Z") + "+00:00").timestamp()


def _active(api: str) -> dict[tuple[str, str], float]:
    """{(instance, alertname): its earliest activeAt} of every firing alert in Prometheus."""
    out: dict[tuple[str, str], float] = {}
    for a in requests.get(f"{api}/alerts", timeout=10).json()["data"]["alerts"]:
        if a["state"] == "firing":
            key = (a["labels"].get("instance", ""), a["labels"]["alertname"])
            at = _unix(a["activeAt"])
            out[key] = min(out.get(key, at), at)
    return out


def _suppressed(am: str, instance: str, alertname: str) -> bool:
    got = requests.get(f"{am}/api/v2/alerts", timeout=10,
                       params={"filter": [f'instance="{instance}"', f'alertname="{alertname}"']}).json()
    return bool(got) and all(a["status"]["state"] == "suppressed" for a in got)


def _rule_failures(prom_port: int) -> float:
    """prometheus_rule_evaluation_failures_total over every rule group, from Prometheus' own /metrics."""
    text = requests.get(f"http://127.0.0.1:{prom_port}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("prometheus_rule_evaluation_failures_total"))


def _evaluated_twice_since(api: str, since: float) -> bool:
    """Every rule group has been evaluated at least twice after `since` (its last evaluation is a
    full interval past it), and every target answered its last scrape."""
    groups = requests.get(f"{api}/rules", timeout=10).json()["data"]["groups"]
    targets = requests.get(f"{api}/targets", timeout=10).json()["data"]["activeTargets"]
    return (all(_unix(g["lastEvaluation"]) > since + SCRAPE_S for g in groups)
            and all(t["health"] == "up" and _unix(t["lastScrape"]) > since for t in targets))


def _rollout(nodes: list[_Node]) -> float:
    """Restart every node's exporter, one after another (a DaemonSet's rolling update): each is
    stopped, started and serving before the next. Returns when the rollout began."""
    began = time.time()
    for n in nodes:
        n.stop()
        n.start()
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
    (tmp_path / "sd").mkdir()
    nodes = [_Node(row, i, tmp_path) for i, row in enumerate(ROWS, 1)]
    compressed_rules(tmp_path / "rules")
    prom = am = None
    actions = []
    try:
        am, am_port = start_listening(
            ["prometheus-alertmanager", f"--config.file={tmp_path / 'alertmanager.yml'}",
             f"--storage.path={tmp_path / 'am-data'}", "--web.listen-address=127.0.0.1:0",
             "--cluster.listen-address=", "--log.level=warn"], tmp_path / "alertmanager.log")
        am_url = f"http://127.0.0.1:{am_port}"
        wait_until_serving(f"{am_url}/api/v2/status", am, 20, "alertmanager")
        every = f"{SCRAPE_S}s"
        cfg = {"global": {"scrape_interval": every, "scrape_timeout": every, "evaluation_interval": every,
                          "external_labels": {"cluster": "e2e"}},
               "rule_files": [str(tmp_path / "rules" / "*.yml")],
               "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
               "scrape_configs": [{"job_name": "gpu-health-exporter", "file_sd_configs": [
                   {"files": [str(tmp_path / "sd" / "*.json")], "refresh_interval": "1s"}]}]}
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        prom, prom_port = start_listening(
            ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", "--web.listen-address=127.0.0.1:0",
             "--log.level=warn", f"--rules.alert.resend-delay={int(60 // SPEEDUP)}s"],
            tmp_path / "prometheus.log")
        api = f"http://127.0.0.1:{prom_port}/api/v1"
        wait_until_serving(f"{api}/status/buildinfo", prom, 30, "prometheus")
        # Prometheus watches before the nodes start: each fault happens a few seconds into its
        # node's life (scenario onsets). All start at once; each joins discovery once it serves.
        t0 = time.time()
        offsets = [n.spawn() for n in nodes]
        for n, offset in zip(nodes, offsets, strict=True):
            n.ready(offset)
        for n in nodes:
            if n.row.action:
                th = threading.Thread(target=_act, args=(n,), daemon=True)
                th.start()
                actions.append(th)

        def complete() -> bool:
            return (all(set(n.row.expect) <= _notified(n) and n.done for n in nodes)
                    and all(_suppressed(am_url, n.instance, m) for n in nodes for m in n.row.mutes))
        try:
            wait_for(complete, DEADLINE_S, "every row's notifications and actions", interval=1)
        except AssertionError:
            pass  # judged row by row below
        # The rollout: every exporter restarted while the pages are active.
        rollout_at = _rollout(nodes)
        settled_from = time.time()
        wait_for(lambda: _evaluated_twice_since(api, settled_from), START_HANG_GUARD_S,
                 "two evaluations after the rollout", interval=0.5)
        run_s = time.time() - t0
        active = _active(api)
        results, problems = {}, []
        for n in nodes:
            events = _events(n.instance)
            exempt = any(s in ROLLOUT_EXEMPT for s in n.row.scenarios)
            if exempt:  # its simulated fault played again at the rollout: judged before it only
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
            for m in n.row.mutes:
                if not _suppressed(am_url, n.instance, m):
                    problems.append(f"{n.row.name}: {m} is not firing and inhibited in Alertmanager")
            restarted = n.action_at if exempt else (n.action_at or rollout_at)
            if n.row.action and n.action_at is None:
                problems.append(f"{n.row.name}: the {n.row.action} never happened (no page first)")
            if restarted is not None:
                late = [a["labels"]["alertname"] for t, _, a in events if t > restarted
                        and a["labels"]["alertname"] not in n.row.resolves]
                if late:
                    problems.append(f"{n.row.name}: notified after its exporter restarted: {late}")
            if not exempt:  # the rollout resolved none of its pages: each was active before it
                for _, name in n.row.expect:
                    at = active.get((n.instance, name))
                    if name not in n.row.resolves and (at is None or at >= rollout_at):
                        problems.append(f"{n.row.name}: {name} is not active since before the rollout "
                                        f"(activeAt {at}, rollout at {rollout_at})")
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
        if os.environ.get("UPDATE_DOCS"):  # a test run leaves the tree as it found it
            write_doc(results, f"Measured on a 2-core machine with the whole matrix running at once, "
                               f"{len(ROWS)} simulated nodes, in {run_s:.0f} s, ending with a rollout of "
                               f"every node's exporter while the pages were active; rule evaluation "
                               f"failures over the whole run: {failures:g}.")
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
