"""Benchmark: what the NCCL RAS collector costs against job size, against the fake RAS server
(exporter/tools/simulate/nccl_ras.py, JSON as NCCL 2.29 writes it, one world communicator).

  - per query on this node: reply bytes, and this process's CPU to connect, read, parse and
    summarise a reply (exporter.nccl.reader.read_job, thread CPU), median of --queries;
  - per scrape: the collector's CPU to export a job's last reply (derive), as the querier;
  - fleet: STATUS per interval cluster-wide for one job of --fleet-nodes nodes, each node a
    collector of its own, over --intervals intervals, with the election and without.

NCCL's own cost (the ring collective inside the training processes) is not measured here: the
fake server answers from memory. Usage: python bench/bench_nccl.py [--sizes 32,256,1024,4096]
[--queries 20] [--fleet-nodes 16] [--intervals 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter import collectors  # noqa: E402
from exporter.catalog import Families  # noqa: E402
from exporter.compose import compose  # noqa: E402
from exporter.config import load  # noqa: E402
from exporter.deadline import Pool  # noqa: E402
from exporter.nccl import netns  # noqa: E402
from exporter.nccl.reader import Settings, read_job  # noqa: E402
from exporter.nvml.session import NvmlSession  # noqa: E402
from exporter.profiles import PROFILES  # noqa: E402
from exporter.tools.simulate.nccl_ras import FakeJob, Proc, RasServer, write_procfs  # noqa: E402
from exporter.tools.simulate.nvml import fake_backend  # noqa: E402
from exporter.workload.model import Workload, WorkloadReading  # noqa: E402

GPUS = 8


def node_tree(root: Path, server: RasServer, node: int) -> dict[int, int]:
    """Node `node`'s processes of the server's job; returns host pid -> GPU."""
    host = server.job.ranks[node * GPUS].host
    ranks = [r for r in server.job.ranks if r.host == host]
    ring = 900000 + node
    procs = [
        Proc(
            100 + r.gpu,
            r.pid,
            r.gpu,
            {"NCCL_RAS_ADDR": f"127.0.0.1:{server.port}"},
            [ring, server.inode] if r.gpu == 0 else [ring],
        )
        for r in ranks
    ]
    write_procfs(root, procs, [("127.0.0.1", server.port, server.inode), (host, 41000, ring)])
    return {p.pid: p.gpu for p in procs}


def per_query(sizes: list[int], queries: int) -> None:
    print(f"{'GPUs':>6} {'reply bytes':>12} {'CPU/query ms':>13} {'CPU/scrape ms':>14}")
    pool = Pool()
    for gpus in sizes:
        job = FakeJob.uniform(max(1, gpus // GPUS), min(gpus, GPUS))
        job.step(96440)
        job.freeze(min(13, gpus - 1))
        job.step(1, "AllGather")
        server = RasServer(job).start()
        with tempfile.TemporaryDirectory() as tmp:
            pids = node_tree(Path(tmp), server, 0)
            cpu, size = [], 0
            for _ in range(queries):
                t0 = time.thread_time()
                r = read_job(tmp, pids, netns.open_socket, Settings(max_bytes=64 << 20))
                cpu.append(time.thread_time() - t0)
                assert r.result == "ok", r.why
                size = r.bytes
            c = collector(Path(tmp), pool)
            c.start()
            scrape(c)
            c.settled(60)
            t0 = time.thread_time()
            for _ in range(queries):
                scrape(c)
            per_scrape = (time.thread_time() - t0) / queries
            c.close()
        server.close()
        print(f"{gpus:>6} {size:>12} {statistics.median(cpu) * 1e3:>13.2f} {per_scrape * 1e3:>14.3f}")
    pool.close()


NOW = [1000.0]


def collector(root: Path, pool: Pool, **cfg: object) -> collectors.Collector:
    collectors.discover()
    config = load(
        None,
        {
            "paths.procfs": str(root),
            "nccl.enabled": True,
            "nccl.max_reply_bytes": 64 << 20,
            **{f"nccl.{k}": v for k, v in cfg.items()},
        },
    )
    nvml = NvmlSession(fake_backend(PROFILES["p5.48xlarge"]), pool=pool)
    nvml.ensure()
    c = collectors.collector_classes()["nccl"](
        compose(config, nvml=nvml, pool=pool),
        opener=netns.open_socket,
        mono=lambda: NOW[0],
        processes=lambda gpus: {100 + g: g for g in gpus},
    )
    c.uuids = [d.uuid for d in nvml.devices]  # type: ignore[attr-defined]
    return c


def scrape(c: collectors.Collector) -> None:
    reading = WorkloadReading(0.0, {u: (Workload(hpc_job="4711"),) for u in c.uuids})  # type: ignore[attr-defined]
    c.derive(Families(), {"workload": reading})  # type: ignore[attr-defined]


def fleet(nodes: int, intervals: int) -> None:
    pool = Pool(8)
    for elect in (True, False):
        job = FakeJob.uniform(nodes, GPUS)
        server = RasServer(job).start()
        with tempfile.TemporaryDirectory() as tmp:
            cs = []
            for n in range(nodes):
                node_tree(Path(tmp) / str(n), server, n)
                c = collector(Path(tmp) / str(n), pool, elect=elect)
                c.start()
                cs.append(c)
            for _ in range(intervals):
                NOW[0] += 30.0
                for c in cs:
                    scrape(c)
                for c in cs:
                    c.settled(60)
            for c in cs:
                c.close()
        server.close()
        print(
            f"{nodes} nodes, elect={elect}: {server.statuses} STATUS in {intervals} intervals "
            f"({server.statuses / intervals:.2f} per interval; {server.bytes_sent / intervals / 1e3:.0f} kB "
            f"per interval served)"
        )
    pool.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="32,256,1024,4096")
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--fleet-nodes", type=int, default=16)
    ap.add_argument("--intervals", type=int, default=30)
    a = ap.parse_args()
    per_query([int(x) for x in a.sizes.split(",")], a.queries)
    fleet(a.fleet_nodes, a.intervals)


if __name__ == "__main__":
    main()
