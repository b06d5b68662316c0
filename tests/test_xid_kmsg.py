"""Reading the kernel log: a file (backlog then follow), and the /dev/kmsg device semantics
(one record per read, EAGAIN ends the backlog, EPIPE counted and skipped)."""

import errno
import os

import pytest

from exporter.xid import kmsg as kmsg_mod
from exporter.xid.kmsg import KmsgReader
from tests.helpers import test_pool


def test_file_backlog_then_follow_with_continuations_and_partial_lines(tmp_path):
    path = tmp_path / "kmsg"
    path.write_text("6,0,10,-;first\n SUBSYSTEM=pci\n DEVICE=+pci:0000:53:00.0\n"
                    "4,1,20,-;second\n4,2,30,-;thi")
    r = KmsgReader(str(path))
    assert [x.message for x in r.read_available()] == ["first", "second"]  # partial line held back
    with open(path, "a") as f:
        f.write("rd\ngarbage line\n12,3,40,-;from user space\n")
    got = list(r.read_available())
    assert [(x.seq, x.message, x.kernel) for x in got] == [(2, "third", True), (3, "from user space", False)]
    assert r.stats.records == 4 and r.stats.malformed == 1 and r.stats.missed == 0
    assert list(r.read_available()) == []


def test_file_truncated_or_replaced_starts_over(tmp_path):
    path = tmp_path / "kmsg"
    path.write_text("6,0,10,-;a\n6,1,11,-;b\n")
    r = KmsgReader(str(path))
    assert len(list(r.read_available())) == 2
    path.write_text("6,7,10,-;c\n")  # shorter: truncated / rotated
    assert [x.message for x in r.read_available()] == ["c"]


def test_missing_file_raises_for_the_caller(tmp_path):
    with pytest.raises(OSError):
        list(KmsgReader(str(tmp_path / "nope")).read_available())


class FakeDevice:
    """os.read replacement: one record per read, EPIPE where the kernel overwrote, then EAGAIN."""

    def __init__(self, items):
        self.items = list(items)

    def read(self, fd, n):
        if not self.items:
            raise BlockingIOError(errno.EAGAIN, "again")
        item = self.items.pop(0)
        if isinstance(item, int):
            raise OSError(item, os.strerror(item))
        return item.encode()


def test_device_semantics_eagain_epipe_and_sequence_gaps(monkeypatch):
    dev = FakeDevice(["6,100,1,-;a\n SUBSYSTEM=x\n", errno.EPIPE, "6,105,2,-;b\n", "6,106,3,-;c\n"])
    monkeypatch.setattr(kmsg_mod.os, "read", dev.read)
    r = KmsgReader("/dev/kmsg")
    r._fd, r._device = 99, True  # as if open() had found the character device
    got = list(r.read_available())
    assert [x.message for x in got] == ["a", "b", "c"]
    assert r.stats.overwrites == 1
    assert r.stats.missed == 4  # 101..104 were overwritten before we read them
    assert list(r.read_available()) == []  # EAGAIN: nothing more now
    dev.items.append("6,107,4,-;d\n")
    assert [x.seq for x in r.read_available()] == [107]
    r._fd = None


def test_malformed_records_are_counted_exported_and_logged_when_the_count_grows(tmp_path, caplog):
    from exporter.collectors.xid import XidCollector
    from exporter.compose import compose
    from exporter.config import load
    from exporter.runner import Runner
    from tests.helpers import scrape, value

    log = tmp_path / "kmsg"
    log.write_text("4,0,10,-;NVRM: fine\nno semicolon here\n4,x,20,-;bad seq\n-1,2,30,-;negative prio\n"
                   "4,3,1_000,-;underscores\n4,4,40,-;NVRM: Xid (PCI:0000:53:00): 31, pid=1, name=p, ok\n")
    ctx = compose(load(None, {"paths.kmsg": str(log), "paths.state_dir": str(tmp_path / "st"),
                                     "xid.nvml_events": False}))
    c = XidCollector(ctx)
    c.service.read_kmsg()
    assert c.service.snapshot().kmsg.stats.malformed == 4 and c.service.snapshot().kmsg.stats.records == 2
    assert "4 malformed kernel-log record(s) skipped" in caplog.text and "underscores" in caplog.text
    text = scrape(Runner([c], deadline_s=5, pool=test_pool()))
    assert value(text, "gpu_health_exporter_kmsg_malformed_records_total") == 4
    assert value(text, "gpu_xid_errors_total", xid="31") == 1


def test_a_fifo_as_the_kernel_log_is_a_clear_error_not_a_silent_hang(tmp_path, caplog):
    from exporter.compose import compose
    from exporter.config import load

    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)  # opening a FIFO without a writer blocks forever
    with pytest.raises(OSError, match="a FIFO, not the kernel log device"):
        KmsgReader(str(fifo)).open()
    ctx = compose(load(None, {"paths.kmsg": str(fifo), "paths.state_dir": str(tmp_path / "st"),
                                     "xid.nvml_events": False}))
    svc = ctx.xid
    assert svc.read_kmsg() == 0 and not svc.snapshot().kmsg.ok
    assert f"cannot read {fifo}: a FIFO, not the kernel log device" in caplog.text


def test_xid_numbers_out_of_range_are_not_reports():
    from exporter.xid.parser import parse_xid

    assert parse_xid("NVRM: Xid (PCI:0000:53:00): 99999999999999999999999, pid=1, name=p, x") is None
    assert parse_xid("NVRM: Xid (PCI:0000:53:00): 0, pid=1, name=p, x") is None
    assert parse_xid("NVRM: Xid (PCI:0000:53:00): 999, pid=1, name=p, x").xid == 999
