"""Read one EFA device's counters and port facts into samples; any read failure fails the device.

Hot path (1,152 files a scrape on a p5): per device, its directory is opened once and every
counter file is read relative to it; what to read, and each sample's name and label dict, come
from a plan cached per device and rebuilt only when a directory listing changes. The samples are
Samples (exporter.metric) whose label dicts are shared by every scrape (never mutated), so a
scrape does no label work.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter.catalog import MetricSpec, define
from exporter.efa import naming
from exporter.efa.discovery import EfaDevice
from exporter.efa.naming import LIFESPAN_FILE, PORT, RATE_FILE
from exporter.efa.parse import (
    U64_DIGITS,
    counter_error,
    parse_lifespan_seconds,
    parse_rate_bytes_per_second,
    plan_reads,
    port_key,
)
from exporter.efa.sysfs import SysfsReader
from exporter.metric import Sample

PORT_RATE = define(
    "efa_port_rate_bytes_per_second", "gauge",
    "Port rate from ports/<p>/rate in bytes per second (100 Gb/sec = 1.25e10). Kernels before 6.13 "
    "(amzn-drivers before r2.13.0) always report 100 Gb/sec whatever the link is; later ones report "
    "the device's maximum link speed.",
    ("device", "port"), unit="bytes_per_second", collector=naming.C, detail=naming.OPT_IN)
LIFESPAN = define(
    "efa_stats_lifespan_seconds", "gauge",
    "How long the kernel caches the port's hardware counters (ports/<p>/hw_counters/lifespan); "
    "reads within this window return one snapshot. A setting, not a counter.",
    ("device", "port"), unit="seconds", collector=naming.C, detail=naming.OPT_IN)

Parser = Callable[[str], float]


@dataclass
class DeviceReading:
    """One device's reading: `samples[i]` belongs to metric `specs[i]` (all or nothing)."""
    device: EfaDevice
    samples: list[Sample] = field(default_factory=list)
    specs: list[MetricSpec] = field(default_factory=list)
    error: str = ""  # why the reading failed ("" when it succeeded)
    files_read: int = 0


@dataclass
class _Group:
    """The files to read in one hw_counters directory, with what each becomes."""
    rel: str  # the directory, relative to the device's: ports/<p>/hw_counters or hw_counters
    names: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # full paths, for error messages and the test seam
    parsers: list[Parser | None] = field(default_factory=list)  # None: a counter (the fast path)
    sample_names: list[str] = field(default_factory=list)
    labels: list[dict[str, str]] = field(default_factory=list)
    specs: list[MetricSpec] = field(default_factory=list)

    def add(self, file: str, path: str, parser: Parser | None, spec: MetricSpec,
            labels: dict[str, str]) -> None:
        self.names.append(file)
        self.paths.append(path)
        self.parsers.append(parser)
        self.sample_names.append(spec.name)
        self.labels.append(labels)
        self.specs.append(spec)


RELIST_S = 60.0  # directory listings are taken again at least this often, whatever their stat says
# A directory changed this recently when listed may change again within the same timestamp tick
# (file systems stamp from a coarse clock), so its stat is not trusted until it is older (as git
# treats "racily clean" files).
RACY_NS = 2_000_000_000

DirKey = tuple[int, int, int] | None  # (inode, mtime, ctime) of a directory; None when it is absent


@dataclass
class _Plan:
    listings: tuple  # (ports, hw_counters listing per port, device hw_counters listing) it was built from
    groups: list[_Group]
    rates: list[tuple[str, str, dict[str, str]]]  # (path relative to the device, full path, labels)
    keys: list[DirKey] = field(default_factory=list)  # of ports/ and each hw_counters dir when listed
    listed_at: float = 0.0
    racy: bool = True  # a directory had changed within RACY_NS of the listing: list again next time


def _key(st: os.stat_result) -> DirKey:
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


