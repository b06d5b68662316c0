"""Reading the kernel log: `/dev/kmsg` records, or a regular file of such records.

Record format (Documentation/ABI/testing/dev-kmsg): `prio,seq,usec,flags[,...];message`, then
optional continuation lines beginning with a space (`KEY=value`). On the character device each
read() returns exactly one record; EAGAIN (with O_NONBLOCK) means the backlog is exhausted and
EPIPE means records were overwritten before we read them (we count it and go on). A regular file
(a saved log, or the simulated node's dev/kmsg) is read to its end, then followed by polling its
size, so records appended later are picked up live.

No record is yielded twice: a record whose sequence number is at or below the highest one
already read is skipped, whether it comes back through a reopen (the device after a read error
starts again at the oldest record in the ring; a file replaced, rotated, truncated or rewritten
in place, which the start of the last line read no longer being where it was betrays, is read
from its start) or within one open file (a dump appended again, a duplicated line). In a file, a
record is a whole line: one that ends in its newline. A last line without it is held until the
newline arrives (a record written in two parts is read whole), by every reader (the daemon,
`ack`, `check`): a half-written record is never counted, and never moves the sequence number
past the record it begins. A line longer than MAX_LINE_BYTES (without its newline) is no record,
however it arrives (in one write or in pieces): it is dropped (counted malformed), never held
whole in memory. NUL bytes before a record (a file truncated under a writer that kept its
offset) are skipped.

A regular file may also hold the kernel log in the text forms people save (`dmesg`, `dmesg -T`,
`journalctl -k` in its short forms, syslog; exporter.xid.textlog), or a mix of them with records:
each such line is read as a record of its own (a kernel record when the line is the kernel's; its
time since boot from the line's `[ 5123.456789]`, else from its wall-clock time, kept as the
record's `wall`). They have no sequence numbers: a text line's is its place among the file's lines,
so a mix is read in file order, and the daemon, which follows /dev/kmsg, has nothing to gain from
them. A line that names an XID or SXid report (exporter.xid.textlog.looks_like_fault) which no
parser can read is counted in `stats.unparsed_faults`: `check` then cannot say "healthy".
"""

from __future__ import annotations

import errno
import os
import select
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from exporter.xid import textlog

KERNEL_FACILITY_MAX_PRIO = 7  # facility 0 (kernel): prio 0..7; user space cannot write facility 0
# A record is at most a few KiB (the kernel's own limit is 8 KiB with its prefix); a longer line
# in a file is not a record: it is dropped up to its newline, never kept whole in memory.
MAX_LINE_BYTES = 64 << 10
# Bounds of a record's numbers: what the state file holds of them (the sequence number, times
# derived from the kernel clock) must pass its validation (exporter.state.values).
MAX_SEQ = 2**63 - 1
MAX_USEC = 10**15  # 31.7 years since boot
MARK_BYTES = 256  # the start of the last line read, compared on every poll (rewritten in place?)


class Record(NamedTuple):
    prio: int  # the syslog prefix value: level in the low 3 bits, facility above
    seq: int
    usec: int  # microseconds since boot (kernel clock)
    flags: str
    message: str
    wall: float | None = None  # Unix time the line gave (a text-form line); None: from the kernel clock

    @property
    def kernel(self) -> bool:
        """True for records the kernel logged (facility 0); user space writes prio >= 8."""
        return self.prio <= KERNEL_FACILITY_MAX_PRIO


def parse_record(text: str) -> Record | None:
    """Parse one record's first line (continuation lines already dropped); None if malformed."""
    head, sep, message = text.partition(";")
    if not sep:
        return None
    parts = head.split(",", 4)
    if len(parts) < 4 or not all(p.isascii() and p.isdigit() and len(p) <= 19 for p in parts[:3]):
        return None  # the three numbers are plain non-negative decimals, of at most 19 digits
    prio, seq, usec = int(parts[0]), int(parts[1]), int(parts[2])
    if seq > MAX_SEQ or usec > MAX_USEC:
        return None  # no kernel numbers its records so, nor has run for 30 years
    return Record(prio, seq, usec, parts[3], message.rstrip("\n"))


@dataclass
class ReaderStats:
    records: int = 0
    malformed: int = 0
    overwrites: int = 0  # EPIPE: the kernel overwrote records before we read them
    missed: int = 0  # records we know we never saw (sequence-number gaps on the device)
    repeated: int = 0  # records skipped after a reopen because they had been read already
    errors: int = 0
    last_malformed: str = ""  # the last malformed record (truncated), for the log
    text_lines: int = 0  # lines read in a text form (dmesg, journalctl, syslog), counted in `records`
    unparsed_faults: int = 0  # lines naming an XID or SXid report that no parser could read
    last_unparsed_fault: str = ""
    first_seq: int | None = None
    last_seq: int | None = None


