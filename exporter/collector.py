"""The collector interface and the context every collector is built from."""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from exporter.catalog import Families

if TYPE_CHECKING:
    from exporter.attribution.history import WorkloadHistory
    from exporter.config import CollectorSection, Config, Paths
    from exporter.deadline import Pool
    from exporter.imds import IdentitySource
    from exporter.nvml.session import NvmlSession
    from exporter.workload.source import WorkloadSource
    from exporter.xid.service import XidService


@dataclass
class Context:
    """What collectors are built from: the validated config (with the file roots, `paths`) and
    the backends and process-wide objects several collectors use. Every part is built once, by
    the composition root (exporter.compose.compose, which exporter.cli, the simulated node and
    the tests call), and handed in; a Context builds nothing itself. No collector knows whether
    the node is real or simulated: a simulation only changes the backends and the roots.

    - `nvml`: the one NVML session (GPU collector, XID events, verdict); its backend (pynvml, a
      capture, a simulated node's fake) is loaded on its first `ensure()`.
    - `statvfs`: how a mount's capacity is read (the Lustre probe); a simulated node answers
      from its tree.
    - `identity`: the instance identity (config, the DMI product name under the sysfs root, then
      the IMDS lookup the daemon starts at start-up).
    - `workload`: the workload source (exporter.workload.source: which job or pod holds each
      GPU; the workload collector and fault attribution read it); None when no kind is configured.
    - `xid`: the XID service (xid, nvswitch and health collectors, `check`, `ack`); None when no
      collector declared the xid section.
    - `workloads`: what the workload source observed on each GPU lately, for fault attribution
      (exporter.attribution): it hears every reading the source takes, and the XID
      service asks it who a counted fault hit.
    - `pool`: the threads every read under a deadline runs on (exporter.deadline): the runner's
      collectors, their device reads, probes. Closed by whoever built it (shutdown).
    """

    config: Config
    nvml: NvmlSession
    statvfs: Callable[[str], os.statvfs_result]
    identity: IdentitySource
    workload: WorkloadSource | None
    xid: XidService | None
    workloads: WorkloadHistory
    pool: Pool

    @property
    def paths(self) -> Paths:
        """Where the file sources are: config's `paths` (sysfs, procfs, debugfs, kmsg, state_dir)."""
        return self.config.paths

    def xid_service(self) -> XidService:
        """The XID service the xid, nvswitch and health collectors read: composed whenever the
        config has the xid section (exporter.compose), which registering the xid collector adds."""
        if self.xid is None:
            raise RuntimeError("no XID service: this context was composed without the xid config section")
        return self.xid


class Collector(ABC):
    """One source. `collect` fills `out` or raises; the runner turns a raise (or a deadline
    miss) into collector_success 0 for that scrape and keeps serving the other collectors.

    What `collect` returns is its reading: the runner hands it to the collectors that depend on
    this one (`Derived`), in the same collection. Most collectors return None."""

    name: str = ""
    # Read by the registry (exporter.collectors): the typed config section (named as the
    # collector, with `enabled`), the domain prefix of its metrics, its docs/metrics.md heading.
    config_section: ClassVar[type[CollectorSection] | None] = None
    prefix: ClassVar[str] = ""
    docs_group: ClassVar[str] = ""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.log = logging.getLogger(f"exporter.{self.name}")

    def start(self) -> None:
        """Start background work (event threads, slow-cadence readers). Called once."""

    def close(self) -> None:
        """Stop background work. Called once at shutdown."""

    def bind_collect(self, collect: Callable[[], Any]) -> None:
        """Called by the runner before `start` with a function that runs a collection (not a
        scrape; it joins one in flight). For a collector whose background work must act even when
        nothing scrapes (the Kubernetes writer's heartbeat); most ignore it."""

    @abstractmethod
    def collect(self, out: Families) -> Any:
        """Add this source's samples to `out`; raise to report the source as failed. Returns the
        reading dependants get (None when no collector depends on this one)."""


class Derived(Collector):
    """A collector computed from other collectors' readings of the same collection (the verdict
    from the GPU collector's reading). The runner starts `derive` as soon as every collector in
    `depends_on` has finished (or missed its deadline) and passes `inputs[name]` for each:

    - the reading that collector returned in this collection, or handed over with `Failed`;
    - None when it raised anything else, missed its deadline, is still stuck in an earlier
      collection, or does not run (disabled, or not built). Never an older reading: a verdict
      from a stale GPU reading would show a GPU lost since as present.

    To give a derived collector a new input: add the collector's name to `depends_on`, return
    the reading from that collector's `collect`, and read `inputs[name]` in `derive`."""

    depends_on: tuple[str, ...] = ()

    def collect(self, out: Families) -> Any:
        """Run alone (no runner): every input is missing."""
        return self.derive(out, dict.fromkeys(self.depends_on))

    @abstractmethod
    def derive(self, out: Families, inputs: Mapping[str, Any]) -> Any:
        """Like `collect`, from the inputs described in the class docstring."""


class Failed(Exception):  # noqa: N818 - reads as `raise Failed(...)`
    """Raised by a collector whose source failed but that still has a reading for its dependants
    (the GPU collector when NVML cannot be used: the verdict reports nvml_unavailable)."""

    def __init__(self, message: str, reading: Any) -> None:
        super().__init__(message)
        self.reading = reading


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
