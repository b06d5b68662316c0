"""State that never lies. Every value read from a state file is validated as strictly
as config or the file is set aside; what the daemon holds goes back to disk whenever the file is
not what it holds (set aside, shutdown, reload); `check` answers 3 for an error of its own; a
kernel-log record counts only when whole, by every reader; the 64 KiB record limit is one rule;
an oversized state file is not re-read every scrape; the simulation stops its thread before
deleting its tree. In-process; tests/test_state_faults_live.py runs the real daemon."""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import shutil
import threading
import time

import pytest

from exporter.cli import main
from exporter.collectors.xid import XidCollector
from exporter.runner import Runner
from exporter.state import file as state_file
from exporter.state.file import MAX_STATE_BYTES
from exporter.tools import simulate
from exporter.xid import kmsg as kmsg_mod
from exporter.xid.kmsg import KmsgReader
from exporter.xid.persistence import STATE_DOC
from exporter.xid.service import one_shot
from exporter.xid.store import Ack
from tests.helpers import START_HANG_GUARD_S, samples, scrape, test_pool
from tests.test_check import REAL
from tests.test_xid_service import counts, make_ctx

PCI = "00000000:53:00"
XID94 = "4,500,5000000,-;NVRM: Xid (PCI:0000:53:00): 94, pid=1, name=p, Contained: SM (0x1).\n"


def state_path(tmp_path):
    return tmp_path / "state" / "xid-state.json"


def good_doc(**extra) -> dict:
    return {"version": 1, "boot_id": "boot-1", "counts": {PCI: {"94": [2, 5.0, 1.7e9]}}, **extra}


def load_doc(tmp_path, doc_or_raw):
    """The context of a one-shot service that loaded this state file."""
    path = state_path(tmp_path)
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(doc_or_raw if isinstance(doc_or_raw, bytes) else json.dumps(doc_or_raw).encode())
    ctx = make_ctx(tmp_path, "")
    one_shot(ctx)
    return ctx


def set_aside(tmp_path) -> list:
    return sorted(p.name for p in state_path(tmp_path).parent.glob("xid-state.json.corrupt-*"))


def wait_for(cond, what: str, timeout_s: float = START_HANG_GUARD_S):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g} s"
        time.sleep(0.02)


def finite_exposition(ctx) -> dict:
    """A scrape as /metrics renders it (a render error is a 500); every value finite."""
    got = samples(scrape(Runner([XidCollector(ctx)], deadline_s=10, pool=test_pool())))
    assert all(math.isfinite(v) for v in got.values()), got
    return got


# -- 2. every value read from a state file is validated, or the file is set aside ----------------
@pytest.mark.parametrize("doc, field", [
    (good_doc(gpus={PCI: {"index": 0, "uuid": "GPU-\udcff"}}), "gpus[00000000:53:00].uuid"),  # unencodable
    (good_doc(gpus={PCI: {"index": 0, "uuid": "GPU-" + "x" * 200}}), "uuid is 204 characters long"),
    (good_doc(gpus={PCI: {"index": 0, "uuid": "GPU-\n1"}}), "control characters"),
    (good_doc(counts={PCI: {"94": [2, 5.0, 1e300]}}), "unix time is 1e+300"),
    (good_doc(counts={PCI: {"94": [2, 1e11, 1.7e9]}}), "kernel time is 100000000000"),
    (good_doc(boot_id="boot-\udcff"), "boot_id"),
    (good_doc(kmsg=["not", "a", "path"]), "kmsg is"),
    (good_doc(written=float("inf")), "written is inf"),
    (good_doc(open=[[PCI, 94, "94", 5.0, ["kmsg\udcff"]]]), "open[0] source"),
    (good_doc(open=[[PCI, 94, "31", 5.0, ["kmsg"]]]), "is not of XID 94"),
    (good_doc(open=[[PCI, 94, "94", 5.0, []]]), "open[0] is"),
    (good_doc(acks=[{"pci": PCI, "xid": 94, "time": 1.7e9, "baseline": {"94": 10**9}}]),
     "acks[0].baseline[94] is 1000000000; expected an integer from 0 to 2"),  # above the count
    (good_doc(acks=[{"pci": PCI, "xid": 94, "time": 1.7e9, "baseline": {"31": 0}}]), "another XID"),
    (good_doc(acks=[{"pci": PCI, "time": float("nan"), "baseline": {}}]), "acks[0].time is nan"),
    (good_doc(acks=[{"pci": PCI, "time": 1.7e9, "uuid": "\udcff"}]), "acks[0].uuid"),
    (good_doc(acks=[{"pci": PCI, "time": 1.7e9, "logged": "yes"}]), "acks[0].logged"),
    (good_doc(acks={"pci": PCI}), "acks is"),
    (good_doc(recoveries=-1), "recoveries is -1"),
])
def test_a_state_value_out_of_shape_sets_the_file_aside_naming_the_field(tmp_path, caplog, doc, field):
    ctx = load_doc(tmp_path, json.dumps(doc).encode("utf-8", "surrogatepass"))
    assert ctx.xid.state.status.problem == "corrupt" and field in caplog.text, caplog.text
    assert set_aside(tmp_path) and not state_path(tmp_path).exists()
    assert counts(ctx.xid) == {}  # nothing of it was taken
    finite_exposition(ctx)


