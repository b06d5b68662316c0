"""The one place EFA code touches the file system: a seam tests replace to inject errors."""

from __future__ import annotations

import os


class SysfsReader:
    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def read(self, path: str) -> str:
        """One read() of a sysfs attribute; raises OSError as the driver returns it (EIO, ...)."""
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.read(fd, 4096).decode("ascii", "replace")
        except OSError as e:
            if e.filename is None:
                e.filename = path  # os.read does not name the file
            raise
        finally:
            os.close(fd)

    def readlink_or_none(self, path: str) -> str | None:
        try:
            return os.readlink(path)
        except OSError:
            return None

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)
