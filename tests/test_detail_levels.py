"""Detail levels: what the default config exports on a simulated p5.48xlarge feeds every shipped
rule and dashboard query and stays within the series budget; `all` exports every counter.

The metric names the rules and dashboards use are read from rules/*.yml and every dashboard
JSON under dashboards/ when the test runs, so the test follows them as they change."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter import collectors
from exporter.arguments import build_parser
from exporter.catalog import DOMAIN_PREFIXES, all_specs
from exporter.exposition import render
from exporter.process import process_metrics
from exporter.runner import Runner
from exporter.startup import build_context
from tests.helpers import START_HANG_GUARD_S, test_pool
from tests.rules_lint import PENDING_SERIES

ROOT = Path(__file__).resolve().parent.parent
# default series on a simulated p5.48xlarge (1000), plus the GPU activity: 4 GPM
# counters and gpu_activity_measured per GPU, 40 on a p5, what replaces a dcgm-exporter beside us
SERIES_BUDGET = 1000 + 40
# Scenarios that make event-driven series exist (XID counts, an eviction) without which a default
# scrape would not show them.
SCENARIOS = ("xid-31-backlog", "xid-63", "lustre-eviction", "gpu-xid-event-79")

_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels, keywords or
    recording-rule outputs, which have a colon); only names in the exporter's domains."""
    s = _STRING.sub('""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # ranges, subqueries
    s = _GROUPING.sub(" ", s)
    s = re.sub(r"\$\{?\w+\}?", " ", s)  # Grafana variables
    names = set()
    for m in _NAME.finditer(s):
        rest = s[m.end():].lstrip()
        if rest.startswith("("):
            continue  # a function or aggregation
        name = m.group()
        if ":" not in name and name.startswith(DOMAIN_PREFIXES):
            names.add(name)
    return names


def rule_files() -> list[Path]:
    return sorted(ROOT.glob("rules/**/*.yml")) + sorted(ROOT.glob("rules/**/*.yaml"))


def dashboard_files() -> list[Path]:
    return sorted(ROOT.glob("dashboards/**/*.json"))


def _strings(node, keys=("expr", "query", "definition")):  # noqa: ANN001, ANN202
    if isinstance(node, dict):
        for k, v in node.items():
            if k in keys and isinstance(v, str):
                yield v
            elif k in keys and isinstance(v, dict) and isinstance(v.get("query"), str):
                yield v["query"]  # Grafana templating: {"query": "label_values(...)"}
            else:
                yield from _strings(v, keys)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v, keys)


def used_names() -> dict[str, list[str]]:
    """metric name -> where it is used (file), from every rule file and dashboard JSON."""
    used: dict[str, list[str]] = {}
    for f in rule_files():
        doc = yaml.safe_load(f.read_text()) or {}
        for group in doc.get("groups", []):
            for rule in group.get("rules", []):
                for name in metric_names(str(rule.get("expr", ""))):
                    used.setdefault(name, []).append(f.name)
    for f in dashboard_files():
        for expr in _strings(json.loads(f.read_text())):
            for name in metric_names(expr):
                used.setdefault(name, []).append(f.name)
    return used


def scrape_simulated(config: Path | None = None) -> str:
    """One scrape of every enabled collector on a simulated p5.48xlarge, after the scenarios'
    onsets and a slow-cadence read."""
    argv = ["--simulate", "p5.48xlarge"]
    for s in SCENARIOS:
        argv += ["--scenario", s]
    if config is not None:
        argv += ["--config", str(config)]
    ctx, sim = build_context(build_parser().parse_args(argv))
    built = collectors.build(ctx)
    runner = Runner.from_config(built, ctx.config, pool=test_pool())
    try:
        sim.advance(60)
        runner.start()
        for c in built:
            if hasattr(c, "refresh_slow"):
                c.refresh_slow(timeout=10)
        deadline = time.monotonic() + START_HANG_GUARD_S
        text = ""
        while "gpu_xid_errors_total{" not in text and time.monotonic() < deadline:
            time.sleep(0.1)  # the kernel-log follower reads the backlog in the background
            text = render(runner.collect() + process_metrics()).decode()  # what /metrics serves
        return text
    finally:
        runner.close()
        sim.close()


