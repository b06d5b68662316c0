"""Read one EFA device's counters and port facts into samples; any read failure fails the device.

Hot path (352 files a scrape on a p5 with the default counter set): every selected file of a
device stays open across scrapes and is read with one pread() a scrape; what to read, and each
sample's name and label dict, come from a plan built when the device's files are opened. The
samples are Samples (exporter.metric) whose label dicts are shared by every scrape (never
mutated), so a scrape does no label work.
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
    runs: list[tuple[MetricSpec, int, int]] = field(default_factory=list)  # samples[a:b] are spec's


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


RECHECK_S = 5.0  # a device's directories are checked for a changed file list at most this often
# A directory changed this recently when listed may change again within the same timestamp tick
# (file systems stamp from a coarse clock), so its stat is not trusted until it is older (as git
# treats "racily clean" files).
RACY_NS = 2_000_000_000

DirKey = tuple[int, int, int] | None  # (inode, mtime, ctime) of a directory; None when it is absent
Listings = tuple[list[str], list[list[str]], list[str]]


@dataclass
class _Plan:
    listings: Listings  # (ports, hw_counters listing per port, device hw_counters listing) it was built from
    groups: list[_Group]
    rates: list[tuple[str, str, dict[str, str]]]  # (path relative to the device, full path, labels)


@dataclass
class _Open:
    """A device's files, open, with what each becomes: one pread per file per scrape."""
    plan: _Plan
    rels: list[str]  # the directories listed (relative to the device), for the re-check
    keys: list[DirKey]  # their (inode, mtime, ctime) when listed
    fds: list[int] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    parsers: list[Parser | None] = field(default_factory=list)  # None: a counter (the fast path)
    names: list[str] = field(default_factory=list)
    labels: list[dict[str, str]] = field(default_factory=list)
    specs: list[MetricSpec] = field(default_factory=list)
    runs: list[tuple[MetricSpec, int, int]] = field(default_factory=list)  # the files of one metric
    checked_at: float = 0.0
    racy: bool = True  # a directory had changed within RACY_NS of the listing: check again next time
    # each file's last contents and the Sample they made: a counter that did not change (most
    # error counters) costs a bytes comparison, and the renderer sees the same Sample again
    last: list[tuple[bytes, Sample] | None] = field(default_factory=list)


def _key(st: os.stat_result) -> DirKey:
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


