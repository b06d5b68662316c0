"""What the docs count or list about rules, collectors and shipped files matches the tree.

Checked in README.md and docs/*.md (docs/metrics.md and docs/configuration.md are generated):
- a number of rule files, collectors, dashboards or alerts ("seven rule files", "56 alerts");
- a list of rule files or collectors (three or more names in backquotes, in a row): all of them;
- every repository path in backquotes (`deploy/slurm/gpu-health-check.sh`, `rules/*.yml`) exists;
- every table row has as many cells as its header.
A sentence that means a subset says so in words instead of a backquoted list.
"""

from __future__ import annotations

import re

import pytest
import yaml

from exporter import collectors
from tests.doc_blocks import ROOT, doc_files

NUMBERS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve "
                                      "thirteen fourteen fifteen".split())}
RULE_FILES = sorted(p.name for p in (ROOT / "rules").glob("*.yml"))
COLLECTORS = sorted(collectors.collector_classes())
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
ALERTS = [r for f in (ROOT / "rules").glob("*.yml") for g in yaml.safe_load(f.read_text())["groups"]
          for r in g["rules"] if "alert" in r]
COUNTS = {"rule files": len(RULE_FILES), "collectors": len(COLLECTORS), "dashboards": len(DASHBOARDS),
          "alerts": len(ALERTS)}
GENERATED = {"docs/metrics.md", "docs/configuration.md"}
TOP = ("rules/", "dashboards/", "deploy/", "docs/", "exporter/", "tests/", "bench/", ".ci/")
# written by a build (the wheel, the release), not in the tree
BUILT = ("exporter/_build.py", "exporter/shipped", "docs/runbooks.html")


def docs() -> list[tuple[str, str]]:
    out = []
    for p in doc_files():
        rel = str(p.relative_to(ROOT))
        if rel not in GENERATED:
            out.append((rel, p.read_text()))
    return out


def where(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


@pytest.mark.parametrize(("name", "text"), docs(), ids=[n for n, _ in docs()])
def test_counts_match_the_tree(name, text):
    for m in re.finditer(r"(?<![\w/.-])(\w+) (rule files|collectors|dashboards|alerts)\b", text, re.I):
        word, what = m.group(1).lower(), m.group(2).lower()
        n = int(word) if word.isdigit() and not word.startswith("0") else NUMBERS.get(word)
        if n is None or (what == "alerts" and n < 10):  # "two alerts" about one counter, not all
            continue
        at = f"{name}:{where(text, m.start())}"
        assert n == COUNTS[what], f"{at}: {m.group(0)!r}, the tree has {COUNTS[what]}"


@pytest.mark.parametrize(("name", "text"), docs(), ids=[n for n, _ in docs()])
def test_counts_of_files_in_paragraphs_about_the_rule_files(name, text):
    """ "the five files", "the other four" in a paragraph about rules/*.yml count the rule files."""
    at = 0
    for para in text.split("\n\n"):
        named = set(re.findall(r"\b[\w-]+\.yml\b", para)) & set(RULE_FILES)
        if re.search(r"rules/\*\.yml|\brule files?\b", para) or len(named) >= 2:
            for m in re.finditer(r"\b(?:the\s+other\s+(\w+)|(\w+)\s+files)\b", para, re.I):
                other, files = m.group(1), m.group(2)
                word = (other or files).lower()
                n = NUMBERS.get(word)
                if n is None:
                    continue
                want = len(RULE_FILES) - 1 if other else len(RULE_FILES)
                where_ = f"{name}:{where(text, at + m.start())}"
                assert n == want, f"{where_}: {m.group(0)!r}; rules/ has {len(RULE_FILES)}"
        at += len(para) + 2


@pytest.mark.parametrize(("name", "text"), docs(), ids=[n for n, _ in docs()])
def test_lists_of_rule_files_and_collectors_are_whole(name, text):
    for m in re.finditer(r"`[\w.-]+`(?:,?\s+(?:and\s+|or\s+)?`[\w.-]+`|,\s*`[\w.-]+`)+", text):
        items = re.findall(r"`([\w.-]+)`", m.group(0))
        for whole in (RULE_FILES, COLLECTORS):
            if len(items) >= 3 and set(items) <= set(whole):
                at = f"{name}:{where(text, m.start())}"
                assert sorted(set(items)) == whole, f"{at}: {items}; the tree: {whole}"


@pytest.mark.parametrize(("name", "text"), docs(), ids=[n for n, _ in docs()])
def test_repository_paths_the_docs_name_exist(name, text):
    for m in re.finditer(r"`([\w.][\w./*-]*)`", text):
        path = m.group(1).rstrip(".")
        if not path.startswith(TOP) or path.startswith(BUILT):
            continue
        hits = list(ROOT.glob(path)) if "*" in path else [ROOT / path] if (ROOT / path).exists() else []
        assert hits, f"{name}:{where(text, m.start())}: `{path}` is not in the tree"


def cells(row: str) -> int:
    """Cells of a markdown table row: `|` outside code spans and not escaped."""
    n, code, prev = 0, False, ""
    for ch in row.strip().strip("|"):
        if ch == "`":
            code = not code
        elif ch == "|" and not code and prev != "\\":
            n += 1
        prev = ch
    return n + 1


@pytest.mark.parametrize(("name", "text"), docs(), ids=[n for n, _ in docs()])
def test_every_table_row_has_its_headers_cells(name, text):
    lines = text.splitlines()
    for i, line in enumerate(lines[1:], 1):
        if re.match(r"^\|(\s*:?-+:?\s*\|)+\s*$", line):  # the separator under a header
            width = cells(lines[i - 1])
            j = i + 1
            while j < len(lines) and lines[j].startswith("|"):
                got = cells(lines[j])
                assert got == width, f"{name}:{j + 1}: {got} cells under {width} headers"
                j += 1
