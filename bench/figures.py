"""The figure table that opens docs/performance.md: each row is one bench command, run three
times (interleaved, so a change in the host's load touches every row alike), given as the median
and the spread (min-max) of those runs, with the command that reproduces it.

    PYTHONPATH=. python3 bench/figures.py [--write] [--runs 3] [--long] [--only NAME ...]
    PYTHONPATH=. python3 bench/figures.py --row detail      # one row's own command

Rows (NAME: command):
- whole: bench/thread_cpu.py --scrapes 300 (the simulated p5.48xlarge, captured NVML latencies,
  CPU per scrape of the exporter process read from /proc, its threads, the HTTP threads' share);
- efa: bench/bench_efa.py --scrapes 300 (server CPU per scrape against node_exporter's infiniband
  collector on the same 32-device tree);
- lustre: bench/bench_lustre.py --repetitions 1 (CPU per OST, 8 to 256 OSTs);
- detail: bench/figures.py --row detail (series and in-process scrape, default and every detail);
- gpu: bench/bench_gpu.py --skip-whole (GPU collector against a naive NVML reader);
- memory: bench/bench_memory.py (RSS by stage);
- render: bench/bench_render.py (the fast renderer against prometheus_client's);
- xid: bench/bench_xid.py --samples 30 (record to /metrics, backfills);
- shutdown: bench/bench_shutdown.py --runs 1 (SIGTERM to exit with stuck sources);
- activity: bench/bench_activity.py --scrapes 300 (what GPU activity from NVML GPM adds to a GPU
  collection on 8 simulated H100s, with and without GPM alternating; series added);
- with --long (about 15 more minutes): whole-vs-single (bench/bench_gpu.py --only-whole) and rules
  (bench/bench_rules.py --nodes 2000).
The default set takes about 10 minutes on the 2-core development host.

--write replaces the table between the figures markers at the top of docs/performance.md. The
table states the figures now; earlier tables are in git.

To see what moved, each new figure is printed (to stderr, never into the doc) beside the one it
replaces, read from the table now between the markers (no second run): "3.94 (3.80–4.10) [was
2.35]". The previous value of a cell is found by matching the old cell against the row's own
template (`previous_figures`), so a row whose wording changed, or that failed last time, simply has
no "was". --baseline-checkout DIR measures another checkout in the same run, for a ratio measured
side by side.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BEGIN, END = "<!-- figures:begin (python bench/figures.py --write) -->", "<!-- figures:end -->"

Figures = dict[str, float]


@dataclass(frozen=True)
class Row:
    name: str
    what: str
    command: list[str]  # run from the repository root with PYTHONPATH=.
    parse: Callable[[str], Figures]  # the command's stdout -> named figures
    cell: Callable[[Callable[[str], str]], str]  # (figure name -> "median (min-max)") -> the cell
    long: bool = False


def _num(pattern: str, text: str, optional: bool = False) -> float:
    """The number the pattern's group matches. `optional`: a figure an older bench script (a
    baseline checkout's) does not print is NaN, shown as n/a."""
    m = re.search(pattern, text)
    if m is None and optional:
        return math.nan
    if m is None:
        raise ValueError(f"no {pattern!r} in the output:\n{text[-1500:]}")
    return float(m.group(1).replace(",", ""))


def parse_whole(text: str) -> Figures:
    http = sum(float(v) for v in re.findall(r"^\s+http-worker[^:]*: ([\d.]+)", text, re.M))
    http += sum(float(v) for v in re.findall(r"^\s+http: ([\d.]+)", text, re.M))
    return {"cpu": _num(r"process ([\d.]+) ms CPU per scrape", text),
            "nosim": _num(r"([\d.]+) without the simulation", text),
            "threads": _num(r"(\d+) threads", text), "http": http}


def parse_efa(text: str) -> Figures:
    return {"ours": _num(r"server CPU per scrape:\s+ours ([\d.]+) ms", text),
            "ne": _num(r"node_exporter ([\d.]+) ms \(ratio", text),
            "ratio": _num(r"\(ratio ([\d.]+)\)", text),
            "per_file": _num(r"\(([\d.]+) us per file", text)}


