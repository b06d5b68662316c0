"""Fault cases for the kernel-log / XID / SXid / state-file path written from the outside, as a
reviewer would: a record never counted twice, a record written in parts, bounded maps, SXid
continuations, what is at the state path, acks and the log trail, and their neighbours (in-place
rewrites, copytruncate NULs, duplicate and backward sequence numbers, CRLF, continuation lines, very
long lines, sockets and directories where the state belongs, the log trail across a restart). Only
the public surface is used: the CLI, /metrics, the service and collectors the composition root
builds."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import requests

from exporter.collectors.health import HealthCollector
from exporter.collectors.nvswitch import NvswitchCollector
from exporter.collectors.xid import XidCollector
from exporter.nvml.fake import FakeBackend, load_capture
from exporter.nvml.session import NvmlSession
from exporter.profiles import PROFILES
from exporter.runner import Runner
from exporter.tools.simulate.nvml_synth import node_capture
from exporter.xid import kmsg as kmsg_mod
from exporter.xid.service import one_shot
from exporter.xid.sxid import SxidContinuation, SxidReport, parse_sxid
from exporter.xid.sxid_state import by_report
from tests.helpers import (
    HANG_GUARD_S,
    ROOT,
    START_HANG_GUARD_S,
    samples,
    scrape,
    start_exporter,
    stop_within,
    test_pool,
    value,
    wait_for,
)
from tests.test_xid_service import make_ctx

GPU2 = "0000:75:00"  # GPU 2 of the simulated/faked p5.48xlarge


def rec(seq: int, xid: int = 31, pci: str = "0000:53:00", usec: int | None = None, prio: int = 4) -> str:
    """One /dev/kmsg record line, events a minute apart unless usec says otherwise."""
    usec = 1_000_000 + seq * 60_000_000 if usec is None else usec
    return f"{prio},{seq},{usec},-;NVRM: Xid (PCI:{pci}): {xid}, pid=1, name=p, some text\n"


def total(svc) -> int:
    return sum(c.count for ks in svc.store.snapshot().values() for c in ks.values())


def by_key(svc) -> dict[tuple[str, str], int]:
    return {(p, k): c.count for p, ks in svc.store.snapshot().items() for k, c in ks.items()}


def sxid_counts(svc) -> dict:
    return {k: c.count for k, c in by_report(svc.sxids).items()}


def bounded(fn, timeout_s: float = 15.0):
    """fn() in a thread; fails instead of hanging the suite when it blocks."""
    out: dict = {}

    def run() -> None:
        try:
            out["v"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out["e"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), f"blocked for more than {timeout_s:g} s"
    if "e" in out:
        raise out["e"]
    return out.get("v")



def p5_session():
    fake = FakeBackend(node_capture(PROFILES["p5.48xlarge"], load_capture()))
    s = NvmlSession(fake, pool=test_pool())
    assert s.ensure()
    return fake, s


# ================================ never a record twice ==============================================
class TestFileReopen:
    def test_copy_append_rename_then_restart(self, tmp_path):
        path = tmp_path / "kmsg"
        svc = one_shot(make_ctx(tmp_path, "".join(rec(i) for i in range(40))))
        assert total(svc) == 40
        tmp = tmp_path / "kmsg.tmp"
        shutil.copyfile(path, tmp)
        with open(tmp, "a") as f:
            f.write("".join(rec(40 + i) for i in range(8)))
        os.rename(tmp, path)
        svc.read_kmsg(live=True)
        svc.read_kmsg(live=True)
        assert total(svc) == 48
        assert svc.flush_state(force=True)
        again = one_shot(make_ctx(tmp_path, None))
        assert total(again) == 48

    def test_truncate_and_rewrite_in_place_with_more_bytes(self, tmp_path):
        """Same inode, rewritten (O_TRUNC) with the old records plus new ones before the next poll:
        the file is longer than what was read, so size alone cannot tell."""
        path = tmp_path / "kmsg"
        svc = one_shot(make_ctx(tmp_path, "".join(rec(i) for i in range(40))))
        ino = os.stat(path).st_ino
        with open(path, "w") as f:  # truncate + rewrite in place
            f.write("".join(rec(i) for i in range(48)))
        assert os.stat(path).st_ino == ino
        svc.read_kmsg(live=True)
        assert total(svc) == 48

    def test_rewritten_in_place_with_the_oldest_records_dropped(self, tmp_path):
        """Rewritten in place holding only records 20..59 (about as long as 0..39 was): records
        40..59 are new and must all be counted, none twice."""
        path = tmp_path / "kmsg"
        ctx = make_ctx(tmp_path, "".join(rec(i) for i in range(40)))
        svc = one_shot(ctx)
        with open(path, "w") as f:
            f.write("".join(rec(i) for i in range(20, 60)))
        svc.read_kmsg(live=True)
        assert total(svc) == 60
        text = scrape(Runner([XidCollector(ctx)], deadline_s=10, pool=test_pool()))
        assert value(text, "gpu_health_exporter_kmsg_records_total") == 60  # repeats are not reads
        assert value(text, "gpu_health_exporter_kmsg_malformed_records_total") == 0

    def test_truncated_shorter_and_rewritten(self, tmp_path):
        path = tmp_path / "kmsg"
        svc = one_shot(make_ctx(tmp_path, "".join(rec(i) for i in range(40))))
        with open(path, "w") as f:
            f.write("".join(rec(i) for i in range(38, 45)))
        svc.read_kmsg(live=True)
        assert total(svc) == 45

    def test_copytruncate_with_a_writer_that_keeps_its_offset(self, tmp_path):
        """logrotate copytruncate and a writer without O_APPEND: the file is truncated, then the
        writer writes at its old offset, so the file starts with a run of NUL bytes."""
        path = tmp_path / "kmsg"
        text = "".join(rec(i) for i in range(40))
        svc = one_shot(make_ctx(tmp_path, text))
        shutil.copyfile(path, tmp_path / "kmsg.1")
        new = "".join(rec(40 + i) for i in range(5))
        with open(path, "r+b") as f:
            f.truncate(0)
            f.seek(len(text))
            f.write(new.encode())
        svc.read_kmsg(live=True)
        assert total(svc) == 45

    def test_logrotate_rename_and_new_file(self, tmp_path):
        path = tmp_path / "kmsg"
        svc = one_shot(make_ctx(tmp_path, "".join(rec(i) for i in range(40))))
        os.rename(path, tmp_path / "kmsg.1")
        path.write_text("".join(rec(40 + i) for i in range(8)))  # only the new records
        svc.read_kmsg(live=True)
        assert total(svc) == 48
        os.rename(path, tmp_path / "kmsg.2")  # and once more, to a file holding old ones too
        path.write_text("".join(rec(i) for i in range(44, 50)))
        svc.read_kmsg(live=True)
        assert total(svc) == 50

    def test_records_written_to_the_old_file_just_before_the_rotation_are_read(self, tmp_path):
        """logrotate `create`: the writer appends to the old file, then it is renamed and a new
        file holds only what came after."""
        path = tmp_path / "kmsg"
        svc = one_shot(make_ctx(tmp_path, "".join(rec(i) for i in range(10))))
        with open(path, "a") as f:
            f.write(rec(10) + rec(11))
        os.rename(path, tmp_path / "kmsg.1")
        path.write_text("".join(rec(i) for i in range(12, 15)))
        svc.read_kmsg(live=True)
        assert total(svc) == 15

    def test_file_briefly_missing_during_rotation(self, tmp_path):
        path = tmp_path / "kmsg"
        svc = one_shot(make_ctx(tmp_path, "".join(rec(i) for i in range(10))))
        os.rename(path, tmp_path / "kmsg.1")
        svc.read_kmsg(live=True)  # gone for a moment
        path.write_text("".join(rec(i) for i in range(5, 12)))
        svc.read_kmsg(live=True)
        svc.read_kmsg(live=True)
        assert total(svc) == 12
        assert svc.snapshot().kmsg.ok

    def test_a_snapshot_appended_again_counts_nothing_twice(self, tmp_path):
        """A tool that appends a full dump of the ring (`cat /dev/kmsg`-style) to the file again:
        same inode, only longer; the old records come back long after their events closed."""
        path = tmp_path / "kmsg"
        dump = "".join(rec(i, usec=1_000_000 + i * 11_000_000) for i in range(10))
        svc = one_shot(make_ctx(tmp_path, dump))
        svc.store.prune(10**9)  # much later: the merge window of those events is long closed
        with open(path, "a") as f:
            f.write(dump + rec(10, usec=200_000_000) + rec(11, usec=211_000_000))
        svc.read_kmsg(live=True)
        assert total(svc) == 12

    def test_duplicate_sequence_numbers_count_once(self, tmp_path):
        lines = [rec(0), rec(1, xid=63), rec(1, xid=63), rec(2), rec(2)]
        svc = one_shot(make_ctx(tmp_path, "".join(lines)))
        assert by_key(svc) == {("00000000:53:00", "31"): 2, ("00000000:53:00", "63"): 1}

    def test_sequence_going_backwards_after_a_reboot_like_swap_is_documented(self, tmp_path):
        """docs/xid.md: a file replaced by a log whose sequence numbers restart below the ones
        read (another boot's) is not read until it passes them (replaying another log means
        starting the exporter on it)."""
        path = tmp_path / "kmsg"
        svc = one_shot(make_ctx(tmp_path, "".join(rec(i) for i in range(10))))
        tmp = tmp_path / "other"
        tmp.write_text("".join(rec(i, xid=79, pci="0000:86:00") for i in range(12)))
        os.replace(tmp, path)
        svc.read_kmsg(live=True)
        assert by_key(svc) == {("00000000:53:00", "31"): 10, ("00000000:86:00", "79"): 2}  # seq 10, 11

    def test_continuation_lines_crlf_and_nul_bytes(self, tmp_path):
        text = (rec(0, xid=63, pci=GPU2)
                + " SUBSYSTEM=pci\n DEVICE=+pci:0000:75:00.0\n"
                + " 4,99,1,-;NVRM: Xid (PCI:0000:53:00): 79, a continuation that looks like a record\n"
                + rec(1, xid=94, pci="0000:97:00").replace("\n", "\r\n")
                + "\x00\x00" + rec(2, xid=48, pci="0000:64:00"))
        svc = one_shot(make_ctx(tmp_path, text))
        assert by_key(svc) == {("00000000:75:00", "63"): 1, ("00000000:97:00", "94"): 1,
                               ("00000000:64:00", "48"): 1}

    def test_a_very_long_line_costs_little_and_loses_nothing(self, tmp_path):
        junk = "4,0,1,-;NVRM: Xid (PCI:0000:53:00 " + "NVRM: Xid (0000:00:0" * 100_000 + "\n"
        text = junk + "6,1,2,-;" + "x" * 3_000_000 + "\n" + rec(2, xid=63, pci=GPU2)
        ctx = make_ctx(tmp_path, text)
        t = time.process_time()
        svc = one_shot(ctx)
        assert time.process_time() - t < 5.0
        assert by_key(svc) == {("00000000:75:00", "63"): 1}

    def test_a_very_long_unfinished_line_is_not_kept_whole_in_memory(self, tmp_path):
        import tracemalloc

        path = tmp_path / "kmsg"
        svc = one_shot(make_ctx(tmp_path, rec(0)))
        tracemalloc.start()
        try:
            with open(path, "a") as f:
                for _ in range(40):
                    f.write("6,1,1,-;" + "y" * 1_000_000)  # a writer gone mad, no newline
                    f.flush()
                    svc.read_kmsg(live=True)
                f.write("\n" + rec(2, xid=63, pci=GPU2))
            svc.read_kmsg(live=True)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 16_000_000, peak  # not the 40 MB line
        assert by_key(svc) == {("00000000:53:00", "31"): 1, ("00000000:75:00", "63"): 1}


class FakeDevice:
    """A character device that behaves like /dev/kmsg: every open starts at the oldest record of
    the ring, one record per read, EAGAIN at the end; `errors` are raised by the next reads."""

    FD = 987_654

    def __init__(self, path: str, records: list[str]) -> None:
        self.path, self.ring, self.pos, self.errors, self.opens = path, list(records), 0, [], 0

    def install(self, mp) -> None:
        real_stat, real_open, real_close = os.stat, os.open, os.close

        def fstat(p, *a, **k):
            if str(p) == self.path:
                return os.stat_result((stat.S_IFCHR | 0o600, 0, 0, 1, 0, 0, 0, 0, 0, 0))
            return real_stat(p, *a, **k)

        def fopen(p, flags, *a):
            if str(p) == self.path:
                self.pos, self.opens = 0, self.opens + 1
                return self.FD
            return real_open(p, flags, *a)

        real_read = os.read

        def fread(fd, n):
            if fd != self.FD:
                return real_read(fd, n)
            if self.errors:
                e = self.errors.pop(0)
                raise OSError(e, os.strerror(e))
            if self.pos >= len(self.ring):
                raise BlockingIOError(errno.EAGAIN, "again")
            self.pos += 1
            return self.ring[self.pos - 1].encode()

        class Poll:
            def register(self, *a):
                pass

            def poll(self, *a):
                return []

        mp.setattr(kmsg_mod.os, "stat", fstat)
        mp.setattr(kmsg_mod.os, "open", fopen)
        mp.setattr(kmsg_mod.os, "read", fread)
        mp.setattr(kmsg_mod.os, "close", lambda fd: None if fd == self.FD else real_close(fd))
        mp.setattr(kmsg_mod.select, "poll", Poll)


class TestDeviceReopen:
    @pytest.mark.parametrize("err", [errno.EIO, errno.ENODEV, errno.EBADF, errno.EINVAL, errno.ENOMEM])
    def test_reopen_after_a_read_error_counts_nothing_twice(self, tmp_path, monkeypatch, err):
        ctx = make_ctx(tmp_path, "")
        dev = FakeDevice(str(tmp_path / "kmsg"), [rec(i) for i in range(10)])
        dev.install(monkeypatch)
        svc = one_shot(ctx)
        assert total(svc) == 10
        dev.ring += [rec(10 + i) for i in range(5)]
        dev.errors = [err]
        for _ in range(3):
            svc.read_kmsg(live=True)
        assert dev.opens >= 2 and svc.snapshot().kmsg.ok
        assert total(svc) == 15
        dev.errors = [err, err]  # twice in a row, then a record
        dev.ring.append(rec(15))
        for _ in range(4):
            svc.read_kmsg(live=True)
        assert total(svc) == 16
        assert svc.snapshot().kmsg.stats.missed == 0

    def test_epipe_and_eintr_are_not_reopens(self, tmp_path, monkeypatch):
        ctx = make_ctx(tmp_path, "")
        dev = FakeDevice(str(tmp_path / "kmsg"), [rec(i) for i in range(3)])
        dev.ring[1] += " SUBSYSTEM=pci\n DEVICE=+pci:0000:53:00.0\n"  # a record's continuation lines
        dev.install(monkeypatch)
        dev.errors = [errno.EINTR, errno.EPIPE]
        svc = one_shot(ctx)
        assert total(svc) == 3 and dev.opens == 1 and svc.snapshot().kmsg.stats.malformed == 0

    def test_ring_wrapped_while_reopening_counts_the_gap_as_missed(self, tmp_path, monkeypatch):
        ctx = make_ctx(tmp_path, "")
        dev = FakeDevice(str(tmp_path / "kmsg"), [rec(i) for i in range(10)])
        dev.install(monkeypatch)
        svc = one_shot(ctx)
        dev.ring = [rec(i) for i in range(13, 20)]  # 10..12 overwritten before the reopen
        dev.errors = [errno.EIO]
        for _ in range(3):
            svc.read_kmsg(live=True)
        assert total(svc) == 17
        assert svc.snapshot().kmsg.stats.missed == 3

    def test_restart_on_the_device_skips_what_the_state_file_covers(self, tmp_path, monkeypatch):
        ctx = make_ctx(tmp_path, "")
        dev = FakeDevice(str(tmp_path / "kmsg"), [rec(i) for i in range(10)])
        dev.install(monkeypatch)
        svc = one_shot(ctx)
        assert svc.flush_state(force=True)
        dev.ring.append(rec(10))
        again = one_shot(make_ctx(tmp_path, None))
        assert total(again) == 11 and again.snapshot().kmsg.stats.missed == 0


# ============================ a record written in parts =============================================
LINE63 = (f"4,7,5000000,-;NVRM: Xid (PCI:{GPU2}): 63, pid=1, name=p, Row Remapper: New row "
          "marked for remapping, reset gpu to activate.\n")


def split_points(line: str) -> dict[str, list[int]]:
    x = line.index("Xid")
    n = line.index("): 63") + 3
    return {
        "two_parts": [len(line) // 2],
        "three_parts": [len(line) // 3, 2 * len(line) // 3],
        "inside_the_xid_prefix": [x + 1],
        "inside_nvrm": [line.index("NVRM") + 2],
        "inside_the_number": [n + 1],
        "right_after_the_number": [n + 2],
        "right_before_the_newline": [len(line) - 1],
        "inside_the_header": [3],
    }


@pytest.mark.parametrize("where", list(split_points(LINE63)))
def test_a_record_written_in_parts_is_read_whole(tmp_path, where):
    path = tmp_path / "kmsg"
    svc = one_shot(make_ctx(tmp_path, rec(0)))
    cuts = [0, *split_points(LINE63)[where], len(LINE63)]
    for a, b in zip(cuts, cuts[1:], strict=False):
        with open(path, "a") as f:
            f.write(LINE63[a:b])
        for _ in range(3):  # the follower polls several times between the parts
            svc.read_kmsg(live=True)
    assert by_key(svc) == {("00000000:53:00", "31"): 1, ("00000000:75:00", "63"): 1}
    assert svc.snapshot().kmsg.stats.malformed == 0


def test_parts_written_with_delays_to_the_running_follower(tmp_path):
    path = tmp_path / "kmsg"
    ctx = make_ctx(tmp_path, rec(0), follow_poll_seconds=0.02)
    c = XidCollector(ctx)
    c.start()
    try:
        svc = c.service
        wait_for(lambda: total(svc) == 1, what="the backlog")
        line = LINE63.replace("4,7,", "4,1,")
        sxid = f"3,2,6000000,-;{HEAD}Fatal, Link 48 LTSSM Fault Up\n"
        for part in (line[:40], line[40:line.index("63") + 1], line[line.index("63") + 1:] + sxid[:30],
                     sxid[30:]):
            with open(path, "a") as f:
                f.write(part)
            size = os.path.getsize(path)
            # the follower has polled past this part (its position in the file)
            wait_for(lambda size=size: getattr(svc.follower.reader, "_offset", size) >= size, what="a poll")
        wait_for(lambda: total(svc) == 2 and sxid_counts(svc), what="the record")
        assert by_key(svc)[("00000000:75:00", "63")] == 1
        assert ("00000000:75:00", "6") not in by_key(svc)
        assert sxid_counts(svc) == {("00000000:06:00", 20034, "fatal"): 1}
    finally:
        c.close()


def test_a_saved_log_without_a_final_newline_keeps_its_last_line_waiting(tmp_path):
    """A record counts only when whole, for `check` and `ack` as for the
    daemon. A line without its newline may be a record still being written (`...: 6` of an
    `...: 63` line), and counting it, as `check` did, counted a phantom XID and stored a sequence
    number that made the daemon skip the whole record."""
    svc = one_shot(make_ctx(tmp_path, rec(0) + LINE63.rstrip("\n")))
    assert ("00000000:75:00", "63") not in by_key(svc)
    with open(tmp_path / "kmsg", "a") as f:
        f.write("\n")
    assert by_key(one_shot(make_ctx(tmp_path, None)))[("00000000:75:00", "63")] == 1


# ================================ bounded maps =======================================================
def flood(n: int, xids=(31, 63), gpu_at: bool = True, start: int = 0) -> str:
    out, seq = [], start
    for i in range(n):
        pci = f"{(i >> 8) + 1:04x}:{i & 0xff:02x}:00"
        if gpu_at:
            out.append(f"4,{seq},{seq},-;NVRM: GPU at PCI:{pci}: GPU-{i:08x}-1111-2222-3333-444455556666\n")
            seq += 1
        for x in xids:
            out.append(f"4,{seq},{seq * 20_000_000},-;NVRM: Xid (PCI:{pci}): {x}, pid=1, name=p, t\n")
            seq += 1
    return "".join(out)


def series(text: str, name: str) -> list[dict]:
    return [dict(ls) for (n, ls) in samples(text) if n == name]


@pytest.mark.parametrize("gpu_at", [True, False], ids=["gpu_at_lines", "unknown_addresses"])
def test_ten_thousand_addresses_stay_bounded_also_after_a_restart(tmp_path, gpu_at):
    n = 10_000
    log = flood(n, xids=(63,), gpu_at=gpu_at)
    ctx = make_ctx(tmp_path, log)
    svc = one_shot(ctx)
    assert total(svc) == n  # nothing lost: the rest is counted under "other"
    collectors = [XidCollector(ctx), HealthCollector(ctx)] if gpu_at else [XidCollector(ctx)]
    runner = Runner(collectors, deadline_s=30, pool=test_pool())
    text = scrape(runner)
    runner.close()
    assert len(series(text, "gpu_xid_errors_total")) <= 100
    assert len(series(text, "gpu_health_reason")) + len(series(text, "gpu_health_verdict")) <= 1000
    assert len(text) < 200_000
    assert svc.flush_state(force=True)
    state = tmp_path / "state" / "xid-state.json"
    # was 3.9 MB; what remains is mostly the merge ledger of events still open (4,096 keys at most)
    assert state.stat().st_size < 300_000
    # restarted on the same ring plus a flood of new addresses (other PCI domains)
    more = flood(2000, xids=(63,), gpu_at=gpu_at, start=log.count("\n")).replace("PCI:0", "PCI:a")
    ctx2 = make_ctx(tmp_path, log + more)
    svc2 = one_shot(ctx2)
    assert total(svc2) == n + 2000
    text2 = scrape(Runner([XidCollector(ctx2)], deadline_s=30, pool=test_pool()))
    assert len(series(text2, "gpu_xid_errors_total")) <= 100
    assert svc2.flush_state(force=True)
    assert state.stat().st_size < 300_000
    doc = json.loads(state.read_text())
    assert len(doc["gpus"]) <= 100 and len(doc["counts"]) <= 100


def test_a_gpu_nvml_lists_keeps_its_own_series_under_a_flood(tmp_path):
    _, session = p5_session()
    ctx = make_ctx(tmp_path, flood(3000) + rec(10**6, xid=94, pci=GPU2), nvml=session)
    one_shot(ctx)
    text = scrape(Runner([XidCollector(ctx)], deadline_s=30, pool=test_pool()))
    assert value(text, "gpu_xid_errors_total", gpu="2", xid="94", tier="replace") == 1


def test_many_nvswitch_addresses_switches_and_codes_stay_bounded_after_restart(tmp_path):
    lines, seq = [], 0
    for i in range(4000):
        code = 10000 + (i % 700) * 7
        lines.append(f"3,{seq},{seq},-;nvidia-nvswitch{i % 70}: SXid (PCI:{i:04x}:{i % 256:02x}:00.0): "
                     f"{code:05d}, {'Fatal' if i % 2 else 'Non-fatal'}, Link {i % 64:02d} x\n")
        seq += 1
    log = "".join(lines)
    ctx = make_ctx(tmp_path, log)
    svc = one_shot(ctx)
    text = scrape(Runner([NvswitchCollector(ctx)], deadline_s=30, pool=test_pool()))
    ss = series(text, "gpu_nvswitch_sxid_errors_total")
    assert 0 < len(ss) <= 256
    assert len({s["pci_bus_id"] for s in ss}) <= 17
    assert svc.flush_state(force=True)
    sx = tmp_path / "state" / "xid-state.json"  # the SXid counts are its `sxid` section
    assert sx.stat().st_size < 64_000
    before = sxid_counts(svc)
    svc2 = one_shot(make_ctx(tmp_path, log))
    assert sxid_counts(svc2) == before  # restarted on the same ring: nothing counted twice
    assert len(svc2.sxids.indices) <= 16


# ================================ SXid continuations ================================================
HEAD = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, "


@pytest.mark.parametrize("body", [
    "Data {0x10000000, 0x10000000, 0x00000000, 0x10000000, 0x00000000, 0x00000000, 0x00000000, "
    "0x00000000, 0x00000000}",
    "Data {0x10000000, 0x10000000, 0x00000000}p",
    "Data {0x10000000, 0x10000000, 0x00000000} ",
    "Data {0x10000000, 0x10000000, 0x00000000}}}",
    "Data {0x10000000, 0x1000",
    "Data {0x10000000, 0x10000000, 0x00000000}\r",
    "Data {0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, "
    "0x00000000} trailing words, Fatal",
    "Severity 1 Engine instance 48 Sub-engine instance 00",
    "Severity 0 Engine instance 46 Sub-engine instance 00p",
    "Severity 5 Engine instance 07 Sub-engine instance 00",
    "Severity 1 Engine instance 60 Sub-engine instance 00 Fatal",
    "Severity 12 Engine instance 9",
    "Severity 1 Engine instance 48 Sub-engine instance 00\r",
    "SOE HALT data[0] = 0x00000001",
])
def test_continuations_are_never_reports(body):
    assert isinstance(parse_sxid(HEAD + body), SxidContinuation), body
    assert isinstance(parse_sxid("[6781753.406566] " + HEAD + body), SxidContinuation), body


@pytest.mark.parametrize(("body", "severity", "link"), [
    ("Fatal, Link 48 LTSSM Fault Up", "fatal", 48),
    ("Fatal, Link 48 LTSSM Fault Up (First)", "fatal", 48),
    ("Non-fatal, Link 32 egress non-posted PRIV error (First)", "non_fatal", 32),
    ("Correctable, Link 04 RX short error rate", "correctable", 4),
    ("Fatal, Failed to post command to SOE. Data {0x00000001, 0x00000002}", "fatal", None),
    ("Non-fatal, egress credit timeout, instance=3, chiplet=1", "non_fatal", None),
    ("SOE HALTED", "unknown", None),
])
def test_reports_stay_reports(body, severity, link):
    r = parse_sxid(HEAD + body)
    assert isinstance(r, SxidReport) and r.severity == severity and r.link == link, body


def test_a_dump_after_its_report_counts_once_and_adds_no_unknown_reason(tmp_path):
    dump = [
        HEAD + "Fatal, Link 48 LTSSM Fault Up (First)",
        HEAD + "Severity 1 Engine instance 48 Sub-engine instance 00",
        HEAD + "Data {0x10000000, 0x10000000, 0x00000000, 0x10000000, 0x00000000}p",
        HEAD + "Data {0x00000000, 0x00000000}junk",
        # a Data line of another SXid, and one of another switch: still dumps, not reports
        "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 22013, Data {0x1, 0x2, 0x3}p",
        "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 Sub-engine "
        "instance 00 trailing",
        "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Non-fatal, Link 46 MC TS crumbstore MCTO (First)",
        "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Severity 0 Engine instance 46 Sub-engine "
        "instance 00",
        "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Data {0x00140004, 0x00100000, 0x00140004, "
        "0x00000000}",
    ]
    text = "".join(f"3,{i},{1_000_000 * (i + 1)},-;{m}" + ("\r\n" if i % 3 == 2 else "\n")
                   for i, m in enumerate(dump))
    ctx = make_ctx(tmp_path, text)
    svc = one_shot(ctx)
    assert sxid_counts(svc) == {("00000000:06:00", 20034, "fatal"): 1,
                                ("00000000:c1:00", 28006, "non_fatal"): 1}
    s = samples(scrape(Runner([HealthCollector(ctx)], deadline_s=10, pool=test_pool())))
    reasons = {dict(ls)["reason"] for (n, ls) in s if n == "gpu_node_health_reason"}
    assert "sxid_unknown" not in reasons and "sxid_reboot" in reasons


# ============================= what is at the state path ===========================================
def make_socket(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cwd = os.getcwd()
    os.chdir(path.parent)  # AF_UNIX paths are limited to 108 bytes: bind a relative name
    try:
        s.bind(path.name)
    finally:
        os.chdir(cwd)
    return s


def plant(kind: str, path: Path, side: Path) -> object:
    """Put a `kind` at `path` (link targets in `side`); returns what must stay alive (a socket)."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink":
        target = side / f"target-{path.name}"
        target.write_text('{"precious": true}')
        path.symlink_to(target)
    elif kind == "dangling_symlink":
        path.symlink_to(side / "nowhere" / "x")
    elif kind == "symlink_to_fifo":
        target = side / f"fifo-{path.name}"
        os.mkfifo(target)
        path.symlink_to(target)
    elif kind == "socket":
        return make_socket(path)
    elif kind == "devnull":
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    return None


