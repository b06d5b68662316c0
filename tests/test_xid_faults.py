"""Faults in the kernel-log / XID / SXid path: a record is never counted twice across
a reopen (device or file, rewritten or rotated), a record written in two parts is read whole,
input cannot grow a map without bound (memory, series, state file), an SXid continuation with
trailing junk is never a report, and a FIFO at the state file's path never hangs anything."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import threading
import time

import pytest
import requests

from exporter.collectors.nvswitch import NvswitchCollector
from exporter.collectors.xid import XidCollector
from exporter.runner import Runner
from exporter.xid import kmsg as kmsg_mod
from exporter.xid.kmsg import KmsgReader
from exporter.xid.service import one_shot
from exporter.xid.sxid import SxidContinuation, parse_sxid
from exporter.xid.sxid_state import by_report
from tests.helpers import samples, scrape, test_pool
from tests.test_xid_service import counts, make_ctx


def xid_record(seq: int, xid: int = 31, pci: str = "0000:53:00") -> str:
    return f"4,{seq},{1_000_000 + seq * 60_000_000},-;NVRM: Xid (PCI:{pci}): {xid}, pid=1, name=p, text\n"


def total(svc) -> int:
    return sum(counts(svc).values())


def within(fn, timeout_s: float = 10.0):
    """Run fn in a daemon thread; fail (instead of hanging the suite) if it blocks."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("v", fn()), daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), f"blocked for more than {timeout_s:g} s"
    return out.get("v")


# -- never counted twice across a reopen ---------------------------------------------------------
def test_file_rewritten_copy_append_rename_counts_each_record_once_also_after_a_restart(tmp_path):
    log = "".join(xid_record(i) for i in range(40))  # 40 events a minute apart
    ctx = make_ctx(tmp_path, log)
    svc = one_shot(ctx)
    assert total(svc) == 40
    path = tmp_path / "kmsg"
    shutil.copy(path, tmp_path / "kmsg.new")  # a log rotated the way tools do it
    with open(tmp_path / "kmsg.new", "a") as f:
        f.write("".join(xid_record(40 + i) for i in range(8)))
    os.rename(tmp_path / "kmsg.new", path)
    svc.read_kmsg(live=True)
    assert total(svc) == 48  # was 88: the reopened file was counted again
    assert svc.flush_state(force=True)
    assert total(one_shot(make_ctx(tmp_path, None))) == 48  # and the state file says so too


class FakeKmsgDevice:
    """/dev/kmsg: a ring of records; every open starts at its oldest, reads one record each,
    EAGAIN at the end; `fail_next` makes the next read fail with that errno."""

    def __init__(self, records: list[str]) -> None:
        self.ring = list(records)
        self.pos = 0
        self.fail_next: int | None = None

    def install(self, monkeypatch, path: str) -> None:
        real_stat, real_open, real_close = os.stat, os.open, os.close

        def fake_stat(p, *a, **k):
            if str(p) == path:
                return os.stat_result((stat.S_IFCHR | 0o600, 0, 0, 1, 0, 0, 0, 0, 0, 0))
            return real_stat(p, *a, **k)

        def fake_open(p, flags, *a):
            if str(p) == path:
                self.pos = 0  # a new open starts at the oldest record in the ring
                return 1_000_001
            return real_open(p, flags, *a)

        def fake_read(fd, n):
            if self.fail_next is not None:
                e, self.fail_next = self.fail_next, None
                raise OSError(e, os.strerror(e))
            if self.pos >= len(self.ring):
                raise BlockingIOError(errno.EAGAIN, "again")
            self.pos += 1
            return self.ring[self.pos - 1].encode()

        monkeypatch.setattr(kmsg_mod.os, "stat", fake_stat)
        monkeypatch.setattr(kmsg_mod.os, "open", fake_open)
        monkeypatch.setattr(kmsg_mod.os, "read", fake_read)
        monkeypatch.setattr(kmsg_mod.os, "close", lambda fd: None if fd == 1_000_001 else real_close(fd))
        monkeypatch.setattr(kmsg_mod.select, "poll", lambda: type("P", (), {"register": lambda *a: None,
                                                                              "poll": lambda *a: []})())


