"""Benchmark: what the kubelet kind costs the exporter, in this tree and, with
--baseline-checkout DIR, in another checkout (its own exporter and simulated kubelet), alternating.

- served: `python -m exporter --simulate p5.48xlarge` with and without `--scenario k8s-pods`
  (two pods on the GPUs, served by the simulated kubelet: in this tree a process of its own, in a
  checkout before issue 36 a grpcio server inside the exporter), scraped --scrapes times with gzip;
  VmRSS and the number of threads (/proc/PID/task) of the exporter process.
- call: one fresh interpreter per tree: VmRSS after `import exporter.cli`, after the first List
  (the client's modules imported and one call made), then CPU (time.process_time(), every thread)
  and wall time per List call over --calls calls, against a simulated kubelet with 8 pods in
  another process. The grpcio client keeps its channel between calls; the h2 client connects anew
  for each.

Usage: PYTHONPATH=. python bench/bench_kubelet.py [--scrapes 100] [--calls 2000] [--rounds 3]
       [--baseline-checkout DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import port_of, wait_for  # noqa: E402

CALL = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
import exporter.cli  # noqa: F401
from exporter.workload.kubelet import KubeletClient
out = {"base": rss()}
c = KubeletClient(sys.argv[2], 5.0)
c.list()
out["first call"] = rss()
n = int(sys.argv[3])
t, w = time.process_time(), time.perf_counter()
for _ in range(n):
    c.list()
out["cpu ms"] = (time.process_time() - t) / n * 1e3
out["wall ms"] = (time.perf_counter() - w) / n * 1e3
out["after calls"] = rss()
out["threads"] = len(__import__("os").listdir("/proc/self/task"))
print(json.dumps(out))
"""

# A simulated kubelet with 8 pods, one GPU each, in its own process, from this tree: the h2 server
# answers grpcio and h2 clients alike.
KUBELET = r"""
import sys
sys.path.insert(0, sys.argv[1])
from exporter.tools.simulate.podresources_server import serve
uuids = [f"GPU-{i:08x}-1111-2222-3333-444455556666" for i in range(8)]
serve(sys.argv[2], [("training", f"pod-{i}", "trainer", "nvidia.com/gpu", [u]) for i, u in enumerate(uuids)])
"""


def served(checkout: Path, scenario: bool, scrapes: int) -> dict:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    args = [sys.executable, "-m", "exporter", "--simulate", "p5.48xlarge", "--log-level", "error",
            "--listen", "127.0.0.1:0"]
    if scenario:
        args += ["--scenario", "k8s-pods"]
    with tempfile.TemporaryDirectory() as state:
        proc = subprocess.Popen(args + ["--path.state-dir", state], cwd=checkout, stderr=subprocess.DEVNULL,
                                env={"PYTHONPATH": str(checkout), "PATH": "/usr/bin:/bin"})
        try:
            base = f"http://127.0.0.1:{port_of(proc)}"

            def ready() -> bool:
                try:
                    return opener.open(f"{base}/readyz", timeout=5).status == 200
                except OSError:
                    return False

            wait_for(ready, 60, "the exporter ready", proc, interval=0.2)
            req = urllib.request.Request(f"{base}/metrics", headers={"Accept-Encoding": "gzip"})
            for _ in range(scrapes):
                opener.open(req, timeout=30).read()
            text = opener.open(f"{base}/metrics", timeout=30).read().decode()
            if scenario:
                assert 'pod="llama-pretrain-0"' in text, "the kubelet kind found no pod"
            status = Path(f"/proc/{proc.pid}/status").read_text()
            rss = int(next(x for x in status.splitlines() if x.startswith("VmRSS:")).split()[1]) / 1024
            return {"rss": rss, "threads": len(list(Path(f"/proc/{proc.pid}/task").iterdir()))}
        finally:
            proc.terminate()
            proc.wait(30)


def call(checkout: Path, sock: str, calls: int) -> dict:
    r = subprocess.run([sys.executable, "-c", CALL, str(checkout), sock, str(calls)], capture_output=True,
                       text=True, timeout=600, check=False)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapes", type=int, default=100)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline-checkout", type=Path)
    args = ap.parse_args()
    trees = {"this tree": ROOT}
    if args.baseline_checkout:
        trees["baseline"] = args.baseline_checkout.resolve()
    tmp = Path(tempfile.mkdtemp(prefix="bench-kubelet-"))
    sock = str(tmp / "kubelet.sock")
    kubelet = subprocess.Popen([sys.executable, "-c", KUBELET, str(ROOT), sock], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert kubelet.stdout and kubelet.stdout.readline().strip() == "ready"
    res: dict[str, dict[str, list[float]]] = {t: {} for t in trees}
    try:
        for _ in range(args.rounds):
            for tree, path in trees.items():
                r = res[tree]
                for scenario in (False, True):
                    s = served(path, scenario, args.scrapes)
                    key = "k8s-pods" if scenario else "no kind"
                    r.setdefault(f"served {key} rss", []).append(s["rss"])
                    r.setdefault(f"served {key} threads", []).append(s["threads"])
                c = call(path, sock, args.calls)
                for k, v in c.items():
                    r.setdefault(f"call {k}", []).append(v)
    finally:
        assert kubelet.stdin
        kubelet.stdin.close()
        kubelet.wait(10)
    print(f"kubelet kind, simulated p5.48xlarge, {args.rounds} rounds (median, min-max), "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for tree, r in res.items():
        print(f"{tree} ({trees[tree]}):")
        for k, vs in r.items():
            print(f"  {k}: {statistics.median(vs):.3f} ({min(vs):.3f}-{max(vs):.3f})")


if __name__ == "__main__":
    main()
