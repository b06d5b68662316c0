"""Read one EFA device's counters and port facts into samples; any read failure fails the device."""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.catalog import MetricSpec, define
from exporter.efa import naming
from exporter.efa.discovery import EfaDevice
from exporter.efa.naming import LIFESPAN_FILE, PORT
from exporter.efa.parse import parse_counter, parse_lifespan_seconds, parse_rate_bytes_per_second, plan_reads
from exporter.efa.sysfs import SysfsReader

PORT_RATE = define(
    "efa_port_rate_bytes_per_second", "gauge",
    "Port rate from ports/<p>/rate in bytes per second (100 Gb/sec = 1.25e10). Kernels before 6.13 "
    "(amzn-drivers before r2.13.0) always report 100 Gb/sec whatever the link is; later ones report "
    "the device's maximum link speed.",
    ("device", "port"), unit="bytes_per_second", collector=naming.C)
LIFESPAN = define(
    "efa_stats_lifespan_seconds", "gauge",
    "How long the kernel caches the port's hardware counters (ports/<p>/hw_counters/lifespan); "
    "reads within this window return one snapshot. A setting, not a counter.",
    ("device", "port"), unit="seconds", collector=naming.C)

Sample = tuple[MetricSpec, float, dict[str, str]]
_PARSERS = {"counter": parse_counter, "lifespan": parse_lifespan_seconds, "rate": parse_rate_bytes_per_second}


@dataclass
class DeviceReading:
    device: EfaDevice
    samples: list[Sample] = field(default_factory=list)
    error: str = ""  # why the reading failed ("" when it succeeded)
    files_read: int = 0


@dataclass(frozen=True)
class _Entry:
    path: str
    kind: str  # key of _PARSERS
    spec: MetricSpec
    labels: dict[str, str]
    optional: bool = False  # a file that may be absent (rate) rather than listed


class DeviceReader:
    """Reads devices, keeping per device the plan of what to read (paths, metric, labels): it is
    rebuilt only when the directory listings change, which are taken on every read."""

    def __init__(self, reader: SysfsReader) -> None:
        self.reader = reader
        self._plans: dict[str, tuple[tuple, list[_Entry]]] = {}

    def forget_except(self, paths: set[str]) -> None:
        for p in self._plans.keys() - paths:
            del self._plans[p]

    def read(self, dev: EfaDevice) -> DeviceReading:
        """Read every counter file of `dev` once, plus port rate and lifespan.

        A file that cannot be read (EIO when an admin command fails, EACCES, the device removed
        mid-scrape) or does not parse fails the whole device for this scrape: `samples` is then
        empty and `error` says which file and why. Absent counter files are simply not listed.
        """
        r = DeviceReading(dev)
        reader = self.reader
        try:
            plan = self._plan(dev)
            samples = r.samples
            for e in plan:
                try:
                    text = reader.read(e.path)
                except FileNotFoundError:
                    if e.optional and reader.exists(dev.path):
                        continue
                    raise
                try:
                    v = _PARSERS[e.kind](text)
                except ValueError as err:
                    raise ValueError(f"{e.path}: {err}") from None
                samples.append((e.spec, v, e.labels))
            r.files_read = len(plan)
        except (OSError, ValueError) as e:
            r.samples = []
            r.error = _describe(e, dev, reader)
        return r

    def _plan(self, dev: EfaDevice) -> list[_Entry]:
        base = dev.path
        ports = tuple(sorted(_listdir_optional(self.reader, base + "/ports", dev)))
        port_files = {p: _listdir_optional(self.reader, f"{base}/ports/{p}/hw_counters", dev) for p in ports}
        device_files = _listdir_optional(self.reader, base + "/hw_counters", dev)
        key = (ports, tuple(tuple(sorted(port_files[p])) for p in ports), tuple(sorted(device_files)))
        cached = self._plans.get(base)
        if cached is not None and cached[0] == key:
            return cached[1]
        plan = build_plan(dev, port_files, device_files)
        self._plans[base] = (key, plan)
        return plan


def build_plan(dev: EfaDevice, port_files: dict[str, list[str]], device_files: list[str]) -> list[_Entry]:
    base, name = dev.path, dev.name
    out: list[_Entry] = []
    for fr in plan_reads(port_files, device_files):
        if fr.where == PORT:
            path = f"{base}/ports/{fr.port}/hw_counters/{fr.file}"
        else:
            path = f"{base}/hw_counters/{fr.file}"
        if fr.file == LIFESPAN_FILE:
            out.append(_Entry(path, "lifespan", LIFESPAN, {"device": name, "port": fr.port}))
            continue
        m = naming.lookup(fr.file, fr.where)
        if m.scope == PORT:
            labels = {"device": name, "port": fr.port or "1"}  # a port counter listed only at device level
        else:
            labels = {"device": name}
        labels.update(m.extra)
        out.append(_Entry(path, "counter", m.spec, labels))
    for p in sorted(port_files):
        out.append(_Entry(f"{base}/ports/{p}/rate", "rate", PORT_RATE, {"device": name, "port": p},
                          optional=True))
    return out


def _listdir_optional(reader: SysfsReader, path: str, dev: EfaDevice) -> list[str]:
    """A directory the kernel may not have (no hw_counters on very old kernels): [] when absent,
    but an error when the device itself has gone."""
    try:
        return reader.listdir(path)
    except FileNotFoundError:
        if not reader.exists(dev.path):
            raise
        return []


def _describe(e: Exception, dev: EfaDevice, reader: SysfsReader) -> str:
    if isinstance(e, FileNotFoundError) and not reader.exists(dev.path):
        return "device removed during the scrape"
    if isinstance(e, OSError):
        return f"{e.filename or dev.path}: {e.strerror or e}"
    return str(e)