def test_device_reopened_after_a_read_error_does_not_count_the_ring_again(tmp_path, monkeypatch):
    dev = FakeKmsgDevice([xid_record(i) for i in range(10)])
    ctx = make_ctx(tmp_path, "")
    dev.install(monkeypatch, str(tmp_path / "kmsg"))
    svc = one_shot(ctx)
    assert total(svc) == 10 and svc.follower.reader.device
    dev.ring += [xid_record(10 + i) for i in range(5)]
    dev.fail_next = errno.EIO  # any error but EPIPE/EINTR/EAGAIN: the reader reopens
    svc.read_kmsg(live=True)
    assert not svc.snapshot().kmsg.ok
    svc.read_kmsg(live=True)  # reopened: the ring again from its oldest record
    assert svc.snapshot().kmsg.ok and total(svc) == 15  # was 25
    assert svc.snapshot().kmsg.stats.repeated == 10 and svc.snapshot().kmsg.stats.missed == 0


def test_reader_skips_what_it_read_before_on_every_reopen(tmp_path):
    path = tmp_path / "kmsg"
    path.write_text("6,0,1,-;a\n6,1,2,-;b\n")
    r = KmsgReader(str(path))
    assert [x.seq for x in r.read_available()] == [0, 1]
    r.close()  # a read error: the caller closes and reads again
    path.write_text("6,0,1,-;a\n6,1,2,-;b\n6,2,3,-;c\n")
    assert [x.seq for x in r.read_available()] == [2]
    tmp = tmp_path / "kmsg.1"
    tmp.write_text("6,1,2,-;b\n6,2,3,-;c\n6,3,4,-;d\n")
    os.replace(tmp, path)  # replaced: a new inode
    assert [x.seq for x in r.read_available()] == [3]
    assert r.high_seq == 3 and r.stats.records == 4


# -- a record written in two parts ---------------------------------------------------------------
def test_a_record_written_in_two_parts_is_read_whole(tmp_path):
    ctx = make_ctx(tmp_path, "")
    svc = one_shot(ctx)
    path = tmp_path / "kmsg"
    with open(path, "a") as f:
        f.write("4,0,1000000,-;NVRM: Xid (PCI:0000:53:00): 6")
    for _ in range(5):  # the follower polls several times before the rest arrives
        svc.read_kmsg(live=True)
    with open(path, "a") as f:
        f.write("3, pid=1, name=p, Row Remapper: New row marked for remapping, reset gpu to activate.\n")
    svc.read_kmsg(live=True)
    assert counts(svc) == {("00000000:53:00", "63"): 1}  # was XID 6 (unknown), 63 never counted


def test_an_unfinished_last_line_is_never_taken_as_it_is(tmp_path):
    """A record is counted only when whole: a saved log that ends without a newline
    keeps its last line waiting, for the daemon and the one-shot commands alike."""
    path = tmp_path / "kmsg"
    path.write_text("6,0,10,-;a\n6,1,11,-;b")
    r = KmsgReader(str(path))
    assert [x.message for x in r.read_available()] == ["a"]
    assert list(r.read_available()) == []  # still waiting for its newline
    assert [x.message for x in KmsgReader(str(path)).read_available()] == ["a"]


# -- bounded maps ----------------------------------------------------------------------------------
def gpu_at_flood(n: int) -> str:
    out, seq = [], 0
    for i in range(n):
        pci = f"{i >> 8:04x}:{i & 0xff:02x}:00"
        out.append(f"4,{seq},{seq},-;NVRM: GPU at PCI:{pci}: GPU-{i:08x}-0000-0000-0000-000000000000\n")
        seq += 1
        for x in (13, 31, 43, 45, 48, 63, 74, 79):
            out.append(f"4,{seq},{seq * 30_000_000},-;NVRM: Xid (PCI:{pci}): {x}, pid=1, name=p, t\n")
            seq += 1
    return "".join(out)


