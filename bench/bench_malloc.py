"""RSS of the exporter with and without the freed-memory hand-back (exporter.lifecycle.MallocTrim).

Starts the exporter (this host's GPUs through NVML, or `--simulate PROFILE`), GPU collector only
and then every collector, each as shipped and with MallocTrim's trim replaced by a no-op; scrapes
it 60 times with a new `requests` connection each and 60 times over one keep-alive gzip
connection (20 ms apart), waits past the first trim, and prints the RSS after the first scrape
and after the 120, the USS, and the largest mappings. Then the floor: a bare python3 with psutil,
with pynvml imported, after nvmlInit, and with the exporter imported too.

    PYTHONPATH=. python3 bench/bench_malloc.py [--simulate p5.48xlarge]

The exporter on this host runs with tests/fixtures/config/no-imds.yaml (IMDS off): nothing
leaves loopback.
"""

from __future__ import annotations

import argparse
import http.client
import subprocess
import sys
import time
from pathlib import Path

import psutil
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers import no_imds, port_of  # noqa: E402

NO_TRIM = """
import sys
import exporter.lifecycle
from exporter.cli import main
exporter.lifecycle._malloc_trim = lambda: (lambda: None)
sys.exit(main(sys.argv[1:]))
"""
SHIPPED = "import sys\nfrom exporter.cli import main\nsys.exit(main(sys.argv[1:]))\n"
ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def largest_mappings(pid: int, n: int = 4) -> dict[str, float]:
    rss: dict[str, int] = {}
    where = "?"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if not parts[0].endswith(":"):
                where = parts[5] if len(parts) > 5 else "[anon]"
            elif parts[0] == "Rss:":
                rss[where] = rss.get(where, 0) + int(parts[1])
    return {k: round(v / 1024, 1) for k, v in sorted(rss.items(), key=lambda x: -x[1])[:n]}


def run(name: str, code: str, args: list[str]) -> None:
    cmd = [sys.executable, "-c", code, "--listen", "127.0.0.1:0", "--log-level", "warning", *no_imds(args)]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port = port_of(p)  # it logs nothing at warning
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                requests.get(base + "/metrics", timeout=10)
                if requests.get(base + "/readyz", timeout=10).status_code == 200:
                    break
            except requests.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        ps = psutil.Process(p.pid)
        first = ps.memory_info().rss / 2**20
        for _ in range(60):
            requests.get(base + "/metrics", timeout=10)
            time.sleep(0.02)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for _ in range(60):
            conn.request("GET", "/metrics", headers={"Accept": ACCEPT, "Accept-Encoding": "gzip"})
            conn.getresponse().read()
            time.sleep(0.02)
        time.sleep(0.5)  # the main thread's next tick (every 0.25 s) has trimmed, when it trims
        m = ps.memory_full_info()
        print(f"{name}: rss after the first scrape {first:.1f} MiB, after 120 scrapes "
              f"{m.rss / 2**20:.1f} MiB (uss {m.uss / 2**20:.1f}); largest mappings "
              f"{largest_mappings(p.pid)}", flush=True)
    finally:
        p.terminate()
        p.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--simulate", metavar="PROFILE", help="a simulated node instead of this host's GPUs")
    a = ap.parse_args()
    sim = ["--simulate", a.simulate] if a.simulate else []
    for collectors in (["--collectors", "gpu"], []):
        for name, code in (("as shipped", SHIPPED), ("no trim", NO_TRIM)):
            run(f"{' '.join(collectors) or 'every collector'}, {name}", code, [*sim, *collectors])
    if a.simulate:
        return 0
    for code in ("import psutil", "import psutil, pynvml", "import psutil, pynvml; pynvml.nvmlInit()",
                 "import psutil, pynvml; pynvml.nvmlInit(); import exporter.cli"):
        rss = "; print(psutil.Process().memory_info().rss / 2**20)"
        out = subprocess.run([sys.executable, "-c", code + rss], capture_output=True, text=True)
        print(f"floor: {code}: {out.stdout.strip() or out.stderr.strip()[-200:]} MiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
