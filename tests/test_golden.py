"""The golden /metrics, as node_exporter keeps one: the whole exposition of a
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

How a golden file is made is tests/golden.py. Regenerate after an intended change (then review
the diff like code), with every other generated file:

    .venv/bin/python -m exporter.tools.generate
"""

from __future__ import annotations

import difflib

import pytest

from tests.golden import CONFIGS, GOLDEN, golden_scrape, mask

COMMAND = ".venv/bin/python -m exporter.tools.generate"


@pytest.mark.slow
@pytest.mark.parametrize("golden", sorted(CONFIGS))
def test_metrics_match_the_golden_file(golden, tmp_path):
    got = golden_scrape(tmp_path, CONFIGS[golden])
    path = GOLDEN / golden
    want = path.read_text() if path.exists() else ""
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(keepends=True), got.splitlines(keepends=True),
                                            f"{path} (golden)", "this scrape", n=1))
        pytest.fail(f"/metrics differs from {path}; if intended, regenerate with "
                    f"`{COMMAND}` and review "
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
