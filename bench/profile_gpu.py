"""Profile the GPU collector's collection (cProfile, top functions by own time).

    PYTHONPATH=. python3 bench/profile_gpu.py [--real [--replicate 8]] [--scrapes 300]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_gpu  # noqa: E402

from exporter.catalog import Families  # noqa: E402
from exporter.runner import Runner  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--real", action="store_true")
    p.add_argument("--replicate", type=int, default=0)
    p.add_argument("--scrapes", type=int, default=300)
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args()
    sim = None
    if not args.real:
        from exporter.tools.simulate import Simulation

        sim = Simulation("p5.48xlarge", []).build()
    from exporter.collectors.gpu import GpuCollector

    ctx = bench_gpu.context(args.real, None, sim)
    if args.real and args.replicate:
        bench_gpu.use_replicated(ctx, args.replicate)
    c = GpuCollector(ctx)
    runner = Runner([c], deadline_s=10, pool=ctx.pool)
    # read inline so that cProfile (this thread only) sees the NVML reads too
    c._read_all = lambda: {i: c._read_fast(i) for i in c.gpus}
    for _ in range(20):
        runner.collect()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.scrapes):
        c.collect(Families())
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
    runner.close()
    if sim:
        sim.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
