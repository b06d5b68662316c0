"""The bounded maps of the XID path under a hostile kernel log: 10,000 PCI
addresses, each with an `NVRM: GPU at PCI` line and 8 XIDs (90,000 records), read once by the
one-shot path, the state file written, one scrape of the xid and health collectors. Prints the
XID and health series, the scrape and state file sizes, peak RSS and the CPU time of it all.

    python bench/bench_xid_limits.py [ROOT]    # ROOT: the tree to measure (default: this one)
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(ROOT))

from exporter import collectors  # noqa: E402
from exporter.collectors.health import HealthCollector  # noqa: E402
from exporter.collectors.xid import XidCollector  # noqa: E402
from exporter.compose import compose  # noqa: E402
from exporter.config import load  # noqa: E402
from exporter.deadline import Pool  # noqa: E402
from exporter.nvml.fake import FakeBackend  # noqa: E402
from exporter.nvml.session import NvmlSession  # noqa: E402
from exporter.runner import Runner  # noqa: E402
from exporter.xid.service import one_shot  # noqa: E402
from tests.helpers import scrape  # noqa: E402


def main() -> None:
    d = Path(tempfile.mkdtemp())
    (d / "proc/sys/kernel/random").mkdir(parents=True)
    (d / "proc/sys/kernel/random/boot_id").write_text("b\n")
    out, seq = [], 0
    for i in range(10_000):
        pci = f"{i >> 8:04x}:{i & 0xff:02x}:00"
        out.append(f"4,{seq},{seq},-;NVRM: GPU at PCI:{pci}: GPU-{i:08x}-0000-0000-0000-000000000000\n")
        seq += 1
        for x in (13, 31, 43, 45, 48, 63, 74, 79):
            out.append(f"4,{seq},{seq * 30_000_000},-;NVRM: Xid (PCI:{pci}): {x}, pid=1, name=p, t\n")
            seq += 1
    (d / "kmsg").write_text("".join(out))
    nvml = NvmlSession(FakeBackend({"system": {}, "devices": []}), pool=Pool())
    nvml.backend.fail_init(12, "no NVML in this bench")
    collectors.discover()  # the composition root: the collectors' config sections
    cfg = load(None, {"paths.procfs": str(d / "proc"), "paths.kmsg": str(d / "kmsg"),
                      "paths.state_dir": str(d / "state"), "xid.nvml_events": False,
                      "instance.imds": False})  # nothing beyond loopback
    ctx = compose(cfg, nvml=nvml)
    t = time.process_time()
    svc = one_shot(ctx)
    svc.flush_state(force=True)
    text = scrape(Runner([XidCollector(ctx), HealthCollector(ctx)], deadline_s=60, pool=ctx.pool))
    cpu = time.process_time() - t
    lines = text.splitlines()
    print(json.dumps({
        "xid_series": sum(1 for x in lines if x.startswith("gpu_xid_errors_total{")),
        "health_series": sum(1 for x in lines if x.startswith("gpu_health_")),
        "scrape_bytes": len(text), "state_file_bytes": os.path.getsize(d / "state" / "xid-state.json"),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "cpu_s": round(cpu, 2)}))


if __name__ == "__main__":
    main()
