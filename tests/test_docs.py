"""Generated docs must match the code: a metric or config key added without regenerating fails."""

from exporter import docs
from tests.helpers import ROOT


def test_metrics_md_matches_catalog():
    current = (ROOT / "docs" / "metrics.md").read_text()
    assert current == docs.metrics_md(), "docs/metrics.md is stale: run `python -m exporter.docs`"


def test_configuration_md_matches_schema():
    current = (ROOT / "docs" / "configuration.md").read_text()
    assert current == docs.configuration_md(), "docs/configuration.md is stale: run `python -m exporter.docs`"


def test_every_metric_documented_once():
    text = docs.metrics_md()
    from exporter.catalog import all_specs

    for spec in all_specs():
        if spec.collector == "test":  # metrics the tests declare for themselves
            continue
        assert text.count(f"| `{spec.name}` |") == 1, spec.name
