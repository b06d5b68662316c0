"""The promtool cases written for a defect fail on the rules as they were before its fix (the
fixtures under tests/fixtures/rules_before_*_fixes), with the real promtool. Its tests are
independent (`spread`: under xdist each goes to whichever worker is free, tests/conftest.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import HANG_GUARD_S, ROOT, promtool
from tests.rules_lint import SUITES_DIR, load

pytestmark = pytest.mark.spread


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=HANG_GUARD_S)


BEFORE = ROOT / "tests" / "fixtures" / "rules_before_fleet_fixes"


def _failing_groups(suite: Path, rules_dir: Path, tmp_path: Path, only: list[str]) -> set[str]:
    """Names of the suite's test groups among `only` that fail when its rule files come from
    `rules_dir` (the other groups are left out: they would only cost promtool's time)."""
    (tmp_path / "rules").mkdir(exist_ok=True)
    for f in rules_dir.glob("*.yml"):
        shutil.copy(f, tmp_path / "rules" / f.name)
    (tmp_path / "tests" / "rules").mkdir(parents=True, exist_ok=True)
    data = load(suite)
    data["tests"] = [g for g in data["tests"] if g["name"] in only]
    (tmp_path / "tests" / "rules" / suite.name).write_text(yaml.safe_dump(data))
    r = _run("test", "rules", str(tmp_path / "tests" / "rules" / suite.name))
    return set(re.findall(r"^\s+name: (.*),$", r.stdout + r.stderr, re.M))


@pytest.mark.parametrize("suite", ["fleet.test.yml", "gpu_ecc_fleet.test.yml"])
def test_regression_cases_of_the_fleet_suites_fail_on_the_rules_before_their_fix(suite, tmp_path):
    """Each promtool case marked "(regression)" fails on the rules as they were before its fix
    (tests/fixtures/rules_before_fleet_fixes, runbook base moved to today's so only behaviour differs);
    test_promtool_unit_suite runs them on rules/."""
    path = SUITES_DIR / suite
    regressions = [g["name"] for g in load(path)["tests"] if "(regression)" in g["name"]]
    assert regressions
    failing = _failing_groups(path, BEFORE, tmp_path, regressions)
    assert set(regressions) <= failing, f"pass on the old rules: {set(regressions) - failing}"


BEFORE_RESTARTS = ROOT / "tests" / "fixtures" / "rules_before_restart_fixes"
RESTARTS = SUITES_DIR / "restarts_and_acks.test.yml"


def _run_one_group(suite: dict, group: dict, rules_dir: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """promtool on a suite of `group` alone (an evaluation error names no group), rules from `rules_dir`."""
    (tmp_path / "rules").mkdir(parents=True, exist_ok=True)
    for f in rules_dir.glob("*.yml"):
        shutil.copy(f, tmp_path / "rules" / f.name)
    (tmp_path / "tests" / "rules").mkdir(parents=True, exist_ok=True)
    path = tmp_path / "tests" / "rules" / "one.test.yml"
    path.write_text(yaml.safe_dump({**suite, "tests": [group]}))
    return _run("test", "rules", str(path))


def test_restart_and_ack_regressions_fail_on_the_rules_before_their_fix(tmp_path):
    """Each promtool case of restarts_and_acks.test.yml marked "(regression)" fails on the rules as
    they were (tests/fixtures/rules_before_restart_fixes) and passes on rules/, as do the "(guard)" cases
    (what the fixes must keep; test_promtool_unit_suite runs the whole suite on rules/). The case of
    an exporter answering again fails there by an evaluation error: one label set from both arms of
    an `or`."""
    suite = load(RESTARTS)
    regressions = [g for g in suite["tests"] if "(regression)" in g["name"]]
    assert len(regressions) == 7, [g["name"] for g in regressions]
    answering = [g for g in regressions if g["name"].startswith("an exporter answering again")]
    assert len(answering) == 1
    for k, group in enumerate(regressions):
        old = _run_one_group(suite, group, BEFORE_RESTARTS, tmp_path / f"old{k}")
        assert old.returncode != 0, f"passes on the old rules: {group['name']}"
        if group is answering[0]:
            assert "same labelset after applying alert labels" in old.stdout + old.stderr
