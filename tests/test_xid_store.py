"""One count per event (window rule, any source order), bounded memory, the state file."""

import json
import os

from exporter.state.file import StateFile
from exporter.xid.identities import GpuIdentities
from exporter.xid.persistence import STATE_DOC
from exporter.xid.store import (
    ACKS_DOC,
    MAX_UNKNOWN_GPUS,
    OTHER,
    SECTION_KEYS,
    XID_DOC,
    XID_EVENTS,
    Ack,
    AcksFile,
    EventStore,
)

PCI = "00000000:53:00"


def state_file(state_dir, boot_id: str, kmsg: str = "") -> StateFile:
    """The daemon's state file, `xid-state.json`, as exporter.xid.persistence opens it."""
    return StateFile(str(state_dir), boot_id, kmsg, doc=STATE_DOC)


def dump(s: EventStore, last_seq: int | None = None) -> dict:
    """The state document's XID section as the daemon writes it (persistence's snapshot; its
    `sxid` and `workload` sections are optional, and these tests hold no SXids nor workloads)."""
    return XID_DOC.dump(s, GpuIdentities(None), last_seq)


def test_nvml_and_kmsg_for_one_xid_count_once_in_either_order():
    for order in (("nvml", 100.0, "kmsg", 100.4), ("kmsg", 100.4, "nvml", 100.9)):
        s = EventStore(XID_EVENTS, window_s=10)
        assert s.report(order[0], PCI, 31, order[1], 0.0) is True
        assert s.report(order[2], PCI, 31, order[3], 0.0) is False
        assert s.counts[PCI]["31"].count == 1
        assert s.merged == {order[2]: 1}


def test_backlog_line_older_than_the_nvml_event_still_matches():
    s = EventStore(XID_EVENTS, window_s=10)
    s.report("nvml", PCI, 79, 200.0, 0.0)
    assert s.report("kmsg", PCI, 79, 197.0, 0.0) is False  # read later, logged earlier
    assert s.counts[PCI]["79"].count == 1


def test_separate_events_beyond_the_window_and_other_gpus_or_xids_count():
    s = EventStore(XID_EVENTS, window_s=10)
    assert s.report("kmsg", PCI, 31, 0.0, 0.0)
    assert s.report("kmsg", PCI, 31, 10.5, 0.0)  # a new event
    assert s.report("kmsg", PCI, 43, 10.6, 0.0)  # other XID
    assert s.report("kmsg", "00000000:64:00", 31, 10.7, 0.0)  # other GPU
    assert s.counts[PCI]["31"].count == 2


def test_flood_of_200k_lines_is_one_event_with_bounded_state():
    s = EventStore(XID_EVENTS, window_s=10)
    for i in range(200_000):
        s.report("kmsg", PCI, 13, 50.0 + i * 1e-6, 0.0)
    assert s.counts[PCI]["13"].count == 1
    assert s.reports["kmsg"] == 200_000 and s.merged["kmsg"] == 199_999
    assert sum(len(q) for q in s.open.values()) == 1
    s.prune(1000.0)
    assert not s.open


def test_xid_154_counts_keep_the_action_code():
    s = EventStore(XID_EVENTS)
    s.report("kmsg", PCI, 154, 1.0, 0.0, qualifier=2)
    assert set(s.counts[PCI]) == {"154/2"}


def test_acks_subtract_a_baseline_and_counters_stay():
    s = EventStore(XID_EVENTS, window_s=1)
    s.report("kmsg", PCI, 63, 1.0, 0.0)
    s.report("kmsg", PCI, 31, 1.0, 0.0)
    s.add_ack(Ack(PCI, 0, "", 63, 5.0, {"63": 1}))
    assert set(s.unacked(PCI)) == {"31"}
    s.report("kmsg", PCI, 63, 9.0, 0.0)  # happens again after the ack
    assert set(s.unacked(PCI)) == {"31", "63"} and s.counts[PCI]["63"].count == 2


def test_state_roundtrip_is_atomic_and_keyed_by_boot(tmp_path):
    s = EventStore(XID_EVENTS)
    s.report("kmsg", PCI, 63, 1.0, 1700000000.0)
    sf = state_file(tmp_path / "state", "boot-a", "/dev/kmsg")
    assert sf.write(dump(s, 42))
    assert not [p for p in (tmp_path / "state").iterdir() if p.name.endswith(".tmp")]
    data = state_file(tmp_path / "state", "boot-a", "/dev/kmsg").read()
    assert data["last_seq"] == 42 and data["counts"][PCI]["63"][0] == 1
    assert state_file(tmp_path / "state", "boot-b", "/dev/kmsg").read() is None  # new boot
    other = state_file(tmp_path / "state", "boot-a", "/tmp/replayed.log")
    assert other.read() is None and other.status.problem == "other_source"


