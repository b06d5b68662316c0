"""Simulated EFA devices: a sysfs tree laid out like a real node's, with counters that advance.

The layout mirrors real sysfs: the RDMA device sits under its PCI function
(devices/pci0000:00/<addr>/infiniband/<name>), class/infiniband/<name> links to it, the PCI
function has vendor/device files and a driver link to bus/pci/drivers/efa. Names follow
rdma-core's persistent naming (rdmap<bus>s<slot>, decimal). Which counter files exist follows
the kernel version the profile models (see KERNEL_FILES). `write_device` is also used by the
tests and the benchmark to lay out other kernels and non-EFA devices.

Assumptions of the simulation (not facts about AWS): the PCI device ids per instance family
(p4d 0xefa1, p5/p5e 0xefa2, p5en 0xefa3), the bus numbers, the per-device link speeds and the
kernels (p5 family 6.17 with network counters, p4d 6.1 without RDMA write or network counters).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from exporter.profiles import Profile
from exporter.tools.simulate import job
from exporter.tools.simulate.source import SimSource

BASIC = ["tx_bytes", "tx_pkts", "rx_bytes", "rx_pkts", "rx_drops"]
MESSAGES = ["send_bytes", "send_wrs", "recv_bytes", "recv_wrs",
            "rdma_read_wrs", "rdma_read_bytes", "rdma_read_wr_err", "rdma_read_resp_bytes"]
RDMA_WRITE = ["rdma_write_wrs", "rdma_write_bytes", "rdma_write_wr_err", "rdma_write_recv_bytes"]
NETWORK = ["retrans_bytes", "retrans_pkts", "retrans_timeout_events", "unresponsive_remote_events",
           "impaired_remote_conn_events"]
DEVICE_5_4 = ["submitted_cmds", "completed_cmds", "no_completion_cmds", "keep_alive_rcvd", "alloc_pd_err",
              "create_qp_err", "reg_mr_err", "alloc_ucontext_err", "create_ah_err"]
DEVICE_5_8 = DEVICE_5_4 + ["cmds_err", "create_cq_err", "mmap_err"]


def kernel_files(kernel: tuple[int, int]) -> tuple[list[str], list[str], bool]:
    """(port counter files, device counter files, combined layout) of an upstream kernel."""
    port = list(BASIC)
    if kernel >= (5, 10):
        port += MESSAGES
    if kernel >= (6, 6):
        port += RDMA_WRITE
    if kernel >= (6, 17):
        port += NETWORK
    device = DEVICE_5_8 if kernel >= (5, 8) else DEVICE_5_4
    return port, device, kernel < (5, 15)


def _write(path: Path, text: str) -> None:
    """Overwrite a counter file in place with one write() (creating files is slow on some file
    systems, and this runs every tick for ~500 files). Counters only grow, so the new text is never
    shorter than the old and no truncation is needed; a scrape racing the write reads digits either
    way."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def write_device(sys_root: Path, name: str, pci_address: str, *, vendor: str = "0x1d0f",
                 device_id: str = "0xefa2", driver: str | None = "efa", kernel: tuple[int, int] = (6, 17),
                 rate: str = "100 Gb/sec (4X EDR)", values: dict[str, int] | None = None,
                 lifespan_ms: int = 12, counters: bool = True) -> Path:
    """Lay out one RDMA device under `sys_root`; returns its class/infiniband entry.

    EFA counter files come from `kernel_files(kernel)` with `values` (default 0); pass
    counters=False for a non-EFA device (which gets a Mellanox-style PMA counters/ directory)."""
    values = values or {}
    pci = sys_root / "devices" / "pci0000:00" / pci_address
    pci.mkdir(parents=True, exist_ok=True)
    (pci / "vendor").write_text(vendor + "\n")
    (pci / "device").write_text(device_id + "\n")
    if driver:
        drv = sys_root / "bus" / "pci" / "drivers" / driver
        drv.mkdir(parents=True, exist_ok=True)
        _symlink(pci / "driver", os.path.relpath(drv, pci))
    dev = pci / "infiniband" / name
    port = dev / "ports" / "1"
    port.mkdir(parents=True, exist_ok=True)
    _symlink(dev / "device", "../../../" + pci_address)
    (dev / "node_type").write_text("7: unspecified\n" if counters else "1: CA\n")
    (dev / "fw_ver").write_text("\n" if counters else "28.39.1002\n")
    (dev / "node_guid").write_text("0000:0000:0000:0000\n")
    (port / "state").write_text("4: ACTIVE\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    (port / "rate").write_text(rate + "\n")
    (port / "link_layer").write_text("Unknown\n" if counters else "InfiniBand\n")
    (port / "lid").write_text("0x0\n")
    (port / "lid_mask_count").write_text("1\n")
    if counters:
        port_files, device_files, combined = kernel_files(kernel)
        if combined:
            port_files = device_files = port_files + device_files
        for d, files in ((port / "hw_counters", port_files), (dev / "hw_counters", device_files)):
            d.mkdir(exist_ok=True)
            for f in files:
                (d / f).write_text(f"{values.get(f, 0)}\n")
            (d / "lifespan").write_text(f"{lifespan_ms}\n")
    else:
        (port / "counters").mkdir(exist_ok=True)
        for f in ("port_xmit_data", "port_rcv_data", "symbol_error"):
            (port / "counters" / f).write_text(f"{values.get(f, 0)}\n")
    cls = sys_root / "class" / "infiniband"
    cls.mkdir(parents=True, exist_ok=True)
    _symlink(cls / name, os.path.relpath(dev, cls))
    return cls / name


def _symlink(link: Path, target: str) -> None:
    if link.is_symlink():
        link.unlink()
    link.symlink_to(target)


# Per instance family: (PCI device id, link Gb/s, kernel, buses). Buses in decimal; slot 0.
_P5_BUSES = [b for base in (79, 96, 113, 130, 147, 164, 181, 198) for b in range(base, base + 4)]
FAMILIES: dict[str, tuple[str, int, tuple[int, int], list[tuple[int, int]]]] = {
    "p5": ("0xefa2", 100, (6, 17), [(b, 0) for b in _P5_BUSES]),
    "p5e": ("0xefa2", 100, (6, 17), [(b, 0) for b in _P5_BUSES]),
    "p5en": ("0xefa3", 200, (6, 17), [(b, 0) for b in _P5_BUSES[::2]]),
    "p4d": ("0xefa1", 100, (6, 1), [(16, 27), (32, 27), (144, 27), (160, 27)]),
}

_RATE_NAMES = {100: "4X EDR", 200: "4X HDR", 400: "8X HDR"}

# Steady traffic per device per second (scaled a little per device so devices differ).
_RATES = {
    "tx_bytes": 2_000_000_000, "rx_bytes": 2_000_000_000, "tx_pkts": 250_000, "rx_pkts": 250_000,
    "send_bytes": 400_000_000, "recv_bytes": 400_000_000, "send_wrs": 50_000, "recv_wrs": 50_000,
    "rdma_read_wrs": 30_000, "rdma_read_bytes": 1_500_000_000, "rdma_read_resp_bytes": 1_500_000_000,
    "rdma_write_wrs": 20_000, "rdma_write_bytes": 800_000_000, "rdma_write_recv_bytes": 800_000_000,
    "submitted_cmds": 5, "completed_cmds": 5, "keep_alive_rcvd": 1,
}
_NO_RDMA_WRITE = ("p4d",)  # the files exist on 6.6+, but the hardware lacks RDMA write: they read 0

# Scenario -> per-second increments on the first device.
_FAULT_RATES = {
    "efa-retrans-timeouts": {"retrans_timeout_events": 3, "retrans_pkts": 2_000, "retrans_bytes": 16_000_000},
    "efa-unresponsive-remote": {"unresponsive_remote_events": 1, "impaired_remote_conn_events": 2},
    "efa-rx-drops": {"rx_drops": 150},
    "efa-rdma-errors": {"rdma_read_wr_err": 5, "rdma_write_wr_err": 5},
}
FLAP_PERIOD_S = 15.0


def family(profile: Profile) -> str:
    return profile.instance_type.split(".")[0]


class EfaSim(SimSource):
    name = "efa"
    scenarios = {
        "efa-device-missing": "One EFA device is absent (efa_devices below efa_devices_expected).",
        "efa-device-flapping": f"The third EFA device vanishes and comes back every {FLAP_PERIOD_S:g} s.",
        "efa-retrans-timeouts": "The first EFA device's retransmits and retransmit timeouts rise.",
        "efa-unresponsive-remote": "The first EFA device's unresponsive and impaired remote events rise.",
        "efa-rx-drops": "The first EFA device drops received packets.",
        "efa-rdma-errors": "The first EFA device's RDMA read/write work requests fail.",
        "efa-counters-unreadable": "The second EFA device's port counters cannot be read (as when the "
                                   "driver's admin command fails: efa_device_up 0) and an admin command "
                                   "timed out.",
        "efa-read-hang": "Reading the fourth EFA device's port counters blocks (as when an admin command "
                         "never completes): that device is reported down after efa.device_timeout_seconds.",
        "efa-old-kernel": "The node runs Linux 5.10: one combined counter list, no RDMA write or network "
                          "counters.",
    }

    def __init__(self, root: Path, profile: Profile, scenarios: set[str]) -> None:
        super().__init__(root, profile, scenarios)
        # training-job scenarios (exporter/tools/simulate/job.py): traffic flat while the job waits,
        # retransmits on a degraded node
        self.job = job.job_scenarios(scenarios)
        self.hang_path: Path | None = None
        # A family without a layout here gets no devices (but a complete object).
        no_layout: tuple[str, int, tuple[int, int], list[tuple[int, int]]] = ("0xefa2", 100, (6, 17), [])
        self.device_id, self.gbps, self.kernel, buses = FAMILIES.get(family(profile), no_layout)
        if "efa-old-kernel" in self.active:
            self.kernel = (5, 10)
        self.devices: list[tuple[str, str]] = [  # (name, pci address)
            (f"rdmap{bus}s{slot}", f"0000:{bus:02x}:{slot:02x}.0")
            for bus, slot in buses[: profile.efa_devices]]
        if "efa-device-missing" in self.active and self.devices:
            self.devices.pop()
        self.sys = root / "sys"
        self.port_files, self.device_files, self.combined = kernel_files(self.kernel)

    def configure(self, shape: Any) -> None:
        layout = len(FAMILIES.get(family(self.profile), ("", 0, (0, 0), []))[3])
        if shape.efa_devices is not None and shape.efa_devices > layout:
            raise ValueError(f"--simulate.efa-devices is {shape.efa_devices}; the "
                             f"{self.profile.instance_type} layout has at most {layout} EFA devices")

    def build(self) -> None:
        gbps = self.gbps if self.kernel >= (6, 13) else 100  # older kernels always say 100
        rate = f"{gbps} Gb/sec ({_RATE_NAMES[gbps]})"
        for i, (name, addr) in enumerate(self.devices):
            write_device(self.sys, name, addr, device_id=self.device_id, kernel=self.kernel, rate=rate,
                         values=self._values(i, 0.0))
        if self.devices and family(self.profile) != "p4d":
            (self.sys / "module" / "efa").mkdir(parents=True, exist_ok=True)
            (self.sys / "module" / "efa" / "version").write_text("2.17.1g\n")
        if "efa-counters-unreadable" in self.active and len(self.devices) > 1:
            name, _ = self.devices[1]
            bad = self.sys / "class" / "infiniband" / name / "ports" / "1" / "hw_counters" / "tx_bytes"
            bad.unlink()
            bad.mkdir()  # read() fails (EISDIR), standing in for the EIO of a failed admin command
        if "efa-read-hang" in self.active and len(self.devices) > 3:
            self.hang_path = self.sys / "class" / "infiniband" / self.devices[3][0] / "ports" / "1" / \
                "hw_counters" / "rx_bytes"
            self.hang_path.unlink()
            os.mkfifo(self.hang_path)  # open() blocks until a writer comes: a read that never returns
        self._flapped_out = False

    def _values(self, i: int, t: float) -> dict[str, int]:
        scale = 1.0 + 0.01 * i
        moving = t
        if self.job & job.EFA_FLAT:  # a stalled job's collectives move nothing
            until = float("inf") if "job-xid79" in self.job else job.RECOVER_AT_S
            moving = job.frozen(0.0, 1.0, t, until)
        out = {f: int((1_000_000 * (i + 1) if f in _RATES else 0) + r * scale * moving)
               for f, r in _RATES.items()}
        if i == 0 and "job-efa-degraded" in self.job and t > job.STALL_AT_S:
            degraded = t - job.STALL_AT_S  # 5% of the packets sent again, a timeout every 10 s
            out["retrans_pkts"] = int(0.05 * _RATES["tx_pkts"] * scale * degraded)
            out["retrans_bytes"] = int(0.05 * _RATES["tx_bytes"] * scale * degraded)
            out["retrans_timeout_events"] = int(degraded / 10)
        if family(self.profile) in _NO_RDMA_WRITE:
            for f in RDMA_WRITE:
                out[f] = 0
        if i == 0:
            for sc in self.active & _FAULT_RATES.keys():
                for f, r in _FAULT_RATES[sc].items():
                    out[f] = out.get(f, 0) + int(r * t)
        if i == 1 and "efa-counters-unreadable" in self.active:
            out["no_completion_cmds"] = 1
        return out

    def advance(self, elapsed_s: float) -> None:
        present = set(self.port_files) | set(self.device_files)
        for i, (name, _addr) in enumerate(self.devices):
            dev = self.sys / "class" / "infiniband" / name
            if i == 2 and "efa-device-flapping" in self.active:
                self._flap(name, int(elapsed_s // FLAP_PERIOD_S) % 2 == 1)
            values = self._values(i, elapsed_s)
            for f, v in values.items():
                if f not in present or (v == 0 and f not in _RATES) or (i == 3 and self.hang_path is not None
                                                                        and f == self.hang_path.name):
                    continue
                for where in self._where(f):
                    try:
                        _write(dev / where / f, f"{v}\n")
                    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                        pass  # flapped out, or replaced by a fault scenario

    def _where(self, f: str) -> tuple[str, ...]:
        if self.combined:  # one list shown in both places
            return ("ports/1/hw_counters", "hw_counters")
        return ("ports/1/hw_counters",) if f in self.port_files else ("hw_counters",)

    def _flap(self, name: str, gone: bool) -> None:
        link = self.sys / "class" / "infiniband" / name
        if gone and not self._flapped_out:
            self._target = os.readlink(link)
            link.unlink()
            self._flapped_out = True
        elif not gone and self._flapped_out:
            link.symlink_to(self._target)
            self._flapped_out = False

    def release_hang(self) -> None:
        """Let a read blocked by efa-read-hang finish (it reads an empty file and fails)."""
        if self.hang_path is not None:
            try:
                os.close(os.open(self.hang_path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass  # nobody is blocked on it


SOURCE = EfaSim