def test_a_12_mb_uuid_is_set_aside_and_never_reaches_a_scrape(tmp_path):
    ctx = load_doc(tmp_path, good_doc(gpus={PCI: {"index": 0, "uuid": "GPU-" + "x" * 12_000_000}}))
    assert ctx.xid.state.status.problem == "corrupt" and ctx.xid.identities.get(PCI) is None
    assert len(scrape(Runner([XidCollector(ctx)], deadline_s=10, pool=test_pool()))) < 100_000


def test_the_files_the_exporter_writes_pass_its_own_validation(tmp_path):
    """Acks and counts as `ack` and the daemon write them load back exactly."""
    svc = load_doc(tmp_path, good_doc(gpus={PCI: {"index": 0, "uuid": "GPU-1"}}, acks=[
        {"pci": PCI, "index": 0, "uuid": "GPU-1", "xid": 94, "time": 1.7e9, "baseline": {"94": 2}}])).xid
    assert svc.state.status.problem == "" and counts(svc) == {(PCI, "94"): 2}
    assert svc.flush_state(force=True)
    again = one_shot(make_ctx(tmp_path, ""))
    assert counts(again) == {(PCI, "94"): 2} and len(again.store.acks) == 1 and not set_aside(tmp_path)


def test_an_ack_baseline_above_the_count_does_not_silence_the_gpu(tmp_path, capsys):
    """Fails on the old code: a baseline of 1e9 silenced XID 94 and the verdict read healthy."""
    log = tmp_path / "kmsg.txt"
    log.write_text(REAL + XID94)
    state = tmp_path / "state"
    args = ["--simulate", "p5.48xlarge", "--kmsg-file", str(log), "--path.state-dir", str(state)]
    assert main(["ack", *args, "--gpu", "1"]) == 0  # writes this boot's acks file (a GPU with no XID)
    doc = json.loads((state / "xid-acks.json").read_text())
    doc["acks"].append({"pci": PCI, "index": 0, "uuid": "", "xid": 94, "time": time.time(),
                        "baseline": {"94": 10**9}})
    (state / "xid-acks.json").write_text(json.dumps(doc))
    capsys.readouterr()
    code = main(["check", *args, "--json"])
    out = json.loads(capsys.readouterr().out)
    # the forged ack waits for counts that never come (EventStore.add_ack): it holds nothing
    assert code == 2 and out["node"]["verdict"] == "replace_required"
    forged = {"pci": PCI, "index": 0, "uuid": "", "xid": 94, "time": 1.7e9, "baseline": {"94": 2}}
    # and in the XID state file, a baseline above its counts makes the file corrupt
    (state / "xid-state.json").write_text(json.dumps({**doc, "acks": [forged], "counts": {}}))
    code = main(["check", *args, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 2 and out["sources"]["state_file"]["problem"] == "corrupt"


@pytest.mark.parametrize("section, bad, field", [
    ("sxid", {"counts": [["00000000:05:00", 12028, "fatal", 1, float("inf")]]}, "counts[0] unix time is inf"),
    ("sxid", {"counts": [["00000000:05:00", 12028, "fatal", 1, 1e300]]}, "unix time is 1e+300"),
    ("sxid", {"counts": [["00000000:05:00", 12028, ["fatal"], 1, 1.0]]}, "severity is ['fatal']"),
    ("workload", {"records": [["00000000:05:00", "xid", 1000, "", 1.0, None]]}, "records[0] xid is 1000"),
    ("xid", {"counts": {PCI: {"94": [-1, 5.0, 1.7e9]}}}, "count is -1"),
])
def test_a_section_out_of_shape_is_set_aside_and_the_others_load(tmp_path, caplog, section, bad, field):
    """One document, sections validated on their own: a bad one is named (file and key), counted
    as a recovery and kept aside with the file; the others load, and are written back."""
    d = tmp_path / "state"
    d.mkdir()
    sections = {"counts": {PCI: {"94": [2, 5.0, 1.7e9]}},
                "sxid": {"counts": [["00000000:05:00", 12028, "fatal", 3, 1.0]], "switches": {}},
                "workload": {"records": [[PCI, "xid", 94, "", 2.0, None]]}}
    doc = {"version": 2, "boot_id": "b", "kmsg": "k", **sections,
           **({section: bad} if section != "xid" else bad)}
    (d / "xid-state.json").write_text(json.dumps(doc))
    sf = state_file.StateFile(str(d), "b", "k", doc=STATE_DOC)
    data = sf.read()
    assert data is not None and sf.status.problem == "corrupt" and sf.recoveries == 1
    assert f"{d / 'xid-state.json'}" in caplog.text and f"section {section}: " in caplog.text
    assert field in caplog.text
    kept = {"xid": "counts" in data, "sxid": "sxid" in data, "workload": "workload" in data}
    assert kept == {k: k != section for k in kept}
    assert data.get("sxid", sections["sxid"]) == sections["sxid"]
    assert [p.read_text() for p in d.glob("xid-state.json.corrupt-*")] == [json.dumps(doc)]
    assert not (d / "xid-state.json").exists() and sf.behind()  # written back at the next flush


# -- 3. what the daemon holds is written back whenever the file is not what it holds -------------
def running(tmp_path, kmsg_text=XID94):
    ctx = make_ctx(tmp_path, kmsg_text)
    svc = ctx.xid
    svc.start()
    return svc


def on_disk(tmp_path) -> dict | None:
    try:
        return json.loads(state_path(tmp_path).read_text())
    except (OSError, ValueError):
        return None


def xid94_on_disk(tmp_path) -> bool:
    doc = on_disk(tmp_path)
    return doc is not None and doc.get("counts", {}).get(PCI, {}).get("94", [0])[0] == 1


@pytest.mark.parametrize("replacement", [
    b'{"version":1,',  # corrupt
    b" " * (MAX_STATE_BYTES + 1),  # beyond the size limit
    json.dumps(good_doc(boot_id="another-boot", counts={})).encode(),  # another boot's
])
def test_a_file_replaced_under_the_daemon_is_written_back_on_shutdown(tmp_path, replacement):
    """The issue's reproduction: count an XID 94, overwrite the state file, stop, let the ring
    wrap, restart: the XID is still counted and nothing was lost, so no recovery. Fails on the
    old code (nothing was written at shutdown: the XID was lost)."""
    svc = running(tmp_path)
    try:
        wait_for(lambda: xid94_on_disk(tmp_path), "XID 94 in the state file")
        state_path(tmp_path).write_bytes(replacement)
    finally:
        svc.stop()
    assert xid94_on_disk(tmp_path)
    again = one_shot(make_ctx(tmp_path, ""))  # the ring wrapped: the kernel log no longer has it
    assert counts(again) == {(PCI, "94"): 1}
    assert again.state.recoveries == 0 and on_disk(tmp_path)["recoveries"] == 0


def test_a_corrupt_file_set_aside_while_running_loses_nothing_and_is_written_back(tmp_path, caplog):
    """Fails on the old code: it counted a recovery (nothing was lost) and did not write back
    until the next kernel record or ack."""
    svc = running(tmp_path)
    try:
        wait_for(lambda: xid94_on_disk(tmp_path), "XID 94 in the state file")
        state_path(tmp_path).write_bytes(b"{truncated")
        # A scrape looks for acks (or the follower's next flush does): reads the file, sets it aside.
        wait_for(lambda: svc.refresh_acks() is not None and set_aside(tmp_path), "the file set aside")
        assert svc.state.recoveries == 0
        assert "nothing lost" in caplog.text
        wait_for(lambda: xid94_on_disk(tmp_path), "the state file written back")
    finally:
        svc.stop()


def test_a_reader_that_does_not_write_back_counts_the_recovery(tmp_path):
    """Without the follower (the verdict alone reads the state, or xid.enabled false) nothing
    writes the counts back: a corrupt file set aside then may lose them, so it is a recovery."""
    svc = load_doc(tmp_path, good_doc()).xid
    state_path(tmp_path).write_bytes(b"{truncated")
    svc.refresh_acks()
    assert set_aside(tmp_path) and svc.state.recoveries == 1


def test_a_recovery_persists_for_the_boot_even_without_new_events(tmp_path):
    """A corrupt file at start may have lost counts: a recovery, written to the new state file at
    once and kept by every later run of this boot. Fails on the old code (nothing was written
    until an event: a restart forgot the recovery)."""
    state_path(tmp_path).parent.mkdir()
    state_path(tmp_path).write_bytes(b"\x00garbage")
    svc = running(tmp_path, "")
    try:
        assert svc.state.recoveries == 1
        wait_for(lambda: (on_disk(tmp_path) or {}).get("recoveries") == 1, "the recovery on disk")
    finally:
        svc.stop()
    assert one_shot(make_ctx(tmp_path, "")).state.recoveries == 1


def test_an_ack_of_what_the_daemon_has_not_counted_yet_waits_for_the_count(tmp_path):
    """`ack` may count a record the daemon has not read yet; the daemon takes the ack once it
    counted the record, so the file it writes stays valid (an ack's baseline never above the
    count; only the daemon writes counts) and a restart counts the record once."""
    ctx = make_ctx(tmp_path, "")
    daemon = one_shot(ctx)
    with open(tmp_path / "kmsg", "a") as f:
        f.write(XID94)
    ack_svc = one_shot(make_ctx(tmp_path, None))  # `ack` reads the record the daemon has not
    assert ack_svc.write_ack(Ack(PCI, None, "", 94, time.time(), {"94": 1})) == ""
    assert daemon.refresh_acks() == []  # the ack waits for the count it acknowledges ...
    assert counts(daemon) == {}  # still behind the kernel log
    daemon.flush_state(force=True)
    assert (on_disk(tmp_path) or {}).get("acks", []) == []  # ... so what it writes is valid
    daemon.read_kmsg()
    assert [a.xid for a in daemon.refresh_acks()] == [94]  # counted: the ack holds
    daemon.flush_state(force=True)
    again = one_shot(make_ctx(tmp_path, None))  # restart: the files are valid, the record counted once
    assert again.state.status.problem == "" and counts(again) == {(PCI, "94"): 1}
    assert [a.xid for a in again.store.acks] == [94]


def test_the_scrape_never_waits_for_the_state_lock_and_keeps_the_acks_it_holds(tmp_path):
    """Fails on the old code: a scrape's look for acks waited, without a timeout, for the lock
    that `ack` (or a hung process) held."""
    svc = load_doc(tmp_path, good_doc(acks=[{"pci": PCI, "xid": 94, "time": 1.0, "baseline": {"94": 1}}])).xid
    doc = on_disk(tmp_path) or good_doc()
    doc["acks"] = [*doc.get("acks", []), {"pci": PCI, "xid": 94, "time": 2.0, "baseline": {"94": 2}}]
    state_path(tmp_path).write_text(json.dumps(doc))  # `ack` wrote a second one ...
    fd = os.open(state_path(tmp_path).parent / "xid-state.json.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # ... and holds the lock still
        got: list = []
        scrape_look = threading.Thread(target=lambda: got.append(svc.refresh_acks()), daemon=True)
        scrape_look.start()
        scrape_look.join(START_HANG_GUARD_S)
        assert not scrape_look.is_alive() and got == [[]]
        assert [a.time for a in svc.store.acks] == [1.0]  # the acks held stay
    finally:
        os.close(fd)  # the lock goes with it
    assert [a.time for a in svc.refresh_acks()] == [2.0]  # the news is taken at the next look
    assert [a.time for a in svc.store.acks] == [1.0, 2.0]


# -- 7. an oversized state file is not re-read on every scrape -----------------------------------
def test_an_oversized_state_file_is_read_once_not_every_scrape(tmp_path, monkeypatch):
    """Fails on the old code: 16 MiB read twice a scrape until the daemon next wrote.

    The daemon's follower thread runs beside the scrapes: it may be the one that reads the file
    (its flush sees a file it did not write), or a scrape may be. Either way the file is read
    once. It is put in place whole (a rename): a file still being written is another file (a
    corrupt one, set aside before it reaches the size limit) and was why this test depended on
    how fast the host wrote 16 MiB."""
    svc = running(tmp_path, "")
    too_big = []

    def read_state_file(*a, **k):
        try:
            return real(*a, **k)
        except OSError as e:
            if e.errno == errno.EFBIG:
                too_big.append(a)
            raise

    real = state_file.read_state_file
    monkeypatch.setattr(state_file, "read_state_file", read_state_file)
    try:
        wait_for(lambda: svc.persistence.loaded, "the state loaded")
        path = state_path(tmp_path)
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_name("oversized.tmp")
        tmp.write_bytes(b" " * (MAX_STATE_BYTES + 1))
        os.replace(tmp, path)
        # the scrape path looks (a flush in progress makes it look again later) until someone read it
        wait_for(lambda: svc.refresh_acks() is not None and too_big, "the oversized file read")
        wait_for(lambda: not path.exists() or path.stat().st_size <= MAX_STATE_BYTES, "the file set aside")
        for _ in range(5):
            svc.refresh_acks()
        assert len(too_big) == 1
        assert len(set_aside(tmp_path)) == 1
    finally:
        svc.stop()


def test_a_corrupt_file_that_cannot_be_set_aside_is_not_read_again_until_it_changes(tmp_path, monkeypatch):
    def cannot(*_a, **_k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(state_file, "set_aside", cannot)
    reads = []
    real = state_file.read_state_file
    monkeypatch.setattr(state_file, "read_state_file", lambda *a, **k: reads.append(a) or real(*a, **k))
    path = state_path(tmp_path)
    path.parent.mkdir()
    path.write_bytes(b"{corrupt")
    sf = state_file.StateFile(str(path.parent), "boot-1", doc=STATE_DOC)
    for _ in range(3):
        assert sf.read() is None and sf.status.problem == "corrupt"
    assert len(reads) == 1
    path.write_text(json.dumps(good_doc()))  # changed: read again
    assert sf.read() is not None and len(reads) == 2


# -- 4. check answers 3 for an error of its own ---------------------------------------------------
def this_boots_state(tmp_path, capsys):
    log = tmp_path / "kmsg.txt"
    log.write_text(REAL)
    state = tmp_path / "state"
    args = ["--simulate", "p5.48xlarge", "--kmsg-file", str(log), "--path.state-dir", str(state)]
    assert main(["ack", *args, "--gpu", "1"]) == 0  # writes this boot's acks file (only the daemon
    capsys.readouterr()                               # writes the XID state file)
    acks = json.loads((state / "xid-acks.json").read_text())
    return args, state, {"version": 1, "boot_id": acks["boot_id"], "counts": {}, "acks": []}


def test_check_with_a_1e300_last_seen_answers_3_not_a_crash(tmp_path, capsys):
    """Fails on the old code: OverflowError, exit 1 ("degraded": not drained)."""
    args, state, doc = this_boots_state(tmp_path, capsys)
    doc["counts"][PCI] = {"94": [1, 5.0, 1e300]}
    (state / "xid-state.json").write_text(json.dumps(doc))
    code = main(["check", *args, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 3 and out["sources"]["state_file"]["problem"] == "corrupt"


def test_check_with_infinity_in_the_sxid_state_answers_not_a_crash(tmp_path, capsys):
    """Fails on the old code: Infinity was accepted, OverflowError, exit 1."""
    args, state, doc = this_boots_state(tmp_path, capsys)
    sx = {"version": 1, "boot_id": doc["boot_id"], "last_seq": None,
          "counts": [["00000000:05:00", 12028, "non_fatal", 1, float("inf")]], "switches": {}}
    (state / "sxid-state.json").write_text(json.dumps(sx))
    code = main(["check", *args, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["node"]["exit_status"] == 0 and out["nvswitch_sxids"] == []
    assert (state / "sxid-state.json").exists()  # check reads only: left for the daemon


def test_any_error_inside_check_is_exit_3_with_the_reason(tmp_path, capsys, monkeypatch):
    from exporter.commands import check

    def broken(*_a, **_k):
        raise OverflowError("timestamp out of range for platform time_t")

    monkeypatch.setattr(check, "to_json", broken)
    log = tmp_path / "kmsg.txt"
    log.write_text(REAL)
    code = main(["check", "--simulate", "p5.48xlarge", "--kmsg-file", str(log), "--json"])
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert code == 3 and out["node"] == {"verdict": "unknown", "reasons": [], "exit_status": 3}
    assert "OverflowError: timestamp out of range" in out["problems"][0]
    assert "OverflowError: timestamp out of range" in captured.err
    monkeypatch.setattr(check, "table", broken)
    assert main(["check", "--simulate", "p5.48xlarge", "--kmsg-file", str(log)]) == 3
    assert "could not check" in capsys.readouterr().err


def test_an_error_before_the_check_runs_is_exit_3_too(tmp_path, capsys, monkeypatch):
    import exporter.cli

    def broken(*_a, **_k):
        raise PermissionError(13, "Permission denied", "/var/lib/gpu-health-exporter")

    monkeypatch.setattr(exporter.cli, "build_context", broken)
    assert main(["check", "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["node"]["verdict"] == "unknown" and "PermissionError" in out["problems"][0]
    with pytest.raises(PermissionError):  # a command without its own answer: as before
        main(["ack", "--gpu", "0"])


# -- 5. a record counts only when whole, by every reader ------------------------------------------
HALF = "4,520,6000000,-;NVRM: Xid (PCI:0000:53:00): 6"
REST = "3, pid=1, name=p, Row Remapper: New row marked for remapping, reset gpu to activate.\n"


def gpu0(capsys) -> dict:
    return next(g for g in json.loads(capsys.readouterr().out)["gpus"] if g["gpu"] == 0)


def test_ack_does_not_count_a_half_written_record_nor_move_past_it(tmp_path, capsys):
    """The issue's reproduction. Fails on the old code: `ack` counted XID 6 and stored its
    sequence number, so XID 63 was never counted once the record was whole."""
    log = tmp_path / "kmsg.txt"
    log.write_text(REAL + HALF)
    state = tmp_path / "state"
    args = ["--simulate", "p5.48xlarge", "--kmsg-file", str(log), "--path.state-dir", str(state)]
    assert main(["ack", *args, "--gpu", "0"]) == 0
    assert "none counted yet" in capsys.readouterr().out
    assert not (state / "xid-state.json").exists()  # `ack` writes the acks file alone
    with open(log, "a") as f:
        f.write(REST)
    code = main(["check", *args, "--json"])
    g0 = gpu0(capsys)
    assert [(x["xid"], x["count"]) for x in g0["xids"]] == [(63, 1)] and code == 2


def test_check_and_the_daemon_do_not_count_a_half_written_record(tmp_path, capsys):
    log = tmp_path / "kmsg.txt"
    log.write_text(REAL + HALF)
    code = main(["check", "--simulate", "p5.48xlarge", "--kmsg-file", str(log), "--json"])
    assert gpu0(capsys)["xids"] == [] and code == 0
    svc = running(tmp_path, HALF)
    try:
        wait_for(lambda: (k := svc.snapshot().kmsg).stats.records == 0 and k.ok, "the kernel log read")
        assert counts(svc) == {} and svc.last_seq is None
        with open(tmp_path / "kmsg", "a") as f:
            f.write(REST)
        wait_for(lambda: counts(svc) == {(PCI, "63"): 1}, "XID 63 once whole")
    finally:
        svc.stop()


def test_a_file_that_ends_without_a_newline_keeps_its_last_line_waiting(tmp_path):
    path = tmp_path / "kmsg"
    path.write_text("6,0,10,-;a\n6,1,11,-;b")
    r = KmsgReader(str(path))
    assert [x.message for x in r.read_available()] == ["a"]
    assert list(r.read_available()) == [] and r.high_seq == 0  # never taken unfinished
    with open(path, "a") as f:
        f.write("c\n")
    assert [x.message for x in r.read_available()] == ["bc"]


# -- 6. the 64 KiB record limit is one rule however the line arrives -------------------------------
def long_xid(total_bytes: int) -> bytes:
    head = b"4,1,1000000,-;NVRM: Xid (PCI:0000:53:00): 94, pid=1, name=p, "
    return head + b"x" * (total_bytes - len(head))


@pytest.mark.parametrize("size, counted", [
    (kmsg_mod.MAX_LINE_BYTES, True),
    (kmsg_mod.MAX_LINE_BYTES + 1, False),
    (70_000, False),
])
@pytest.mark.parametrize("pieces", [1, 2, 3])
def test_the_record_limit_is_the_same_in_one_write_or_in_pieces(tmp_path, size, counted, pieces):
    """Fails on the old code: a 70 KB line written in one piece was counted, in two dropped."""
    line = long_xid(size) + b"\n"  # its newline comes with the last piece
    path = tmp_path / "kmsg"
    path.write_bytes(b"4,0,10,-;before\n")
    r = KmsgReader(str(path))
    got = [x.seq for x in r.read_available()]
    cut = [len(line) * i // pieces for i in range(pieces + 1)]
    for a, b in zip(cut, cut[1:], strict=False):
        with open(path, "ab") as f:
            f.write(line[a:b])
        got += [x.seq for x in r.read_available()]
    with open(path, "ab") as f:
        f.write(b"4,2,20,-;after\n")
    got += [x.seq for x in r.read_available()]
    assert got == ([0, 1, 2] if counted else [0, 2])
    assert r.stats.malformed == (0 if counted else 1)


# -- 8. the simulation stops its thread before deleting its tree -----------------------------------
def test_simulation_close_stops_its_thread_before_removing_its_tree(monkeypatch):
    """Fails on the old code: the tree was removed while the clock's thread was still running."""
    sim = simulate.Simulation("p5.48xlarge", tick_s=0.001).build()
    entered = threading.Event()
    seen = {}
    source = sim.sources[0]

    def advance(_t):
        entered.set()
        sim._stop.wait(30)  # a tick under way when close() comes
        (sim.root / "late").write_text("a tick's write")

    real_rmtree = shutil.rmtree

    def rmtree(path, *a, **k):
        seen["alive"] = sim._thread.is_alive()
        return real_rmtree(path, *a, **k)

    monkeypatch.setattr(source, "advance", advance)
    monkeypatch.setattr(simulate.shutil, "rmtree", rmtree)
    sim.start()
    assert entered.wait(30)
    sim.close()
    assert seen == {"alive": False} and not sim.root.exists()


def test_a_failing_tick_is_logged_not_a_raw_thread_traceback(monkeypatch, caplog):
    sim = simulate.Simulation("p5.48xlarge", tick_s=0.001).build()
    hooked = []
    monkeypatch.setattr(threading, "excepthook", hooked.append)
    ticks = []

    def advance(_t):
        ticks.append(1)
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(sim.sources[0], "advance", advance)
    sim.start()
    try:
        wait_for(lambda: len(ticks) >= 2, "two ticks")  # the thread lived on after the first
    finally:
        sim.close()
    assert hooked == [] and "advancing the simulated node failed" in caplog.text
    assert not sim.root.exists()


def test_what_the_exporter_learns_it_can_write_and_read_back(tmp_path):
    """Identities come from kernel lines and NVML and go to the state file: a UUID the file could
    not hold (too long, unencodable) is not taken, so a restart never sets the file aside."""
    from exporter.xid.identities import GpuIdentities
    from exporter.xid.parser import parse_message

    long_line = "NVRM: GPU at PCI:0000:53:00: GPU-" + "a" * 200
    assert getattr(parse_message(long_line), "uuid", None) is None
    ids = GpuIdentities(None)
    ids.identify(PCI, 0, "GPU-\udcff")
    ids.identify("00000000:64:00", 5000, "GPU-" + "b" * 100)
    assert ids.get(PCI).uuid == "" and ids.get("00000000:64:00").index is None
    svc = load_doc(tmp_path, good_doc()).xid
    svc.identities.load(ids.to_state())
    assert svc.flush_state(force=True)
    assert one_shot(make_ctx(tmp_path, None)).state.status.problem == ""


def test_record_numbers_the_state_file_could_not_hold_are_malformed(tmp_path):
    """A sequence number beyond 2^63-1 or an uptime beyond 30 years is no kernel's (a forged or
    corrupted file): counted, it made a state file the next start set aside (and a 5,000-digit
    number raised ValueError out of the reader)."""
    bad = "NVRM: Xid (PCI:0000:53:00): 94, pid=1, name=p, x\n"
    text = (f"4,{2**64},1000000,-;{bad}4,2,{10**16},-;{bad}4,3,{'9' * 5000},-;{bad}"
            "4,4,2000000,-;NVRM: Xid (PCI:0000:64:00): 31, pid=1, name=p, x\n")
    svc = one_shot(make_ctx(tmp_path, text))
    assert counts(svc) == {("00000000:64:00", "31"): 1} and svc.snapshot().kmsg.stats.malformed == 3
    assert svc.flush_state(force=True)
    assert one_shot(make_ctx(tmp_path, None)).state.status.problem == ""


# ------------------------------ every document validated in one style ------------------------------
def _documents():
    from exporter.xid.attribution_state import WORKLOAD_DOC
    from exporter.xid.store import ACKS_DOC
    from exporter.xid.sxid_state import SXID_DOC
    return {"XID": (STATE_DOC, {"counts": {"00000000:05:00": {"94": [1, 1.0, 2.0]}}}),
            "acks": (ACKS_DOC, {"acks": []}),
            "SXid": (SXID_DOC, {"counts": [["00000000:08:00", 20034, "fatal", 1, 2.0]]}),
            "workload": (WORKLOAD_DOC, {"records": [["00000000:05:00", "xid", 94, "", 2.0, None]]})}


@pytest.mark.parametrize("what", ["XID", "acks", "SXid", "workload"])
@pytest.mark.parametrize("field, value", [("boot_id", "b" * 65), ("kmsg", "a\nb"), ("recoveries", -1),
                                          ("recoveries", True)])
def test_every_document_checks_the_shared_fields_alike_and_names_them(what, field, value):
    """The fields the state file adds to every document are checked by one rule (exporter.state.
    values.envelope), whichever document: the error names the field, and a good one passes."""
    doc, body = _documents()[what]
    good = {**body, "version": doc.schema.version, "boot_id": "b", "kmsg": "/dev/kmsg", "recoveries": 0}
    doc.validate(good)
    with pytest.raises(state_file.StateError, match=f"^{field} "):
        doc.validate({**good, field: value})
    with pytest.raises(state_file.StateError, match=f"not a version-{doc.schema.version} {what} state"):
        doc.validate({**good, "version": 0})
