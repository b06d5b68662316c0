"""Time to page at the rule groups' real intervals: the replace-now, reboot, lost-GPU
and DBE rows of the alert matrix, run without time compression.

    PYTHONPATH=. python3 bench/time_to_page.py [--scrape 15] [--runs 1]

tests/test_alert_matrix.py runs every row with every duration divided by 7.5 (a 2 s scrape); this
runs the pages' rows in real time: simulated p5.48xlarge nodes on 127.0.0.1, a real Prometheus
scraping them every --scrape seconds with rules/ exactly as shipped (each group at its own
`interval:`, which promtool ignores), and a real Alertmanager with deploy/alertmanager's routing
(its own group_wait) sending to webhooks on 127.0.0.1. For each row it prints the seconds from the
fault (the XID's own timestamp) to the row's first notification (the matrix's time to page), and
to each of its alerts' firing in Prometheus (polled every second: the rules' share of the delay;
an alert that joins its notification group later is sent after Alertmanager's group_interval).
--rules DIR runs another rule set (a baseline checkout's rules/) in the same way, run after run
alternating with rules/. About 2 minutes a run; nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import requests
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.alert_matrix import PAGE, REPLACE, TICKET, XID_TIME, Row  # noqa: E402
from tests.helpers import ROOT, start_listening, wait_for, wait_until_serving  # noqa: E402
from tests.test_alert_matrix import _events, _fault_time, _Hook, _Node, _notified  # noqa: E402

ROWS = (
    Row("Replace now: XID 63", ("xid-63",), REPLACE, fault_at=XID_TIME),
    Row("Lost GPU, reboot: GPU lost (NVML)", ("gpu-lost",),
        ((PAGE, "GpuLost"), (PAGE, "GpuXidRebootRequired"), (PAGE, "GpuNodeRebootRequired"),
         (PAGE, "GpuCountBelowExpected")), fault_at=XID_TIME),
    Row("DBE: double-bit ECC error", ("gpu-ecc-dbe",),
        ((TICKET, "GpuEccUncorrectedErrors"), (TICKET, "GpuXidResetRequired"), (TICKET, "GpuRowRemapPending"),
         (TICKET, "GpuRecoveryActionRequired")), fault_at=XID_TIME),
)
DEADLINE_S = 600


def _alertmanager(hook_url: str) -> dict:
    """The shipped Alertmanager config as is, its webhooks sent to `hook_url`/<receiver>."""
    cfg = yaml.safe_load((ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
    for r in cfg["receivers"]:
        for w in r.get("webhook_configs", []):
            w["url"] = f"{hook_url}/{r['name']}"
    return cfg


def _firing(api: str, seen: dict[tuple[str, str], float]) -> None:
    """Record when each (instance, alertname) is first seen firing."""
    with contextlib.suppress(requests.RequestException):
        for a in requests.get(f"{api}/alerts", timeout=5).json()["data"]["alerts"]:
            if a["state"] == "firing":
                seen.setdefault((a["labels"].get("instance", ""), a["labels"]["alertname"]), time.time())


def run_once(scrape_s: int, rules: Path, log=print) -> dict[str, dict[str, float | None]]:
    """One run of every row at once; {row: {"first": s, alertname: s}} from the fault: the first
    notification, and each alert's firing in Prometheus."""
    tmp = Path(tempfile.mkdtemp(prefix="time-to-page-"))
    _Hook.received = []
    hook = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    (tmp / "alertmanager.yml").write_text(yaml.safe_dump(_alertmanager(f"http://127.0.0.1:{hook.server_port}")))
    (tmp / "sd").mkdir()
    nodes = [_Node(row, i, tmp) for i, row in enumerate(ROWS, 1)]
    prom = am = None
    try:
        am, am_port = start_listening(
            ["prometheus-alertmanager", f"--config.file={tmp / 'alertmanager.yml'}",
             f"--storage.path={tmp / 'am-data'}", "--web.listen-address=127.0.0.1:0",
             "--cluster.listen-address=", "--log.level=warn"], tmp / "alertmanager.log")
        wait_until_serving(f"http://127.0.0.1:{am_port}/api/v2/status", am, 30, "alertmanager")
        every = f"{scrape_s}s"
        cfg = yaml.safe_load((ROOT / "deploy" / "prometheus" / "scrape.yml").read_text())["global"]
        cfg = {"global": {"scrape_interval": every, "scrape_timeout": every,
                          "evaluation_interval": cfg.get("evaluation_interval", "30s"),
                          "external_labels": {"cluster": "e2e"}},
               "rule_files": [str(rules / "*.yml")],  # as shipped: each group at its interval
               "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
               "scrape_configs": [{"job_name": "gpu-health-exporter", "file_sd_configs": [
                   {"files": [str(tmp / "sd" / "*.json")], "refresh_interval": "1s"}]}]}
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        prom, prom_port = start_listening(
            ["prometheus", f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             "--web.listen-address=127.0.0.1:0", "--log.level=warn"], tmp / "prometheus.log")
        api = f"http://127.0.0.1:{prom_port}/api/v1"
        wait_until_serving(f"{api}/status/buildinfo", prom, 60, "prometheus")
        t0 = time.time()
        offsets = [n.spawn() for n in nodes]
        for n, offset in zip(nodes, offsets, strict=True):
            n.ready(offset)
        seen: dict[tuple[str, str], float] = {}

        def done() -> bool:
            _firing(api, seen)
            return all(_notified(n) and all((n.instance, a) in seen for _, a in n.row.expect) for n in nodes)
        wait_for(done, DEADLINE_S, "every row's first notification and every alert firing", interval=1)
        run_s = time.time() - t0
        out = {}
        for n in nodes:
            fault = _fault_time(api, n, run_s)
            firing = [(t, a["labels"]["alertname"]) for t, r, a in _events(n.instance)
                      if a["status"] == "firing" and (r, a["labels"]["alertname"]) in set(n.row.expect)]
            got: dict[str, float | None] = {}
            for _, name in n.row.expect:
                at = seen.get((n.instance, name))
                got[name] = at - fault if at and fault else None
            got["first"] = min(t for t, _ in firing) - fault if firing and fault else None
            out[n.row.name] = got
            log(f"  {n.row.name}: first notification {got['first']:.1f} s after the fault")
        return out
    finally:
        for n in nodes:
            n.stop()
        for p in (prom, am):
            if p is not None:
                p.terminate()
                p.wait(timeout=20)
        hook.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scrape", type=int, default=15, help="scrape interval, s (the matrix's reference: 15)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--rules", type=Path, metavar="DIR", help="also run this rule set, alternating")
    args = ap.parse_args()
    sets = [ROOT / "rules"] + ([args.rules] if args.rules else [])
    by_set: dict[Path, list] = {d: [] for d in sets}
    for _ in range(args.runs):
        for d in sets:
            print(f"{d}:", file=sys.stderr)
            by_set[d].append(run_once(args.scrape, d, log=lambda m: print(m, file=sys.stderr)))
    for d in sets:
        print(f"\n{d}")
        report(by_set[d], args.scrape)


def report(runs: list[dict], scrape_s: int) -> None:
    print(f"Seconds from the fault: the first notification (first), each alert firing in Prometheus; rules "
          f"at the groups' own intervals, a {scrape_s} s scrape, the shipped Alertmanager routing; median "
          f"(min-max) of {len(runs)} runs:")
    for row in ROWS:
        cells = []
        for key in ["first", *sorted(name for _, name in row.expect)]:
            vals = [r[row.name][key] for r in runs if r[row.name][key] is not None]
            if vals:
                cells.append(f"{key} {statistics.median(vals):.0f} ({min(vals):.0f}-{max(vals):.0f})")
            else:
                cells.append(f"{key} none")
        print(f"{row.name}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
