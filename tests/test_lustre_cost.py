"""The Lustre collector's per-OST work: the per-target files are read for the exported fields
only (and agree with the full parsers), reads are capped in size, the statvfs probe keeps one
worker per mount (no thread per scrape), and the simulated node's OST count is a parameter."""

import errno
import logging
import os
import threading

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from exporter.catalog import Families
from exporter.collectors.lustre import LustreCollector
from exporter.compose import compose
from exporter.config import load
from exporter.lustre import parsers, sources
from exporter.profiles import PROFILES
from exporter.runner import Runner
from exporter.tools.simulate import lustre as sim_lustre
from tests.helpers import FIXTURES, samples, scrape, test_pool, value, wait_for
from tests.lustre_tree import FakeStatvfs, FsSpec, LustreTree, import_file

DIR = FIXTURES / "lustre"
TiB = 1024**4
OSC_NAMES = ("req_waittime", "read_bytes", "write_bytes")


def full_import(text):
    i = parsers.parse_import(text)
    return i.state, i.connection_attempts, i.inflight, i.timeouts


def full_stats(text):
    counters = parsers.parse_stats(text).counters
    return {n: (c.count, c.unit, c.sum) for n, c in counters.items() if n in OSC_NAMES}


@pytest.mark.parametrize("name", ["osc-import-2.10.1.txt", "synth-osc-import-2.15-idle.txt",
                                  "synth-mdc-import-evicted.txt"])
def test_import_fields_agree_with_parse_import_on_the_fixtures(name):
    text = (DIR / name).read_text()
    assert parsers.import_fields(text)[:4] == full_import(text)
    assert parsers.import_fields(text.rstrip("\n"))[:4] == full_import(text)
    assert parsers.import_fields(text)[4] == 0


@pytest.mark.parametrize("name", ["synth-osc-stats-2.15.txt", "mdc-stats-2.10.1.txt",
                                  "llite-stats-2.10.1.txt", "lctl-llite-stats-usec-2.13-2.14-style.txt"])
def test_stats_fields_agree_with_parse_stats_on_the_fixtures(name):
    text = (DIR / name).read_text()
    assert parsers.stats_fields(text, OSC_NAMES) == (full_stats(text), 0)


# An import file in the kernel's layout, then mutated: lines moved, re-indented, duplicated,
# values damaged, junk added. Whatever the fast path takes must be what parse_import reads.
_value = st.one_of(st.integers(0, 10**22).map(str), st.sampled_from(["", "oops", "-3", "12 sec", " 7 "]))
_indent = st.sampled_from(["", " ", "  ", "    ", "       ", "\t", "        "])
_junk = st.sampled_from(["???", "- [ 1, FULL ]", "\x00\x01", "state: IDLE", "   inflight: 99", "rpcs:",
                         "connection:", "x:", "", "  ", "a\rb: 1", "timeouts:"])


def _kernel_import(state, attempts, inflight, timeouts):
    return import_file("fs-OST0001-osc-ffff", state=state, attempts=attempts, inflight=inflight,
                       timeouts=timeouts)


@settings(max_examples=300)
@given(st.sampled_from(["FULL", "IDLE", "DISCONN", "EVICTED"]), _value, _value, _value,
       st.lists(st.tuples(st.integers(0, 20), st.one_of(_junk, st.tuples(_indent, _junk).map("".join))),
                max_size=3),
       st.lists(st.tuples(st.integers(0, 20), _indent), max_size=2))
@example("FULL", "1", "8", "0", [], [])
@example("FULL", "1", "8", "0", [(12, "   inflight: 99")], [])
@example("FULL", "1", "8", "0", [(8, "    rpcs:")], [])
def test_import_fields_agree_with_parse_import(state, attempts, inflight, timeouts, inserts, reindents):
    lines = _kernel_import(state, 0, 0, 0).splitlines()
    lines = [ln.replace("connection_attempts: 0", f"connection_attempts: {attempts}")
             .replace("inflight: 0", f"inflight: {inflight}").replace("timeouts: 0", f"timeouts: {timeouts}")
             for ln in lines]
    for at, indent in reindents:
        k = min(at, len(lines) - 1)
        lines[k] = indent + lines[k].lstrip()
    for at, junk in inserts:
        lines.insert(min(at, len(lines)), junk)
    text = "\n".join(lines) + "\n"
    got = parsers.import_fields(text)
    assert got[:4] == full_import(text)
    flat, _ = parsers._import_flat(text)
    raw = [flat.get(k) for k in ("connection.connection_attempts", "rpcs.inflight", "rpcs.timeouts")]
    assert got[4] == sum(1 for r, v in zip(raw, got[1:4], strict=True) if r is not None and v is None)


