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

# Where an entry comes from (XidInfo.source). CAT: NVIDIA's Ampere+ XID catalog (its "Catalog" sheet,
# as leptonai/gpud's catalog_generated.go mirrors it, generated 2025-10-29); OLD: NVIDIA's older XID
# table (r555, Sep 2024, kept in gpud's history) for the cause flags; DECODE: the catalog's "XID
# 144-150 Decode" sheet (exporter/xid/nvlink_table.py); NVLINK_ERR: the catalog's WORKFLOW_NVLINK_ERR
# text (XID 74's registers, quoted in NVIDIA/NVSentinel #364); MEM: NVIDIA's GPU memory error
# management guide; GPUD: leptonai/gpud's xid.go (codes newer than the catalog above).
SOURCES = {
    "CAT": "NVIDIA XID catalog, docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html "
           "(via leptonai/gpud catalog_generated.go, 2025-10-29)",
    "OLD": "NVIDIA's XID table r555 (Sep 2024), cause flags",
    "DECODE": "NVIDIA XID catalog, sheet \"XID 144-150 Decode\"",
    "NVLINK_ERR": "NVIDIA XID catalog, WORKFLOW_NVLINK_ERR (XID 74 registers)",
    "MEM": "NVIDIA GPU memory error management, docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/",
    "GPUD": "leptonai/gpud components/accelerator/nvidia/xid/xid.go (after the catalog above)",
}


