"""The figures docs/design.md states in words agree with what measures them: the render cost with
the figures table of docs/performance.md (written by `python bench/figures.py --write`), the thread
count with that table and with the bound tests/test_threads.py holds the exporter to. (The series
counts in design.md are written by `python -m exporter.tools.generate` and checked for drift by
`--check`.) A figure that moves past what the words say fails here, naming the doc to change."""

from __future__ import annotations

import re

from tests.helpers import ROOT

DESIGN = (ROOT / "docs" / "design.md").read_text()
PERFORMANCE = (ROOT / "docs" / "performance.md").read_text()


def _row(start: str) -> str:
    rows = [line for line in PERFORMANCE.splitlines() if line.startswith(f"| {start}")]
    assert len(rows) == 1, f"docs/performance.md: one table row starting {start!r}"
    return rows[0]


def _ms(row: str, what: str) -> float:
    m = re.search(rf"{re.escape(what)} ([0-9.]+) \(", row)
    assert m, f"docs/performance.md: no median for {what!r} in {row[:80]}..."
    return float(m.group(1))


def test_design_states_the_render_cost_the_table_measures():
    row = _row("Rendering /metrics")
    fast, client = _ms(row, "fast renderer"), _ms(row, "prometheus_client")
    # The host's speed drifts by up to half between runs, so the words state the ratio, which holds.
    words = " ".join(DESIGN.split())
    assert "a fraction of a millisecond" in words and "about a hundredth of what prometheus_client" in words
    assert fast < 1, f"the fast renderer takes {fast} ms: docs/design.md says a fraction of one"
    assert 50 <= client / fast <= 200, (
        f"prometheus_client's renderer takes {client / fast:.0f} times the fast one: docs/design.md says 100")


def test_design_states_the_thread_count_the_table_measures_and_the_test_bounds():
    m = re.search(r"The served simulated p5\.48xlarge runs (\d+) to (\d+) threads", DESIGN)
    assert m, "docs/design.md no longer gives the served exporter's thread range"
    low, high = int(m.group(1)), int(m.group(2))
    threads = re.search(r"; (\d+) \((\d+)–(\d+)\) threads \|", _row("Whole scrape"))
    assert threads, "docs/performance.md's whole-scrape row gives no thread count"
    median, least, most = map(int, threads.groups())
    assert low <= least <= median <= most <= high, (low, high, threads.groups())
    bound = re.search(r"def test_the_simulated_p5_runs_at_most_(\d+)_threads",
                      (ROOT / "tests" / "test_threads.py").read_text())
    assert bound and int(bound.group(1)) == high, "docs/design.md's bound is not tests/test_threads.py's"
