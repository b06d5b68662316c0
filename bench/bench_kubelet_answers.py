"""Benchmark: peak RSS (VmHWM) and CPU of one kubelet reading (List, then matching to 8 GPUs) for
answers the exporter must not believe, in a fresh interpreter per answer and checkout:
each CHECKOUT's own exporter.workload.kubelet (the grpcio client before issue 36, the h2 one since)
against the same grpcio server (a test dependency) serving the same bytes.

Usage: PYTHONPATH=. python bench/bench_kubelet_answers.py CHECKOUT [CHECKOUT ...]
  e.g. `git worktree add --detach ../base c88ad74 && ... bench/bench_kubelet_answers.py ../base .`
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_workload_kubelet import Lister, serve, stopped  # noqa: E402
from tests.test_workload_kubelet_limits import ld, one_container  # noqa: E402

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
def rss(field="VmRSS:"):  # VmHWM: the peak (ru_maxrss would carry the parent's across fork and exec)
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
from exporter.workload import kubelet
class Gpu:
    def __init__(self, i, uuid):
        self.index, self.uuid = i, uuid
gpus = [Gpu(i, f"GPU-{i:08d}-0000-0000-0000-000000000000") for i in range(8)]
uuids = [g.uuid for g in gpus]
idx = kubelet.GpuIndex({u.lower(): u for u in uuids}, dict(enumerate(uuids)), dict(enumerate(uuids)), {})
c = kubelet.KubeletClient(sys.argv[2], 60.0)
try:  # the client's modules imported before the baseline
    from exporter.workload import grpc_h2  # noqa: F401
except ImportError:
    import grpc  # noqa: F401
    from exporter.workload.podresources import api_pb2, api_pb2_grpc  # noqa: F401
before, t = rss(), time.process_time()
try:
    got = c.list()
    devices = got.devices if hasattr(got, "devices") else got
    out, problems = kubelet.assign(devices, gpus, kubelet.DEFAULT_RESOURCES, idx)
    result = f"read {len(devices)} devices, {len(problems)} problems"
except Exception as e:
    result = str(e)[:150]
print(json.dumps({"before MiB": round(before, 1), "peak MiB": round(rss("VmHWM:"), 1),
                  "cpu s": round(time.process_time() - t, 2), "result": result}))
"""
ANSWERS = {
    "4 MiB, 1.3 M one-character ids": lambda: one_container(ld(2, b"a") * 1_300_000),
    "15 MB of device ids": lambda: one_container(ld(2, b"GPU-0") * 2_140_000),
    "15 MB of empty pods": lambda: ld(1, b"") * 7_500_000,
    "100 MiB": lambda: b"\x00" * (100 << 20),
}


def main() -> None:
    for name, make in ANSWERS.items():
        sock = tempfile.mkdtemp() + "/k.sock"
        srv = serve(sock, Lister([], raw=make()))
        try:
            for tree in sys.argv[1:]:
                r = subprocess.run([sys.executable, "-c", CHILD, str(Path(tree).resolve()), sock],
                                   capture_output=True, text=True, timeout=300)
                print(name, "|", tree, "|", r.stdout.strip() or r.stderr[-300:], flush=True)
        finally:
            stopped(srv)


if __name__ == "__main__":
    main()