def test_corrupt_and_unwritable_state_are_reported_not_raised(tmp_path, caplog):
    d = tmp_path / "state"
    d.mkdir()
    (d / "xid-state.json").write_text('{"version": 1, "boot_id": "b", "counts": {"x": {"31": "nope"}}')
    sf = state_file(d, "b")
    assert sf.read() is None
    assert (sf.status.ok, sf.status.problem, sf.status.read_errors) == (False, "corrupt", 1)
    assert len(list(d.glob("xid-state.json.corrupt-*"))) == 1  # set aside for a human
    bad_key = {"version": 1, "boot_id": "b", "counts": {PCI: {"x": [1, 0, 0]}}}
    (d / "xid-state.json").write_text(json.dumps(bad_key))
    data = sf.read()  # a bad key is corrupt too: the XID section is dropped, the file set aside
    assert data is not None and not set(SECTION_KEYS) & set(data) and sf.status.read_errors == 2
    assert sf.status.problem == "corrupt" and len(list(d.glob("xid-state.json.corrupt-*"))) == 2
    assert f"section xid: counts[{PCI}]: count key 'x'" in caplog.text
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    bad = state_file(blocked / "sub", "b")
    s = EventStore(XID_EVENTS)
    s.report("kmsg", PCI, 31, 1.0, 0.0)
    assert bad.write(dump(s)) is False
    assert (bad.status.ok, bad.status.problem, bad.status.write_errors) == (False, "unwritable", 1)
    assert s.counts[PCI]["31"].count == 1  # nothing lost in memory


def test_ack_writes_the_acks_file_alone_and_the_daemon_folds_it_in(tmp_path):
    """One writer a file: `ack` never writes the daemon's counts; the daemon takes its acks."""
    d = str(tmp_path)
    daemon = EventStore(XID_EVENTS)
    daemon.report("kmsg", PCI, 63, 1.0, 0.0)
    state = state_file(d, "b")
    assert state.write(dump(daemon))
    written = (tmp_path / "xid-state.json").read_bytes()
    assert AcksFile(d, "b").update(lambda disk: ACKS_DOC.dump([Ack(PCI, 0, "", None, 2.0, {"63": 1})]))
    assert (tmp_path / "xid-state.json").read_bytes() == written  # `ack` left the daemon's file alone
    intake = AcksFile(d, "b")
    assert intake.changed_on_disk()
    assert [a.xid for a in ACKS_DOC.load(intake.read_news(), daemon)] == [None]
    assert not intake.changed_on_disk()
    daemon.report("kmsg", PCI, 31, 30.0, 0.0)
    assert daemon.unacked(PCI).keys() == {"31"}
    assert state.write(dump(daemon))
    on_disk = json.loads((tmp_path / "xid-state.json").read_text())
    assert len(on_disk["acks"]) == 1 and on_disk["counts"][PCI]["63"][0] == 1


def test_an_ack_of_counts_not_held_yet_waits_until_they_are(tmp_path):
    """`ack` read a record the daemon has not reached yet: its ack waits for the count (never a
    count of `ack`'s added to the daemon's, never a baseline above the counts written)."""
    daemon = EventStore(XID_EVENTS)
    assert ACKS_DOC.load({"acks": [Ack(PCI, 0, "", None, 6.0, {"79": 1}).to_json()]}, daemon) == []
    assert daemon.acks == [] and dump(daemon)["acks"] == [] and daemon.take_waiting() == []
    daemon.report("kmsg", PCI, 79, 5.0, 0.0)  # the daemon's follower reaches the record
    assert [a.time for a in daemon.take_waiting()] == [6.0]
    assert daemon.counts[PCI]["79"].count == 1 and daemon.unacked(PCI) == {}
    assert len(dump(daemon)["acks"]) == 1


def test_cardinality_guard_refuses_new_series_beyond_the_caps():
    s = EventStore(XID_EVENTS)
    for x in range(200):
        s.report("kmsg", PCI, 800 + x, float(x), 0.0)  # XIDs outside the catalog
    assert len(s.counts[PCI]) == 128 and s.dropped == 72
    assert s.report("kmsg", PCI, 800, 500.0, 0.0)  # a known series still counts
    s.report("kmsg", PCI, 99999999999999999999999, 600.0, 0.0)  # out of range: never a series
    assert s.dropped == 73 and len(s.counts[PCI]) == 128


