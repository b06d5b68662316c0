"""Generated docs must match the code: a metric or config key added without regenerating fails."""

from exporter.tools import docs
from tests.helpers import ROOT


def test_metrics_md_matches_catalog():
    current = (ROOT / "docs" / "metrics.md").read_text()
    assert current == docs.metrics_md(), "docs/metrics.md is stale: run `python -m exporter.tools.generate`"


def test_configuration_md_matches_schema():
    current = (ROOT / "docs" / "configuration.md").read_text()
    assert current == docs.configuration_md(), \
        "docs/configuration.md is stale: run `python -m exporter.tools.generate`"


def test_every_metric_documented_once():
    text = docs.metrics_md().split("## Coming from dcgm-exporter")[0]  # the catalog's tables
    from exporter.catalog import all_specs

    for spec in all_specs():
        assert text.count(f"| `{spec.name}` |") == 1, spec.name


def test_dcgm_migration_table_names_only_metrics_that_exist():
    """Every series the dcgm-exporter table points to is in the catalog (a rename fails here), every
    row says what to use or that it is not exported; the profiling fields NVML's GPM gives are mapped
    to the activity counters, the rest still needs DCGM."""
    import re

    from exporter import migration
    from exporter.catalog import all_specs

    docs.metrics_md()  # loads every collector's metrics
    names = {s.name for s in all_specs()}
    for field, here, _note in migration.FIELDS:
        assert field.startswith("`DCGM_FI_"), field
        if here == migration.NOT_EXPORTED:
            continue
        used = re.findall(r"`([a-z_]+)(?:\{[^`]*\})?`", here)
        assert used, (field, here)
        assert set(used) <= names, (field, set(used) - names)
    assert any("DCGM_FI_PROF_" in f and h == migration.NOT_EXPORTED for f, h, _ in migration.FIELDS)
    mapped = {f: h for f, h, _ in migration.FIELDS}
    for dcgm, ours in (("SM_ACTIVE", "gpu_sm_active_seconds_total"),
                       ("SM_OCCUPANCY", "gpu_sm_occupancy_seconds_total"),
                       ("PIPE_TENSOR_ACTIVE", "gpu_tensor_active_seconds_total"),
                       ("DRAM_ACTIVE", "gpu_dram_active_seconds_total")):
        assert mapped[f"`DCGM_FI_PROF_{dcgm}`"] == f"`{ours}`"
    for pitfall in migration.PITFALLS:
        assert set(re.findall(r"gpu_[a-z_]+_total", pitfall)) <= names, pitfall