def parse_lustre(text: str) -> Figures:
    # the first repetition's row: ms at 8 OSTs ... ms at 256 OSTs, CPU per OST
    m = re.search(r"^\| 1 \| ([\d.]+) \|.* \| ([\d.]+) \| ([-\d.]+) \|$", text, re.M)
    if m is None:
        raise ValueError(f"no repetition row in:\n{text[-1500:]}")
    return {"at8": float(m.group(1)), "at256": float(m.group(2)), "per_ost": float(m.group(3))}


def parse_detail(text: str) -> Figures:
    return {"series": _num(r"default: ([\d,]+) series", text),
            "ms": _num(r"default: [\d,]+ series, ([\d.]+) ms", text),
            "all_series": _num(r"all: ([\d,]+) series", text),
            "all_ms": _num(r"all: [\d,]+ series, ([\d.]+) ms", text)}


def _json(text: str) -> dict:
    return json.loads(text[text.index("{"):])


def parse_gpu(text: str) -> Figures:
    r = _json(text)
    ours = r["gpu_collector_serial"]
    return {"ours": ours["median_ms"], "cpu": ours["cpu_ms_per_scrape"],
            "naive": r["naive_one_call_at_a_time"]["median_ms"]}


def parse_memory(text: str) -> Figures:
    r = _json(text)
    no = r["no-nvml"]
    last = [k for k in no if k.startswith("after")][-1]
    return {"python": no["python"], "imports": no["imports"], "built": no["built"],
            "first": no["first collection"], "last": no[last], "fake": r["fake-nvml"]["first collection"],
            "pynvml": r["pynvml-import"]["pynvml imported"] - r["pynvml-import"]["imports"],
            "served": r["served"][[k for k in r["served"] if k.startswith("after")][-1]]}


def parse_render(text: str) -> Figures:
    return {"series": _num(r"(?m)^(\d+) series", text),
            "fast": _num(r"fast render, OpenMetrics\s+([\d.]+)", text),
            "client": _num(r"prometheus_client, OpenMetrics\s+([\d.]+)", text),
            "families": _num(r"families \(collection \+ process_\*\)\s+([\d.]+)", text, optional=True)}


def parse_xid(text: str) -> Figures:
    return {"latency": _num(r"count in /metrics: median ([\d.]+) ms", text),
            "p95": _num(r"count in /metrics: median [\d.]+ ms, p95 ([\d.]+) ms", text),
            "backfill": _num(r"backfill 100,000 records .*?: ([\d.]+) s best", text),
            "flood": _num(r"backfill 1,000,000 .*?: ([\d.]+) s best", text),
            "flood_rss": _num(r"\(\+([\d.]+) MiB while reading\)", text)}


def parse_shutdown(text: str) -> Figures:
    return {"nvml": _num(r"(?m)^\| hung NVML call[^|]*\| ([\d.]+)", text),
            "fifo": _num(r"(?m)^\| blocked Lustre[^|]*\| ([\d.]+)", text)}


def parse_activity(text: str) -> Figures:
    r = _json(text)
    return {"cpu": r["gpm_cpu_ms_added"], "wall": r["gpm_wall_ms_added"],
            "with": r["cpu_ms_per_collection"]["with"], "without": r["cpu_ms_per_collection"]["without"],
            "series": r["series_added_total"]}


def parse_whole_vs_single(text: str) -> Figures:
    r = _json(text)["whole_scrape_vs_slowest_single_collector"]
    m = r["median_ms"]
    return {"whole": m["all"], "slowest": m[r["slowest_single"]], "ratio": r["whole_over_slowest"]}


def parse_rules(text: str) -> Figures:
    rows = re.findall(r"^([\w-]+)\s+\d+\s+([\d.]+) / ", text, re.M)  # group, rules, median / max
    cores = re.search(r"^rules at [\d,]+ nodes: ([\d.]+) cores at the groups' own intervals \(query time\); "
                      r"([\d.]+) cores from Prometheus' CPU", text, re.M)
    if not rows or not cores:
        raise ValueError(f"no rule group table or cores in:\n{text[-1500:]}")
    ms = sorted((float(v) for _, v in rows), reverse=True)
    return {"slowest": ms[0], "under_1s": sum(1 for v in ms if v < 1000), "groups": len(ms),
            "cores": float(cores[1]), "cpu_cores": float(cores[2])}


