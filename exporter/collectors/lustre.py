"""FSx for Lustre client collector: throughput, operations and their latency, RPC health per
osc/mdc import, import state and evictions, cache, health_check, capacity, client version.

Sources are read from procfs, sysfs and debugfs wherever the running client version keeps
them (exporter.lustre.sources); parsing is in exporter.lustre.parsers. Choices are written
down in docs/lustre.md.
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from exporter import deadline
from exporter.catalog import Families, MetricSpec, define
from exporter.collector import Collector, Context, ProblemLog
from exporter.config import CollectorSection, positive, setting
from exporter.lustre import discovery, parsers
from exporter.lustre.discovery import Device, Mount
from exporter.lustre.evictions import EvictionTracker
from exporter.lustre.sources import SOURCES, KeptFiles, StatvfsFn, Tree
from exporter.metric import Sample

NAME = "lustre"

@dataclass
class LustreSection(CollectorSection):
    """FSx for Lustre client statistics (docs/lustre.md)."""

    name: ClassVar[str] = NAME
    enabled: bool = setting(
        True, "Run the Lustre client collector.")
    per_target: bool = setting(
        False, "Export osc/mdc series per target (OST/MDT). Off: one series per file system and component, "
        "with an empty `target` label; a large file system has dozens of OSTs.")
    statfs: bool = setting(
        True, "Call statvfs on each Lustre mount for capacity and inodes.")
    probe_timeout_seconds: float = setting(
        1.0, "Longest wait for a statvfs or ioctl on a mount; a mount whose servers are unreachable can "
        "hang such calls, and the rest of the collection goes on.", check=positive)
    file_timeout_seconds: float = setting(
        1.0, "Longest wait for one Lustre file read (a stats file of a client waiting on its servers can "
        "block); past it only that file's series are left out of the scrape, and the file is not read"
        " again until the blocked read returns.", check=positive)
    lfs_command: str = setting(
        "lfs", "`lfs` used to map a mount to its llite instance (`lfs getname`); empty to skip it.")
    use_ioctl: bool = setting(
        True, "Map mounts to llite instances with the OBD_IOC_GETMDNAME ioctl when `lfs` is missing.")
    rootfs: str = setting(
        "/", "Prefix added to mount points before statvfs and the ioctl (for example /host when the host's"
        " root is bind-mounted there in a container).", path=True)

L = ("fsname", "mount")
T = ("fsname", "mount", "component", "target")


def _d(name: str, type_: str, help_: str, labels: tuple[str, ...], unit: str = "") -> MetricSpec:
    return define(name, type_, help_, labels, unit=unit, collector=NAME)


INFO = _d("lustre_client_info", "gauge",
          "Always 1 per Lustre mount: its llite instance ('' when unmapped), client version and "
          "LNet network.",
          ("fsname", "mount", "llite", "version", "network"))
MOUNTS = _d("lustre_client_mounts", "gauge", "Lustre mounts found in the mounts file.", ())
SOURCE_UP = _d("lustre_client_source_up", "gauge",
               "1 if the tree (procfs, sysfs, debugfs) the client version keeps data in was readable in the "
               "last collection; debugfs at 0 means no llite/osc/mdc stats (2.12+ clients).", ("source",))
READ_BYTES = _d("lustre_client_read_bytes_total", "counter",
                "Bytes read through the mount (llite read_bytes).", L, "bytes")
WRITE_BYTES = _d("lustre_client_write_bytes_total", "counter",
                 "Bytes written through the mount (llite write_bytes).", L, "bytes")
READ_CALLS = _d("lustre_client_read_calls_total", "counter",
                "Read calls on the mount (llite read_bytes samples).", L)
WRITE_CALLS = _d("lustre_client_write_calls_total", "counter",
                 "Write calls on the mount (llite write_bytes samples).", L)
OPS = _d("lustre_client_operations_total", "counter",
         "VFS operations on the mount by llite counter name (open, close, getattr, ...).", L + ("operation",))
OP_SECONDS = _d("lustre_client_operation_seconds_total", "counter",
                "Time spent in VFS operations, from llite [usec] counters (clients 2.13.51+).",
                L + ("operation",), "seconds")
STATS_RESET = _d("lustre_client_stats_reset_timestamp_seconds", "gauge",
                 "When the llite stats were created or last cleared (start_time, clients 2.15.2+).",
                 L, "seconds")
CACHE_USED = _d("lustre_client_cache_used_bytes", "gauge",
                "Client page cache used by the mount (max_cached_mb used_mb).", L, "bytes")
CACHE_LIMIT = _d("lustre_client_cache_limit_bytes", "gauge", "Client page cache limit (max_cached_mb).", L,
                 "bytes")
TARGETS = _d("lustre_client_targets", "gauge", "osc/mdc devices (OSTs/MDTs) the mount has.",
             ("fsname", "mount", "component"))
RPCS = _d("lustre_client_rpcs_total", "counter", "RPCs completed (req_waittime samples, pings included).", T)
RPC_WAIT = _d("lustre_client_rpc_wait_seconds_total", "counter",
              "Time from RPC send to reply, summed (req_waittime).", T, "seconds")
RPC_READ_BYTES = _d("lustre_client_rpc_read_bytes_total", "counter",
                    "Bulk bytes read over the wire (BRW RPCs).", T, "bytes")
RPC_WRITE_BYTES = _d("lustre_client_rpc_write_bytes_total", "counter",
                     "Bulk bytes written over the wire (BRW RPCs).", T, "bytes")
RPC_TIMEOUTS = _d("lustre_client_rpc_timeouts_total", "counter",
                  "RPCs that timed out (import rpcs.timeouts).", T)
RPCS_IN_FLIGHT = _d("lustre_client_rpcs_in_flight", "gauge",
                    "RPCs in flight (import rpcs.inflight); summed over targets when per_target is off.", T)
MAX_RPCS = _d("lustre_client_max_rpcs_in_flight", "gauge",
              "Configured max_rpcs_in_flight; summed over targets when per_target is off.", T)
IMPORT_STATE = _d("lustre_client_import_state", "gauge",
                  "Targets in each import state: per target 1 for the current state, else the count of "
                  "targets in it. FULL and IDLE (an unused OSC after 20 s) are normal.", T + ("state",))
EVICTIONS = _d("lustre_client_import_evictions_total", "counter",
               "EVICTED entries seen in the import state history, each counted once.", T)
LAST_EVICTION = _d("lustre_client_import_last_eviction_timestamp_seconds", "gauge",
                   "Time of the newest eviction seen (0 if none).", T, "seconds")
CONN_ATTEMPTS = _d("lustre_client_import_connection_attempts_total", "counter",
                   "Connection attempts (also rise on idle reconnects; not an eviction count).", T)
HEALTH = _d("lustre_client_health_status", "gauge",
            "Client health_check: 1 for the current status (healthy, not_healthy, lbug), 0 for the others.",
            ("status",))
FS_SIZE = _d("lustre_client_filesystem_size_bytes", "gauge", "File system size (statvfs).", L, "bytes")
FS_FREE = _d("lustre_client_filesystem_free_bytes", "gauge", "Free bytes (statvfs f_bfree).", L, "bytes")
FS_AVAIL = _d("lustre_client_filesystem_available_bytes", "gauge",
              "Bytes available to unprivileged users (statvfs f_bavail).", L, "bytes")
FS_INODES = _d("lustre_client_filesystem_inodes", "gauge", "Inodes (statvfs f_files).", L)
FS_INODES_FREE = _d("lustre_client_filesystem_inodes_free", "gauge", "Free inodes (statvfs f_ffree).", L)
STATFS_OK = _d("lustre_client_statfs_success", "gauge",
               "1 if statvfs of the mount answered within probe_timeout_seconds.", L)
MALFORMED = _d("lustre_client_malformed_lines_total", "counter",
               "Lines of Lustre files skipped because they did not parse.", ("file",))

IMPORT_STATES = ("CLOSED", "NEW", "DISCONN", "CONNECTING", "REPLAY", "REPLAY_LOCKS", "REPLAY_WAIT", "RECOVER",
                 "FULL", "EVICTED", "IDLE", "UNKNOWN")
FILE_KINDS = ("mounts", "llite_stats", "osc_stats", "mdc_stats", "import", "state", "max_cached_mb",
              "max_rpcs_in_flight", "health_check", "version")
# llite counters exported as read/write calls and bytes rather than as operations.
_IO_COUNTERS = {"read_bytes", "write_bytes"}
# stats counters read per osc/mdc device (the rest of the file is not parsed)
_OSC_COUNTERS = ("req_waittime", "read_bytes", "write_bytes")
_MDC_COUNTERS = ("req_waittime",)
_STATE_SET = frozenset(IMPORT_STATES)
TUNABLE_REFRESH_S = 60.0  # max_rpcs_in_flight is read again after this long (see _collect_mount)
MAX_OPERATIONS = 100  # bound on distinct llite counter names per mount (the client has ~45)
MiB = 1 << 20


class _Acc:
    """Samples summed (or maxed) over the targets that share a label set."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, tuple[str, ...]], float] = {}  # keyed by name: cheap to hash
        self.specs: dict[str, MetricSpec] = {}

    def _key(self, spec: MetricSpec, labels: dict[str, str]) -> tuple[str, tuple[str, ...]]:
        if spec.name not in self.specs:
            self.specs[spec.name] = spec
        return spec.name, tuple(map(labels.__getitem__, spec.labels))

    def add(self, spec: MetricSpec, value: float, labels: dict[str, str]) -> None:
        key = self._key(spec, labels)
        self.values[key] = self.values.get(key, 0.0) + value

    def max(self, spec: MetricSpec, value: float, labels: dict[str, str]) -> None:
        key = self._key(spec, labels)
        self.values[key] = max(self.values.get(key, value), value)

    def emit(self, out: Families) -> None:
        # the keys hold exactly the spec's labels, in order: no per-sample checks (Families.add)
        for (name, lv), v in self.values.items():
            spec = self.specs[name]
            labels = dict(zip(spec.labels, map(str, lv), strict=True))
            out.add_samples(spec, (Sample(name, labels, float(v)),))


