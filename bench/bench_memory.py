"""RSS of the exporter by stage, with and without NVML, and over many scrapes (issue 14).

Each variant runs in a fresh interpreter (so nothing one loaded counts for the other) that
prints its RSS (VmRSS, MiB) after each stage:

- python: the bare interpreter;
- imports: exporter.cli and every collector module (prometheus_client, yaml, psutil...);
- built: the simulated p5.48xlarge's context and collectors (config, sysfs/procfs trees, fake
  kernel log), malloc limited to one arena as the daemon does;
- first collection, then after each checkpoint of an in-process loop of collections, each
  rendered as /metrics serves it (exposition + process metrics).

Variants: `no-nvml` (the node has no NVML: the GPU collector fails, nothing NVML is loaded),
`fake-nvml` (the simulated node's fake backend, the H200 capture behind 8 GPUs), and
`pynvml-import` (no-nvml plus `import pynvml`, the Python binding's own cost; nvmlInit needs a
driver and is measured on a GPU host only).

    PYTHONPATH=. python3 bench/bench_memory.py [--scrapes 100000] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

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
from exporter.cli import build_context, build_parser, limit_malloc_arenas
collectors.collector_classes()
out["imports"] = rss()
if variant == "pynvml-import":
    import pynvml  # noqa: F401
    out["pynvml imported"] = rss()
limit_malloc_arenas()
argv = ["--simulate", "p5.48xlarge", "--log-level", "error"]
if variant != "fake-nvml":
    argv += ["--nvml-capture", "/nonexistent/no-nvml-on-this-node.json"]
ctx = build_context(build_parser().parse_args(argv))
from exporter.exposition import render
from exporter.process import process_metrics
from exporter.runner import Runner
import logging
logging.disable(logging.ERROR)
built = collectors.build(ctx)
runner = Runner.from_config(built, ctx.config)
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
ctx.simulation.close()
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scrapes", type=int, default=100_000,
                   help="collections in the loop of the no-nvml variant (default 100,000)")
    p.add_argument("--other-scrapes", type=int, default=1_000,
                   help="collections in the loop of the other variants (default 1,000)")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args()
    res = {"command": " ".join(sys.argv)}
    for variant, n in (("no-nvml", args.scrapes), ("fake-nvml", args.other_scrapes),
                       ("pynvml-import", 0)):
        t = time.perf_counter()
        res[variant] = measure(variant, n)
        print(f"{variant}: {time.perf_counter() - t:.0f}s", file=sys.stderr, flush=True)
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
