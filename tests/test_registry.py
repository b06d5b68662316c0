"""The explicit registry: a collector class declares its typed config section, its
metric prefix and its docs group, and nothing else needs editing. A toy collector registered here
gets its config section, its docs (docs/configuration.md and docs/metrics.md) and its metrics."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from exporter import catalog, collectors
from exporter.catalog import Families, define
from exporter.collector import Collector
from exporter.compose import compose
from exporter.config import CollectorSection, ConfigError, load, positive, setting
from exporter.tools import docs
from tests.helpers import HANG_GUARD_S, scrape, test_pool, value


@dataclass
class NvmeSection(CollectorSection):
    """NVMe SMART health of the node's local disks (a toy collector of the tests)."""

    name = "nvme"
    enabled: bool = setting(True, "Run the NVMe collector.")
    devices: int = setting(2, "Disks to report.", check=positive)
    device_prefix: str | None = setting(None, "Name of the disks (nvme when unset).")


class NvmeCollector(Collector):
    name = "nvme"
    config_section = NvmeSection
    prefix = "nvme_"
    docs_group = "NVMe SMART (toy)"

    def collect(self, out: Families) -> None:
        cfg = self.ctx.config.section(NvmeSection)  # typed: NvmeSection
        for i in range(cfg.devices):
            out.add(SMART_OK, 1, device=f"{cfg.device_prefix or 'nvme'}{i}")


SMART_OK: catalog.MetricSpec


@pytest.fixture
def toy():
    global SMART_OK
    SMART_OK = define("nvme_smart_ok", "gauge", "1 if the disk's SMART health is OK (toy).", ("device",),
                      collector="nvme")
    collectors.register(NvmeCollector)
    try:
        yield NvmeCollector
    finally:
        collectors.unregister("nvme")
        catalog.forget("nvme_smart_ok")


def test_a_registered_collector_gets_its_config_section(toy, tmp_path):
    assert load(None).section(NvmeSection).devices == 2
    p = tmp_path / "config.yaml"
    p.write_text("nvme:\n  devices: 3\n  device_prefix: disk\n")
    cfg = load(p)
    assert cfg.section(NvmeSection).devices == 3 and cfg.section(NvmeSection).device_prefix == "disk"
    p.write_text("nvme:\n  devices: 0\n  bogus: 1\n")
    with pytest.raises(ConfigError) as e:
        load(p)
    assert "key 'nvme.devices' is 0; expected a number greater than 0" in str(e.value)
    assert "unknown key 'nvme.bogus'; expected one of nvme.enabled, nvme.devices" in str(e.value)


def test_a_registered_collector_gets_its_docs(toy):
    conf = docs.configuration_md()
    assert "## `nvme`\n\nNVMe SMART health of the node's local disks (a toy collector of the tests)." in conf
    assert "| `nvme.devices` | an integer | `2` | Disks to report. |" in conf
    assert "| `nvme.device_prefix` | a string or null | unset |" in conf
    metrics = docs.metrics_md()
    assert "## NVMe SMART (toy)\n" in metrics
    row = "| `nvme_smart_ok` | gauge | `device` | default | 1 if the disk's SMART health is OK (toy). |"
    assert row in metrics


def test_a_registered_collector_is_built_enabled_and_its_metrics_served(toy, tmp_path):
    from exporter.runner import Runner

    p = tmp_path / "config.yaml"
    p.write_text("nvme:\n  devices: 3\n")
    cfg = load(p)
    built = collectors.build(compose(cfg), only=["nvme"])
    assert [c.name for c in built] == ["nvme"]
    runner = Runner(built, 5.0, pool=test_pool())
    try:
        text = scrape(runner)
    finally:
        runner.close()
    assert value(text, "nvme_smart_ok", device="nvme2") == 1
    assert value(text, "gpu_health_exporter_collector_success", collector="nvme") == 1
    p.write_text("nvme:\n  enabled: false\n")
    assert "nvme" not in [c.name for c in collectors.build(compose(load(p)))]


def test_a_registered_collector_gets_its_command_line_flags(toy):
    from exporter.arguments import build_parser, cli_overrides

    args = build_parser().parse_args(["--no-collector.nvme"])
    assert cli_overrides(args)["nvme.enabled"] is False


def test_a_collector_metric_outside_its_prefix_is_refused(toy):
    with pytest.raises(ValueError, match="must start with one of"):
        define("gpu_not_mine", "gauge", "x", collector="nvme")


def test_what_a_collector_must_declare():
    class NoSection(NvmeCollector):
        config_section = None

    class NoGroup(NvmeCollector):
        docs_group = ""

    for cls in (NoSection, NoGroup):
        with pytest.raises(ValueError, match="collector 'nvme'"):
            collectors.register(cls)
    assert "nvme" not in collectors.collector_classes()


def test_every_metric_belongs_to_a_registered_collector_or_the_exporter():
    known = set(collectors.collector_classes()) | {"exporter"}
    docs._load_everything()
    assert {s.collector for s in catalog.all_specs()} <= known


def test_sections_exist_once_the_composition_root_discovers_the_collectors():
    """A process that discovers the collectors (as exporter.cli does before it loads a config) has
    every collector's section, whether or not it imported their modules."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    code = ("from exporter import collectors; collectors.discover(); from exporter.config import load; "
            "c = load(None); print(c.sections['gpu'].timeout_seconds, c.sections['efa'].counters)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert r.returncode == 0 and r.stdout.split() == ["4.0", "default"], r.stderr


def test_an_unregistered_collectors_section_is_an_unknown_key(toy):
    collectors.unregister("nvme")
    with pytest.raises(ConfigError, match="nvme"):
        load(None, {"nvme.devices": 3})
    collectors.register(NvmeCollector)
    assert load(None, {"nvme.devices": 3}).section(NvmeSection).devices == 3
