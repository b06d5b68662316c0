"""Lustre parsers on every fixture in tests/fixtures/lustre (public files verbatim, and
synthesised files for the variants no public file covers; see its SOURCES.md)."""

from pathlib import Path

import pytest

from exporter.lustre import discovery, parsers
from exporter.lustre.parsers import Counter
from tests.helpers import FIXTURES

DIR = FIXTURES / "lustre"


def text(name: str) -> str:
    return (DIR / name).read_text()


def test_every_fixture_is_exercised():
    """A fixture added without a test here fails this test."""
    used = set(Path(__file__).read_text().split('"'))
    missing = [p.name for p in DIR.glob("*.txt") if p.name not in used]
    assert not missing


# -- stats ----------------------------------------------------------------------------------

def test_llite_stats_2_10_regs_and_bytes_without_sumsq():
    s = parsers.parse_stats(text("llite-stats-2.10.1.txt"))
    assert s.malformed == 0 and s.param is None
    assert s.snapshot_time == pytest.approx(1510950459.772792457)
    assert s.start_time is None and s.reset_timestamp() is None
    assert s.get("read_bytes") == Counter("read_bytes", 1, "bytes", 4194304, 4194304, 4194304, None)
    assert s.get("write_bytes").sum == 93813797294080 and s.get("write_bytes").count == 89467810
    assert s.get("open") == Counter("open", 136, "reqs")  # [regs] folded onto reqs
    assert s.get("open").seconds() is None
    assert len(s.counters) == 12
    assert s.get("mkdir") is None  # zero counters are not printed


def test_mdc_stats_2_10_req_waittime_in_usec():
    s = parsers.parse_stats(text("mdc-stats-2.10.1.txt"))
    assert s.malformed == 0 and len(s.counters) == 12
    w = s.get("req_waittime")
    assert (w.count, w.unit, w.min, w.max, w.sum) == (7604, "usecs", 90, 132365, 3103430)
    assert w.sumsq == 34840946126
    assert w.seconds() == pytest.approx(3.10343)
    assert s.get("req_active").unit == "reqs" and s.get("req_active").sum == 8133
    assert s.get("seq_query").sumsq == 14752045764


def test_lctl_form_usec_counters_and_sumsq_beyond_int64():
    s = parsers.parse_stats(text("lctl-llite-stats-usec-2.13-2.14-style.txt"))
    assert s.param == "llite.ai400x2-ffff9440f1003000.stats"
    assert s.malformed == 0 and len(s.counters) == 13
    assert s.get("open").unit == "usecs" and s.get("open").seconds() == pytest.approx(1027.077752)
    assert s.get("ioctl") == Counter("ioctl", 2, "reqs")
    assert s.get("opencount").sumsq == 34531048
    occ = s.get("openclosetime")
    assert occ.sumsq == 11416538743473681487 and occ.sumsq > 2**63


def test_three_line_header_and_usecs_units():
    s = parsers.parse_stats(text("lctl-llite-stats-2.14-ddn-usecs-header.txt"))
    assert s.param == "llite.fs-ffff97e895d31000.stats"
    assert s.start_time == pytest.approx(1715767600.564021089)
    assert s.elapsed_time == pytest.approx(528136.727422941)
    assert s.reset_timestamp() == pytest.approx(1715767600.564021089)
    assert s.get("getattr") == Counter("getattr", 6, "usecs", 408, 449, 2555, 1088895)


def test_2_15_0_header_is_seconds_since_boot_never_a_timestamp():
    s = parsers.parse_stats(text("synth-llite-stats-2.15.0-boot-header.txt"))
    assert s.malformed == 0
    assert s.snapshot_time == pytest.approx(354817.102938475)
    assert s.start_time == 0.0
    assert s.reset_timestamp() is None
    assert s.get("read").unit == "usecs" and s.get("read").seconds() == pytest.approx(1.503217)
    assert s.get("read_bytes").sumsq == 549755813888000


def test_2_16_usecs_secs_and_huge_sumsq():
    s = parsers.parse_stats(text("synth-llite-stats-2.16-usecs.txt"))
    assert s.malformed == 0 and s.param == "llite.scratch-fs-ffff8d1e4c6b9000.stats"
    assert s.get("fsync").seconds() == pytest.approx(0.25)
    occ = s.get("openclosetime")
    assert occ.unit == "secs" and occ.seconds() == 1200000.0
    assert occ.sumsq == 40000000000
    big = s.get("mkdir").sumsq  # u64 (%llu): above 2^63, never above 2^64 - 1
    assert big == 9500000000000000000 and 2**63 < big < 2**64
    assert s.reset_timestamp() == pytest.approx(1763625600.0)


