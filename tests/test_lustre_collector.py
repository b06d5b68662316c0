"""The Lustre collector on generated 2.10/2.12/2.15/2.16 trees: paths per version, per-target
switch, eviction counting across scrapes, mounts coming and going, debugfs missing, hung mounts,
damaged files."""

import logging
import shutil
import time

import pytest

from exporter.collectors.lustre import IMPORT_STATES, LustreCollector
from exporter.compose import compose
from exporter.config import load
from exporter.deadline import Pool
from exporter.lustre.evictions import EvictionTracker, appended
from exporter.runner import Runner
from tests.helpers import START_HANG_GUARD_S, promtool_check_metrics, samples, scrape, test_pool, value
from tests.lustre_tree import (
    STATS_START_TIME,
    FakeStatvfs,
    FsSpec,
    LustreTree,
    import_file,
    llite_stats,
    state_file,
)

TiB = 1024**4


def make(tree: LustreTree, statvfs=None, **cfg):
    overrides = {**tree.overrides(), "lustre.lfs_command": "", "lustre.use_ioctl": False}
    overrides.update({f"lustre.{k}": v for k, v in cfg.items()})
    c = LustreCollector(compose(load(None, overrides)))
    c.statvfs = statvfs or FakeStatvfs({fs.mountpoint: TiB for fs in tree.filesystems})
    return c, Runner([c], deadline_s=5, pool=test_pool())


def series(s, name):
    return {ls: v for (n, ls), v in s.items() if n == name}


@pytest.mark.parametrize("version", ["2.10.1", "2.12.9", "2.15.0", "2.15.6", "2.16.0"])
def test_each_client_layout(tmp_path, version):
    tree = LustreTree(tmp_path, version, filesystems=[FsSpec("scratch-fs", "/scratch", osts=4)]).build()
    if tree.vt >= (2, 12):  # stats only in debugfs, tunables only in sysfs
        assert not (tree.proc / "llite").exists() and (tree.debug / "llite").is_dir()
        assert not list(tree.proc.glob("osc/*/max_rpcs_in_flight"))
    c, r = make(tree)
    text = scrape(r)
    assert promtool_check_metrics(text) == ""
    s = samples(text)
    fs = {"fsname": "scratch-fs", "mount": "/scratch"}
    osc = {**fs, "component": "osc", "target": ""}
    mdc = {**fs, "component": "mdc", "target": ""}
    assert value(s, "gpu_health_exporter_collector_success", collector="lustre") == 1
    assert value(s, "lustre_client_info", **fs) == 1
    assert value(s, "lustre_client_info", llite="scratch-fs-ffff8d1e4c6b9000", version=version) == 1
    assert value(s, "lustre_client_read_bytes_total", **fs) == 40960
    assert value(s, "lustre_client_read_calls_total", **fs) == 10
    assert value(s, "lustre_client_write_bytes_total", **fs) == 8192
    assert value(s, "lustre_client_operations_total", operation="open", **fs) == 5
    latency = series(s, "lustre_client_operation_seconds_total")
    if tree.vt >= (2, 13):
        got = value(s, "lustre_client_operation_seconds_total", operation="open", **fs)
        assert got == pytest.approx(5e-4)
    else:
        assert latency == {}  # [regs] counters carry no time
    assert value(s, "lustre_client_rpcs_total", **osc) == 400
    assert value(s, "lustre_client_rpc_wait_seconds_total", **osc) == pytest.approx(0.2)
    assert value(s, "lustre_client_rpcs_total", **mdc) == 100
    assert value(s, "lustre_client_rpc_read_bytes_total", **osc) == 4 * 4096 * 1024
    assert value(s, "lustre_client_import_state", state="FULL", **osc) == 4
    assert value(s, "lustre_client_import_state", state="DISCONN", **osc) == 0
    assert value(s, "lustre_client_rpcs_in_flight", **osc) == 8
    assert value(s, "lustre_client_max_rpcs_in_flight", **osc) == 32
    assert value(s, "lustre_client_rpc_timeouts_total", **mdc) == 0
    assert value(s, "lustre_client_targets", fsname="scratch-fs", mount="/scratch", component="osc") == 4
    assert value(s, "lustre_client_cache_used_bytes", **fs) == 10 * 2**20
    assert value(s, "lustre_client_cache_limit_bytes", **fs) == 1000 * 2**20
    assert value(s, "lustre_client_filesystem_size_bytes", **fs) == TiB
    assert value(s, "lustre_client_filesystem_available_bytes", **fs) == TiB // 4
    assert value(s, "lustre_client_filesystem_inodes_free", **fs) == 900
    assert value(s, "lustre_client_health_status", status="healthy") == 1
    assert value(s, "lustre_client_import_evictions_total", **osc) == 0
    ups = {dict(ls)["source"]: v for ls, v in series(s, "lustre_client_source_up").items()}
    want = {"procfs": 1, "sysfs": 1} if tree.vt < (2, 12) else {"procfs": 1, "sysfs": 1, "debugfs": 1}
    assert ups == want
    assert value(s, "lustre_client_malformed_lines_total", file="llite_stats") == 0
    reset = series(s, "lustre_client_stats_reset_timestamp_seconds")
    if tree.vt >= (2, 15, 2):  # start_time is wall clock
        assert list(reset.values()) == [STATS_START_TIME]
        assert value(s, "lustre_client_stats_reset_timestamp_seconds", **fs) == STATS_START_TIME
    else:  # no start_time line before 2.14.56; 0 on 2.15.0-2.15.1
        assert reset == {}