KINDS = ["fifo", "directory", "symlink", "dangling_symlink", "symlink_to_fifo", "socket", "devnull"]


def short_tmp() -> Path:
    return Path(tempfile.mkdtemp(prefix="hx", dir="/tmp"))


@pytest.mark.parametrize("name", ["xid-state.json", "sxid-state.json", "xid-state.json.lock"])
@pytest.mark.parametrize("kind", KINDS)
def test_odd_things_at_the_state_file_paths_never_block_and_are_left_alone(name, kind, caplog):
    tmp = short_tmp()
    try:
        state = tmp / "state"
        state.mkdir()
        keep = plant(kind, state / name, tmp)
        before = os.lstat(state / name)
        ctx = make_ctx(tmp, rec(0) + f"3,1,2,-;{HEAD}Fatal, Link 48 LTSSM Fault Up\n")
        svc = bounded(lambda: one_shot(ctx))
        assert total(svc) == 1 and sum(sxid_counts(svc).values()) == 1
        bounded(lambda: svc.flush_state(force=True))
        bounded(lambda: svc.refresh_acks())
        after = os.lstat(state / name)
        if name != "xid-state.json.lock":  # what is at the state paths is neither read nor replaced
            assert (after.st_ino, stat.S_IFMT(after.st_mode)) == (before.st_ino, stat.S_IFMT(before.st_mode))
            assert str(state / name) in caplog.text
        if kind.startswith("symlink") and kind != "symlink_to_fifo":
            assert (tmp / f"target-{name}").read_text() == '{"precious": true}'
        if name == "xid-state.json":
            text = scrape(Runner([XidCollector(ctx)], deadline_s=10, pool=test_pool()))
            assert value(text, "gpu_health_exporter_state_file_ok") == 0
        del keep
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("kind", ["fifo", "regular_file", "socket", "dangling_symlink", "symlink_to_fifo"])
def test_odd_things_at_the_state_dir_never_block(kind):
    tmp = short_tmp()
    try:
        state = tmp / "state"
        keep = plant(kind, state, tmp) if kind != "regular_file" else state.write_text("x")
        ctx = make_ctx(tmp, rec(0))
        svc = bounded(lambda: one_shot(ctx))
        assert total(svc) == 1
        assert bounded(lambda: svc.flush_state(force=True)) is False
        text = scrape(Runner([XidCollector(ctx)], deadline_s=10, pool=test_pool()))
        assert value(text, "gpu_health_exporter_state_file_ok") == 0
        del keep
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["socket", "directory"])
def test_check_and_ack_with_an_odd_state_file_answer(kind, capsys):
    from exporter.cli import main

    tmp = short_tmp()
    try:
        state = tmp / "state"
        state.mkdir()
        keep = plant(kind, state / "xid-state.json", tmp)
        log = tmp / "kmsg.txt"
        log.write_text(rec(0, xid=63, pci=GPU2))
        common = ["--simulate", "p5.48xlarge", "--kmsg-file", str(log), "--path.state-dir", str(state)]
        assert bounded(lambda: main(["check", *common, "--json"]), 60) == 2  # the XID 63 already
        doc = json.loads(capsys.readouterr().out)
        assert doc["sources"]["state_file"]["problem"] == "unreadable"
        assert bounded(lambda: main(["ack", *common, "--gpu", "2"]), 60) == 2
        assert "cannot write the state file" in capsys.readouterr().err
        assert stat.S_IFMT(os.lstat(state / "xid-state.json").st_mode) != stat.S_IFREG
        del keep
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_check_with_a_fifo_as_its_kernel_log_answers(tmp_path, capsys):
    from exporter.cli import main

    fifo = str(tmp_path / "kmsg.fifo")
    os.mkfifo(fifo)
    code = bounded(lambda: main(["check", "--simulate", "p5.48xlarge", "--kmsg-file", fifo,
                                 "--path.state-dir", str(tmp_path / "state"), "--json"]), 60)
    doc = json.loads(capsys.readouterr().out)
    assert code == 3 and "FIFO" in json.dumps(doc["sources"])


