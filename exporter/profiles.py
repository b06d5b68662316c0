"""What each supported EC2 instance type has: GPUs, their model, and EFA devices.

Used for the expected counts on a real node (when config leaves them unset) and for the
simulated nodes. Sources: AWS instance type pages and the EFA reference (docs/efa.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    instance_type: str
    gpus: int
    gpu_model: str  # NVML device name
    gpu_memory_bytes: int
    nvlinks: int  # NVLink links per GPU (0 on PCIe parts)
    efa_devices: int


GiB = 1024**3

PROFILES: dict[str, Profile] = {
    p.instance_type: p
    for p in (
        Profile("p4d.24xlarge", 8, "NVIDIA A100-SXM4-40GB", 40 * GiB, 12, 4),
        Profile("p4de.24xlarge", 8, "NVIDIA A100-SXM4-80GB", 80 * GiB, 12, 4),
        Profile("p5.48xlarge", 8, "NVIDIA H100 80GB HBM3", 80 * GiB, 18, 32),
        Profile("p5e.48xlarge", 8, "NVIDIA H200", 141 * GiB, 18, 32),
        Profile("p5en.48xlarge", 8, "NVIDIA H200", 141 * GiB, 18, 16),
        Profile("p6-b200.48xlarge", 8, "NVIDIA B200", 180 * GiB, 18, 8),
    )
}

SIMULATED = ("p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p4d.24xlarge")


def lookup(instance_type: str | None) -> Profile | None:
    return PROFILES.get(instance_type or "")
