"""/metrics' `CollectorRegistry`: prometheus_client's custom-collector API over the runner.

The runner collects every exporter collector in parallel, each under its deadline, and concurrent
scrapes share one collection (exporter.runner). A collection is a `Collection`: its families in
order, and each collector's part. The registry holds one prometheus_client collector per exporter
collector (`CollectionPart`, in the runner's order), one for the runner's own series
(collector_success, build_info, ...) and the process_* collector. A part yields its collector's
families from the collection a scrape is serving (`families(registry, collection)`), else from
the runner's last one, so `generate_latest(registry)` and `registry.get_sample_value` also work
outside a scrape. A collector that failed or missed its deadline has no part: its series are
absent for that scrape and its collector_success is 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from exporter.metric import Metric
from exporter.process import ProcessCollector

if TYPE_CHECKING:
    from exporter.runner import Runner

RUNNER_PART = "exporter"  # the runner's own series (catalog collector "exporter")


class Collection(list):
    """One collection's families in exposition order (a list of prometheus_client Metrics), and
    `parts`: each collector's families by collector name."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: dict[str, list[Metric]] = {}

    def add(self, name: str, families: Iterable[Metric]) -> None:
        fams = list(families)
        self.parts[name] = fams
        self.extend(fams)


_serving: ContextVar[Collection | None] = ContextVar("serving", default=None)


class CollectionPart:
    """A prometheus_client custom collector: one exporter collector's families."""

    def __init__(self, name: str, latest: Callable[[], Collection]) -> None:
        self.name = name
        self._latest = latest

    def collect(self) -> Iterable[Metric]:
        c = _serving.get()
        return (c if c is not None else self._latest()).parts.get(self.name, ())


def build_registry(runner: Runner, process: bool = True) -> CollectorRegistry:
    """The registry /metrics renders: the runner's collectors, its own series, process_*."""
    reg = CollectorRegistry(auto_describe=False)
    for name in [c.name for c in runner.collectors] + [RUNNER_PART]:
        reg.register(CollectionPart(name, lambda: runner.collection))
    if process:
        reg.register(ProcessCollector())
    return reg


def families(registry: CollectorRegistry, collection: Collection) -> list[Metric]:
    """What `registry` yields while serving `collection` (one consistent collection even when
    another finishes meanwhile)."""
    token = _serving.set(collection)
    try:
        return list(registry.collect())
    finally:
        _serving.reset(token)
