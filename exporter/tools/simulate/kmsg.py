"""The simulated node's kernel log: root/dev/kmsg is a regular file of /dev/kmsg records.

At build it holds a boot backlog like a real GPU node's: kernel lines, the NVIDIA module loading
and one `NVRM: GPU at PCI:...: GPU-<uuid>` line per GPU (the same PCI ids and UUIDs as the fake
NVML), plus user-space records (prio >= 8). The `xid-*` scenarios append the driver's records
ONSET_S seconds after start, so the follower must pick them up live. The `gpu-*` NVML scenarios
that raise an XID also get the kernel line the driver would log, so one XID arrives from both
sources, as on a real node. Record timestamps are time.monotonic() (seconds since boot on Linux),
which is also the clock the XID code gives NVML events.
"""

from __future__ import annotations

import os
import time
import uuid as uuidlib
from pathlib import Path

from exporter.nvml.fake import new_uuid
from exporter.profiles import Profile
from exporter.tools.simulate.nvml_synth import P5_BUSES
from exporter.tools.simulate.source import SimSource

ONSET_S = 3.0
SMS = 132  # H100 SXM streaming multiprocessors: an XID 13 flood logs ~3 lines per SM


def gpu_pci(index: int) -> str:
    """The kernel's form of simulated GPU `index`'s PCI address (as in `NVRM: Xid (PCI:...)`)."""
    return f"0000:{P5_BUSES[index % len(P5_BUSES)]:02x}:00"


def gpu_uuid(profile: Profile, index: int) -> str:
    return new_uuid(f"{profile.instance_type}/{index}")


def xid_line(index: int, xid: int, text: str, pid: int | str | None = None, name: str | None = None) -> str:
    who = f", pid={pid}" if pid is not None else ""
    who += f", name={name}" if name else ""
    return f"NVRM: Xid (PCI:{gpu_pci(index)}): {xid}{who}, {text}"


def bus_loss_lines(index: int) -> list[str]:
    """What the driver logs when a GPU falls off the bus: the XID 79 line, the multi-line notice
    and the single-line form (all one event)."""
    bus = gpu_pci(index)
    return [
        xid_line(index, 79, "GPU has fallen off the bus.", pid="'<unknown>'", name="<unknown>"),
        f"NVRM: GPU {bus}.0: GPU has fallen off the bus.",
        f"NVRM: The NVIDIA GPU {bus}.0",
        "NVRM: (PCI ID: 10de:2330) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
    ]


def xid13_flood(index: int, sms: int = SMS, pid: int = 4242) -> list[str]:
    out = []
    for sm in range(sms):
        gpc, tpc = sm // 18, (sm // 2) % 9
        where = f"(GPC {gpc}, TPC {tpc}, SM {sm % 2})"
        out.append(xid_line(index, 13, f"Graphics SM Warp Exception on {where}: Out Of Range Address",
                            pid, "python3"))
        out.append(xid_line(index, 13, f"Graphics SM Global Exception on {where}: Multiple Warp Errors",
                            pid, "python3"))
        out.append(xid_line(index, 13, f"Graphics Exception: ESR 0x{0x504648 + sm * 0x800:x}=0x1000e "
                            "0x504650=0x20 0x504644=0xd3eff2 0x50464c=0x17f", pid, "python3"))
    return out


# NVSwitch PCI buses of an HGX H100 baseboard (Fabric Manager user guide's lspci example: four
# bridges 07:00.0 ... 0a:00.0); used for every profile's switches.
NVSWITCH_BUSES = (0x07, 0x08, 0x09, 0x0A)


def sxid_line(switch: int, sxid: int, body: str) -> str:
    """One NVSwitch SXid line as the driver prints it (NVSWITCH_PRINT_SXID)."""
    bus = NVSWITCH_BUSES[switch % len(NVSWITCH_BUSES)]
    return f"nvidia-nvswitch{switch}: SXid (PCI:0000:{bus:02x}:00.0): {sxid:05d}, {body}"


def sxid_nonfatal_burst(switch: int = 2, count: int = 24) -> list[str]:
    """TX replays on a few links of one switch, each with its error-log dump (one report each)."""
    out = []
    for i in range(count):
        link = (8, 9, 26, 27)[i % 4]
        first = " (First)" if i == 0 else ""
        out.append(sxid_line(switch, 20001, f"Non-fatal, Link {link:02d} TX Replay Error{first}"))
        out.append(sxid_line(switch, 20001, f"Severity 0 Engine instance {link:02d} Sub-engine instance 00"))
        out.append(sxid_line(switch, 20001, "Data {0x00000001, 0x00000000, 0x00000000, 0x00000000, "
                                            "0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000}"))
    return out


