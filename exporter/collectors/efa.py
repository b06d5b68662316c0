"""EFA collector: every driver counter of every EFA device, device facts, per-device up.

Discovery, reading and naming live in exporter.efa; this module adds the samples and keeps one
device's failure from touching the others.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from exporter import imds, node
from exporter.catalog import Families, define
from exporter.collector import Collector, Context
from exporter.config import Key, declare_section, non_negative, positive
from exporter.efa.discovery import Discovery, EfaDevice
from exporter.efa.naming import C
from exporter.efa.reader import DeviceReader, DeviceReading
from exporter.efa.sysfs import SysfsReader
from exporter.efa.workers import Workers

declare_section(C, "EFA devices: counters from <paths.sysfs>/class/infiniband.", {
    "enabled": Key(bool, True, "Run the EFA collector."),
    "expected_devices": Key(int, None, "EFA devices the node should have; from the instance type when "
                            "unset (p4d 4, p5/p5e 32, p5en 16, p6-b200 8).",
                            nullable=True, check=non_negative),
    "timeout_seconds": Key((int, float), None, "Deadline of the EFA collection; the global "
                           "collector_timeout_seconds when unset.", nullable=True, check=positive),
    "device_timeout_seconds": Key((int, float), 2.0,
                                  "Deadline for reading one device; a device past it (a read blocked on "
                                  "an admin command that does not complete) is reported with "
                                  "efa_device_up 0 while the others are served. Keep it under the "
                                  "collector's deadline.", check=positive),
    "read_workers": Key(int, 4, "Threads reading devices in parallel.", check=positive),
})

DEVICES = define("efa_devices", "gauge",
                 "EFA devices found (RDMA devices with an EFA PCI id or bound to the efa driver).",
                 collector=C)
DEVICES_EXPECTED = define(
    "efa_devices_expected", "gauge",
    "EFA devices the node should have: efa.expected_devices, else from the instance type; absent if unknown.",
    collector=C)
DEVICE_UP = define(
    "efa_device_up", "gauge",
    "1 if every file of the device was read and parsed in this scrape, 0 if any read failed (EIO from a "
    "failed admin command, permission denied, device removed mid-scrape); its counters are then absent "
    "for this scrape.", ("device",), collector=C)
INFO = define(
    "efa_info", "gauge",
    "Always 1 per EFA device: its PCI address and PCI device id, and the efa driver version "
    "(/sys/module/efa/version; empty for the in-tree driver, which has none).",
    ("device", "pci_address", "pci_device_id", "driver_version"), collector=C)


class EfaCollector(Collector):
    name = C

    def __init__(self, ctx: Context, reader: SysfsReader | None = None) -> None:
        super().__init__(ctx)
        self.reader = reader or SysfsReader()
        self.sysfs = ctx.config.paths.sysfs
        self.discovery = Discovery(self.sysfs, self.reader)
        self.devices = DeviceReader(self.reader)
        self.workers = Workers(ctx.config.efa.read_workers)
        self._inflight: dict[str, Future] = {}  # device path -> its read, which may outlive a deadline
        self._failing: dict[str, str] = {}  # device -> error, to log state changes only
        self.lookup: imds.IdentityLookup | None = None

    def start(self) -> None:
        self.lookup = imds.ensure_lookup(self.ctx)  # the expected count can come from the instance type

    def close(self) -> None:
        self.workers.close()
        if self.lookup is not None:
            self.lookup.close()

    def expected(self) -> int | None:
        if self.ctx.config.efa.expected_devices is not None:
            return self.ctx.config.efa.expected_devices
        p = node.profile(self.ctx)
        return p.efa_devices if p else None

    def driver_version(self) -> str:
        try:
            return self.reader.read(os.path.join(self.sysfs, "module", "efa", "version")).strip()
        except OSError:
            return ""

    def collect(self, out: Families) -> None:
        devices = self.discovery.discover()
        out.add(DEVICES, len(devices))
        expected = self.expected()
        if expected is not None:
            out.add(DEVICES_EXPECTED, expected)
        out.declare(DEVICE_UP)
        version = self.driver_version() if devices else ""
        failing: dict[str, str] = {}
        for reading in self.read_all(devices):
            dev = reading.device
            out.add(INFO, 1, device=dev.name, pci_address=dev.pci_address, pci_device_id=dev.pci_device_id,
                    driver_version=version)
            if reading.error:
                failing[dev.name] = reading.error
                out.add(DEVICE_UP, 0, device=dev.name)
                continue
            out.add(DEVICE_UP, 1, device=dev.name)
            for spec, value, labels in reading.samples:
                out.add(spec, value, **labels)
        self.devices.forget_except({d.path for d in devices})
        self._log_changes(devices, failing)

    def read_all(self, devices: list[EfaDevice]) -> list[DeviceReading]:
        """Read the devices in parallel, each within device_timeout_seconds. A device whose read from
        an earlier scrape is still blocked is not read again until that read returns."""
        timeout = self.ctx.config.efa.device_timeout_seconds
        futures: list[Future | str] = []
        for dev in devices:
            prev = self._inflight.get(dev.path)
            if prev is not None and not prev.done():
                futures.append(f"a read from an earlier scrape is still blocked (over {timeout:g} s)")
                continue
            fut = self.workers.submit(self.devices.read, dev)
            self._inflight[dev.path] = fut
            futures.append(fut)
        deadline = time.monotonic() + timeout
        out: list[DeviceReading] = []
        for dev, fut in zip(devices, futures, strict=True):
            if isinstance(fut, str):
                out.append(DeviceReading(dev, error=fut))
                continue
            try:
                out.append(fut.result(timeout=max(0.0, deadline - time.monotonic())))
            except FutureTimeout:
                out.append(DeviceReading(dev, error=f"read did not finish within {timeout:g} s"))
            except Exception as e:  # noqa: BLE001 - a reader bug fails the device, not the collector
                out.append(DeviceReading(dev, error=f"{type(e).__name__}: {e}"))
        live = {d.path for d in devices}
        for path in [p for p, f in self._inflight.items() if p not in live and f.done()]:
            del self._inflight[path]
        return out

    def _log_changes(self, devices: list[EfaDevice], failing: dict[str, str]) -> None:
        for name, err in failing.items():
            if self._failing.get(name) != err:
                self.log.warning("EFA device %s unreadable this scrape: %s", name, err)
        for name in self._failing.keys() - failing.keys():
            if any(d.name == name for d in devices):
                self.log.info("EFA device %s readable again", name)
        self._failing = failing


COLLECTOR = EfaCollector