PY = "python3"
ROWS = [
    Row("whole", "Whole scrape, simulated p5.48xlarge with captured NVML latencies, CPU per scrape of the "
        "exporter process (read from /proc; keep-alive gzip scrapes; goal ≤ 4 ms, ≤ 12 threads)",
        [PY, "bench/thread_cpu.py", "--scrapes", "300"], parse_whole,
        lambda f: (f"{f('cpu')} ms ({f('nosim')} ms without the simulated node's own thread; of it the "
                   f"HTTP threads, rendering + gzip + HTTP, {f('http')} ms); {f('threads')} threads")),
    Row("efa", "EFA collector vs node_exporter's infiniband collector, same 32-device tree, server CPU "
        "per scrape (goal ≤ 0.6×)",
        [PY, "bench/bench_efa.py", "--scrapes", "300"], parse_efa,
        lambda f: (f"ours {f('ours')} ms vs node_exporter {f('ne')} ms: **{f('ratio')}×**; "
                   f"{f('per_file')} µs per counter file in process (11 of 36 files per device)")),
    Row("lustre", "Lustre collector, one simulated mount at 8 to 256 OSTs (`per_target` off), CPU per "
        "collection in process (goal ≤ 20 µs per OST)",
        [PY, "bench/bench_lustre.py", "--repetitions", "1"], parse_lustre,
        lambda f: f"{f('at8')} ms at 8 OSTs, {f('at256')} ms at 256: **{f('per_ost')} µs per OST**"),
    Row("detail", "Series and scrape (collection + rendering, in process), default and every detail level",
        [PY, "bench/figures.py", "--row", "detail"], parse_detail,
        lambda f: (f"default {f('series')} series, {f('ms')} ms; every detail level (`efa.counters: all`, "
                   f"`gpu.detail: all`) {f('all_series')} series, {f('all_ms')} ms")),
    Row("gpu", "GPU collector vs naive NVML reader (8 simulated GPUs, captured latencies), wall per scrape",
        [PY, "bench/bench_gpu.py", "--skip-whole", "--scrapes", "300", "--naive-scrapes", "20"], parse_gpu,
        lambda f: f"GPU collector {f('ours')} ms ({f('cpu')} ms CPU) vs naive reader {f('naive')} ms"),
    Row("memory", "RSS by stage (MiB)",
        [PY, "bench/bench_memory.py", "--scrapes", "1000", "--other-scrapes", "200"], parse_memory,
        lambda f: (f"without NVML: python {f('python')}, imports {f('imports')}, built {f('built')}, first "
                   f"collection {f('first')}, after 1,000 collections {f('last')}; fake NVML, first "
                   f"collection {f('fake')}; `import pynvml` +{f('pynvml')}; the served exporter after 200 "
                   f"scrapes {f('served')}")),
    Row("render", "Rendering /metrics (OpenMetrics, the families /metrics renders for the simulated p5): "
        "the cached fast renderer vs prometheus_client's, CPU per render",
        [PY, "bench/bench_render.py", "--iterations", "200", "--repeat", "1"], parse_render,
        lambda f: (f"{f('series')} series: fast renderer {f('fast')} ms vs prometheus_client "
                   f"{f('client')} ms; the families (collection + process_*) {f('families')} ms")),
    Row("xid", "XID pipeline: kernel-log record to its count in /metrics (goal median ≤ 1 s); backfill of "
        "100,000 records (goal ≤ 2 s) and of a 1,000,000-record XID 13 flood",
        [PY, "bench/bench_xid.py", "--samples", "30"], parse_xid,
        lambda f: (f"record to /metrics median {f('latency')} ms (p95 {f('p95')} ms); 100,000 records "
                   f"{f('backfill')} s; 1,000,000 flood records {f('flood')} s, one event, "
                   f"+{f('flood_rss')} MiB while reading")),
    Row("shutdown", "SIGTERM to exit with a source stuck (goal ≤ 5 s)",
        [PY, "bench/bench_shutdown.py", "--runs", "1"], parse_shutdown,
        lambda f: (f"a GPU's NVML call hung: {f('nvml')} s; Lustre stats and an EFA counter blocked "
                   f"(FIFOs): {f('fifo')} s; exit status 0")),
    Row("activity", "GPU activity (NVML GPM) added to a GPU collection, 8 simulated H100s with a real "
        "H200's GPM latencies, CPU per collection (goal ≤ 1 ms) and series",
        [PY, "bench/bench_activity.py", "--scrapes", "300", "--rounds", "3"], parse_activity,
        lambda f: (f"+{f('cpu')} ms CPU ({f('with')} with GPM vs {f('without')} ms without), "
                   f"+{f('wall')} ms wall; +{f('series')} series")),
    Row("whole-vs-single", "Whole HTTP scrape vs slowest single collector, wall (goal ≤ 1.2×)",
        [PY, "bench/bench_gpu.py", "--only-whole", "--whole-scrapes", "100"], parse_whole_vs_single,
        lambda f: f"whole {f('whole')} ms vs slowest single {f('slowest')} ms: {f('ratio')}×", long=True),
    Row("rules", "Rule evaluation at 2,000 nodes × 8 GPUs, each group alone, and the cores it costs at "
        "the groups' own intervals (goal ≤ 0.25 cores)",
        [PY, "bench/bench_rules.py", "--nodes", "2000"], parse_rules,
        lambda f: (f"{f('cores')} cores at the groups' own intervals ({f('cpu_cores')} from Prometheus' "
                   f"CPU); slowest group {f('slowest')} ms; {f('under_1s')} of {f('groups')} under 1 s"),
        long=True),
]


