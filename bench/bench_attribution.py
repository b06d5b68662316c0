"""Fault attribution's cost, in-process on a simulated p5 (fake NVML, 8 GPUs):

1. per counted event: FaultAttribution.xid() (history lookup + ledger) with 8 GPUs each holding
   a full history (256 workload changes), and FaultAttribution.sxid() (all 8 GPUs);
2. per scrape: the xid and nvswitch collectors' collect(), with an empty ledger and with a full
   one (8 GPUs x 8 attributed XIDs x 2 workloads, and an SXid on all 8 GPUs): the difference is
   what the attribution series add; and how many series they are.

    PYTHONPATH=. python bench/bench_attribution.py [--repeat 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter import collectors  # noqa: E402
from exporter.attribution.history import MAX_SEGMENTS  # noqa: E402
from exporter.attribution.ledger import MAX_PER_GPU, Attribution, AttributionLedger  # noqa: E402
from exporter.catalog import Families  # noqa: E402
from exporter.collectors.nvswitch import NvswitchCollector  # noqa: E402
from exporter.collectors.xid import XidCollector  # noqa: E402
from exporter.workload.model import Workload, WorkloadReading  # noqa: E402
from exporter.xid.parser import pci_key  # noqa: E402
from exporter.xid.service import one_shot  # noqa: E402
from tests.test_xid_service import fake_p5, make_ctx  # noqa: E402

collectors.discover()  # the collectors' config sections, as the composition root does


def timed(fn, repeat: int) -> float:
    """Median microseconds of fn() over `repeat` runs (in batches of 10)."""
    runs = []
    for _ in range(max(1, repeat // 10)):
        t = time.perf_counter()
        for _ in range(10):
            fn()
        runs.append((time.perf_counter() - t) / 10 * 1e6)
    return statistics.median(runs)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=2000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        _, session = fake_p5()
        ctx = make_ctx(Path(tmp), "", nvml=session)
        svc = one_shot(ctx)
        gpus = [(d.uuid, pci_key(d.pci_bus_id)) for d in session.devices]
        now, mono = time.time(), time.monotonic()
        for k in range(2 * MAX_SEGMENTS):  # a reading every 7.5 s, a new job on every GPU every 15 s
            ago = (2 * MAX_SEGMENTS - k) * 7.5
            held = {u: (Workload(hpc_job=f"{k // 2}{i}"),) for i, (u, _) in enumerate(gpus)}
            ctx.workloads.observe(WorkloadReading(now - ago, held, mono - ago))
        attribution = svc.attribution
        xid_us = timed(lambda: attribution.xid(gpus[3][1], 94, now - 1000), args.repeat)
        sxid_us = timed(lambda: attribution.sxid("00000000:06:00", 20034, now - 1000), args.repeat)

        collectors = [XidCollector(ctx), NvswitchCollector(ctx)]

        def scrape() -> None:
            out = Families()
            for c in collectors:
                c.collect(out)

        def fill(per_gpu: int, workloads: int) -> tuple[float, int]:
            attribution.ledger = AttributionLedger()
            for i, (_, pci) in enumerate(gpus):
                for x in range(per_gpu):
                    attribution.ledger.add(Attribution(pci, "xid", 13 + x, "", now - x, tuple(
                        Workload(hpc_job=f"{i}{x}{w}") for w in range(workloads))))
            us = timed(scrape, args.repeat)
            out = Families()
            for c in collectors:
                c.collect(out)
            return us, sum(len(f.samples) for f in out if "workload" in f.name)

        empty_us, _ = fill(0, 0)
        typical_us, typical = fill(1, 1)  # 8 jobs, each killed by one XID
        full_us, full = fill(MAX_PER_GPU, 2)  # every GPU's ledger at its bound, 2 jobs sharing each GPU
    print(f"per XID event, attribution: {xid_us:.1f} us (8 GPUs, {MAX_SEGMENTS} workload changes each)")
    print(f"per SXid report, attribution on all 8 GPUs: {sxid_us:.1f} us")
    print(f"xid+nvswitch collect, no attribution: {empty_us:.1f} us; 8 GPUs x 1 XID x 1 job: "
          f"{typical_us:.1f} us "
          f"(+{typical_us - empty_us:.1f} us for {typical} series); every ledger full: {full_us:.1f} us "
          f"(+{full_us - empty_us:.1f} us for {full} series)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