# ============================ acks and the log trail ================================================
def xid_logs(caplog, what: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name in ("exporter.xid", "exporter.sxid")
            and what in r.getMessage()]


def daemon_service(tmp_path, log_text: str | None):
    _, session = p5_session()
    ctx = make_ctx(tmp_path, log_text, nvml=session, follow_poll_seconds=0.02)
    c = XidCollector(ctx)
    c.start()
    return ctx, c


def test_every_counted_event_logged_once_and_not_again_after_a_restart(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    flood13 = "".join(f"4,{10 + i},{9_000_000 + i},-;NVRM: Xid (PCI:0000:53:00): 13, Graphics SM "
                      f"Warp Exception on (GPC 0, TPC {i}, SM 0)\n" for i in range(50))
    log = (rec(0, xid=63, pci=GPU2) + rec(1, xid=79, pci="0000:86:00") + flood13
           + f"3,70,10000000,-;{HEAD}Fatal, Link 48 LTSSM Fault Up (First)\n"
           + f"3,71,10000001,-;{HEAD}Severity 1 Engine instance 48 Sub-engine instance 00\n"
           + f"3,72,10000002,-;{HEAD}Data {{0x1, 0x2}}p\n")
    ctx, c = daemon_service(tmp_path, log)
    try:
        svc = c.service
        wait_for(lambda: total(svc) == 3 and sxid_counts(svc), what="counts")
        wait_for(lambda: len(xid_logs(caplog, "counted")) >= 4, what="log lines")
    finally:
        c.close()
    counted = xid_logs(caplog, "counted")
    assert len(counted) == 4, counted
    x63 = [m for m in counted if "XID 63" in m]
    assert len(x63) == 1 and "GPU 2" in x63[0] and "00000000:75:00.0" in x63[0] and "replace" in x63[0]
    assert len([m for m in counted if "XID 13" in m]) == 1  # a flood is one event, one line
    sx = [m for m in counted if "SXid" in m]
    assert len(sx) == 1 and "20034" in sx[0] and "00000000:06:00.0" in sx[0] and "fatal" in sx[0]
    assert all(r.levelno == logging.WARNING for r in caplog.records if "counted" in r.getMessage())

    caplog.clear()
    with open(tmp_path / "kmsg", "a") as f:
        f.write(rec(80, xid=94, pci="0000:97:00"))
    ctx2, c2 = daemon_service(tmp_path, None)  # restarted on the same ring plus one record
    try:
        wait_for(lambda: ("00000000:97:00", "94") in by_key(c2.service), what="the new XID")
        wait_for(lambda: xid_logs(caplog, "XID 94"), what="its log line")
        assert total(c2.service) == 4
    finally:
        c2.close()
    counted = xid_logs(caplog, "counted")
    assert len(counted) == 1 and "XID 94" in counted[0] and "GPU 4" in counted[0], counted


def run_ack(ctx, gpu: str, xid: int | None = None) -> int:
    import argparse

    from exporter.commands import ack
    from exporter.startup import build_context  # noqa: F401 - the same composition the CLI uses

    ack_ctx = make_ctx(Path(ctx.config.paths.state_dir).parent, None, nvml=p5_session()[1])
    return ack.run(argparse.Namespace(gpu=gpu, xid=xid), ack_ctx)


def test_an_ack_is_exported_and_logged_once_and_not_again_after_a_restart(tmp_path, caplog, capsys):
    caplog.set_level(logging.INFO)
    ctx, c = daemon_service(tmp_path, rec(0, xid=63, pci=GPU2) + rec(1, xid=48, pci="0000:64:00"))
    runner = Runner([XidCollector(ctx)], deadline_s=10, pool=test_pool())
    try:
        wait_for(lambda: total(c.service) == 2, what="counts")
        c.service.flush_state(force=True)
        t0 = time.time()
        assert run_ack(ctx, "2") == 0
        assert run_ack(ctx, "1", xid=48) == 0
        text = scrape(runner)
        assert value(text, "gpu_xid_acknowledged_timestamp_seconds", gpu="2", xid="all",
                     pci_bus_id="00000000:75:00.0") >= t0 - 1
        assert value(text, "gpu_xid_acknowledged_timestamp_seconds", gpu="1", xid="48") >= t0 - 1
        for _ in range(3):
            scrape(runner)
            c.service.flush_state(force=True)
    finally:
        c.close()
    acked = xid_logs(caplog, "acknowledged")
    assert len(acked) == 2, acked
    a2 = next(m for m in acked if "GPU 2" in m)
    assert "00000000:75:00.0" in a2 and "63" in a2 and "replace" in a2
    assert all(r.levelno == logging.INFO for r in caplog.records if "acknowledged" in r.getMessage())

    caplog.clear()
    ctx2, c2 = daemon_service(tmp_path, None)
    try:
        text = scrape(Runner([XidCollector(ctx2)], deadline_s=10, pool=test_pool()))
        assert value(text, "gpu_xid_acknowledged_timestamp_seconds", gpu="2", xid="all") >= t0 - 1
        scrape(Runner([XidCollector(ctx2)], deadline_s=10, pool=test_pool()))
    finally:
        c2.close()
    assert xid_logs(caplog, "acknowledged") == [] and xid_logs(caplog, "counted") == []


def test_an_ack_made_while_the_daemon_was_down_is_logged_when_it_starts(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    ctx, c = daemon_service(tmp_path, rec(0, xid=63, pci=GPU2))
    try:
        wait_for(lambda: total(c.service) == 1, what="counts")
    finally:
        c.close()
    assert run_ack(ctx, "2") == 0
    caplog.clear()
    ctx2, c2 = daemon_service(tmp_path, None)
    try:
        runner = Runner([XidCollector(ctx2)], deadline_s=10, pool=test_pool())
        scrape(runner)
        scrape(runner)
        c2.service.flush_state(force=True)
    finally:
        c2.close()
    acked = xid_logs(caplog, "acknowledged")
    assert len(acked) == 1 and "GPU 2" in acked[0], acked
    caplog.clear()
    ctx3, c3 = daemon_service(tmp_path, None)
    try:
        scrape(Runner([XidCollector(ctx3)], deadline_s=10, pool=test_pool()))
    finally:
        c3.close()
    assert xid_logs(caplog, "acknowledged") == []


# ================================== end to end: the daemon ==========================================
def xid_total(url: str) -> float:
    text = requests.get(url, timeout=30).text
    return sum(v for (n, _), v in samples(text).items() if n == "gpu_xid_errors_total")


@pytest.mark.slow
def test_daemon_rotated_log_counts_exactly_and_logs_each_event_once_across_a_restart(tmp_path):
    log = tmp_path / "kmsg.txt"
    log.write_text("".join(rec(i, pci=GPU2) for i in range(40)))
    state = tmp_path / "state"
    args = ("--simulate", "p5.48xlarge", "--kmsg-file", str(log), "--path.state-dir", str(state))
    proc, url, out = start_exporter(tmp_path, *args)
    try:
        wait_for(lambda: xid_total(url) == 40, START_HANG_GUARD_S, "40 events")
        shutil.copyfile(log, tmp_path / "kmsg.new")
        with open(tmp_path / "kmsg.new", "a") as f:
            f.write("".join(rec(40 + i, pci=GPU2) for i in range(8)))
        os.rename(tmp_path / "kmsg.new", log)
        wait_for(lambda: xid_total(url) >= 48, START_HANG_GUARD_S, "48 events")
        t0 = time.time()
        r = subprocess.run([sys.executable, "-m", "exporter", "ack", *args, "--gpu", "2"],
                           capture_output=True,
                           text=True, timeout=HANG_GUARD_S, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert r.returncode == 0, r.stderr
        acked = wait_for(lambda: [v for (n, ls), v in samples(requests.get(url, timeout=30).text).items()
                                  if n == "gpu_xid_acknowledged_timestamp_seconds"], 30, "the ack fact")
        assert len(acked) == 1 and acked[0] >= t0 - 1
        requests.get(url, timeout=30)
        assert xid_total(url) == 48
        assert stop_within(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    first = out.read_text()
    assert first.count("XID 31 counted on GPU 2 (PCI 00000000:75:00.0): tier application") == 48
    assert first.count("acknowledged all XIDs on GPU 2 (PCI 00000000:75:00.0)") == 1
    proc, url, out = start_exporter(tmp_path, *args)
    try:
        assert xid_total(url) == 48
        text = requests.get(url, timeout=30).text
        assert value(text, "gpu_xid_acknowledged_timestamp_seconds", gpu="2", xid="all") >= t0 - 1
        assert stop_within(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    second = out.read_text()
    assert "counted on" not in second and "acknowledged" not in second


@pytest.mark.slow
def test_daemon_with_a_socket_as_its_state_file_and_a_fifo_as_its_log_serves_and_stops_on_sigterm():
    tmp = short_tmp()
    try:
        state = tmp / "state"
        state.mkdir()
        keep = make_socket(state / "xid-state.json")
        os.mkfifo(tmp / "kmsg.fifo")  # used to hang start-up: --kmsg-file was opened to sniff a capture
        proc, url, out = start_exporter(tmp, "--simulate", "p5.48xlarge", "--kmsg-file",
                                        str(tmp / "kmsg.fifo"), "--path.state-dir", str(state))
        try:
            text = requests.get(url, timeout=30).text
            assert "gpu_health_exporter_state_file_ok 0.0" in text
            assert "gpu_health_exporter_kmsg_up 0.0" in text
            assert stop_within(proc) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        del keep
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_backlog_xid_read_before_nvml_is_up_is_logged_with_its_gpu(tmp_path, caplog):
    """The daemon reads the backlog before NVML is initialised (the GPU collector's first scrape or
    the event watcher does that): the log line still names the GPU."""
    caplog.set_level(logging.WARNING)
    fake = FakeBackend(node_capture(PROFILES["p5.48xlarge"], load_capture()))
    session = NvmlSession(fake, pool=test_pool())  # not initialised yet
    ctx = make_ctx(tmp_path, rec(0, xid=63, pci=GPU2), nvml=session, follow_poll_seconds=0.02)
    c = XidCollector(ctx)
    c.start()
    try:
        wait_for(lambda: total(c.service) == 1, what="the count")
        assert session.ensure()
        wait_for(lambda: xid_logs(caplog, "XID 63"), what="the log line")
    finally:
        c.close()
    lines = xid_logs(caplog, "counted")
    assert len(lines) == 1 and "GPU 2 (PCI 00000000:75:00.0)" in lines[0], lines
