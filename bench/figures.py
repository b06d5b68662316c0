"""The figure table that opens docs/performance.md, every row measured side by side in one run.

    PYTHONPATH=. python3 bench/figures.py [--write] [--quick]

Rows (each names the bench it comes from; that bench run alone gives the full detail):
- default vs `all` detail levels on the simulated p5.48xlarge: series and in-process scrape
  (collection + rendering), interleaved;
- whole scrape over HTTP vs the slowest single collector (bench_gpu.py --only-whole);
- EFA per-file cost and whole EFA collection vs node_exporter on the same tree (bench_efa.py);
- GPU collector vs a naive NVML reader, captured latencies (bench_gpu.py);
- RSS by stage without and with NVML (bench_memory.py);
- rule evaluation at 2,000 nodes (bench_rules.py);
- a real GPU: not lent in this task.

--write replaces the table between the figures markers at the top of docs/performance.md.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

BEGIN, END = "<!-- figures:begin (python bench/figures.py --write) -->", "<!-- figures:end -->"


def detail_levels(n: int) -> tuple[str, str]:
    """Series and median in-process scrape of the default and `all` configs, interleaved."""
    from exporter import collectors
    from exporter.cli import build_context, build_parser
    from exporter.exposition import render
    from exporter.runner import Runner

    every = Path(tempfile.mkdtemp()) / "all.yml"
    every.write_text("efa:\n  counters: all\ngpu:\n  detail: all\n")
    setups = {}
    for name, extra in (("default", []), ("all", ["--config", str(every)])):
        argv = ["--simulate", "p5.48xlarge", "--nvml-latencies", *extra]
        ctx = build_context(build_parser().parse_args(argv))
        built = collectors.build(ctx)
        runner = Runner.from_config(built, ctx.config)
        for c in built:
            if hasattr(c, "refresh_slow"):
                c.refresh_slow(timeout=10)
        setups[name] = (ctx, runner, [])
    for _ in range(n):
        for _name, (_ctx, runner, walls) in setups.items():
            t = time.perf_counter()
            body = render(runner.collect())
            walls.append(time.perf_counter() - t)
    out = {}
    for name, (ctx, runner, walls) in setups.items():
        body = render(runner.collect()).decode()
        series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
        out[name] = (series, statistics.median(walls) * 1e3)
        runner.close()
        ctx.simulation.close()
    d, a = out["default"], out["all"]
    return (f"{d[0]:,} series, {d[1]:.1f} ms", f"{a[0]:,} series, {a[1]:.1f} ms (`efa.counters: all`, "
            f"`gpu.detail: all`)")


def whole_vs_single(n: int) -> str:
    import bench_gpu

    r = bench_gpu.bench_whole_vs_single(False, "p5.48xlarge", n)
    m = r["median_ms"]
    singles = ", ".join(f"{k} {v:.1f}" for k, v in sorted(m.items()) if k != "all")
    return (f"whole {m['all']:.1f} ms vs slowest single ({r['slowest_single']}) "
            f"{m[r['slowest_single']]:.1f} ms: **{r['whole_over_slowest']:.2f}×** (singles: {singles} ms)")


def gpu_vs_naive(n: int) -> str:
    import bench_gpu

    from exporter.simulate import Simulation

    sim = Simulation("p5.48xlarge", []).build()
    try:
        ours = bench_gpu.bench_collector(False, sim, False, n)
        naive = bench_gpu.bench_naive(False, sim, max(10, n // 10))
    finally:
        sim.close()
    return (f"GPU collector {ours['median_ms']:.2f} ms vs naive reader {naive['median_ms']:.1f} ms per "
            f"scrape of 8 GPUs ({naive['median_ms'] / ours['median_ms']:.0f}× less)")


def efa_vs_node_exporter(n: int) -> str:
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_efa.py"), "--scrapes", str(n)],
                       capture_output=True, text=True, cwd=ROOT, timeout=900, check=False)
    text = r.stdout
    def grab(prefix: str) -> str:
        m = re.search(re.escape(prefix) + r"\s*(.*)", text)
        return m.group(1).strip() if m else "?"
    per_file = re.search(r"\(([\d.]+ us per file) incl. parsing\)", text)
    return (f"HTTP scrape ours {grab('ours HTTP scrape:')}; "
            f"node_exporter {grab('node_exporter HTTP scrape:')}"
            f"; ours {per_file.group(1) if per_file else '?'} in process (the default counter set: 11 of "
            "36 files per device)")


def memory(n: int) -> str:
    import bench_memory

    no = bench_memory.measure("no-nvml", n)
    fake = bench_memory.measure("fake-nvml", max(100, n // 10))
    imp = bench_memory.measure("pynvml-import", 0)
    last = [k for k in no if k.startswith("after")][-1]
    return (f"without NVML: python {no['python']}, imports {no['imports']}, built {no['built']}, "
            f"first collection {no['first collection']}, {last} {no[last]} MiB; fake NVML: first "
            f"collection {fake['first collection']} MiB; `import pynvml` +"
            f"{imp['pynvml imported'] - imp['imports']:.1f} MiB")


def rules(nodes: int, interval: int) -> str:
    """Each rule group's evaluation cost at `nodes` nodes, in isolation (bench_rules.measure)."""
    import bench_rules

    try:
        figs = bench_rules.measure(nodes, interval, log=lambda m: None)
    except Exception as e:  # noqa: BLE001 - the table says what failed instead of losing the other rows
        return f"bench_rules.py at {nodes:,} nodes failed: {e}"
    ranked = sorted(figs.groups.items(), key=lambda kv: -kv[1][0])
    over = [g for g, (med, _, _) in ranked if med >= 1.0]
    worst = ", ".join(f"{g} {med * 1000:.0f}" for g, (med, _, _) in ranked[:3])
    return (f"{nodes:,} nodes × 8 GPUs ({interval} s history), each group alone: slowest {worst} ms; "
            f"{len(figs.groups) - len(over)} of {len(figs.groups)} groups under 1 s"
            + (f" (over: {', '.join(over)})" if over else "")
            + f"; all groups once {sum(m for m, _, _ in figs.groups.values()):.1f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="put the table at the top of docs/performance.md")
    ap.add_argument("--quick", action="store_true", help="fewer scrapes and 500 nodes (a smoke run)")
    ap.add_argument("--rules-nodes", type=int, default=2000)
    ap.add_argument("--rules-interval", type=int, default=30)
    args = ap.parse_args()
    q = args.quick
    t0 = time.monotonic()
    d, a = detail_levels(50 if q else 200)
    rows = [
        ("Series and scrape (collection + rendering, in process), default detail", d, "`bench/figures.py`"),
        ("Same, every detail level on", a, "`bench/figures.py`"),
        ("Whole HTTP scrape vs slowest single collector (goal ≤ 1.2×)", whole_vs_single(60 if q else 200),
         "`bench/bench_gpu.py --only-whole`"),
        ("EFA collection vs node_exporter on the same 32-device tree", efa_vs_node_exporter(50 if q else 200),
         "`bench/bench_efa.py`"),
        ("GPU collector vs naive NVML reader (captured latencies)", gpu_vs_naive(100 if q else 500),
         "`bench/bench_gpu.py`"),
        ("RSS by stage (MiB)", memory(500 if q else 5000),
         "`bench/bench_memory.py` (100,000 scrapes: see below)"),
        ("Rule evaluation", rules(500 if q else args.rules_nodes, args.rules_interval),
         f"`bench/bench_rules.py --nodes {args.rules_nodes}`"),
        ("Real GPU: whole scrape vs `nvidia-smi --query-gpu`", "not lent in this task",
         "`bench/real_gpu.sh`"),
    ]
    took = time.monotonic() - t0
    lines = [BEGIN, "", "Measured side by side in one run of `python bench/figures.py --write` "
             f"({took / 60:.0f} min, a 2-core host shared with other work, {time.strftime('%Y-%m-%d')}).", "",
             "| what | figure | bench |", "|---|---|---|"]
    lines += [f"| {w} | {f} | {b} |" for w, f, b in rows]
    lines += ["", END]
    table = "\n".join(lines)
    print(table)
    if args.write:
        doc = ROOT / "docs" / "performance.md"
        text = doc.read_text()
        if BEGIN in text:
            text = text[:text.index(BEGIN)] + table + text[text.index(END) + len(END):]
        else:
            head, _, rest = text.partition("\n")
            text = f"{head}\n\n{table}\n{rest}"
        doc.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
