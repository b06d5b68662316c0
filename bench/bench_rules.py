"""Cost of the alert rules on a fleet: evaluation time of every rule group in rules/ on a real
Prometheus holding synthetic history for N nodes (a simulated p5.48xlarge's series, 8 GPUs each).

    python bench/bench_rules.py --nodes 100 500 2000 [--interval 30]

For each node count it
  1. scrapes a simulated p5.48xlarge once (the exporter on 127.0.0.1) and keeps the series the rules
     read (metric names taken from rules/*.yml), copied per node with its own `instance`;
  2. writes their history as OpenMetrics: 20 minutes at the scrape interval for every series, 80
     minutes for the series read through an hour-long window (uncorrectable ECC, EFA admin commands),
     and the recording rules' own history that the rules read back (the 5-minute corrected-ECC rate
     for 75 minutes, the hourly one every 5 minutes for 13 hours);
  3. imports it with `promtool tsdb create-blocks-from openmetrics`;
  4. starts Prometheus on that TSDB with a copy of rules/ in which every group is evaluated every
     15 s (a slower group's cost per evaluation does not depend on its interval), waits for
     several evaluations and reports each group's evaluation time (Prometheus' own
     `evaluationTime` from /api/v1/rules), median and maximum over the evaluations seen.

`measure(nodes)` returns the figures (bench/figures.py calls it); the command prints one table.
Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.helpers import free_port, running_exporter, wait_until_serving  # noqa: E402
from tests.rules_lint import all_rules, metric_names  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHORT_S = 17 * 60  # history of every series (the longest plain window in rules/ is 15m)
LONG_S = 80 * 60  # history of series read over [1h] offset 15m
LONG = {"gpu_ecc_errors_total", "efa_admin_commands_no_completion_total"}
RECORDED = {  # recorded series the rules read back over a range: (source, history s, step s)
    "gpu:gpu_ecc_corrected_errors:rate5m": ("ecc", 75 * 60, None),
    "gpu:gpu_ecc_corrected_errors:rate1h": ("ecc", 13 * 3600, 300),
    "gpu:gpu_ecc_corrected_errors:rate6h_offset1h": ("ecc", SHORT_S, 300),
    "gpu:gpu_ecc_corrected_errors:rate1h_max6h": ("ecc", SHORT_S, 300),
    "instance:gpu_devices_expected:max": ("node", SHORT_S, None),
    "instance:gpu_health_exporter_up:last_seen_timestamp_seconds": ("node", SHORT_S, None),
}
EVAL_S = 15
# Counters grow like a fleet's: traffic (bytes, packets sent and received) at rates from idle to
# busy; error and event counters (retransmits, drops, timeouts, ECC, XIDs...) stand still except on
# FAULTY_SHARE of the series, which rise fast enough to fire their alerts. (Every counter rising at
# random, as before, had a quarter of all EFA devices alerting at once: the cost measured was
# mostly Prometheus writing thousands of ALERTS series, not the rules' reads.)
TRAFFIC = re.compile(r"_(bytes|packets)_total$")
FAULTY_SHARE = 0.002
PREP_S_PER_NODE = [0.5]  # writing + importing one node's history (2 cores); learnt from each run


@dataclass
class Figures:
    nodes: int
    series: int
    samples: int
    # group name -> (median s, max s, rules)
    groups: dict[str, tuple[float, float, int]] = field(default_factory=dict)


def node_series() -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of one simulated p5.48xlarge's series that the rules read."""
    wanted = {n for _, _, r in all_rules() for n in metric_names(r["expr"]) if ":" not in n} - {"ALERTS"}
    with running_exporter("--simulate", "p5.48xlarge") as url:
        time.sleep(2)  # the slow GPU readings (NVLink state, PCIe replays) arrive in the background
        text = requests.get(f"{url}/metrics", timeout=30).text
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in wanted:
                if s.name == "gpu_nvlink_errors_total":  # the per-GPU default of issue 14, not per link
                    if s.labels.get("link") not in ("0", "all"):
                        continue
                    s.labels["link"] = "all"
                out.append((s.name, dict(s.labels), s.value))
    out.append(("up", {}, 1.0))
    out.append(("scrape_duration_seconds", {}, 0.05))
    return out


