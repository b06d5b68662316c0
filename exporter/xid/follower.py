"""The kernel-log follower: reads the kernel log (exporter.xid.kmsg) and hands every record to
its consumers (the XID counter, the SXid counter), in order, once. One reader for both.

It owns the kernel-log sequence number: the last record processed this run, and for each
consumer the record through which an earlier run counted (its state file, `resume`). A consumer
is told whether a record is new to it, so a restart never counts a record twice.

`read()` processes what is available now (the one-shot commands call it once, the service's
background loop again and again). Read errors are recorded in `status` and logged once per
distinct message, never raised; malformed records are logged at most once a minute.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from exporter.xid.clock import KernelClock
from exporter.xid.kmsg import KmsgReader, Record

log = logging.getLogger("exporter.xid")

MALFORMED_LOG_S = 60.0


@dataclass
class KmsgStatus:
    ok: bool = False
    error: str = ""
    backlog_done: bool = False
    enabled: bool = True


# A consumer gets every record, and whether it is new to it (not counted by an earlier run).
Consumer = Callable[[Record, bool], None]


class KmsgFollower:
    def __init__(self, path: str, consumers: dict[str, Consumer], clock: KernelClock,
                 enabled: bool = True) -> None:
        self.path = path
        self.consumers = consumers
        self.clock = clock
        self.reader = KmsgReader(path)
        self.status = KmsgStatus(enabled=enabled and bool(consumers))
        # One read at a time: the follower thread, and read_kmsg or shutdown's last read from another
        # thread, share the reader (its file offset, its open descriptor). Reads never block.
        self._reading = threading.Lock()
        # Written under _reading; read by any (an int, read whole).
        self.last_seq: int | None = None  # the last record processed this run
        self._resumed: dict[str, int] = {}  # consumer -> records up to here were counted before
        self._malformed_logged = 0
        self._malformed_at = -MALFORMED_LOG_S

    def resume(self, consumer: str, seq: int | None) -> None:
        """An earlier run's `consumer` counted the records up to `seq` (its state file says so)."""
        if seq is not None and consumer in self.consumers:
            self._resumed[consumer] = max(seq, self._resumed.get(consumer, seq))

    def counted_through(self, consumer: str | None = None) -> int | None:
        """The last record whose reports `consumer` (default: every consumer) has counted, this run
        or an earlier one: what its state file records."""
        seqs = [self.last_seq, *(q for c, q in self._resumed.items() if consumer in (None, c))]
        return max((q for q in seqs if q is not None), default=None)

    def read(self, live: bool = False) -> int:
        """Process every record available now; returns how many were read. Errors (no such
        file, permission denied without CAP_SYSLOG) are recorded, not raised."""
        if not self.status.enabled:
            return 0
        with self._reading:
            return self._read(live)

    def _read(self, live: bool) -> int:
        n = 0
        try:
            if not self.reader.is_open:
                self.reader.open()
            for rec in self.reader.read_available():
                if self.reader.stats.records == 1:
                    self._note_first(rec)
                if live:
                    self.clock.observe_live(rec.usec / 1e6)
                for name, consume in self.consumers.items():
                    consume(rec, rec.seq > self._resumed.get(name, -1))
                self.last_seq = rec.seq
                n += 1
        except OSError as e:
            self.reader.close()
            msg = f"cannot read {self.path}: {e.strerror or e}"
            if self.status.error != msg:
                log.warning("%s%s", msg, read_error_hint(self.path, getattr(e, "errno", None)))
            self.status.ok, self.status.error = False, msg
            self.reader.stats.errors += 1
            return n
        self.status.ok, self.status.error = True, ""
        self._log_malformed()
        return n

    def _log_malformed(self) -> None:
        """Log when malformed records were skipped since the last line (at most once a minute)."""
        st = self.reader.stats
        now = time.monotonic()
        if st.malformed > self._malformed_logged and now - self._malformed_at >= MALFORMED_LOG_S:
            log.warning("%s: %d malformed kernel-log record(s) skipped (%d in all), last: %r", self.path,
                        st.malformed - self._malformed_logged, st.malformed, st.last_malformed)
            self._malformed_logged, self._malformed_at = st.malformed, now

    def _note_first(self, rec: Record) -> None:
        """Records we can prove we never saw: the ring wrapped before we (first) read it."""
        if not self.reader.device:
            return
        seen = max(self._resumed.values(), default=-1)
        if rec.seq > seen + 1:
            self.reader.stats.missed += rec.seq - seen - 1

    def close(self) -> None:
        with self._reading:
            self.reader.close()


def read_error_hint(path: str, err: int | None) -> str:
    """What to do about a permission error: the kernel log device needs CAP_SYSLOG; a regular file
    (a saved log, --kmsg-file) needs read permission for this user, which no capability is about."""
    if err not in (errno.EPERM, errno.EACCES):
        return ""
    try:
        device = stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        device = False
    if device:
        return " (reading /dev/kmsg needs CAP_SYSLOG when kernel.dmesg_restrict=1)"
    return (f" (a file: this user (uid {os.getuid()}) may not read it; check its mode and owner, "
            f"`ls -l {path}`)")
