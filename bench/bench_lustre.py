"""Lustre collector cost: one FSx mount with 16 and 64 OSTs, per-OST series off and on.

Builds the simulated 2.15 tree (exporter/simulate/lustre.py, full-size import/stats files) with
the OST count patched, then times LustreCollector.collect() in-process (file reads, parsing,
aggregation, statvfs seam; no HTTP) and counts the series it emits.

    python bench/bench_lustre.py [--iterations 300]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.catalog import Families  # noqa: E402
from exporter.collector import Context  # noqa: E402
from exporter.collectors.lustre import LustreCollector  # noqa: E402
from exporter.config import load  # noqa: E402
from exporter.profiles import PROFILES  # noqa: E402
from exporter.simulate import lustre as sim_lustre  # noqa: E402


def build(root: Path, osts: int) -> None:
    sim_lustre.OSTS = osts
    for d in ("proc", "sys/kernel/debug"):
        (root / d).mkdir(parents=True, exist_ok=True)
    sim_lustre.LustreSim(root, PROFILES["p5.48xlarge"], set()).build()


def run(osts: int, per_target: bool, iterations: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-lustre-") as tmp:
        root = Path(tmp)
        build(root, osts)
        cfg = load(None, {"paths.procfs": str(root / "proc"), "paths.sysfs": str(root / "sys"),
                          "paths.debugfs": str(root / "sys/kernel/debug"), "lustre.per_target": per_target})
        c = LustreCollector(Context(config=cfg, simulation=SimpleNamespace(root=root)))  # type: ignore[arg-type]
        for _ in range(5):  # warm caches (dentries, the mount mapping)
            c.collect(Families())
        times, cpu = [], []
        for _ in range(iterations):
            out = Families()
            t, tc = time.perf_counter(), time.process_time()
            c.collect(out)
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - tc)
        series = sum(len(m.samples) for m in out)
    times.sort()
    return {"cpu_ms": statistics.median(cpu) * 1e3, "min_ms": times[0] * 1e3,
            "median_ms": statistics.median(times) * 1e3,
            "p95_ms": times[int(len(times) * 0.95)] * 1e3, "series": series}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=300)
    args = p.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {load:.2f}, {args.iterations} collections each")
    print("| OSTs | per_target | wall min ms | wall median ms | wall p95 ms | CPU median ms | series |")
    print("|---|---|---|---|---|---|---|")
    for osts in (16, 64):
        for per_target in (False, True):
            r = run(osts, per_target, args.iterations)
            print(f"| {osts} | {str(per_target).lower()} | {r['min_ms']:.2f} | {r['median_ms']:.2f} | "
                  f"{r['p95_ms']:.2f} | {r['cpu_ms']:.2f} | "
                  f"{r['series']:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
