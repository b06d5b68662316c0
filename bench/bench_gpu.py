"""Benchmark of the GPU collector: scrape time, CPU time, naive vs batched, whole
scrape and memory.

Simulated (default): a p5.48xlarge of 8 GPUs on the fake NVML backend with the captured
latencies on (each call's us_median from the H200 capture; each field of a batch costs what
timing-h100/field_cost.json measured). Real (--real): the pynvml backend on this host's GPUs.

    PYTHONPATH=. python3 bench/bench_gpu.py [--scrapes 1000] [--real] [--json OUT.json]

Figures: median and mean wall time of one GPU collection in-process (the GPUs read one after
another: reading them at once measured 3.3 against 6.0 ms median wall but the same CPU, 3.53
against 3.65 ms, on the simulated p5 on 2026-11-28, so it went; exporter/deadline.py), CPU
time per collection (process CPU time over the run / collections), the
naive reading (every value one call at a time, energy and throttle counters included, every
scrape) and the batched-every-scrape reading, the slow-cadence pass, and the exporter as a
subprocess scraped over HTTP n times (GPU collector only, then all collectors): scrape wall
time, the exporter's CPU time per scrape, its RSS along the way and its peak RSS.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter import collectors  # noqa: E402
from exporter.collector import Context  # noqa: E402
from exporter.compose import compose  # noqa: E402
from exporter.config import load  # noqa: E402
from exporter.nvml.backend import NvmlError  # noqa: E402
from exporter.runner import Runner  # noqa: E402
from tests.helpers import no_imds, port_of, wait_until_serving  # noqa: E402

collectors.discover()  # the collectors' config sections, as the composition root does


def ms(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"median_ms": round(statistics.median(xs) * 1e3, 3),
            "mean_ms": round(statistics.fmean(xs) * 1e3, 3),
            "p90_ms": round(xs[int(len(xs) * 0.9)] * 1e3, 3), "n": len(xs)}


def context(real: bool, overrides: dict | None = None, sim=None) -> Context:  # noqa: ANN001
    collectors.collector_classes()
    o = sim.prepare().config() if sim else {}
    o.update(overrides or {})
    if real:
        return compose(load(None, o))
    return sim.context(load(None, o), nvml_latencies=True)


def timed(fn, n: int) -> tuple[list[float], float]:  # noqa: ANN001
    """Wall time of each of n calls, and process CPU seconds per call."""
    walls = []
    cpu0 = time.process_time()
    for _ in range(n):
        t = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t)
    return walls, (time.process_time() - cpu0) / n


class Replicated:
    """The real backend's GPU 0 presented as `n` GPUs (distinct UUIDs and bus ids): on a one-GPU
    host, the cost of reading n GPUs when NVML serialises them all (the worst case)."""

    def __init__(self, inner, n: int) -> None:  # noqa: ANN001
        self.inner, self.n = inner, n

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.inner, name)

    def device_count(self) -> int:
        return self.n

    def call(self, index: int, fn: str, *args: int):  # noqa: ANN201
        v = self.inner.call(0, fn, *args)
        if fn == "nvmlDeviceGetUUID":
            return f"{v[:-2]}{index:02d}"
        if fn == "nvmlDeviceGetPciInfo":
            v["busId"] = f"00000000:{0x53 + 0x11 * index:02X}:00.0"
        return v

    def field_values(self, index: int, ids):  # noqa: ANN001, ANN201
        return self.inner.field_values(0, ids)


REPLICATE = 0


def use_replicated(ctx: Context, n: int) -> None:
    """Make `ctx`'s NVML session the real GPU 0 presented as `n` GPUs."""
    from exporter.nvml.pynvml_backend import PynvmlBackend
    from exporter.nvml.session import NvmlSession

    ctx.nvml = NvmlSession(Replicated(PynvmlBackend(), n), pool=ctx.pool)


