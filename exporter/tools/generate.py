"""Regenerate every generated file of the checkout, or say which are stale (a checkout tool: it
refuses to run from an installed package, like exporter.tools.docs).

    .venv/bin/python -m exporter.tools.generate            # rewrite what is stale, name each file written
    .venv/bin/python -m exporter.tools.generate --check    # write nothing; name each stale file, exit 1 if so
    .venv/bin/python -m exporter.tools.generate --only docs --only golden   # some generators only

One command for every file made from another source (CI runs `--check`: .ci/run):

- job-rules: rules/job.yml (exporter.tools.job_rules' default settings) and its promtool suites
  tests/rules/job.test.yml and job_day.test.yml (tests/job_cases.py);
- docs: docs/metrics.md, docs/configuration.md, from the metric catalog and the config schema
  (exporter.tools.docs);
- dashboards: dashboards/*.json and the panel reference in docs/dashboards.md, from
  dashboards/*.py (dashboards.build);
- golden: tests/fixtures/golden/*.prom, a pinned simulated node's /metrics (tests/golden.py);
- xid-catalog: docs/xid.md's default-tier and catalog tables, from the XID catalog and the
  default policy (exporter.tools.xid_catalog);
- doc-lists: the lists and counts of collectors, rule files, dashboards and alerts in README.md
  and docs/*.md, from the tree (the claims tests/test_doc_claims.py checks), and the simulated
  p5.48xlarge's "N default series" and "N series with every detail level", from the golden files;
- deploy: the PrometheusRule, dashboard and runbook components under
  deploy/kubernetes/components/, from rules/, dashboards/ and docs/runbooks.md (exporter.tools.deploygen);
- podresources: exporter/workload/podresources/api_pb2.py, from api.proto (grpc_tools.protoc).

Not here, because they are measurements rather than functions of the tree: docs/performance.md's
tables (bench/figures.py) and the alert matrix's table in docs/alerts.md (UPDATE_DOCS=1 with
tests/test_alert_matrix.py, real Prometheus and Alertmanager).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from exporter import share

ROOT = Path(__file__).resolve().parents[2]

# A generator: every path it owns -> the text it must hold (None: the path must not exist).
Generator = Callable[[], "dict[Path, str | None]"]


def _docs() -> dict[Path, str | None]:
    from exporter import collectors
    from exporter.tools import docs

    collectors.discover()
    return dict(docs.expected())


def _dashboards() -> dict[Path, str | None]:
    from dashboards import build

    models = build.dashboards()
    out: dict[Path, str | None] = {build.DOC: build.document(models, build.DOC.read_text())}
    out.update({build.OUT / f"{name}.json": build.render(m) for name, m in models.items()})
    out.update({p: None for p in build.OUT.glob("*.json") if p.stem not in models})
    return out


def _deploy() -> dict[Path, str | None]:
    from exporter.tools import deploygen

    want: dict[Path, str | None] = dict(deploygen.expected())
    for d in (deploygen.DASHBOARDS_OUT, deploygen.RUNBOOKS_OUT):
        want.update({p: None for p in d.glob("*.yaml") if p not in want})
    return want


# -- doc-lists: what tests/test_doc_claims.py checks, written from the tree ------------------------
NUMBER_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
                "fifteen").split()
LIST = re.compile(r"`[\w.-]+`(?:,?\s+(?:and\s+|or\s+)?`[\w.-]+`|,\s*`[\w.-]+`)+")
COUNT = re.compile(r"(?<![\w/.-])(\w+) (rule files|collectors|dashboards|alerts)\b", re.I)
GENERATED_DOCS = {"docs/metrics.md", "docs/configuration.md"}
# "1,021 default series", "2,943 series with every detail level": the simulated p5.48xlarge's, as
# its golden /metrics has them (tests/fixtures/golden/, written by the golden generator first).
SERIES = re.compile(r"(?<![\w.,~])\d{1,3}(?:,\d{3})*(?= (default series|series with every detail level)\b)")
SERIES_FILES = {"default series": "p5.48xlarge.prom",
                "series with every detail level": "p5.48xlarge-all.prom"}


def tree_names() -> dict[str, list[str]]:
    """The lists the docs name whole: collectors, rule files."""
    from exporter import collectors

    return {"collectors": sorted(collectors.collector_classes()),
            "rule files": sorted(p.name for p in (ROOT / "rules").glob("*.yml"))}


def tree_counts() -> dict[str, int]:
    import yaml

    alerts = [r for f in (ROOT / "rules").glob("*.yml") for g in yaml.safe_load(f.read_text())["groups"]
              for r in g["rules"] if "alert" in r]
    names = tree_names()
    return {"rule files": len(names["rule files"]), "collectors": len(names["collectors"]),
            "dashboards": len(list((ROOT / "dashboards").glob("*.json"))), "alerts": len(alerts)}


def whole_lists(text: str, names: dict[str, list[str]], counts: dict[str, int]) -> str:
    """`text` with every list of three or more collectors (or rule files) made the whole list, in
    its own style ("`a`, `b` and `c`"), and every "<number> collectors" (rule files, dashboards,
    ten or more alerts) the tree's number, in words where it was in words."""
    def one_list(m: re.Match[str]) -> str:
        items = re.findall(r"`([\w.-]+)`", m.group(0))
        for whole in names.values():
            if len(items) >= 3 and set(items) <= set(whole) and sorted(set(items)) != whole:
                last = re.search(r"\s+(and|or)\s+`[\w.-]+`$", m.group(0))
                quoted = [f"`{n}`" for n in whole]
                if last:
                    return ", ".join(quoted[:-1]) + f" {last.group(1)} {quoted[-1]}"
                return ", ".join(quoted)
        return m.group(0)

    def one_count(m: re.Match[str]) -> str:
        word, what = m.group(1), m.group(2)
        low = word.lower()
        digits = word.isdigit() and not word.startswith("0")
        n = int(word) if digits else NUMBER_WORDS.index(low) if low in NUMBER_WORDS else None
        want = counts[what.lower()]
        if n is None or (what.lower() == "alerts" and n < 10) or n == want:
            return m.group(0)
        if digits or want >= len(NUMBER_WORDS):
            new = str(want)
        else:
            new = NUMBER_WORDS[want].capitalize() if word[0].isupper() else NUMBER_WORDS[want]
        return f"{new} {what}"

    return COUNT.sub(one_count, LIST.sub(one_list, text))


