"""Where each Lustre client file lives for the running client version, reading it, and statvfs.

| file | 2.10 | 2.12+ |
|---|---|---|
| llite/osc/mdc `stats`, llite `max_cached_mb` | procfs | debugfs (root-only, must be mounted) |
| osc/mdc `import`, `state` | procfs | procfs |
| osc/mdc `max_rpcs_in_flight` | procfs | sysfs |
| `health_check`, `version` | sysfs | sysfs (2.13+ also a debugfs `health_check`) |

procfs = <procfs>/fs/lustre, sysfs = <sysfs>/fs/lustre, debugfs = <debugfs>/lustre. Each file is
looked for in the version's usual tree first and then in the others, so an unknown or
unexpected layout still resolves.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from exporter import deadline

SOURCES = ("procfs", "sysfs", "debugfs")

# file kind -> (trees for clients < 2.12, trees for clients >= 2.12 or unknown)
_ORDER: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "stats": (("procfs", "debugfs"), ("debugfs", "procfs")),
    "max_cached_mb": (("procfs", "debugfs", "sysfs"), ("debugfs", "sysfs", "procfs")),
    "import": (("procfs",), ("procfs",)),
    "state": (("procfs",), ("procfs",)),
    "max_rpcs_in_flight": (("procfs", "sysfs"), ("sysfs", "procfs")),
    "health_check": (("sysfs", "procfs", "debugfs"), ("sysfs", "procfs", "debugfs")),
    "version": (("sysfs", "procfs"), ("sysfs", "procfs")),
}
# Trees a client version keeps data in; a tree not needed is not reported as a source.
NEEDED_OLD = ("procfs", "sysfs")
NEEDED_NEW = ("procfs", "sysfs", "debugfs")


class SourceState:
    """What went wrong with one tree during one scrape ('' when nothing did)."""

    def __init__(self) -> None:
        self.problem = ""
        self.hung = False  # the problem is a read past its deadline, not the tree's access

    def fail(self, why: str, hung: bool = False) -> None:
        if not self.problem:
            self.problem, self.hung = why, hung


_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
# The largest Lustre file read. The biggest real ones (llite stats of a 2.16 client, an import
# file with its flag lists) are a few KiB; a file past this is not a Lustre file we know (or one
# that never ends) and is refused: bounded memory and time whatever the file system serves.
MAX_FILE_BYTES = 1 << 20
# The mounts files are the exception: a Kubernetes node with thousands of mounts has a mountinfo
# of several MiB.
MAX_MOUNTS_BYTES = 64 << 20
_MOUNTS_FILES = ("/mountinfo", "/mounts")
_CHUNK = 65536
# Files the kernel prints as one seq_file record (single_open) or a sysfs attribute: one read of
# _CHUNK bytes returns all of a shorter file, so a short read is the end and the read that would
# return b"" is skipped (a stats file is printed a counter a record and can come in pieces).
_ONE_RECORD = ("/import", "/state", "/max_rpcs_in_flight")


def read_text(path: str, max_bytes: int | None = None) -> str:
    """The file's text (UTF-8, bad bytes replaced). os.open/os.read rather than open(): a third
    of the system calls and none of the text-layer set-up, for 3 small files per OST a scrape.
    A file longer than `max_bytes` (MAX_FILE_BYTES, MAX_MOUNTS_BYTES for a mounts file) raises
    OSError(EFBIG) after reading at most max_bytes + 1."""
    if max_bytes is None:
        max_bytes = MAX_MOUNTS_BYTES if path.endswith(_MOUNTS_FILES) else MAX_FILE_BYTES
    fd = os.open(path, _FLAGS)
    try:
        data = os.read(fd, _CHUNK)
        # a pseudo-file can answer in pieces (a seq_file, a page at a time): read to EOF
        if data and (len(data) == _CHUNK or not path.endswith(_ONE_RECORD)):
            more = os.read(fd, _CHUNK)
            if more:
                chunks, size = [data, more], len(data) + len(more)
                while more and size <= max_bytes:
                    more = os.read(fd, min(_CHUNK, max_bytes + 1 - size))
                    chunks.append(more)
                    size += len(more)
                if size > max_bytes:
                    raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes; not read", path)
                data = b"".join(chunks)
            elif len(data) > max_bytes:
                raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes; not read", path)
    except OSError as e:
        e.filename = e.filename or path  # os.read does not name the file
        raise
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace")


def _read_rest(fd: int, path: str, data: bytes, max_bytes: int) -> bytes:
    """`data` (a read at offset 0) and the rest of the file, read with pread up to EOF; past
    max_bytes raises OSError(EFBIG) after reading at most max_bytes + 1."""
    size = len(data)
    chunks = [data]
    while size <= max_bytes:
        more = os.pread(fd, min(_CHUNK, max_bytes + 1 - size), size)
        if not more:
            break
        chunks.append(more)
        size += len(more)
    if size > max_bytes:
        raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes; not read", path)
    return data if len(chunks) == 1 else b"".join(chunks)


class _Replaced(Exception):
    """A kept regular file was unlinked or replaced (its path names another file now)."""


def _fd_budget() -> int:
    """How many descriptors KeptFiles may hold: half the soft limit on open files, so the rest of
    the exporter (EFA counter files, sockets) keeps the other half."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 0
    return 1 << 15 if soft == resource.RLIM_INFINITY else max(0, soft // 2 - 32)


class KeptFiles:
    """Reads files through descriptors kept open between scrapes: one pread() at offset 0 a file
    (a stats file: one more, which returns nothing), no path walk, open or close.

    procfs, debugfs and sysfs print a file again on each read at offset 0 (seq_file restarts),
    and a read of a file whose device went away fails (EIO, ENODEV): the descriptor is then closed
    and the path opened again, so a removed file reads as missing, as by path. A regular file (a
    simulated or test tree, told apart at open: its size is what was read, or it has blocks;
    kernel files show 0 or 4096 and no blocks) can be replaced by rename, which a read through
    the old descriptor would not see: it is fstat()ed after each read and opened again when
    unlinked (`trust_regular` skips that, for a benchmark of a tree that does not change: what
    reading kernel files costs). Files that read empty are not kept (a seq_file at its end stays
    there on pread).

    `sweep` closes the descriptors of files not read since the last sweep and `forget` all of
    them (the collector calls it when the device set changes, and at close). At most half the soft
    limit on open files are kept by all KeptFiles of the process together; the other files are
    read by path. Mount files are always read by path (they can be large and are read once a
    scrape). Thread-safe for the reader's workers: the hot path reads the table without a lock;
    changes to it take the lock.
    """

    _lock = threading.Lock()  # guards every instance's table and the process-wide count
    _kept_total = 0
    max_open = _fd_budget()  # process-wide

    def __init__(self, trust_regular: bool = False) -> None:
        self.trust_regular = trust_regular
        self._files: dict[str, tuple[int, bool, bool]] = {}  # path -> (fd, check by fstat, whole if short)
        self._seen: set[str] = set()

    def __call__(self, path: str) -> str:
        f = self._files.get(path)
        if f is not None:
            self._seen.add(path)
            fd, check, whole = f
            try:
                data = os.pread(fd, _CHUNK, 0)
                if check and os.fstat(fd).st_nlink == 0:
                    raise _Replaced
            except (OSError, _Replaced):
                self._drop(path, f)  # opened again below: a read error or a removed file
            else:
                n = len(data)
                if 0 < n < _CHUNK and whole:  # a short read is all of it
                    return data.decode("utf-8", "replace")
                if n:
                    try:
                        return _read_rest(fd, path, data, MAX_FILE_BYTES).decode("utf-8", "replace")
                    except OSError as e:
                        self._drop(path, f)
                        if e.errno == errno.EFBIG:
                            raise
                else:
                    self._drop(path, f)
        return self._open_read(path)

    def _open_read(self, path: str) -> str:
        if path.endswith(_MOUNTS_FILES) or KeptFiles._kept_total >= KeptFiles.max_open:
            return read_text(path)
        try:
            fd = os.open(path, _FLAGS)
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE):
                with KeptFiles._lock:  # out of descriptors: keep fewer from now on
                    KeptFiles.max_open = KeptFiles._kept_total // 2
                self.forget()
                return read_text(path)
            raise
        keep = False
        try:
            one = path.endswith(_ONE_RECORD)
            try:
                data = os.pread(fd, _CHUNK, 0)
            except OSError as e:
                if e.errno != errno.ESPIPE:
                    raise
                return read_text(path)  # a file opened non-seekable: read (and opened) by path

            if data and (len(data) == _CHUNK or not one):
                data = _read_rest(fd, path, data, MAX_FILE_BYTES)
            if data:
                st = os.fstat(fd)
                regular = st.st_size == len(data) or st.st_blocks != 0
                with KeptFiles._lock:
                    if path not in self._files and KeptFiles._kept_total < KeptFiles.max_open:
                        self._files[path] = (fd, regular and not self.trust_regular, regular or one)
                        KeptFiles._kept_total += 1
                        self._seen.add(path)
                        keep = True
        except OSError as e:
            e.filename = e.filename or path  # os.pread does not name the file
            raise
        finally:
            if not keep:
                os.close(fd)
        return data.decode("utf-8", "replace")

    def _drop(self, path: str, f: tuple[int, bool, bool]) -> None:
        with KeptFiles._lock:
            if self._files.get(path) is f:
                del self._files[path]
                KeptFiles._kept_total -= 1
                os.close(f[0])

    def sweep(self) -> None:
        """Close the descriptors of files not read since the last sweep."""
        with KeptFiles._lock:
            seen, self._seen = self._seen, set()
            for path in [p for p in self._files if p not in seen]:
                os.close(self._files.pop(path)[0])
                KeptFiles._kept_total -= 1

    def forget(self) -> None:
        """Close every kept descriptor."""
        with KeptFiles._lock:
            files, self._files = self._files, {}
            self._seen = set()
            KeptFiles._kept_total -= len(files)
            for fd, _, _ in files.values():
                os.close(fd)

    def __len__(self) -> int:
        return len(self._files)


