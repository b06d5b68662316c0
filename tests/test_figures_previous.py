"""bench/figures.py prints each new figure beside the one the table it replaces gave, and writes
only the new figures into docs/performance.md: the previous values are read back from the table
between the figures markers by matching each old cell against its row's template. Only the parsing
and formatting run here, no bench."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def figures():
    spec = importlib.util.spec_from_file_location("bench_figures", ROOT / "bench" / "figures.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_figures"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _row(figures, name):
    return next(r for r in figures.ROWS if r.name == name)


def _doc(figures, lines: list[str], intro: str = "Measured at 1a2b3c4 on 2026-11-27.") -> str:
    return "\n".join(["# Performance", "", figures.BEGIN, "", intro, "",
                      "| what | figure | command |", "|---|---|---|", *lines, "", figures.END, "", "more"])


def _line(figures, name: str, cell: str) -> str:
    row = _row(figures, name)
    return f"| {row.what} | {cell} | `{' '.join(row.command)}` |"


def test_previous_medians_are_read_from_each_rows_cell(figures):
    doc = _doc(figures, [
        _line(figures, "efa", "ours 2.47 (2.37–3.07) ms vs node_exporter 4.80 (4.63–6.20) ms: "
                              "**0.51 (0.49–0.51)×**; 2.80 (2.60–3) µs per counter file in process "
                              "(11 of 36 files per device)"),
        _line(figures, "lustre", "1.53 ms at 8 OSTs, 13.5 (11.4–14.0) ms at 256: **-1.5 (-2–3) µs per OST**"),
        _line(figures, "shutdown", "failed: python3 bench/bench_shutdown.py exited 2: boom"),
    ])
    prev = figures.previous_figures(doc)
    assert prev["efa"] == {"ours": "2.47", "ne": "4.80", "ratio": "0.51", "per_file": "2.80"}
    assert prev["lustre"] == {"at8": "1.53", "at256": "13.5", "per_ost": "-1.5"}
    assert "shutdown" not in prev  # a row that failed last time has no previous figures
    assert "whole" not in prev  # nor one the table does not have
    assert figures.previous_note(doc) == "at 1a2b3c4, 2026-11-27"


def test_a_cell_whose_wording_changed_gives_no_previous_figures(figures):
    doc = _doc(figures, [_line(figures, "efa", "ours 2.47 ms, theirs 4.80 ms")])
    assert figures.previous_figures(doc) == {}
    assert figures.previous_figures("no table here") == {}


def test_a_new_cell_shows_the_previous_figure_and_can_be_read_back(figures):
    """The printed cell with "[was X]" still matches its template (its median, not the old one)."""
    row = _row(figures, "gpu")
    was = {"ours": "4.99", "cpu": "2.35", "naive": "77.1"}
    new = {"ours": [3.1, 3.0, 3.4], "cpu": [3.9, 3.8, 4.1], "naive": [77.0, 77.2, 76.9]}
    cell = row.cell(lambda k: figures.with_previous(figures.spread(new[k]), was.get(k)))
    assert cell == ("GPU collector 3.10 (3–3.40) [was 4.99] ms (3.90 (3.80–4.10) [was 2.35] ms CPU) "
                    "vs naive reader 77 (76.9–77.2) [was 77.1] ms")
    again = figures.previous_figures(_doc(figures, [_line(figures, "gpu", cell)]))
    assert again == {"gpu": {"ours": "3.10", "cpu": "3.90", "naive": "77"}}


def test_n_a_figures_are_not_carried_forward(figures):
    doc = _doc(figures, [_line(figures, "render", "937 series: fast renderer 0.13 (0.13–0.14) ms vs "
                                                  "prometheus_client 10.3 ms; the families (collection + "
                                                  "process_*) n/a ms")])
    assert figures.previous_figures(doc) == {"render": {"series": "937", "fast": "0.13", "client": "10.3"}}
    assert figures.with_previous("0.12", None) == "0.12"


def test_every_default_row_of_the_shipped_table_is_read(figures):
    """docs/performance.md's table is what the next --write compares with: each of its default
    rows must match its row's template (a changed template without a regenerated table would lose
    that row's previous figures)."""
    prev = figures.previous_figures((ROOT / "docs" / "performance.md").read_text())
    assert {r.name for r in figures.ROWS if not r.long} <= set(prev)


def test_the_shipped_table_states_the_figures_of_now(figures):
    """History is in git: the table carries no previous figures and no commit it was measured at."""
    import re
    doc = (ROOT / "docs" / "performance.md").read_text()
    table = doc[doc.index(figures.BEGIN):doc.index(figures.END)]
    assert "[was " not in table
    assert not re.search(r"\bat [0-9a-f]{7,40}\b", table)