def bench_collector(real: bool, sim, n: int) -> dict:  # noqa: ANN001
    from exporter.collectors.gpu import GpuCollector

    ctx = context(real, None, sim)
    if real and REPLICATE:
        use_replicated(ctx, REPLICATE)
    c = GpuCollector(ctx)
    runner = Runner([c], deadline_s=10, pool=ctx.pool)
    runner.collect()  # static values, first reads
    t = time.perf_counter()
    c.refresh_slow(timeout=30)
    slow_s = time.perf_counter() - t
    for _ in range(20):
        runner.collect()
    walls, cpu = timed(runner.collect, n)
    gpus = len(c.gpus)
    ok = sum(1 for g in runner.readings["gpu"].gpus.values() if not g.lost)
    out = {**ms(walls), "cpu_ms_per_scrape": round(cpu * 1e3, 3), "gpus": gpus, "gpus_ok": ok,
           "slow_pass_all_gpus_ms": round(slow_s * 1e3, 2)}
    runner.close()
    c.close()
    return out


# The two per-GPU readings the team's peer_timing.py timed on a real H100 (7.4 ms naive,
# 4.5 ms batched-every-scrape per GPU), replayed call for call.
BATCH_FIELDS = [3, 4, 5, 6, 82, 83, 94, 142, 143, 144, 145, 186, 75, 74, 269, 270, 271, 230]


def naive_read(be, i: int) -> None:  # noqa: ANN001
    """Every health value one call at a time, energy and throttle counters included."""
    calls = [*[("nvmlDeviceGetTotalEccErrors", et, ct) for et in (0, 1) for ct in (0, 1)],
             ("nvmlDeviceGetRemappedRows",), ("nvmlDeviceGetCurrentClocksEventReasons",),
             ("nvmlDeviceGetUtilizationRates",), ("nvmlDeviceGetMemoryInfo",),
             ("nvmlDeviceGetTemperature", 0),
             *[("nvmlDeviceGetTemperatureThreshold", t) for t in (0, 1, 3)],
             ("nvmlDeviceGetPowerUsage",), ("nvmlDeviceGetEnforcedPowerLimit",),
             ("nvmlDeviceGetTotalEnergyConsumption",), ("nvmlDeviceGetClockInfo", 1),
             ("nvmlDeviceGetClockInfo", 2),
             ("nvmlDeviceGetMaxClockInfo", 1), ("nvmlDeviceGetPcieReplayCounter",),
             ("nvmlDeviceGetCurrPcieLinkGeneration",), ("nvmlDeviceGetCurrPcieLinkWidth",),
             ("nvmlDeviceGetPerformanceState",), ("nvmlDeviceGetViolationStatus", 0),
             ("nvmlDeviceGetViolationStatus", 1)]
    for c in calls:
        try:
            be.call(i, *c)
        except NvmlError:
            pass
    be.field_values(i, [82, 230])


def batched_every_scrape(be, i: int) -> None:  # noqa: ANN001
    """One field batch with the expensive fields in it, plus the calls without a field."""
    be.field_values(i, BATCH_FIELDS)
    for c in [("nvmlDeviceGetCurrentClocksEventReasons",), ("nvmlDeviceGetUtilizationRates",),
              ("nvmlDeviceGetMemoryInfo",), ("nvmlDeviceGetTemperature", 0), ("nvmlDeviceGetPowerUsage",),
              ("nvmlDeviceGetClockInfo", 1), ("nvmlDeviceGetClockInfo", 2),
              ("nvmlDeviceGetCurrPcieLinkGeneration",), ("nvmlDeviceGetCurrPcieLinkWidth",),
              ("nvmlDeviceGetPerformanceState",)]:
        try:
            be.call(i, *c)
        except NvmlError:
            pass


def bench_naive(real: bool, sim, n: int, read=naive_read) -> dict:  # noqa: ANN001
    ctx = context(real, None, sim)
    s = ctx.nvml
    s.ensure()

    def once() -> None:
        for d in s.devices:
            read(s.backend, d.index)

    once()
    walls, cpu = timed(once, n)
    return {**ms(walls), "cpu_ms_per_scrape": round(cpu * 1e3, 3), "gpus": len(s.devices)}


