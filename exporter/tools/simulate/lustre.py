"""Simulated FSx for Lustre client: one mount with a 2.15-layout tree whose counters advance.

Layout written under the simulation root (client 2.15.6):
  proc/mounts                                  + `<nid>@<net>:/abcdefgh /fsx lustre ...`
  proc/fs/lustre/{osc,mdc}/<dev>/{import,state}
  sys/fs/lustre/{version,health_check}, sys/fs/lustre/llite/<inst>/, {osc,mdc}/<dev>/max_rpcs_in_flight
  sys/kernel/debug/lustre/llite/<inst>/{stats,max_cached_mb}, {osc,mdc}/<dev>/stats, health_check
  sim/lustre-statvfs.json                      what statvfs("/fsx") answers in simulation mode
                                               (`fake_statvfs(root)`, which exporter.startup hands the
                                               collector as Context.statvfs)

Every value is a function of the elapsed time, so `advance(t)` is repeatable in tests.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from exporter.profiles import Profile
from exporter.tools.simulate import job
from exporter.tools.simulate.source import SimSource

FSNAME = "abcdefgh"
MOUNTPOINT = "/fsx"
INSTANCE_ID = "ffff9c4b3a2f7800"
INSTANCE = f"{FSNAME}-{INSTANCE_ID}"
VERSION = "2.15.6"
OSTS = 8  # the default; LustreSim(osts=N) or `--simulate.lustre-osts` (configure) sets another
IDLE_OST = 7  # an OSC with no traffic goes IDLE after 20 s on 2.12+: normal, must not alert
EVICTED_OST = 2
DISCONN_OST = 3
EVICT_AT_S = 5.0  # lustre-eviction: the eviction happens this many seconds after the start
CAPACITY_BYTES = 4_800 * 1024**3  # a 4.8 TiB persistent SSD file system
INODES = 3_000_000_000
MiB = 1 << 20
# Where the simulated node keeps the statvfs answers of its fake mounts, under the simulation root.
STATVFS_FILE = "sim/lustre-statvfs.json"

SCENARIOS = {
    "lustre-eviction": f"OST{EVICTED_OST:04X} of the FSx mount is evicted {EVICT_AT_S:g} s after the start "
                       "(an EVICTED entry in its state history; the import recovers to FULL).",
    "lustre-import-disconnected": f"OST{DISCONN_OST:04X}'s import is stuck in DISCONN, its RPC timeouts "
                                  "and connection attempts rising.",
    "lustre-mdc-slow": "Metadata RPC wait time rises: the average mdc req_waittime grows by 20 ms a second.",
    "lustre-fs-full": "The FSx file system is full (statvfs: no bytes available, 0.1% free for root).",
    "lustre-debugfs-missing": "debugfs is not mounted: no llite/osc/mdc stats or max_cached_mb.",
    "lustre-lbug": "The client hit an LBUG: health_check reads LBUG.",
}
CHECKPOINT_WRITES = 360  # 4 MiB writes per second: 1.5 GB/s
STALL_RPC_WAIT_US = 2_000_000


def _write(path: Path, text: str) -> None:
    """Replace a file atomically so a concurrent reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _stat(name: str, count: int, unit: str, lo: int | None = None, hi: int | None = None,
          total: int | None = None, sumsq: int | None = None) -> str:
    if count <= 0:
        return ""  # the kernel omits counters at zero
    line = f"{name:<25} {count} samples [{unit}]"
    if lo is not None:
        line += f" {lo} {hi} {total}"
        if sumsq is not None:
            line += f" {sumsq}"
    return line + "\n"


def _usec(name: str, count: int, avg_us: float) -> str:
    """A latency counter as 2.15.6 prints it: `[usec]` (the plural `[usecs]` came in 2.15.52)."""
    count = int(count)
    total = int(count * avg_us)
    return _stat(name, count, "usec", max(1, int(avg_us / 3)), int(avg_us * 8) + 1, total,
                 int(count * avg_us * avg_us * 1.5))


