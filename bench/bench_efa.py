"""Benchmark: EFA collector vs Debian's prometheus-node-exporter infiniband collector, same run.

Both read the same generated sysfs tree of a simulated p5.48xlarge (32 EFA devices, Linux 6.17
counter set). Measures, interleaving the two servers scrape by scrape:
  - HTTP scrape wall time (GET /metrics, one keep-alive client for both),
  - CPU time per scrape of each server process (utime+stime from /proc/<pid>/stat),
  - collector-only time: ours in-process (EfaCollector.collect) and each server's own
    collector duration metric,
  - what each exports (series counts; which driver counters node_exporter misses).

Debian's node_exporter 1.5.0 (procfs 0.8) requires board_id and hca_type files and a port
counters/ directory, which EFA devices do not have: on a faithful tree its infiniband collector
fails and exports nothing. To measure it doing work, the benchmark tree also gets those three
(empty) entries per device; our collector ignores them. The faithful-tree result is reported too.

Usage: python bench/bench_efa.py [--scrapes 200] [--node-exporter /usr/bin/prometheus-node-exporter]
"""

from __future__ import annotations

import argparse
import http.client
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from exporter.catalog import Families  # noqa: E402
from exporter.collector import Context  # noqa: E402
from exporter.collectors.efa import EfaCollector  # noqa: E402
from exporter.config import load  # noqa: E402
from exporter.profiles import PROFILES  # noqa: E402
from exporter.simulate.efa import EfaSim, kernel_files  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_tree(root: Path, node_exporter_compat: bool) -> Path:
    sim = EfaSim(root, PROFILES["p5.48xlarge"], set())
    sim.build()
    sim.advance(3600.0)
    cls = root / "sys" / "class" / "infiniband"
    if node_exporter_compat:
        for dev in cls.iterdir():
            (dev / "board_id").write_text("\n")
            (dev / "hca_type").write_text("\n")
            (dev / "ports" / "1" / "counters").mkdir(exist_ok=True)
    return root / "sys"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"server exited {proc.returncode}: {err}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/metrics")
            c.getresponse().read()
            c.close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("server did not start")


