"""What a simulated source is (`SimSource`) and the node's shape it is given (`Shape`): the base
the source modules of this package build on, apart from the Simulation that discovers them
(exporter.simulate), so they import nothing that imports them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporter.profiles import Profile

if TYPE_CHECKING:
    from exporter.config import Config


@dataclass(frozen=True)
class Shape:
    """The simulated node's size where it differs from its profile (config section `simulate`);
    None keeps the profile's (or the source's) own."""

    gpus: int | None = None
    efa_devices: int | None = None
    lustre_osts: int | None = None

    @classmethod
    def from_config(cls, config: Config) -> Shape:
        sec = getattr(config, "simulate", None)
        if sec is None:
            return cls()
        return cls(sec.gpus, sec.efa_devices, sec.lustre_osts)


class SimSource(ABC):
    name: str = ""
    scenarios: dict[str, str] = {}  # scenario name -> what it does

    def __init__(self, root: Path, profile: Profile, scenarios: set[str]) -> None:
        self.root = root
        self.profile = profile
        self.active = scenarios & set(self.scenarios)

    def configure(self, shape: Shape) -> None:
        """Take the node's shape (called before build); the GPU and EFA counts are the profile's."""

    @abstractmethod
    def build(self) -> None:
        """Write this source's initial tree under `root`."""

    def advance(self, elapsed_s: float) -> None:
        """Move the source's counters forward to `elapsed_s` seconds since the start."""

    def config_overrides(self) -> dict[str, Any]:
        """Config keys this source's scenarios set (where the exporter finds what it built)."""
        return {}

    def close(self) -> None:
        """Stop what build() started (a server)."""