@contextlib.contextmanager
def exporter_process(real: bool, profile: str,
                     only: str | None) -> Iterator[tuple[subprocess.Popen, str, list[str]]]:
    """The exporter as deployed (a subprocess serving HTTP), simulated unless `real`; yields the
    process, its /metrics URL and its command line once it has served a first scrape."""
    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "exporter", "--listen", "127.0.0.1:0", "--log-level", "warning"]
    if not real:
        cmd += ["--simulate", profile, "--nvml-latencies"]
    if only:
        cmd += ["--collectors", only]
    cmd = no_imds(cmd)  # this host is no EC2 instance: IMDS off through the config
    proc = subprocess.Popen(cmd, cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port_of(proc)}/metrics"  # it binds port 0, logs nothing at warning
        wait_until_serving(url, proc, 60, "exporter")
        yield proc, url, cmd
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def bench_exporter(real: bool, profile: str, only: str | None, n: int) -> dict:
    """n scrapes of /metrics of one exporter process: their wall time, the exporter's CPU time
    per scrape, its RSS along the way and its peak RSS."""
    import requests

    with exporter_process(real, profile, only) as (proc, url, cmd):
        time.sleep(1.0)  # let the first slow-cadence reading land
        ps = psutil.Process(proc.pid)
        session = requests.Session()
        rss = {}
        walls = []
        cpu0 = sum(ps.cpu_times()[:2])
        text = ""
        for i in range(1, n + 1):
            t = time.perf_counter()
            text = session.get(url, timeout=10).text
            walls.append(time.perf_counter() - t)
            if i in (1, 10, 100, 500, n):
                rss[f"after_{i}"] = round(ps.memory_info().rss / 2**20, 1)
        cpu = (sum(ps.cpu_times()[:2]) - cpu0) / n
        status = {}
        for line in text.splitlines():
            for metric in ("gpu_health_exporter_collector_success",
                           "gpu_health_exporter_collector_duration_seconds"):
                if line.startswith(metric + "{"):
                    name = line.split('collector="')[1].split('"')[0]
                    status.setdefault(name, {})[metric.rsplit("_", 1)[-1]] = float(line.rsplit(" ", 1)[1])
        peak = None
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = round(int(line.split()[1]) / 1024, 1)
        except OSError:
            pass
        return {**ms(walls), "exporter_cpu_ms_per_scrape": round(cpu * 1e3, 3),
                "collectors_last_scrape": status, "bytes": len(text), "rss_mib": rss, "peak_rss_mib": peak,
                "command": " ".join(cmd[1:])}


