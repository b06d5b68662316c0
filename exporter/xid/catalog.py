"""The XID catalog: meaning, likely cause and NVIDIA's recommended action for each code.

Sources: NVIDIA's Ampere+ XID catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html)
for the action buckets, NVIDIA's older XID table for the cause flags (H hardware, D driver, A user
application, B bus, T thermal, FB framebuffer, SM system memory). `nvidia_action` is the catalog's
immediate action; RESTART_APP = restart the application, RESET_GPU = `nvidia-smi -r` (reboot if it
persists), RESTART_BM = power-cycle the node, IGNORE = no action, WORKFLOW_* = follow the named
workflow. The tier each code lands in is the policy's business (policy.py), not the catalog's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class XidInfo:
    xid: int
    meaning: str
    cause: str
    nvidia_action: str


def _e(xid: int, meaning: str, cause: str, action: str) -> XidInfo:
    return XidInfo(xid, meaning, cause, action)


_ENTRIES = [
    _e(8, "GPU stopped processing (FIFO idle timeout)", "D,A,B,T", "RESTART_APP"),
    _e(13, "Graphics engine exception (one line per SM when it floods)", "A (mostly)", "RESTART_APP"),
    _e(31, "GPU memory page fault (MMU fault)", "A,D,H", "RESTART_APP"),
    _e(32, "Invalid or corrupted push buffer stream (PBDMA)", "D,SM,B,T,FB", "RESTART_APP"),
    _e(38, "Driver firmware error (FECS watchdog)", "D", "IGNORE"),
    _e(43, "GPU stopped processing (reset channel verification)", "D,A", "IGNORE"),
    _e(45, "Preemptive cleanup after a previous error", "D,A", "WORKFLOW_XID_45"),
    _e(46, "GPU stopped processing (timeout)", "D", "RESET_GPU"),
    _e(48, "Double-bit ECC error (DBE)", "H", "WORKFLOW_XID_48"),
    _e(56, "Display engine error", "H,D", "CONTACT_SUPPORT (unused on Ampere+)"),
    _e(57, "Error programming video memory interface", "H,D", "CONTACT_SUPPORT (unused on Ampere+)"),
    _e(58, "Unstable video memory interface", "H,D", "CONTACT_SUPPORT (unused on Ampere+)"),
    _e(61, "Internal micro-controller breakpoint/warning (PMU)", "H,D",
       "CONTACT_SUPPORT (unused on Ampere+)"),
    _e(62, "Internal micro-controller halt (PMU)", "H,D,T", "RESET_GPU"),
    _e(63, "Row remapping / page retirement recorded (ECC)", "H,D,FB", "IGNORE"),
    _e(64, "Row remapping / page retirement recording failed", "H,D", "RESET_GPU"),
    _e(65, "Video processor exception", "H,D", "CONTACT_SUPPORT (unused on Ampere+)"),
    _e(68, "NVDEC0 exception", "H,D,A", "RESTART_APP"),
    _e(69, "Graphics engine class error", "H,D", "RESTART_APP"),
    _e(73, "NVENC2 error", "H,D", "CONTACT_SUPPORT (unused on Ampere+)"),
    _e(74, "NVLink error", "H,D,B", "WORKFLOW_NVLINK_ERR"),
    _e(79, "GPU has fallen off the bus", "H,D,SM,B,T", "RESTART_BM"),
    _e(80, "Corrupted data sent to GPU (push-buffer CRC mismatch)", "H,D,SM,B,FB", "RESTART_APP"),
    _e(81, "VGA subsystem error", "H", "CONTACT_SUPPORT (unused on Ampere+)"),
    _e(92, "High single-bit ECC error rate", "H,D", "IGNORE"),
    _e(94, "Contained uncorrectable memory error (ECC)", "H,D,FB", "RESTART_APP"),
    _e(95, "Uncontained uncorrectable memory error (ECC)", "H,D,FB", "RESET_GPU"),
    _e(109, "Context switch timeout", "H,D,A,B,T,FB", "RESET_GPU"),
    _e(110, "Security fault", "H", "RESET_GPU"),
    _e(119, "GSP RPC timeout", "H,D,SM,B,T,FB", "RESET_GPU"),
    _e(120, "GSP error", "H,D,SM,B,T,FB", "RESET_GPU"),
    _e(121, "C2C (Grace-GPU) link error", "H,B", "IGNORE"),
    _e(122, "SPI PMU RPC read failure", "H,D", "CONTACT_SUPPORT (unused on Ampere+)"),
    _e(123, "SPI PMU RPC write failure", "H,D", "CONTACT_SUPPORT (unused on Ampere+)"),
    _e(136, "NVLink ALI training failed", "H", "RESET_GPU"),
    _e(137, "NVLink FLA privilege error (illegal peer access by the application)", "A", "IGNORE"),
    _e(140, "Unrecovered ECC error escape", "H,D,FB", "RESET_GPU"),
    _e(143, "GPU initialization error", "H,D,FB", "RESET_GPU"),
    _e(144, "NVLink5 SAW error", "NVLink", "WORKFLOW_NVLINK5_ERR"),
    _e(145, "NVLink5 RLW error", "NVLink", "WORKFLOW_NVLINK5_ERR"),
    _e(146, "NVLink5 TLW error", "NVLink", "WORKFLOW_NVLINK5_ERR"),
    _e(147, "NVLink5 TREX error", "NVLink", "WORKFLOW_NVLINK5_ERR"),
    _e(148, "NVLink5 NVLPW error", "NVLink", "WORKFLOW_NVLINK5_ERR"),
    _e(149, "NVLink5 NETIR error", "NVLink", "WORKFLOW_NVLINK5_ERR"),
    _e(150, "NVLink5 MSE error", "NVLink", "WORKFLOW_NVLINK5_ERR"),
    _e(151, "Key rotation error (confidential computing)", "D", "RESTART_VM"),
    _e(154, "GPU recovery action changed (follow the action it names)", "meta", "XID_154_EVAL"),
    _e(155, "NVLink software-defined error", "D", "RESET_GPU"),
    _e(156, "Resource retirement event", "H", "RESET_GPU"),
    _e(157, "Resource retirement failure", "H", "IGNORE"),
    _e(158, "GPU fatal timeout", "H,D", "RESET_GPU"),
    _e(160, "Channel retirement event (memory marked for repair)", "H", "RESTART_BM"),
    _e(161, "Channel retirement failure", "H", "IGNORE"),
    _e(171, "Uncorrectable DRAM error (detail for XID 48)", "H", "WORKFLOW_XID_48"),
    _e(172, "Uncorrectable SRAM error (detail for XID 48)", "H", "WORKFLOW_XID_48"),
]

CATALOG: dict[int, XidInfo] = {e.xid: e for e in _ENTRIES}

# XID 154's recovery-action codes (NVML field 230 values), by hex code.
RECOVERY_ACTIONS = {
    0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_and_reset",
    5: "recover_imex_domain", 6: "bus_reset", 7: "system_reboot",
}


def lookup(xid: int) -> XidInfo | None:
    return CATALOG.get(xid)
