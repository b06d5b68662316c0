"""The simulated node's NVML: a fake backend (exporter.nvml.fake) of the profile's GPUs,
synthesised from the real H200 capture (nvml_synth) and scripted by the `gpu-*` fault scenarios
(nvml_scenarios). Nothing on disk: the composition root hands the backend to the NVML session."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exporter.nvml.fake import FakeBackend, load_capture
from exporter.tools.simulate.nvml_scenarios import SCENARIOS, apply_scenarios
from exporter.tools.simulate.nvml_synth import node_capture
from exporter.tools.simulate.source import SimSource


def fake_backend(profile: Any, scenarios: Sequence[str] = (), latencies: bool = False,
                 capture: dict[str, Any] | None = None) -> FakeBackend:
    """A node of `profile.gpus` GPUs grounded in the H200 capture (or `capture`), scripted by the
    NVML scenarios among `scenarios`."""
    fake = FakeBackend(node_capture(profile, capture or load_capture()), latencies=latencies)
    apply_scenarios(fake, scenarios, profile)
    if any(s.startswith("nccl-") for s in scenarios):  # the NCCL job's processes on its GPUs
        from exporter.tools.simulate.nccl_ras import nvml_processes

        nvml_processes(fake, profile.gpus)
    return fake


class NvmlSimSource(SimSource):
    name = "nvml"
    scenarios = {name: doc for name, (doc, _apply) in SCENARIOS.items()}

    def build(self) -> None:
        """Nothing on disk: NVML is served by the fake backend (Simulation.nvml_backend)."""


SOURCE = NvmlSimSource
