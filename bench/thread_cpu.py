"""CPU of each thread of a simulated exporter, idle or under back-to-back keep-alive scrapes.

Starts `python -m exporter --simulate PROFILE --nvml-latencies` (every collector unless
--collectors), waits for it to settle, then either leaves it idle for --idle seconds or scrapes
/metrics --scrapes times over one keep-alive gzip connection asking for OpenMetrics (as
Prometheus does), and prints
the process's CPU and each thread's (utime+stime from /proc/<pid>/task/<tid>/stat), per second
idle or per scrape. Python does not name OS threads, so the exporter runs under a small wrapper
that writes its threads' names (native id -> threading name) to a file the bench reads.

    PYTHONPATH=. python3 bench/thread_cpu.py --idle 15
    PYTHONPATH=. python3 bench/thread_cpu.py --scrapes 300 [--collectors efa]
    PYTHONPATH=. python3 bench/thread_cpu.py --scrapes 300 --rounds 3 --baseline-checkout ../base

With --rounds N each exporter is measured N times (the median is given, and each round's figure);
with --baseline-checkout another checkout's exporter runs beside it, measured in alternating
blocks, so a change in the host's load touches both alike.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers import port_of, wait_until_serving  # noqa: E402

# What Prometheus 2.x/3.x sends: OpenMetrics preferred.
ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
          "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")

# Runs in the exporter's process: names its threads into NAMES every half second, then serves.
WRAPPER = """
import json, os, sys, threading, time
def names():
    while True:
        tmp = sys.argv[1] + ".tmp"
        with open(tmp, "w") as f:
            json.dump({t.native_id: t.name for t in threading.enumerate()}, f)
        os.replace(tmp, sys.argv[1])
        time.sleep(0.5)
threading.Thread(target=names, name="bench-thread-names", daemon=True).start()
from exporter.cli import main
sys.exit(main(sys.argv[2:]))
"""


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of `pid`."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


class Exporter:
    """One simulated exporter process (from `checkout`) with a keep-alive connection."""

    def __init__(self, checkout: Path, tmp: str, tag: str, args: argparse.Namespace) -> None:
        self.names_file = os.path.join(tmp, f"threads-{tag}.json")
        cmd = [sys.executable, "-c", WRAPPER, self.names_file, "--listen", "127.0.0.1:0",
               "--log-level", "warning", "--simulate", args.profile, "--nvml-latencies"]
        if args.collectors:
            cmd += ["--collectors", args.collectors]
        self.proc = subprocess.Popen(cmd, cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)},
                                     stdout=subprocess.DEVNULL)
        self.conn: http.client.HTTPConnection | None = None

    def ready(self) -> None:
        port = port_of(self.proc)  # it binds port 0, logs nothing at warning
        wait_until_serving(f"http://127.0.0.1:{port}/metrics", self.proc, 60, "exporter")
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for _ in range(10):
            self.scrape()

    def scrape(self) -> None:
        assert self.conn is not None
        self.conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip", "Accept": ACCEPT})
        self.conn.getresponse().read()

    def names(self) -> dict[int, str]:
        return {int(k): v for k, v in json.loads(Path(self.names_file).read_text()).items()
                if k.isdigit()}  # a thread not started yet has no native id

    def measure(self, scrapes: int, idle: float | None) -> tuple[dict[int, float], float, int]:
        """CPU seconds of each thread over the run, its wall time, and the exporter's threads."""
        before, t0 = thread_cpu(self.proc.pid), time.perf_counter()
        if idle:
            time.sleep(idle)
        else:
            for _ in range(scrapes):
                self.scrape()
        after, wall = thread_cpu(self.proc.pid), time.perf_counter() - t0
        names = self.names()
        used = {tid: after[tid] - before.get(tid, 0.0) for tid in after
                if names.get(tid) != "bench-thread-names"}  # the wrapper's own thread is not the exporter's
        return used, wall, len(after) - 1

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="p5.48xlarge")
    p.add_argument("--collectors", default=None, help="comma-separated (default: every collector)")
    p.add_argument("--baseline-checkout", type=Path, default=None,
                   help="another checkout (a git worktree of an older commit) measured in the same run, "
                        "in alternating blocks, for before/after figures")
    p.add_argument("--rounds", type=int, default=1, help="measurements of each exporter (alternating)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--idle", type=float, metavar="SECONDS", help="measure the idle exporter")
    what.add_argument("--scrapes", type=int, help="measure this many back-to-back scrapes")
    args = p.parse_args()
    root = Path(__file__).resolve().parent.parent
    checkouts = {"ours": root}
    if args.baseline_checkout:
        checkouts["baseline"] = args.baseline_checkout.resolve()
    per, unit = (args.idle, "ms CPU per second idle") if args.idle else (args.scrapes, "ms CPU per scrape")
    with tempfile.TemporaryDirectory(prefix="thread-cpu-") as tmp:
        exporters = {tag: Exporter(ck, tmp, tag, args) for tag, ck in checkouts.items()}
        results: dict[str, list[tuple[dict[int, float], float, int]]] = {tag: [] for tag in exporters}
        try:
            for e in exporters.values():
                e.ready()
            time.sleep(3.0)  # first slow-cadence readings, and the thread names files
            order = list(exporters)
            for r in range(args.rounds):
                for tag in order if r % 2 == 0 else order[::-1]:
                    results[tag].append(exporters[tag].measure(args.scrapes, args.idle))
            names = {tag: e.names() for tag, e in exporters.items()}
        finally:
            for e in exporters.values():
                e.stop()
    for tag, runs in results.items():
        label = args.collectors or "every collector"
        if len(exporters) > 1:
            label = f"{tag} ({checkouts[tag].name}) {label}"
        totals = [sum(used.values()) for used, _, _ in runs]
        sims = [sum(c for tid, c in used.items() if names[tag].get(tid) == "simulation")
                for used, _, _ in runs]
        used, wall, threads = runs[-1]
        spread = ""
        if len(runs) > 1:
            spread = " (" + ", ".join(f"{1e3 * t / per:.2f}" for t in totals) + f" over {len(runs)} rounds)"
        total, sim = statistics.median(totals), statistics.median(sims)
        print(f"{label}: process {1e3 * total / per:.2f} {unit}{spread}"
              + ("" if args.idle else f", wall {1e3 * wall / per:.1f} ms per scrape")
              + f", {threads} threads; {1e3 * (total - sim) / per:.2f} without the simulation's own thread")
        for tid, cpu in sorted(used.items(), key=lambda kv: -kv[1]):
            if cpu > 0:
                print(f"  {names[tag].get(tid, '?')}: {1e3 * cpu / per:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