def series(text: str, prefix: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith(prefix):
                out[s.name] = out.get(s.name, 0) + 1
    return out


def sample(text: str, name: str, **labels: str) -> float | None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def stats_ms(xs: list[float]) -> str:
    xs = sorted(xs)
    p90 = xs[int(len(xs) * 0.9) - 1]
    return (f"median {statistics.median(xs) * 1e3:.2f} ms, p90 {p90 * 1e3:.2f} ms, "
            f"mean {statistics.mean(xs) * 1e3:.2f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--node-exporter", default="/usr/bin/prometheus-node-exporter")
    ap.add_argument("--read-workers", type=int, default=4, help="efa.read_workers for our exporter")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-efa-"))
    procs: list[subprocess.Popen] = []
    try:
        faithful = build_tree(tmp / "faithful", node_exporter_compat=False)
        sysfs = build_tree(tmp / "compat", node_exporter_compat=True)
        cfg = tmp / "config.yaml"
        cfg.write_text("node: {instance_type: p5.48xlarge}\ninstance: {imds: false}\n"
                       f"efa: {{read_workers: {args.read_workers}}}\n")

        # collector-only, in process
        ctx = Context(config=load(cfg, {"paths.sysfs": str(sysfs)}))
        col = EfaCollector(ctx)
        for _ in range(5):
            col.collect(Families())
        inproc = []
        for _ in range(args.scrapes):
            t = time.perf_counter()
            col.collect(Families())
            inproc.append(time.perf_counter() - t)
        files_read = sum(col.devices.read(d).files_read for d in col.discovery.discover())

        ours_port, ne_port = free_port(), free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "GPU_HEALTH_EXPORTER_IMDS": "off"}
        ours = subprocess.Popen([sys.executable, "-m", "exporter", "--config", str(cfg),
                                 "--collectors", "efa", "--path.sysfs", str(sysfs),
                                 "--listen", f"127.0.0.1:{ours_port}", "--log-level", "warning"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(ours)

        def node_exporter(tree: Path, port: int) -> subprocess.Popen:
            p = subprocess.Popen([args.node_exporter, "--collector.disable-defaults",
                                  "--collector.infiniband", f"--path.sysfs={tree}",
                                  f"--web.listen-address=127.0.0.1:{port}"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            procs.append(p)
            return p

        ne = node_exporter(sysfs, ne_port)
        wait_ready(ours_port, ours)
        wait_ready(ne_port, ne)

        conns = {n: http.client.HTTPConnection("127.0.0.1", p, timeout=30)
                 for n, p in (("ours", ours_port), ("ne", ne_port))}
        pids = {"ours": ours.pid, "ne": ne.pid}

        def get(name: str) -> str:
            c = conns[name]
            c.request("GET", "/metrics")
            return c.getresponse().read().decode()

        for _ in range(10):
            get("ours")
            get("ne")
        wall: dict[str, list[float]] = {"ours": [], "ne": []}
        cpu0 = {n: cpu_seconds(p) for n, p in pids.items()}
        coll: dict[str, list[float]] = {"ours": [], "ne": []}
        texts = {}
        for i in range(args.scrapes):
            for name in (("ours", "ne") if i % 2 == 0 else ("ne", "ours")):
                t = time.perf_counter()
                texts[name] = get(name)
                wall[name].append(time.perf_counter() - t)
                if name == "ours":
                    coll[name].append(sample(texts[name], "gpu_health_exporter_collector_duration_seconds",
                                             collector="efa") or 0.0)
                else:
                    coll[name].append(sample(texts[name], "node_scrape_collector_duration_seconds",
                                             collector="infiniband") or 0.0)
        cpu = {n: (cpu_seconds(p) - cpu0[n]) / args.scrapes for n, p in pids.items()}

        # node_exporter on the faithful tree
        ne2_port = free_port()
        ne2 = node_exporter(faithful, ne2_port)
        wait_ready(ne2_port, ne2)
        c = http.client.HTTPConnection("127.0.0.1", ne2_port, timeout=30)
        c.request("GET", "/metrics")
        faithful_text = c.getresponse().read().decode()

        ours_series = series(texts["ours"], "efa_")
        ne_series = series(texts["ne"], "node_infiniband_")
        port_files, device_files, _ = kernel_files((6, 17))
        ne_names = " ".join(ne_series)
        missed = [f for f in port_files + device_files if f not in ne_names]

        ratio_wall = statistics.median(wall["ours"]) / statistics.median(wall["ne"])
        ratio_cpu = cpu["ours"] / cpu["ne"] if cpu["ne"] else float("inf")
        print(f"# bench_efa: {args.scrapes} interleaved scrapes, 32 simulated EFA devices (p5.48xlarge, 6.17 "
              f"counter set), efa.read_workers {args.read_workers}\n"
              f"# host: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
              f"Python {platform.python_version()}")
        print(f"ours HTTP scrape:           {stats_ms(wall['ours'])}")
        print(f"node_exporter HTTP scrape:  {stats_ms(wall['ne'])}")
        print(f"ratio ours/node_exporter (median HTTP scrape): {ratio_wall:.2f}")
        print(f"server CPU per scrape:      ours {cpu['ours'] * 1e3:.2f} ms, "
              f"node_exporter {cpu['ne'] * 1e3:.2f} ms (ratio {ratio_cpu:.2f})")
        print(f"ours collector-only in process: {stats_ms(inproc)}; {files_read} files read per scrape "
              f"({statistics.median(inproc) / files_read * 1e6:.1f} us per file incl. parsing)")
        print(f"ours collector duration metric: {stats_ms(coll['ours'])}")
        print(f"node_exporter infiniband collector duration metric: {stats_ms(coll['ne'])}")
        print(f"ours exports {sum(ours_series.values())} efa_* series in {len(ours_series)} metrics "
              f"({sum(v for k, v in ours_series.items() if k.endswith('_total'))} counter series)")
        print(f"node_exporter exports {sum(ne_series.values())} node_infiniband_* series: "
              + ", ".join(f"{k} x{v}" for k, v in sorted(ne_series.items())))
        print(f"driver counter files node_exporter does not export ({len(missed)} of "
              f"{len(port_files) + len(device_files)}): {' '.join(missed)}")
        fs = sample(faithful_text, "node_scrape_collector_success", collector="infiniband")
        print("node_exporter on the faithful EFA tree (no board_id/hca_type/counters): collector success "
              f"{fs:g}, {sum(series(faithful_text, 'node_infiniband_').values())} node_infiniband_* series")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
