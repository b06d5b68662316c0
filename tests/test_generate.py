"""The one regeneration command (exporter/tools/generate.py): every generator parses its arguments (`--help`
writes nothing), `--check` names what is stale and writes nothing, and the doc lists and counts
tests/test_doc_claims.py checks are written from the tree."""

from __future__ import annotations

import pytest

from exporter.tools import deploygen, docs, generate

NAMES = {"collectors": ["efa", "gpu", "xid"], "rule files": ["a.yml", "b.yml", "c.yml", "d.yml"]}
COUNTS = {"collectors": 3, "rule files": 4, "dashboards": 2, "alerts": 12}


@pytest.mark.parametrize("main", [docs.main, deploygen.main, generate.main])
def test_help_writes_nothing(main, capsys):
    before = {p: p.stat().st_mtime_ns for p in docs.expected()}
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "usage:" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in before} == before


def test_check_names_a_stale_file_and_writes_nothing(monkeypatch, tmp_path, capsys):
    stale = tmp_path / "docs" / "stale.md"
    stale.parent.mkdir()
    stale.write_text("old\n")
    monkeypatch.setattr(generate, "ROOT", tmp_path)
    monkeypatch.setattr(generate, "GENERATORS", {"toy": lambda: {stale: "new\n", tmp_path / "gone": None}})
    assert generate.main(["--check"]) == 1
    assert capsys.readouterr().out == "stale (toy): docs/stale.md\n"
    assert stale.read_text() == "old\n"
    assert generate.main([]) == 0 and stale.read_text() == "new\n"
    assert generate.main(["--check"]) == 0


def test_the_tree_is_current_for_the_cheap_generators():
    assert generate.main(["--check", "--only", "docs", "--only", "doc-lists", "--only", "deploy"]) == 0


@pytest.mark.parametrize("text, want", [
    ("One collector (`efa`, `gpu`) fails.", "One collector (`efa`, `gpu`) fails."),  # two: a subset, said so
    ("Any of `efa`, `gpu` or `nvswitch`.", "Any of `efa`, `gpu` or `nvswitch`."),  # not a subset of the tree
    ("Each of `a.yml`, `b.yml` and `c.yml`.", "Each of `a.yml`, `b.yml`, `c.yml` and `d.yml`."),
    ("From `efa`, `gpu`, `xid`.", "From `efa`, `gpu`, `xid`."),
    ("the seven rule files", "the four rule files"),
    ("Eight collectors run.", "Three collectors run."),
    ("5 dashboards", "2 dashboards"),
    ("two alerts on one counter", "two alerts on one counter"),  # a few alerts: not all of them
    ("the 56 alerts", "the 12 alerts"),
])
def test_doc_lists_and_counts_are_written_from_the_tree(text, want):
    assert generate.whole_lists(text, NAMES, COUNTS) == want


@pytest.mark.parametrize("text, want", [
    ("970 default series against 2,690 series with every detail level",
     "1,021 default series against 2,943 series with every detail level"),
    ("1,021 default series", "1,021 default series"),
    ("~900 default series", "~900 default series"),  # an approximation is left as it is: say it exactly
    ("32 series by default", "32 series by default"),  # one metric's series, not the node's
])
def test_the_simulated_nodes_series_counts_are_written_from_the_golden_files(text, want):
    series = {"default series": 1021, "series with every detail level": 2943}
    assert generate.series_counts(text, series) == want