class DeviceReader:
    """Reads devices through descriptors kept open across scrapes (one pread per file).

    A device's directories are listed, and its files opened, on its first read, after any read
    error (the descriptors are then closed and the next read starts afresh), and when a check of
    its directories finds them changed (inode, mtime or ctime of `ports/` or of a hw_counters
    directory). The check runs at most every RECHECK_S; a device is listed again at its next read
    while a directory was changed less than RACY_NS before it was listed (its stat cannot be trusted then: the
device is listed again). On sysfs a device's attributes change
    only when the device goes (open attributes of a removed device read ENODEV) and comes back.
    """

    def __init__(self, reader: SysfsReader, wanted: frozenset[str] | None = None) -> None:
        """`wanted`: the counter files to read (efa.counters); None reads every file."""
        self.reader = reader
        self.wanted = wanted
        self._open: dict[str, _Open] = {}

    def forget_except(self, paths: set[str]) -> None:
        for p in self._open.keys() - paths:
            self._drop(p)

    def close(self) -> None:
        for p in list(self._open):
            self._drop(p)

    def _drop(self, path: str) -> None:
        o = self._open.pop(path, None)
        if o is not None:
            for fd in o.fds:
                try:
                    self.reader.close(fd)
                except OSError:
                    pass

    def read(self, dev: EfaDevice) -> DeviceReading:
        """Read every selected file of `dev` once: counters, port rate and lifespan.

        A file that cannot be read (EIO when an admin command fails, EACCES, the device removed
        mid-scrape) or does not parse fails the whole device for this scrape: `samples` is then
        empty and `error` says which file and why. Absent counter files are simply not listed.
        """
        r = DeviceReading(dev)
        try:
            o = self._open.get(dev.path)
            if o is None or o.racy or (
                    time.monotonic() - o.checked_at >= RECHECK_S and self._changed(dev, o)):
                self._drop(dev.path)
                o = self._open[dev.path] = self._build(dev)
            datas = self.reader.read_fds(o.fds, o.paths)
            samples = r.samples
            append = samples.append
            last = o.last
            if len(last) != len(datas):
                last[:] = [None] * len(datas)
            try:
                for i, (data, parser, name, labels) in enumerate(
                        zip(datas, o.parsers, o.names, o.labels, strict=True)):
                    prev = last[i]
                    if prev is not None and prev[0] == data:  # unchanged since the last scrape: same Sample
                        append(prev[1])
                        continue
                    if parser is None:
                        s = data.strip()
                        if not s.isdigit() or len(s) > U64_DIGITS:  # 310 digits would be +Inf
                            raise ValueError(counter_error(data))
                        sample = Sample(name, labels, float(s))
                    else:
                        sample = Sample(name, labels, parser(data.decode("ascii", "replace")))
                    append(sample)
                    last[i] = (data, sample)
            except ValueError as err:
                raise ValueError(f"{o.paths[len(samples)]}: {err}") from None
            r.specs, r.runs = o.specs, o.runs
            r.files_read = len(datas)
        except (OSError, ValueError) as e:
            r.samples, r.specs, r.runs, r.files_read = [], [], [], 0
            r.error = _describe(e, dev, self.reader)
            self._drop(dev.path)  # open and list afresh next time
        return r

    def _changed(self, dev: EfaDevice, o: _Open) -> bool:
        """Whether a directory's stat differs from when it was listed (and stamps the check)."""
        keys = [self._stat_key(f"{dev.path}/{rel}", dev) for rel in o.rels]
        if keys != o.keys:
            return True
        o.checked_at = time.monotonic()
        o.racy = _racy(keys)
        return False

    def _build(self, dev: EfaDevice) -> _Open:
        reader = self.reader
        dirs: list[int] = []
        try:
            dev_fd = reader.open_dir(dev.path)
            dirs.append(dev_fd)
            ports_fd = self._open_optional(dev_fd, "ports", dev, dirs)
            ports = self._list(ports_fd, dev)
            rels = ["ports"] + [f"ports/{p}/hw_counters" for p in ports] + ["hw_counters"]
            fds: dict[str, int | None] = {"ports": ports_fd}
            for rel in rels[1:]:
                fds[rel] = self._open_optional(dev_fd, rel, dev, dirs)
            keys = [None if (fd := fds[rel]) is None else _key(reader.fstat(fd)) for rel in rels]
            listings = (ports, [self._list(fds[f"ports/{p}/hw_counters"], dev) for p in ports],
                        self._list(fds["hw_counters"], dev))
            plan = build_plan(dev, listings, self.wanted)
            o = _Open(plan, rels, keys, checked_at=time.monotonic(), racy=_racy(keys))
            try:
                for g in plan.groups:
                    dir_fd = fds[g.rel]
                    assert dir_fd is not None  # a group exists only for a directory that was listed
                    for file, path, parser, name, labels, spec in zip(
                            g.names, g.paths, g.parsers, g.sample_names, g.labels, g.specs, strict=True):
                        o.fds.append(reader.open_file(file, dir_fd, path))
                        o.paths.append(path)
                        o.parsers.append(parser)
                        o.names.append(name)
                        o.labels.append(labels)
                        o.specs.append(spec)
                for rel, path, labels in plan.rates:
                    try:
                        fd = reader.open_file(rel, dev_fd, path)
                    except FileNotFoundError:
                        if reader.exists(dev.path):
                            continue  # no rate file: not an error
                        raise
                    o.fds.append(fd)
                    o.paths.append(path)
                    o.parsers.append(parse_rate_bytes_per_second)
                    o.names.append(PORT_RATE.name)
                    o.labels.append(labels)
                    o.specs.append(PORT_RATE)
            except BaseException:
                for fd in o.fds:
                    reader.close(fd)
                raise
            _group_by_metric(o)
            return o
        finally:
            for fd in dirs:
                reader.close(fd)

    def _list(self, fd: int | None, dev: EfaDevice) -> list[str]:
        if fd is None:
            return []
        try:
            return self.reader.listdir_fd(fd)
        except OSError as e:
            e.filename = e.filename or dev.path
            raise

    def _stat_key(self, path: str, dev: EfaDevice) -> DirKey:
        try:
            return _key(self.reader.stat(path))
        except FileNotFoundError:
            if not self.reader.exists(dev.path):
                raise
            return None

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


def _group_by_metric(o: _Open) -> None:
    """Order the files so that each metric's are adjacent (in their order, metrics in order of
    first appearance): the collector then adds a device's samples one slice per metric."""
    first: dict[str, int] = {}
    for i, spec in enumerate(o.specs):
        first.setdefault(spec.name, i)
    order = sorted(range(len(o.fds)), key=lambda i: (first[o.specs[i].name], i))
    for name in ("fds", "paths", "parsers", "names", "labels", "specs"):
        col = getattr(o, name)
        setattr(o, name, [col[i] for i in order])
    o.runs = []
    for i, spec in enumerate(o.specs):
        if o.runs and o.runs[-1][0] is spec:
            o.runs[-1] = (spec, o.runs[-1][1], i + 1)
        else:
            o.runs.append((spec, i, i + 1))


def _racy(keys: list[DirKey]) -> bool:
    recent = time.time_ns() - RACY_NS
    return any(k is not None and (k[1] >= recent or k[2] >= recent) for k in keys)


def build_plan(dev: EfaDevice, listings: Listings, wanted: frozenset[str] | None = None) -> _Plan:
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