_stat_value = st.one_of(st.integers(0, 10**25).map(str), st.sampled_from(["-5", "x", "1.5", ""]))


@settings(max_examples=300)
@given(st.sampled_from(OSC_NAMES + ("req_active", "ost_read")), _stat_value, _stat_value,
       st.sampled_from(["usec", "usecs", "bytes", "reqs", "us ec", ""]), st.sampled_from(["", " ", "\t"]),
       st.sampled_from([" ", "  ", "\t", "                "]), st.booleans(), st.booleans())
@example("req_waittime", "100", "5000", "usec", "", "              ", True, False)
def test_stats_fields_agree_with_parse_stats_for_one_line(name, count, total, unit, lead, gap, sums, sumsq):
    line = f"{lead}{name}{gap}{count} samples [{unit}]" + (f" 1 2 {total}" if sums else "") + \
        (" 9" if sums and sumsq else "")
    text = "snapshot_time 1.0 secs.nsecs\n" + line + "\nreq_active 3 samples [reqs] 1 1 3 3\n"
    got, bad = parsers.stats_fields(text, OSC_NAMES)
    full = parsers.parse_stats(text)
    assert got == full_stats(text)
    assert bad == (1 if name in OSC_NAMES and name not in full.counters else 0)


def test_a_file_over_the_size_cap_is_refused_with_bounded_reads(tmp_path):
    big = tmp_path / "stats"
    big.write_text("x" * 5000)
    with pytest.raises(OSError) as e:
        sources.read_text(str(big), max_bytes=4096)
    assert e.value.errno == errno.EFBIG and str(big) in str(e.value)
    assert sources.read_text(str(big), max_bytes=5000) == "x" * 5000
    with pytest.raises(OSError) as e:  # an endless file: stops after max_bytes + 1
        sources.read_text("/dev/zero", max_bytes=200_000)
    assert e.value.errno == errno.EFBIG


def test_an_oversized_import_costs_only_its_series_and_is_logged(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger="exporter.lustre")
    tree = LustreTree(tmp_path, filesystems=[FsSpec("fs1", "/fsx")]).build()
    dev = "fs1-OST0001-osc-ffff8d1e4c6b9000"
    huge = import_file(dev) + "    padding: " + "y" * (sources.MAX_FILE_BYTES + 10) + "\n"
    tree.write(tree.proc / "osc" / dev / "import", huge)
    overrides = {**tree.overrides(), "lustre.lfs_command": "", "lustre.use_ioctl": False}
    c = LustreCollector(compose(load(None, overrides), statvfs=FakeStatvfs({"/fsx": TiB})))
    s = samples(scrape(Runner([c], deadline_s=5, pool=test_pool())))
    assert value(s, "gpu_health_exporter_collector_success", collector="lustre") == 1
    assert value(s, "lustre_client_rpcs_in_flight", component="osc") == 3 * 2  # the other 3 OSTs
    assert value(s, "lustre_client_source_up", source="procfs") == 0
    msgs = [r.getMessage() for r in caplog.records]
    assert any(f"{dev}/import" in m and "larger than 1048576 bytes" in m for m in msgs), msgs


def test_statvfs_comes_from_the_context_and_no_thread_is_made_per_scrape(tmp_path):
    tree = LustreTree(tmp_path, filesystems=[FsSpec("fs1", "/fsx"), FsSpec("fs2", "/fsy", "ffff02")]).build()
    overrides = {**tree.overrides(), "lustre.lfs_command": "", "lustre.use_ioctl": False}
    statvfs = FakeStatvfs({"/fsx": TiB, "/fsy": 2 * TiB})
    ctx = compose(load(None, overrides), statvfs=statvfs)
    c = LustreCollector(ctx)
    c.collect(Families())
    made = []
    real_start = threading.Thread.start

    def start(self):
        made.append(self.name)
        real_start(self)

    threading.Thread.start = start
    try:
        for _ in range(10):
            out = Families()
            c.collect(out)
    finally:
        threading.Thread.start = real_start
    # The probes run on the context's pool: a busy host may make it grow a thread while a probe
    # is still in flight, never beyond its size, and no other thread is made, whatever the scrapes.
    assert all(name.startswith(f"{ctx.pool.name}-") for name in made), made
    assert ctx.pool.started <= ctx.pool.size and ctx.pool.written_off == 0
    assert statvfs.calls == 22
    s = samples(scrape(Runner([c], deadline_s=5, pool=test_pool())))
    assert value(s, "lustre_client_filesystem_size_bytes", mount="/fsy") == 2 * TiB