def test_per_target_series(tmp_path):
    tree = LustreTree(tmp_path, filesystems=[FsSpec("fs1", "/fsx", osts=4)]).build()
    _, off = make(tree)
    _, on = make(tree, per_target=True)
    text_on = scrape(on)
    assert promtool_check_metrics(text_on) == ""
    s_off, s_on = samples(scrape(off)), samples(text_on)
    assert len(series(s_off, "lustre_client_import_state")) == 2 * len(IMPORT_STATES)
    assert len(series(s_on, "lustre_client_import_state")) == 5 * len(IMPORT_STATES)
    targets = {dict(ls)["target"] for ls in series(s_on, "lustre_client_rpcs_total")}
    assert targets == {"MDT0000", "OST0000", "OST0001", "OST0002", "OST0003"}
    assert value(s_on, "lustre_client_rpcs_total", target="OST0002") == 100
    assert value(s_on, "lustre_client_import_state", target="OST0002", state="FULL") == 1
    assert value(s_on, "lustre_client_max_rpcs_in_flight", target="OST0002") == 8
    per = series(s_on, "lustre_client_rpcs_total")
    assert sum(v for ls, v in per.items() if ("component", "osc") in ls) == \
        value(s_off, "lustre_client_rpcs_total", component="osc")


def test_eviction_ring_overlap():
    ring = [(i, "FULL") for i in range(16)]
    assert appended(ring, ring) == []
    assert appended(ring, ring[3:] + [(20, "DISCONN"), (20, "EVICTED"), (21, "FULL")]) == \
        [(20, "DISCONN"), (20, "EVICTED"), (21, "FULL")]
    assert appended([], ring) == ring
    assert appended(ring, [(99, "EVICTED")]) == [(99, "EVICTED")]  # more than 16 transitions between reads
    t = EvictionTracker()
    assert t.update("a", [(1, "FULL"), (5, "EVICTED")]) == (1, 1, 5)  # first sight counts the ring
    assert t.update("a", [(1, "FULL"), (5, "EVICTED")]) == (0, 1, 5)
    assert t.update("a", [(5, "EVICTED"), (6, "FULL"), (9, "EVICTED")]) == (1, 2, 9)
    t.update("b", [])
    t.retain({"b"})
    assert len(t) == 1


def test_evictions_counted_once_across_scrapes(tmp_path):
    tree = LustreTree(tmp_path, filesystems=[FsSpec("fs1", "/fsx", osts=4)]).build()
    c, r = make(tree, per_target=True)
    _, agg = make(tree)
    dev = tree.proc / "osc/fs1-OST0001-osc-ffff8d1e4c6b9000/state"
    base = [(1700000000 + i, "FULL") for i in range(14)]

    def counts():
        s, a = samples(scrape(r)), samples(scrape(agg))
        return (value(s, "lustre_client_import_evictions_total", target="OST0001"),
                value(a, "lustre_client_import_evictions_total", component="osc"),
                value(s, "lustre_client_import_last_eviction_timestamp_seconds", target="OST0001"))

    tree.write(dev, state_file(base))
    assert counts() == (0, 0, 0)
    hist = base + [(1700000100, "DISCONN"), (1700000101, "EVICTED")]
    tree.write(dev, state_file(hist))
    assert counts() == (1, 1, 1700000101)
    assert counts() == (1, 1, 1700000101)  # the ring repeats the entry: not counted again
    hist = hist[3:] + [(1700000102, "RECOVER"), (1700000103, "FULL"), (1700000200, "IDLE")]
    tree.write(dev, state_file(hist[-16:]))
    assert counts() == (1, 1, 1700000101)  # the ring rolled
    hist = hist[-14:] + [(1700000300, "EVICTED"), (1700000301, "FULL")]
    tree.write(dev, state_file(hist))
    assert counts() == (2, 2, 1700000300)
    # The eviction has left the ring: the count and the time stay.
    tree.write(dev, state_file([(1700000400 + i, "FULL") for i in range(16)]))
    assert counts() == (2, 2, 1700000300)
    assert len(c.evictions) == 5  # one ring per import present, no more


