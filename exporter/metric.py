"""The exporter's metric model is prometheus_client's: a family is its `Metric`
(prometheus_client.metrics_core), a sample its `Sample` (prometheus_client.samples), and a value is
spelled by its `floatToGoString`. Collectors fill families through exporter.catalog.Families and
`Sample(name, labels, value)`; /metrics renders them directly (exporter.exposition).

A counter family is named without `_total` and its samples with it (prometheus_client's own
convention). Families are made without a unit, so OpenMetrics output has no `# UNIT` line (as
before prometheus_client was the model): prometheus_client appends a unit that a name does not end
in, which would rename a series; units are documented in docs/metrics.md.

Only the model's modules are imported, not prometheus_client's package (see _import_model): its
`__init__` imports its HTTP servers and push clients, which the served exporter never uses.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable

MODEL_MODULES = ("prometheus_client.samples", "prometheus_client.metrics_core", "prometheus_client.utils")


def _import_model() -> None:
    """Import prometheus_client's model modules without running its package `__init__`, which
    imports prometheus_client.exposition (http.server, wsgiref, urllib.request, email, ssl) and its
    default registry's collectors: 2.6 MiB of the served exporter's RSS (docs/performance.md).
    The package module is made from its spec but not run; the model's modules, which import only
    each other, load under it; its `__init__` runs when anything first asks the package for a name
    it does not have yet (`from prometheus_client import generate_latest`: a test, a tool), so the
    package is whole for them, with the same classes. tests/test_runtime_imports.py checks both."""
    if "prometheus_client" in sys.modules:  # imported already (a test): nothing left to save
        return
    spec = importlib.util.find_spec("prometheus_client")
    if spec is None or spec.loader is None:
        return  # the plain import below names what is missing
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def run_init(name: str) -> object:
        del package.__dict__["__getattr__"]
        loader.exec_module(package)
        return getattr(package, name)

    package.__dict__["__getattr__"] = run_init  # asked for a name it lacks (PEP 562) until it has run
    sys.modules["prometheus_client"] = package
    for name in MODEL_MODULES:
        importlib.import_module(name)


_import_model()

from prometheus_client.metrics_core import Metric  # noqa: E402 - after _import_model
from prometheus_client.samples import Sample  # noqa: E402
from prometheus_client.utils import floatToGoString  # noqa: E402

go_float: Callable[[float], str] = floatToGoString  # its signature, which prometheus_client leaves untyped

__all__ = ["Metric", "Sample", "go_float"]