def test_unknown_addresses_share_a_bucket_and_never_crowd_out_a_listed_gpu():
    listed = {PCI}
    s = EventStore(XID_EVENTS)
    for i in range(70):  # garbage addresses first: the 64-GPU cap must not be full of them
        s.report("kmsg", f"0000{i:04x}:ee:00", 31, float(i), 0.0)
    unknown = [p for p in s.counts if p not in (PCI, OTHER)]
    assert len(unknown) == MAX_UNKNOWN_GPUS and s.counts[OTHER]["31"].count == 70 - MAX_UNKNOWN_GPUS
    assert s.report("kmsg", PCI, 94, 100.0, 0.0, listed=PCI in listed)  # GPU 0's XID 94 is counted
    assert s.counts[PCI]["94"].count == 1
    # a listed GPU whose per-GPU cap is full of garbage XIDs still gets its catalog XIDs
    for x in range(128):
        s.report("kmsg", PCI, 800 + x, 200.0 + x, 0.0, listed=True)
    assert s.report("kmsg", PCI, 95, 400.0, 0.0, listed=True) and s.counts[PCI]["95"].count == 1
    # after a restart (state file) the same holds
    st = dump(s)
    s2 = EventStore(XID_EVENTS)
    s2.merge(st["counts"], st["open"], listed=lambda pci: pci in listed)
    assert s2.report("kmsg", PCI, 48, 500.0, 0.0, listed=True) and s2.counts[PCI]["48"].count == 1
    s2.report("kmsg", "0000ffff:ee:00", 31, 500.0, 0.0)
    assert s2.counts[OTHER]["31"].count == 70 - MAX_UNKNOWN_GPUS + 1
    assert len([p for p in s2.counts if p not in (PCI, OTHER)]) == MAX_UNKNOWN_GPUS


def _state(tmp_path, doc, raw=None):
    d = tmp_path / "state"
    d.mkdir(exist_ok=True)
    (d / "xid-state.json").write_bytes(raw if raw is not None else json.dumps(doc).encode())
    return d


def test_non_utf8_state_file_is_set_aside_not_a_crash(tmp_path, caplog):
    d = _state(tmp_path, None, raw=b'{"version": 1, "boot_id": "b\xff\xfe", "counts": {}}')
    sf = state_file(d, "b")
    assert sf.read() is None and sf.status.problem == "corrupt" and sf.recoveries == 1
    assert not (d / "xid-state.json").exists() and len(list(d.glob("xid-state.json.corrupt-*"))) == 1
    assert "UnicodeDecodeError" in caplog.text


def test_state_file_values_out_of_range_are_rejected_naming_the_field(tmp_path, caplog):
    """A bad XID value costs the XID section (dropped, named with its field, a recovery, the file
    kept aside); the other sections load. A bad envelope field costs the whole file."""
    workload = {"records": [[PCI, "xid", 94, "", 2.0, None]]}
    good = {"version": 2, "boot_id": "b", "counts": {PCI: {"31": [1, 1.0, 2.0]}}, "workload": workload}
    data = state_file(_state(tmp_path, good), "b").read()
    assert data is not None and data["counts"] == good["counts"] and data["workload"] == workload
    bad_cases = [
        ({PCI: {"31": [-5, 1.0, 2.0]}}, f"counts[{PCI}][31] count is -5"),
        ({PCI: {"31": [1e308, 1.0, 2.0]}}, f"counts[{PCI}][31] count is 1e+308"),
        ({PCI: {"31": [10**12, 1.0, 2.0]}}, "expected an integer from 0 to 1000000000"),
        ({PCI: {"31": [True, 1.0, 2.0]}}, "count is True"),
        ({PCI: {"31": [1, float("nan"), 2.0]}}, "kernel time is nan"),
        ({PCI: {"31": [1, 1.0, float("inf")]}}, "unix time is inf"),
        ({PCI: {"99999999999999999999999": [1, 1.0, 2.0]}}, "count key '99999999999999999999999'"),
        ({PCI: {"0": [1, 1.0, 2.0]}}, "XID is 0"),
        ({"not-a-pci": {"31": [1, 1.0, 2.0]}}, "'not-a-pci' is not a PCI address key"),
    ]
    for counts, message in bad_cases:
        caplog.clear()
        d = _state(tmp_path, {**good, "counts": counts})
        sf = state_file(d, "b")
        data = sf.read()
        assert data is not None and not set(SECTION_KEYS) & set(data), counts  # the XID section dropped
        assert data["workload"] == workload, counts  # the others load
        assert (sf.status.problem, sf.recoveries) == ("corrupt", 1), counts
        assert not (d / "xid-state.json").exists() and sf.behind()  # kept aside, written back next
        assert "section xid: " in caplog.text and message in caplog.text, (message, caplog.text)
    caplog.clear()
    sf = state_file(_state(tmp_path, {**good, "last_seq": -1}), "b")  # the envelope's: the whole file
    assert sf.read() is None and sf.status.problem == "corrupt" and "last_seq is -1" in caplog.text
    assert len(list((tmp_path / "state").glob("xid-state.json.corrupt-*"))) == 5  # the last 5 kept


