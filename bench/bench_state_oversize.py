"""The XID collector's scrape with a state file over the 16 MiB limit in place: such
a file used to be read on every scrape (twice with the health collector) until the daemon next
wrote; it is now set aside at the first read (or, when it cannot be, not read again until it
changes). Prints the median and max of 20 scrapes after the file appeared.

    .venv/bin/python bench/bench_state_oversize.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.collectors.xid import XidCollector  # noqa: E402
from exporter.runner import Runner  # noqa: E402
from tests.helpers import scrape  # noqa: E402
from tests.test_xid_service import make_ctx  # noqa: E402

SCRAPES = 20

with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    ctx = make_ctx(tmp, "4,500,5000000,-;NVRM: Xid (PCI:0000:53:00): 94, pid=1, name=p, x\n")
    runner = Runner([XidCollector(ctx)], deadline_s=10, pool=ctx.pool)
    scrape(runner)
    (tmp / "state").mkdir(exist_ok=True)
    (tmp / "state" / "xid-state.json").write_bytes(b" " * (17 << 20))
    ms = []
    for _ in range(SCRAPES):
        t = time.perf_counter()
        scrape(runner)
        ms.append((time.perf_counter() - t) * 1000)
    print(f"scrape with a 17 MiB state file: median {statistics.median(ms):.2f} ms, "
          f"max {max(ms):.2f} ms over {SCRAPES} scrapes")
