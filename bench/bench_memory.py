"""RSS of the exporter by stage, with and without NVML, and over many scrapes.

Each variant runs in a fresh interpreter (so nothing one loaded counts for the other) that
prints its RSS (VmRSS, MiB) after each stage:

- python: the bare interpreter;
- imports: exporter.cli and every collector module (prometheus_client, yaml, psutil...);
- built: the simulated p5.48xlarge's context and collectors (config, sysfs/procfs trees, fake
  kernel log), malloc limited to one arena as the daemon does;
- first collection, then after each checkpoint of an in-process loop of collections, each
  rendered as /metrics serves it (exposition + process metrics).

Variants: `no-nvml` (the node has no NVML: the GPU collector fails, nothing NVML is loaded),
`fake-nvml` (the simulated node's fake backend, the H200 capture behind 8 GPUs),
`pynvml-import` (no-nvml plus `import pynvml`, the Python binding's own cost; nvmlInit needs a
driver and is measured on a GPU host only), and `served` (the exporter as deployed:
`python -m exporter` serving the no-NVML simulated node on 127.0.0.1, scraped over HTTP with
gzip as Prometheus does; its HTTP server, asyncio, is what the in-process variants leave out).

`imds` measures what the IMDS client (http.client without ssl) adds to a running exporter: a
process serving the no-NVML simulated node as `served` does (runner and HTTP server started,
scraped over HTTP from this process) is read (VmRSS) after `--other-scrapes` scrapes, then runs one
IMDSv2 identity lookup (the client's imports, a connection, token + 3 GETs) against a fake IMDS on
127.0.0.1 that this process serves, and is read again right after and after as many scrapes
more. Alone: `--variants imds`.

    PYTHONPATH=. python3 bench/bench_memory.py [--scrapes 100000] [--variants LIST] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import port_of  # noqa: E402

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
variant, scrapes = sys.argv[2], int(sys.argv[3])
checkpoints = [int(x) for x in sys.argv[4].split(",") if int(x) <= scrapes]

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)

out = {"python": rss()}
from exporter import collectors
from exporter.arguments import build_parser
from exporter.lifecycle import limit_malloc_arenas
from exporter.startup import build_context
collectors.collector_classes()
out["imports"] = rss()
if variant == "pynvml-import":
    import pynvml  # noqa: F401
    out["pynvml imported"] = rss()
limit_malloc_arenas()
argv = ["--simulate", "p5.48xlarge", "--log-level", "error"]
if variant != "fake-nvml":
    argv += ["--nvml-capture", "/nonexistent/no-nvml-on-this-node.json"]
ctx, sim = build_context(build_parser().parse_args(argv))
from exporter.exposition import render
from exporter.process import process_metrics
from exporter.runner import Runner
import logging
logging.disable(logging.ERROR)
built = collectors.build(ctx)
runner = Runner.from_config(built, ctx.config, ctx.pool)
runner.start()
out["built"] = rss()
body = render(runner.collect() + process_metrics())
out["first collection"] = rss()
t = time.perf_counter()
for i in range(1, scrapes + 1):
    body = render(runner.collect() + process_metrics())
    if i in checkpoints:
        out[f"after {i:,} scrapes"] = rss()
        out["seconds per scrape"] = round((time.perf_counter() - t) / i, 5)
        print(json.dumps(out), flush=True)  # progress: a long run can be read before it ends
out["bytes"] = len(body)
runner.close()
sim.close()
print(json.dumps(out))
"""

CHECKPOINTS = (100, 1_000, 10_000, 50_000, 100_000)


def measure(variant: str, scrapes: int) -> dict:
    cp = ",".join(str(c) for c in sorted({*CHECKPOINTS, scrapes}))
    r = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), variant, str(scrapes), cp],
                       capture_output=True, text=True, timeout=24 * 3600, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{variant}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _vmrss(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for {pid}")


def served(scrapes: int) -> dict:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with tempfile.TemporaryDirectory() as state:
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "--simulate", "p5.48xlarge", "--log-level", "error",
             "--nvml-capture", "/nonexistent/no-nvml-on-this-node.json", "--listen", "127.0.0.1:0",
             "--path.state-dir", state], cwd=ROOT, stderr=subprocess.DEVNULL)
        try:
            base = f"http://127.0.0.1:{port_of(proc)}"  # it logs nothing at error
            deadline = time.monotonic() + 60
            while True:
                try:
                    if opener.open(f"{base}/readyz", timeout=5).status == 200:
                        break
                except OSError as e:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"served: not ready (exit status {proc.poll()})") from e
                    time.sleep(0.2)
            out = {"ready": _vmrss(proc.pid)}
            req = urllib.request.Request(f"{base}/metrics", headers={"Accept-Encoding": "gzip"})
            t = time.perf_counter()
            for i in range(1, scrapes + 1):
                body = opener.open(req, timeout=30).read()
                if i == 1:
                    out["first scrape"] = _vmrss(proc.pid)
                if i in CHECKPOINTS or i == scrapes:
                    out[f"after {i:,} scrapes"] = _vmrss(proc.pid)
                    out["seconds per scrape"] = round((time.perf_counter() - t) / i, 5)
            out["gzip bytes"] = len(body)
            return out
        finally:
            proc.terminate()
            proc.wait(30)