def test_temp_file_never_follows_a_planted_symlink_and_stale_temps_are_removed(tmp_path):
    d = tmp_path / "state"
    d.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (d / f".xid-state.json.{os.getpid()}.tmp").symlink_to(victim)  # planted at our temp name
    (d / ".xid-state.json.999999.tmp").write_text('{"half a wri')  # a writer SIGKILLed mid-write
    s = EventStore(XID_EVENTS)
    s.report("kmsg", PCI, 31, 1.0, 0.0)
    assert state_file(d, "b").write(dump(s))
    assert victim.read_text() == "precious"
    assert sorted(p.name for p in d.iterdir()) == ["xid-state.json", "xid-state.json.lock"]
    assert state_file(d, "b").read()["counts"][PCI]["31"][0] == 1


def test_a_recovery_is_a_lasting_signal_kept_in_the_new_state_file(tmp_path):
    d = _state(tmp_path, None, raw=b"{truncated")
    sf = state_file(d, "b")
    s = EventStore(XID_EVENTS)
    assert sf.read() is None
    s.report("kmsg", PCI, 31, 1.0, 0.0)
    assert sf.write(dump(s)) and sf.status.ok  # ok again after the next write ...
    assert sf.recoveries == 1
    sf2 = state_file(d, "b")  # ... but a restart still knows this boot recovered from a corrupt file
    assert sf2.read() is not None and sf2.recoveries == 1


def test_kernel_clock_offset_follows_live_records_and_ignores_other_boots():
    from exporter.xid.clock import KernelClock

    c = KernelClock()
    c.observe_live(100.0, mono=100.5)  # read 0.5 s late
    c.observe_live(200.2, mono=200.3)  # read 0.1 s late: the better estimate wins
    assert abs(c.offset_s - (-0.1)) < 1e-9
    c.observe_live(29.0, mono=100000.0)  # a replayed record of another boot
    assert abs(c.offset_s - (-0.1)) < 1e-9 and c.samples == 2


def test_loading_folds_extra_addresses_into_other_and_never_drops_a_count(tmp_path):
    """One limit rule for every load: addresses of the file beyond the guards are folded into
    "other" (never dropped, never given series of their own), and loading again adds nothing."""
    d = str(tmp_path)
    earlier = EventStore(XID_EVENTS)  # an earlier run, which counted addresses this one has not read yet
    for i in range(MAX_UNKNOWN_GPUS + 4):
        earlier.report("kmsg", f"0000{i:04x}:ee:00", 31, float(i), 0.0)
    assert state_file(d, "b").write(dump(earlier))
    daemon = EventStore(XID_EVENTS)  # its own unknown addresses fill the room
    for i in range(100, 100 + MAX_UNKNOWN_GPUS):
        daemon.report("kmsg", f"0000{i:04x}:ee:00", 43, float(i), 0.0)
    doc = state_file(d, "b").read()
    daemon.merge(doc["counts"], doc["open"], lambda pci: False)
    counts = dump(daemon)["counts"]
    assert sum(ks.get("31", [0])[0] for ks in counts.values()) == MAX_UNKNOWN_GPUS + 4
    assert counts[OTHER]["31"][0] == MAX_UNKNOWN_GPUS + 4
    assert len([p for p in counts if p != OTHER]) == MAX_UNKNOWN_GPUS
    daemon.merge(doc["counts"], doc["open"], lambda pci: False)
    assert dump(daemon)["counts"] == counts
