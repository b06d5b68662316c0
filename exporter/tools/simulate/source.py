"""What a simulated source is (`SimSource`) and the node's shape it is given (`Shape`): the base
the source modules of this package build on, apart from the Simulation that discovers them
(exporter.tools.simulate), so they import nothing that imports them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.profiles import Profile

MAX_GPUS = 16  # distinct PCI buses the synthesised node has (exporter/tools/simulate/nvml_synth.py)


@dataclass(frozen=True)
class Shape:
    """The simulated node's size where it differs from its profile (`--simulate.gpus`,
    `--simulate.efa-devices`, `--simulate.lustre-osts`: benchmarks at other sizes); None keeps
    the profile's (or the source's) own. Out of range is a ValueError naming the flag."""

    gpus: int | None = None
    efa_devices: int | None = None
    lustre_osts: int | None = None
    nccl_ras_port: int | None = None  # the port of its NCCL job's fake RAS server (simulate/nccl_ras.py)
    nccl_node: int | None = None  # which node of that job this one is

    def __post_init__(self) -> None:
        for flag, v, lo, hi in (("--simulate.gpus", self.gpus, 0, MAX_GPUS),
                                ("--simulate.efa-devices", self.efa_devices, 0, 64),
                                ("--simulate.lustre-osts", self.lustre_osts, 1, 4096),
                                ("--simulate.nccl-ras-port", self.nccl_ras_port, 1, 65535),
                                ("--simulate.nccl-node", self.nccl_node, 0, 4095)):
            if v is not None and not lo <= v <= hi:
                raise ValueError(f"{flag} is {v}; expected an integer from {lo} to {hi}")


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

    def settings(self) -> dict[str, Any]:
        """Config keys this source's scenarios set (where the exporter finds what it built)."""
        return {}

    def close(self) -> None:
        """Stop what build() started (a server)."""
