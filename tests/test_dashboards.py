"""dashboards/gpu-health.json: valid Grafana dashboard JSON following grafana/dashboard-linter's main
rules, whose every query is valid PromQL (checked by the real promtool) reading only metrics the
exporter exports or the rules in rules/ record."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from tests.helpers import ROOT, promtool
from tests.rules_lint import PROMETHEUS_SERIES, metric_names, recorded
from tests.test_rules import _catalog

DASHBOARD = ROOT / "dashboards" / "gpu-health.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
# Counters shown as values on purpose (lint exception): XIDs since boot are the point of that table.
RAW_COUNTERS = {"gpu_xid_errors_total"}


def _load() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(d: dict) -> list[dict]:
    return [p for p in d["panels"] if p["type"] != "row"]


def _targets(d: dict) -> list[str]:
    return [t["expr"] for p in _panels(d) for t in p["targets"]]


def _concrete(expr: str) -> str:
    return (expr.replace("$__rate_interval", "5m").replace("$instance", ".*").replace("$cluster", ".*"))


def test_dashboard_model():
    d = _load()
    assert d["id"] is None and re.fullmatch(r"[a-z0-9-]{8,40}", d["uid"])
    assert d["schemaVersion"] >= 36 and not d["editable"]
    assert "__inputs" not in d and "__requires" not in d, "provisioning cannot resolve ${DS_...} inputs"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert [v["name"] for v in d["templating"]["list"] if v["type"] == "datasource"] == ["datasource"]
    inst = variables["instance"]
    assert inst["multi"] and inst["includeAll"] and inst["allValue"] == ".+" and inst["refresh"] == 2
    assert inst["datasource"] == DS
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("panel", _panels(_load()), ids=lambda p: p["title"])
def test_panel_lint(panel):
    assert panel["title"] and panel.get("description"), "title and description"
    assert panel["datasource"] == DS, "panels use the templated datasource"
    assert panel["fieldConfig"]["defaults"].get("unit"), "every panel has a unit"
    assert panel["targets"], "at least one query"
    for t in panel["targets"]:
        assert t["datasource"] == DS
        expr = t["expr"]
        assert 'instance=~"$instance"' in expr or 'cluster=~"$cluster"' in expr, expr
        for window in re.findall(r"\b(?:rate|irate|increase)\([^\[]*\[([^\]]+)\]", expr):
            assert window == "$__rate_interval", expr
        for name in metric_names(_concrete(expr)):
            if name.endswith("_total") and name not in RAW_COUNTERS:
                assert re.search(rf"\b(?:rate|irate|increase)\(\s*{name}\b", expr), \
                    f"counter {name} outside rate/increase: {expr}"


def test_every_query_is_valid_promql_on_existing_metrics(tmp_path):
    d = _load()
    catalog, rec = _catalog(), recorded()
    exprs = _targets(d) + [_concrete(v["definition"]).removeprefix("label_values(").rsplit(",", 1)[0]
                           for v in d["templating"]["list"] if v["type"] == "query"]
    missing = set()
    for expr in exprs:
        for name in metric_names(_concrete(expr)):
            if not (name in catalog or name in rec or name in PROMETHEUS_SERIES):
                missing.add(name)
    assert not missing, f"dashboard queries metrics nobody exports or records: {missing}"
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query:{i}", "expr": _concrete(e)} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    r = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
