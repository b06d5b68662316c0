"""Lustre collector CPU per OST: one simulated FSx mount with 8 to 256 OSTs.

Builds the simulated 2.15 tree (exporter/tools/simulate/lustre.py, `LustreSim(osts=N)`, full-size
import/state/stats files) and runs LustreCollector.collect() in-process: file reads (through the
collector's reader thread), parsing, aggregation and statvfs (the simulated node's answer; no
HTTP). CPU is time.process_time(), so the reader thread's CPU counts and the other load on the
host does not. Each repetition builds a fresh tree and collector, warms it up, then takes the
median CPU of `--iterations` collections at each OST count.

Printed per repetition: CPU per collection at each OST count, and the CPU per OST, the slope
of a least-squares line through those points (the cost of one more OST). Then the median and the
spread (min-max) of each over the repetitions.

    python bench/bench_lustre.py [--osts 8,32,64,128,256] [--repetitions 3] [--iterations 40]
                                 [--per-target] [--kernel-files] [--min]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter import collectors  # noqa: E402
from exporter.catalog import Families  # noqa: E402
from exporter.collectors.lustre import LustreCollector  # noqa: E402
from exporter.compose import compose  # noqa: E402
from exporter.config import load  # noqa: E402
from exporter.profiles import PROFILES  # noqa: E402
from exporter.tools.simulate import lustre as sim_lustre  # noqa: E402


def collector(root: Path, osts: int, per_target: bool, kernel_files: bool = False) -> LustreCollector:
    for d in ("proc", "sys/kernel/debug"):
        (root / d).mkdir(parents=True, exist_ok=True)
    sim_lustre.LustreSim(root, PROFILES["p5.48xlarge"], set(), osts=osts).build()
    collectors.discover()  # the composition root: the collectors' config sections
    cfg = load(None, {"paths.procfs": str(root / "proc"), "paths.sysfs": str(root / "sys"),
                      "paths.debugfs": str(root / "sys/kernel/debug"), "lustre.per_target": per_target,
                      "lustre.lfs_command": "", "lustre.use_ioctl": False})
    c = LustreCollector(compose(cfg))
    # the simulated node's statvfs answer, as `--simulate` wires it (the collector's seam)
    c.statvfs = sim_lustre.fake_statvfs(root)
    if kernel_files:  # the tree does not change during the run: read it as kernel files are read
        c.files.trust_regular = True
    return c


def cpu_per_collection(osts: int, per_target: bool, iterations: int,
                       kernel_files: bool = False, least: bool = False) -> tuple[float, int]:
    """Median (`least`: smallest) CPU seconds of one collect() and the series it emits."""
    with tempfile.TemporaryDirectory(prefix="bench-lustre-") as tmp:
        c = collector(Path(tmp), osts, per_target, kernel_files)
        for _ in range(5):  # warm up: dentries, the mount mapping, the reader thread
            c.collect(Families())
        cpu = []
        for _ in range(iterations):
            out = Families()
            t = time.process_time()
            c.collect(out)
            cpu.append(time.process_time() - t)
        series = sum(len(m.samples) for m in out)
    return (min(cpu) if least else statistics.median(cpu)), series


def slope(xs: list[int], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def spread(values: list[float], scale: float, fmt: str) -> str:
    v = [x * scale for x in values]
    return f"{statistics.median(v):{fmt}} ({min(v):{fmt}}-{max(v):{fmt}})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--osts", default="8,32,64,128,256", help="OST counts, comma-separated")
    p.add_argument("--repetitions", type=int, default=3)
    p.add_argument("--iterations", type=int, default=40, help="collections timed per OST count")
    p.add_argument("--per-target", action="store_true", help="lustre.per_target on (default off)")
    p.add_argument("--kernel-files", action="store_true",
                   help="read the (unchanging) simulated files as kernel files are read: no fstat after each "
                        "read to catch a file replaced by rename, which only a regular-file tree needs")
    p.add_argument("--min", action="store_true",
                   help="the smallest CPU of the collections at each point rather than the median (other "
                        "load on the host only adds CPU time, through cache and scheduler contention)")
    args = p.parse_args()
    counts = [int(x) for x in args.osts.split(",")]
    load_avg = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{load_avg:.2f}; per_target {str(args.per_target).lower()}"
          f"{'; kernel-file reads' if args.kernel_files else ''}; {'min' if args.min else 'median'} of "
          f"{args.iterations} "
          f"collections per point, {args.repetitions} repetitions")
    print("| repetition | " + " | ".join(f"{n} OSTs ms" for n in counts) + " | CPU per OST µs |")
    print("|---|" + "---|" * (len(counts) + 1))
    per_count: dict[int, list[float]] = {n: [] for n in counts}
    slopes, series = [], {}
    for rep in range(1, args.repetitions + 1):
        row = []
        for n in counts:
            cpu, series[n] = cpu_per_collection(n, args.per_target, args.iterations, args.kernel_files,
                                                args.min)
            per_count[n].append(cpu)
            row.append(cpu)
        slopes.append(slope(counts, row) if len(counts) > 1 else row[0] / counts[0])
        print(f"| {rep} | " + " | ".join(f"{x * 1e3:.2f}" for x in row) + f" | {slopes[-1] * 1e6:.1f} |")
    print("| median (min-max) | " + " | ".join(spread(per_count[n], 1e3, ".2f") for n in counts)
          + f" | {spread(slopes, 1e6, '.1f')} |")
    print("series: " + ", ".join(f"{n} OSTs {series[n]}" for n in counts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