def test_gpu_at_lines_cannot_make_unbounded_series_memory_or_state(tmp_path):
    from exporter.xid.store import MAX_IDENTITIES, MAX_UNKNOWN_GPUS

    ctx = make_ctx(tmp_path, gpu_at_flood(600))
    svc = one_shot(ctx)
    assert len(svc.identities.known) <= MAX_IDENTITIES
    assert len(svc.store.counts) <= MAX_IDENTITIES + MAX_UNKNOWN_GPUS + 1  # + "other"
    assert total(svc) == 600 * 8  # nothing lost: the rest is under pci_bus_id="other"
    text = scrape(Runner([XidCollector(ctx)], deadline_s=10, pool=test_pool()))
    series = [1 for n, _ in samples(text) if n == "gpu_xid_errors_total"]
    assert len(series) <= (MAX_IDENTITIES + MAX_UNKNOWN_GPUS + 1) * 8  # was 4,800
    assert svc.flush_state(force=True)
    doc = json.loads((tmp_path / "state" / "xid-state.json").read_text())
    assert len(doc["gpus"]) <= MAX_IDENTITIES and len(doc["counts"]) <= MAX_IDENTITIES + MAX_UNKNOWN_GPUS + 1


def test_a_state_file_beyond_the_limits_is_folded_not_trusted(tmp_path):
    from exporter.xid.store import MAX_IDENTITIES, MAX_UNKNOWN_GPUS

    svc = one_shot(make_ctx(tmp_path, "6,0,1,-;boot\n"))
    assert svc.flush_state(force=True)
    path = tmp_path / "state" / "xid-state.json"
    doc = json.loads(path.read_text())
    doc["gpus"] = {f"{i:08x}:01:00": {"index": None, "uuid": f"GPU-{i}"} for i in range(2000)}
    doc["counts"] = {f"{i:08x}:02:00": {"31": [2, 1.0, 1.0]} for i in range(2000)}
    path.write_text(json.dumps(doc))
    svc2 = one_shot(make_ctx(tmp_path, ""))
    assert len(svc2.identities.known) <= MAX_IDENTITIES
    assert len(svc2.store.counts) <= MAX_UNKNOWN_GPUS + 1
    assert total(svc2) == 4000
    assert total(one_shot(make_ctx(tmp_path, ""))) == 4000  # read twice: still not counted twice


def test_many_nvswitch_addresses_share_an_overflow_bucket(tmp_path):
    from exporter.xid.sxid_state import MAX_SWITCHES

    lines = [f"3,{i},{i},-;nvidia-nvswitch{i % 64}: SXid (PCI:{i:04x}:07:00.0): 20034, Fatal, Link 01 x\n"
             for i in range(200)]
    ctx = make_ctx(tmp_path, "".join(lines))
    svc = one_shot(ctx)
    assert len(svc.sxids.indices) == MAX_SWITCHES
    assert sum(c.count for c in by_report(svc.sxids).values()) == 200
    text = scrape(Runner([NvswitchCollector(ctx)], deadline_s=5, pool=test_pool()))
    pcis = {dict(ls)["pci_bus_id"] for n, ls in samples(text) if n == "gpu_nvswitch_sxid_errors_total"}
    assert len(pcis) == MAX_SWITCHES + 1 and "other" in pcis


# -- SXid continuation with trailing junk --------------------------------------------------------
def test_an_sxid_continuation_with_trailing_junk_is_not_a_report(tmp_path):
    head = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, "
    for body in ("Data {0x10000000, 0x10000000, 0x00000000}p", "Data {0x1, 0x2",
                 "Severity 1 Engine instance 48 Sub-engine instance 00 junk", "Severity 5 Engine instance 7"):
        assert isinstance(parse_sxid(head + body), SxidContinuation), body
    lines = [head + "Fatal, Link 48 LTSSM Fault Up (First)", head + "Data {0x10000000, 0x00000000}p"]
    svc = one_shot(make_ctx(tmp_path, "".join(f"3,{i},{i},-;{m}\n" for i, m in enumerate(lines))))
    assert {k: c.count for k, c in by_report(svc.sxids).items()} == {("00000000:06:00", 20034, "fatal"): 1}


