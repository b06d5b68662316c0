"""What a read under exporter.deadline costs: `each` (one worker reads the items in order)
against a hand-over per item (`call` per item, what `each` would be without its in-order run),
for N short reads (a sysfs-like file's text, read through a kept descriptor with pread, as the
EFA and Lustre readers do).

    .venv/bin/python bench/bench_deadline.py [--items 32] [--rounds 300]

Figures: median wall and CPU (process time) per read of all items, in ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from exporter.deadline import Deadlines, Pool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=32, help="items per read (default 32: a p5's EFA devices)")
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        fds = []
        for i in range(args.items):
            p = os.path.join(d, f"f{i}")
            with open(p, "w") as f:
                f.write("123456789\n")
            fds.append(os.open(p, os.O_RDONLY))

        def read(fd: int) -> bytes:
            return os.pread(fd, 4096, 0)

        pool = Pool()
        reads = Deadlines(pool)
        ways = {
            "each (one worker, in order)": lambda: reads.each(fds, read, timeout=2.0, budget=3.2),
            "call per item (a hand-over each)":
                lambda: [reads.call(fd, lambda fd=fd: read(fd), 2.0) for fd in fds],
        }
        for name, way in ways.items():
            for _ in range(20):
                way()
            wall, cpu = [], []
            for _ in range(args.rounds):
                w, c = time.perf_counter(), time.process_time()
                way()
                wall.append(time.perf_counter() - w)
                cpu.append(time.process_time() - c)
            print(f"{name:34s} {args.items} items: wall {statistics.median(wall) * 1e3:.3f} ms, "
                  f"CPU {statistics.median(cpu) * 1e3:.3f} ms (median of {args.rounds})")
        pool.close()
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    main()
