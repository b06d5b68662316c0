"""The alert rules in rules/: valid for the real promtool, covered by promtool unit tests, written to
the project's conventions, and consistent with the exporter's metric catalog and the docs."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from exporter import collectors
from exporter.catalog import all_specs
from exporter.rules import DEFAULT_RUNBOOK_BASE
from tests.helpers import HANG_GUARD_S, promtool
from tests.rules_lint import (
    ALERTS_MD,
    KUBE_STATE_METRICS_SERIES,
    PENDING_SERIES,
    PROMETHEUS_SERIES,
    RULES_DIR,
    RUNBOOKS,
    SUITES_DIR,
    alerts,
    all_rules,
    github_anchors,
    load,
    metric_names,
    recorded,
    rule_files,
    suite_cases,
    suites,
)

SEVERITIES = {"critical", "warning", "info"}


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=HANG_GUARD_S)


def test_there_are_rules_and_suites():
    assert {p.name for p in rule_files()} == {"gpu.yml", "xid.yml", "efa.yml", "fsx.yml", "exporter.yml",
                                              "fabric.yml", "ec2.yml", "job.yml", "nccl.yml"}
    assert len(suites()) >= 5
    assert len(alerts()) >= 40


@pytest.mark.parametrize("path", rule_files(), ids=lambda p: p.name)
def test_promtool_check_rules(path):
    r = _run("check", "rules", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_promtool_suite_fails_on_a_wrong_expectation(tmp_path):
    """The suites can fail: the same case with a wrong description is reported as a failure."""
    suite = load(SUITES_DIR / "gpu.test.yml")
    for group in suite["tests"]:
        for case in group.get("alert_rule_test") or []:
            for exp in case.get("exp_alerts") or []:
                exp["exp_annotations"]["description"] = "something else"
    suite["rule_files"] = [str(RULES_DIR / "gpu.yml")]
    path = tmp_path / "wrong.test.yml"
    path.write_text(yaml.safe_dump(suite))
    r = _run("test", "rules", str(path))
    assert r.returncode != 0
    assert "FAILED" in r.stdout + r.stderr


def test_ecc_thresholds_are_overridable_in_one_place(tmp_path):
    """Raising the factor recording rule (and nothing else) silences the step-up case: the alert
    reads the threshold series, not a number in its expression."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests" / "rules").mkdir(parents=True)
    text = (RULES_DIR / "gpu.yml").read_text()
    assert text.count("expr: vector(3)") == 1
    (tmp_path / "rules" / "gpu.yml").write_text(text.replace("expr: vector(3)", "expr: vector(20)"))
    suite = load(SUITES_DIR / "gpu_ecc.test.yml")
    suite["tests"] = [g for g in suite["tests"] if g["name"] in (
        "step up to several times the baseline fires after for", "steady rate above the floor is silent")]
    assert len(suite["tests"]) == 2
    (tmp_path / "tests" / "rules" / "gpu_ecc.test.yml").write_text(yaml.safe_dump(suite))
    r = _run("test", "rules", str(tmp_path / "tests" / "rules" / "gpu_ecc.test.yml"))
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "step up to several times the baseline fires after for" in out
    assert "steady rate above the floor is silent" not in out


@pytest.mark.parametrize("name", sorted(alerts()))
def test_alert_conventions(name):
    rule = alerts()[name]
    assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", name) and len(name) <= 40, name
    labels, ann = rule.get("labels", {}), rule.get("annotations", {})
    assert labels.get("severity") in SEVERITIES
    assert "$value" not in str(labels), "a label that changes with the value resets `for`"
    summary = ann.get("summary", "")
    assert summary and "{{" not in summary and summary[0].isupper() and summary.endswith("."), summary
    assert "{{" in ann.get("description", ""), "description must be templated"
    if not name.endswith("Absent"):  # absent() has no series, hence no node, to name
        assert "$labels.instance" in ann["description"], "description must name the node"
    assert ann.get("runbook_url") == f"{DEFAULT_RUNBOOK_BASE}#{name.lower()}"
    if labels.get("node_action") == "replace":
        assert labels["severity"] == "critical"
    if labels["severity"] == "critical":  # a 2-minute exporter restart must not resolve and re-page
        assert name in MUST_SURVIVE_RESTART, f"{name}: a critical alert must survive a restart"


