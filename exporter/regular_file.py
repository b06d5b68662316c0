"""Files that must be regular files (the config and web config, certificates, the state files,
the boot id): opened without blocking and checked before anything reads them, since a FIFO planted
at such a path would block an open() or read() forever (start-up, reload, shutdown and `check` all
read these files)."""

from __future__ import annotations

import errno
import os
import stat


class NotRegularFile(OSError):
    """The path is there but is not a regular file. `kind` says what it is ("a FIFO", ...)."""

    def __init__(self, kind: str, path: str | os.PathLike[str] = "") -> None:
        super().__init__(errno.EINVAL, f"{kind}, not a regular file", str(path))
        self.kind = kind


def file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "a special file"


def open_regular(path: str | os.PathLike[str], flags: int = os.O_RDONLY, mode: int = 0o644,
                 follow: bool = True) -> int:
    """A descriptor of the regular file at `path`, opened non-blocking (and, with `follow`
    False, without following a symbolic link at its last component). Raises NotRegularFile
    naming what is there instead, or the OSError of the open."""
    nofollow = 0 if follow else os.O_NOFOLLOW
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC | nofollow, mode)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise NotRegularFile("a symbolic link", path) from e
        try:  # a socket (ENXIO), a device without its driver...: say what is there, not just why
            st_mode = (os.stat if follow else os.lstat)(path).st_mode
        except OSError:
            raise e from None
        if not stat.S_ISREG(st_mode):
            raise NotRegularFile(file_kind(st_mode), path) from e
        raise
    st_mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(st_mode):
        os.close(fd)
        raise NotRegularFile(file_kind(st_mode), path)
    return fd


def read_regular(path: str | os.PathLike[str], limit: int, follow: bool = True) -> bytes:
    """The bytes of the regular file at `path` (open_regular), at most `limit` + 1 of them: a
    result longer than `limit` tells the caller the file is over it."""
    fd = open_regular(path, follow=follow)
    try:
        chunks, total = [], 0
        while total <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - total))):
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
