"""EFA collector: every driver counter of every EFA device, device facts, per-device up, and the
node's totals of the counters the rules read (exporter.efa.node_totals).

Discovery, reading and naming live in exporter.efa; this module adds the samples and keeps one
device's failure from touching the others.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from exporter import deadline, node
from exporter.catalog import Families, MetricSpec, define
from exporter.collector import Collector, Context, ProblemLog
from exporter.config import CollectorSection, non_negative, positive, setting
from exporter.efa.discovery import Discovery, EfaDevice
from exporter.efa.naming import INFO as INFO_ITEM
from exporter.efa.naming import OPT_IN, C, check_counters, counter_set
from exporter.efa.node_totals import DEVICES_UNREADABLE, NodeTotals
from exporter.efa.reader import DeviceReader, DeviceReading
from exporter.efa.sysfs import SysfsReader
from exporter.metric import Sample


@dataclass
class EfaSection(CollectorSection):
    """EFA devices: counters from <paths.sysfs>/class/infiniband."""

    name: ClassVar[str] = C
    enabled: bool = setting(
        True, "Run the EFA collector.")
    expected_devices: int | None = setting(
        None, "EFA devices the node should have; from the instance type when unset (p4d 4, p5/p5e 32, p5en "
        "16, p6-b200 8).", check=non_negative)
    timeout_seconds: float | None = setting(
        None, "Deadline of the EFA collection; the global collector_timeout_seconds when unset.",
        check=positive)
    device_timeout_seconds: float = setting(
        2.0, "Deadline for reading one device, from the start of its read; a device past it (a read "
        "blocked on an admin command that does not complete) is reported with efa_device_up 0 while "
        "the others are served. Keep it under the collector's deadline.", check=positive)
    counters: str | list[str] = setting(
        "default",
        "Which counter files to read and export: default (what the shipped rules and dashboards use "
        "and what locates a fault on a device; docs/efa.md lists them), all (every file the driver "
        "has, names this exporter does not know included), or a list of file names (for example "
        "[tx_bytes, rx_bytes, rdma_read_bytes]; rate, lifespan and info (efa_info) too). Files not "
        "selected are not read.",
        check=check_counters, expected="default, all, or a list of counter file names")
    read_workers: int = setting(
        1, "Retired, ignored (kept so configs that set it still load): one pool thread reads the devices "
        "one after another, which costs the least CPU.",
        check=positive)

    def deadline_seconds(self) -> float | None:
        return self.timeout_seconds


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
    ("device", "pci_address", "pci_device_id", "driver_version"), collector=C, detail=OPT_IN)


class EfaCollector(Collector):
    name = C
    config_section = EfaSection
    prefix = "efa_"
    docs_group = "EFA"

    def __init__(self, ctx: Context, reader: SysfsReader | None = None) -> None:
        super().__init__(ctx)
        cfg = ctx.config.section(EfaSection)
        self.reader = reader or SysfsReader()
        self.sysfs = ctx.config.paths.sysfs
        self.discovery = Discovery(self.sysfs, self.reader)
        wanted = counter_set(cfg.counters)
        self.devices = DeviceReader(self.reader, wanted)
        self.info = wanted is None or INFO_ITEM in wanted
        limit = cfg.timeout_seconds or ctx.config.collector_timeout_seconds
        self.budget = limit * 0.8  # all devices' reads, so the collection ends within its deadline
        self.device_timeout = min(cfg.device_timeout_seconds, self.budget)
        self.reads = deadline.Deadlines(ctx.pool)
        self._recheck = False  # a read failed: list the devices again next scrape
        self._known: list[EfaDevice] | None = None  # the device list of the last scrape
        self._version = ""  # the driver's, read when the devices are listed
        self._failing: set[str] = set()  # devices with a problem reported
        self._fixed: dict[str, tuple[tuple[str, str, str], Sample, Sample, Sample]] = {}  # info, up 1, up 0
        self.problems = ProblemLog(self.log)
        self.totals = NodeTotals()

    def close(self) -> None:
        self.devices.close()

    def expected(self) -> int | None:
        configured = self.ctx.config.section(EfaSection).expected_devices
        if configured is not None:
            return configured
        p = node.profile(self.ctx)
        return p.efa_devices if p else None

    def driver_version(self) -> str:
        try:
            return self.reader.read(os.path.join(self.sysfs, "module", "efa", "version")).strip()
        except OSError:
            return ""

    def collect(self, out: Families) -> None:
        devices = self.discovery.devices(recheck=self._recheck)
        out.add(DEVICES, len(devices))
        expected = self.expected()
        if expected is not None:
            out.add(DEVICES_EXPECTED, expected)
        out.declare(DEVICE_UP)
        if devices is not self._known:
            self._version = self.driver_version() if devices and self.info else ""
        version = self._version
        failing: dict[str, str] = {}
        self._recheck = False
        info: list[Sample] = []
        up: list[Sample] = []
        groups: dict[str, list[Sample]] = {}
        specs: list[MetricSpec] = []
        readings = self.read_all(devices)
        for reading in readings:
            dev = reading.device
            info_sample, up1, up0 = self._fixed_samples(dev, version)
            if self.info:
                info.append(info_sample)
            if reading.error:
                self._recheck = True  # a removed device reads ENODEV: see whether it is still there
                failing[dev.name] = reading.error
                up.append(up0)
                continue
            up.append(up1)
            samples = reading.samples
            for spec, a, b in reading.runs:
                g = groups.get(spec.name)
                if g is None:
                    g = groups[spec.name] = []
                    specs.append(spec)
                g += samples[a:b]
        out.add_samples(DEVICE_UP, up)
        out.add(DEVICES_UNREADABLE, len(failing))
        if devices is not self._known:
            self.totals.forget_except({d.name for d in devices})
        self.totals.update(readings)
        if info:
            out.add_samples(INFO, info)
        for spec in specs:
            out.add_samples(spec, groups[spec.name])
        for spec, sample in self.totals.samples():
            out.add_samples(spec, (sample,))
        if devices is not self._known:  # listed again: forget what went away
            self._known = devices
            self.devices.forget_except({d.path for d in devices})
            names = {d.name for d in devices}
            for name in self._fixed.keys() - names:
                del self._fixed[name]
            self.problems.forget(lambda subject: subject.removeprefix("EFA device ") not in names)
            self._failing &= names
        for name in self._failing | failing.keys():  # a problem appeared, changed or cleared
            self.problems.report(f"EFA device {name}", failing.get(name, ""))
        self._failing = set(failing)

    def _fixed_samples(self, dev: EfaDevice, version: str) -> tuple[Sample, Sample, Sample]:
        """efa_info and efa_device_up 1/0 of a device: the same Sample objects every scrape."""
        key = (dev.pci_address, dev.pci_device_id, version)
        cached = self._fixed.get(dev.name)
        if cached is None or cached[0] != key:
            up_labels = {"device": dev.name}
            cached = self._fixed[dev.name] = (
                key,
                Sample(INFO.name, {"device": dev.name, "pci_address": dev.pci_address,
                                   "pci_device_id": dev.pci_device_id, "driver_version": version}, 1.0),
                Sample(DEVICE_UP.name, up_labels, 1.0),
                Sample(DEVICE_UP.name, up_labels, 0.0))
        return cached[1], cached[2], cached[3]

    def read_all(self, devices: list[EfaDevice]) -> list[DeviceReading]:
        """Read the devices one after another on a pool thread, each device within
        device_timeout_seconds of the start of its read, all within 80% of the collector's deadline.
        A device whose read from an earlier scrape is still blocked is not read again until that
        read returns."""
        out: list[DeviceReading] = []
        outcomes = self.reads.each(devices, self._read_one, key=lambda d: d.path, timeout=self.device_timeout,
                                   budget=self.budget)
        for dev, o in zip(devices, outcomes, strict=True):
            out.append(o.value if o.ok else DeviceReading(dev, error=o.reason))
        return out

    def _read_one(self, dev: EfaDevice) -> DeviceReading:
        try:
            return self.devices.read(dev)
        except Exception as e:  # noqa: BLE001 - a reader bug fails the device, not the collector
            return DeviceReading(dev, error=f"{type(e).__name__}: {e}")


COLLECTOR = EfaCollector