def _labels(d: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(d.items()))


def _step(name: str, rng: random.Random) -> float:
    """A counter's increase per second in the synthetic history (see TRAFFIC)."""
    if TRAFFIC.search(name) and "retrans" not in name:
        return rng.choice([0.01, 0.5, 1e3, 1e6])
    return 0.5 if rng.random() < FAULTY_SHARE else 0.0


def write_history(path: Path, nodes: int, interval: int, end: int) -> tuple[int, int]:
    """OpenMetrics history for `nodes` copies of the simulated node; returns (series, samples)."""
    per_node = node_series()
    rng = random.Random(1)
    families: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, labels, value in per_node:
        families.setdefault(name, []).append((labels, value))
    ecc = [lab for lab, _ in families.get("gpu_ecc_errors_total", []) if lab.get("error_type") == "corrected"
           and lab.get("counter") == "aggregate"]
    series = samples = 0
    with path.open("w") as f:
        for name, members in families.items():
            f.write(f"# TYPE {name} unknown\n")
            span = LONG_S if name in LONG else SHORT_S
            ts = list(range(end - span, end + 1, interval))
            counter = name.endswith("_total")
            for node in range(nodes):
                node_labels = {"instance": f"gpu-node-{node}", "job": "gpu-health-exporter", "cluster": "c1"}
                for labels, value in members:
                    lab = _labels({**labels, **node_labels})
                    step = _step(name, rng) * interval if counter else 0.0
                    f.writelines(f"{name}{{{lab}}} {value + i * step:.6g} {t}\n" for i, t in enumerate(ts))
                    series += 1
                    samples += len(ts)
        for name, (kind, span, step_s) in RECORDED.items():
            f.write(f"# TYPE {name} unknown\n")
            ts = list(range(end - span, end + 1, step_s or EVAL_S * 2))
            for node in range(nodes):
                node_labels = {"instance": f"gpu-node-{node}", "job": "gpu-health-exporter", "cluster": "c1"}
                members = [{k: v for k, v in lab.items() if k != "counter"} for lab in ecc] if kind == "ecc" \
                    else [{}]
                for labels in members:
                    lab = _labels({**labels, **node_labels})
                    v = 8.0 if kind == "node" else rng.choice([0.0, 0.0, 0.001, 0.02])
                    f.writelines(f"{name}{{{lab}}} {v:.6g} {t}\n" for t in ts)
                    series += 1
                    samples += len(ts)
        f.write("# EOF\n")
    return series, samples


def _rules_copy(dst: Path) -> None:
    """rules/ with every group evaluated every EVAL_S seconds."""
    dst.mkdir()
    for src in sorted((ROOT / "rules").glob("*.yml")):
        doc = yaml.safe_load(src.read_text())
        for g in doc["groups"]:
            g["interval"] = f"{EVAL_S}s"
        (dst / src.name).write_text(yaml.safe_dump(doc, sort_keys=False))


