"""Simulated nodes: generated sysfs/procfs/debugfs trees and kernel logs plus the fake NVML
backend, so the exporter runs end to end on a machine without GPUs, EFA or Lustre.

Each source contributes a `SimSource` in a module of this package (discovered automatically):
it builds its part of the tree, names the fault scenarios it understands, and advances its
counters on each tick of the simulation clock.
"""

from __future__ import annotations

import importlib
import pkgutil
import shutil
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from exporter.dmi import PRODUCT_NAME
from exporter.profiles import PROFILES, SIMULATED, Profile


class SimSource(ABC):
    name: str = ""
    scenarios: dict[str, str] = {}  # scenario name -> what it does

    def __init__(self, root: Path, profile: Profile, scenarios: set[str]) -> None:
        self.root = root
        self.profile = profile
        self.active = scenarios & set(self.scenarios)

    @abstractmethod
    def build(self) -> None:
        """Write this source's initial tree under `root`."""

    def advance(self, elapsed_s: float) -> None:
        """Move the source's counters forward to `elapsed_s` seconds since the start."""

    def close(self) -> None:
        """Stop what build() started (a server)."""


def source_classes() -> list[type[SimSource]]:
    out = []
    for mod in pkgutil.iter_modules(__path__):
        m = importlib.import_module(f"{__name__}.{mod.name}")
        cls = getattr(m, "SOURCE", None)
        if cls is not None:
            out.append(cls)
    return sorted(out, key=lambda c: c.name)


def all_scenarios() -> dict[str, str]:
    out: dict[str, str] = {}
    for cls in source_classes():
        out.update(cls.scenarios)
    return out


class Simulation:
    """A simulated node under `root` (a temporary directory unless given)."""

    def __init__(self, instance_type: str, scenarios: list[str] | None = None,
                 root: str | Path | None = None, tick_s: float = 1.0) -> None:
        if instance_type not in SIMULATED:
            raise ValueError(f"unknown simulated instance type {instance_type!r}; expected one of "
                             + ", ".join(SIMULATED))
        known = all_scenarios()
        unknown = [s for s in scenarios or [] if s not in known]
        if unknown:
            raise ValueError(f"unknown scenario {unknown[0]!r}; expected one of " + ", ".join(sorted(known)))
        self.profile = PROFILES[instance_type]
        self.scenarios = set(scenarios or [])
        self._own_root = root is None
        self.root = Path(root or tempfile.mkdtemp(prefix="ghe-sim-"))
        self.tick_s = tick_s
        self.sources = [cls(self.root, self.profile, self.scenarios) for cls in source_classes()]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic()

    def build(self) -> Simulation:
        for d in ("sys", "proc", "sys/kernel/debug", "dev", "state"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        # what EC2 firmware says: the instance type is the DMI product name (exporter/dmi.py)
        dmi_file = self.root / "sys" / PRODUCT_NAME
        dmi_file.parent.mkdir(parents=True, exist_ok=True)
        dmi_file.write_text(self.profile.instance_type + "\n")
        for s in self.sources:
            s.build()
        return self

    def config_overrides(self) -> dict[str, Any]:
        return {
            "paths.sysfs": str(self.root / "sys"),
            "paths.procfs": str(self.root / "proc"),
            "paths.debugfs": str(self.root / "sys/kernel/debug"),
            "paths.kmsg": str(self.root / "dev/kmsg"),
            "paths.state_dir": str(self.root / "state"),
        }

    def advance(self, elapsed_s: float | None = None) -> None:
        t = time.monotonic() - self._t0 if elapsed_s is None else elapsed_s
        for s in self.sources:
            s.advance(t)

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.tick_s):
                self.advance()

        self._thread = threading.Thread(target=loop, name="simulation", daemon=True)
        self._thread.start()

    @property
    def imds_url(self) -> str | None:
        """The simulated IMDS (scenario ec2-scheduled-reboot) on 127.0.0.1, else None: IMDS off."""
        return next((s.url for s in self.sources if getattr(s, "url", None)), None)

    def close(self) -> None:
        self._stop.set()
        for s in self.sources:
            s.close()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
