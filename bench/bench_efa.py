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
                                 [--read-workers N] [--baseline-checkout DIR]

--baseline-checkout DIR also serves the same tree from another checkout of this repository (e.g.
a `git worktree` of an older commit), scraped in the same interleaved loop, for before/after
figures from one run.

--whole-node: instead, serve `--simulate p5.48xlarge` with every collector (the EFA collector then
runs beside the others, sharing the GIL) from this checkout and, with --baseline-checkout, the
other one, interleaved; reports the whole scrape and the EFA collector's duration metric.
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

from exporter import collectors  # noqa: E402
from exporter.catalog import Families  # noqa: E402
from exporter.collectors.efa import EfaCollector  # noqa: E402
from exporter.compose import compose  # noqa: E402
from exporter.config import load  # noqa: E402
from exporter.efa import reader as efa_reader  # noqa: E402
from exporter.lifecycle import raise_fd_limit  # noqa: E402
from exporter.profiles import PROFILES  # noqa: E402
from exporter.tools.simulate.efa import EfaSim, kernel_files  # noqa: E402
from tests.helpers import port_of, stop_all, wait_until_serving  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


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


def checkout_version(path: Path) -> str:
    """The commit a checkout is at, and the last commits of the EFA collector and the server."""
    def log(*paths: str) -> str:
        r = subprocess.run(["git", "-C", str(path), "log", "-1", "--format=%h %s", "--", *paths],
                           capture_output=True, text=True)
        return r.stdout.strip()[:90] or "?"
    dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--", "exporter"],
                           capture_output=True, text=True).stdout.strip()
    return (f"{log()}{' (exporter/ modified)' if dirty else ''}"
            f"; EFA: {log('exporter/efa', 'exporter/collectors/efa.py')}"
            f"; server: {log('exporter/web/server.py', 'exporter/exposition.py')}")


