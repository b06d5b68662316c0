"""Cost of the alert rules on a fleet: evaluation time of every rule group in rules/ on a real
Prometheus holding synthetic history for N nodes (a simulated p5.48xlarge's series, 8 GPUs each).

    python bench/bench_rules.py --nodes 100 500 2000 [--interval 30] [--live] [--top N]
                                [--baseline-rules DIR]

For each node count it
  1. scrapes a simulated p5.48xlarge once (the exporter on 127.0.0.1) and keeps the series the rules
     read (metric names taken from rules/*.yml), copied per node with its own `instance`;
  2. builds their history at the scrape interval: 17 minutes for every series, 80 minutes for the
     series read through an hour-long window, and the recording rules' own output that the rules
     read back (the 5-minute corrected-ECC rate for 75 minutes, the hourly one every 5 minutes for
     13 hours, and so on; the hourly ECC rates only for the 2% of GPUs with errors, as the rules
     record them);
  3. puts the last 2 hours into Prometheus' head by remote write (bench/remote_write.py), where a
     live Prometheus holds its recent data, and what is older into blocks (`promtool tsdb
     create-blocks-from openmetrics`), and waits until Prometheus has compacted those blocks;
  4. measures each group. By default in isolation: every rule's expression is run as an instant
     query at the end of the history, one at a time, and a group's time is the sum of its rules'
     median execution times (Prometheus' own `execTotalTime`); Prometheus evaluates the rules of a
     group one after another and the groups concurrently, so this is what a group costs when it
     has a core. With --live the rules are loaded (every group every 15 s) and Prometheus' own
     `evaluationTime` is read: on a host with fewer cores than busy groups that measures the
     contention as well (at 2,000 nodes on 2 cores every group waits seconds for a core).

What a Prometheus pays is each group's cost per evaluation over its own `interval:` (a group
without one runs at deploy/prometheus/scrape.yml's `evaluation_interval`): the command prints
those cores for the whole rule set, from the query time (the sum of the groups' medians, each over
its interval) and from Prometheus' own CPU (utime + stime around each group's queries, median of
the rounds, over its interval), and the groups that cost the most. promtool ignores `interval:`,
so this is where a group's interval shows.

With --baseline-rules DIR (another checkout's rules/, e.g. `git worktree add /tmp/base main`), the
same history is measured with both rule sets, round by round interleaved, and both costs are
printed: before and after from one run on one host. The history holds every series either rule set
reads, and always every `efa_*` family a node exports by default (BALLAST): a real Prometheus holds
them whether or not a rule reads them, and its head's size sets the cost of every read.

`measure(nodes)` returns the figures (bench/figures.py calls it); the command prints the tables.
Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import bisect
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import remote_write  # noqa: E402  (bench/, beside this file)

from tests.helpers import running_exporter, start_listening, wait_until_serving  # noqa: E402
from tests.rules_lint import metric_names  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules"
# The families held though no rule may read them (see the module's doc): the EFA devices' own series.
BALLAST = re.compile(r"^efa_")
SHORT_S = 17 * 60  # history of every series (the longest plain window in rules/ is 15m)
LONG_S = 80 * 60  # history of series read over [1h] offset 15m
LONG = {"gpu_ecc_errors_total", "efa_admin_commands_no_completion_total"}
# Recorded series the rules read back over a range: (per GPU or node, history s, step s, whether
# only GPUs with corrected ECC errors have it). The hourly ECC rate and what is recorded from it
# exist only for GPUs with errors (rules/gpu.yml): ECC_ERRING_EVERY-th GPU of the fleet.
RECORDED = {
    "gpu:gpu_ecc_corrected_errors:rate5m": ("ecc", 75 * 60, None, False),
    "gpu:gpu_ecc_corrected_errors:rate1h": ("ecc", 13 * 3600, 300, True),
    "gpu:gpu_ecc_corrected_errors:rate6h_offset1h": ("ecc", SHORT_S, 300, True),
    "gpu:gpu_ecc_corrected_errors:rate1h_max6h": ("ecc", SHORT_S, 300, True),
    "instance:gpu_ecc_corrected_errors:gpus": ("node", 13 * 3600, 300, False),
    "instance:gpu_ecc_corrected_errors:history_7h": ("node", SHORT_S, 300, False),
    "instance:gpu_ecc_corrected_errors:threshold_without_baseline": ("node", SHORT_S, 300, False),
    "instance:gpu_devices_expected:max": ("node", SHORT_S, None, False),
    "instance:gpu_health_exporter_up:last_seen_timestamp_seconds": ("node", SHORT_S, None, False),
    "instance:gpu_missing:count": ("node", SHORT_S, None, False),
    "gpu:gpu_health_verdict_replace_required:last5m": ("gpu", SHORT_S, None, False),
    "mount:lustre_client_filesystem_available:ratio": ("mount", SHORT_S, None, False),
    "mount:lustre_client_filesystem_inodes_free:ratio": ("mount", SHORT_S, None, False),
    "mount:lustre_client_mdc_rpc_wait_seconds:mean5m": ("mount", SHORT_S, None, False),
    "mount:lustre_client_mdc_rpcs:rate5m": ("mount", SHORT_S, None, False),
    **{f"gpu_health_threshold:ecc_corrected_rate_{t}": ("const", SHORT_S, None, False)
       for t in ("factor", "floor_per_second", "young_per_second", "keep_ratio", "high_per_second")},
    # rules/job.yml's baselines (issue 43): the median of an hour of a series recorded every minute,
    # per GPU or node of a job, and the baselines themselves, read back over 10 minutes (recorded
    # every 5 minutes by job-health-history; a minute apart here: an upper bound on those reads)
    # (the per-job ones, training_job:phase:*, are 125 series: left out, as per-job series would
    # collide here without their job labels).
    **{f"job_gpu:gpu_tensor_active:{k}": ("gpu", LONG_S, 60, False) for k in ("share", "share_baseline")},
    **{f"instance_training_job:{n}": ("node", LONG_S, 60, False)
       for n in ("efa_tx_bytes:share", "efa_tx_bytes:share_baseline", "lustre_client_read_bytes:share",
                 "lustre_client_read_bytes:share_baseline", "throughput:rate", "throughput:baseline",
                 "gpu_clock_sm:avg", "gpu_clock_sm:baseline", "lustre_client_rpc_wait_seconds:mean",
                 "lustre_client_rpc_wait_seconds:baseline", "efa_retrans_packets:ratio",
                 "efa_retrans_packets:baseline")},
}
JOB_NODES = 16  # nodes per Slurm job in the synthetic fleet (rules/job.yml groups per job)
ECC_ERRING_EVERY = 50  # 2% of GPUs with corrected ECC errors in the last hours
EVAL_S = 15
# Counters grow like a fleet's: traffic (bytes, packets sent and received) at rates from idle to
# busy; error and event counters (retransmits, drops, timeouts, ECC, XIDs...) stand still except on
# FAULTY_SHARE of the series, which rise fast enough to fire their alerts. (Every counter rising at
# random, as before, had a quarter of all EFA devices alerting at once: the cost measured was
# mostly Prometheus writing thousands of ALERTS series, not the rules' reads.)
TRAFFIC = re.compile(r"_(bytes|packets)_total$")
FAULTY_SHARE = 0.002
# The history of the last HEAD_S goes into Prometheus' head by remote write, as a live Prometheus
# holds its last 2-3 hours in the head; older history into blocks (promtool), as it would be.
HEAD_S = 2 * 3600
SLAB_S = 30 * 60
SETTLE_S = 140  # waiting for Prometheus to compact the imported blocks (wait_for_compaction)
PREP_S_PER_NODE = [0.25]  # writing + pushing one node's history (2 cores); learnt from each run


@dataclass
class Figures:
    nodes: int
    series: int
    samples: int
    head: bool  # the recent history was in the head (remote write), not only in imported blocks
    live: bool  # evaluationTime of the rules loaded into Prometheus, not the isolated queries
    # group name -> (median s, max s, rules)
    groups: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    # rule (group/name) -> median evaluation time s
    rules: dict[str, float] = field(default_factory=dict)
    # Prometheus itself: series in its head, resident memory after the measurement (and its peak),
    # and CPU seconds (utime + stime) per round of every rule's query, rounds in isolation
    head_series: int = 0
    rss_bytes: int = 0
    rss_peak_bytes: int = 0
    cpu_s_per_round: list[float] = field(default_factory=list)
    # group -> its evaluation interval (s), and Prometheus' CPU s of its queries, one per round
    intervals: dict[str, float] = field(default_factory=dict)
    group_cpu_s: dict[str, list[float]] = field(default_factory=dict)
    group_round_s: dict[str, list[float]] = field(default_factory=dict)  # its rules' query time, per round
    rules_dir: str = "rules"
    baseline: Figures | None = None  # the same history measured with --baseline-rules

    def cost(self) -> list[tuple[str, float, float, float]]:
        """(group, cores from query time, cores from CPU, interval s) of every group, costliest first:
        its cost per evaluation over its own interval."""
        out = []
        for g, (med, _, _) in self.groups.items():
            every = self.intervals.get(g, default_interval())
            cpu = statistics.median(self.group_cpu_s[g]) if self.group_cpu_s.get(g) else float("nan")
            out.append((g, med / every, cpu / every, every))
        return sorted(out, key=lambda c: -c[1])

    def cores(self) -> tuple[float, float]:
        """The whole rule set's cores at the groups' own intervals: (from query time, from CPU)."""
        c = self.cost()
        return sum(q for _, q, _, _ in c), sum(u for _, _, u, _ in c)

    def cores_per_round(self) -> list[tuple[float, float]]:
        """The cores of each round alone (query time, CPU): their spread is the run's."""
        rounds = min((len(v) for v in self.group_cpu_s.values()), default=0)
        every = {g: self.intervals.get(g, default_interval()) for g in self.groups}
        return [(sum(self.group_round_s[g][k] / every[g] for g in self.group_round_s),
                 sum(self.group_cpu_s[g][k] / every[g] for g in self.group_cpu_s)) for k in range(rounds)]