class _Target:
    """One osc/mdc label set's values, summed over its devices in name order (as floats, as
    _Acc.add sums them). None or False: no device had the file the series comes from."""

    __slots__ = ("labels", "rpcs", "wait", "read_bytes", "write_bytes", "has_stats", "new_evictions",
                 "last_eviction", "has_state", "states", "inflight", "timeouts", "attempts", "max_rpcs")

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.rpcs = self.wait = self.read_bytes = self.write_bytes = 0.0
        self.has_stats = self.has_state = False
        self.new_evictions = self.last_eviction = 0
        self.states: dict[str, int] = {}
        self.inflight: float | None = None
        self.timeouts: float | None = None
        self.attempts: float | None = None
        self.max_rpcs: float | None = None


def _tunable(text: str) -> int | None:
    """parsers.parse_int, without its regular expression for the usual bare number."""
    v = text.strip()
    if v.isascii() and v.isdigit():
        return int(v) if len(v) <= 20 else None
    return parsers.parse_int(text)


# Where the mounts are listed, in order of preference (see LustreCollector._mounts).
_MOUNT_FILES = (("1/mountinfo", discovery.parse_mountinfo), ("1/mounts", discovery.parse_mounts),
                ("self/mountinfo", discovery.parse_mountinfo), ("mounts", discovery.parse_mounts))
