"""Rendering cost: /metrics' fast renderer (exporter/exposition.py) against prometheus_client's own
renderers, on the families /metrics renders for a simulated p5.48xlarge (the collection and
process_*), in both formats. CPU time (time.process_time) per render, each repetition the mean of
`--iterations` renders; the collection is made once.

    python bench/bench_render.py [--iterations 200] [--repeat 3] [--config FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client.exposition import generate_latest  # noqa: E402
from prometheus_client.openmetrics.exposition import generate_latest as om_generate_latest  # noqa: E402

from exporter import collectors  # noqa: E402
from exporter.arguments import build_parser  # noqa: E402
from exporter.exposition import render  # noqa: E402
from exporter.runner import Runner  # noqa: E402
from exporter.startup import build_context
from exporter.web.server import families  # noqa: E402


class Fixed:
    """A prometheus_client collector of given families (what its renderers take)."""

    def __init__(self, metrics: list) -> None:
        self.metrics = metrics

    def collect(self) -> list:
        return self.metrics


def render_client(metrics: list, openmetrics: bool) -> bytes:
    return (om_generate_latest if openmetrics else generate_latest)(Fixed(metrics))


def cpu_ms(fn, iterations: int) -> float:  # noqa: ANN001
    t = time.process_time()
    for _ in range(iterations):
        fn()
    return (time.process_time() - t) / iterations * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--config", help="exporter config (default: the defaults)")
    a = p.parse_args()
    argv = ["--simulate", "p5.48xlarge"] + (["--config", a.config] if a.config else [])
    ctx, sim = build_context(build_parser().parse_args(argv))
    runner = Runner(collectors.build(ctx), 5.0, pool=ctx.pool)
    try:
        collection = runner.collect()
        fams = families(collection)
        print(f"{sum(len(f.samples) for f in fams)} series in {len(fams)} families")
        cases = [("families (collection + process_*)", lambda: families(collection), a.iterations)]
        for om, fmt in ((False, "text 0.0.4"), (True, "OpenMetrics")):
            assert render(fams, om) == render_client(fams, om)
            cases.append((f"fast render, {fmt}", lambda om=om: render(fams, om), a.iterations))
            cases.append((f"prometheus_client, {fmt}", lambda om=om: render_client(fams, om),
                          max(10, a.iterations // 10)))
        for name, fn, n in cases:
            runs = [cpu_ms(fn, n) for _ in range(a.repeat)]
            print(f"{name:34s} {min(runs):6.3f} .. {max(runs):6.3f} ms CPU ({a.repeat} x {n})")
    finally:
        runner.close()
        sim.close()


if __name__ == "__main__":
    main()