class Tree:
    """The three Lustre trees of one node, with per-scrape source problems recorded."""

    def __init__(self, procfs: str, sysfs: str, debugfs: str, pool: deadline.Pool, timeout_s: float,
                 reader: Callable[[str], str] = read_text) -> None:
        self.debugfs_root = Path(debugfs)
        self.roots = {"procfs": Path(procfs) / "fs/lustre", "sysfs": Path(sysfs) / "fs/lustre",
                      "debugfs": self.debugfs_root / "lustre"}
        self._root_str = {k: str(v) for k, v in self.roots.items()}
        # A Lustre client's stats file can block in the kernel (a client waiting on a server), and
        # a blocked read cannot be interrupted: each file is read under its own deadline
        # (`timeout_s`, exporter.deadline). A hung file fails with TimeoutError (only its series
        # are missing) and is not read again until its read returns: it costs its deadline once.
        self.reader = reader  # path -> text (tests wrap it)
        self.timeout_s = timeout_s
        self._files = deadline.Deadlines(pool)
        self.version: tuple[int, ...] | None = None
        self.state = {s: SourceState() for s in SOURCES}
        self._reach: dict[str, int] = {}  # file kind -> trees to read at first (see read_many)
        # request -> its candidate (tree, path)s, for this scrape and the last (bounded: devices
        # that left are forgotten after a scrape), for the layout they were made for
        self._cands: dict[tuple[str, ...], tuple[tuple[str, str], ...]] = {}
        self._cands_old: dict[tuple[str, ...], tuple[tuple[str, str], ...]] = {}
        self._cands_layout: bool | None = None
        # id -> (a request list read in one batch, its first-tree paths, its kinds), for this
        # scrape and the last (the list is held, so its id is not reused while here)
        self._batches: dict[int, tuple[Sequence[tuple[str, ...]], list[str], dict[str, int]]] = {}
        self._batches_old: dict[int, tuple[Sequence[tuple[str, ...]], list[str], dict[str, int]]] = {}

    def begin(self) -> None:
        self.state = {s: SourceState() for s in SOURCES}
        self._cands_old, self._cands = self._cands, {}
        self._batches_old, self._batches = self._batches, {}

    def new_layout(self) -> bool:
        return self.version is None or self.version >= (2, 12)

    def needed(self) -> tuple[str, ...]:
        return NEEDED_NEW if self.new_layout() else NEEDED_OLD

    def order(self, kind: str) -> tuple[str, ...]:
        old, new = _ORDER[kind]
        return new if self.new_layout() else old

    def check_roots(self) -> None:
        """Record trees that are absent or unreadable as a whole."""
        for src, root in self.roots.items():
            try:
                os.listdir(root)
            except PermissionError:
                self.state[src].fail(f"{root} is not readable (permission denied)")
            except FileNotFoundError:
                if src == "debugfs" and not _has_entries(self.debugfs_root):
                    self.state[src].fail(f"debugfs is not mounted at {self.debugfs_root}")
                else:
                    self.state[src].fail(f"{root} does not exist")
            except OSError as e:
                self.state[src].fail(f"{root}: {e.strerror or e}")

    def listdir(self, kind: str) -> dict[str, str]:
        """Entry names under `<tree>/<kind>` in every tree -> the first tree they were seen in."""
        out: dict[str, str] = {}
        for src in SOURCES:
            try:
                names = os.listdir(self.roots[src] / kind)
            except OSError:
                continue
            for n in names:
                out.setdefault(n, src)
        return out

    def read_files(self, paths: list[str]) -> list[str | BaseException]:
        """Each path's text, or the exception its read raised (TimeoutError past its deadline),
        all of them read in one hand-over to a pool worker."""
        out: list[str | BaseException] = []
        outcomes = self._files.each(paths, lambda path: self.reader(path), timeout=self.timeout_s)
        for p, o in zip(paths, outcomes, strict=True):
            if o.status in (deadline.OK, deadline.ERROR):
                out.append(o.value)
            else:  # not read in time: its reason in the error the callers report
                out.append(TimeoutError(errno.ETIMEDOUT, o.reason, p))
        return out

    def read(self, kind: str, *parts: str) -> str | None:
        """The text of the file `kind` under `<tree>/<parts>/`, trying the version's trees in
        order; None when no tree has it. A permission or I/O error marks that tree failed for
        this scrape and the next tree is tried."""
        return self.read_many([(kind, *parts)])[0]

    def read_many(self, requests: Sequence[tuple[str, ...]]) -> list[str | None]:
        """`read` of each (kind, *parts), the files read in batches (one hand-over to the reader
        each). The first batch reads each file in its trees in order up to the tree the file's
        kind was found in at the last scrape (the first tree at the first); the trees after are
        read only for files the batch found in none of those. The answer is the same as reading
        every candidate: the first tree that has the file wins."""
        layout = self.new_layout()
        if layout != self._cands_layout:
            self._cands, self._cands_old, self._cands_layout = {}, {}, layout
            self._batches, self._batches_old = {}, {}
        first: list[str | BaseException] | None = None
        if not any(v > 1 for v in self._reach.values()):
            # The usual scrape: every kind was found in its first tree last time, so the first
            # batch is one path per file; when each is read, that is the whole answer. The paths
            # are kept for the same (unchanged) request list: the collector passes the one it keeps
            # for a mount until its devices change.
            batch = self._batches.get(id(requests)) or self._batches_old.get(id(requests))
            if batch is None or batch[0] is not requests:
                batch = (requests, [self._candidates(req)[0][1] for req in requests],
                         dict.fromkeys({req[0] for req in requests}, 1))
            self._batches[id(requests)] = batch
            paths = batch[1]
            first = self.read_files(paths)
            if set(map(type, first)) <= _ONLY_STR:
                self._reach.update(batch[2])
                return first  # type: ignore[return-value]
        cands = [self._candidates(req) for req in requests]
        texts: list[list[str | BaseException]] = [[] for _ in requests]
        upto = [min(len(c), self._reach.get(req[0], 1)) for req, c in zip(requests, cands, strict=True)]
        todo = list(range(len(requests)))
        while todo:
            wanted = [(i, path) for i in todo for _, path in cands[i][len(texts[i]):upto[i]]]
            if first is not None:  # that first batch, read above
                got, first = first, None
            else:
                got = self.read_files([p for _, p in wanted])
            for (i, _), r in zip(wanted, got, strict=True):
                texts[i].append(r)
            todo = []
            for i, t in enumerate(texts):
                if len(t) < len(cands[i]) and all(isinstance(r, BaseException) for r in t):
                    upto[i] = len(cands[i])
                    todo.append(i)
        reach: dict[str, int] = {}
        for req, t in zip(requests, texts, strict=True):
            won = next((k for k, r in enumerate(t) if not isinstance(r, BaseException)), None)
            if won is not None:
                reach[req[0]] = max(reach.get(req[0], 0), won + 1)
        self._reach.update(reach)
        return [self._first(c[:len(t)], t) for c, t in zip(cands, texts, strict=True)]

    def _candidates(self, req: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
        c = self._cands.get(req)
        if c is None:
            c = self._cands_old.get(req)
            if c is None:
                tail = "/".join((*req[1:], req[0]))
                c = tuple((src, f"{self._root_str[src]}/{tail}") for src in self.order(req[0]))
            self._cands[req] = c
        return c

    def _first(self, cands: tuple[tuple[str, str], ...], texts: list[str | BaseException]) -> str | None:
        for (src, path), r in zip(cands, texts, strict=True):
            if not isinstance(r, BaseException):
                return r
            if isinstance(r, (FileNotFoundError, NotADirectoryError)):
                continue
            if isinstance(r, PermissionError):
                self.state[src].fail(f"{path} is not readable (permission denied)")
            elif isinstance(r, TimeoutError):
                self.state[src].fail(f"{path}: {r.strerror or r} (Lustre client hung?); its series are "
                                     "left out", hung=True)
            elif isinstance(r, OSError):
                if r.errno != errno.ENODEV:
                    self.state[src].fail(f"{path}: {r.strerror or r}")
            else:
                raise r
        return None


_ONLY_STR = frozenset({str})


def _has_entries(path: Path) -> bool:
    try:
        return any(True for _ in os.scandir(path))
    except OSError:
        return False


StatvfsFn = Callable[[str], Any]


__all__ = ["MAX_FILE_BYTES", "MAX_MOUNTS_BYTES", "SOURCES", "KeptFiles", "StatvfsFn", "Tree", "read_text"]
