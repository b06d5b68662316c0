"""CPU of each thread of a simulated exporter, idle or under back-to-back keep-alive scrapes.

Starts `python -m exporter --simulate PROFILE --nvml-latencies` (every collector unless
--collectors), waits for it to settle, then either leaves it idle for --idle seconds or scrapes
/metrics --scrapes times over one keep-alive gzip connection (as Prometheus does), and prints
the process's CPU and each thread's (utime+stime from /proc/<pid>/task/<tid>/stat), per second
idle or per scrape. Python does not name OS threads, so the exporter runs under a small wrapper
that writes its threads' names (native id -> threading name) to a file the bench reads.

    PYTHONPATH=. python3 bench/thread_cpu.py --idle 15
    PYTHONPATH=. python3 bench/thread_cpu.py --scrapes 300 [--collectors efa]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers import free_port, wait_until_serving  # noqa: E402

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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="p5.48xlarge")
    p.add_argument("--collectors", default=None, help="comma-separated (default: every collector)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--idle", type=float, metavar="SECONDS", help="measure the idle exporter")
    what.add_argument("--scrapes", type=int, help="measure this many back-to-back scrapes")
    args = p.parse_args()
    root = Path(__file__).resolve().parent.parent
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="thread-cpu-") as tmp:
        names_file = os.path.join(tmp, "threads.json")
        cmd = [sys.executable, "-c", WRAPPER, names_file, "--listen", f"127.0.0.1:{port}",
               "--log-level", "warning", "--simulate", args.profile, "--nvml-latencies"]
        if args.collectors:
            cmd += ["--collectors", args.collectors]
        proc = subprocess.Popen(cmd, cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                                stdout=subprocess.DEVNULL)
        try:
            wait_until_serving(f"http://127.0.0.1:{port}/metrics", proc, 60, "exporter")
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

            def scrape() -> None:
                conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
                conn.getresponse().read()

            for _ in range(10):
                scrape()
            time.sleep(3.0)  # first slow-cadence readings, and the thread names file
            before, t0 = thread_cpu(proc.pid), time.perf_counter()
            if args.idle:
                time.sleep(args.idle)
            else:
                for _ in range(args.scrapes):
                    scrape()
            after, wall = thread_cpu(proc.pid), time.perf_counter() - t0
            names = {int(k): v for k, v in json.loads(Path(names_file).read_text()).items()}
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    per, unit = (wall, "ms CPU per second idle") if args.idle else (args.scrapes, "ms CPU per scrape")
    used = {tid: after[tid] - before.get(tid, 0.0) for tid in after
            if names.get(tid) != "bench-thread-names"}  # the wrapper's own thread is not the exporter's
    total = sum(used.values())
    print(f"{args.collectors or 'every collector'}: process {1e3 * total / per:.2f} {unit}"
          + ("" if args.idle else f", wall {1e3 * wall / per:.1f} ms per scrape"))
    for tid, cpu in sorted(used.items(), key=lambda kv: -kv[1]):
        if cpu > 0:
            print(f"  {names.get(tid, 'main' if tid == proc.pid else '?')}: {1e3 * cpu / per:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
