"""CI is deterministic: Hypothesis draws the same examples on every run unless
the random search is asked for (HYPOTHESIS_PROFILE=search; tests/conftest.py), and .ci/run runs
the derandomized profile."""

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import ROOT

DRAWN: list[int] = []


def test_the_suite_profile_is_derandomized():
    if os.environ.get("HYPOTHESIS_PROFILE", "ci") != "ci":
        return  # a random search was asked for
    s = settings.default
    assert s.derandomize and s.database is None and s.deadline is None


@settings(max_examples=5)
@given(st.integers())
def _draw(n):
    DRAWN.append(n)


def test_two_runs_draw_the_same_examples():
    if os.environ.get("HYPOTHESIS_PROFILE", "ci") != "ci":
        return
    _draw()
    first = list(DRAWN)
    DRAWN.clear()
    _draw()
    assert DRAWN == first and len(first) == 5


def test_ci_run_uses_the_derandomized_profile():
    assert 'export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"' in (ROOT / ".ci/run").read_text()
