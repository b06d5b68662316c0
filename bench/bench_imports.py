"""Where the served exporter's memory goes: RSS after each group of imports in
the order the daemon makes them, in a fresh interpreter, then the served exporter itself.

    PYTHONPATH=. python3 bench/bench_imports.py [--scrapes 200] [--rounds 3] [--served-only]
    PYTHONPATH=. python3 bench/bench_imports.py --churn 24000

1. Imports: a child interpreter imports each group and reads VmRSS after it (the interpreter,
   prometheus_client's model modules, PyYAML, psutil, asyncio (without ssl: exporter/web/aio.py),
   ctypes, the exporter's modules, every collector, pynvml, the kubelet kind's h2, the IMDS
   client's http.client and the condition writer's requests).
2. Served: `python -m exporter --simulate p5.48xlarge` with every default collector, with the
   kubelet kind on (`--scenario k8s-pods`), and a node's defaults on this host (no GPU: NVML fails
   to load; IMDS off by config), each scraped `--scrapes` times with gzip, then VmRSS and
   the thread count (the deadline pool's workers are started on demand: the count varies by one
   or two between runs; tests/test_runtime_imports.py checks that the kind adds no thread of its
   own); `--rounds` runs of each, alternating; median and range.
3. --churn N instead: N renders of 1,000 steady series plus 8 series never seen before (a job's
   workload labels), and what that adds to RSS and to the renderer's prefix cache.
On a real node NVML's own libraries add 16-18.5 MiB to the served figure (docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # after PYTHONPATH: --churn measures the checkout it names

from tests.helpers import port_of, wait_until_serving  # noqa: E402

STAGES = """
import importlib
def rss():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024
stages = [("interpreter", None),
          ("prometheus_client's model (exporter.metric: metrics_core, samples, utils; not its servers)",
           "exporter.metric"),
          ("PyYAML", "yaml"), ("psutil", "psutil"),
          ("asyncio, without ssl (exporter.web.aio)", "exporter.web.aio"),
          ("ctypes", "ctypes"),
          ("the exporter's modules (exporter.cli: config, catalog, runner, xid, ...)", "exporter.cli"),
          ("the HTTP server (exporter.web.server, exporter.web.httpd)", "exporter.web.server"),
          ("every collector module (collectors.discover)", "DISCOVER"),
          ("pynvml (imported when NVML is first used)", "pynvml"),
          ("h2, hpack, hyperframe and the pod-resources client (the kubelet kind only)",
           "exporter.workload.grpc_h2"),
          ("http.client without ssl (the IMDS client: every EC2 node)", "IMDS"),
          ("requests, urllib3 and ssl (the GpuHealthy condition writer's client, over TLS)", "requests")]
prev = rss()
for what, mod in stages:
    if mod == "DISCOVER":
        from exporter import collectors
        collectors.discover()
    elif mod == "IMDS":
        from exporter.imds import prepare_http_client
        prepare_http_client()
    elif mod:
        importlib.import_module(mod)
    now = rss()
    print(f"  {what}: {now:.1f} MiB" + (f" (+{now - prev:.1f})" if mod else ""))
    prev = now
"""


def served(args: list[str], scrapes: int) -> tuple[float, int]:
    p = subprocess.Popen([sys.executable, "-m", "exporter", "--listen", "127.0.0.1:0", "--log-level", "error",
                          *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port = port_of(p)
        wait_until_serving(f"http://127.0.0.1:{port}/metrics", p, 60)
        for _ in range(scrapes):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                         headers={"Accept-Encoding": "gzip"})
            urllib.request.urlopen(req, timeout=30).read()
        status = Path(f"/proc/{p.pid}/status").read_text()
        return int(status.split("VmRSS:")[1].split()[0]) / 1024, len(os.listdir(f"/proc/{p.pid}/task"))
    finally:
        p.terminate()
        p.wait(20)


def churn(n: int) -> None:
    from exporter import exposition
    from exporter.metric import Metric, Sample

    def rss() -> float:
        return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) / 1024

    steady = []
    for i in range(100):
        m = Metric(f"steady_{i}", "help", "gauge")
        m.samples = [Sample(m.name, {"gpu": str(g), "uuid": f"GPU-{i:04d}-{g:08d}-aaaa-bbbb-cccc"}, 1.0)
                     for g in range(10)]
        steady.append(m)
    before = rss()
    for j in range(n):
        w = Metric("gpu_workload_info", "help", "gauge")
        w.samples = [Sample(w.name, {"gpu": str(g), "uuid": f"GPU-00000000-{g:04d}-aaaa-bbbb-cccc",
                                     "kind": "slurm", "workload": f"job-{j}-{g}-abcdefgh"}, 1.0)
                     for g in range(8)]
        exposition.render([*steady, w], openmetrics=True)
    print(f"{n} renders of 1,000 steady series and 8 new ones each: RSS +{rss() - before:.1f} MiB, "
          f"{len(exposition._prefixes)} prefixes cached")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--served-only", action="store_true")
    ap.add_argument("--churn", type=int, metavar="N", help="measure the renderer's caches under series churn")
    a = ap.parse_args()
    if a.churn:
        churn(a.churn)
        return 0
    if not a.served_only:
        print("RSS after each group of imports (a fresh interpreter):", flush=True)
        subprocess.run([sys.executable, "-c", STAGES], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       check=True)
    kinds = {"every default collector": ["--simulate", "p5.48xlarge"],
             "and the kubelet kind": ["--simulate", "p5.48xlarge", "--scenario", "k8s-pods"],
             "a node's defaults, no GPU": ["--config", str(ROOT / "tests/fixtures/config/no-imds.yaml")]}
    got: dict[str, list[tuple[float, int]]] = {k: [] for k in kinds}
    for r in range(a.rounds):
        for name in (list(kinds) if r % 2 == 0 else list(kinds)[::-1]):
            got[name].append(served(kinds[name], a.scrapes))
    print(f"served, after {a.scrapes} gzip scrapes ({a.rounds} runs):")
    for name, v in got.items():
        rss = [x for x, _ in v]
        print(f"  {name}: {statistics.median(rss):.1f} MiB ({min(rss):.1f}-{max(rss):.1f}), "
              f"{statistics.median(t for _, t in v):.0f} threads")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
