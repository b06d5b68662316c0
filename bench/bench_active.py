"""What the `active` collector adds to a collection: it reads the four result files in
<state_dir>/active/ (or finds none) and exports them, every scrape.

    .venv/bin/python bench/bench_active.py [--rounds 2000]

Figures: median wall and CPU (process time) per collection, in ms, with no result on record and
with all four checks' results (8 GPUs' DCGM and NVML findings) on record.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from types import SimpleNamespace
from typing import Any

from exporter import collectors
from exporter.activecheck import result
from exporter.activecheck.result import CheckResult, Finding
from exporter.catalog import Families
from exporter.collectors.active import ActiveCollector
from exporter.config import load


def measure(state_dir: str, rounds: int) -> tuple[float, float]:
    ctx: Any = SimpleNamespace(config=load(None, {"paths.state_dir": state_dir}))
    ctx.paths = ctx.config.paths
    c = ActiveCollector(ctx)
    wall, cpu = [], []
    for _ in range(rounds):
        w, p = time.perf_counter(), time.process_time()
        c.collect(Families())
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - p)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2000)
    args = ap.parse_args()
    collectors.discover()
    with tempfile.TemporaryDirectory() as d:
        wall, cpu = measure(d, args.rounds)
        print(f"none on record: wall {wall:.3f} ms, CPU {cpu:.3f} ms")
        now = time.time()
        for check in result.CHECKS:
            gpus = [Finding(str(i), t, "pass", "Hardware") for i in range(8)
                    for t in ("memory", "pcie", "nvlink")]
            result.write(d, CheckResult(check, "pass", "ok", started_at=now - 60, finished_at=now,
                                        findings=gpus if check in ("nvml", "dcgm") else [],
                                        measurements={"bus_bandwidth_bytes_per_second": 4.8e11}))
        wall, cpu = measure(d, args.rounds)
        print(f"four on record: wall {wall:.3f} ms, CPU {cpu:.3f} ms")


if __name__ == "__main__":
    main()
