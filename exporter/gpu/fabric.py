"""GPU fabric state (nvmlDeviceGetGpuFabricInfoV) decoded from the backend's plain dict. Pure.

On Hopper with NVSwitches every GPU registers with the Fabric Manager; until it has, CUDA fails
to start (error 802, "system not yet initialized"). NVML reports the registration `state`, its
`status` (an NVML return code, meaningful once the state is completed), the clique id, and on
newer drivers a health mask (docs/fabric.md has the table). State 0, NOT_SUPPORTED, is what a GPU
without an NVLink fabric answers (a single passthrough GPU, PCIe parts): absent, not a fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# nvmlGpuFabricState_t
STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
COMPLETED = 3

# healthMask fields: name -> (shift, width); the value 1 means TRUE (the problem is there), 2 FALSE,
# 0 not supported (NVML_GPU_FABRIC_HEALTH_MASK_* in nvml.h).
HEALTH_FIELDS = {
    "degraded_bandwidth": (0, 0x3),
    "route_recovery": (2, 0x3),
    "route_unhealthy": (4, 0x3),
    "access_timeout_recovery": (6, 0x3),
}
INCORRECT_CONFIGURATION = (8, 0xF)  # 0 n/s, 1 none, 2.. a reason
HEALTH_SUMMARY = {1: "healthy", 2: "unhealthy", 3: "limited_capacity"}  # 0: not supported


@dataclass(frozen=True)
class FabricInfo:
    state: str  # one of STATES' values
    status: int | None  # NVML return code once completed, else None
    clique_id: int = 0
    cluster_uuid: str = ""
    # problem -> True (present) / False (absent); only the ones the driver reports
    health: dict[str, bool] = field(default_factory=dict)
    summary: str = ""  # healthy, unhealthy, limited_capacity; "" when not reported

    @property
    def supported(self) -> bool:
        return self.state != "not_supported"

    @property
    def completed(self) -> bool:
        return self.state == "completed"


def decode(raw: dict[str, Any]) -> FabricInfo:
    """The backend's result ({state, status, cliqueId, clusterUuid, healthMask, healthSummary})."""
    state = STATES.get(int(raw.get("state", 0)) & 0xFF, "not_supported")  # C type is one byte
    status = int(raw.get("status", 0)) if state == "completed" else None
    mask = int(raw.get("healthMask") or 0)
    health: dict[str, bool] = {}
    for name, (shift, width) in HEALTH_FIELDS.items():
        v = (mask >> shift) & width
        if v in (1, 2):
            health[name] = v == 1
    conf = (mask >> INCORRECT_CONFIGURATION[0]) & INCORRECT_CONFIGURATION[1]
    if conf:
        health["incorrect_configuration"] = conf > 1
    uuid = raw.get("clusterUuid") or ""
    if isinstance(uuid, list):  # the capture's form of a uint8 array
        uuid = bytes(int(b) & 0xFF for b in uuid).hex()
    uuid = "" if set(str(uuid)) <= {"0"} else str(uuid)  # all zero: no cluster (Hopper)
    return FabricInfo(state, status, int(raw.get("cliqueId") or 0), uuid, health,
                      HEALTH_SUMMARY.get(int(raw.get("healthSummary") or 0), ""))