def test_malformed_lines_are_skipped_and_counted():
    s = parsers.parse_stats(text("synth-llite-stats-malformed.txt"))
    assert s.malformed == 3
    assert set(s.counters) == {"read_bytes", "open", "getattr"}
    assert s.get("getattr").count == 12


def test_osc_stats_2_15():
    s = parsers.parse_stats(text("synth-osc-stats-2.15.txt"))
    assert s.malformed == 0
    assert s.get("req_waittime").seconds() == pytest.approx(7.300021)
    assert s.get("write_bytes").sum == 5033164800
    assert s.get("ldlm_extent_enqueue").min == 1


def test_stats_garbage_and_empty():
    assert parsers.parse_stats("").counters == {}
    s = parsers.parse_stats("\x00\x01garbage\nopen 3 samples [regs]\nread_bytes -1 samples [bytes]\n")
    assert s.malformed == 2 and s.get("open").count == 3


# -- import / state -------------------------------------------------------------------------

def test_import_2_10():
    i = parsers.parse_import(text("osc-import-2.10.1.txt"))
    assert i.malformed == 0
    assert i.name == "lustrefs-OST0000-osc-ffff88105db50000"
    assert i.target == "lustrefs-OST0000_UUID"
    assert i.state == "FULL"
    assert i.current_connection == "172.20.20.5@o2ib"
    assert (i.connection_attempts, i.inflight, i.timeouts, i.avg_waittime_usecs) == (1, 8, 0, 6054)
    assert i.idle_seconds is None  # 2.12+ only


def test_import_idle_2_15():
    i = parsers.parse_import(text("synth-osc-import-2.15-idle.txt"))
    assert i.malformed == 0
    assert i.state == "IDLE" and i.idle_seconds == 27 and i.timeouts == 2 and i.inflight == 0
    assert i.connection_attempts == 14 and i.avg_waittime_usecs == 812


def test_import_evicted():
    i = parsers.parse_import(text("synth-mdc-import-evicted.txt"))
    assert i.state == "EVICTED" and i.timeouts == 17 and i.avg_waittime_usecs == 40211


def test_import_is_not_yaml_and_damage_is_counted():
    damaged = ("import:\n    name: x-OST0000-osc-ffff\n    state: FULL\n    connect_flags: [ a, b\n"
               "    ???\n    rpcs:\n       inflight: 3\n       timeouts: oops\n")
    i = parsers.parse_import(damaged)
    assert i.state == "FULL" and i.inflight == 3 and i.timeouts is None
    assert i.malformed == 1
    # The same key in another section does not leak (connection.generation vs rpcs.*).
    assert parsers.parse_import("import:\n  connection:\n    inflight: 9\n").inflight is None


def test_state_2_10():
    h = parsers.parse_state(text("osc-state-2.10.1.txt"))
    assert h.current == "FULL" and h.malformed == 0
    assert h.history == [(1510766261, "CONNECTING"), (1510766261, "FULL")]


def test_state_ring_with_evictions():
    h = parsers.parse_state(text("synth-osc-state-evicted-ring.txt"))
    assert len(h.history) == 16 and h.malformed == 0
    assert [ts for ts, s in h.history if s == "EVICTED"] == [1763701001, 1763705003]
    assert h.current == "FULL"
    assert parsers.parse_state("current_state: FULL\nstate_history:\n - [ x, FULL ]\n").malformed == 1


# -- health, version, tunables --------------------------------------------------------------

@pytest.mark.parametrize("name,status", [
    ("synth-health_check-healthy.txt", "healthy"),
    ("synth-health_check-not-healthy.txt", "not_healthy"),
    ("synth-health_check-lbug.txt", "lbug"),
    ("synth-health_check-debugfs-2.15-unhealthy.txt", "not_healthy"),
])
def test_health_check(name, status):
    assert parsers.parse_health_check(text(name)) == status


def test_health_check_unknown_text():
    assert parsers.parse_health_check("") is None
    assert parsers.parse_health_check("maybe\n") is None


def test_version():
    assert parsers.parse_version(text("synth-version-2.15.txt")) == "2.15.6"
    assert parsers.parse_version(text("synth-version-procfs-2.10.txt")) == "2.10.1"
    assert parsers.version_tuple("2.15.6") == (2, 15, 6)
    assert parsers.version_tuple("2.14.0_ddn145") == (2, 14, 0)
    assert parsers.version_tuple(None) is None
    assert parsers.parse_version("garbage\n") is None


