"""The one place EFA code touches the file system: a seam tests replace to inject errors.

Counter files are read relative to an open directory (`open_dir` + `read_files`): the path of a
device's directory (through the class/infiniband symlink) is walked once per scrape, not once per
file. Directory descriptors live only for one device's read; nothing stays open across scrapes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


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

    def read_files(self, dir_fd: int, names: Sequence[str], paths: Sequence[str]) -> list[bytes]:
        """One read() of each file `names[i]` in the open directory `dir_fd`, in order; `paths[i]`
        is its full path, named by the OSError raised (as the driver returns it) at the first
        file that cannot be opened or read."""
        out: list[bytes] = []
        append, open_, read, close = out.append, os.open, os.read, os.close
        try:
            for name in names:
                fd = open_(name, _FILE_FLAGS, dir_fd=dir_fd)
                try:
                    append(read(fd, 4096))
                finally:
                    close(fd)
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
