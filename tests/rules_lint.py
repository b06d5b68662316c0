"""Helpers for tests/test_rules*.py: load the rule files and the promtool suites, and pull the metric
names out of PromQL expressions (a small lexer, enough for the expressions in rules/)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.helpers import ROOT

RULES_DIR = ROOT / "rules"


def copy_rules_at_global_interval(dst: Path) -> None:
    """rules/ as shipped into `dst`, less each group's `interval:`: a live test's Prometheus then
    evaluates every group at its own (seconds-long) global interval, the pace of its scrape."""
    dst.mkdir(parents=True)
    for f in sorted(RULES_DIR.glob("*.yml")):
        doc = yaml.safe_load(f.read_text())
        for g in doc["groups"]:
            g.pop("interval", None)
        (dst / f.name).write_text(yaml.safe_dump(doc, sort_keys=False))
SUITES_DIR = ROOT / "tests" / "rules"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
ALERTS_MD = ROOT / "docs" / "alerts.md"

# Series Prometheus itself writes (for every target; ALERTS for every active alert); not in the
# exporter's catalog.
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "ALERTS"}
# Series kube-state-metrics exports, which rules/job.yml reads to map pods to their training job
# (docs/alerts.md, "Job health"); absent where it does not run.
KUBE_STATE_METRICS_SERIES = {"kube_pod_labels", "kube_pod_owner"}
# Series another issue's branch adds to the catalog, which rules and dashboards may already read
# (they work once it exists, and read nothing until then). Drop an entry once its branch is merged.
PENDING_SERIES: dict[str, str] = {
    # recorded by rules/nccl.yml (issue 44); TrainingJobStalled is quiet for a job that has it
    "training_job:nccl_ras_answering": "issue 44",
}

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
             "offset", "bool", "inf", "nan"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def rule_files() -> list[Path]:
    return sorted(RULES_DIR.glob("*.yml"))


def suites() -> list[Path]:
    return sorted(SUITES_DIR.glob("*.test.yml"))


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def all_rules() -> list[tuple[Path, str, dict]]:
    """(file, group name, rule) for every rule in rules/."""
    return [(f, g["name"], r) for f in rule_files() for g in load(f)["groups"] for r in g["rules"]]


def alerts() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for _, _, r in all_rules():
        if "alert" in r:
            assert r["alert"] not in out, f"alert {r['alert']} defined twice"
            out[r["alert"]] = r
    return out


def recorded() -> set[str]:
    return {r["record"] for _, _, r in all_rules() if "record" in r}


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers left once strings, label matchers, range and
    offset durations, grouping label lists, function calls, keywords and numbers are removed."""
    s = _STRING.sub('""', expr)
    s = _MATCHERS.sub(" ", s)
    s = _RANGE.sub(" ", s)
    s = _LABEL_LIST.sub(" ", s)
    s = re.sub(r"\boffset\s+\d+[smhdwy]\b", " ", s)
    names = set()
    for m in _IDENT.finditer(s):
        word = m.group(0)
        rest = s[m.end():].lstrip()
        if rest.startswith("("):  # a function call (or an aggregation)
            continue
        if word.lower() in _KEYWORDS:
            continue
        if m.start() > 0 and (s[m.start() - 1].isdigit() or s[m.start() - 1] == "."):
            continue  # the exponent or unit part of a number such as 1e6
        names.add(word)
    return names


def github_anchors(markdown: str) -> set[str]:
    """Anchors GitHub generates for the headings of a markdown document."""
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            out.add(text.replace(" ", "-"))
    return out


def suite_cases() -> dict[str, list[tuple[str, str, list]]]:
    """alertname -> [(suite file name, test group name, exp_alerts)] over every suite."""
    out: dict[str, list] = {}
    for path in suites():
        for group in load(path)["tests"]:
            for case in group.get("alert_rule_test") or []:
                out.setdefault(case["alertname"], []).append(
                    (path.name, group.get("name", ""), case.get("exp_alerts") or []))
    return out