def measure(nodes: int, interval: int = 30, evaluations: int = 4, log=print) -> Figures:
    """Build the history for `nodes` nodes and measure every rule group's evaluation time."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-rules-"))
    # The history must end when the rules start evaluating: later, their instant selectors find
    # nothing (5m lookback); earlier, Prometheus refuses the rules' own output (a sample older than
    # the newest block is out of bounds). So it ends at an estimate of when writing and importing
    # are done, and the evaluation waits for that moment.
    started = time.time()
    end = int(started + 30 + nodes * PREP_S_PER_NODE[0])
    try:
        t = time.monotonic()
        series, samples = write_history(tmp / "history.om", nodes, interval, end)
        log(f"{nodes} nodes: {series:,} series, {samples:,} samples written in {time.monotonic() - t:.0f} s")
        t = time.monotonic()
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(tmp / "history.om"),
                        str(tmp / "tsdb")], check=True, capture_output=True, timeout=3600)
        (tmp / "history.om").unlink()
        log(f"{nodes} nodes: imported in {time.monotonic() - t:.0f} s")
        PREP_S_PER_NODE[0] = 1.5 * (time.time() - started) / nodes  # for the next, larger run
        late = time.time() - end
        if late > 60:
            raise RuntimeError(f"writing and importing took {late:.0f} s longer than estimated: the "
                               "history is stale; run a smaller --nodes first (it calibrates the estimate)")
        time.sleep(max(0.0, -late) + 1)
        _rules_copy(tmp / "rules")
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(
            {"global": {"evaluation_interval": f"{EVAL_S}s"}, "rule_files": [str(tmp / "rules" / "*.yml")]}))
        port = free_port()
        proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'tsdb'}", "--storage.tsdb.retention.time=10y",
                                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=error"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        api = f"http://127.0.0.1:{port}/api/v1"
        try:
            wait_until_serving(f"{api}/status/tsdb", proc, 300, "prometheus")
            seen: dict[str, dict[str, float]] = {}  # group -> {lastEvaluation: evaluationTime}
            rules_per_group: dict[str, int] = {}
            deadline = time.monotonic() + EVAL_S * (evaluations + 2) + 30
            while time.monotonic() < deadline:
                for g in requests.get(f"{api}/rules", timeout=30).json()["data"]["groups"]:
                    errors = [r.get("lastError") for r in g["rules"] if r.get("health") == "err"]
                    assert not errors, (g["name"], errors)
                    if g["lastEvaluation"].startswith("0001"):
                        continue
                    seen.setdefault(g["name"], {})[g["lastEvaluation"]] = g["evaluationTime"]
                    rules_per_group[g["name"]] = len(g["rules"])
                if seen and min(len(v) for v in seen.values()) >= evaluations and \
                        len(seen) == len(rules_per_group):
                    break
                time.sleep(2)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        figs = Figures(nodes, series, samples)
        for name, evals in sorted(seen.items()):
            times = list(evals.values())
            figs.groups[name] = (statistics.median(times), max(times), rules_per_group[name])
        return figs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def table(results: list[Figures]) -> str:
    groups = sorted({g for r in results for g in r.groups})
    head = f"{'group':28} {'rules':>5} " + " ".join(f"{f'{r.nodes:,} nodes ms':>22}" for r in results)
    lines = [head, f"{'':28} {'':>5} " + " ".join(f"{'median / max':>22}" for _ in results)]
    for g in groups:
        n = next(r.groups[g][2] for r in results if g in r.groups)
        cells = []
        for r in results:
            med, mx, _ = r.groups.get(g, (float("nan"), float("nan"), 0))
            cells.append(f"{med * 1000:>12.1f} / {mx * 1000:>7.1f}")
        lines.append(f"{g:28} {n:>5} " + " ".join(cells))
    worst = [max(mx for _, mx, _ in r.groups.values()) for r in results]
    lines.append(f"{'slowest group (max)':28} {'':>5} " + " ".join(f"{w * 1000:>22.1f}" for w in worst))
    lines.append("series / samples in the TSDB: " + "; ".join(
        f"{r.nodes:,} nodes {r.series:,} / {r.samples:,}" for r in results))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[100])
    ap.add_argument("--interval", type=int, default=30, help="scrape interval of the synthetic history (s)")
    ap.add_argument("--evaluations", type=int, default=4, help="evaluations of each group to wait for")
    args = ap.parse_args()
    results = [measure(n, args.interval, args.evaluations, log=lambda m: print(m, file=sys.stderr))
               for n in args.nodes]
    print(f"Rule group evaluation time (Prometheus evaluationTime), history at a {args.interval} s scrape, "
          f"each group evaluated every {EVAL_S} s")
    print(table(results))


if __name__ == "__main__":
    main()