# Every alert that an exporter restart (its series gone for a scrape or two) must not resolve: each
# holds through the gap with `keep_firing_for`, or with a recorded hold-over arm (`...:held`, which
# an acknowledgement ends at once; keep_firing_for cannot tell an ack from a missed scrape). The
# exporter's own alerts are about the process and its scrapes: a restart does change them.
MUST_SURVIVE_RESTART = {
    # XIDs and the node verdict: the hold-over arm, ended by an ack
    "GpuXidReplaceNow", "GpuXidRebootRequired", "GpuXidResetRequired", "GpuXidUnknown",
    "GpuNodeReplaceRequired", "GpuNodeRebootRequired", "GpuXidNonfatalRateHigh",
    # GPU
    "GpuEccCorrectedRateAccelerating", "GpuEccCorrectedRateHigh", "GpuEccUncorrectedErrors",
    "GpuRowRemapFailure", "GpuRowRemapPending", "GpuRecoveryActionRebootRequired",
    "GpuRecoveryActionRequired",
    "GpuLost", "GpuUnresponsive", "GpuCountBelowExpected", "GpuHealthUnreadable", "GpuHwSlowdownActive",
    "GpuPowerBrakeActive",
    "GpuTemperatureNearSlowdown", "GpuPcieLinkWidthDegraded", "GpuPcieLinkGenerationDegraded",
    "GpuPcieReplayRateHigh", "GpuNvlinkErrorsRising", "GpuNvlinkDown",
    "GpuActiveCheckFailed", "GpuActiveCheckPassStale",
    # NVSwitch, fabric, EC2
    "NvswitchSxidReplaceNow", "NvswitchSxidRebootRequired", "NvswitchSxidUnknown",
    "NvswitchSxidNonFatalRateHigh",
    "GpuFabricNotCompleted", "GpuFabricRegistrationFailed",
    "Ec2ScheduledEventWithin7Days", "Ec2ScheduledRebootWithin24Hours",
    # EFA
    "EfaDevicesBelowExpected", "EfaDeviceUnreadable", "EfaAdminCommandsNoCompletion",
    "EfaUnresponsiveRemoteEvents",
    "EfaImpairedRemoteConnections", "EfaRetransmitTimeouts", "EfaRetransmitRatioHigh", "EfaReceiveDrops",
    "EfaWorkRequestErrors",
    # FSx for Lustre
    "LustreImportNotConnected", "LustreClientEvicted", "LustreRpcTimeouts", "LustreMetadataLatencyHigh",
    "LustreClientUnhealthy", "LustreStatsSourceUnreadable", "LustreMountUnresponsive",
    "LustreFilesystemNearlyFull",
    # job health: a restart empties the job's series for a scrape or two (keep_firing_for)
    "TrainingJobStalled", "TrainingJobStraggler", "TrainingJobSlow", "TrainingJobNcclStalled",
    # the exporter's own: only the one that says no exporter is scraped at all
    "GpuHealthExporterAbsent",
}
RESTART_CHANGES = {"GpuHealthExporterDown", "GpuHealthExporterTargetMissing",
                   "GpuHealthExporterCollectorFailing", "GpuHealthExporterScrapeSlow",
                   "GpuHealthExporterXidSourceDown", "GpuHealthExporterStateFileFailing"}
HOLD_OVER = re.compile(r"\b[a-z_]+:[a-z_]+:held\b")


def _duration_s(d: str) -> int:
    return sum(int(n) * {"s": 1, "m": 60, "h": 3600}[u] for n, u in re.findall(r"(\d+)([smh])", d))


def test_alerts_that_must_survive_a_restart():
    """Every alert is either listed as surviving an exporter restart or as one a restart changes;
    each listed one holds for at least 5 minutes after its series vanish (keep_firing_for, or a
    recorded hold-over of 15 minutes that an ack ends)."""
    rules = alerts()
    assert set(rules) == MUST_SURVIVE_RESTART | RESTART_CHANGES, (
        f"unclassified: {set(rules) - MUST_SURVIVE_RESTART - RESTART_CHANGES}; "
        f"gone: {(MUST_SURVIVE_RESTART | RESTART_CHANGES) - set(rules)}")
    assert not MUST_SURVIVE_RESTART & RESTART_CHANGES
    held = {r["record"]: r["expr"] for _, _, r in all_rules() if r.get("record", "").endswith(":held")}
    for name in sorted(MUST_SURVIVE_RESTART):
        rule = rules[name]
        arms = HOLD_OVER.findall(rule["expr"])
        if arms:
            assert not rule.get("keep_firing_for"), f"{name}: keep_firing_for would outlast an ack"
            for arm in arms:
                assert "last_over_time(" in held[arm] and "[15m]" in held[arm], arm
                assert "acknowledged" in held[arm], f"{arm}: an ack must end the hold-over"
        else:
            assert _duration_s(rule.get("keep_firing_for", "0s")) >= 300, f"{name}: keep_firing_for >= 5m"