_VERSION_HEALTH = [("version",), ("health_check",)]  # read together, at the start of a collection


class LustreCollector(Collector):
    name = NAME
    config_section = LustreSection
    prefix = "lustre_client_"
    docs_group = "FSx for Lustre client"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        cfg = ctx.config.section(LustreSection)
        paths = ctx.config.paths
        self.procfs = Path(paths.procfs)
        # the files are read through descriptors kept open between scrapes (see KeptFiles)
        self.files = KeptFiles()
        self.tree = Tree(paths.procfs, paths.sysfs, paths.debugfs, ctx.pool, cfg.file_timeout_seconds,
                         reader=self.files)
        self.per_target: bool = cfg.per_target
        self.do_statfs: bool = cfg.statfs
        self.rootfs: str = cfg.rootfs
        # statvfs and the instance probes (lfs, ioctl) of a mount that lost its servers hang: each
        # mount's call under probe_timeout_seconds; a mount whose call is still stuck is not
        # probed again until it returns (keyed by the mount's path).
        self.probe_timeout_s: float = cfg.probe_timeout_seconds
        self.probe = deadline.Deadlines(ctx.pool)
        # Seams (tests replace these attributes): the simulated node passes its fake statvfs in
        # the Context and turns the mount probes (lfs, ioctl) off in its config.
        self.statvfs: StatvfsFn = ctx.statvfs
        self.lfs: str | None = shutil.which(cfg.lfs_command) if cfg.lfs_command else None
        self.use_ioctl: bool = cfg.use_ioctl
        self.evictions = EvictionTracker()
        self._mounts_at = 0  # the _MOUNT_FILES entry read last time
        # device -> (state file text, its current state, malformed lines, newest eviction)
        self._states: dict[str, tuple[str, str | None, int, int]] = {}
        # osc/mdc directory names -> their devices, and per (fsname, llite instance) the mount's
        # devices and files to read: made again when the names change
        self._dev_names: dict[str, str] | None = None
        self._devices: list[Device] = []
        self._dev_instances: dict[str, str] = {}
        # (devices, files, max_rpcs_in_flight files, mdc count, osc count)
        self._mine: dict[tuple[str, str], tuple[list[Device], list[tuple[str, str, str]],
                                                list[tuple[str, str, str]], int, int]] = {}
        # per (fsname, llite instance): when its max_rpcs_in_flight files were read, for which
        # request list, and their texts
        self._tunables: dict[tuple[str, str],
                             tuple[float, list[tuple[str, str, str]], list[int | bool | None]]] = {}
        self._evict_total: dict[tuple[str, ...], int] = {}
        self._last_evict: dict[tuple[str, ...], int] = {}
        self._instances: dict[tuple[str, str], str] = {}  # (mountpoint, source) -> llite instance
        self._malformed = dict.fromkeys(FILE_KINDS, 0)
        self.problems = ProblemLog(self.log)

    def close(self) -> None:
        self.files.forget()

    # -- logging on change -------------------------------------------------------------------
    def _count_bad(self, kind: str, n: int) -> None:
        self._malformed[kind] += n

    # -- collection ---------------------------------------------------------------------------
    def collect(self, out: Families) -> None:
        mounts = self._mounts()
        tree = self.tree
        tree.begin()
        version_text, health_text = tree.read_many(_VERSION_HEALTH)  # one hand-over for both
        version = parsers.parse_version(version_text) if version_text else None
        if version_text is not None and version is None:
            self._count_bad("version", 1)
        tree.version = parsers.version_tuple(version)
        out.add(MOUNTS, len(mounts))
        if not mounts:  # nothing mounted: only the module's health, and no source is "down"
            if version_text is not None:
                self._health(out, health_text)
            self.files.sweep()
            return
        tree.check_roots()
        names = {**tree.listdir("osc"), **tree.listdir("mdc")}
        if names != self._dev_names:  # parsed again only when the device set changes
            self._dev_names = names
            self._devices = [d for d in map(discovery.parse_device, names) if d]
            self._dev_instances = {f"{d.fsname}-{d.instance_id}": "" for d in self._devices}
            self._mine.clear()
            self._tunables.clear()
            self.files.forget()
        devices = self._devices
        # llite directories, plus the instances the osc/mdc device names imply (same suffix).
        instances = {**tree.listdir("llite"), **self._dev_instances}
        mapping = self._map_instances(mounts, list(instances))

        live: set[tuple[str, ...]] = set()
        live_imports: set[str] = set()
        for m in mounts:
            inst = mapping.get(m.mountpoint)
            out.add(INFO, 1, fsname=m.fsname, mount=m.mountpoint, llite=inst or "", version=version or "",
                    network=m.network)
            acc = _Acc()  # per mount: a mount that fails half-way adds nothing
            try:
                self._collect_mount(m, inst, devices, acc, live, live_imports)
            except Exception as e:  # noqa: BLE001 - one broken mount must not hide the others
                self.problems.report(f"mount {m.mountpoint}",
                                     f"collection failed: {type(e).__name__}: {e}")
            else:
                self.problems.report(f"mount {m.mountpoint}", "")
                acc.emit(out)
        self.evictions.retain(live_imports)
        for k in [k for k in self._states if k not in live_imports]:
            del self._states[k]
        mounted = {m.mountpoint for m in mounts}
        self.problems.forget(lambda subject: subject.partition(" ")[0] in ("mount", "map", "statfs")
                             and subject.partition(" ")[2] not in mounted)
        for d in (self._evict_total, self._last_evict):
            for gone in [k for k in d if k not in live]:
                del d[gone]
        if self.do_statfs:
            self._statfs_all(mounts, out)
        self._health(out, health_text)
        self._sources(out, mounts)
        self.files.sweep()  # descriptors of files no longer read are closed
        for kind, n in self._malformed.items():
            out.add(MALFORMED, n, file=kind)

    def _mounts(self) -> list[Mount]:
        """Lustre mounts of the host, one per client instance (bind mounts folded).

        Tried in order: <procfs>/1/mountinfo and 1/mounts (init's namespace: the host's mounts
        even in a container that bind-mounts the host's /proc, where <procfs>/mounts would be the
        exporter's own namespace), then <procfs>/self/mountinfo, then <procfs>/mounts. mountinfo
        tells bind mounts apart (same device); a mounts file cannot. No readable file is a failure.
        The file that answered last time is read alone first (one hand-over to the reader); only
        when it fails are all of them read again, in order.
        """
        paths = [str(self.procfs / rel) for rel, _ in _MOUNT_FILES]
        first = self.tree.read_files([paths[self._mounts_at]])[0]
        texts = [first] if isinstance(first, str) else self.tree.read_files(paths)
        at = self._mounts_at if isinstance(first, str) else 0
        for i, text in enumerate(texts, at):
            if isinstance(text, str):
                self._mounts_at = i
                mounts, bad = _MOUNT_FILES[i][1](text)
                self._count_bad("mounts", bad)
                return discovery.distinct_mounts(mounts)
            if not isinstance(text, OSError):
                raise text
        raise OSError(f"cannot read the mounts file under {self.procfs}: {texts[-1]}")

    def _map_instances(self, mounts: list[Mount], instances: list[str]) -> dict[str, str]:
        """mountpoint -> llite instance: lfs getname, else the ioctl, else a unique fsname."""
        listed = set(instances)
        keys = {(m.mountpoint, m.source) for m in mounts}
        for k in [k for k in self._instances if k not in keys or self._instances[k] not in listed]:
            del self._instances[k]
        by_fsname = discovery.map_by_fsname(mounts, instances)
        out: dict[str, str] = {}
        for m in mounts:
            key = (m.mountpoint, m.source)
            inst = self._instances.get(key)
            if inst is None:
                inst = self._probe_instance(m, listed) or by_fsname.get(m.mountpoint)
                if inst is not None:
                    self._instances[key] = inst
            if inst is None:
                self.problems.report(f"map {m.mountpoint}",
                                     f"{m.fsname}: cannot find its llite instance (no lfs, ioctl failed, "
                                     "fsname not unique); only capacity is exported")
                continue
            self.problems.report(f"map {m.mountpoint}", "")
            out[m.mountpoint] = inst
        return out

    def _probe_instance(self, m: Mount, listed: set[str]) -> str | None:
        path = self._host_path(m.mountpoint)
        candidates: list[Callable[[str], str | None]] = []
        if self.lfs:
            lfs = self.lfs
            candidates.append(lambda p: discovery.lfs_getname(lfs, p, self.probe_timeout_s))
        if self.use_ioctl:
            candidates.append(discovery.ioctl_getmdname)
        for fn in candidates:
            # a failure falls through to the next method
            o = self.probe.call(path, functools.partial(fn, path), self.probe_timeout_s)
            inst = o.value if o.ok else None
            if isinstance(inst, str) and inst in listed:
                parts = discovery.split_instance(inst)
                if parts and parts[0] == m.fsname:
                    return inst
        return None

    def _host_path(self, mountpoint: str) -> str:
        return mountpoint if self.rootfs in ("", "/") else os.path.join(self.rootfs, mountpoint.lstrip("/"))

    def _collect_mount(self, m: Mount, inst: str | None, devices: list[Device], acc: _Acc,
                       live: set[tuple[str, ...]], live_imports: set[str]) -> None:
        base = {"fsname": m.fsname, "mount": m.mountpoint}
        if inst is None:
            return
        key = (m.fsname, inst)
        mine_reqs = self._mine.get(key)
        if mine_reqs is None:  # (until the device set changes)
            inst_id = (discovery.split_instance(inst) or ("", ""))[1]
            mine = sorted((d for d in devices if d.fsname == m.fsname and d.instance_id == inst_id),
                          key=lambda d: d.name)
            # every file of the mount in one batch (one hand-over to the reader thread)
            reqs = [("stats", "llite", inst), ("max_cached_mb", "llite", inst)]
            for d in mine:
                reqs += (("stats", d.component, d.name), ("state", d.component, d.name),
                         ("import", d.component, d.name))
            tunables = [("max_rpcs_in_flight", d.component, d.name) for d in mine]
            mine_reqs = self._mine[key] = (mine, reqs, tunables, sum(1 for d in mine if d.component == "mdc"),
                                           sum(1 for d in mine if d.component == "osc"))
        mine, reqs, tunables, n_mdc, n_osc = mine_reqs
        texts = self.tree.read_many(reqs)
        # max_rpcs_in_flight is a setting (lctl set_param), not a counter: read again at most
        # every TUNABLE_REFRESH_S while every device's file reads; at once for new devices.
        now = time.monotonic()
        kept = self._tunables.get(key)
        if kept is None or kept[1] is not tunables or now - kept[0] >= TUNABLE_REFRESH_S:
            got = self.tree.read_many(tunables)
            # parsed once a read: an int, False for a value that does not parse, None for no file
            parsed = [None if x is None else _tunable(x) for x in got]
            tvals: list[int | bool | None] = [False if v is None and x is not None else v
                                              for v, x in zip(parsed, got, strict=True)]
            if None not in got:
                self._tunables[key] = (now, tunables, tvals)
            else:
                self._tunables.pop(key, None)
        else:
            tvals = kept[2]
        text = texts[0]
        if text is not None:
            self._llite_stats(parsers.parse_stats(text), base, acc)
        text = texts[1]
        if text is not None:
            cache = parsers.parse_max_cached_mb(text)
            self._count_bad("max_cached_mb", cache.malformed)
            if cache.used_mb is not None:
                acc.add(CACHE_USED, cache.used_mb * MiB, base)
            if cache.max_mb is not None:
                acc.add(CACHE_LIMIT, cache.max_mb * MiB, base)
        acc.add(TARGETS, n_mdc, {**base, "component": "mdc"})
        acc.add(TARGETS, n_osc, {**base, "component": "osc"})
        # Sum the devices into one _Target per label set (one per component when per_target is off),
        # then add each target's series once: the cost per OST is reading and parsing its files.
        targets: dict[tuple[str, str], _Target] = {}
        per_target = self.per_target
        stats_fields, import_fields, seconds = parsers.stats_fields, parsers.import_fields, parsers.seconds
        seen_states, count_bad, add_import = self._states, self._count_bad, live_imports.add
        t: _Target | None = None
        last_key: tuple[str, str] | None = None
        k = 2
        # One device's files (stats, state, import; max_rpcs_in_flight) added to its target; written
        # out here rather than as a method: this loop runs once per OST and is the collector's cost.
        for dev, tunable in zip(mine, tvals, strict=True):
            stats, state_text, import_text = texts[k], texts[k + 1], texts[k + 2]
            k += 3
            comp = dev.component
            key = (comp, dev.target if per_target else "")
            if key != last_key:
                t = targets.get(key)
                if t is None:
                    t = targets[key] = _Target({**base, "component": comp, "target": key[1]})
                last_key = key
            assert t is not None
            if stats is not None:
                osc = comp == "osc"
                found, bad = stats_fields(stats, _OSC_COUNTERS if osc else _MDC_COUNTERS)
                if bad:
                    count_bad(f"{comp}_stats", bad)
                wait = found.get("req_waittime")
                if wait:  # (a device without the line adds 0, as the series still exists)
                    t.rpcs += wait[0]
                    t.wait += seconds(wait[1], wait[2]) or 0.0
                if osc:
                    r, w = found.get("read_bytes"), found.get("write_bytes")
                    t.read_bytes += (r[2] or 0) if r else 0
                    t.write_bytes += (w[2] or 0) if w else 0
                t.has_stats = True
            current = None
            if state_text is not None:
                # The ring changes only on a state change: an unchanged file has no new eviction.
                name = dev.name
                seen = seen_states.get(name)
                if seen is not None and seen[0] == state_text:
                    current, bad, last = seen[1], seen[2], seen[3]
                else:
                    hist = parsers.parse_state(state_text)
                    new, _total, last = self.evictions.update(name, hist.history)
                    current, bad = hist.current, hist.malformed
                    seen_states[name] = (state_text, current, bad, last)
                    t.new_evictions += new
                if bad:
                    count_bad("state", bad)
                add_import(name)
                if last > t.last_eviction:
                    t.last_eviction = last
                t.has_state = True
            if import_text is not None:
                state, attempts, inflight, timeouts, bad = import_fields(import_text)
                if bad:
                    count_bad("import", bad)
                # The import's state, else the state file's current_state (same kernel field).
                current = state or current
                if inflight is not None:
                    t.inflight = (t.inflight or 0.0) + inflight
                if timeouts is not None:
                    t.timeouts = (t.timeouts or 0.0) + timeouts
                if attempts is not None:
                    t.attempts = (t.attempts or 0.0) + attempts
            if current is not None:
                states = t.states
                state = current if current in _STATE_SET else "UNKNOWN"
                states[state] = states.get(state, 0) + 1
            if tunable is not None:
                if tunable is False:
                    count_bad("max_rpcs_in_flight", 1)
                else:
                    t.max_rpcs = (t.max_rpcs or 0.0) + tunable
        for t in targets.values():
            self._emit_target(t, acc, live)

    def _llite_stats(self, stats: parsers.Stats, base: dict[str, str], acc: _Acc) -> None:
        self._count_bad("llite_stats", stats.malformed)
        for name, c in (("read_bytes", READ_CALLS), ("write_bytes", WRITE_CALLS)):
            ctr = stats.get(name)
            acc.add(c, ctr.count if ctr else 0, base)
            acc.add(READ_BYTES if name == "read_bytes" else WRITE_BYTES, (ctr.sum or 0) if ctr else 0, base)
        n = 0
        for ctr in stats.counters.values():
            if ctr.name in _IO_COUNTERS:
                continue
            n += 1
            if n > MAX_OPERATIONS:
                break
            labels = {**base, "operation": ctr.name}
            acc.add(OPS, ctr.count, labels)
            secs = ctr.seconds()
            if secs is not None:
                acc.add(OP_SECONDS, secs, labels)
        reset = stats.reset_timestamp()
        if reset is not None:
            acc.max(STATS_RESET, reset, base)

    def _emit_target(self, t: _Target, acc: _Acc, live: set[tuple[str, ...]]) -> None:
        """The series of one label set, in the order a device adds them."""
        labels = t.labels
        if t.has_stats:
            acc.add(RPCS, t.rpcs, labels)
            acc.add(RPC_WAIT, t.wait, labels)
            if labels["component"] == "osc":
                acc.add(RPC_READ_BYTES, t.read_bytes, labels)
                acc.add(RPC_WRITE_BYTES, t.write_bytes, labels)
        if t.has_state:
            key = tuple(labels[k] for k in T)
            live.add(key)
            total = self._evict_total[key] = self._evict_total.get(key, 0) + t.new_evictions
            last = self._last_evict[key] = max(self._last_evict.get(key, 0), t.last_eviction)
            acc.max(EVICTIONS, total, labels)
            acc.max(LAST_EVICTION, last, labels)
        if t.states:
            for s in IMPORT_STATES:
                acc.add(IMPORT_STATE, t.states.get(s, 0), {**labels, "state": s})
        if t.inflight is not None:
            acc.add(RPCS_IN_FLIGHT, t.inflight, labels)
        if t.timeouts is not None:
            acc.add(RPC_TIMEOUTS, t.timeouts, labels)
        if t.attempts is not None:
            acc.add(CONN_ATTEMPTS, t.attempts, labels)
        if t.max_rpcs is not None:
            acc.add(MAX_RPCS, t.max_rpcs, labels)

    def _statfs_all(self, mounts: list[Mount], out: Families) -> None:
        """statvfs of every mount, one after another, each within the probe timeout: a hung mount
        costs the collection probe_timeout_seconds once, then nothing while stuck."""
        paths = [self._host_path(m.mountpoint) for m in mounts]
        outcomes = self.probe.each(paths, self.statvfs, timeout=self.probe_timeout_s)
        for m, path, o in zip(mounts, paths, outcomes, strict=True):
            labels = {"fsname": m.fsname, "mount": m.mountpoint}
            subject = f"statfs {m.mountpoint}"
            if o.status == deadline.ERROR and not isinstance(o.value, OSError):
                raise o.value
            if not o.ok:
                why = f"failed: {o.value.strerror or o.value}" if isinstance(o.value, OSError) else o.reason
                self.problems.report(subject, f"statvfs({path}): {why}; capacity not exported")
                out.add(STATFS_OK, 0, **labels)
                continue
            st = o.value
            self.problems.report(subject, "")
            frsize = st.f_frsize or getattr(st, "f_bsize", 0)
            out.add(STATFS_OK, 1, **labels)
            out.add(FS_SIZE, st.f_blocks * frsize, **labels)
            out.add(FS_FREE, st.f_bfree * frsize, **labels)
            out.add(FS_AVAIL, st.f_bavail * frsize, **labels)
            out.add(FS_INODES, st.f_files, **labels)
            out.add(FS_INODES_FREE, st.f_ffree, **labels)

    def _health(self, out: Families, text: str | None) -> None:
        if text is None:
            return
        status = parsers.parse_health_check(text)
        if status is None:
            self._count_bad("health_check", 1)
            return
        for s in parsers.HEALTH_STATUSES:
            out.add(HEALTH, 1 if s == status else 0, status=s)

    def _sources(self, out: Families, mounts: list[Mount]) -> None:
        needed = self.tree.needed()
        for src in SOURCES:
            problem = self.tree.state[src].problem if src in needed else ""
            if src in needed:
                out.add(SOURCE_UP, 0 if problem else 1, source=src)
            if problem and src == "debugfs" and not self.tree.state[src].hung:
                problem += ("; llite/osc/mdc stats and max_cached_mb (2.12+ clients keep them in debugfs) "
                            "are not exported: mount debugfs and run as root or with CAP_DAC_READ_SEARCH")
            self.problems.report(f"source {src}", problem)


COLLECTOR = LustreCollector
