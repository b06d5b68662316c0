"""The state files in `state_dir`: one implementation for every document (exporter.state).

A state file is JSON keyed by the boot id and the kernel log its counts came from, written
atomically (temporary file, fsync, rename, fsync of the directory) under an advisory lock on the
state directory shared with `ack` and `check`. Each file has one writer (the daemon; `ack` for
the acks file), so a write never merges with what is on disk. What a document holds and how it
is validated are its Document's (exporter.state.document); this module reads, upgrades, checks,
sets aside and writes, adding the envelope every document shares (version, boot_id, kmsg,
recoveries). Never raises: problems are logged once and recorded in `status` (metrics).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.regular_file import NotRegularFile, open_regular, read_regular
from exporter.state.document import Document, Sectioned
from exporter.state.values import mapping, show
from exporter.state.versions import NewerVersion, StateError

log = logging.getLogger("exporter.state.file")

CORRUPT_KEEP = 5  # corrupt state files set aside that are kept for a human (oldest removed)
LOCK_NAME = "xid-state.json.lock"  # one advisory lock for the state directory

def _remove_stale_temps(path: Path) -> None:
    """Temporary files of `path` left by a writer killed mid-write. Writers of a state file are
    serialised (the lock, or one daemon), so any found before writing are stale."""
    prefix = f".{path.name}."
    try:
        names = [n for n in os.listdir(path.parent) if n.startswith(prefix) and n.endswith(".tmp")]
    except OSError:
        return
    for n in names:
        with contextlib.suppress(OSError):
            os.unlink(path.parent / n)  # a symlink is removed, never followed
            log.info("removed stale temporary file %s (a write was interrupted)", path.parent / n)


def _open_temp(tmp: Path) -> int:
    """Create the temporary file, never following a symlink planted at its name."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(tmp, flags, 0o644)
    except FileExistsError:
        os.unlink(tmp)  # planted, or left by an earlier process with our pid: remove the name
        return os.open(tmp, flags, 0o644)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write `data` as JSON to `path` atomically: a temporary file created O_EXCL|O_NOFOLLOW,
    fsync, rename, fsync of the directory; stale temporary files removed first. Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with os.fdopen(_open_temp(tmp), "w") as f:
            json.dump(data, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


MAX_STATE_BYTES = 16 << 20  # far above any state within the limits (a few hundred KiB at most)


def read_state_file(path: str | os.PathLike[str], max_bytes: int = MAX_STATE_BYTES) -> bytes:
    """A state file's bytes: a regular file, its last component not a symbolic link (the state
    directory may be shared with other tools), at most `max_bytes` (more is an error)."""
    data = read_regular(path, max_bytes, follow=False)
    if len(data) > max_bytes:
        raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes", str(path))
    return data


def read_boot_id(procfs: str) -> str:
    """The kernel's boot id (<procfs>/sys/kernel/random/boot_id); '' when unreadable."""
    try:
        raw = read_state_file(Path(procfs, "sys/kernel/random/boot_id"), 4096)
        return raw.decode("ascii", "replace").strip()
    except OSError:
        return ""


FileIdentity = tuple[int, int, int, int]  # (st_dev, st_ino, st_size, st_mtime_ns)


def file_identity(st: os.stat_result) -> FileIdentity:
    """What tells one version of a file from another without reading it."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def identity_on_disk(path: Path) -> FileIdentity | None:
    """The file_identity of what is at `path` now (not following a symlink); None when nothing."""
    try:
        return file_identity(os.lstat(path))
    except OSError:
        return None


def encodable(s: str) -> str:
    """`s` as UTF-8 can encode it (a path's undecodable bytes, held as lone surrogates, replaced)."""
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def set_aside(path: Path, keep: int | None, kind: str = "corrupt") -> Path:
    """Rename a corrupt state file to `<name>.<kind>-<UTC time>[.n]` for a human (`kind`:
    "corrupt", "newer-v<N>" for a newer version's, "migrated" for an old file read into the
    state document), keeping the newest `keep` of each kind (None: all).
    Raises OSError when it cannot be renamed."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = next(p for n in range(1000) if not (p := path.with_name(
        f"{path.name}.{kind}-{stamp}" + (f".{n}" if n else ""))).exists())
    os.replace(path, aside)
    for p in sorted(path.parent.glob(f"{path.name}.{kind}-*"))[:-keep] if keep is not None else ():
        with contextlib.suppress(OSError):
            p.unlink()
    return aside


@dataclass
class StateStatus:
    ok: bool = True  # the last read and write of the state file worked
    # "", "missing", "corrupt", "newer_version", "unreadable", "unwritable", "other_boot", "no_boot_id"
    problem: str = ""
    read_errors: int = 0
    write_errors: int = 0
    writes: int = 0


class StateFile:
    """One state file in `state_dir`: `doc`'s (its name, versions and validator), upgraded to
    this exporter's version when read. `kmsg` names the kernel log its counts come from: a file
    of another log is not this one's ("" reads any)."""

    def __init__(self, state_dir: str, boot_id: str, kmsg: str = "", read_only: bool = False, *,
                 doc: Document) -> None:
        self.kmsg = encodable(kmsg)  # the kernel log the counts came from; a state of another log is not ours
        self.dir = Path(state_dir)
        self.doc = doc
        self.path = self.dir / doc.name
        self.what = doc.schema.what  # names its counts in log lines ("XID", "SXid", "workload", "acks")
        self.label = "state file" if self.what == "XID" else f"{self.what} state file"  # in log lines
        self.boot_id = boot_id
        # read_only (`check`): a corrupt file is reported but left in place for the daemon, which
        # sets it aside and records the recovery.
        self.read_only = read_only
        self.status = StateStatus()
        # corrupt state files set aside this boot: read from the file, plus those set aside here
        self.recoveries = 0
        # Set by hold(), once the caller holds what the file held and writes it back (the daemon
        # once it runs): a corrupt file set aside from then on loses nothing, so it is no recovery.
        self.holds = False
        self._ident: FileIdentity | None = None  # the file as we last read or wrote it (file_identity)
        self._written: FileIdentity | None = None  # the file as we last wrote it
        self._behind = False  # what is on disk is not what we hold: the next flush writes
        self._bad: FileIdentity | None = None  # a file found corrupt that could not be set aside: not re-read
        self._logged: set[str] = set()
        # The path is not a regular file (a FIFO, a link...): nothing is read from or written
        # to it for the rest of the run; counts are kept in memory (logged once, an error).
        self.disabled = False

    def loss(self, newer: bool = False) -> str:
        """What is lost with a file set aside (log lines): counts come back from the kernel log
        while it still has them. `newer`: set aside as a newer version's."""
        if newer:
            return (f"{self.what} counts are rebuilt from the kernel log, and one recorded only in that file "
                    "(ring buffer wrapped since) is not counted by this version")
        return (f"{self.what} counts are rebuilt from the kernel log: one recorded only in the old file "
                "(ring buffer wrapped since) is lost")

    def hold(self) -> None:
        """From now on the caller holds what the file held and writes it back whenever the file is
        not what it holds (the daemon, once it runs): a corrupt file set aside loses nothing."""
        self.holds = True

    def _refuse(self, e: OSError) -> None:
        """The state path is not a regular file: log it once and carry on without persistence."""
        self.disabled = True
        self.status.ok, self.status.problem = False, "unreadable"
        self.status.read_errors += 1
        if "not_regular" not in self._logged:
            self._logged.add("not_regular")
            log.error("%s %s is %s: %s counts are not persisted (kept in memory only) until it is "
                      "removed and the exporter restarted", self.label, self.path, e.strerror, self.what)

    def _problem(self, kind: str, msg: str, *, write: bool) -> None:
        self.status.ok = False
        self.status.problem = kind
        if write:
            self.status.write_errors += 1
        else:
            self.status.read_errors += 1
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("%s %s: %s", self.label, self.path, msg)

    @contextlib.contextmanager
    # an advisory lock shared by the daemon, check and ack
    def locked(self, wait: bool = True) -> Iterator[bool]:
        """Hold the state directory's lock. Yields False, holding nothing, when `wait` is False and
        another holds it (the scrape path never waits for an `ack` in progress)."""
        fd = None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = open_regular(self.dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, follow=False)
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if fd is not None:
                os.close(fd)
            fd = None  # a read-only state dir (or no regular lock file): go on without the lock
            if isinstance(e, BlockingIOError):
                yield False
                return
        try:
            yield True
        finally:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def read(self) -> dict[str, Any] | None:
        """The state for this boot, or None (missing, corrupt, another boot)."""
        if self.disabled:
            return None
        try:
            ident = file_identity(os.lstat(self.path))  # a dangling symlink is a symlink, not missing
            if ident == self._bad:  # the same corrupt file as before: its verdict stands
                return None
            raw = read_state_file(self.path)
        except NotRegularFile as e:
            self._refuse(e)
            return None
        except FileNotFoundError:
            self.status.problem = "missing"
            return None
        except OSError as e:
            if e.errno == errno.EFBIG:  # beyond any state within the limits: corrupt
                self._corrupt(StateError(f"larger than {MAX_STATE_BYTES} bytes"), ident)
                return None
            self._problem("unreadable", f"cannot read: {e.strerror or e}", write=False)
            return None
        self._ident = ident
        try:
            doc = self.doc.schema.upgrade(json.loads(raw.decode("utf-8")))  # an older version migrated
            self.doc.validate(doc)  # every field, before anyone uses it
            data = mapping(doc, "the state")  # a JSON object, as validated
            # a document of sections: one out of shape is dropped, the others load
            dropped = self.doc.keep_valid_sections(data) if isinstance(self.doc, Sectioned) else []
        except NewerVersion as e:
            self._newer(e, ident)
            return None
        except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError included
            self._corrupt(e, ident)
            return None
        if dropped:
            self._corrupt(StateError("; ".join(dropped)), ident, partial=True)
        if not self.boot_id:
            self.status.problem = "no_boot_id"
            return None
        if data.get("boot_id") != self.boot_id:
            self.status.problem = "other_boot"  # a new boot: start over from the kernel log
            self._behind = True
            return None
        self.recoveries = max(self.recoveries, data.get("recoveries", 0))
        if self.kmsg and data.get("kmsg") not in (None, self.kmsg):
            self.status.problem = "other_source"  # counts of another kernel log (a replay)
            self._behind = True
            return None
        return data

    def _corrupt(self, e: Exception, ident: FileIdentity, partial: bool = False) -> None:
        """Set a corrupt file aside. `partial`: sections of it were (named in `e`), and the others
        are read: the file is kept aside whole, and the daemon writes back what it holds."""
        why = show(str(e) if isinstance(e, StateError) else f"{type(e).__name__}: {e}", 300)
        if partial:
            why += "; the other sections are read"
        if self.read_only:
            if not partial:
                self._bad = ident
            self._problem("corrupt", f"corrupt ({why}); left in place for the daemon", write=False)
            return
        try:
            aside = set_aside(self.path, CORRUPT_KEEP)
        except OSError as err:
            if not partial:
                self._bad = ident  # not read again (16 MiB a scrape) until it changes
            self._problem("corrupt", f"corrupt ({why}) and cannot be set aside: {err.strerror or err}",
                          write=False)
            return
        self._behind = True  # what we hold goes back to disk at the next flush
        self.status.ok, self.status.problem = False, "corrupt"
        self.status.read_errors += 1
        if self.holds:  # the daemon holds every count the file held: nothing was lost
            log.error("%s %s: corrupt (%s); set aside as %s and written again from the counts "
                      "held in memory (nothing lost)", self.label, self.path, why, aside.name)
            return
        self.recoveries += 1
        # Always logged (not once per kind): each recovery may have lost counts.
        log.error("%s %s: corrupt (%s); set aside as %s. %s; inspect %s "
                  "(gpu_health_exporter_state_file_recoveries_total counts the XID file's)",
                  self.label, self.path, why, aside.name,
                  "what those sections held is rebuilt from the kernel log while it still has it "
                  "(an attribution is not)" if partial else self.loss(), aside)

    def _newer(self, e: NewerVersion, ident: FileIdentity) -> None:
        """A file of a newer version (the exporter was rolled back): not corrupt, and not ours to
        read. Set aside under a name that says so, for the newer exporter (or a human) to take
        back; this one counts from the kernel log from here, and says what that may lose."""
        if self.read_only:
            self._bad = ident
            self._problem("newer_version", f"{e}; left in place (the daemon sets it aside)", write=False)
            return
        try:
            aside = set_aside(self.path, CORRUPT_KEEP, f"newer-v{e.found}")
        except OSError as err:
            self._bad = ident
            self._problem("newer_version", f"{e}, and it cannot be set aside: {err.strerror or err}",
                          write=False)
            return
        self._behind = True
        self.status.ok, self.status.problem = False, "newer_version"
        self.status.read_errors += 1
        if not self.holds:
            self.recoveries += 1  # its counts are not read: a recovery, as for a corrupt file
        log.error("%s %s: %s. Set aside as %s (kept for a newer exporter: move it back after "
                  "upgrading again); %s", self.label, self.path, e, aside.name, self.loss(newer=True))

    def changed_on_disk(self) -> bool:
        """True when someone else (`ack`, the acks file's writer) wrote the file since we last read
        or wrote it."""
        now = identity_on_disk(self.path)
        return now is not None and now != self._ident and now != self._bad

    def behind(self) -> bool:
        """True when the file on disk is not the one we last wrote (set aside, removed, replaced,
        another boot's, written by `ack`): the holder writes what it holds back."""
        return not self.disabled and (self._behind or identity_on_disk(self.path) != self._written)

    def read_news(self) -> dict[str, Any] | None:
        """The file's content when it changed since we last read it (see changed_on_disk). Never
        waits: while another holds the lock (`ack` writing) it is None, and the news is taken at
        a later look."""
        if not self.changed_on_disk():
            return None
        with self.locked(wait=False) as held:
            if not held:
                return None
            return self.read()

    def write(self, body: dict[str, Any]) -> bool:
        """Write a document's body (its Document's dump; the envelope is added here), atomically,
        whatever is on disk (this process is the file's one writer). False (the problem in
        `status`) when not written."""
        if self.disabled:
            return False
        with self.locked():
            return self._write(body)

    def update(self, change: Callable[[dict[str, Any] | None], dict[str, Any]]) -> bool:
        """Write `change(what is on disk now, or None)` under the lock (the acks file's writer
        adds to what it holds)."""
        if self.disabled:
            return False
        with self.locked():
            body = change(self.read())
            return not self.disabled and self._write(body)

    def _write(self, body: dict[str, Any]) -> bool:
        data = {**body, "version": self.doc.schema.version, "boot_id": self.boot_id, "kmsg": self.kmsg,
                "recoveries": self.recoveries}
        try:
            write_json_atomic(self.path, data)
            self._ident = self._written = identity_on_disk(self.path)
            self._behind = False
        except OSError as e:
            self._problem("unwritable", f"cannot write (counts kept in memory): {e.strerror or e}",
                          write=True)
            return False
        self.status.ok = True
        self.status.problem = ""
        self.status.writes += 1
        return True
