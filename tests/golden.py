"""The golden /metrics: how each golden file in tests/fixtures/golden/ is made (a pinned
simulated p5.48xlarge scraped once, volatile series masked). tests/test_golden.py compares a
scrape with each file; `python -m exporter.tools.generate` (re)writes them. See tests/test_golden.py for
what is pinned and why.
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path
from unittest import mock

from exporter import collectors
from exporter.arguments import build_parser
from exporter.exposition import render
from exporter.runner import Runner
from exporter.startup import build_context
from exporter.web.server import families
from tests.helpers import FIXTURES, START_HANG_GUARD_S, test_pool

GOLDEN = FIXTURES / "golden"
FROZEN = 1767225600.0  # 2026-01-01T00:00:00Z
IDENTITY = "instance:\n  instance_id: i-0123456789abcdef0\n  availability_zone: us-east-2b\n"
CONFIGS = {  # golden file -> config (besides IDENTITY)
    "p5.48xlarge.prom": "",  # the defaults
    "p5.48xlarge-all.prom": "efa:\n  counters: all\ngpu:\n  detail: all\nlustre:\n  per_target: true\n",
}
EXCLUDED = re.compile(r"process_")
MASKED_VALUES = re.compile(
    r"gpu_health_exporter_(collector_duration_seconds|scrapes_total|collections_total)\b")
MASKED_LABELS = re.compile(r'((?:python_version|revision|branch)=")[^"]*(")')


def mask(text: str) -> str:
    """The exposition with the volatile series excluded or masked (see tests/test_golden.py)."""
    out = []
    for line in text.splitlines(keepends=True):
        name = line.split(" ", 3)[2] if line.startswith("# ") else line
        if EXCLUDED.match(name):
            continue
        if not line.startswith("#"):
            if MASKED_VALUES.match(line):
                line = line.rsplit(" ", 1)[0] + " NaN\n"
            line = MASKED_LABELS.sub(r"\1masked\2", line)
        out.append(line)
    return "".join(out)


def _value(text: str, name: str) -> str | None:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return m[1] if m else None


def golden_scrape(work: Path, extra_config: str) -> str:
    """/metrics of the pinned simulated p5.48xlarge, as the endpoint renders it, masked; `work`
    is an empty directory for its config and state."""
    with mock.patch.object(time, "time", lambda: FROZEN):
        cfg = work / "config.yml"
        cfg.write_text(IDENTITY + extra_config)
        ctx, sim = build_context(build_parser().parse_args(
            ["--simulate", "p5.48xlarge", "--config", str(cfg), "--path.state-dir", str(work / "state")]))
        ctx.nvml.ensure()
        freeze = getattr(ctx.nvml.backend, "advance_to", None)
        if freeze is not None:
            freeze(0.0)
        records = len((sim.root / "dev" / "kmsg").read_text().splitlines())
        built = collectors.build(ctx)
        runner = Runner.from_config(built, ctx.config, pool=test_pool())
        try:
            runner.start()
            for c in built:
                if hasattr(c, "refresh_slow"):
                    c.refresh_slow(timeout=30)
            # The follower reads the simulated kernel log in the background: wait for all of it.
            deadline = time.monotonic() + START_HANG_GUARD_S
            while True:
                text = render(families(runner.collect())).decode()
                if _value(text, "gpu_health_exporter_kmsg_up") == "1.0" and \
                        _value(text, "gpu_health_exporter_kmsg_records_total") == f"{records:.1f}":
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the kernel-log follower did not read the simulated log")
                time.sleep(0.1)
            failed = [line for line in text.splitlines()
                      if "collector_success" in line and line.endswith(" 0.0")]
            if 'collector_success{collector="' not in text or failed:
                raise RuntimeError(f"a collector failed: the golden file would record a failure: {failed}")
            return mask(text)
        finally:
            runner.close()
            sim.close()


def expected() -> dict[Path, str]:
    """Every golden file and what it must hold (a simulated node scraped per file)."""
    out = {}
    for name, config in sorted(CONFIGS.items()):
        with tempfile.TemporaryDirectory(prefix="golden-") as work:
            out[GOLDEN / name] = golden_scrape(Path(work), config)
    return out