def test_max_cached_mb():
    c = parsers.parse_max_cached_mb(text("synth-max_cached_mb-2.12.txt"))
    assert (c.max_mb, c.used_mb, c.malformed) == (96000, 1234, 0)
    c = parsers.parse_max_cached_mb(text("synth-max_cached_mb-2.15.txt"))
    assert (c.max_mb, c.used_mb, c.malformed) == (128000, 64000, 0)
    assert parsers.parse_max_cached_mb("4096\n").max_mb == 4096
    assert parsers.parse_max_cached_mb("max_cached_mb: lots\nused_mb: 3\n").malformed == 1


def test_max_rpcs_in_flight():
    assert parsers.parse_int("32\n") == 32
    assert parsers.parse_int("x\n") is None


# -- mounts and names -----------------------------------------------------------------------

def test_mounts():
    mounts, bad = discovery.parse_mounts(text("synth-mounts.txt"))
    assert bad == 1
    got = [(m.fsname, m.mountpoint, m.network, m.subdir) for m in mounts]
    assert got == [
        ("abcdefgh", "/fsx", "tcp", ""),
        ("scratch-fs", "/scratch", "efa", ""),
        ("scratch-fs", "/mnt/team a", "efa", "team a"),
        ("lustre", "/lus", "o2ib", ""),
    ]


def test_mountinfo_folds_bind_mounts():
    mounts, bad = discovery.parse_mountinfo(text("synth-mountinfo.txt"))
    assert bad == 1
    assert [(m.mountpoint, m.device, m.root) for m in mounts] == [
        ("/fsx", "0:52", "/"), ("/home", "0:52", "/home"),
        ("/scratch", "0:60", "/"), ("/scratch2", "0:61", "/")]
    assert mounts[0].fsname == "abcdefgh" and mounts[2].network == "efa"
    # /home is a bind mount of /fsx/home: one client instance, exported once (as /fsx).
    assert [m.mountpoint for m in discovery.distinct_mounts(mounts)] == ["/fsx", "/scratch", "/scratch2"]


def test_stacked_mounts_keep_the_visible_one():
    mounts, _ = discovery.parse_mounts("a@tcp:/fs /fsx lustre rw 0 0\nb@tcp:/fs /fsx lustre rw 0 0\n")
    assert [m.source for m in discovery.distinct_mounts(mounts)] == ["b@tcp:/fs"]


def test_instance_and_device_names_split_on_the_last_dash():
    assert discovery.split_instance("scratch-fs-ffff8d1e4c6b9000") == ("scratch-fs", "ffff8d1e4c6b9000")
    assert discovery.split_instance("nodash") is None
    d = discovery.parse_device("scratch-fs-OST001f-osc-ffff8d1e4c6b9000")
    assert (d.fsname, d.target, d.component, d.instance_id) == ("scratch-fs", "OST001F", "osc",
                                                                "ffff8d1e4c6b9000")
    assert discovery.parse_device("my-fs-MDT0000-mdc-ffff01").component == "mdc"
    assert discovery.parse_device("abcdefgh-clilov-ffff01") is None
    assert discovery.instance_from_mdname("scratch-fs-clilmv-ffff8d1e4c6b9000\x00\x00") == \
        "scratch-fs-ffff8d1e4c6b9000"
    assert discovery.instance_from_mdname("garbage") is None


def test_map_by_fsname_only_when_unique():
    mounts, _ = discovery.parse_mounts(text("synth-mounts.txt"))
    got = discovery.map_by_fsname(mounts, ["abcdefgh-ffff01", "scratch-fs-ffff02", "scratch-fs-ffff03"])
    assert got == {"/fsx": "abcdefgh-ffff01"}  # scratch-fs is mounted twice: ambiguous


def test_ioctl_on_a_non_lustre_directory_fails_cleanly(tmp_path):
    assert discovery.ioctl_getmdname(str(tmp_path)) is None
    assert discovery.ioctl_getmdname(str(tmp_path / "absent")) is None


def test_lfs_getname_from_a_stub(tmp_path):
    lfs = tmp_path / "lfs"
    lfs.write_text("#!/bin/sh\necho \"scratch-fs-ffff8d1e4c6b9000 $2\"\n")
    lfs.chmod(0o755)
    assert discovery.lfs_getname(str(lfs), "/scratch", 5) == "scratch-fs-ffff8d1e4c6b9000"
    assert discovery.lfs_getname(str(tmp_path / "no-lfs"), "/scratch", 5) is None
