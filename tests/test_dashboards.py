"""The dashboards (dashboards/*.py, rendered to dashboards/*.json): the committed JSON is what the code
renders, and every dashboard follows grafana/dashboard-linter's main rules plus this project's: a
templated datasource, `cluster` and `instance` matchers on every selector of every query, a unit, a
description that states the panel's series bound, `$__rate_interval` in every rate, no raw counter
outside rate/increase unless listed below. Every query is valid PromQL for the real promtool and
reads only metrics the exporter exports, rules/ records, or Prometheus itself writes."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from dashboards import build
from dashboards.lib import TAG, UIDS
from tests.helpers import HANG_GUARD_S, ROOT, promtool
from tests.rules_lint import PENDING_SERIES, PROMETHEUS_SERIES, metric_names, recorded
from tests.test_rules import _catalog

DS = {"type": "prometheus", "uid": "${datasource}"}
# Series Prometheus writes besides the per-target ones.
PROMETHEUS_OWN = PROMETHEUS_SERIES | {"ALERTS"}
# Counters shown as values on purpose (the lint's exceptions), and why.
RAW_COUNTERS = {
    "gpu_xid_errors_total": "XIDs since boot per GPU are the point of the XID tables",
    "gpu_ecc_errors_total": "lifetime (aggregate) uncorrected ECC counts are what an RMA asks for",
    "gpu_remapped_rows_total": "remapped rows are InfoROM entries: the count is the state",
    "lustre_client_import_evictions_total": "evictions seen per target, shown as counts in a table",
    "gpu_nvswitch_sxid_errors_total": "SXids since boot per switch and code are the point of the SXid tables",
}
SUBSTITUTIONS = {"$__rate_interval": "5m", "$__range_s": "3600", "$__range": "1h", "$cluster": ".*",
                 "$instance": ".+", "$gpu": ".*", "$job": ".*"}
_RATE = re.compile(r"\b(?:rate|irate|increase)\(\s*$")  # directly the argument of a rate

MODELS = build.dashboards()


def _concrete(expr: str) -> str:
    for k, v in SUBSTITUTIONS.items():
        expr = expr.replace(k, v)
    return expr


def _panels(d: dict) -> list[dict]:
    return [p for p in d["panels"] if p["type"] != "row"]


ALL_PANELS = [(name, p) for name, d in MODELS.items() for p in _panels(d)]


def _selectors(expr: str, name: str) -> list[str]:
    """The label selector after each occurrence of metric `name` ('' where it has none)."""
    out = []
    for m in re.finditer(rf'(?<![\w:"]){re.escape(name)}(?![\w:])', expr):
        rest = expr[m.end():]
        out.append(rest[:rest.index("}") + 1] if rest.startswith("{") else "")
    return out


def test_json_matches_code():
    """dashboards/*.json is exactly what the code renders (regenerate: python -m dashboards.build)."""
    on_disk = {p.stem for p in (ROOT / "dashboards").glob("*.json")}
    assert on_disk == set(MODELS), "dashboards/*.json and dashboards.build.BUILDERS list different files"
    for name, model in MODELS.items():
        text = (ROOT / "dashboards" / f"{name}.json").read_text()
        assert text == build.render(model), f"{name}.json is stale: run python -m exporter.tools.generate"
    assert build.main(["--check"]) == 0


def test_drift_check_fails_on_a_hand_edit(tmp_path, monkeypatch):
    """The check can fail: a committed file edited by hand is reported."""
    for name, model in MODELS.items():
        (tmp_path / f"{name}.json").write_text(build.render(model))
    monkeypatch.setattr(build, "OUT", tmp_path)
    assert build.main(["--check"]) == 0
    path = tmp_path / f"{next(iter(MODELS))}.json"
    path.write_text(path.read_text().replace('"title"', '"title" ', 1))
    assert build.main(["--check"]) == 1


def test_stable_uids_tags_and_links():
    uids = [d["uid"] for d in MODELS.values()]
    assert len(uids) == len(set(uids)) and set(uids) == set(UIDS.values())
    for d in MODELS.values():
        assert TAG in d["tags"]
        link = [x for x in d["links"] if x["type"] == "dashboards"]
        assert link and link[0]["tags"] == [TAG] and link[0]["includeVars"] and link[0]["keepTime"]
    # Every data link into another dashboard names one of ours.
    text = json.dumps(list(MODELS.values()))
    targets = set(re.findall(r"/d/([\w-]+)/", text))
    assert targets and targets <= set(UIDS.values())


def test_links_use_only_defined_variables():
    """${var} in a link is a variable of the dashboard or one of Grafana's own."""
    for d in MODELS.values():
        defined = {v["name"] for v in d["templating"]["list"]}
        used = set(re.findall(r"\$\{(\w+)", json.dumps(d)))
        assert used - {"__data", "__value", "__url_time_range"} <= defined, d["uid"]


def test_file_provider():
    """deploy/grafana/dashboards.yaml: a file provider Grafana accepts, read-only in the UI."""
    cfg = yaml.safe_load((ROOT / "deploy" / "grafana" / "dashboards.yaml").read_text())
    assert cfg["apiVersion"] == 1
    [provider] = cfg["providers"]
    assert provider["type"] == "file" and provider["allowUiUpdates"] is False
    assert provider["options"]["path"].startswith("/") and provider["folder"]
    assert provider["options"]["path"] in (ROOT / "docs" / "dashboards.md").read_text()


@pytest.mark.parametrize("name", MODELS)
def test_dashboard_model(name):
    d = MODELS[name]
    assert d["id"] is None and re.fullmatch(r"[a-z0-9-]{8,40}", d["uid"])
    assert d["schemaVersion"] >= 36 and not d["editable"]
    assert "__inputs" not in d and "__requires" not in d, "provisioning cannot resolve ${DS_...} inputs"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert [v["name"] for v in d["templating"]["list"] if v["type"] == "datasource"] == ["datasource"]
    assert variables["datasource"]["query"] == "prometheus"
    for var in ("cluster", "instance"):
        v = variables[var]
        assert v["type"] == "query" and v["datasource"] == DS and v["refresh"] == 2
    assert variables["cluster"]["includeAll"] and variables["cluster"]["allValue"] == ".*"
    inst = variables["instance"]
    if name == "gpu-health-node":  # one node; its GPUs are the multi-select
        assert not inst.get("multi") and not inst.get("includeAll")
        assert variables["gpu"]["multi"] and variables["gpu"]["includeAll"]
    else:
        assert inst["multi"] and inst["includeAll"] and inst["allValue"] == ".+"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("name,panel", ALL_PANELS, ids=[f"{n}:{p['title']}" for n, p in ALL_PANELS])
def test_panel_lint(name, panel):
    assert panel["title"] and panel.get("description"), "title and description"
    bound = re.search(r"Bound: ([^.]+)\.", panel["description"])
    assert bound, "the description states the panel's series bound"
    assert panel["datasource"] == DS, "panels use the templated datasource"
    assert panel["fieldConfig"]["defaults"].get("unit"), "every panel has a unit"
    if panel["type"] in ("stat", "gauge", "bargauge"):
        assert panel["fieldConfig"]["defaults"].get("thresholds"), "stats are coloured by thresholds"
    assert panel["targets"], "at least one query"
    topk = re.match(r"top (\d+)", bound.group(1))
    for t in panel["targets"]:
        assert t["datasource"] == DS
        expr = t["expr"]
        if topk:
            assert re.search(rf"\b(?:topk|bottomk)\({topk.group(1)},", expr), f"bound says top-k: {expr}"
        for window in re.findall(r"\b(?:rate|irate|increase)\([^\[]*\[([^\]]+)\]", expr):
            assert window == "$__rate_interval", expr
        for metric in metric_names(_concrete(expr)):
            for s in _selectors(expr, metric):
                assert 'cluster=~"$cluster"' in s and 'instance=~"$instance"' in s, \
                    f"{metric} without the cluster and instance matchers: {expr}"
            if metric.endswith("_total") and metric not in RAW_COUNTERS:
                for m in re.finditer(rf'(?<![\w:"]){metric}\b', expr):
                    assert _RATE.search(expr[:m.start()]), f"counter {metric} outside rate/increase: {expr}"


def test_lint_catches_a_selector_without_cluster():
    """The selector check can fail: a query filtering on instance only is caught."""
    expr = 'rate(x_total{instance=~"$instance"}[5m]) / y'
    assert _selectors(expr, "x_total") == ['{instance=~"$instance"}']
    assert _selectors("sum(y)", "y") == [""]


def _all_queries() -> list[str]:
    exprs = [t["expr"] for _, p in ALL_PANELS for t in p["targets"]]
    for d in MODELS.values():
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                exprs.append(re.fullmatch(r"label_values\((.*), \w+\)", v["query"]).group(1))
    return exprs


def test_every_query_is_valid_promql_on_existing_metrics(tmp_path):
    catalog, rec = _catalog(), recorded()
    exprs = _all_queries()
    missing = {name for e in exprs for name in metric_names(_concrete(e))
               if not (name in catalog or name in rec or name in PROMETHEUS_OWN or name in PENDING_SERIES)}
    assert not missing, f"dashboard queries metrics nobody exports or records: {missing}"
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query:{i}", "expr": _concrete(e)} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    r = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stdout + r.stderr


def test_workload_panels_join_on_gpu_workload_info(tmp_path):
    """The per-workload activity panels read gpu_workload_info, the workload source's series (issue
    26: one per GPU and workload holding it). Given it, each gives a workload's mean SM activity over
    its GPUs: a Slurm job on two GPUs, a pod on a third; a GPU nobody holds counts for nobody."""
    exprs = {p["title"]: t["expr"] for _, p in ALL_PANELS for t in p["targets"]
             if "gpu_workload_info" in t["expr"] and "gpu_sm_active" in t["expr"]}
    assert set(exprs) == {"SM activity per workload", "Least busy workloads"}
    common = 'cluster="c1", instance="n1", job="gpu-health-exporter"'
    series = [{"series": f'gpu_sm_active_seconds_total{{{common}, gpu="{g}", uuid="GPU-{g}"}}', "values": v}
              for g, v in (("0", "0+54x10"), ("1", "0+30x10"), ("2", "0+6x10"), ("3", "0+60x10"))]
    series += [{"series": f'gpu_workload_info{{{common}, gpu="{g}", uuid="GPU-{g}", {w}}}', "values": "1x10"}
               for g, w in (("0", 'hpc_job="77"'), ("1", 'hpc_job="77"'),
                            ("2", 'namespace="ml", pod="nb-1", container="jupyter"'))]
    expected = [{"labels": '{cluster="c1", hpc_job="77"}', "value": 0.7},
                {"labels": '{cluster="c1", namespace="ml", pod="nb-1"}', "value": 0.1}]
    suite = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [{"expr": _concrete(e), "eval_time": "10m", "exp_samples": expected}
                             for e in exprs.values()]}]}
    path = tmp_path / "workloads.test.yml"
    path.write_text(yaml.safe_dump(suite))
    r = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stdout + r.stderr
