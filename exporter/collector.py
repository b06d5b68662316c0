"""The collector interface and the context every collector is built from."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exporter.catalog import Families

if TYPE_CHECKING:
    from exporter.config import Config
    from exporter.simulate import Simulation


@dataclass
class Context:
    """What collectors share: the validated config and objects owned by the process.

    `shared` holds lazily created objects that several collectors use (for example the one
    NVML session the GPU and XID collectors both talk to), keyed by name.
    """

    config: Config
    # Where NVML comes from: a capture file to replay, a simulated node, or (both None) the
    # real library. `nvml_latencies` makes the fake sleep the captured per-call latencies.
    nvml_capture: str | None = None
    simulation: Simulation | None = None
    scenarios: tuple[str, ...] = ()
    nvml_latencies: bool = False
    shared: dict[str, Any] = field(default_factory=dict)

    def get_shared(self, key: str, factory):  # noqa: ANN001 - any zero-argument callable
        if key not in self.shared:
            self.shared[key] = factory()
        return self.shared[key]


class Collector(ABC):
    """One source. `collect` fills `out` or raises; the runner turns a raise (or a deadline
    miss) into collector_success 0 for that scrape and keeps serving the other collectors."""

    name: str = ""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.log = logging.getLogger(f"exporter.{self.name}")

    def start(self) -> None:
        """Start background work (event threads, slow-cadence readers). Called once."""

    def close(self) -> None:
        """Stop background work. Called once at shutdown."""

    @abstractmethod
    def collect(self, out: Families) -> None:
        """Add this source's samples to `out`; raise to report the source as failed."""


class ProblemLog:
    """Logs a subject's problem (a GPU, a device, a mount) when it appears or changes, and once
    when it clears, so a problem that lasts is one log line, not one per scrape."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self._problems: dict[str, str] = {}

    def report(self, subject: str, problem: str) -> None:
        """`problem` is what is wrong with `subject` this scrape, '' when it is fine."""
        old = self._problems.get(subject, "")
        if problem == old:
            return
        if problem:
            self.log.warning("%s: %s", subject, problem)
            self._problems[subject] = problem
        else:
            self.log.info("%s: fine again", subject)
            del self._problems[subject]

    def forget(self, gone: Callable[[str], bool]) -> None:
        """Drop, without logging, the problems of subjects that no longer exist."""
        for subject in [s for s in self._problems if gone(s)]:
            del self._problems[subject]