@dataclass(frozen=True)
class XidInfo:
    xid: int
    meaning: str
    cause: str
    nvidia_action: str
    source: str = "CAT+OLD"  # keys of SOURCES joined by "+"


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
    XidInfo(74, "NVLink error (Hopper NVLink4: decoded by its registers)", "H,D,B", "WORKFLOW_NVLINK_ERR",
            "CAT+OLD+NVLINK_ERR"),
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
    *(XidInfo(x, f"NVLink5 {unit} error (Blackwell: decoded by unit, status, interrupt info)", "NVLink",
              "WORKFLOW_NVLINK5_ERR", "CAT+DECODE")
      for x, unit in zip(range(144, 151), ("SAW", "RLW", "TLW", "TREX", "NVLPW", "NETIR", "MSE"),
                         strict=True)),
    XidInfo(151, "Key rotation error (confidential computing)", "D", "RESTART_VM"),
    XidInfo(154, "GPU recovery action changed (follow the action it names)", "meta", "XID_154", "CAT"),
    XidInfo(155, "NVLink software-defined error", "D", "RESET_GPU"),
    XidInfo(156, "Resource retirement event", "H", "RESET_GPU"),
    XidInfo(157, "Resource retirement failure", "H", "IGNORE"),
    XidInfo(158, "GPU fatal timeout", "H,D", "RESET_GPU"),
    XidInfo(160, "Channel retirement event (memory marked for repair)", "H", "IGNORE", "CAT+MEM"),
    XidInfo(161, "Channel retirement failure", "H", "IGNORE"),
    XidInfo(171, "Uncorrectable DRAM error (detail for XID 48)", "H", "WORKFLOW_XID_48", "CAT+MEM"),
    XidInfo(172, "Uncorrectable SRAM error (detail for XID 48)", "H", "WORKFLOW_XID_48", "CAT+MEM"),
    # Codes of the catalog that NVIDIA's older table did not have (no cause flags), Blackwell's among
    # them (152-170), and 173 from after it.
    XidInfo(11, "Invalid or corrupted push buffer stream (GR missing HW)", "", "RESTART_APP", "CAT"),
    XidInfo(14, "Fake or injected error from userspace", "", "IGNORE", "CAT"),
    XidInfo(25, "Invalid or illegal push buffer stream", "", "RESTART_APP", "CAT"),
    XidInfo(37, "Driver firmware error (FECS unimplemented firmware method)", "", "IGNORE", "CAT"),
    *(XidInfo(x, f"Copy engine {i} exception", "", "RESTART_APP", "CAT")
      for i, x in enumerate((39, 40, 41))),
    XidInfo(44, "Graphics engine fault during context switch", "", "IGNORE", "CAT"),
    XidInfo(54, "Auxiliary power is not connected to the GPU board", "", "CHECK_MECHANICALS", "CAT"),
    XidInfo(60, "Video processor exception (SEC2)", "", "RESTART_APP", "CAT"),
    XidInfo(66, "Illegal register access by the driver (FECS)", "", "IGNORE", "CAT"),
    XidInfo(67, "Illegal access by the driver (FECS verification)", "", "IGNORE", "CAT"),
    *(XidInfo(x, f"Copy engine {i} error", "", "RESTART_APP", "CAT")
      for i, x in ((3, 70), (4, 71), (5, 72), (6, 75), (7, 76), (8, 77), (9, 85), (10, 126), (11, 127),
                   (12, 128), (13, 129), (14, 130), (15, 131), (16, 132), (17, 133), (18, 134), (19, 135))),
    *(XidInfo(x, f"NVDEC{i} error", "", "RESTART_APP", "CAT")
      for i, x in ((1, 83), (2, 84), (3, 88), (4, 89), (5, 96), (6, 97), (7, 98))),
    *(XidInfo(x, f"NVJPG{i} error", "", "RESTART_APP", "CAT")
      for i, x in ((0, 82), (1, 99), (2, 100), (3, 101), (4, 102), (5, 103), (6, 104), (7, 105))),
    XidInfo(86, "OFA exception", "", "RESTART_APP", "CAT"),
    XidInfo(93, "Non-fatal violation of the provisioned InfoROM wear limit", "", "IGNORE", "CAT"),
    XidInfo(106, "SMBPBI test message", "", "IGNORE", "CAT"),
    XidInfo(107, "SMBPBI test message (silent)", "", "IGNORE", "CAT"),
    XidInfo(108, "NVLink remote translation error (sympathetic; see XID 137)", "", "IGNORE", "CAT"),
    XidInfo(139, "OFA1 error", "", "RESTART_APP", "CAT"),
    XidInfo(141, "CUDA fast path error", "", "IGNORE", "CAT"),
    XidInfo(142, "NVENC3 error", "", "CONTACT_SUPPORT", "CAT"),
    XidInfo(152, "DLA SMMU error", "", "IGNORE", "CAT"),
    XidInfo(153, "DLA timeout error", "", "IGNORE", "CAT"),
    XidInfo(159, "CHI non-data error (sympathetic; check UVM)", "", "CHECK_UVM", "CAT"),
    XidInfo(162, "Power smoothing circuitry capability re-engaged", "", "(none given)", "CAT"),
    XidInfo(163, "Power smoothing circuitry capability disengaged", "", "(none given)", "CAT"),
    XidInfo(164, "Power smoothing circuitry low lifetime reached", "", "(none given)", "CAT"),
    XidInfo(165, "Power smoothing circuitry lifetime exhausted", "", "(none given)", "CAT"),
    XidInfo(167, "PCIe fatal timeout", "", "(none given)", "CAT"),
    XidInfo(168, "Reduced GPU memory capacity (errors in the write-protected region)", "", "(none given)",
            "CAT"),
    XidInfo(169, "Internal micro-controller halt (SEC2)", "", "(none given)", "CAT"),
    XidInfo(173, "C2C (Grace-GPU) fatal link failure", "", "(not in the catalog; gpud: reboot)", "GPUD"),
]

CATALOG: dict[int, XidInfo] = {e.xid: e for e in _ENTRIES}

# NVIDIA numbers XIDs from 1 to about 200; a number past 3 digits is a corrupted line, and would
# be an unbounded label value.
XID_MIN, XID_MAX = 1, 999


def valid_xid(xid: int) -> bool:
    return XID_MIN <= xid <= XID_MAX


def lookup(xid: int) -> XidInfo | None:
    return CATALOG.get(xid)