def test_mounts_appear_and_vanish(tmp_path):
    a, b = FsSpec("fs-a", "/a", inst_id="ffff0001", osts=2), FsSpec("fs-b", "/b", inst_id="ffff0002", osts=3)
    tree = LustreTree(tmp_path, filesystems=[a]).build()
    statvfs = FakeStatvfs({"/a": TiB, "/b": 2 * TiB})
    c, r = make(tree, statvfs=statvfs, per_target=True)
    s = samples(scrape(r))
    assert {dict(ls)["mount"] for ls in series(s, "lustre_client_info")} == {"/a"}
    tree.filesystems.append(b)
    tree.add_fs(b)
    tree.write_mounts()
    s = samples(scrape(r))
    assert {dict(ls)["mount"] for ls in series(s, "lustre_client_info")} == {"/a", "/b"}
    assert value(s, "lustre_client_targets", mount="/b", component="osc") == 3
    assert value(s, "lustre_client_filesystem_size_bytes", mount="/b") == 2 * TiB
    assert len(c.evictions) == 3 + 4
    tree.filesystems.remove(a)
    tree.write_mounts()
    shutil.rmtree(tree.debug / "llite" / a.instance)
    for comp, dev, _ in a.devices():
        shutil.rmtree(tree.proc / comp / dev)
    s = samples(scrape(r))
    assert not [ls for (n, ls) in s if n.startswith("lustre_client") and ("mount", "/a") in ls]
    assert value(s, "lustre_client_mounts") == 1
    assert len(c.evictions) == 4 and all(k[1] == "/b" for k in c._evict_total)


def test_debugfs_missing_still_exports_import_health_capacity(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="exporter.lustre")
    tree = LustreTree(tmp_path, debugfs=False, filesystems=[FsSpec("fs1", "/fsx")]).build()
    c, r = make(tree)
    for _ in range(3):
        s = samples(scrape(r))
    assert value(s, "gpu_health_exporter_collector_success", collector="lustre") == 1
    assert value(s, "lustre_client_source_up", source="debugfs") == 0
    assert value(s, "lustre_client_source_up", source="procfs") == 1
    assert value(s, "lustre_client_source_up", source="sysfs") == 1
    assert value(s, "lustre_client_import_state", component="osc", state="FULL") == 4
    assert value(s, "lustre_client_health_status", status="healthy") == 1
    assert value(s, "lustre_client_filesystem_size_bytes", mount="/fsx") == TiB
    assert value(s, "lustre_client_max_rpcs_in_flight", component="mdc") == 8
    assert not series(s, "lustre_client_read_bytes_total")
    assert not series(s, "lustre_client_rpcs_total")
    warnings = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # said once, not every scrape
    assert "debugfs is not mounted" in warnings[0] and "stats" in warnings[0]
    # debugfs comes back (mounted): the source is up again and the recovery is logged.
    tree.debugfs = True
    tree.add_fs(tree.filesystems[0])
    s = samples(scrape(r))
    assert value(s, "lustre_client_source_up", source="debugfs") == 1
    assert value(s, "lustre_client_read_bytes_total", mount="/fsx") == 40960
    assert any(rec.getMessage() == "source debugfs: fine again" for rec in caplog.records)


def test_debugfs_unreadable(tmp_path, caplog):
    tree = LustreTree(tmp_path, filesystems=[FsSpec("fs1", "/fsx")]).build()
    c, r = make(tree)
    real = c.tree.reader

    def reader(path):
        if str(path).startswith(str(tree.debug)):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    c.tree.reader = reader
    s = samples(scrape(r))
    assert value(s, "lustre_client_source_up", source="debugfs") == 0
    assert value(s, "lustre_client_import_state", component="mdc", state="FULL") == 1
    assert not series(s, "lustre_client_read_bytes_total")
    assert any("permission denied" in rec.getMessage() and "CAP_DAC_READ_SEARCH" in rec.getMessage()
               for rec in caplog.records)