# The figure of each row compared with a baseline checkout (--baseline-checkout): lower is better.
COMPARED = {"whole": "cpu", "efa": "ours", "lustre": "per_ost", "detail": "ms", "gpu": "cpu",
            "memory": "served", "render": "fast", "xid": "latency", "shutdown": "nvml", "activity": "cpu",
            "whole-vs-single": "whole", "rules": "cores"}


def spread(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "n/a"

    def fmt(v: float) -> str:
        if v >= 100 or v == int(v):
            return f"{v:,.0f}"
        return f"{v:.2f}" if v < 10 else f"{v:.1f}"
    med = statistics.median(values)
    lo, hi = min(values), max(values)
    return fmt(med) if lo == hi else f"{fmt(med)} ({fmt(lo)}–{fmt(hi)})"


# One figure in a cell as `spread` writes it, maybe followed by the previous table's value:
# "12.4", "12.4 (11.9–13.6)", "n/a", each optionally " [was 9.1]". The group is the median.
_FIGURE = r"(n/a|-?[\d,.]+)(?: \(-?[\d,.]+–-?[\d,.]+\))?(?: \[was [^\]]*\])?"
_MARK = "\x00{}\x00"


def cell_pattern(row: Row) -> tuple[list[str], re.Pattern[str]]:
    """The figure names of a row's cell, in order, and a pattern that matches a cell the row's
    template wrote, capturing each figure's median."""
    keys: list[str] = []

    def mark(key: str) -> str:
        keys.append(key)
        return _MARK.format(len(keys) - 1)

    parts = re.split(r"\x00\d+\x00", row.cell(mark))  # the template's text between its figures
    return keys, re.compile(_FIGURE.join(re.escape(p) for p in parts))


def _table_rows(doc: str) -> list[list[str]]:
    """The cells of each row of the table between the figures markers (header first)."""
    if BEGIN not in doc or END not in doc:
        return []
    table = doc[doc.index(BEGIN):doc.index(END)]
    return [[c.strip() for c in line.strip().strip("|").split(" | ")]
            for line in table.splitlines() if line.startswith("| ") and not line.startswith("|---")]


def previous_figures(doc: str, rows: list[Row] = ROWS) -> dict[str, dict[str, str]]:
    """Row name -> figure name -> the median the table in `doc` gives it (as written), for each
    row whose command and cell the table has in the row's current form."""
    table = _table_rows(doc)
    if not table or "figure" not in table[0]:
        return {}
    col = table[0].index("figure")
    cells = {r[-1].strip("`"): r[col] for r in table[1:] if len(r) == len(table[0])}
    out: dict[str, dict[str, str]] = {}
    for row in rows:
        cell = cells.get(" ".join(row.command))
        if cell is None:
            continue
        keys, pattern = cell_pattern(row)
        m = pattern.fullmatch(cell)
        if m is not None:
            out[row.name] = {k: v for k, v in zip(keys, m.groups(), strict=True) if v != "n/a"}
    return out


def previous_note(doc: str) -> str:
    """When and where the table in `doc` was measured, from its opening sentence (for the new one's)."""
    if BEGIN not in doc or END not in doc:
        return ""
    intro = doc[doc.index(BEGIN):doc.index(END)].split("\n|", 1)[0]
    date = re.search(r"\d{4}-\d{2}-\d{2}", intro)
    rev = re.search(r"\bat ([0-9a-f]{7,40})\b", intro)
    return ", ".join(x for x in (rev and f"at {rev[1]}", date and date[0]) if x)


def with_previous(figure: str, previous: str | None) -> str:
    """A figure as the cell shows it, with the previous table's beside it."""
    return figure if previous is None else f"{figure} [was {previous}]"


def run_row(row: Row, checkout: Path = ROOT) -> Figures:
    """Run a row's command in `checkout` (this tree, or a baseline's: its own bench scripts and
    exporter) and parse what it printed."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    argv = [sys.executable, *row.command[1:]] if row.command[0] == PY else row.command  # this interpreter
    r = subprocess.run(argv, cwd=checkout, env=env, capture_output=True, text=True, timeout=1800,
                       check=False)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{' '.join(row.command)} exited {r.returncode}: {last}")
    return row.parse(r.stdout)


def detail_levels(n: int) -> str:
    """Series and median in-process scrape of the default and `all` configs, interleaved."""
    sys.path.insert(0, str(ROOT))
    from exporter import collectors
    from exporter.arguments import build_parser
    from exporter.exposition import render
    from exporter.runner import Runner
    from exporter.startup import build_context

    every = Path(tempfile.mkdtemp()) / "all.yml"
    every.write_text("efa:\n  counters: all\ngpu:\n  detail: all\n")
    setups = {}
    for name, extra in (("default", []), ("all", ["--config", str(every)])):
        argv = ["--simulate", "p5.48xlarge", "--nvml-latencies", *extra]
        ctx, sim = build_context(build_parser().parse_args(argv))
        built = collectors.build(ctx)
        runner = Runner.from_config(built, ctx.config, ctx.pool)
        for c in built:
            if hasattr(c, "refresh_slow"):
                c.refresh_slow(timeout=10)
        setups[name] = (sim, runner, [])
    time.sleep(2.5)  # past the simulated trees' "racily clean" window (exporter/efa/reader.py)
    for _ in range(n):
        for _name, (_sim, runner, walls) in setups.items():
            t = time.perf_counter()
            render(runner.collect())
            walls.append(time.perf_counter() - t)
    lines = []
    for name, (sim, runner, walls) in setups.items():
        body = render(runner.collect()).decode()
        series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
        lines.append(f"{name}: {series:,} series, {statistics.median(walls) * 1e3:.1f} ms")
        runner.close()
        sim.close()
    return "\n".join(lines)


def baseline_note(args: argparse.Namespace) -> str:
    if not args.baseline_checkout:
        return ""
    rev = subprocess.run(["git", "-C", str(args.baseline_checkout), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=False).stdout.strip()
    return (f" Each row also ran in a checkout of {rev} (its own bench scripts and exporter), interleaved "
            "with this tree's runs; the last column divides the two medians of the named figure "
            "(lower is better, so above 1 is worse).")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="put the table at the top of docs/performance.md")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--long", action="store_true", help="also the whole-vs-single and 2,000-node rule rows")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="just these rows")
    ap.add_argument("--row", choices=["detail"], help="print one row's own measurement (its command)")
    ap.add_argument("--baseline-checkout", type=Path, metavar="DIR",
                    help="also run every row in this checkout (e.g. `git worktree add DIR c475e11`), "
                    "interleaved with this tree's runs, and add its figures and the ratio to the table")
    args = ap.parse_args()
    if args.row == "detail":
        print(detail_levels(100))
        return 0
    if args.only:
        rows = [r for r in ROWS if r.name in args.only]
    else:
        rows = [r for r in ROWS if args.long or not r.long]
    doc = ROOT / "docs" / "performance.md"
    before = doc.read_text() if doc.exists() else ""
    previous, previous_when = previous_figures(before, rows), previous_note(before)
    t0 = time.monotonic()
    trees = {"this": ROOT}
    if args.baseline_checkout:
        trees["baseline"] = args.baseline_checkout.resolve()
    runs: dict[tuple[str, str], list[Figures]] = {(t, r.name): [] for t in trees for r in rows}
    errors: dict[tuple[str, str], str] = {}
    for i in range(args.runs):
        for row in rows if i % 2 == 0 else rows[::-1]:  # interleaved: drifting load touches every row
            for tree, checkout in trees.items():  # and both trees alike
                if (tree, row.name) in errors:
                    continue
                t = time.monotonic()
                try:
                    runs[tree, row.name].append(run_row(row, checkout))
                except Exception as e:  # noqa: BLE001 - the table says what failed instead of losing the other rows
                    errors[tree, row.name] = str(e).splitlines()[0]
                print(f"run {i + 1}: {tree} {row.name} {time.monotonic() - t:.0f}s", file=sys.stderr,
                      flush=True)
    took = time.monotonic() - t0
    lines = [BEGIN, "", f"Each figure is the median of {args.runs} runs with their range in brackets, the "
             "runs interleaved row by row (`python bench/figures.py --write`, "
             f"{took / 60:.0f} min, a 2-core host shared with other work, "
             f"{time.strftime('%Y-%m-%d')}). Commands run from the repository root with `PYTHONPATH=.`."
             + baseline_note(args), "",
             "| what | figure | " + ("baseline | this ÷ baseline | " if args.baseline_checkout else "")
             + "command |", "|---|---|---|" + ("---|---|" if args.baseline_checkout else "")]

    def cell(tree: str, row: Row, was: dict[str, str] | None = None) -> str:
        if (tree, row.name) in errors:
            return f"failed: {errors[tree, row.name]}"
        figs = runs[tree, row.name]
        return row.cell(lambda k: with_previous(spread([f[k] for f in figs]), (was or {}).get(k)))

    if previous:  # what moved, for whoever ran it; the doc keeps only the figures of now
        print(f"beside the previous table ({previous_when or 'its run'}; on that day's host, so a ratio "
              "to it is only as good as the two hosts' likeness):", file=sys.stderr)
        for row in rows:
            if row.name in previous:
                print(f"  {row.name}: {cell('this', row, previous[row.name])}", file=sys.stderr)

    for row in rows:
        cells = [cell("this", row)]
        if args.baseline_checkout:
            cells.append(cell("baseline", row))
            mine, base = runs["this", row.name], runs["baseline", row.name]
            key = COMPARED[row.name]
            ratio = (statistics.median(f[key] for f in mine) / statistics.median(f[key] for f in base)
                     if mine and base else None)
            cells.append(f"{key}: {ratio:.2f}" if ratio is not None else "–")
        lines.append(f"| {row.what} | " + " | ".join(cells) + " | `" + " ".join(row.command) + "` |")
    lines += ["", END]
    table = "\n".join(lines)
    print(table)
    if args.write:
        text = doc.read_text()
        if BEGIN in text:
            text = text[:text.index(BEGIN)] + table + text[text.index(END) + len(END):]
        else:
            head, _, rest = text.partition("\n")
            text = f"{head}\n\n{table}\n{rest}"
        doc.write_text(text)
    return 1 if any(tree == "this" for tree, _ in errors) else 0


if __name__ == "__main__":
    sys.exit(main())
