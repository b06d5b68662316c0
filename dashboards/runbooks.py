"""The alerts of this project and their runbook links, read from rules/ when the dashboards are
built, so the fleet dashboard's alert table names exactly the shipped alerts and opens the runbook
each one's `runbook_url` annotation names (one source: the rule files)."""

from __future__ import annotations

from pathlib import Path

import yaml
from grafana_foundation_sdk.models import dashboard as dm

RULES = Path(__file__).resolve().parent.parent / "rules"


def runbooks() -> dict[str, str]:
    """alertname -> runbook_url for every alert in rules/*.yml."""
    out = {}
    for path in sorted(RULES.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    out[rule["alert"]] = rule.get("annotations", {}).get("runbook_url", "")
    return out


def alert_regex() -> str:
    """A PromQL regex matching exactly this project's alert names."""
    return "|".join(sorted(runbooks()))


def runbook_properties() -> list[dm.DynamicConfigValue]:
    """Field properties for a `runbook` column holding the alert name: a value mapping from each
    name to its runbook URL (shown as text) and a link opening it (${__value.text} is the mapped
    text). The URLs carry the default runbook base; `python -m exporter.tools.deploygen --runbook-base`
    moves them with every other shipped link."""
    mapping = dm.ValueMap(options={name: dm.ValueMappingResult(text=url, index=i)
                                   for i, (name, url) in enumerate(sorted(runbooks().items()))})
    url = "${__value.text}"
    return [dm.DynamicConfigValue(id_val="mappings", value=[mapping]),
            dm.DynamicConfigValue(id_val="links", value=[{"title": "Open the runbook", "url": url,
                                                          "targetBlank": True}])]