IMDS_CHILD = r"""
import sys
sys.path.insert(0, sys.argv[1])
from exporter import collectors
from exporter.arguments import build_parser
from exporter.lifecycle import limit_malloc_arenas
from exporter.startup import build_context
from exporter.web.server import Server, limits_from_config
import logging
collectors.collector_classes()
limit_malloc_arenas()
logging.disable(logging.ERROR)
built = build_context(build_parser().parse_args(
    ["--simulate", "p5.48xlarge", "--log-level", "error",
     "--nvml-capture", "/nonexistent/no-nvml-on-this-node.json", "--path.state-dir", sys.argv[2]]))
# (ctx, simulation); a checkout from before issue 19 returned the Context, which held it
ctx, sim = built if isinstance(built, tuple) else (built, built.simulation)
from exporter.runner import Runner
runner = Runner.from_config(collectors.build(ctx), ctx.config, ctx.pool)
server = Server(runner, "127.0.0.1", 0, None, limits_from_config(ctx.config))
runner.start()
server.start()
print(server.port, flush=True)
url = sys.stdin.readline().strip()  # the parent's fake IMDS, once it has read the baseline
if url:  # else the control: no lookup
    from exporter import imds
    getattr(imds, "prepare_http_client", lambda: None)()  # as IdentitySource does (a checkout before: none)
    client = imds.ImdsClient(url, timeout_s=2.0)
    print(client.fetch().instance_type, flush=True)
    getattr(client, "close", lambda: None)()  # (the urllib client before issue 21 had none)
else:
    print("p5.48xlarge", flush=True)
sys.stdin.readline()  # the parent is done
server.shutdown()
runner.close()
sim.close()
"""


def imds_cost(scrapes: int, root: Path = ROOT) -> dict:
    """VmRSS of a serving exporter before and after its first IMDS lookup, and of a control that
    makes no lookup (see the docstring)."""
    from exporter.tools.simulate.imds import FakeImdsServer

    fake = FakeImdsServer({"instance-type": "p5.48xlarge", "instance-id": "i-0123456789abcdef0",
                           "placement/availability-zone": "us-east-2b"})
    fake.start()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def scrape_n(port: int, n: int) -> None:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "gzip"})
        for _ in range(n):
            opener.open(req, timeout=30).read()

    def one(url: str) -> dict:
        with tempfile.TemporaryDirectory() as state:
            proc = subprocess.Popen([sys.executable, "-c", IMDS_CHILD, str(root), state], cwd=root, text=True,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            try:
                port = int(proc.stdout.readline())
                scrape_n(port, scrapes)
                out = {"before": _vmrss(proc.pid)}
                proc.stdin.write(url + "\n")
                proc.stdin.flush()
                assert proc.stdout.readline().strip() == "p5.48xlarge"
                out["right after"] = _vmrss(proc.pid)
                scrape_n(port, scrapes)
                out["after as many scrapes more"] = _vmrss(proc.pid)
                proc.stdin.write("\n")
                proc.stdin.flush()
                proc.wait(30)
                return out
            finally:
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait(30)

    try:
        res = {"scrapes": scrapes, "lookup": one(fake.url), "control (no lookup)": one("")}
    finally:
        fake.close()
    res["lookup cost MiB"] = round(res["lookup"]["after as many scrapes more"]
                                   - res["control (no lookup)"]["after as many scrapes more"], 1)
    return res


VARIANTS = ("no-nvml", "fake-nvml", "pynvml-import", "served", "imds")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scrapes", type=int, default=100_000,
                   help="collections in the loop of the no-nvml variant (default 100,000)")
    p.add_argument("--other-scrapes", type=int, default=1_000,
                   help="collections in the loop of the other variants (default 1,000)")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="comma-separated variants to run (default: all): " + ", ".join(VARIANTS))
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args()
    res = {"command": " ".join(sys.argv)}
    wanted = args.variants.split(",")
    for variant, n in (("no-nvml", args.scrapes), ("fake-nvml", args.other_scrapes),
                       ("pynvml-import", 0), ("served", args.other_scrapes), ("imds", args.other_scrapes)):
        if variant not in wanted:
            continue
        t = time.perf_counter()
        if variant == "served":
            res[variant] = served(n)
        elif variant == "imds":
            res[variant] = imds_cost(n)
        else:
            res[variant] = measure(variant, n)
        print(f"{variant}: {time.perf_counter() - t:.0f}s", file=sys.stderr, flush=True)
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
