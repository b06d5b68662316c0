"""The per-GPU health facts the GPU collector reads each scrape and the verdict consumes.

The GPU collector returns a `NodeGpuHealth` from every collection; the runner hands it to the
health collector (the verdict) of the same collection, which reads it rather than calling NVML
a second time. The one-shot `check` command runs both collectors once the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GpuHealth:
    index: int
    uuid: str
    pci_bus_id: str
    lost: bool = False  # NVML said GPU is lost (XID 79 equivalent)
    row_remap_pending: bool | None = None  # None: not supported / not read
    row_remap_failure: bool | None = None
    recovery_action: int | None = None  # NVML field 230: 0 none, 1 reset, 2 reboot, 3 drain P2P, ...
    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    fabric_state: str | None = None  # exporter.gpu.fabric.STATES; None: not supported / not read
    fabric_status: int | None = None  # NVML return code once completed
    fabric_problems: tuple[str, ...] = ()  # health-mask problems reported present
    # Did NVML answer? `unanswered_s`: seconds since its calls for this GPU first failed to return
    # within gpu.read_timeout_seconds (0 on the first such read), None while it answers.
    # `read_ok`: its health-critical reads succeeded (gpu_read_success 1). Either one unset makes
    # the verdict `unknown` at least (exporter.xid.verdict): a GPU we could not read is never healthy.
    unanswered_s: float | None = None
    read_ok: bool = True


@dataclass
class NodeGpuHealth:
    gpus: dict[int, GpuHealth] = field(default_factory=dict)
    count: int = 0  # GPUs NVML enumerates
    expected: int | None = None  # GPUs the node should have (config or instance type)
    nvml_error: str = ""  # NVML could not be used at all (no driver, no library)