def default_interval() -> float:
    """The evaluation interval of a group without `interval:`: the shipped Prometheus config's."""
    cfg = yaml.safe_load((ROOT / "deploy" / "prometheus" / "scrape.yml").read_text())
    return duration_s(cfg["global"].get("evaluation_interval", "1m"))


def duration_s(d: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+)(ms|s|m|h|d)", d)
    if not parts or "".join(a + b for a, b in parts) != d:
        raise ValueError(f"not a Prometheus duration: {d!r}")
    return sum(int(a) * units[b] for a, b in parts)


def rule_groups(rules_dir: Path = RULES) -> list[tuple[str, float, list[dict]]]:
    """(group, interval s, rules) of every group of the rule files in `rules_dir`."""
    out = []
    for f in sorted(rules_dir.glob("*.yml")):
        for g in yaml.safe_load(f.read_text())["groups"]:
            every = duration_s(g["interval"]) if "interval" in g else default_interval()
            out.append((g["name"], every, g["rules"]))
    return out


def all_rules(rules_dir: Path = RULES) -> list[tuple[str, str, dict]]:
    """(group, group, rule) of every rule, as tests.rules_lint.all_rules with a directory."""
    return [(name, name, r) for name, _, rules in rule_groups(rules_dir) for r in rules]


def node_series(rule_dirs: Iterable[Path] = (RULES,)) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of one simulated p5.48xlarge's series that the rules read, and the
    BALLAST families."""
    wanted = {n for d in rule_dirs for _, _, r in all_rules(d) for n in metric_names(r["expr"])
              if ":" not in n} - {"ALERTS"}
    # A Slurm job on every GPU (gpu_workload_info): the job-health rules group the fleet into jobs
    # of JOB_NODES nodes each (histories()).
    with running_exporter("--simulate", "p5.48xlarge", "--scenario", "slurm-job") as url:
        time.sleep(2)  # the slow GPU readings (NVLink state, PCIe replays) arrive in the background
        text = requests.get(f"{url}/metrics", timeout=30).text
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in wanted or BALLAST.match(s.name):
                if s.name == "gpu_nvlink_errors_total":  # the per-GPU default of issue 14, not per link
                    if s.labels.get("link") not in ("0", "all"):
                        continue
                    s.labels["link"] = "all"
                out.append((s.name, dict(s.labels), s.value))
    out.append(("up", {}, 1.0))
    out.append(("scrape_duration_seconds", {}, 0.05))
    return out


def _step(name: str, rng: random.Random) -> float:
    """A counter's increase per second in the synthetic history (see TRAFFIC)."""
    if TRAFFIC.search(name) and "retrans" not in name:
        return rng.choice([0.01, 0.5, 1e3, 1e6])
    return 0.5 if rng.random() < FAULTY_SHARE else 0.0