def sxid_fatal(gpu: int) -> list[str]:
    """A link going down on switch 1 (LTSSM fault up) with its dump, and the NVLink XID the fatal
    error propagates to on the GPU behind that access port (Fabric Manager guide)."""
    return [
        sxid_line(1, 20034, "Fatal, Link 48 LTSSM Fault Up (First)"),
        sxid_line(1, 20034, "Severity 1 Engine instance 48 Sub-engine instance 00"),
        sxid_line(1, 20034, "Data {0x10000000, 0x10000000, 0x00000000, 0x10000000, 0x00000000, 0x00000000, "
                            "0x00000000, 0x00000000, 0x00000000}"),
        xid_line(gpu, 74, "NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"),
    ]


def _scenario_lines(name: str) -> list[str]:
    """The driver's messages a scenario appends at its onset (none for scenarios of other sources)."""
    from exporter.tools.simulate.nvml_scenarios import FAULTY_GPU as F

    return {
        "xid-63": [xid_line(2, 63, "Row Remapper: New row (0x0000000000ab12c0) marked for remapping, reset "
                            "gpu to activate.", pid="'<unknown>'", name="<unknown>")],
        "xid-79-bus-loss": bus_loss_lines(5),
        "xid-13-flood": xid13_flood(0),
        "xid-94": [xid_line(1, 94, "Contained: CE User Channel (0x9). RST: No, D-RST: No", 7194, "python3")],
        "sxid-nonfatal-burst": sxid_nonfatal_burst(),
        "sxid-fatal": sxid_fatal(F),
        "xid-154": [xid_line(6, 154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot "
                             "Required)")],
        # NVSentinel issue #1357's line and a BER event (gpud's tests): Nonfatal, never a node action
        "xid-nvlink-nonfatal": [
            xid_line(3, 145, "RLW_SRC_TRACK Nonfatal XC1 i0 Link 17 (0x04084507 0x00000004 0x00000000 "
                             "0x00000000 0x00000000 0x00000000"),
            xid_line(3, 149, "NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 (0x00086226 0x00000001 0x00000000 "
                             "0x00000000 0x00000000 0x00000000)")],
        # the kernel lines of the NVML scenarios (exporter/tools/simulate/nvml_scenarios.py) that raise an XID
        "gpu-lost": bus_loss_lines(F),
        "gpu-ecc-dbe": [xid_line(F, 48, "An uncorrectable double bit error (DBE) has been detected on "
                                 "GPU in the framebuffer at partition 6, subpartition 0.")],
        "gpu-row-remap-pending": [xid_line(F, 63, "Row Remapper: New row (0x00000000001f0a40) marked for "
                                           "remapping, reset gpu to activate.")],
        "gpu-row-remap-failure": [xid_line(F, 64, "Row Remapper: Failed to remap row (0x00000000001f0a40), "
                                           "bank already has 8 uncorrectable remaps.")],
        "gpu-nvlink-errors": [xid_line(F, 74, "NVLink: fatal error detected on link 7(0x10000, 0x0, 0x0, "
                                       "0x0, 0x0, 0x0, 0x0)")],
        "gpu-recovery-action-reboot": [xid_line(F, 154, "GPU recovery action changed from 0x0 (None) to "
                                                "0x2 (Node Reboot Required)")],
    }.get(name, [])