def test_group_limits_and_unique_names():
    """mixtool's limits, and group names unique across files (one PrometheusRule or AMP workspace
    may hold all five files)."""
    names = []
    for path in rule_files():
        for g in load(path)["groups"]:
            names.append(g["name"])
            assert len(g["name"]) <= 40 and len(g["rules"]) <= 20, g["name"]
    assert len(names) == len(set(names))


# What a group costs is its cost per evaluation over its interval (bench/bench_rules.py),
# so every group says its interval, and a group with a critical alert (a page) is evaluated every
# 30 s or faster, so every page comes within a minute of its condition (docs/alerts.md,
# "Evaluation intervals"). promtool ignores `interval:`; tests/test_alert_matrix.py runs the groups
# at their own intervals (compressed) on a live Prometheus.
CRITICAL_MAX_INTERVAL_S = 30


def test_every_group_names_its_interval_and_pages_within_a_minute():
    for path in rule_files():
        for g in load(path)["groups"]:
            assert "interval" in g, f"{path.name}: group {g['name']} has no interval: (docs/alerts.md)"
            every = _duration_s(g["interval"])
            assert 15 <= every <= 300, (g["name"], g["interval"])
            critical = [r["alert"] for r in g["rules"] if r.get("labels", {}).get("severity") == "critical"]
            if critical:
                assert every <= CRITICAL_MAX_INTERVAL_S, f"{g['name']} ({g['interval']}) pages: {critical}"


def test_rule_files_convert_to_prometheusrule(tmp_path):
    """Each file is a PrometheusRule's spec as is: wrap it, unwrap it, and promtool still accepts it."""
    for path in rule_files():
        cr = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
              "metadata": {"name": f"gpu-health-exporter-{path.stem}", "labels": {"release": "prometheus"}},
              "spec": load(path)}
        back = yaml.safe_load(yaml.safe_dump(cr))["spec"]
        out = tmp_path / path.name
        out.write_text(yaml.safe_dump(back))
        r = _run("check", "rules", str(out))
        assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_fires_and_misses_in_a_suite():
    """Every alert has a case that fires, asserting its full labels and annotations, and a case
    where it stays silent."""
    cases = suite_cases()
    rules = alerts()
    for name, rule in rules.items():
        assert name in cases, f"{name} has no promtool test"
        fired = [exp for _, _, exps in cases[name] for exp in exps]
        assert fired, f"{name}: no case in which it fires"
        assert any(not exps for _, _, exps in cases[name]), f"{name}: no near-miss case"
        for exp in fired:
            labels = exp.get("exp_labels", {})
            assert labels.get("severity") == rule["labels"]["severity"]
            for k, v in rule["labels"].items():
                assert labels.get(k) == v, f"{name}: case does not assert label {k}"
            if not name.endswith("Absent"):
                assert labels.get("instance"), f"{name}: alert must carry instance (inhibition, grouping)"
            assert set(exp.get("exp_annotations", {})) == {"summary", "description", "runbook_url"}, name
    unknown = set(cases) - set(rules)
    assert not unknown, f"suites test alerts that do not exist: {unknown}"


def _catalog() -> set[str]:
    import exporter.runner  # noqa: F401 - declares the exporter's own metrics

    collectors.collector_classes()
    return {s.name for s in all_specs()}


def test_metric_name_extraction():
    assert metric_names('max without (counter) (rate(gpu_ecc_errors_total{error_type="corrected"}[5m]))') \
        == {"gpu_ecc_errors_total"}
    assert metric_names('a:b:c > on () group_left () x_total * 1e6 unless y offset 15m') \
        == {"a:b:c", "x_total", "y"}
    assert metric_names('label_replace(absent(up{job=~".*e.*"}), "job", "e", "", "")') == {"up"}