History = tuple[str, dict[str, str], list[int], list[float]]  # name, labels, timestamps s, values


def histories(per_node: list[tuple[str, dict[str, str], float]], nodes: int, interval: int,
              end: int) -> Iterator[History]:
    """The synthetic history of `nodes` copies of one node's series, series by series."""
    rng = random.Random(1)
    families: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, labels, value in per_node:
        families.setdefault(name, []).append((labels, value))
    ecc = [lab for lab, _ in families.get("gpu_ecc_errors_total", []) if lab.get("error_type") == "corrected"
           and lab.get("counter") == "aggregate"]
    for name, members in families.items():
        span = LONG_S if name in LONG else SHORT_S
        ts = list(range(end - span, end + 1, interval))
        counter = name.endswith("_total")
        for node in range(nodes):
            node_labels = {"instance": f"gpu-node-{node}", "job": "gpu-health-exporter", "cluster": "c1"}
            for labels, value in members:
                if "hpc_job" in labels:
                    labels = {**labels, "hpc_job": str(1000 + node // JOB_NODES)}
                step = _step(name, rng) * interval if counter else 0.0
                yield name, {**labels, **node_labels}, ts, [value + i * step for i in range(len(ts))]
    members_of = {"ecc": [{k: v for k, v in lab.items() if k != "counter"} for lab in ecc],
                  "gpu": [{k: v for k, v in lab.items() if k not in ("counter", "error_type")}
                          for lab in ecc],
                  "node": [{}], "mount": [{"mount": "/fsx"}]}
    for name, (kind, span, step_s, erring_only) in RECORDED.items():
        ts = list(range(end - span, end + 1, step_s or EVAL_S * 2))
        if kind == "const":
            yield name, {}, ts, [1.0] * len(ts)
            continue
        for node in range(nodes):
            node_labels = {"instance": f"gpu-node-{node}", "job": "gpu-health-exporter", "cluster": "c1"}
            members = members_of[kind]
            for i, labels in enumerate(members):
                erring = (node * len(members) + i) % ECC_ERRING_EVERY == 0
                if erring_only and not erring:
                    continue
                if kind == "ecc":
                    v = rng.choice([0.001, 0.02]) if erring else 0.0
                else:  # no GPU missing; 8 GPUs expected; a verdict exported; 1 otherwise
                    v = 0.0 if name.endswith("missing:count") else 8.0 if name.endswith(":max") else 1.0
                yield name, {**labels, **node_labels}, ts, [v] * len(ts)


def write_blocks(items: Iterable[History], head_start: int, path: Path) -> tuple[int, int]:
    """Writes the samples older than `head_start` (histories longer than a live Prometheus keeps in
    its head) as OpenMetrics for `promtool tsdb create-blocks-from`; returns the series and samples
    of the whole history and the samples written."""
    series = samples = written = 0
    typed: set[str] = set()
    with path.open("w") as f:
        for name, labels, ts, values in items:
            series += 1
            samples += len(ts)
            cut = bisect.bisect_left(ts, head_start)
            if cut:
                if name not in typed:  # a family's series come together (histories() yields them so)
                    f.write(f"# TYPE {name} unknown\n")
                    typed.add(name)
                lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                f.writelines(f"{name}{{{lab}}} {v:.6g} {t}\n"
                             for t, v in zip(ts[:cut], values[:cut], strict=True))
                written += cut
        f.write("# EOF\n")
    return series, samples, written


def head_bodies(items: Iterable[History], start: int, stop: int) -> Iterator[bytes]:
    """The samples in [start, stop), as encoded remote-write TimeSeries."""
    enc = remote_write.SampleEncoder()
    for name, labels, ts, values in items:
        lo, hi = bisect.bisect_left(ts, start), bisect.bisect_left(ts, stop)
        if lo < hi:
            labels = {"__name__": name, **labels}
            yield remote_write.encode_labels(labels) + enc.encode(ts[lo:hi], values[lo:hi])


def _gauge(text: str, name: str) -> float:
    """The value of an unlabelled sample `name` in a /metrics text (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def wait_for_compaction(metrics_url: str, stall_s: float = 900, log=print) -> None:
    """Waits until Prometheus has compacted the imported blocks (into larger ones, in the
    background, which would otherwise run beside and slow the rules measured): until a whole
    compaction cycle has run and changed nothing.

    Prometheus triggers a cycle a minute after the previous one ended
    (`prometheus_tsdb_compactions_triggered_total` counts them) and runs it to the end before the
    next one: once that counter is 2 past its value when the blocks (`blocks_loaded`,
    `compactions_total`) last changed, a cycle that started after the change has ended with no
    further change. There is no fixed deadline, which a loaded host overran (the old 15 minutes
    counted from Prometheus' start, so a long push alone used it up): the wait fails only when no
    cycle ends for `stall_s`."""
    watched = ("prometheus_tsdb_blocks_loaded", "prometheus_tsdb_compactions_total",
               "prometheus_tsdb_compactions_failed_total")
    last: tuple[float, ...] | None = None
    trig_at_change = trig = -1.0
    progressed = time.monotonic()
    while True:
        text = requests.get(metrics_url, timeout=60).text
        now = tuple(_gauge(text, n) for n in watched)
        new_trig = _gauge(text, "prometheus_tsdb_compactions_triggered_total")
        if new_trig != trig:
            trig, progressed = new_trig, time.monotonic()
        if now != last:
            if last is not None:
                log(f"  compaction: blocks {now[0]:.0f}, compactions {now[1]:.0f} (cycle {trig:.0f})")
            last, trig_at_change = now, trig
        if trig >= trig_at_change + 2:
            return
        if time.monotonic() - progressed > stall_s:
            raise RuntimeError(f"no Prometheus compaction cycle ended in {stall_s:.0f} s: "
                               f"{dict(zip(watched, now, strict=True))}, cycles {trig:.0f}")
        time.sleep(5)


def _rules_copy(dst: Path) -> None:
    """rules/ with every group evaluated every EVAL_S seconds (--live)."""
    dst.mkdir()
    for src in sorted((ROOT / "rules").glob("*.yml")):
        doc = yaml.safe_load(src.read_text())
        for g in doc["groups"]:
            g["interval"] = f"{EVAL_S}s"
        (dst / src.name).write_text(yaml.safe_dump(doc, sort_keys=False))


def measure(nodes: int, interval: int = 30, evaluations: int = 4, log=print, head: bool = True,
            live: bool = False, baseline_rules: Path | None = None) -> Figures:
    """Build the history for `nodes` nodes and measure every rule group's evaluation time. With
    `head` (the default) the last HEAD_S seconds go into Prometheus' head by remote write, as on a
    live Prometheus; without it, everything is read from imported blocks (slower per series). With
    `baseline_rules`, that directory's rules are measured on the same history as well (isolated
    only), interleaved round by round, into the result's `baseline`."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-rules-"))
    # Isolated, the queries are made at the history's end, whenever that is. Live, the history must
    # end when the rules start evaluating: later, their instant selectors find nothing (5m
    # lookback); earlier, Prometheus refuses the rules' own output (a sample older than the newest
    # one of that series). So it ends at an estimate of when writing, pushing and compacting are
    # done, and the evaluation waits for that moment.
    started = time.time()
    end = int(started + 30 + SETTLE_S + nodes * PREP_S_PER_NODE[0]) if live else int(started)
    head_start = end - HEAD_S if head else end + 1
    config = tmp / "prometheus.yml"
    proc = None
    try:
        rule_dirs = [RULES] + ([baseline_rules] if baseline_rules else [])
        per_node = node_series(rule_dirs)
        t = time.monotonic()
        series, samples, in_blocks = write_blocks(histories(per_node, nodes, interval, end), head_start,
                                                  tmp / "history.om")
        if in_blocks:
            subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(tmp / "history.om"),
                            str(tmp / "tsdb")], check=True, capture_output=True, timeout=3600)
        (tmp / "history.om").unlink()
        log(f"{nodes} nodes: {series:,} series, {samples:,} samples; {in_blocks:,} of them written to blocks "
            f"in {time.monotonic() - t:.0f} s")
        config.write_text(yaml.safe_dump({"global": {"evaluation_interval": f"{EVAL_S}s"}}))
        proc, port = start_listening(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             "--storage.tsdb.retention.time=10y", "--web.enable-remote-write-receiver",
             "--web.listen-address=127.0.0.1:0", "--log.level=error"], tmp / "prometheus.log", timeout=300)
        api = f"http://127.0.0.1:{port}/api/v1"
        wait_until_serving(f"{api}/status/tsdb", proc, 300, "prometheus")
        t = time.monotonic()
        # In slabs of at most SLAB_S, oldest first: the head refuses a sample older than an hour
        # before the newest one it holds.
        pushed = 0
        for start in range(head_start, end + 1, SLAB_S):
            slab = head_bodies(histories(per_node, nodes, interval, end), start, min(start + SLAB_S, end + 1))
            pushed += remote_write.push(f"{api}/write", slab)
            log(f"  pushed up to {min(start + SLAB_S, end + 1) - head_start} s of {HEAD_S} s "
                f"({time.monotonic() - t:.0f} s)")
        log(f"{nodes} nodes: the last {HEAD_S // 60} minutes pushed into the head ({pushed:,} series-slabs) "
            f"in {time.monotonic() - t:.0f} s")
        PREP_S_PER_NODE[0] = 1.5 * (time.time() - started) / nodes  # for the next, larger run
        t = time.monotonic()
        wait_for_compaction(f"http://127.0.0.1:{port}/metrics", log=log)
        log(f"{nodes} nodes: block compaction settled in {time.monotonic() - t:.0f} s")
        late = time.time() - end if live else 0.0
        if late > 60:
            raise RuntimeError(f"writing and pushing took {late:.0f} s longer than estimated: the history "
                               "is stale; run a smaller --nodes first (it calibrates the estimate)")
        figs = Figures(nodes, series, samples, head, live, rules_dir=_shown(RULES))
        if baseline_rules:
            figs.baseline = Figures(nodes, series, samples, head, live, rules_dir=_shown(baseline_rules))
        if live:
            time.sleep(max(0.0, -late) + 1)
            _live(api, proc, config, tmp / "rules", evaluations, figs)
        else:
            sets = [(RULES, figs)] + ([(baseline_rules, figs.baseline)] if figs.baseline else [])
            _isolated(api, end, evaluations, sets, proc.pid)
        tsdb = requests.get(f"{api}/status/tsdb", timeout=60).json()["data"]
        for f in (figs, figs.baseline):
            if f is not None:
                f.head_series = int(tsdb["headStats"]["numSeries"])
                f.rss_bytes, f.rss_peak_bytes = _rss(proc.pid)
        return figs
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)