def test_same_fsname_twice_needs_lfs(tmp_path, caplog):
    one = FsSpec("scratch-fs", "/scratch", inst_id="ffff0001", osts=1)
    two = FsSpec("scratch-fs", "/scratch2", inst_id="ffff0002", osts=2)
    tree = LustreTree(tmp_path, filesystems=[one, two]).build()
    _, r = make(tree)
    s = samples(scrape(r))
    assert value(s, "lustre_client_info", mount="/scratch", llite="") == 1  # ambiguous: not guessed
    assert value(s, "lustre_client_filesystem_size_bytes", mount="/scratch2") == TiB
    assert not series(s, "lustre_client_rpcs_total")
    assert any("cannot find its llite instance" in rec.getMessage() for rec in caplog.records)
    lfs = tmp_path / "lfs"
    lfs.write_text('#!/bin/sh\ncase "$2" in /scratch) echo "scratch-fs-ffff0001 $2";;\n'
                   '*) echo "scratch-fs-ffff0002 $2";; esac\n')
    lfs.chmod(0o755)
    _, r = make(tree, lfs_command=str(lfs))
    s = samples(scrape(r))
    assert value(s, "lustre_client_info", mount="/scratch", llite="scratch-fs-ffff0001") == 1
    assert value(s, "lustre_client_targets", mount="/scratch2", component="osc") == 2
    assert value(s, "lustre_client_rpcs_total", mount="/scratch", component="osc") == 100


def test_hung_statvfs_does_not_block_the_collection(tmp_path):
    tree = LustreTree(tmp_path, filesystems=[FsSpec("fs1", "/fsx"), FsSpec("fs2", "/fsy", "ffff02")]).build()
    hung = FakeStatvfs({"/fsx": TiB, "/fsy": TiB}, hang_s=4.0)
    _, r = make(tree, statvfs=hung, probe_timeout_seconds=1.0)
    s = samples(scrape(r))
    s2 = samples(scrape(r))
    # Each mount's probe costs its timeout once (the collection goes on), and a stuck call is
    # not started again on the next scrape.
    assert hung.calls == 2
    for x in (s, s2):
        for mnt in ("/fsx", "/fsy"):
            assert value(x, "lustre_client_statfs_success", mount=mnt) == 0
            assert value(x, "lustre_client_import_state", mount=mnt, component="osc", state="FULL") == 4
        assert not series(x, "lustre_client_filesystem_size_bytes")


def test_a_blocking_stats_file_costs_only_its_own_series(tmp_path):
    import os

    tree = LustreTree(tmp_path, version="2.12.9",
                      filesystems=[FsSpec("fs1", "/fsx"), FsSpec("fs2", "/fsy", "ffff02")]).build()
    fs = tree.filesystems[0]
    stats = tree.debug / "llite" / fs.instance / "stats"
    stats.unlink()
    os.mkfifo(stats)  # opening a FIFO with no writer blocks in the kernel, like a hung client's read
    c, r = make(tree, file_timeout_seconds=0.5)
    s = samples(scrape(r))
    s2 = samples(scrape(r))
    # the deadline once, not per scrape (one read written off), never the collector's 5 s (success)
    assert c.tree._files.abandoned == 1 and len(c.tree._files.stuck()) == 1
    for x in (s, s2):
        assert value(x, "gpu_health_exporter_collector_success", collector="lustre") == 1
        assert not series(x, "lustre_client_read_bytes_total").get(
            frozenset({("fsname", "fs1"), ("mount", "/fsx")}))  # the blocked file's series only
        assert value(x, "lustre_client_read_bytes_total", mount="/fsy") == 40960
        assert value(x, "lustre_client_import_state", mount="/fsx", component="osc", state="FULL") == 4
        assert value(x, "lustre_client_source_up", source="debugfs") == 0
    w = os.open(stats, os.O_WRONLY)  # a writer: the blocked open returns ...
    fixed = tmp_path / "stats.new"
    fixed.write_text(llite_stats((2, 12)))
    os.replace(fixed, stats)  # ... and the client answers again: the file is read on a later scrape
    os.close(w)
    deadline = time.monotonic() + START_HANG_GUARD_S
    while True:
        x = samples(scrape(r))
        if value(x, "lustre_client_source_up", source="debugfs") == 1 or time.monotonic() > deadline:
            break
    assert value(x, "lustre_client_source_up", source="debugfs") == 1