def bench_whole_vs_single(real: bool, profile: str, n: int, block: int = 10, settle_s: float = 0.3) -> dict:
    """Whole scrape against each collector alone: one exporter per collector plus one with all,
    each measured ALONE: while one is scraped the others are stopped (SIGSTOP), so no other
    exporter's background work (its simulated node's tick, the fake NVML's event thread) takes
    CPU from the one measured, as on a node that runs one exporter. The exporters take turns in
    blocks of `block` scrapes (so slow drifts of the host's load hit all alike), each block after
    `settle_s` for the resumed process's catch-up work (timers that fired while it was stopped).
    Scrapes reuse one keep-alive connection per exporter, with gzip, as Prometheus does. Figures:
    the median HTTP scrape of each, and the whole scrape over the slowest single collector's. Goal:
    at most 1.2, i.e. the collectors overlap and the verdict waits for nothing but
    the GPU reading it uses.

    Before 2026-11-26 (09:00 UTC) the exporters ran side by side, scraped round-robin: the 'all'
    figure then also carried the other seven exporters' background CPU on the 2 cores."""
    import signal

    import requests

    setups = [*collectors.collector_classes(), None]  # None: every enabled collector
    walls: dict[str, list[float]] = {name or "all": [] for name in setups}
    with contextlib.ExitStack() as stack:
        procs = {}
        for name in setups:
            proc, url, _ = stack.enter_context(exporter_process(real, profile, name))
            procs[name or "all"] = (proc, url)
        time.sleep(1.0)  # first slow-cadence readings land

        def only(key: str) -> None:
            for k, (proc, _) in procs.items():
                if k != key:
                    proc.send_signal(signal.SIGSTOP)
            procs[key][0].send_signal(signal.SIGCONT)

        sessions = {k: requests.Session() for k in procs}
        try:
            for key, (_, url) in procs.items():  # warm up, each alone
                only(key)
                for _ in range(10):
                    sessions[key].get(url, timeout=10)
            done = 0
            while done < n:
                k = min(block, n - done)
                for key, (_, url) in procs.items():
                    only(key)
                    time.sleep(settle_s)
                    for _ in range(k):
                        t = time.perf_counter()
                        sessions[key].get(url, timeout=10)
                        walls[key].append(time.perf_counter() - t)
                done += k
        finally:
            for proc, _ in procs.values():  # stopped processes cannot exit on SIGTERM
                proc.send_signal(signal.SIGCONT)
    medians = {k: round(statistics.median(v) * 1e3, 3) for k, v in walls.items()}
    single = {k: v for k, v in medians.items() if k != "all"}
    slowest = max(single, key=single.get)
    return {"median_ms": medians, "slowest_single": slowest,
            "whole_over_slowest": round(medians["all"] / single[slowest], 3), "n": n,
            "method": "each exporter alone (others SIGSTOPped), blocks of "
                      f"{block} keep-alive gzip scrapes after {settle_s:g} s to settle"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scrapes", type=int, default=1000, help="scrapes per measurement (default 1000)")
    p.add_argument("--naive-scrapes", type=int, default=50, help="scrapes of the naive reading (default 50)")
    p.add_argument("--profile", default="p5.48xlarge")
    p.add_argument("--real", action="store_true", help="use this host's GPUs through pynvml")
    p.add_argument("--skip-whole", action="store_true", help="skip the exporter-process part")
    p.add_argument("--all-scrapes", type=int, default=None,
                   help="scrapes of the all-collectors exporter (default: --scrapes)")
    p.add_argument("--whole-scrapes", type=int, default=300,
                   help="scrapes of each exporter in the whole-vs-single comparison (default 300)")
    p.add_argument("--only-whole", action="store_true",
                   help="only the whole-scrape vs slowest-single-collector comparison")
    p.add_argument("--replicate", type=int, default=0, metavar="N",
                   help="with --real: present GPU 0 as N GPUs to the collector (one-GPU hosts)")
    p.add_argument("--json", metavar="FILE", help="also write the results here")
    args = p.parse_args()
    global REPLICATE
    REPLICATE = args.replicate
    logging.basicConfig(level=logging.WARNING)
    sim = None
    if not args.real:
        from exporter.tools.simulate import Simulation

        sim = Simulation(args.profile, []).build()
    res: dict = {"mode": "real" if args.real else f"simulated {args.profile}, captured latencies",
                 "python": platform.python_version(), "cpus": psutil.cpu_count(),
                 "command": " ".join(sys.argv)}
    def stage(name: str, fn) -> None:  # noqa: ANN001
        t = time.perf_counter()
        res[name] = fn()
        print(f"{name}: {time.perf_counter() - t:.1f}s", file=sys.stderr, flush=True)

    try:
        if not args.only_whole:
            stage("gpu_collector_serial", lambda: bench_collector(args.real, sim, args.scrapes))
            stage("naive_one_call_at_a_time", lambda: bench_naive(args.real, sim, args.naive_scrapes))
            stage("batched_every_scrape_no_cadence",
                  lambda: bench_naive(args.real, sim, args.naive_scrapes, batched_every_scrape))
        if not args.skip_whole and not args.only_whole:
            stage("exporter_gpu_only", lambda: bench_exporter(args.real, args.profile, "gpu", args.scrapes))
            stage("exporter_all_collectors",
                  lambda: bench_exporter(args.real, args.profile, None, args.all_scrapes or args.scrapes))
        if not args.skip_whole:
            stage("whole_scrape_vs_slowest_single_collector",
                  lambda: bench_whole_vs_single(args.real, args.profile, args.whole_scrapes))
    finally:
        if sim is not None:
            sim.close()
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