def test_a_hung_mount_is_not_probed_again_until_its_call_returns_and_the_others_are_served(tmp_path):
    tree = LustreTree(tmp_path, filesystems=[FsSpec("fs1", "/fsx"), FsSpec("fs2", "/fsy", "ffff02")]).build()
    overrides = {**tree.overrides(), "lustre.lfs_command": "", "lustre.use_ioctl": False,
                 "lustre.probe_timeout_seconds": 0.2}
    release = threading.Event()
    calls: list[str] = []

    def statvfs(path):
        calls.append(path)
        if path.endswith("/fsx"):
            release.wait(10)
        return FakeStatvfs({"/fsx": TiB, "/fsy": 2 * TiB})(path)

    c = LustreCollector(compose(load(None, overrides), statvfs=statvfs))
    try:
        for _ in range(3):
            s = samples(scrape(Runner([c], deadline_s=5, pool=test_pool())))
            assert value(s, "lustre_client_filesystem_size_bytes", mount="/fsy") == 2 * TiB
            assert value(s, "lustre_client_statfs_success", mount="/fsx") == 0
        assert sum(p.endswith("/fsx") for p in calls) == 1  # the stuck call is not started again
        assert c.ctx.pool.written_off == 1
    finally:
        release.set()
    wait_for(lambda: not c.probe.stuck())
    s = samples(scrape(Runner([c], deadline_s=5, pool=test_pool())))
    assert value(s, "lustre_client_filesystem_size_bytes", mount="/fsx") == TiB


@pytest.mark.parametrize("osts", [1, 40, 300])
def test_simulated_ost_count(tmp_path, osts):
    for d in ("proc", "sys/kernel/debug"):
        (tmp_path / d).mkdir(parents=True)
    sim_lustre.LustreSim(tmp_path, PROFILES["p5.48xlarge"], set(), osts=osts).build()
    cfg = load(None, {"paths.procfs": str(tmp_path / "proc"), "paths.sysfs": str(tmp_path / "sys"),
                      "paths.debugfs": str(tmp_path / "sys/kernel/debug"), "lustre.lfs_command": "",
                      "lustre.use_ioctl": False})
    c = LustreCollector(compose(cfg, statvfs=sim_lustre.fake_statvfs(tmp_path)))
    s = samples(scrape(Runner([c], deadline_s=10, pool=test_pool())))
    assert value(s, "lustre_client_targets", component="osc") == osts
    states = [value(s, "lustre_client_import_state", component="osc", state=st) for st in ("FULL", "IDLE")]
    assert sum(states) == osts
    assert value(s, "lustre_client_filesystem_size_bytes") == sim_lustre.CAPACITY_BYTES


def test_simulated_ost_count_is_checked(tmp_path):
    with pytest.raises(ValueError, match="OST count 0"):
        sim_lustre.LustreSim(tmp_path, PROFILES["p5.48xlarge"], set(), osts=0)


def test_max_rpcs_in_flight_is_read_again_after_the_refresh_interval(tmp_path, monkeypatch):
    from exporter.collectors import lustre as lustre_collector

    tree = LustreTree(tmp_path, filesystems=[FsSpec("fs1", "/fsx", osts=2)]).build()
    overrides = {**tree.overrides(), "lustre.lfs_command": "", "lustre.use_ioctl": False}
    c = LustreCollector(compose(load(None, overrides), statvfs=FakeStatvfs({"/fsx": TiB})))
    r = Runner([c], deadline_s=5, pool=test_pool())
    assert value(samples(scrape(r)), "lustre_client_max_rpcs_in_flight", component="osc") == 16
    tree.write(tree.sys / "osc" / "fs1-OST0000-osc-ffff8d1e4c6b9000" / "max_rpcs_in_flight", "64\n")
    assert value(samples(scrape(r)), "lustre_client_max_rpcs_in_flight", component="osc") == 16  # kept
    monkeypatch.setattr(lustre_collector, "TUNABLE_REFRESH_S", 0.0)
    assert value(samples(scrape(r)), "lustre_client_max_rpcs_in_flight", component="osc") == 64 + 8
    # a read that finds a file missing is not kept: the files are read again on the next scrape
    path = tree.sys / "osc" / "fs1-OST0001-osc-ffff8d1e4c6b9000" / "max_rpcs_in_flight"
    path.unlink()
    assert value(samples(scrape(r)), "lustre_client_max_rpcs_in_flight", component="osc") == 64
    monkeypatch.setattr(lustre_collector, "TUNABLE_REFRESH_S", 3600.0)
    tree.write(path, "32\n")
    assert value(samples(scrape(r)), "lustre_client_max_rpcs_in_flight", component="osc") == 64 + 32


