"""The promtool unit suites (tests/rules/*.test.yml) on rules/, with the real promtool: a file of
their own, so that the suites' two promtool runs at a time share no xdist worker with the rest of the
rules' tests (tests/test_rules.py)."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import HANG_GUARD_S, promtool
from tests.rules_lint import suites


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=HANG_GUARD_S)


# The suites that take promtool longest (seconds on an idle core), longest first: the two at a time
# below then end together (about 68 s in all on an idle host, against 79 s in name order). A stale
# list costs only balance.
LONGEST_SUITES = ("gpu_ecc.test.yml",  # 31
                  "fleet.test.yml",  # 26
                  "job_day.test.yml",  # 26
                  "gpu_ecc_fleet.test.yml",  # 14
                  "job.test.yml",  # 12
                  "restarts_and_acks.test.yml",  # 11
                  "ec2.test.yml")  # 9; the others about 1 s each


def _longest_first(p: Path) -> int:
    return LONGEST_SUITES.index(p.name) if p.name in LONGEST_SUITES else len(LONGEST_SUITES)


@pytest.fixture(scope="module")
def unit_suite_runs() -> dict[Path, subprocess.CompletedProcess]:
    """promtool on every unit suite, two at a time (each runs on one core; the suites are
    independent), longest first, once for the module."""
    order = sorted(suites(), key=_longest_first)
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(order, pool.map(lambda p: _run("test", "rules", str(p)), order), strict=True))


@pytest.mark.parametrize("path", suites(), ids=lambda p: p.name)
def test_promtool_unit_suite(path, unit_suite_runs):
    r = unit_suite_runs[path]
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout
