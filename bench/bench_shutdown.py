"""SIGTERM-to-exit of the exporter process while sources are stuck (goal: 5 s).

Two cases, each run --runs times: a simulated p5 whose GPU 3 NVML calls hang for 600 s
(scenario gpu-nvml-hang, a scrape made after the onset so a read is stuck in NVML), and a
Lustre client tree whose llite stats file and an EFA counter file are FIFOs (opens that block
in the kernel). Reports each run's seconds from SIGTERM to exit and the exit status. Loopback
only; IMDS off.

    python bench/bench_shutdown.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.efa_trees import efa  # noqa: E402
from tests.helpers import no_imds, port_of  # noqa: E402
from tests.lustre_tree import FsSpec, LustreTree  # noqa: E402


def sigterm_to_exit(args: list[str], settle_s: float) -> tuple[float, int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "exporter", *no_imds(args), "--listen", "127.0.0.1:0"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port_of(proc)}/metrics"
    except AssertionError as e:
        proc.kill()
        raise RuntimeError(f"exporter did not start: {e}") from None
    requests.get(url, timeout=30)  # the first scrape (it listens: the connection is accepted)
    time.sleep(settle_s)
    requests.get(url, timeout=30)  # a scrape with the stuck read in it
    t = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        return float("inf"), -9
    return time.monotonic() - t, rc


def blocked_files_tree(root: Path) -> list[str]:
    tree = LustreTree(root, version="2.12.9", filesystems=[FsSpec("fs1", "/fsx")]).build()
    stats = tree.debug / "llite" / tree.filesystems[0].instance / "stats"
    stats.unlink()
    os.mkfifo(stats)
    counter = efa(root / "sys", "rdmap0s0", 0) / "ports/1/hw_counters/tx_bytes"
    counter.unlink()
    os.mkfifo(counter)
    p = tree.overrides()
    return ["--collectors", "lustre,efa", "--path.procfs", p["paths.procfs"],
            "--path.sysfs", p["paths.sysfs"], "--path.debugfs", p["paths.debugfs"],
            "--path.state-dir", str(root / "state")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}")
    print("| case | SIGTERM-to-exit (s), each run | exit status |")
    print("|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        cases = {
            "hung NVML call (gpu-nvml-hang)": (["--simulate", "p5.48xlarge", "--scenario", "gpu-nvml-hang",
                                                "--path.state-dir", f"{d}/state"], 4.0),
            "blocked Lustre stats and EFA counter reads (FIFOs)": (blocked_files_tree(Path(d) / "tree"), 0.5),
        }
        for name, (args, settle) in cases.items():
            runs = [sigterm_to_exit(args, settle) for _ in range(a.runs)]
            print(f"| {name} | {', '.join(f'{t:.2f}' for t, _ in runs)} | {sorted({rc for _, rc in runs})} |")


if __name__ == "__main__":
    main()