class DeviceReader:
    """Reads devices, keeping per device the plan of what to read (paths, metric, labels).

    The directories are listed again, and the plan rebuilt if the listings differ, when the
    inode, mtime or ctime of `ports/` or of a hw_counters directory changes (on sysfs a
    hw_counters directory is created and removed whole with its device or port, which gives it a
    new inode; on other file systems adding or removing a file moves the directory's mtime), when
    a listed file turns out to be missing, while a directory was changed less than RACY_NS
    before it was listed, and at least every RELIST_S. In between, a scrape stats the
    directories instead of listing them.
    """

    def __init__(self, reader: SysfsReader, wanted: frozenset[str] | None = None) -> None:
        """`wanted`: the counter files to read (efa.counters); None reads every file."""
        self.reader = reader
        self.wanted = wanted
        self._plans: dict[str, _Plan] = {}

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
        fds: list[int] = []
        try:
            dev_fd = reader.open_dir(dev.path)
            fds.append(dev_fd)
            plan = self._plans.get(dev.path)
            trusted = plan is not None and not plan.racy and time.monotonic() - plan.listed_at < RELIST_S
            keys = [self._stat_key(dev_fd, "ports", dev)]
            if trusted and plan is not None and keys[0] == plan.keys[0]:
                ports = plan.listings[0]
            else:
                trusted = False
                ports_fd = self._open_optional(dev_fd, "ports", dev, fds) if keys[0] is not None else None
                ports = self._list(ports_fd, dev)
            dirs: dict[str, int | None] = {}
            for rel in [f"ports/{p}/hw_counters" for p in ports] + ["hw_counters"]:
                fd = dirs[rel] = self._open_optional(dev_fd, rel, dev, fds)
                keys.append(None if fd is None else _key(reader.fstat(fd)))
            if not trusted or plan is None or keys != plan.keys:
                plan = self._relist(dev, ports, dirs, keys, plan)
            samples, specs = r.samples, r.specs
            append = samples.append
            for g in plan.groups:
                fd = dirs[g.rel]
                assert fd is not None  # a group exists only for a directory that was listed
                start = len(samples)
                datas = reader.read_files(fd, g.names, g.paths)
                try:
                    for data, parser, name, labels in zip(datas, g.parsers, g.sample_names, g.labels,
                                                          strict=True):
                        if parser is None:
                            s = data.strip()
                            if not s.isdigit() or len(s) > U64_DIGITS:  # 310 digits would be +Inf
                                raise ValueError(counter_error(data))
                            append(Sample(name, labels, float(s)))
                        else:
                            append(Sample(name, labels, parser(data.decode("ascii", "replace"))))
                except ValueError as err:
                    raise ValueError(f"{g.paths[len(samples) - start]}: {err}") from None
                specs.extend(g.specs)
                r.files_read += len(datas)
            for rel, path, labels in plan.rates:
                try:
                    data = reader.read_files(dev_fd, (rel,), (path,))[0]
                except FileNotFoundError:
                    if reader.exists(dev.path):
                        continue  # no rate file: not an error
                    raise
                r.files_read += 1
                try:
                    v = parse_rate_bytes_per_second(data.decode("ascii", "replace"))
                except ValueError as err:
                    raise ValueError(f"{path}: {err}") from None
                samples.append(Sample(PORT_RATE.name, labels, v))
                specs.append(PORT_RATE)
        except (OSError, ValueError) as e:
            r.samples, r.specs, r.files_read = [], [], 0
            r.error = _describe(e, dev, reader)
            if isinstance(e, FileNotFoundError):
                self._plans.pop(dev.path, None)  # a listed file went away: list again next time
        finally:
            for fd in fds:
                reader.close(fd)
        return r

    def _relist(self, dev: EfaDevice, ports: list[str], dirs: dict[str, int | None], keys: list[DirKey],
                old: _Plan | None) -> _Plan:
        listings = (ports, [self._list(dirs[f"ports/{p}/hw_counters"], dev) for p in ports],
                    self._list(dirs["hw_counters"], dev))
        plan = old if old is not None and old.listings == listings else build_plan(dev, listings, self.wanted)
        plan.keys, plan.listed_at = keys, time.monotonic()
        recent = time.time_ns() - RACY_NS
        plan.racy = any(k is not None and (k[1] >= recent or k[2] >= recent) for k in keys)
        self._plans[dev.path] = plan
        return plan

    def _list(self, fd: int | None, dev: EfaDevice) -> list[str]:
        if fd is None:
            return []
        try:
            return self.reader.listdir_fd(fd)
        except OSError as e:
            e.filename = e.filename or dev.path
            raise

    def _stat_key(self, dev_fd: int, rel: str, dev: EfaDevice) -> DirKey:
        try:
            return _key(self.reader.stat(rel, dev_fd))
        except FileNotFoundError:
            if not self.reader.exists(dev.path):
                raise
            return None
        except OSError as e:
            e.filename = f"{dev.path}/{rel}"
            raise

    def _open_optional(self, dev_fd: int, rel: str, dev: EfaDevice, fds: list[int]) -> int | None:
        """Open a directory the kernel may not have (no hw_counters on very old kernels): None
        when absent, but an error when the device itself has gone."""
        reader = self.reader
        try:
            fd = reader.open_dir(rel, dev_fd)
        except FileNotFoundError:
            if not reader.exists(dev.path):
                raise
            return None
        except OSError as e:
            e.filename = f"{dev.path}/{rel}"
            raise
        fds.append(fd)
        return fd


def build_plan(dev: EfaDevice, listings: tuple, wanted: frozenset[str] | None = None) -> _Plan:
    """What to read of a device: every file listed, or (`wanted`) only those; a file not read
    costs nothing."""
    ports, port_lists, device_files = listings
    port_files = dict(zip(ports, port_lists, strict=True))
    base, name = dev.path, dev.name
    groups: dict[str, _Group] = {}
    for fr in plan_reads(port_files, device_files):
        if wanted is not None and fr.file not in wanted:
            continue
        rel = f"ports/{fr.port}/hw_counters" if fr.where == PORT else "hw_counters"
        g = groups.get(rel)
        if g is None:
            g = groups[rel] = _Group(rel)
        path = f"{base}/{rel}/{fr.file}"
        if fr.file == LIFESPAN_FILE:
            g.add(fr.file, path, parse_lifespan_seconds, LIFESPAN, {"device": name, "port": fr.port})
            continue
        m = naming.lookup(fr.file, fr.where)
        if m.scope == PORT:
            labels = {"device": name, "port": fr.port or "1"}  # a port counter listed only at device level
        else:
            labels = {"device": name}
        labels.update(m.extra)
        g.add(fr.file, path, None, m.spec, labels)
    rates = [(f"ports/{p}/rate", f"{base}/ports/{p}/rate", {"device": name, "port": p})
             for p in sorted(port_files, key=port_key) if wanted is None or RATE_FILE in wanted]
    return _Plan(listings, list(groups.values()), rates)


def _describe(e: Exception, dev: EfaDevice, reader: SysfsReader) -> str:
    if isinstance(e, FileNotFoundError) and not reader.exists(dev.path):
        return "device removed during the scrape"
    if isinstance(e, OSError):
        return f"{e.filename or dev.path}: {e.strerror or e}"
    return str(e)
