"""EFA collector: every driver counter of every EFA device, device facts, per-device up.

Discovery, reading and naming live in exporter.efa; this module adds the samples and keeps one
device's failure from touching the others.
"""

from __future__ import annotations

import os
import threading
import time

from exporter import imds, node
from exporter.catalog import Families, MetricSpec, define
from exporter.collector import Collector, Context, ProblemLog
from exporter.config import Key, declare_section, non_negative, positive
from exporter.efa.discovery import Discovery, EfaDevice
from exporter.efa.naming import INFO as INFO_ITEM
from exporter.efa.naming import OPT_IN, C, check_counters, counter_set
from exporter.efa.reader import DeviceReader, DeviceReading
from exporter.efa.sysfs import SysfsReader
from exporter.efa.workers import Chain, Pool
from exporter.metric import Sample

declare_section(C, "EFA devices: counters from <paths.sysfs>/class/infiniband.", {
    "enabled": Key(bool, True, "Run the EFA collector."),
    "expected_devices": Key(int, None, "EFA devices the node should have; from the instance type when "
                            "unset (p4d 4, p5/p5e 32, p5en 16, p6-b200 8).",
                            nullable=True, check=non_negative),
    "timeout_seconds": Key((int, float), None, "Deadline of the EFA collection; the global "
                           "collector_timeout_seconds when unset.", nullable=True, check=positive),
    "device_timeout_seconds": Key((int, float), 2.0,
                                  "Deadline for reading one device, from the start of its read; a device "
                                  "past it (a read blocked on an admin command that does not complete) is "
                                  "reported with efa_device_up 0 while the others are served. Keep it "
                                  "under the collector's deadline.", check=positive),
    "counters": Key((str, list), "default",
                    "Which counter files to read and export: default (what the shipped rules and "
                    "dashboards use and what locates a fault on a device; docs/efa.md lists them), all "
                    "(every file the driver has, names this exporter does not know included), or a "
                    "list of file names (for example [tx_bytes, rx_bytes, rdma_read_bytes]; rate, "
                    "lifespan and info (efa_info) too). Files not selected are not read.",
                    check=check_counters, expected="default, all, or a list of counter file names"),
    "read_workers": Key(int, 1, "Threads reading devices at once, each reading its share of the devices "
                        "one after another. 1 costs the least CPU; more only shorten the collection "
                        "when reads wait on the devices.", check=positive),
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
    ("device", "pci_address", "pci_device_id", "driver_version"), collector=C, detail=OPT_IN)


class EfaCollector(Collector):
    name = C

    def __init__(self, ctx: Context, reader: SysfsReader | None = None) -> None:
        super().__init__(ctx)
        cfg = ctx.config.efa
        self.reader = reader or SysfsReader()
        self.sysfs = ctx.config.paths.sysfs
        self.discovery = Discovery(self.sysfs, self.reader)
        wanted = counter_set(cfg.counters)
        self.devices = DeviceReader(self.reader, wanted)
        self.info = wanted is None or INFO_ITEM in wanted
        self.pool = Pool("efa-read")
        self.workers = cfg.read_workers
        deadline = cfg.timeout_seconds or ctx.config.collector_timeout_seconds
        self.budget = deadline * 0.8  # all devices' reads, so the collection ends within its deadline
        self.device_timeout = min(cfg.device_timeout_seconds, self.budget)
        self._blocked: dict[str, Chain] = {}  # device path -> the chain stuck reading it
        self._fixed: dict[str, tuple[tuple[str, str, str], Sample, Sample, Sample]] = {}  # info, up 1, up 0
        self.problems = ProblemLog(self.log)
        self.lookup: imds.IdentityLookup | None = None

    def start(self) -> None:
        self.lookup = self.ctx.identity.start_lookup()  # the expected count can come from the instance type

    def close(self) -> None:
        self.pool.close()
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
        version = self.driver_version() if devices and self.info else ""
        failing: dict[str, str] = {}
        info: list[Sample] = []
        up: list[Sample] = []
        groups: dict[str, list[Sample]] = {}
        specs: list[MetricSpec] = []
        for reading in self.read_all(devices):
            dev = reading.device
            info_sample, up1, up0 = self._fixed_samples(dev, version)
            if self.info:
                info.append(info_sample)
            if reading.error:
                failing[dev.name] = reading.error
                up.append(up0)
                continue
            up.append(up1)
            for spec, sample in zip(reading.specs, reading.samples, strict=True):
                g = groups.get(spec.name)
                if g is None:
                    g = groups[spec.name] = []
                    specs.append(spec)
                g.append(sample)
        out.add_samples(DEVICE_UP, up)
        if info:
            out.add_samples(INFO, info)
        for spec in specs:
            out.add_samples(spec, groups[spec.name])
        live = {d.path for d in devices}
        self.devices.forget_except(live)
        for name in self._fixed.keys() - {d.name for d in devices}:
            del self._fixed[name]
        names = {d.name for d in devices}
        self.problems.forget(lambda subject: subject.removeprefix("EFA device ") not in names)
        for name in names:
            self.problems.report(f"EFA device {name}", failing.get(name, ""))

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
        """Read the devices in efa.read_workers chains (one by default), each device within
        device_timeout_seconds of the start of its read, all within 80% of the collector's deadline.
        A device whose read from an earlier scrape is still blocked is not read again until that
        read returns."""
        timeout = self.device_timeout
        end = time.monotonic() + self.budget
        results: list[DeviceReading | None] = [None] * len(devices)
        todo: list[int] = []
        for i, dev in enumerate(devices):
            stuck = self._blocked.get(dev.path)
            if stuck is not None and not stuck.done.is_set():
                results[i] = DeviceReading(
                    dev, error=f"a read from an earlier scrape is still blocked (over {timeout:g} s)")
            else:
                todo.append(i)
        live = {d.path for d in devices}
        for path in [p for p, ch in self._blocked.items() if ch.done.is_set() or p not in live]:
            del self._blocked[path]
        wake = threading.Event()
        n = min(self.workers, len(todo))
        active: list[tuple[Chain, list[int]]] = []
        for k in range(n):
            part = todo[k * len(todo) // n:(k + 1) * len(todo) // n]
            active.append(self._start([devices[i] for i in part], part, wake))
        while active:
            wake.clear()
            now = time.monotonic()
            still: list[tuple[Chain, list[int]]] = []
            for chain, idx in active:
                if chain.done.is_set():
                    for j, r in chain.results.items():
                        results[idx[j]] = r
                    continue
                cur = chain.cancel_if_stuck(timeout, now, hard_stop=now >= end)
                if cur is None:
                    still.append((chain, idx))
                    continue
                for j, r in list(chain.results.items()):
                    results[idx[j]] = r
                dev = devices[idx[cur]]
                self._blocked[dev.path] = chain
                why = "the collection's deadline" if now >= end else f"{timeout:g} s"
                results[idx[cur]] = DeviceReading(dev, error=f"read did not finish within {why}")
                rest = idx[cur + 1:]
                if rest and now < end:
                    still.append(self._start([devices[i] for i in rest], rest, wake))
                for i in rest if now >= end else ():
                    results[i] = DeviceReading(
                        devices[i], error="not read: the devices before it used up the collection's deadline")
            active = still
            if active:
                now = time.monotonic()
                wait = min([ch.next_deadline(timeout) for ch, _ in active] + [end]) - now
                wake.wait(max(wait, 0.001))
        return [r if r is not None else DeviceReading(devices[i], error="not read")
                for i, r in enumerate(results)]

    def _start(self, items: list[EfaDevice], idx: list[int],
               wake: threading.Event) -> tuple[Chain, list[int]]:
        chain = Chain(items, self._read_one, wake)
        self.pool.submit(chain)
        return chain, idx

    def _read_one(self, dev: EfaDevice) -> DeviceReading:
        try:
            return self.devices.read(dev)
        except Exception as e:  # noqa: BLE001 - a reader bug fails the device, not the collector
            return DeviceReading(dev, error=f"{type(e).__name__}: {e}")



COLLECTOR = EfaCollector
