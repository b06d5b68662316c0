"""The attribution series' helpers, shared by the xid and nvswitch collectors (no collector of
its own): the last time each workload was hit, and samples rebuilt only when their inputs change."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable

from exporter.attribution.ledger import XID, Attribution
from exporter.metric import Sample
from exporter.workload.model import Workload

WORKLOAD_LABELS = ("hpc_job", "namespace", "pod", "container")


def last_seen(records: Iterable[Attribution], kind: str) -> dict[tuple[str, int, Workload], float]:
    """The exported attribution series of `kind`: per (the GPU's PCI key for an XID, the
    NVSwitch's for an SXid; code; workload) the time of the last such event. Unknown and idle
    attributions have no series (no workload is ever invented)."""
    out: dict[tuple[str, int, Workload], float] = {}
    for r in records:
        if r.kind != kind:
            continue
        for w in r.workloads or ():
            key = (r.pci if kind == XID else r.switch, r.code, w)
            out[key] = max(out.get(key, 0.0), r.time)
    return out


def series_labels(w: Workload) -> dict[str, str]:
    """All four workload labels of an attribution series (those of the other kind empty)."""
    return {n: getattr(w, n) for n in WORKLOAD_LABELS}


class PreparedSeries:
    """The samples of an attribution series, rebuilt only when what they are made of changes (the
    ledger, the acks, the GPUs' labels): a scrape then costs one key comparison, not a label set
    per sample (up to 8 per GPU, each with its workloads)."""

    def __init__(self) -> None:
        self._key: Hashable | None = None
        self._samples: tuple[Sample, ...] = ()

    def get(self, key: Hashable, build: Callable[[], Iterable[Sample]]) -> tuple[Sample, ...]:
        if key != self._key:
            self._samples = tuple(build())
            self._key = key
        return self._samples
