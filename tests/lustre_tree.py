"""Generated Lustre client trees (2.10, 2.12 and 2.15 layouts) for collector tests and the
benchmark: procfs, sysfs and debugfs under one root, plus a statvfs stand-in."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace


@dataclass
class FsSpec:
    fsname: str
    mountpoint: str
    inst_id: str = "ffff8d1e4c6b9000"
    osts: int = 4
    mdts: int = 1
    network: str = "tcp"

    @property
    def instance(self) -> str:
        return f"{self.fsname}-{self.inst_id}"

    def devices(self) -> list[tuple[str, str, int]]:
        out = [("mdc", f"{self.fsname}-MDT{i:04x}-mdc-{self.inst_id}", i) for i in range(self.mdts)]
        return out + [("osc", f"{self.fsname}-OST{i:04x}-osc-{self.inst_id}", i) for i in range(self.osts)]


STATS_START_TIME = 1699645000  # start_time of the generated stats files on clients 2.15.2+


def stats_header(version: tuple[int, ...]) -> str:
    """The stats header the client version prints (reference: lustre.md section 3.1): one wall-clock
    `snapshot_time` line before 2.14.56; three lines after, with `snapshot_time` in seconds since
    boot and `start_time` 0 on 2.15.0-2.15.1, wall clock from 2.15.2."""
    if version < (2, 14, 56):
        return "snapshot_time             1700000000.000000001 secs.nsecs\n"
    if version < (2, 15, 2):
        return ("snapshot_time             354817.102938475 secs.nsecs\n"
                "start_time                0.000000000 secs.nsecs\n"
                "elapsed_time              354817.102938475 secs.nsecs\n")
    return ("snapshot_time             1700000000.000000001 secs.nsecs\n"
            f"start_time                {STATS_START_TIME}.000000001 secs.nsecs\n"
            f"elapsed_time              {1700000000 - STATS_START_TIME}.000000000 secs.nsecs\n")


def usec_unit(version: tuple[int, ...]) -> str:
    return "usecs" if version >= (2, 15, 52) else "usec"


def llite_stats(version: tuple[int, ...], reads: int = 10, read_bytes: int = 40960, opens: int = 5) -> str:
    if version < (2, 13):
        return (stats_header(version) +
                f"read_bytes                {reads} samples [bytes] 4096 4096 {read_bytes}\n"
                "write_bytes               2 samples [bytes] 4096 4096 8192\n"
                f"open                      {opens} samples [regs]\n"
                "getattr                   7 samples [regs]\n")
    unit = usec_unit(version)
    return (stats_header(version) +
            f"read_bytes                {reads} samples [bytes] 4096 4096 {read_bytes} 1\n"
            "write_bytes               2 samples [bytes] 4096 4096 8192 1\n"
            f"open                      {opens} samples [{unit}] 10 100 {opens * 100} 1\n"
            f"getattr                   7 samples [{unit}] 1 10 70 700\n")


def rpc_stats(count: int = 100, wait_us: int = 50000, read_bytes: int = 0,
              version: tuple[int, ...] = (2, 15, 6)) -> str:
    s = (stats_header(version) +
         f"req_waittime              {count} samples [{usec_unit(version)}] 100 900 {wait_us} 1\n"
         f"req_active                {count} samples [reqs] 1 8 {count} {count}\n")
    if read_bytes:
        s += f"read_bytes                4 samples [bytes] 4096 4194304 {read_bytes} 1\n"
    return s


def import_file(name: str, state: str = "FULL", inflight: int = 2, timeouts: int = 0,
                attempts: int = 1) -> str:
    return ("import:\n"
            f"    name: {name}\n"
            f"    target: {name.rsplit('-', 2)[0]}_UUID\n"
            f"    state: {state}\n"
            "    connect_flags: [ write_grant, server_lock ]\n"
            "    connection:\n"
            "       current_connection: 10.0.0.1@tcp\n"
            f"       connection_attempts: {attempts}\n"
            "    rpcs:\n"
            f"       inflight: {inflight}\n"
            "       unregistering: 0\n"
            f"       timeouts: {timeouts}\n"
            "       avg_waittime: 500 usec\n")


def state_file(history: list[tuple[int, str]], current: str = "FULL") -> str:
    return f"current_state: {current}\nstate_history:\n" + "".join(f" - [ {t}, {s} ]\n" for t, s in history)


@dataclass
class LustreTree:
    """A node's Lustre trees under `root`: root/proc, root/sys, root/sys/kernel/debug."""

    root: Path
    version: str = "2.15.6"
    debugfs: bool = True
    filesystems: list[FsSpec] = field(default_factory=list)

    @property
    def vt(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.version.split(".")[:3])

    @property
    def proc(self) -> Path:
        return self.root / "proc/fs/lustre"

    @property
    def sys(self) -> Path:
        return self.root / "sys/fs/lustre"

    @property
    def debug(self) -> Path:
        return self.root / "sys/kernel/debug/lustre"

    def overrides(self) -> dict[str, str]:
        return {"paths.procfs": str(self.root / "proc"), "paths.sysfs": str(self.root / "sys"),
                "paths.debugfs": str(self.root / "sys/kernel/debug")}

    def stats_dir(self) -> Path:
        """Where llite/osc/mdc stats live for this version."""
        return self.proc if self.vt < (2, 12) else self.debug

    def write(self, path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def build(self) -> LustreTree:
        (self.root / "sys/kernel/debug").mkdir(parents=True, exist_ok=True)
        self.write_mounts()
        self.write(self.sys / "version", self.version + "\n")
        self.write(self.sys / "health_check", "healthy\n")
        for fs in self.filesystems:
            self.add_fs(fs)
        return self

    def write_mounts(self) -> None:
        lines = ["proc /proc proc rw 0 0\n"]
        lines += [f"10.0.0.1@{fs.network}:/{fs.fsname} {fs.mountpoint} lustre rw,flock 0 0\n"
                  for fs in self.filesystems]
        self.write(self.root / "proc/mounts", "".join(lines))

    def add_fs(self, fs: FsSpec) -> None:
        old = self.vt < (2, 12)
        stats = self.stats_dir()
        if old or self.debugfs:
            self.write(stats / "llite" / fs.instance / "stats", llite_stats(self.vt))
            self.write(stats / "llite" / fs.instance / "max_cached_mb",
                       "users: 1\nmax_cached_mb: 1000\nused_mb: 10\nunused_mb: 990\nreclaim_count: 0\n")
        if not old:
            (self.sys / "llite" / fs.instance).mkdir(parents=True, exist_ok=True)
        for comp, dev, _i in fs.devices():
            if old or self.debugfs:
                self.write(stats / comp / dev / "stats",
                           rpc_stats(read_bytes=4096 * 1024 if comp == "osc" else 0, version=self.vt))
            self.write(self.proc / comp / dev / "import", import_file(dev))
            self.write(self.proc / comp / dev / "state", state_file([(1700000000, "CONNECTING"),
                                                                     (1700000000, "FULL")]))
            tunables = self.proc if old else self.sys
            self.write(tunables / comp / dev / "max_rpcs_in_flight", "8\n")


class FakeStatvfs:
    """statvfs stand-in: mountpoint -> fields; counts calls; can sleep to model a hung mount."""

    def __init__(self, sizes: dict[str, int] | None = None, hang_s: float = 0.0) -> None:
        self.sizes = sizes or {}
        self.hang_s = hang_s
        self.calls = 0

    def __call__(self, path: str) -> SimpleNamespace:
        import time

        self.calls += 1
        if self.hang_s:
            time.sleep(self.hang_s)
        if path not in self.sizes:
            raise FileNotFoundError(2, "No such file or directory", path)
        blocks = self.sizes[path] // 4096
        return SimpleNamespace(f_frsize=4096, f_bsize=4096, f_blocks=blocks, f_bfree=blocks // 2,
                               f_bavail=blocks // 4, f_files=1000, f_ffree=900)
