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


_ENTRIES = [
    XidInfo(8, "GPU stopped processing (FIFO idle timeout)", "D,A,B,T", "RESTART_APP"),
    XidInfo(13, "Graphics engine exception (one line per SM when it floods)", "A (mostly)", "RESTART_APP"),
    XidInfo(31, "GPU memory page fault (MMU fault)", "A,D,H", "RESTART_APP"),
    XidInfo(32, "Invalid or corrupted push buffer stream (PBDMA)", "D,SM,B,T,FB", "RESTART_APP"),
    XidInfo(38, "Driver firmware error (FECS watchdog)", "D", "IGNORE"),
    XidInfo(43, "GPU stopped processing (reset channel verification)", "D,A", "IGNORE"),
    XidInfo(45, "Preemptive cleanup after a previous error", "D,A", "WORKFLOW_XID_45"),
    XidInfo(46, "GPU stopped processing (timeout)", "D", "RESET_GPU"),
    XidInfo(48, "Double-bit ECC error (DBE)", "H", "WORKFLOW_XID_48"),
    XidInfo(56, "Display engine error", "H,D", "CONTACT_SUPPORT (unused on Ampere+)"),
    XidInfo(57, "Error programming video memory interface", "H,D", "CONTACT_SUPPORT (unused on Ampere+)"),
    XidInfo(58, "Unstable video memory interface", "H,D", "CONTACT_SUPPORT (unused on Ampere+)"),
    XidInfo(61, "Internal micro-controller breakpoint/warning (PMU)", "H,D",
            "CONTACT_SUPPORT (unused on Ampere+)"),
    XidInfo(62, "Internal micro-controller halt (PMU)", "H,D,T", "RESET_GPU"),
    XidInfo(63, "Row remapping / page retirement recorded (ECC)", "H,D,FB", "IGNORE"),
    XidInfo(64, "Row remapping / page retirement recording failed", "H,D", "RESET_GPU"),
    XidInfo(65, "Video processor exception", "H,D", "CONTACT_SUPPORT (unused on Ampere+)"),
    XidInfo(68, "NVDEC0 exception", "H,D,A", "RESTART_APP"),
    XidInfo(69, "Graphics engine class error", "H,D", "RESTART_APP"),
    XidInfo(73, "NVENC2 error", "H,D", "CONTACT_SUPPORT (unused on Ampere+)"),
    XidInfo(74, "NVLink error", "H,D,B", "WORKFLOW_NVLINK_ERR"),
    XidInfo(79, "GPU has fallen off the bus", "H,D,SM,B,T", "RESTART_BM"),
    XidInfo(80, "Corrupted data sent to GPU (push-buffer CRC mismatch)", "H,D,SM,B,FB", "RESTART_APP"),
    XidInfo(81, "VGA subsystem error", "H", "CONTACT_SUPPORT (unused on Ampere+)"),
    XidInfo(92, "High single-bit ECC error rate", "H,D", "IGNORE"),
    XidInfo(94, "Contained uncorrectable memory error (ECC)", "H,D,FB", "RESTART_APP"),
    XidInfo(95, "Uncontained uncorrectable memory error (ECC)", "H,D,FB", "RESET_GPU"),
    XidInfo(109, "Context switch timeout", "H,D,A,B,T,FB", "RESET_GPU"),
    XidInfo(110, "Security fault", "H", "RESET_GPU"),
    XidInfo(119, "GSP RPC timeout", "H,D,SM,B,T,FB", "RESET_GPU"),
    XidInfo(120, "GSP error", "H,D,SM,B,T,FB", "RESET_GPU"),
    XidInfo(121, "C2C (Grace-GPU) link error", "H,B", "IGNORE"),
    XidInfo(122, "SPI PMU RPC read failure", "H,D", "CONTACT_SUPPORT (unused on Ampere+)"),
    XidInfo(123, "SPI PMU RPC write failure", "H,D", "CONTACT_SUPPORT (unused on Ampere+)"),
    XidInfo(136, "NVLink ALI training failed", "H", "RESET_GPU"),
    XidInfo(137, "NVLink FLA privilege error (illegal peer access by the application)", "A", "IGNORE"),
    XidInfo(140, "Unrecovered ECC error escape", "H,D,FB", "RESET_GPU"),
    XidInfo(143, "GPU initialization error", "H,D,FB", "RESET_GPU"),
    XidInfo(144, "NVLink5 SAW error", "NVLink", "WORKFLOW_NVLINK5_ERR"),
    XidInfo(145, "NVLink5 RLW error", "NVLink", "WORKFLOW_NVLINK5_ERR"),
    XidInfo(146, "NVLink5 TLW error", "NVLink", "WORKFLOW_NVLINK5_ERR"),
    XidInfo(147, "NVLink5 TREX error", "NVLink", "WORKFLOW_NVLINK5_ERR"),
    XidInfo(148, "NVLink5 NVLPW error", "NVLink", "WORKFLOW_NVLINK5_ERR"),
    XidInfo(149, "NVLink5 NETIR error", "NVLink", "WORKFLOW_NVLINK5_ERR"),
    XidInfo(150, "NVLink5 MSE error", "NVLink", "WORKFLOW_NVLINK5_ERR"),
    XidInfo(151, "Key rotation error (confidential computing)", "D", "RESTART_VM"),
    XidInfo(154, "GPU recovery action changed (follow the action it names)", "meta", "XID_154_EVAL"),
    XidInfo(155, "NVLink software-defined error", "D", "RESET_GPU"),
    XidInfo(156, "Resource retirement event", "H", "RESET_GPU"),
    XidInfo(157, "Resource retirement failure", "H", "IGNORE"),
    XidInfo(158, "GPU fatal timeout", "H,D", "RESET_GPU"),
    XidInfo(160, "Channel retirement event (memory marked for repair)", "H", "RESTART_BM"),
    XidInfo(161, "Channel retirement failure", "H", "IGNORE"),
    XidInfo(171, "Uncorrectable DRAM error (detail for XID 48)", "H", "WORKFLOW_XID_48"),
    XidInfo(172, "Uncorrectable SRAM error (detail for XID 48)", "H", "WORKFLOW_XID_48"),
]

CATALOG: dict[int, XidInfo] = {e.xid: e for e in _ENTRIES}

# NVIDIA numbers XIDs from 1 to about 200; a number past 3 digits is a corrupted line, and would
# be an unbounded label value.
XID_MIN, XID_MAX = 1, 999


def valid_xid(xid: int) -> bool:
    return XID_MIN <= xid <= XID_MAX


def lookup(xid: int) -> XidInfo | None:
    return CATALOG.get(xid)