def test_damaged_files_are_counted_not_fatal(tmp_path):
    tree = LustreTree(tmp_path, version="2.12.9", filesystems=[FsSpec("fs1", "/fsx")]).build()
    fs = tree.filesystems[0]
    tree.write(tree.debug / "llite" / fs.instance / "stats",
               llite_stats((2, 12)) + "garbage line\nclose 3 samples\n")
    dev = "fs1-OST0000-osc-ffff8d1e4c6b9000"
    # Per-target files are read for the exported fields only: a damaged line of one of those
    # counts (timeouts, req_waittime), junk elsewhere in the file does not.
    damaged = import_file(dev, state="WEIRD", timeouts=7).replace("timeouts: 7", "timeouts: oops")
    tree.write(tree.proc / "osc" / dev / "import", damaged + "\x00\x01\n")
    stats = tree.debug / "osc" / dev / "stats"
    text = stats.read_text()
    assert "req_waittime              100 samples [usec] 100 900 50000 1\n" in text
    tree.write(stats, text.replace(" 100 900 50000 1\n", " 100 900\n") + "not a counter\n")
    tree.write(tree.sys / "osc" / dev / "max_rpcs_in_flight", "lots\n")
    tree.write(tree.sys / "health_check", "device fs1-MDT0000-mdc-x reported unhealthy\nLBUG\n")
    _, r = make(tree)
    s = samples(scrape(r))
    s = samples(scrape(r))
    assert value(s, "gpu_health_exporter_collector_success", collector="lustre") == 1
    assert value(s, "lustre_client_malformed_lines_total", file="llite_stats") == 4  # 2 per scrape
    assert value(s, "lustre_client_malformed_lines_total", file="import") == 2
    assert value(s, "lustre_client_malformed_lines_total", file="osc_stats") == 2
    assert value(s, "lustre_client_rpc_timeouts_total", component="osc") == 0  # the good OSTs' 0s
    assert value(s, "lustre_client_rpcs_total", component="osc") == 3 * 100  # the other OSTs'
    assert value(s, "lustre_client_malformed_lines_total", file="max_rpcs_in_flight") == 2
    assert value(s, "lustre_client_read_bytes_total", mount="/fsx") == 40960
    assert value(s, "lustre_client_import_state", component="osc", state="UNKNOWN") == 1
    assert value(s, "lustre_client_import_state", component="osc", state="FULL") == 3
    assert value(s, "lustre_client_health_status", status="lbug") == 1
    assert value(s, "lustre_client_health_status", status="healthy") == 0


def test_one_broken_mount_does_not_hide_the_other(tmp_path):
    a, b = FsSpec("fs-a", "/a", inst_id="ffff0001"), FsSpec("fs-b", "/b", inst_id="ffff0002")
    tree = LustreTree(tmp_path, filesystems=[a, b]).build()
    c, r = make(tree)
    real = c.tree.reader

    def reader(path):
        if "fs-a-OST0002" in str(path):
            raise RuntimeError("driver bug")
        return real(path)

    c.tree.reader = reader
    s = samples(scrape(r))
    assert value(s, "gpu_health_exporter_collector_success", collector="lustre") == 1
    assert value(s, "lustre_client_read_bytes_total", mount="/b") == 40960
    assert not series({k: v for k, v in s.items() if ("mount", "/a") in k[1]}, "lustre_client_rpcs_total")
    assert value(s, "lustre_client_info", mount="/a") == 1
    assert value(s, "lustre_client_filesystem_size_bytes", mount="/a") == TiB


