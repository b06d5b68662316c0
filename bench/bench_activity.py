"""What GPU activity (NVML GPM) adds to a scrape: CPU and wall time per GPU collection and
series, on a simulated p5.48xlarge (8 H100s) with the fake NVML's latencies on.

    PYTHONPATH=. python3 bench/bench_activity.py [--scrapes 300] [--rounds 3] [--json OUT.json]

Two nodes, identical but for GPM: "with" answers GPM as a Hopper does (a sample and a metrics
computation per GPU per collection); "without" has no GPM functions (driver_too_old: one probe,
then no GPM call). Their collections alternate in rounds, so a busy shared host slows both alike;
the figures are the medians of the rounds. The GPM latencies are a real H200's
(exporter/tools/simulate/nvml_synth.gpm_us(), from exporter/data/nvml_h200_gpm.json): the fake
sleeps them (as a real call waits inside NVML), so the wall time carries them and the CPU time
is the exporter's own Python work. Run with --no-latencies for the CPU alone without sleeps.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.collectors import collector_classes  # noqa: E402
from exporter.config import load  # noqa: E402
from exporter.deadline import Pool  # noqa: E402
from exporter.exposition import render  # noqa: E402
from exporter.nvml.session import NvmlSession  # noqa: E402
from exporter.profiles import PROFILES  # noqa: E402
from exporter.runner import Runner  # noqa: E402
from exporter.tools.simulate.nvml import fake_backend  # noqa: E402

collector_classes()
from exporter.collectors.gpu import GpuCollector  # noqa: E402
from exporter.compose import compose  # noqa: E402

ACTIVITY = ("gpu_sm_active_seconds_total", "gpu_sm_occupancy_seconds_total",
            "gpu_tensor_active_seconds_total", "gpu_dram_active_seconds_total", "gpu_activity_measured")


def node(gpm: bool, latencies: bool) -> Runner:
    fake = fake_backend(PROFILES["p5.48xlarge"], latencies=latencies)
    if not gpm:
        for dev in fake.devices:
            for key in [k for k in dev if k.startswith("nvmlGpm")]:
                del dev[key]
    pool = Pool()  # the bench process exits with it
    ctx = compose(load(None, {"node.instance_type": "p5.48xlarge"}), nvml=NvmlSession(fake, pool=pool),
                  pool=pool)
    return Runner([GpuCollector(ctx)], deadline_s=5.0, pool=pool)


def per_collection(runner: Runner, n: int) -> tuple[float, float]:
    """CPU and wall seconds per collection over `n` collections."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        runner.collect()
    return (time.process_time() - cpu) / n, (time.perf_counter() - wall) / n


def series(runner: Runner) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in render(runner.collect()).decode().splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            out[name] = out.get(name, 0) + 1
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scrapes", type=int, default=300, help="collections per node per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-latencies", action="store_true", help="the fake's calls cost nothing")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    latencies = not args.no_latencies
    runners = {"with": node(True, latencies), "without": node(False, latencies)}
    for r in runners.values():
        per_collection(r, 20)  # warm: identities, static reads, GPM probe and baseline
    rounds: dict[str, list[tuple[float, float]]] = {k: [] for k in runners}
    for _ in range(args.rounds):
        for name, r in runners.items():
            rounds[name].append(per_collection(r, args.scrapes))
    med = {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v))
           for k, v in rounds.items()}
    with_series = series(runners["with"])
    added = {n: with_series.get(n, 0) for n in ACTIVITY}
    out = {
        "gpus": 8, "latencies": latencies, "scrapes_per_round": args.scrapes, "rounds": args.rounds,
        "cpu_ms_per_collection": {k: round(c * 1e3, 3) for k, (c, _) in med.items()},
        "wall_ms_per_collection": {k: round(w * 1e3, 3) for k, (_, w) in med.items()},
        "gpm_cpu_ms_added": round((med["with"][0] - med["without"][0]) * 1e3, 3),
        "gpm_wall_ms_added": round((med["with"][1] - med["without"][1]) * 1e3, 3),
        "cpu_ms_rounds": {k: [round(c * 1e3, 3) for c, _ in v] for k, v in rounds.items()},
        "series_added": added, "series_added_total": sum(added.values()),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    for r in runners.values():
        r.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