class KmsgSimSource(SimSource):
    name = "kmsg"
    scenarios = {
        "xid-63": f"GPU 2 logs XID 63 (row remap recorded) after {ONSET_S:g}s: replace tier by default",
        "xid-79-bus-loss": f"GPU 5 falls off the bus after {ONSET_S:g}s: XID 79 line plus the single- and "
                           "multi-line bus-loss notices, counted as one XID 79 (reboot tier)",
        "xid-13-flood": f"GPU 0 logs an XID 13 flood after {ONSET_S:g}s ({SMS * 3} lines, one event; "
                        "application tier)",
        "xid-94": f"GPU 1 logs XID 94 (contained uncorrectable ECC) after {ONSET_S:g}s",
        "xid-154": f"GPU 6 logs XID 154, recovery action changed to 0x2 (node reboot), after {ONSET_S:g}s",
        "xid-31-backlog": "GPU 4 logged an XID 31 (application page fault) before the exporter started",
        "xid-nvlink-nonfatal": f"GPU 3 logs two Nonfatal NVLink5 XIDs (145 RLW_SRC_TRACK, 149 "
                               f"NETIR_BER_EVENT) after {ONSET_S:g}s: nonfatal tier, the node stays healthy",
        "sxid-nonfatal-burst": f"NVSwitch 2 logs 24 non-fatal SXid 20001 (TX replay) reports on four links, "
                               f"each with its Severity and Data lines, after {ONSET_S:g}s: 24 counts, "
                               "ignore tier",
        "sxid-fatal": f"NVSwitch 1 logs fatal SXid 20034 (LTSSM fault up, link 48) with its dump after "
                      f"{ONSET_S:g}s, and GPU 3 the NVLink XID 74 it propagates to: node reboot_required",
    }

    def __init__(self, root: Path, profile: Profile, scenarios: set[str]) -> None:
        super().__init__(root, profile, scenarios)
        self.all_scenarios = set(scenarios)
        self.path = root / "dev" / "kmsg"
        self.seq = 0
        self.fired = False

    def _record(self, message: str, usec: int, prio: int = 4, flags: str = "-") -> str:
        """One record. The driver's lines after the module load carry flag `c` (a fragment), as in
        the real H200 capture (tests/fixtures/kmsg/kmsg_nvidia.txt)."""
        rec = f"{prio},{self.seq},{usec},{flags};{message}\n"
        self.seq += 1
        return rec

    def build(self) -> None:
        now_us = int(time.monotonic() * 1e6)
        boot_us = max(1, now_us // 1000)  # boot lines early in this "boot"
        lines = [
            self._record("Linux version 6.8.0-1021-aws (buildd@lcy02-amd64-046) (gcc 13.2.0) #23-Ubuntu SMP",
                         0, 5),
            self._record("Command line: BOOT_IMAGE=/vmlinuz-6.8.0-1021-aws root=PARTUUID=0 ro console=ttyS0",
                         0, 6),
            self._record("nvidia: loading out-of-tree module taints kernel.", boot_us, 4),
            self._record("nvidia-nvlink: Nvlink Core is being initialized, major device number 234",
                         boot_us, 6),
            self._record("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build",
                         boot_us + 20, 3),
        ]
        for i in range(self.profile.gpus):
            t = boot_us + 1_000_000 + i * 1000
            at = f"NVRM: GPU at PCI:{gpu_pci(i)}: {gpu_uuid(self.profile, i)}"
            lines.append(self._record(at, t, 4, "c"))
            serial = 1653924043000 + 17 * (i + 1)
            lines.append(self._record(f"NVRM: GPU Board Serial Number: {serial}", t + 5, 4, "c"))
        lines.append(self._record("systemd[1]: Started nvidia-persistenced.service - NVIDIA Persistence "
                                  "Daemon.", boot_us + 9_000_000, 30))
        if "xid-31-backlog" in self.active:
            lines.append(self._record(
                xid_line(4, 31, "channel 0x0000000a, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC1 "
                         "GPCCLIENT_T1_4 faulted @ 0xde_ad000000. Fault is of type FAULT_PDE "
                         "ACCESS_TYPE_VIRT_WRITE", 446, "python3"), boot_us + 60_000_000, 4, "c"))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(lines))
        boot_id = self.root / "proc" / "sys" / "kernel" / "random" / "boot_id"
        if not boot_id.exists():
            boot_id.parent.mkdir(parents=True, exist_ok=True)
            # stable per profile: `check`/`ack` runs against one simulated node with a shared
            # --path.state-dir see the same boot, whatever scenario flags each run has (an ack
            # made with other flags would otherwise belong to another boot and be ignored)
            seed = self.profile.instance_type
            boot_id.write_text(str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, seed)) + "\n")

    def advance(self, elapsed_s: float) -> None:
        if self.fired or elapsed_s < ONSET_S:
            return
        self.fired = True
        msgs = [m for name in sorted(self.all_scenarios) for m in _scenario_lines(name)]
        if not msgs:
            return
        now_us = int(time.monotonic() * 1e6)
        data = "".join(self._record(m, now_us + i, flags="c") for i, m in enumerate(msgs))
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, data.encode())
        finally:
            os.close(fd)


SOURCE = KmsgSimSource