def series(text: str) -> dict[str, int]:
    """sample name -> number of series, plus each family name (for histograms and counters)."""
    out: dict[str, int] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0) + 1
    return out


@pytest.fixture(scope="module")
def default_scrape() -> dict[str, int]:
    return series(scrape_simulated())


def test_the_name_extraction_finds_selectors_and_skips_the_rest():
    expr = ('sum by (cluster, gpu_index) (rate(efa_tx_bytes_total{device=~"rdmap.*"}[5m])) '
            '/ on (instance) group_left(gpu_info_label) instance:efa_rx_bytes:rate5m '
            '+ label_replace(gpu_info, "gpu_x", "$1", "gpu", "(.*)") and absent(gpu_lost offset 5m)')
    assert metric_names(expr) == {"efa_tx_bytes_total", "gpu_info", "gpu_lost"}


def test_rules_and_dashboards_are_fed_by_the_default_config(default_scrape):
    used = used_names()
    assert len(used) > 20, "found too few metric names in rules/ and dashboards/: is the parser broken?"
    missing = {n: sorted(set(w)) for n, w in used.items()
               if n not in default_scrape and n not in PENDING_SERIES}
    # Series that need an event the simulated node cannot give (IMDS is never reached in tests):
    # they must at least be declared as exported by the default config.
    specs = {s.name: s for s in all_specs()}
    not_default = {n: w for n, w in missing.items()
                   if n not in specs or specs[n].detail != "default" or not _enabled_by_default(specs[n])}
    assert not_default == {}, "used by rules/dashboards but not exported by the default config"
    event_only = sorted(missing)
    event_sources = ("instance", "nvswitch", "xid", "lustre", *ON_ONCE_CONFIGURED, *OFF_BY_DEFAULT)
    assert all(specs[n].collector in event_sources for n in event_only), event_only


# Collectors with nothing to read until the node says where: on by default once configured.
ON_ONCE_CONFIGURED = {"workload": "the workload source (a Slurm mapping directory, cgroups or the kubelet)",
                      "active": "the result files the `active` command writes (docs/active-checks.md)"}
# Collectors off by default whose rules stay silent without them (the operator turns them on).
OFF_BY_DEFAULT = {"nccl": "queries run inside the training processes: docs/nccl.md, \"Risks\""}


def _enabled_by_default(spec) -> bool:  # noqa: ANN001
    from exporter.config import CollectorSection, load

    cfg = load(None)
    section = cfg.sections.get(spec.collector)
    on = not isinstance(section, CollectorSection) or section.enabled
    return on or spec.collector in ON_ONCE_CONFIGURED or spec.collector in OFF_BY_DEFAULT


def test_default_stays_within_the_series_budget(default_scrape):
    total = sum(default_scrape.values())
    assert total <= SERIES_BUDGET, f"{total} series by default on a simulated p5.48xlarge"


def test_all_exports_every_counter(tmp_path, default_scrape):
    cfg = tmp_path / "all.yml"
    cfg.write_text("efa:\n  counters: all\ngpu:\n  detail: all\n")
    everything = series(scrape_simulated(cfg))
    from exporter.efa.naming import DEVICE_COUNTERS, PORT_COUNTERS

    for m in [*PORT_COUNTERS.values(), *DEVICE_COUNTERS.values()]:
        # the simulated p5 runs a kernel with every counter
        assert everything.get(m.spec.name, 0) == 32, m.spec.name
    assert everything["efa_verbs_errors_total"] == 32 * 7
    assert everything["gpu_nvlink_errors_total"] == 8 * 18 * 4
    assert everything["gpu_nvlink_up"] == 8 * 18
    for name in ("gpu_pcie_errors_total", "gpu_throttle_seconds_total", "gpu_clock_max_hertz", "efa_info",
                 "efa_port_rate_bytes_per_second"):
        assert everything.get(name, 0) > 0 and name not in default_scrape, name
    thresholds = "gpu_temperature_threshold_celsius"  # slowdown and memory_max by default, 4 with limits
    assert everything[thresholds] == 2 * default_scrape[thresholds]
    assert sum(everything.values()) > 2 * sum(default_scrape.values())
