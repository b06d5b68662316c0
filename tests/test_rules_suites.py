"""The promtool unit suites (tests/rules/*.test.yml) on rules/, with the real promtool, one suite a
test. The suites are independent and take promtool 200 s of CPU in all on a 2-core host (the job
suites a minute each), so the module is `spread`: under xdist each suite goes to whichever worker
is free (tests/conftest.py) instead of all of them holding one worker."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import HANG_GUARD_S, promtool
from tests.rules_lint import suites

pytestmark = pytest.mark.spread

# The suites that take promtool longest (seconds on a loaded 2-core host), longest first: handed
# out first, so that no worker starts a minute-long suite when the others are done. A stale list
# costs only balance.
LONGEST_SUITES = ("job.test.yml",  # 80
                  "job_day.test.yml",  # 78
                  "gpu_ecc.test.yml",  # 30
                  "gpu_ecc_fleet.test.yml",  # 21
                  "fleet.test.yml",  # 19
                  "restarts_and_acks.test.yml",  # 12
                  "active.test.yml",  # 10
                  "xid_storm.test.yml",  # 9
                  "ec2.test.yml")  # 6; the others at most 4 each


def _longest_first(p: Path) -> int:
    return LONGEST_SUITES.index(p.name) if p.name in LONGEST_SUITES else len(LONGEST_SUITES)


@pytest.mark.parametrize("path", sorted(suites(), key=_longest_first), ids=lambda p: p.name)
def test_promtool_unit_suite(path):
    r = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout
