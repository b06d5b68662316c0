"""Benchmark: what the workload source costs on a simulated p5.48xlarge (8 GPUs) with 8 Slurm jobs
or 8 pods, one per GPU.

- CPU per scrape of each kind: a collection of a Runner holding only the workload collector,
  minus one holding only a collector that does nothing (the runner's own cost), in this process,
  timed with time.process_time() (every thread of the process) over
  --scrapes collections after a warm-up, the two runners alternating in rounds of 100. The
  kubelet kind calls a pod-resources server in another process (so the server's CPU is not
  counted), over a unix socket, with its h2 client (exporter.workload.grpc_h2).
  The slurm_cgroup kind reads NVML's process lists from the fake backend (no NVML latency: on a
  real node add two NVML calls per GPU) and a generated /proc tree.
- Series added: what one collection exports (gpu_workload_info and the source's status), plus
  the runner's collector_success and collector_duration for the collector.
- RSS added by the kubelet client: VmRSS of a fresh interpreter after `import exporter.cli`, then
  after importing the client (h2 and the decoder), then after one List call.

Usage: PYTHONPATH=. python bench/bench_workload.py [--scrapes 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter import collectors  # noqa: E402
from exporter.catalog import Families  # noqa: E402
from exporter.collector import Collector  # noqa: E402
from exporter.collectors.workload import WorkloadCollector  # noqa: E402
from exporter.compose import compose  # noqa: E402
from exporter.config import load  # noqa: E402
from exporter.deadline import Pool  # noqa: E402
from exporter.nvml.fake import FakeBackend, load_capture  # noqa: E402
from exporter.nvml.session import NvmlSession  # noqa: E402
from exporter.profiles import PROFILES  # noqa: E402
from exporter.runner import Runner  # noqa: E402
from exporter.tools.simulate.nvml_synth import node_capture  # noqa: E402

P5 = PROFILES["p5.48xlarge"]

SERVER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from exporter.tools.simulate.podresources_server import serve
    uuids = {uuids!r}
    pods = [("training", f"pod-{{i}}", "trainer", "nvidia.com/gpu", [u]) for i, u in enumerate(uuids)]
    serve({sock!r}, pods)
""")

RSS = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r})
    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    import exporter.cli  # noqa
    out = {{"base": rss()}}
    from exporter.workload.kubelet import KubeletClient
    c = KubeletClient({sock!r}, 5.0)
    out["imported"] = rss()
    c.list()
    out["called"] = rss()
    print(json.dumps(out))
""")


def session() -> tuple[FakeBackend, NvmlSession]:
    fake = FakeBackend(node_capture(P5, load_capture()))
    s = NvmlSession(fake, pool=Pool())  # the bench process exits with it
    assert s.ensure()
    return fake, s


class Nothing(Collector):
    name = "workload"  # the same name: the runner's own series are the same

    def collect(self, out: Families) -> None:
        return None


def cpu_per_scrape(overrides: dict, nvml: NvmlSession, scrapes: int) -> tuple[float, int]:
    collectors.discover()  # the composition root: the collectors' config sections
    ctx = compose(load(None, overrides), nvml=nvml)
    c = WorkloadCollector(ctx)
    runners = [Runner([c], deadline_s=5, pool=ctx.pool), Runner([Nothing(ctx)], deadline_s=5, pool=ctx.pool)]
    for r in runners:
        for _ in range(50):
            r.collect()
    out = Families()
    c.collect(out)
    series = sum(len(f.samples) for f in out)
    spent = [0.0, 0.0]
    for _ in range(max(1, scrapes // 100)):
        for i, r in enumerate(runners):
            t = time.process_time()
            for _ in range(100):
                r.collect()
            spent[i] += time.process_time() - t
    c.close()
    return (spent[0] - spent[1]) / (max(1, scrapes // 100) * 100), series


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapes", type=int, default=2000)
    args = ap.parse_args()
    fake, nvml = session()
    uuids = [d.uuid for d in nvml.devices]
    tmp = Path(tempfile.mkdtemp(prefix="bench-workload-"))
    mapping = tmp / "map"
    mapping.mkdir()
    for i in range(8):
        (mapping / str(i)).write_text(f"{1000 + i}\n")
    proc = tmp / "proc"
    (proc / "1").mkdir(parents=True)  # init: the cgroup kind checks that procfs shows others' processes
    for i in range(8):
        pid = 5000 + i
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(
            f"0::/system.slice/slurmstepd.scope/job_{1000 + i}/step_0/user/task_0\n")
        fake.set_value(i, "nvmlDeviceGetComputeRunningProcesses", [{"pid": pid, "usedGpuMemory": 1 << 30}])
    sock = str(tmp / "kubelet.sock")
    server = subprocess.Popen([sys.executable, "-c", SERVER.format(root=str(ROOT), uuids=uuids, sock=sock)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"
    try:
        kinds = {
            "slurm_mapping (8 jobs)": {"workload.slurm_job_mapping_dir": str(mapping)},
            "slurm_cgroup (8 jobs)": {"workload.slurm_cgroup": True, "paths.procfs": str(proc)},
            "kubelet (8 pods)": {"workload.kubelet_socket": sock},
        }
        print(f"workload source on a simulated p5.48xlarge, {args.scrapes} collections each, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs")
        for name, overrides in kinds.items():
            took, series = cpu_per_scrape(overrides, nvml, args.scrapes)
            print(f"  {name:24} CPU {took * 1e3:.3f} ms per collection; {series} series "
                  f"(+2 collector_success/duration)")
        r = subprocess.run([sys.executable, "-c", RSS.format(root=str(ROOT), sock=sock)], capture_output=True,
                           text=True, timeout=60, check=True)
        rss = json.loads(r.stdout)
        base = rss["base"]
        print(f"  RSS: {base:.1f} MiB after import exporter.cli; +{rss['imported'] - base:.1f} MiB importing "
              f"the kubelet client (h2); +{rss['called'] - base:.1f} MiB after one List")
    finally:
        server.stdin.close()
        server.wait(10)


if __name__ == "__main__":
    main()
