"""The exporter's metric model is prometheus_client's: a family is its `Metric`
(prometheus_client.metrics_core), a sample its `Sample` (prometheus_client.samples), and a value is
spelled by its `floatToGoString`. Collectors fill families through exporter.catalog.Families and
`Sample(name, labels, value)`; /metrics renders them directly (exporter.exposition).

A counter family is named without `_total` and its samples with it (prometheus_client's own
convention). Families are made without a unit, so OpenMetrics output has no `# UNIT` line (as
before prometheus_client was the model): prometheus_client appends a unit that a name does not end
in, which would rename a series; units are documented in docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

go_float: Callable[[float], str] = floatToGoString  # its signature, which prometheus_client leaves untyped

__all__ = ["Metric", "Sample", "go_float"]