@dataclass
class KmsgReader:
    """Reads records from `path` (character device or regular file), backlog first, then follows.

    `read_available()` returns the records available now without blocking; `wait(timeout)`
    blocks until more may be available. Opening errors raise OSError (the caller reports them).
    """

    path: str
    chunk_bytes: int = 1 << 20
    stats: ReaderStats = field(default_factory=ReaderStats)

    def __post_init__(self) -> None:
        self._fd: int | None = None
        self._device = False
        self._offset = 0
        self._ino: tuple[int, int] | None = None
        self._pending = b""  # a trailing partial line of a regular file
        self._discard = False  # dropping an over-long line up to its newline
        # (offset, bytes) of the start of the last whole line read: a file rewritten in place
        # (same inode, not shorter) no longer holds them there
        self._mark: tuple[int, bytes] | None = None
        self._poll: select.poll | None = None
        self.high_seq: int | None = None  # the highest sequence number read, across every open
        self._line_no = 0  # lines of the open file read so far (a text line's sequence number)
        self._text_high = 0  # the highest text line read (a file read again skips them)
        self._wall_base: float | None = None  # the wall time a text line's kernel time counts from
        # The header ("NVRM: Xid (PCI:...): 13") of the last readable XID line: a flood's next lines
        # start with it and are readable without being parsed again (the counter's parser has the
        # same fast path; parsing each line here too made a 1,000,000-line XID 13 flood 3x slower).
        self._readable_header = ""

    # -- opening -------------------------------------------------------------------------------
    def open(self) -> None:
        st = os.stat(self.path)
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            # A FIFO would block the open until a writer comes; a directory or socket never reads.
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) \
                else "not a regular file"
            raise OSError(errno.EINVAL, f"{kind}, not the kernel log device or a file of /dev/kmsg records",
                          self.path)
        self._device = stat.S_ISCHR(st.st_mode)
        flags = os.O_RDONLY | (os.O_NONBLOCK if self._device else 0)
        self._fd = os.open(self.path, flags)
        self._ino = (st.st_dev, st.st_ino)
        self._offset = 0
        self._pending = b""
        self._discard = False
        self._mark = None
        self._line_no = 0
        if self._device:
            self._poll = select.poll()
            self._poll.register(self._fd, select.POLLIN)

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    @property
    def device(self) -> bool:
        return self._device

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            finally:
                self._fd = None

    # -- reading -------------------------------------------------------------------------------
    def read_available(self) -> Iterator[Record]:
        """Yield the records available now, never blocking. Iterate it to the end: a file's
        position advances by whole chunks. A file's last line without a newline is no record yet:
        it waits for its newline."""
        if self._fd is None:
            self.open()
        if self._device:
            yield from self._read_device()
        else:
            yield from self._read_file()

    def _malformed(self, text: str) -> None:
        self.stats.malformed += 1
        self.stats.last_malformed = text[:120]
        if textlog.looks_like_fault(text):
            self._unparsed_fault(text)

    def _unparsed_fault(self, text: str) -> None:
        self.stats.unparsed_faults += 1
        self.stats.last_unparsed_fault = text[:160]

    def _check_fault(self, rec: Record) -> None:
        """A kernel record that names an XID or SXid report no parser reads: the log cannot be
        trusted to have every fault counted."""
        msg, h = rec.message, self._readable_header
        if not rec.kernel or (h and msg.startswith(h) and (len(msg) == len(h) or not msg[len(h)].isdigit())):
            return
        if textlog.looks_like_fault(msg):
            from exporter.xid.parser import xid_header

            header = xid_header(msg)
            if header:
                self._readable_header = header
            elif not readable_fault(msg):
                self._unparsed_fault(msg)

    def _text_record(self, line: str) -> Record | None:
        """A line in a text form (exporter.xid.textlog) as a record; None when it is in none."""
        t = textlog.parse_line(line)
        if t is None:
            return None
        kernel_s = t.kernel_s
        if kernel_s is None:
            if t.wall is None:
                return None
            if self._wall_base is None:  # this boot's start, or the log's first line if older
                self._wall_base = min(time.time() - time.monotonic(), t.wall)
            kernel_s = max(0.0, t.wall - self._wall_base)
        usec = min(int(kernel_s * 1e6), MAX_USEC)
        prio = textlog.KERNEL_PRIO if t.kernel else textlog.USER_PRIO
        return Record(prio, self._line_no, usec, "-", t.message, t.wall)

    def _note(self, rec: Record) -> bool:
        """Account for a record; False when it was read before (skip it): its sequence number is
        at or below the highest read, whether it comes back through a reopen or within the same
        open file (a dump of the ring appended to it again, a duplicated line)."""
        if self.high_seq is not None and rec.seq <= self.high_seq:
            self.stats.repeated += 1
            return False
        if self.high_seq is None or rec.seq > self.high_seq:
            self.high_seq = rec.seq
        st = self.stats
        st.records += 1
        if st.first_seq is None:
            st.first_seq = rec.seq
        elif self._device and st.last_seq is not None and rec.seq > st.last_seq + 1:
            st.missed += rec.seq - st.last_seq - 1
        st.last_seq = rec.seq
        return True

    def _read_device(self) -> Iterator[Record]:
        fd = self._fd
        while fd is not None:
            try:
                data = os.read(fd, 16384)
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno == errno.EPIPE:  # overwritten while we were behind: skip to the next
                    self.stats.overwrites += 1
                    continue
                if e.errno == errno.EINTR:
                    continue
                raise
            if not data:
                return
            text = data.decode("utf-8", "replace")
            rec = parse_record(text.split("\n", 1)[0])
            if rec is None:
                self._malformed(text)
                continue
            self._check_fault(rec)
            if self._note(rec):
                yield rec

    def _lines(self, data: bytes) -> Iterator[Record]:
        raw: list[bytes] | None = None
        for i, line in enumerate(data.decode("utf-8", "replace").split("\n")):
            # A character is 1 to 4 bytes: only a line this long can be over the limit in bytes,
            # the same rule as for a line that arrives in pieces (measured in the bytes read).
            if len(line) > MAX_LINE_BYTES // 4:
                raw = raw or data.split(b"\n")  # line i of the text is line i of the bytes
                if len(raw[i]) > MAX_LINE_BYTES:
                    self._malformed(line[:120])
                    continue
            line = line.lstrip("\x00")  # NULs: a copytruncate'd file whose writer kept its offset
            if not line or line[0] == " ":  # continuation line (KEY=value) or blank
                continue
            self._line_no += 1
            rec = parse_record(line)
            if rec is None:
                if textlog.is_marker(line):
                    continue
                rec = self._text_record(line)
                if rec is None:
                    self._malformed(line)
                    continue
                self._check_fault(rec)
                if self._line_no <= self._text_high:  # read before (the file was read again)
                    self.stats.repeated += 1
                    continue
                self._text_high = self._line_no
                self.stats.records += 1
                self.stats.text_lines += 1
                yield rec
                continue
            self._check_fault(rec)
            if self._note(rec):
                yield rec

    def _change(self) -> str:
        """How the file at the path changed since the last read: "replaced" (another inode: a
        rotation), "rewritten" (truncated, or rewritten in place: the start of the last line
        read is no longer where it was) or "" (at most appended to)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return ""  # gone for a moment (rotation): keep reading what we have open
        if (st.st_dev, st.st_ino) != self._ino:
            return "replaced"
        if st.st_size < self._offset:
            return "rewritten"
        if self._mark is not None and self._fd is not None:
            at, head = self._mark
            return "rewritten" if os.pread(self._fd, len(head), at) != head else ""
        return ""

    def _read_file(self) -> Iterator[Record]:
        change = self._change()
        if change == "replaced":  # the records written to the old file just before it was renamed
            yield from self._read_open()
        if change:  # start over; sequence numbers drop repeats
            self.close()
            self.open()
        yield from self._read_open()

    def _read_open(self) -> Iterator[Record]:
        fd = self._fd
        while fd is not None:
            data = os.pread(fd, self.chunk_bytes, self._offset)
            if not data:
                return
            start = self._offset - len(self._pending)  # where buf begins in the file
            self._offset += len(data)
            buf = self._pending + data
            end = buf.rfind(b"\n")
            if end < 0:
                self._pending = buf
                if len(buf) > MAX_LINE_BYTES:  # not a record: drop it up to its newline
                    if not self._discard:
                        self._malformed(buf[:120].decode("utf-8", "replace"))
                    self._pending, self._discard = b"", True
                continue
            first = 0
            if self._discard:  # the rest of an over-long line
                first, self._discard = buf.find(b"\n") + 1, False
            self._pending = buf[end + 1:]
            if len(self._pending) > MAX_LINE_BYTES:
                self._malformed(self._pending[:120].decode("utf-8", "replace"))
                self._pending, self._discard = b"", True
            last = buf.rfind(b"\n", 0, end) + 1
            self._mark = (start + last, buf[last:min(end + 1, last + MARK_BYTES)])
            yield from self._lines(buf[first:end])

    def wait(self, timeout_s: float) -> None:
        """Block until more records may be available (device) or for the poll interval (file)."""
        if self._device and self._poll is not None:
            self._poll.poll(max(0, int(timeout_s * 1000)))
        else:
            time.sleep(timeout_s)


def readable_fault(message: str) -> bool:
    """An XID or SXid line one of the parsers reads (an XID report, an SXid report or its
    continuation)."""
    from exporter.xid.parser import parse_xid
    from exporter.xid.sxid import parse_sxid

    return parse_xid(message) is not None or parse_sxid(message) is not None
