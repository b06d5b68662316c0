"""Generated EFA sysfs trees and test seams shared by the EFA tests."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from exporter.catalog import Families
from exporter.collectors.efa import EfaCollector
from exporter.compose import compose
from exporter.config import load
from exporter.efa.sysfs import SysfsReader
from exporter.runner import Runner
from exporter.tools.simulate.efa import write_device
from tests.helpers import scrape, test_pool


def efa(sys_root: Path, name: str, bus: int, **kw) -> Path:
    """An EFA device on PCI bus `bus` (slot 0)."""
    return write_device(sys_root, name, f"0000:{bus:02x}:00.0", **kw)


def mellanox(sys_root: Path, name: str = "mlx5_0", bus: int = 0x30) -> Path:
    return write_device(sys_root, name, f"0000:{bus:02x}:00.0", vendor="0x15b3", device_id="0x101b",
                        driver="mlx5_core", counters=False, rate="400 Gb/sec (4X NDR)")


def collector(sys_root: Path, reader: SysfsReader | None = None, pool=None, **overrides) -> EfaCollector:
    # every counter unless a test asks otherwise: most tests check how each file is read
    cfg = load(None, {"paths.sysfs": str(sys_root), "efa.counters": "all", **overrides})
    ctx = compose(cfg, pool=pool)
    return EfaCollector(ctx, reader=reader)


def run(c: EfaCollector) -> str:
    """One scrape through the real runner (collector success/duration included)."""
    return scrape(Runner([c], deadline_s=10, pool=test_pool()))


def collect(c: EfaCollector) -> Families:
    out = Families()
    c.collect(out)
    return out


class FaultyReader(SysfsReader):
    """A SysfsReader that raises OSError(errno) when reading a path ending in a suffix given to
    `fail`, counts reads per path (`reads`) and directory listings (`listings`), runs
    `on_read(path)` before each read, and reads ENODEV from a file that no longer exists."""

    def __init__(self) -> None:
        self.faults: dict[str, int] = {}
        self.reads: dict[str, int] = {}
        self.listings = 0  # directory listings taken (of a device's directories)
        self.class_listings = 0  # listings of class/infiniband
        self.opens = 0  # counter and rate files opened
        self.on_read = None  # optional callback(path) run before each read

    def fail(self, suffix: str, err: int = errno.EIO) -> None:
        self.faults[suffix] = err

    def _check(self, path: str) -> None:
        self.reads[path] = self.reads.get(path, 0) + 1
        if self.on_read is not None:
            self.on_read(path)
        for suffix, err in self.faults.items():
            if path.endswith(suffix):
                raise OSError(err, errno.errorcode[err], path)

    def listdir_fd(self, fd: int) -> list[str]:
        self.listings += 1
        return super().listdir_fd(fd)

    def listdir(self, path: str) -> list[str]:
        self.class_listings += 1
        return super().listdir(path)

    def open_file(self, name: str, dir_fd: int, path: str) -> int:
        self.opens += 1
        return super().open_file(name, dir_fd, path)

    def read(self, path: str) -> str:
        self._check(path)
        return super().read(path)

    def read_fds(self, fds, paths) -> list[bytes]:
        out = []
        for fd, path in zip(fds, paths, strict=True):
            self._check(path)
            if not os.path.lexists(path):
                # sysfs: an open attribute of a removed device reads ENODEV (a regular file would
                # still read its old text)
                raise OSError(errno.ENODEV, errno.errorcode[errno.ENODEV], path)
            out += super().read_fds([fd], [path])
        return out
