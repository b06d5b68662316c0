"""One collection: the families each collector produced, in the runner's order, under the name of
the collector that produced them, the runner's own series (collector_success, build_info, ...)
last. The runner builds it (exporter.runner), /metrics renders it (exporter.web.server) and the
landing page reads it. A collector that failed or missed its deadline has no part: its series
are absent for that collection and its collector_success is 0.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

from exporter.metric import Metric

RUNNER_PART = "exporter"  # the runner's own series (catalog collector "exporter")


class Collection(list[Metric]):
    """One collection's families in exposition order (a list of prometheus_client Metrics), and
    `parts`: each collector's families by collector name."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: dict[str, list[Metric]] = {}

    def add(self, name: str, families: Iterable[Metric]) -> None:
        fams = list(families)
        self.parts[name] = fams
        self.extend(fams)

    def select(self, wanted: set[str] | None) -> list[Metric]:
        """The families of the `wanted` collectors (None: all) and the runner's own; of its
        series about a collector (a `collector` label: success, duration), those of the wanted."""
        if wanted is None:
            return self
        out: list[Metric] = []
        for name, fams in self.parts.items():
            if name in wanted:
                out.extend(fams)
            elif name == RUNNER_PART:
                for m in fams:
                    if m.samples and "collector" in m.samples[0].labels:
                        m = copy.copy(m)
                        m.samples = [s for s in m.samples if s.labels["collector"] in wanted]
                    out.append(m)
        return out