class LustreSim(SimSource):
    name = "lustre"
    scenarios = SCENARIOS

    def __init__(self, root: Path, profile: Profile, scenarios: set[str], osts: int | None = None) -> None:
        super().__init__(root, profile, scenarios)
        # training-job scenarios (exporter/tools/simulate/job.py): a training node reads and writes little;
        # a checkpoint writes; a storage stall is evicted, slow and reads nothing
        self.job = job.job_scenarios(scenarios)
        self.osts = osts if osts is not None else getattr(profile, "lustre_osts", None) or OSTS
        if not 1 <= self.osts <= 0x10000:  # OST indexes are 4 hex digits in device names
            raise ValueError(f"simulated Lustre OST count {self.osts} is not between 1 and 65536")

    def configure(self, shape: Any) -> None:
        """`--simulate.lustre-osts` (exporter.tools.simulate.Shape)."""
        if shape.lustre_osts is not None:
            self.osts = shape.lustre_osts

    def build(self) -> None:
        self.t0 = int(time.time())
        self.network = "tcp" if self.profile.efa_devices < 8 else "efa"
        self.nid = f"172.31.12.34@{self.network}"
        self.proc = self.root / "proc/fs/lustre"
        self.sys = self.root / "sys/fs/lustre"
        self.debug = self.root / "sys/kernel/debug/lustre"
        mounts = self.root / "proc/mounts"
        mounts.parent.mkdir(parents=True, exist_ok=True)
        with open(mounts, "a") as f:  # other sources may list their own mounts
            f.write(f"{self.nid}:/{FSNAME} {MOUNTPOINT} lustre rw,seclabel,noatime,flock,lazystatfs,"
                    "encrypt 0 0\n")
        _write(self.sys / "version", VERSION + "\n")
        _write(self.sys / "health_check", ("LBUG" if "lustre-lbug" in self.active else "healthy") + "\n")
        (self.sys / "llite" / INSTANCE).mkdir(parents=True, exist_ok=True)
        _write(self.sys / "llite" / INSTANCE / "stats_track_pid", "0\n")
        for comp, dev in self._devices():
            _write(self.sys / comp / dev / "max_rpcs_in_flight", ("64" if comp == "mdc" else "32") + "\n")
            _write(self.sys / comp / dev / "active", "1\n")
        if "lustre-debugfs-missing" not in self.active:
            _write(self.debug / "health_check", "LBUG\n" if "lustre-lbug" in self.active else "healthy\n")
        self._statvfs()
        self.advance(0.0)

    def _devices(self) -> list[tuple[str, str]]:
        out = [("mdc", f"{FSNAME}-MDT0000-mdc-{INSTANCE_ID}")]
        out += [("osc", f"{FSNAME}-OST{i:04x}-osc-{INSTANCE_ID}") for i in range(self.osts)]
        return out

    # -- per-tick content ---------------------------------------------------------------------
    def advance(self, elapsed_s: float) -> None:
        t = max(0.0, elapsed_s)
        debugfs = "lustre-debugfs-missing" not in self.active
        if debugfs:
            _write(self.debug / "llite" / INSTANCE / "stats", self._llite_stats(t))
            used = min(64_000, 20_000 + int(40 * t))
            _write(self.debug / "llite" / INSTANCE / "max_cached_mb",
                   f"users: 1\nmax_cached_mb: 128000\nused_mb: {used}\nunused_mb: {128000 - used}\n"
                   "reclaim_count: 0\nmax_read_ahead_mb: 1024\nused_read_ahead_mb: 12\n")
        for comp, dev in self._devices():
            idx = int(dev.split("-")[-3][3:], 16)
            if debugfs:
                _write(self.debug / comp / dev / "stats", self._rpc_stats(comp, idx, t))
            _write(self.proc / comp / dev / "import", self._import(comp, dev, idx, t))
            _write(self.proc / comp / dev / "state", self._state(comp, idx, t))

    def _header(self, t: float) -> str:
        now = self.t0 + t
        return (f"{'snapshot_time':<25} {now:.9f} secs.nsecs\n"
                f"{'start_time':<25} {self.t0 - 86400:.9f} secs.nsecs\n"
                f"{'elapsed_time':<25} {86400 + t:.9f} secs.nsecs\n")

    def _evicted_at(self) -> float | None:
        if "lustre-eviction" in self.active:
            return EVICT_AT_S
        if "job-storage-stall" in self.job:
            return job.STALL_AT_S
        return None

    def _llite_stats(self, t: float) -> str:
        reads, writes = int(50_000 + 200 * t), int(12_000 + 50 * t)
        if self.job:  # training: reads for the data loader, a log line now and then
            writes = int(12_000 + 0.2 * t)
            if self.job & job.LUSTRE_WAIT:
                reads = int(job.frozen(50_000, 200, t))
            if "job-checkpoint" in self.job and t > job.STALL_AT_S:
                writes += int(CHECKPOINT_WRITES * (min(t, job.RECOVER_AT_S) - job.STALL_AT_S))
        s = self._header(t)
        s += _stat("read_bytes", reads, "bytes", 4096, 4 * MiB, reads * MiB, reads * MiB * MiB)
        s += _stat("write_bytes", writes, "bytes", 4096, 4 * MiB, writes * 4 * MiB, writes * 16 * MiB * MiB)
        s += _usec("read", reads, 900)
        s += _usec("write", writes, 2500)
        s += _stat("ioctl", int(40 + t), "reqs")
        s += _usec("open", 3_000 + 20 * t, 180)
        s += _usec("close", 2_990 + 20 * t, 120)
        s += _usec("getattr", 9_000 + 100 * t, 60)
        s += _usec("setattr", 100 + t, 400)
        s += _usec("fsync", 50 + t / 10, 4000)
        s += _usec("statfs", 20, 300)
        s += _usec("inode_permission", 40_000 + 400 * t, 1)
        s += _stat("opencount", int(3_000 + 20 * t), "reqs", 1, 2, int(3_100 + 20 * t), int(3_300 + 20 * t))
        return s

    def _mdc_wait_us(self, count: int, t: float, rate: float) -> int:
        """Total mdc req_waittime: 350 us each, or, when slow, 350 us + 20 ms per elapsed second."""
        base = 350.0
        if "lustre-mdc-slow" not in self.active:
            return int(count * base)
        k = 20_000.0  # us per second
        return int(count * base + rate * 0.5 * k * t * t)

    def _rpc_stats(self, comp: str, idx: int, t: float) -> str:
        s = self._header(t)
        if comp == "mdc":
            rate = 60.0
            n = int(20_000 + rate * t)
            wait = self._mdc_wait_us(n, t, rate)
            s += _stat("req_waittime", n, "usec", 90, max(132_365, int(wait / max(n, 1)) * 3), wait,
                       wait * 400)
            s += _stat("req_active", n, "reqs", 1, 9, int(n * 1.4), int(n * 2.5))
            s += _usec("mds_getattr", 200 + t, 300)
            s += _usec("mds_close", 3_000 + 20 * t, 250)
            s += _usec("mds_statfs", 20, 400)
            s += _usec("obd_ping", 3_000 + t / 25, 150)
            s += _stat("ldlm_ibits_enqueue", int(12_000 + 30 * t), "reqs", 1, 1, int(12_000 + 30 * t),
                       int(12_000 + 30 * t))
            return s
        active = idx not in (IDLE_OST,) and not (idx == DISCONN_OST and "lustre-import-disconnected"
                                                 in self.active)
        rate = 30.0 if active else 0.0
        n = int(8_000 + rate * t)
        wait = n * 800
        if "job-storage-stall" in self.job and t > job.STALL_AT_S:  # every RPC of the window takes 2 s
            wait += int(rate * (min(t, job.RECOVER_AT_S) - job.STALL_AT_S) * STALL_RPC_WAIT_US)
        if "job-storage-latency" in self.job and t > job.STALL_AT_S:  # every RPC of the window 50x slower
            wait += int(rate * (min(t, job.RECOVER_AT_S) - job.STALL_AT_S) * 800 * (job.LATENCY_FACTOR - 1))
        s += _stat("req_waittime", n, "usec", 120, 90_000, wait, wait * 1200)
        s += _stat("req_active", n, "reqs", 1, 32, n * 6, n * 60)
        reads, writes = int(3_000 + rate * 0.6 * t), int(1_000 + rate * 0.3 * t)
        s += _stat("read_bytes", reads, "bytes", 4096, 4 * MiB, reads * 4 * MiB, reads * 16 * MiB * MiB)
        s += _stat("write_bytes", writes, "bytes", 4096, 4 * MiB, writes * 4 * MiB, writes * 16 * MiB * MiB)
        s += _usec("ost_read", reads, 2_000)
        s += _usec("ost_write", writes, 5_000)
        s += _usec("obd_ping", 3_000 + t / 25, 150)
        return s

    def _import_state(self, comp: str, idx: int, t: float) -> str:
        if comp == "osc" and idx == DISCONN_OST and "lustre-import-disconnected" in self.active:
            return "DISCONN"
        if comp == "osc" and idx == IDLE_OST:
            return "IDLE"
        return "FULL"

    def _import(self, comp: str, dev: str, idx: int, t: float) -> str:
        state = self._import_state(comp, idx, t)
        target = dev.rsplit("-", 2)[0]
        timeouts, attempts, inflight = 0, 1, (4 if comp == "mdc" else 8)
        if state == "DISCONN":
            timeouts, attempts, inflight = 3 + int(t / 10), 2 + int(t / 10), 0
        elif state == "IDLE":
            inflight = 0
        evicted = self._evicted_at()
        if comp == "osc" and idx == EVICTED_OST and evicted is not None and t >= evicted:
            timeouts, attempts = 1, 3
        return (
            "import:\n"
            f"    name: {dev}\n"
            f"    target: {target}_UUID\n"
            f"    state: {state}\n"
            "    connect_flags: [ write_grant, server_lock, version, request_portal, max_byte_per_rpc, "
            "early_lock_cancel, adaptive_timeouts, lru_resize, fid_is_enabled, version_recovery, full20, "
            "layout_lock, 64bithash, jobstats, grant_param, lvb_type, bulk_mbits, second_flags ]\n"
            "    connect_data:\n"
            "       flags: 0xa0425af2e3440078\n"
            "       instance: 7\n"
            "       target_version: 2.15.6.0\n"
            "       max_brw_size: 4194304\n"
            "    import_flags: [ replayable, pingable, connect_tried ]\n"
            "    connection:\n"
            f"       failover_nids: [ {self.nid} ]\n"
            f"       current_connection: {self.nid}\n"
            f"       connection_attempts: {attempts}\n"
            f"       generation: {attempts}\n"
            "       in-progress_invalidations: 0\n"
            f"       idle: {int(t) % 25} sec\n"
            "    rpcs:\n"
            f"       inflight: {inflight}\n"
            "       unregistering: 0\n"
            f"       timeouts: {timeouts}\n"
            "       avg_waittime: 800 usec\n"
            "    service_estimates:\n"
            "       services: 1 sec\n"
            "       network: 1 sec\n"
            "    transactions:\n"
            "       last_replay: 0\n"
            "       peer_committed: 0\n"
            "       last_checked: 0\n"
        )

    def _state(self, comp: str, idx: int, t: float) -> str:
        boot = self.t0 - 86400
        hist = [(boot, "CONNECTING"), (boot, "FULL")]
        current = self._import_state(comp, idx, t)
        if current == "IDLE":
            hist += [(self.t0 - 100, "IDLE")]
        if current == "DISCONN":
            hist += [(self.t0 - 30, "DISCONN")]
        evicted = self._evicted_at()
        if comp == "osc" and idx == EVICTED_OST and evicted is not None and t >= evicted:
            te = self.t0 + int(evicted)
            hist += [(te, "DISCONN"), (te, "CONNECTING"), (te, "EVICTED"), (te, "RECOVER"), (te + 1, "FULL")]
        lines = "".join(f" - [ {ts}, {s} ]\n" for ts, s in hist[-16:])
        return f"current_state: {current}\nstate_history:\n{lines}"

    def _statvfs(self) -> None:
        """Written once, at build time: later ticks leave it alone, so it can be edited by hand."""
        bsize = 4096
        blocks = CAPACITY_BYTES // bsize
        if "lustre-fs-full" in self.active:
            bfree, bavail = blocks // 1000, 0
        else:
            bfree = bavail = int(blocks * 0.62)
        data = {MOUNTPOINT: {"f_bsize": bsize, "f_frsize": bsize, "f_blocks": blocks, "f_bfree": bfree,
                             "f_bavail": bavail, "f_files": INODES, "f_ffree": INODES - 41_000_000}}
        _write(self.root / STATVFS_FILE, json.dumps(data, indent=1) + "\n")


def fake_statvfs(root: Path) -> Callable[[str], Any]:
    """The simulated node's statvfs: reads <root>/sim/lustre-statvfs.json, a JSON object mapping a
    mount point to its statvfs fields (f_frsize, f_blocks, f_bfree, f_bavail, f_files, f_ffree),
    on each call (so a test or a user can edit it while the exporter runs)."""
    path = Path(root) / STATVFS_FILE

    def statvfs(mountpoint: str) -> Any:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, "no simulated statvfs file", str(path)) from None
        if mountpoint not in data:
            raise FileNotFoundError(errno.ENOENT, "mount not in the simulated statvfs file", mountpoint)
        return SimpleNamespace(**data[mountpoint])

    return statvfs


SOURCE = LustreSim