def test_every_metric_in_the_rules_exists():
    """Every raw metric a rule reads is in the exporter's catalog (or written by Prometheus); every
    recorded one is recorded by a rule."""
    catalog, rec = _catalog(), recorded()
    missing = {}
    for path, group, rule in all_rules():
        for name in metric_names(rule["expr"]):
            if ":" in name:
                ok = name in rec or name in PENDING_SERIES
            else:
                ok = (name in catalog or name in PROMETHEUS_SERIES or name in PENDING_SERIES
                      or name in KUBE_STATE_METRICS_SERIES)
            if not ok:
                where = f"{path.name}/{group}/{rule.get('alert') or rule['record']}"
                missing.setdefault(name, []).append(where)
    assert not missing, f"metrics used in rules/ but not in the catalog: {missing}"


def test_every_alert_has_a_runbook_section():
    anchors = github_anchors(RUNBOOKS.read_text())
    for name in alerts():
        assert name.lower() in anchors, f"docs/runbooks.md has no section for {name}"


def test_alerts_table_lists_every_alert_with_severity_and_tests():
    text = ALERTS_MD.read_text()
    cases = suite_cases()
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^\|\s*`([A-Z][A-Za-z0-9]+)`\s*\|\s*(\w+)\s*\|(.*)\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3), m.group(4))
    for name, rule in alerts().items():
        assert name in rows, f"docs/alerts.md has no row for {name}"
        severity, _, tests = rows[name]
        assert severity == rule["labels"]["severity"], name
        for _suite, group, _ in cases[name]:
            if group in tests:
                break
        else:
            raise AssertionError(f"docs/alerts.md row for {name} names none of its test cases")
    extra = set(rows) - set(alerts())
    assert not extra, f"docs/alerts.md lists alerts that do not exist: {extra}"


def test_every_or_with_an_alerts_arm_is_disjoint():
    """An alert's `ALERTS{...}` arm (or a hold-over) never yields a label set its other arm yields:
    every arm that returns ALERTS' own series is followed by `unless on (...)` of the alert's
    current arm, and a recorded hold-over is `unless` the current series. (Reading ALERTS in an
    `and` yields the other side's labels: no arm of its own.)"""
    arms = 0
    for name, rule in alerts().items():
        expr = rule["expr"]
        for m in re.finditer(r"max without \(alertstate\) \(ALERTS\{", expr):
            arms += 1
            assert "unless on (" in expr[m.end():], name
    assert arms >= 4
    for _, _, r in all_rules():
        if r.get("record", "").endswith(":held"):
            assert "unless on (" in r["expr"], r["record"]


# The properties of "Holding through real operations" (docs/alerts.md), each held by a promtool case
# that fails on the rules before its fix (tests/test_rules_regression_cases.py runs them there).
HOLDING_CASES = (
    ("fleet.test.yml", "an acknowledged GPU stays silent through a missed health collection"),
    ("fleet.test.yml", "a replace page holds while the exporter is unreachable or its target gone"),
    ("fleet.test.yml", "a 2-minute exporter restart neither resolves nor re-pages"),
    ("fleet.test.yml", "GPUs count as missing when NVML is unusable"),
    ("gpu_ecc_fleet.test.yml", "rate doubling every 2 hours fires"),
    ("gpu_ecc_fleet.test.yml", "step that persists keeps firing, a linear drift never fires"),
    ("gpu_ecc_fleet.test.yml", "young series judged on the young threshold only"),
)


def test_every_holding_property_has_a_regression_case():
    for suite, case in HOLDING_CASES:
        names = [g["name"] for g in load(SUITES_DIR / suite)["tests"]]
        assert f"{case} (regression)" in names, f"{suite}: no regression case {case!r}"


def test_rendered_rules_carry_the_runbook_base_and_pass_promtool(tmp_path):
    """`python -m exporter.rules --runbook-base URL --out DIR` moves every runbook link to URL and
    changes nothing else; promtool accepts the copy."""
    from exporter import rules as render

    base = "https://wiki.example.com/gpu/runbooks.md"
    assert render.main(["--runbook-base", base, "--out", str(tmp_path)]) == 0
    for path in rule_files():
        out = tmp_path / path.name
        got = load(out)
        urls = [r["annotations"]["runbook_url"] for g in got["groups"] for r in g["rules"] if "alert" in r]
        assert urls and all(u.startswith(base + "#") for u in urls)
        assert out.read_text().replace(base, DEFAULT_RUNBOOK_BASE) == path.read_text()
        r = _run("check", "rules", str(out))
        assert r.returncode == 0, r.stdout + r.stderr


def test_render_rejects_a_bad_base(tmp_path, capsys):
    from exporter import rules as render

    assert render.main(["--runbook-base", "wiki/runbooks.md", "--out", str(tmp_path)]) == 2
    assert "--runbook-base" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