def golden_series() -> dict[str, int]:
    """The series each golden file of the simulated p5.48xlarge holds, by the phrase docs use."""
    from tests.golden import GOLDEN

    return {what: sum(1 for line in (GOLDEN / f).read_text().splitlines() if line and line[0] != "#")
            for what, f in SERIES_FILES.items()}


def series_counts(text: str, series: dict[str, int]) -> str:
    """`text` with every "<number> default series" (or "series with every detail level") the
    golden file's number, written with thousands separators."""
    return SERIES.sub(lambda m: f"{series[m.group(1)]:,}", text)


def _doc_lists() -> dict[Path, str | None]:
    names, counts, series = tree_names(), tree_counts(), golden_series()
    out: dict[Path, str | None] = {}
    for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if str(p.relative_to(ROOT)) not in GENERATED_DOCS:
            out[p] = series_counts(whole_lists(p.read_text(), names, counts), series)
    return out


def _podresources() -> dict[Path, str | None]:
    """The message classes of the kubelet's pod-resources API (the client speaks gRPC's framing
    itself: no grpc stub is generated)."""
    rel = "exporter/workload/podresources/api.proto"
    with tempfile.TemporaryDirectory(prefix="protoc-") as out:
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(ROOT), f"--python_out={out}",
                        rel], check=True, cwd=ROOT)
        made = Path(out) / Path(rel).parent / "api_pb2.py"
        return {ROOT / Path(rel).parent / "api_pb2.py": made.read_text()}


def _xid_catalog() -> dict[Path, str | None]:
    from exporter.tools import xid_catalog

    return {xid_catalog.DOC: xid_catalog.render(xid_catalog.DOC.read_text())}


def _golden() -> dict[Path, str | None]:
    from tests import golden

    return dict(golden.expected())


# In order, each before what reads its output: the dashboards' JSON files before the counts of
# dashboards (doc-lists), docs/runbooks.md's lists before the runbooks' ConfigMap (deploy).
def _job_rules() -> dict[Path, str | None]:
    from exporter.tools import job_rules
    from tests import job_cases

    return {ROOT / "rules" / "job.yml": job_rules.render(),
            job_cases.SUITE: job_cases.text(False), job_cases.DAY_SUITE: job_cases.text(True)}


GENERATORS: dict[str, Generator] = {
    "job-rules": _job_rules,  # before deploy and doc-lists, which read rules/
    "docs": _docs,
    "dashboards": _dashboards,
    "golden": _golden,  # before doc-lists, which counts its series
    "xid-catalog": _xid_catalog,  # before doc-lists, which reads docs/xid.md too
    "doc-lists": _doc_lists,
    "deploy": _deploy,
    "podresources": _podresources,
}

def stale(want: dict[Path, str | None]) -> list[Path]:
    out = []
    for p, text in want.items():
        if text is None:
            if p.exists():
                out.append(p)
        elif not p.exists() or p.read_text() != text:
            out.append(p)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m exporter.tools.generate", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true",
                   help="write nothing; name each stale file and exit 1 if any")
    p.add_argument("--only", action="append", choices=sorted(GENERATORS), metavar="NAME",
                   help=f"run this generator only (repeatable): {', '.join(GENERATORS)}")
    args = p.parse_args(argv)
    if not share.in_checkout():  # installed: there is no checkout to regenerate
        print(share.not_in_checkout("python -m exporter.tools.generate"), file=sys.stderr)
        return 2
    found = 0
    for name, gen in GENERATORS.items():
        if args.only and name not in args.only:
            continue
        want = gen()
        for path in stale(want):
            found += 1
            rel = path.relative_to(ROOT)
            if args.check:
                print(f"stale ({name}): {rel}")
                continue
            text = want[path]
            if text is None:
                path.unlink()
                print(f"removed ({name}): {rel}")
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                print(f"wrote ({name}): {rel}")
    if args.check and found:
        print(f"{found} generated file(s) stale: run .venv/bin/python -m exporter.tools.generate, "
              "review the diff", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