def test_node_without_lustre(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/mounts").write_text("proc /proc proc rw 0 0\n")
    tree = LustreTree(tmp_path)
    _, r = make(tree)
    s = samples(scrape(r))
    assert value(s, "lustre_client_mounts") == 0
    assert not series(s, "lustre_client_source_up")  # no blind-spot alert on nodes without Lustre
    assert value(s, "gpu_health_exporter_collector_success", collector="lustre") == 1


def test_client_loaded_but_nothing_mounted(tmp_path):
    tree = LustreTree(tmp_path, debugfs=False).build()
    tree.write(tree.sys / "health_check", "LBUG\n")
    _, r = make(tree)
    s = samples(scrape(r))
    assert value(s, "lustre_client_mounts") == 0
    assert value(s, "lustre_client_health_status", status="lbug") == 1
    assert not series(s, "lustre_client_source_up")


def test_unreadable_mounts_file_fails_the_collector(tmp_path):
    _, r = make(LustreTree(tmp_path))
    s = samples(scrape(r))
    assert value(s, "gpu_health_exporter_collector_success", collector="lustre") == 0


def test_fallbacks_state_file_and_instance_from_device_names(tmp_path):
    """No llite directory in any tree: the instance comes from the osc/mdc names. An import file
    that cannot be read: the state file's current_state still gives the import state."""
    tree = LustreTree(tmp_path, filesystems=[FsSpec("fs1", "/fsx", osts=2)]).build()
    shutil.rmtree(tree.debug / "llite")
    shutil.rmtree(tree.sys / "llite")
    dev = "fs1-OST0001-osc-ffff8d1e4c6b9000"
    (tree.proc / "osc" / dev / "import").unlink()
    tree.write(tree.proc / "osc" / dev / "state", state_file([(1700000000, "DISCONN")], current="DISCONN"))
    _, r = make(tree, per_target=True)
    s = samples(scrape(r))
    assert value(s, "lustre_client_info", mount="/fsx", llite="fs1-ffff8d1e4c6b9000") == 1
    assert value(s, "lustre_client_import_state", target="OST0001", state="DISCONN") == 1
    assert value(s, "lustre_client_import_state", target="OST0000", state="FULL") == 1
    assert not [ls for ls in series(s, "lustre_client_rpc_timeouts_total") if ("target", "OST0001") in ls]
    assert not series(s, "lustre_client_read_bytes_total")  # llite stats are gone with the directory


def test_bind_mount_in_mountinfo_is_exported_once(tmp_path):
    tree = LustreTree(tmp_path, filesystems=[FsSpec("abcdefgh", "/fsx")]).build()
    tree.write(tmp_path / "proc/1/mountinfo",
               "98 22 0:52 / /fsx rw shared:60 - lustre 172.31.12.34@tcp:/abcdefgh rw,flock\n"
               "104 22 0:52 /home /home rw shared:60 - lustre 172.31.12.34@tcp:/abcdefgh rw,flock\n")
    _, r = make(tree)
    s = samples(scrape(r))
    assert value(s, "lustre_client_mounts") == 1
    assert value(s, "lustre_client_info", mount="/fsx", llite="abcdefgh-ffff8d1e4c6b9000") == 1
    assert not [k for k in s if ("mount", "/home") in k[1]]


def test_a_file_is_read_only_in_the_trees_up_to_the_one_that_has_it(tmp_path):
    """Tree.read_many reads the later trees only for files the first ones lack, and still
    prefers the first tree as soon as it has the file again."""
    from exporter.lustre.sources import Tree, read_text

    proc, sys_, dbg = tmp_path / "proc", tmp_path / "sys", tmp_path / "dbg"
    for root, text in ((dbg / "lustre", "from debugfs\n"), (proc / "fs/lustre", "from procfs\n")):
        (root / "osc/dev0").mkdir(parents=True)
        (root / "osc/dev0/stats").write_text(text)
    (sys_ / "fs/lustre").mkdir(parents=True)
    read: list[str] = []

    def reader(path: str) -> str:
        read.append(path)
        return read_text(path)

    # no version: 2.12+ order, debugfs first
    tree = Tree(str(proc), str(sys_), str(dbg), Pool(), 1.0, reader=reader)
    assert tree.read_many([("stats", "osc", "dev0")]) == ["from debugfs\n"]
    assert read == [f"{dbg}/lustre/osc/dev0/stats"]  # procfs's copy is not read
    (dbg / "lustre/osc/dev0/stats").unlink()
    read.clear()
    assert tree.read_many([("stats", "osc", "dev0"), ("import", "osc", "dev0")]) == ["from procfs\n", None]
    assert read == [f"{dbg}/lustre/osc/dev0/stats", f"{proc}/fs/lustre/osc/dev0/import",
                    f"{proc}/fs/lustre/osc/dev0/stats"]
    (dbg / "lustre/osc/dev0/stats").write_text("debugfs again\n")
    read.clear()
    assert tree.read_many([("stats", "osc", "dev0")]) == ["debugfs again\n"]
    assert read == [f"{dbg}/lustre/osc/dev0/stats", f"{proc}/fs/lustre/osc/dev0/stats"]
    read.clear()
    assert tree.read_many([("stats", "osc", "dev0")]) == ["debugfs again\n"]
    assert read == [f"{dbg}/lustre/osc/dev0/stats"]