# -- a FIFO at the state file's path -------------------------------------------------------------
def test_a_fifo_as_the_state_file_never_blocks_and_is_a_clear_error(tmp_path, caplog):
    state = tmp_path / "state"
    state.mkdir()
    for name in ("xid-state.json", "sxid-state.json", "xid-state.json.lock"):
        os.mkfifo(state / name)
    ctx = make_ctx(tmp_path, xid_record(0))
    svc = within(lambda: one_shot(ctx))
    assert total(svc) == 1
    assert within(lambda: svc.flush_state(force=True)) is False  # no persistence, no hang
    assert svc.state.status.problem == "unreadable"
    assert f"state file {state / 'xid-state.json'} is a FIFO" in caplog.text
    assert stat.S_ISFIFO(os.lstat(state / "xid-state.json").st_mode)  # left alone


def test_check_with_a_fifo_state_file_answers(tmp_path, capsys):
    from exporter.cli import main

    state = tmp_path / "state"
    state.mkdir()
    os.mkfifo(state / "xid-state.json")
    log = tmp_path / "kmsg.txt"
    log.write_text(xid_record(0))
    code = within(lambda: main(["check", "--simulate", "p5.48xlarge", "--kmsg-file", str(log),
                                "--path.state-dir", str(state), "--json"]), 60)
    doc = json.loads(capsys.readouterr().out)
    assert code == 3 and doc["sources"]["state_file"]["problem"] == "unreadable"


def test_a_symlinked_state_file_is_not_followed(tmp_path, caplog):
    state = tmp_path / "state"
    state.mkdir()
    target = tmp_path / "elsewhere.json"
    target.write_text("precious")
    (state / "xid-state.json").symlink_to(target)
    svc = one_shot(make_ctx(tmp_path, xid_record(0)))
    assert not svc.flush_state(force=True) and target.read_text() == "precious"
    assert "is a symbolic link" in caplog.text


# -- minor: the replayed capture's kernel log is a private file ------------------------------------
def test_a_replayed_capture_s_kernel_log_is_written_privately(tmp_path):
    from exporter.arguments import kmsg_replay_path

    capture = tmp_path / "capture.json"
    capture.write_text(json.dumps({"kmsg": [xid_record(0).strip()]}))
    out = kmsg_replay_path(str(capture))
    assert out != str(capture) and open(out).read() == xid_record(0)
    d = os.lstat(os.path.dirname(out))
    assert stat.S_ISDIR(d.st_mode) and d.st_uid == os.getuid() and d.st_mode & 0o077 == 0
    assert time.time() - os.stat(out).st_mtime < 60


@pytest.mark.slow
def test_the_daemon_with_a_fifo_state_file_serves_and_stops_in_time(tmp_path):
    from tests.helpers import start_exporter, stop_within
    from tests.test_shutdown import EXIT_BOUND_S

    state = tmp_path / "state"
    state.mkdir()
    os.mkfifo(state / "xid-state.json")  # used to hang start-up: port bound, never answering
    proc, url, log = start_exporter(tmp_path, "--simulate", "p5.48xlarge", "--scenario", "xid-31-backlog",
                                    "--path.state-dir", str(state))
    try:
        text = requests.get(url, timeout=30).text
        assert 'gpu_health_exporter_state_file_ok 0.0' in text
        assert 'gpu_xid_errors_total{gpu="4"' in text  # counted, in memory
        assert stop_within(proc, EXIT_BOUND_S) == 0  # and SIGTERM is not ignored
    finally:
        if proc.poll() is None:
            proc.kill()
    assert f"state file {state / 'xid-state.json'} is a FIFO" in log.read_text()