def stats_ms(xs: list[float]) -> str:
    xs = sorted(xs)
    p90 = xs[int(len(xs) * 0.9) - 1]
    return (f"median {statistics.median(xs) * 1e3:.2f} ms, p90 {p90 * 1e3:.2f} ms, "
            f"mean {statistics.mean(xs) * 1e3:.2f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--node-exporter", default="/usr/bin/prometheus-node-exporter")
    ap.add_argument("--baseline-checkout", type=Path, default=None,
                    help="another checkout of this repository to serve the same tree, for before/after")
    ap.add_argument("--whole-node", action="store_true",
                    help="scrape the whole simulated p5 (every collector) instead; see the module docstring")
    args = ap.parse_args()
    if args.whole_node:
        return whole_node(args)

    tmp = Path(tempfile.mkdtemp(prefix="bench-efa-"))
    procs: list[subprocess.Popen] = []
    try:
        faithful = build_tree(tmp / "faithful", node_exporter_compat=False)
        sysfs = build_tree(tmp / "compat", node_exporter_compat=True)
        built = time.time()
        cfg = tmp / "config.yaml"
        cfg.write_text("node: {instance_type: p5.48xlarge}\ninstance: {imds: false}\n")

        # A directory changed within the last RACY_NS is listed again at every read (its stat cannot
        # be trusted yet): time the steady state, as on a node whose devices came up long ago.
        time.sleep(max(0.0, built + efa_reader.RACY_NS / 1e9 + 0.1 - time.time()))
        # collector-only, in process
        collectors.discover()  # the composition root: the collectors' config sections
        raise_fd_limit()  # and the process start-up's open-file limit (exporter.lifecycle)
        ctx = compose(load(cfg, {"paths.sysfs": str(sysfs)}))
        col = EfaCollector(ctx)
        for _ in range(5):
            col.collect(Families())
        inproc = []
        for _ in range(args.scrapes):
            t = time.perf_counter()
            col.collect(Families())
            inproc.append(time.perf_counter() - t)
        files_read = sum(col.devices.read(d).files_read for d in col.discovery.discover())

        # Every server binds port 0; the ports they took are read back once all are started.
        def exporter(checkout: Path) -> subprocess.Popen:
            env = {**os.environ, "PYTHONPATH": str(checkout)}  # the config turns IMDS off
            p = subprocess.Popen([sys.executable, "-m", "exporter", "--config", str(cfg),
                                  "--collectors", "efa", "--path.sysfs", str(sysfs),
                                  "--listen", "127.0.0.1:0", "--log-level", "warning"],
                                 cwd=checkout, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True)
            procs.append(p)
            return p

        servers = {"ours": exporter(ROOT)}
        if args.baseline_checkout:
            servers["base"] = exporter(args.baseline_checkout.resolve())

        def node_exporter(tree: Path) -> subprocess.Popen:
            p = subprocess.Popen([args.node_exporter, "--collector.disable-defaults",
                                  "--collector.infiniband", f"--path.sysfs={tree}",
                                  "--web.listen-address=127.0.0.1:0"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            procs.append(p)
            return p

        servers["ne"] = node_exporter(sysfs)
        ports = {n: port_of(proc) for n, proc in servers.items()}
        for n, proc in servers.items():
            wait_until_serving(f"http://127.0.0.1:{ports[n]}/metrics", proc)

        conns = {n: http.client.HTTPConnection("127.0.0.1", ports[n], timeout=30) for n in servers}
        pids = {n: proc.pid for n, proc in servers.items()}

        def get(name: str) -> str:
            c = conns[name]
            c.request("GET", "/metrics")
            return c.getresponse().read().decode()

        names = list(servers)
        for _ in range(10):
            for name in names:
                get(name)
        wall: dict[str, list[float]] = {n: [] for n in names}
        cpu0 = {n: cpu_seconds(p) for n, p in pids.items()}
        coll: dict[str, list[float]] = {n: [] for n in names}
        texts = {}
        for i in range(args.scrapes):
            for name in names[i % len(names):] + names[:i % len(names)]:
                t = time.perf_counter()
                texts[name] = get(name)
                wall[name].append(time.perf_counter() - t)
        cpu = {n: (cpu_seconds(p) - cpu0[n]) / args.scrapes for n, p in pids.items()}
        for name in names:  # the servers' own collector durations, from 20 more scrapes each
            for _ in range(20):
                text = get(name)
                if name == "ne":
                    coll[name].append(sample(text, "node_scrape_collector_duration_seconds",
                                             collector="infiniband") or 0.0)
                else:
                    coll[name].append(sample(text, "gpu_health_exporter_collector_duration_seconds",
                                             collector="efa") or 0.0)

        # node_exporter on the faithful tree
        ne2 = node_exporter(faithful)
        ne2_port = port_of(ne2)
        wait_until_serving(f"http://127.0.0.1:{ne2_port}/metrics", ne2)
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
              "counter set)\n"
              f"# host: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
              f"Python {platform.python_version()}\n# ours: {checkout_version(ROOT)}")
        if "base" in names:
            print(f"# baseline: {checkout_version(args.baseline_checkout)}")
        print(f"ours HTTP scrape:           {stats_ms(wall['ours'])}")
        print(f"node_exporter HTTP scrape:  {stats_ms(wall['ne'])}")
        print(f"ratio ours/node_exporter (median HTTP scrape): {ratio_wall:.2f}")
        print(f"server CPU per scrape:      ours {cpu['ours'] * 1e3:.2f} ms, "
              f"node_exporter {cpu['ne'] * 1e3:.2f} ms (ratio {ratio_cpu:.2f})")
        print(f"ours collector-only in process: {stats_ms(inproc)}; {files_read} files read per scrape "
              f"({statistics.median(inproc) / files_read * 1e6:.1f} us per file incl. parsing)")
        print(f"ours collector duration metric: {stats_ms(coll['ours'])}")
        if "base" in names:
            print(f"baseline HTTP scrape:       {stats_ms(wall['base'])} (ratio to node_exporter "
                  f"{statistics.median(wall['base']) / statistics.median(wall['ne']):.2f})")
            print(f"baseline server CPU per scrape: {cpu['base'] * 1e3:.2f} ms; "
                  f"collector duration metric: {stats_ms(coll['base'])}")
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
        stop_all(procs)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def whole_node(args: argparse.Namespace) -> int:
    checkouts = {"ours": ROOT}
    if args.baseline_checkout:
        checkouts["base"] = args.baseline_checkout.resolve()
    procs: dict[str, subprocess.Popen] = {}
    ports: dict[str, int] = {}
    try:
        for name, ck in checkouts.items():
            env = {**os.environ, "PYTHONPATH": str(ck)}
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "exporter", "--simulate", "p5.48xlarge", "--listen",
                 "127.0.0.1:0", "--log-level", "error"],
                cwd=ck, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for name in checkouts:
            ports[name] = port_of(procs[name])
            wait_until_serving(f"http://127.0.0.1:{ports[name]}/metrics", procs[name], 60)
        conns = {n: http.client.HTTPConnection("127.0.0.1", ports[n], timeout=30) for n in checkouts}

        def get(name: str) -> str:
            conns[name].request("GET", "/metrics")
            return conns[name].getresponse().read().decode()

        names = list(checkouts)
        for _ in range(10):
            for name in names:
                get(name)
        wall: dict[str, list[float]] = {n: [] for n in names}
        efa: dict[str, list[float]] = {n: [] for n in names}
        series_count: dict[str, int] = {}
        for i in range(args.scrapes):
            for name in names[i % len(names):] + names[:i % len(names)]:
                t = time.perf_counter()
                text = get(name)
                wall[name].append(time.perf_counter() - t)
                efa[name].append(sample(text, "gpu_health_exporter_collector_duration_seconds",
                                        collector="efa") or 0.0)
                series_count[name] = sum(1 for line in text.splitlines() if line and line[0] != "#")
                time.sleep(0.02)  # a little idle time between scrapes, as a real scraper leaves
        print(f"# bench_efa --whole-node: {args.scrapes} interleaved scrapes of the simulated p5.48xlarge, "
              f"every collector\n# host: {platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} CPUs, Python {platform.python_version()}")
        for name in names:
            print(f"# {name}: {checkout_version(checkouts[name])}")
            print(f"{name}: whole scrape {stats_ms(wall[name])}; EFA collector {stats_ms(efa[name])}; "
                  f"{series_count[name]} series")
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