def test_mounts_files_have_a_larger_cap(tmp_path):
    mounts = tmp_path / "mountinfo"
    line = "36 25 0:52 / /data rw - ext4 /dev/sda1 rw\n"
    mounts.write_text(line * (sources.MAX_FILE_BYTES // len(line) + 10))  # past 1 MiB: a big k8s node
    assert sources.read_text(str(mounts)).count("\n") > sources.MAX_FILE_BYTES // len(line)
    other = tmp_path / "import"
    other.write_text("x" * (sources.MAX_FILE_BYTES + 1))
    with pytest.raises(OSError):
        sources.read_text(str(other))


# -- descriptors kept open between scrapes (sources.KeptFiles) --------------------------------------

def _opens(monkeypatch):
    """Paths os.open is asked for, from now on."""
    opened: list[str] = []
    real = os.open

    def counting(path, *a, **kw):
        opened.append(str(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(os, "open", counting)
    return opened


def test_per_target_files_are_opened_once_and_read_again_through_their_descriptors(tmp_path, monkeypatch):
    tree = LustreTree(tmp_path, filesystems=[FsSpec("fs1", "/fsx", osts=4)]).build()
    overrides = {**tree.overrides(), "lustre.lfs_command": "", "lustre.use_ioctl": False}
    c = LustreCollector(compose(load(None, overrides), statvfs=FakeStatvfs({"/fsx": TiB})))
    r = Runner([c], deadline_s=5, pool=test_pool())
    first = samples(scrape(r))
    opened = _opens(monkeypatch)
    dev = tree.proc / "osc" / "fs1-OST0002-osc-ffff8d1e4c6b9000"
    old = parsers.import_fields((dev / "import").read_text())[2]
    tree.write(dev / "import", import_file(dev.name, inflight=old + 4))
    again = samples(scrape(r))
    assert not [p for p in opened if p.endswith(("/stats", "/import", "/state"))], opened
    assert value(again, "lustre_client_rpcs_in_flight", component="osc") == \
        value(first, "lustre_client_rpcs_in_flight", component="osc") + 4  # the new text, not a stale one
    c.close()
    assert len(c.files) == 0


def test_a_kept_file_replaced_by_rename_or_removed_reads_as_by_path(tmp_path):
    path = tmp_path / "state"
    path.write_text("current_state: FULL\n")
    kept = sources.KeptFiles()
    assert kept(str(path)) == "current_state: FULL\n" and len(kept) == 1
    tmp = tmp_path / "state.tmp"
    tmp.write_text("current_state: EVICTED\n")
    os.replace(tmp, path)  # as the simulation writes: the old descriptor still reads the old file
    assert kept(str(path)) == "current_state: EVICTED\n"
    path.write_text("current_state: IDLE\n")  # rewritten in place
    assert kept(str(path)) == "current_state: IDLE\n"
    path.unlink()
    with pytest.raises(FileNotFoundError):
        kept(str(path))
    assert len(kept) == 0


def test_a_kernel_file_is_printed_again_on_each_read_through_its_kept_descriptor():
    kept = sources.KeptFiles()
    first = kept("/proc/uptime")  # a seq_file: st_size 0, so not checked with fstat
    assert len(kept) == 1 and kept._files["/proc/uptime"][1] is False
    waited = threading.Event()
    for _ in range(200):  # until the uptime moves on (no fixed sleep)
        if sources.read_text("/proc/uptime") != first:
            break
        waited.wait(0.01)
    second = kept("/proc/uptime")
    assert second != first and float(second.split()[0]) > float(first.split()[0])
    kept.forget()


def test_unread_descriptors_are_closed_and_the_process_wide_cap_holds(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("1\n")
    b.write_text("2\n")
    kept = sources.KeptFiles()
    kept(str(a))
    kept(str(b))
    kept.sweep()
    assert len(kept) == 2
    kept(str(a))
    kept.sweep()  # b was not read since the last sweep
    assert list(kept._files) == [str(a)]
    kept.forget()
    monkeypatch.setattr(sources.KeptFiles, "max_open", sources.KeptFiles._kept_total)
    assert kept(str(a)) == "1\n" and len(kept) == 0  # read by path


def test_a_file_without_pread_is_read_by_path():
    r, w = os.pipe()  # pread on a pipe fails with ESPIPE, as on a file opened non-seekable
    try:
        os.write(w, b"healthy\n")
        os.close(w)
        kept = sources.KeptFiles()
        assert kept(f"/proc/self/fd/{r}") == "healthy\n" and len(kept) == 0
    finally:
        os.close(r)
