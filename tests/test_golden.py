"""The golden /metrics (issue 19 item 7), as node_exporter keeps one: the whole exposition of a
simulated p5.48xlarge, compared byte for byte with tests/fixtures/golden/, so every rename, label
change, new or stray series shows up as one diff in review.

Pinned so the bytes repeat: a frozen wall clock (time.time() is FROZEN for the whole run, so the
simulated Lustre stats' reset time and every timestamp derived from the wall clock are fixed), the
simulated NVML's clock held at 0 s (no counter grows), the simulation's own clock never started,
and fixed identities: the simulation derives GPU UUIDs, serials, PCI addresses, the boot id and
the EFA/Lustre names from the profile, and the config below fixes the instance id and zone.
The collection is taken once the background readers are done: the kernel-log follower has read
every record of the simulated log and the GPUs' slow-cadence counters have been read once.

Volatile series, deliberately:
- excluded: every process_* series (CPU, memory, fds, threads, start time of the test process;
  tests/test_server.py checks their names against prometheus_client's ProcessCollector);
- kept with the value masked as NaN: gpu_health_exporter_collector_duration_seconds (wall time),
  gpu_health_exporter_scrapes_total and gpu_health_exporter_collections_total (how many the
  test's wait took); the labels python_version, revision and branch of
  gpu_health_exporter_build_info are masked as "masked" (the interpreter running the test, the
  commit and branch of the checkout).

Regenerate after an intended change (then review the diff like code):

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_golden.py
"""

from __future__ import annotations

import difflib
import os
import re
import time

import pytest

from exporter import collectors
from exporter.cli import build_context, build_parser
from exporter.exposition import render
from exporter.runner import Runner
from exporter.server import families
from tests.helpers import FIXTURES

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
UPDATE = os.environ.get("UPDATE_GOLDEN", "") not in ("", "0")


def mask(text: str) -> str:
    """The exposition with the volatile series excluded or masked (see the module docstring)."""
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


def golden_scrape(tmp_path, monkeypatch, extra_config: str) -> str:
    """/metrics of the pinned simulated p5.48xlarge, as the endpoint renders it, masked."""
    monkeypatch.setattr(time, "time", lambda: FROZEN)
    cfg = tmp_path / "config.yml"
    cfg.write_text(IDENTITY + extra_config)
    ctx, sim = build_context(build_parser().parse_args(
        ["--simulate", "p5.48xlarge", "--config", str(cfg), "--path.state-dir", str(tmp_path / "state")]))
    ctx.nvml.ensure()
    freeze = getattr(ctx.nvml.backend, "advance_to", None)
    if freeze is not None:
        freeze(0.0)
    records = len((sim.root / "dev" / "kmsg").read_text().splitlines())
    built = collectors.build(ctx)
    runner = Runner.from_config(built, ctx.config)
    try:
        runner.start()
        for c in built:
            if hasattr(c, "refresh_slow"):
                c.refresh_slow(timeout=30)
        # The follower reads the simulated kernel log in the background: wait for all of it.
        deadline = time.monotonic() + 60
        while True:
            text = render(families(runner.collect())).decode()
            if _value(text, "gpu_health_exporter_kmsg_up") == "1.0" and \
                    _value(text, "gpu_health_exporter_kmsg_records_total") == f"{records:.1f}":
                break
            assert time.monotonic() < deadline, "the kernel-log follower did not read the simulated log"
            time.sleep(0.1)
        assert 'collector_success{collector="' in text and "} 0.0\n" not in "".join(
            line for line in text.splitlines(keepends=True) if "collector_success" in line), \
            "a collector failed: the golden file would record a failure"
        return mask(text)
    finally:
        runner.close()
        sim.close()


@pytest.mark.slow
@pytest.mark.parametrize("golden", sorted(CONFIGS))
def test_metrics_match_the_golden_file(golden, tmp_path, monkeypatch):
    got = golden_scrape(tmp_path, monkeypatch, CONFIGS[golden])
    path = GOLDEN / golden
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
        print(f"wrote {path}")
    want = path.read_text() if path.exists() else ""
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(keepends=True), got.splitlines(keepends=True),
                                            f"{path} (golden)", "this scrape", n=1))
        pytest.fail(f"/metrics differs from {path}; if intended, regenerate with "
                    f"`UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_golden.py` and review "
                    f"the diff:\n{diff[:20000]}", pytrace=False)


def test_the_mask_excludes_and_masks_only_the_volatile_series():
    scrapes = "gpu_health_exporter_scrapes_total"
    text = ("# HELP process_threads Threads.\n# TYPE process_threads gauge\nprocess_threads 9.0\n"
            f"# HELP {scrapes} Scrapes.\n# TYPE {scrapes} counter\n{scrapes} 3.0\n"
            'gpu_health_exporter_collector_duration_seconds{collector="gpu"} 0.01\n'
            'gpu_health_exporter_collector_success{collector="gpu"} 1.0\n'
            'gpu_health_exporter_build_info{branch="main",python_version="3.11.7",revision="abc",'
            'version="0.1.0"} 1.0\n')
    assert mask(text) == (
        f"# HELP {scrapes} Scrapes.\n# TYPE {scrapes} counter\n{scrapes} NaN\n"
        'gpu_health_exporter_collector_duration_seconds{collector="gpu"} NaN\n'
        'gpu_health_exporter_collector_success{collector="gpu"} 1.0\n'
        'gpu_health_exporter_build_info{branch="masked",python_version="masked",revision="masked",'
        'version="0.1.0"} 1.0\n')
