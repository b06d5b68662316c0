"""The simulated node's NVML: the fake backend itself is built by exporter.nvml.session from the
simulation's profile and scenarios; this source only declares the `gpu-*` fault scenarios."""

from __future__ import annotations

from exporter.nvml.scenarios import SCENARIOS
from exporter.simulate import SimSource


class NvmlSimSource(SimSource):
    name = "nvml"
    scenarios = {name: doc for name, (doc, _apply) in SCENARIOS.items()}

    def build(self) -> None:
        """Nothing on disk: NVML is served by the fake backend (exporter.nvml.fake)."""


SOURCE = NvmlSimSource
