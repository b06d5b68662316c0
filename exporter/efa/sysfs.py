"""The one place EFA code touches the file system: a seam tests replace to inject errors.

Counter files are opened once (`open_file`, relative to their open directory) and then read with
one pread() each per scrape (`read_fds`): no path walk, open or close on the hot path. Directory
descriptors live only while a device's files are being opened.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
READ_SIZE = 128  # a counter is at most 20 digits and a newline; a longer file is a bad read anyway


class SysfsReader:
    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def read(self, path: str) -> str:
        """One read() of a sysfs attribute; raises OSError as the driver returns it (EIO, ...)."""
        fd = os.open(path, _FILE_FLAGS)
        try:
            return os.read(fd, 4096).decode("ascii", "replace")
        except OSError as e:
            if e.filename is None:
                e.filename = path  # os.read does not name the file
            raise
        finally:
            os.close(fd)

    def open_dir(self, path: str, dir_fd: int | None = None) -> int:
        """A descriptor of directory `path` (relative to `dir_fd` when given); close it with close()."""
        return os.open(path, _DIR_FLAGS, dir_fd=dir_fd)

    def listdir_fd(self, fd: int) -> list[str]:
        return os.listdir(fd)

    def stat(self, path: str, dir_fd: int | None = None) -> os.stat_result:
        return os.stat(path, dir_fd=dir_fd)

    def fstat(self, fd: int) -> os.stat_result:
        return os.fstat(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def open_file(self, name: str, dir_fd: int, path: str) -> int:
        """A descriptor of file `name` in the open directory `dir_fd`; `path` (its full path) names it
        in the OSError. Opening blocks where a read would (a FIFO), so it runs under the deadline."""
        try:
            return os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as e:
            e.filename = path
            raise

    def read_fds(self, fds: Sequence[int], paths: Sequence[str]) -> list[bytes]:
        """One pread() from offset 0 of each open file, in order (sysfs regenerates an attribute on
        each read at offset 0); `paths[i]` is named by the OSError raised at the first that fails."""
        out: list[bytes] = []
        append, pread = out.append, os.pread
        try:
            for fd in fds:
                append(pread(fd, READ_SIZE, 0))
        except OSError as e:
            e.filename = paths[len(out)]  # the file being read when it failed
            raise
        return out

    def readlink_or_none(self, path: str) -> str | None:
        try:
            return os.readlink(path)
        except OSError:
            return None

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)
