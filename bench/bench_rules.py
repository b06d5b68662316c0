"""Cost of the alert rules on a fleet: what one evaluation of each group in rules/gpu.yml (and the
node-level groups) reads and how long it takes, on a real Prometheus holding 7 hours of synthetic
history for N nodes (8 GPUs each, corrected and uncorrected ECC counters, volatile and aggregate).

    python bench/bench_rules.py [--nodes 100] [--interval 30]

It writes OpenMetrics, imports it with `promtool tsdb create-blocks-from openmetrics`, starts
Prometheus on that TSDB (rules not loaded), and runs every expression of rules/gpu.yml's groups as an
instant query with `stats=all`, reporting wall time and samples read; the figures scale linearly with
nodes and with samples per series (a 30 s scrape reads twice the samples of a 60 s one).
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.helpers import free_port, wait_until_serving  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HOURS = 7


def write_openmetrics(path: Path, nodes: int, interval: int, end: int) -> int:
    start = end - HOURS * 3600
    steps = HOURS * 3600 // interval
    rng = random.Random(1)
    n = 0
    with path.open("w") as f:
        f.write("# TYPE gpu_ecc_errors counter\n")
        for node in range(nodes):
            for gpu in range(8):
                base = (f'instance="gpu-node-{node}",job="gpu-health-exporter",gpu="{gpu}",'
                        f'uuid="GPU-{node}-{gpu}",pci_bus_id="00000000:{0x53 + gpu * 17:02X}:00.0"')
                rate = rng.choice([0, 0, 0, 0.001, 0.02])
                for etype, r in (("corrected", rate), ("uncorrected", 0.0)):
                    for counter in ("volatile", "aggregate"):
                        v = 1000.0 if counter == "aggregate" else 0.0
                        labels = f'{{{base},error_type="{etype}",counter="{counter}"}}'
                        lines = []
                        for i in range(steps + 1):
                            v += r * interval
                            lines.append(f"gpu_ecc_errors_total{labels} {v:.0f} {start + i * interval}\n")
                        f.writelines(lines)
                        n += len(lines)
        f.write("# EOF\n")
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--interval", type=int, default=30, help="scrape interval of the synthetic history (s)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-rules-"))
    end = int(time.time()) - 60
    try:
        t = time.monotonic()
        samples = write_openmetrics(tmp / "history.om", args.nodes, args.interval, end)
        gen_s = time.monotonic() - t
        t = time.monotonic()
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(tmp / "history.om"),
                        str(tmp / "tsdb")], check=True, capture_output=True, timeout=1800)
        import_s = time.monotonic() - t
        (tmp / "history.om").unlink()
        port = free_port()
        (tmp / "prometheus.yml").write_text("global: {}\n")
        proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'tsdb'}", "--storage.tsdb.retention.time=10y",
                                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=error"])
        api = f"http://127.0.0.1:{port}/api/v1"
        try:
            wait_until_serving(f"{api}/status/tsdb", proc, 60, "prometheus")
            print(f"{args.nodes} nodes, {args.nodes * 8 * 4} series, {samples:,} samples "
                  f"({HOURS} h at {args.interval} s); generated in {gen_s:.1f} s, "
                  f"imported in {import_s:.1f} s")
            print(f"{'rule':55} {'median ms':>10} {'samples read':>14}")
            rules = yaml.safe_load((ROOT / "rules" / "gpu.yml").read_text())
            for group in rules["groups"]:
                if group["name"] != "gpu-ecc":
                    continue
                for rule in group["rules"]:
                    name = rule.get("record") or rule.get("alert")
                    times, read = [], 0
                    for _ in range(5):
                        r = requests.get(f"{api}/query", params={"query": rule["expr"], "time": end,
                                                                  "stats": "all"}, timeout=120).json()
                        assert r["status"] == "success", r
                        times.append(r["data"]["stats"]["timings"]["evalTotalTime"] * 1000)
                        read = r["data"]["stats"]["samples"]["totalQueryableSamples"]
                    print(f"{name:55} {statistics.median(times):10.1f} {read:14,}")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
