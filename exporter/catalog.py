"""The metric catalog: every metric is declared here once (name, type, help, labels, unit).

Collectors declare their metrics at import time with `define()`, and fill them per scrape
through `Families`, whose families are prometheus_client's (exporter.metric). docs/metrics.md
is generated from `all_specs()` (see exporter.tools.docs).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from exporter.metric import Metric, Sample

_SPECS: dict[str, MetricSpec] = {}

# process_: the exporter's own process metrics, under the names every Prometheus exporter uses.
DOMAIN_PREFIXES = ("gpu_health_exporter_", "gpu_", "efa_", "lustre_client_", "ec2_", "nccl_ras_", "process_")


@dataclass(frozen=True)
class MetricSpec:
    name: str  # the exposed name: counters end in _total, info metrics in _info
    type: str  # "gauge" or "counter"
    help: str
    labels: tuple[str, ...]
    unit: str
    collector: str
    detail: str = "default"  # which setting exports it (docs/metrics.md); "default": the default config

    def family(self) -> Metric:
        """A new, empty prometheus_client family for this metric. A counter family is named
        without _total (OpenMetrics), its samples with it; no unit (see exporter.metric)."""
        return Metric(self.name.removesuffix("_total"), self.help, self.type)


def define(
    name: str,
    type: str,
    help: str,
    labels: tuple[str, ...] | list[str] = (),
    unit: str = "",
    collector: str = "",
    detail: str = "default",
) -> MetricSpec:
    """Declare a metric. Names are checked against the project's conventions at declaration."""
    if name in _SPECS:
        raise ValueError(f"metric {name} declared twice")
    if type not in ("gauge", "counter"):
        raise ValueError(f"metric {name}: type must be gauge or counter, not {type!r}")
    if type == "counter" and not name.endswith("_total"):
        raise ValueError(f"counter {name} must end in _total")
    if type == "gauge" and name.endswith("_total"):
        raise ValueError(f"gauge {name} must not end in _total")
    _check_prefix(name, collector)
    if unit and unit not in name:
        raise ValueError(f"metric {name} must carry its unit {unit!r} in its name")
    spec = MetricSpec(name, type, help, tuple(labels), unit, collector, detail)
    _SPECS[name] = spec
    return spec


# Collector name -> the prefixes its metrics may have: the exporter's own here, a collector's
# from its class (exporter.collectors.register). A collector's metrics are defined before its
# class is registered, so they are checked at registration, and at definition after it.
_OWN: dict[str, tuple[str, ...]] = {"exporter": ("gpu_health_exporter_", "process_")}


def _check_prefix(name: str, collector: str) -> None:
    allowed = _OWN.get(collector, None if collector else DOMAIN_PREFIXES)
    if allowed is not None and not name.startswith(allowed):
        raise ValueError(f"metric {name} of {collector or 'no collector'} must start with one of {allowed}")


def own_prefixes(collector: str, prefixes: tuple[str, ...] | None) -> None:
    """Set (None: forget) the prefixes of a collector's metrics, checking those defined so far."""
    if prefixes is None:
        _OWN.pop(collector, None)
        return
    _OWN[collector] = prefixes
    for spec in _SPECS.values():
        if spec.collector == collector:
            _check_prefix(spec.name, collector)


def forget(name: str) -> None:
    """Drop a metric's declaration (tests that declare a collector of their own)."""
    _SPECS.pop(name, None)


def all_specs() -> list[MetricSpec]:
    return sorted(_SPECS.values(), key=lambda s: s.name)


class Families:
    """The samples of one collection, each family created on first use, in declaration order."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def add(self, spec: MetricSpec, value: float, **labels: str | int) -> None:
        fam = self._families.get(spec.name)
        if fam is None:
            fam = self._families[spec.name] = spec.family()
        if len(labels) != len(spec.labels):
            raise ValueError(f"{spec.name}: labels {sorted(labels)} do not match {spec.labels}")
        fam.samples.append(Sample(spec.name, {k: str(labels[k]) for k in spec.labels}, float(value)))

    def add_samples(self, spec: MetricSpec, samples: Iterable[Sample]) -> None:
        """Add prepared samples (named spec.name, labels exactly spec.labels): for values served
        many times, such as a slow-cadence reading, so a scrape does no per-sample label work."""
        fam = self._families.get(spec.name)
        if fam is None:
            fam = self._families[spec.name] = spec.family()
        fam.samples.extend(samples)

    def declare(self, spec: MetricSpec) -> None:
        """Emit the family even when it has no sample (so HELP/TYPE stay visible)."""
        self._families.setdefault(spec.name, spec.family())

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())