def _shown(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in bytes."""
    got = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            got[key] = int(value.split()[0]) * 1024
    return got["VmRSS"], got["VmHWM"]


def _isolated(api: str, at: int, repeats: int, sets: list[tuple[Path, Figures]], pid: int) -> None:
    """Each rule's expression as an instant query, one at a time, `repeats` times at slightly
    different times; a group's time is the sum of its rules' medians (Prometheus evaluates the
    rules of a group one after another). Prometheus' own execution time of the query
    (`stats=all`), so HTTP and JSON are not counted; the rules' writes (recorded series, ALERTS)
    are not either. `at`: the end of the history. With several rule sets (a baseline), each round
    runs every set's rules, one set after another, so both see the same host."""
    loaded = [(rule_groups(d), figs) for d, figs in sets]
    times: list[dict[tuple[str, str], list[float]]] = [{} for _ in sets]
    # Round by round (every rule once per round), so that Prometheus' CPU time per round, and per
    # group, is measured as well: it includes parsing and the JSON answer, not the writes of the
    # rules' output.
    for k in range(repeats):
        for (groups, figs), got in zip(loaded, times, strict=True):
            round_cpu = _cpu_s(pid)
            for group, every, rules in groups:
                figs.intervals[group] = every
                cpu = _cpu_s(pid)
                took = 0.0
                for rule in rules:
                    name = rule.get("alert") or rule.get("record")
                    r = requests.get(f"{api}/query", params={"query": rule["expr"], "time": f"{at - k:.3f}",
                                                             "stats": "all"}, timeout=600).json()
                    if r.get("status") != "success":
                        raise RuntimeError(f"{figs.rules_dir} {group}/{name}: {r.get('error')}")
                    took += r["data"]["stats"]["timings"]["execTotalTime"]
                    got.setdefault((group, name), []).append(r["data"]["stats"]["timings"]["execTotalTime"])
                figs.group_cpu_s.setdefault(group, []).append(_cpu_s(pid) - cpu)
                figs.group_round_s.setdefault(group, []).append(took)
            figs.cpu_s_per_round.append(_cpu_s(pid) - round_cpu)
    for (_, figs), got in zip(loaded, times, strict=True):
        per_group: dict[str, list[tuple[float, float]]] = {}
        for (group, name), ts in got.items():
            figs.rules[f"{group}/{name}"] = statistics.median(ts)
            per_group.setdefault(group, []).append((statistics.median(ts), max(ts)))
        for group, rules in sorted(per_group.items()):
            figs.groups[group] = (sum(m for m, _ in rules), sum(x for _, x in rules), len(rules))


def _live(api: str, proc: subprocess.Popen, config: Path, rules_dir: Path, evaluations: int,
          figs: Figures) -> None:
    """Loads the rules into the running Prometheus (every group every EVAL_S) and reads each
    group's own evaluationTime over `evaluations` evaluations. The groups run concurrently, so on a
    host with fewer cores than busy groups this measures the contention too."""
    # The rules start only now: earlier, their output at the current time would make Prometheus
    # refuse the older pushed samples of the recorded series they read back.
    _rules_copy(rules_dir)
    config.write_text(yaml.safe_dump({"global": {"evaluation_interval": f"{EVAL_S}s"},
                                      "rule_files": [str(rules_dir / "*.yml")]}))
    proc.send_signal(signal.SIGHUP)
    seen: dict[str, dict[str, float]] = {}  # group -> {lastEvaluation: evaluationTime}
    per_rule: dict[str, dict[str, float]] = {}  # group/rule -> {lastEvaluation: evaluationTime}
    rules_per_group: dict[str, int] = {}
    deadline = time.monotonic() + EVAL_S * (evaluations + 2) + 30
    while time.monotonic() < deadline:
        for g in requests.get(f"{api}/rules", timeout=30).json()["data"]["groups"]:
            errors = [r.get("lastError") for r in g["rules"] if r.get("health") == "err"]
            assert not errors, (g["name"], errors)
            if g["lastEvaluation"].startswith("0001"):
                continue
            seen.setdefault(g["name"], {})[g["lastEvaluation"]] = g["evaluationTime"]
            for r in g["rules"]:
                key = f"{g['name']}/{r['name']}"
                per_rule.setdefault(key, {})[r["lastEvaluation"]] = r["evaluationTime"]
            rules_per_group[g["name"]] = len(g["rules"])
        done = seen and min(len(v) for v in seen.values()) >= evaluations
        if done and len(seen) == len(rules_per_group):
            break
        time.sleep(2)
    for name, evals in sorted(seen.items()):
        times = list(evals.values())
        figs.groups[name] = (statistics.median(times), max(times), rules_per_group[name])
    figs.rules = {k: statistics.median(v.values()) for k, v in per_rule.items()}
    figs.intervals = {name: every for name, every, _ in rule_groups()}


def table(results: list[Figures]) -> str:
    groups = sorted({g for r in results for g in r.groups})
    head = f"{'group':28} {'rules':>5} " + " ".join(f"{f'{r.nodes:,} nodes ms':>22}" for r in results)
    lines = [head, f"{'':28} {'':>5} " + " ".join(f"{'median / max':>22}" for _ in results)]
    for g in groups:
        n = next(r.groups[g][2] for r in results if g in r.groups)
        cells = []
        for r in results:
            med, mx, _ = r.groups.get(g, (float("nan"), float("nan"), 0))
            cells.append(f"{med * 1000:>12.1f} / {mx * 1000:>7.1f}")
        lines.append(f"{g:28} {n:>5} " + " ".join(cells))
    worst = [max(mx for _, mx, _ in r.groups.values()) for r in results]
    lines.append(f"{'slowest group (max)':28} {'':>5} " + " ".join(f"{w * 1000:>22.1f}" for w in worst))
    total = [sum(med for med, _, _ in r.groups.values()) for r in results]
    lines.append(f"{'all groups once (sum)':28} {'':>5} " + " ".join(f"{t * 1000:>22.1f}" for t in total))
    lines.append(f"{'Prometheus head series':28} {'':>5} "
                 + " ".join(f"{r.head_series:>22,}" for r in results))
    lines.append(f"{'Prometheus RSS (peak) MiB':28} {'':>5} " + " ".join(
        f"{f'{r.rss_bytes / 2**20:,.0f} ({r.rss_peak_bytes / 2**20:,.0f})':>22}" for r in results))
    lines.append(f"{'CPU s per round (min-max)':28} {'':>5} " + " ".join(
        f"{f'{min(r.cpu_s_per_round or [0]):.2f}-{max(r.cpu_s_per_round or [0]):.2f}':>22}" for r in results))
    lines.append("series / samples in the TSDB: " + "; ".join(
        f"{r.nodes:,} nodes {r.series:,} / {r.samples:,}" for r in results))
    return "\n".join(lines)


def cost_table(r: Figures, top: int = 10) -> str:
    """The rule set's cores at the groups' own intervals, and its costliest groups."""
    q, u = r.cores()
    how = "evaluationTime" if r.live else "query time"
    head = f"{r.rules_dir} at {r.nodes:,} nodes: {q:.3f} cores at the groups' own intervals ({how})"
    if not r.live:
        head += f"; {u:.3f} cores from Prometheus' CPU"
        per = r.cores_per_round()
        if per:
            head += (f"\n  round by round: {min(q for q, _ in per):.3f}-{max(q for q, _ in per):.3f} cores "
                     f"(query time), {min(c for _, c in per):.3f}-{max(c for _, c in per):.3f} (CPU)")
    lines = [head,
             f"  biggest groups by cost (of {len(r.groups)}):",
             f"  {'group':28} {'interval':>8} {'ms/eval':>9} {'CPU ms/eval':>11} {'cores':>7} {'share':>6}"]
    for g, cq, cu, every in r.cost()[:top]:
        cpu_ms = cu * every * 1000
        lines.append(f"  {g:28} {every:>7g}s {r.groups[g][0] * 1000:>9.1f} {cpu_ms:>11.0f} {cq:>7.4f} "
                     f"{cq / q if q else 0:>6.1%}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[100])
    ap.add_argument("--interval", type=int, default=30, help="scrape interval of the synthetic history (s)")
    ap.add_argument("--evaluations", type=int, default=4, help="evaluations of each group to wait for")
    ap.add_argument("--live", action="store_true",
                    help="load the rules into Prometheus and read their evaluationTime (concurrent groups)")
    ap.add_argument("--blocks-only", action="store_true",
                    help="read everything from imported blocks (the earlier method) instead of the head")
    ap.add_argument("--top", type=int, default=0, metavar="N", help="also list the N slowest rules")
    ap.add_argument("--top-groups", type=int, default=10, metavar="N",
                    help="groups listed by cost at their intervals (default 10)")
    ap.add_argument("--baseline-rules", type=Path, metavar="DIR",
                    help="also measure this directory's rule files on the same history (before/after)")
    args = ap.parse_args()
    if args.baseline_rules and args.live:
        ap.error("--baseline-rules measures in isolation only (not with --live)")
    results = [measure(n, args.interval, args.evaluations, log=lambda m: print(m, file=sys.stderr),
                       head=not args.blocks_only, live=args.live, baseline_rules=args.baseline_rules)
               for n in args.nodes]
    how = (f"Prometheus' evaluationTime, every group evaluated every {EVAL_S} s, concurrently" if args.live
           else "its rules' expressions queried one at a time (sum of their median execution times)")
    print(f"Rule group evaluation time: {how}; history at a {args.interval} s scrape")
    print(table(results))
    for r in results:
        print(cost_table(r, args.top_groups))
    if args.baseline_rules:
        base = [r.baseline for r in results if r.baseline]
        print(f"\nBaseline {base[0].rules_dir}, the same history and rounds:")
        print(table(base))
        for b, r in zip(base, results, strict=True):
            print(cost_table(b, args.top_groups))
            print(f"{r.rules_dir} / {b.rules_dir} at {r.nodes:,} nodes: {r.cores()[0] / b.cores()[0]:.2f}x "
                  f"(query time), {r.cores()[1] / b.cores()[1]:.2f}x (CPU)")
    if args.top:
        for r in results:
            print(f"slowest rules at {r.nodes:,} nodes (median ms):")
            for k, v in sorted(r.rules.items(), key=lambda kv: -kv[1])[:args.top]:
                print(f"  {v * 1000:9.1f}  {k}")


if __name__ == "__main__":
    main()
