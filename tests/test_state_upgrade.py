"""State written by earlier versions of this project loads with every count.

tests/fixtures/state/<commit>/ holds the state files a simulated p5.48xlarge wrote at that commit
(its XID, SXid and, from c88ad74, workload-attribution files; from 43ffce6 the acks file), after
two `ack`s folded in by the running daemon (all XIDs of GPU 1; XID 63 of GPU 2). How they were
made is in the README there.
The current code loads each: every XID and SXid count, every ack, every attribution. A file of a
newer version (a downgrade) is set aside under a name that says so, with a log line, never read
as zero counts in silence.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from exporter.arguments import build_parser
from exporter.cli import main
from exporter.startup import build_context
from exporter.state import versions
from exporter.state.versions import NewerVersion, Schema, StateError
from exporter.xid.sxid_state import by_report
from tests.helpers import FIXTURES

STATE = FIXTURES / "state"
COMMITS = sorted(p.name for p in STATE.iterdir() if p.is_dir())


def fixture(commit: str, name: str) -> dict:
    return json.loads((STATE / commit / name).read_text())


def sim_args(commit: str, state: Path) -> list[str]:
    """The simulated node that wrote the fixture: its kernel log's name ("simulated:PROFILE:SCENARIOS")
    is what the file records, so the same node reads it as its own."""
    _, profile, scenarios = fixture(commit, "xid-state.json")["kmsg"].split(":")
    return ["--simulate", profile, *[a for s in scenarios.split(",") for a in ("--scenario", s)],
            "--path.state-dir", str(state)]


def copied(commit: str, tmp_path: Path) -> Path:
    state = tmp_path / "state"
    shutil.copytree(STATE / commit, state)
    (state / "README.md").unlink(missing_ok=True)
    return state


def test_fixtures_of_every_released_format_are_here():
    assert {"c475e11", "c88ad74", "43ffce6"} <= set(COMMITS)


@pytest.mark.parametrize("commit", COMMITS)
def test_every_generation_loads_with_nothing_lost(commit, tmp_path):
    """Each generation loaded into the store: every count with its times (kernel clock and wall
    clock of the last event), every open event's first report, every SXid count with its time,
    every ack (from the XID file, or from the acks file where `ack` wrote one), every attribution
    no ack cleared (its time and workloads)."""
    state = copied(commit, tmp_path)
    ctx, sim = build_context(build_parser().parse_args(sim_args(commit, state)))
    try:
        svc = ctx.xid
        svc.load_state()
        xid = fixture(commit, "xid-state.json")
        got = {p: {k: c.to_json() for k, c in ks.items()} for p, ks in svc.store.snapshot().items()}
        assert got == xid["counts"]
        opened = {(p, x, ev.key, ev.start_s) for (p, x), q in svc.store.open.items() for ev in q}
        assert opened == {(p, x, key, start) for p, x, key, start, _ in xid["open"]}
        sx = {(p, n, sev): (c.count, c.last_wall) for (p, n, sev), c in by_report(svc.sxids).items()}
        assert sx == {(p, n, sev): (count, wall)
                      for p, n, sev, count, wall in fixture(commit, "sxid-state.json")["counts"]}
        written = [*xid["acks"]]
        if (STATE / commit / "xid-acks.json").exists():
            written += fixture(commit, "xid-acks.json")["acks"]
        acks = {(a.pci, a.xid, round(a.time, 3), tuple(a.baseline.items()))
                for a in svc.store.acks_snapshot()}
        assert acks == {(a["pci"], a["xid"], round(a["time"], 3), tuple(a["baseline"].items()))
                        for a in written}
        assert len(acks) == 2
        if (STATE / commit / "workload-state.json").exists():
            ledger = svc.attribution.ledger
            seen = {(r.pci, r.kind, r.code, r.switch, round(r.time, 3),
                     tuple((w.hpc_job, w.namespace, w.pod, w.container) for w in r.workloads or ()))
                    for r in ledger.visible(svc.store.acks_snapshot())}
            records = fixture(commit, "workload-state.json")["records"]
            on_disk = {(pci, kind, code, switch, t, tuple(map(tuple, ws or ())))
                       for pci, kind, code, switch, t, ws, *_ in records}
            # the acks: every XID of GPU 1 (00000000:64:00), XID 63 of GPU 2 (00000000:75:00)
            cleared = {r for r in on_disk
                       if r[0] == "00000000:64:00" or r[:3] == ("00000000:75:00", "xid", 63)}
            assert seen == on_disk - cleared and len(seen) == 16
    finally:
        sim.close()


@pytest.mark.parametrize("commit", COMMITS)
def test_the_state_loads_with_every_count_and_ack(commit, tmp_path):
    """Loaded alone (the kernel log not read): the counts are the file's, not the log's."""
    state = copied(commit, tmp_path)
    ctx, sim = build_context(build_parser().parse_args(sim_args(commit, state)))
    try:
        svc = ctx.xid
        svc.load_state()
        assert svc.persistence.found and svc.state.status.problem == ""
        want = {(p, k): v[0] for p, ks in fixture(commit, "xid-state.json")["counts"].items()
                for k, v in ks.items()}
        got = {(p, k): c.count for p, ks in svc.store.snapshot().items() for k, c in ks.items()}
        assert got == want and len(want) == 4
        acks = {(a.pci, a.xid, tuple(sorted(a.baseline.items()))) for a in svc.store.acks_snapshot()}
        assert acks == {(a["pci"], a["xid"], tuple(sorted(a["baseline"].items())))
                        for a in fixture(commit, "xid-state.json")["acks"]} and len(acks) == 2
        sx = {(p, n, sev): c.count for (p, n, sev), c in by_report(svc.sxids).items()}
        on_disk = fixture(commit, "sxid-state.json")["counts"]
        assert sx == {(p, n, sev): count for p, n, sev, count, _ in on_disk}
        assert sum(sx.values()) == 25
        assert svc.follower.counted_through("xid") == fixture(commit, "xid-state.json")["last_seq"]
    finally:
        sim.close()


@pytest.mark.parametrize("commit", COMMITS)
def test_check_reports_the_counts_acks_and_attribution_of_the_old_files(commit, tmp_path, capsys):
    """`check` on the node that wrote them: each XID once (the log's records up to the file's
    sequence number are not counted again), the acked ones acknowledged, and (from c88ad74, the
    first with attribution) the Slurm job each fault hit."""
    state = copied(commit, tmp_path)
    main(["check", *sim_args(commit, state), "--json"])
    out = json.loads(capsys.readouterr().out)
    xids = {(g["gpu"], x["xid"]): (x["count"], x["acknowledged"]) for g in out["gpus"] for x in g["xids"]}
    assert xids == {(1, 94): (1, True), (2, 63): (1, True), (3, 74): (1, False), (5, 79): (1, False)}
    assert sorted((s["sxid"], s["count"]) for s in out["nvswitch_sxids"]) == [(20001, 24), (20034, 1)]
    assert not out["problems"], out["problems"]
    if (STATE / commit / "workload-state.json").exists():
        hit = {(g["gpu"], w["event"], w.get("xid") or w.get("sxid")):
               [j.get("hpc_job") for j in w["workloads"]] for g in out["gpus"] for w in g["workloads_hit"]}
        index = {p: g["index"] for p, g in fixture(commit, "xid-state.json")["gpus"].items()}
        written = fixture(commit, "workload-state.json")["records"]
        records = {(index[pci], kind, code) for pci, kind, code, *_ in written}
        acked = {r for r in records if r[0] == 1 or r[:3] == (2, "xid", 63)}  # the acks clear what they cover
        # c475e11 and c88ad74 kept the records an ack cleared (20, 4 of them cleared); from
        # 43ffce6 the daemon drops them when it writes (16)
        assert len(records - acked) == 16
        assert set(hit) == records - acked
        assert set(map(tuple, hit.values())) == {("4242",)}


OLD_FILES = ("sxid-state.json", "workload-state.json")


def loaded(state: Path, commit: str, flush: bool = True) -> tuple[dict, dict, list]:
    """(XID counts, SXid counts, attributions) a service on `state` loads; flushed when `flush`."""
    ctx, sim = build_context(build_parser().parse_args(sim_args(commit, state)))
    try:
        svc = ctx.xid
        svc.load_state()
        if flush:
            assert svc.flush_state(force=True)
        return ({p: {k: c.to_json() for k, c in ks.items()} for p, ks in svc.store.snapshot().items()},
                {k: (c.count, c.last_wall) for k, c in by_report(svc.sxids).items()},
                sorted(map(repr, svc.attribution.ledger.records())))
    finally:
        sim.close()


@pytest.mark.parametrize("commit", COMMITS)
def test_the_old_files_migrate_into_one_document_and_are_renamed_not_lost(commit, tmp_path):
    """Read once into xid-state.json (version 2: its sxid and workload sections), then renamed
    `<name>.migrated-<time>` with their bytes; a restart loads the same from the document alone."""
    state = copied(commit, tmp_path)
    olds = {n: (state / n).read_bytes() for n in OLD_FILES if (state / n).exists()}
    first = loaded(state, commit)
    doc = json.loads((state / "xid-state.json").read_text())
    assert doc["version"] == versions.XID.version == 2 and doc["sxid"]["counts"]
    assert ("workload-state.json" in olds) == bool(doc["workload"]["records"])
    for name, raw in olds.items():
        assert not (state / name).exists()
        assert [p.read_bytes() for p in state.glob(f"{name}.migrated-*")] == [raw]
    assert loaded(state, commit) == first and first[1]
    assert {p.name for p in state.iterdir() if p.name.endswith(".json")} == {"xid-state.json"} | (
        {"xid-acks.json"} if (STATE / commit / "xid-acks.json").exists() else set())


def test_a_crash_between_writing_the_document_and_renaming_the_old_files_the_document_wins(tmp_path):
    commit = COMMITS[-1]
    state = copied(commit, tmp_path)
    first = loaded(state, commit)
    for name in OLD_FILES:  # put back as a crash before the rename leaves them, with other counts
        (aside,) = state.glob(f"{name}.migrated-*")
        doc = json.loads(aside.read_text())
        doc.update(counts=[[*row[:3], row[3] + 100, row[4]] for row in doc.get("counts", [])], records=[])
        (state / name).write_text(json.dumps(doc))
    assert loaded(state, commit, flush=False) == first  # the document's, not the old files'
    for name in OLD_FILES:
        assert not (state / name).exists() and len(list(state.glob(f"{name}.migrated-*"))) == 2


def test_what_is_not_a_regular_file_at_an_old_path_is_named_and_left_alone(tmp_path, caplog):
    """A symlink (to a good old file) and a FIFO: never read, renamed nor replaced."""
    import os

    commit = COMMITS[-1]
    state = copied(commit, tmp_path)
    target = tmp_path / "elsewhere.json"
    os.replace(state / "sxid-state.json", target)
    (state / "sxid-state.json").symlink_to(target)
    (state / "workload-state.json").unlink()
    os.mkfifo(state / "workload-state.json")
    before = {n: os.lstat(state / n) for n in OLD_FILES}
    with caplog.at_level(logging.ERROR):
        _, sxids, records = loaded(state, commit)
    assert sxids == {} and records == []  # the document (version 1) has neither; the old files unread
    for name in OLD_FILES:
        assert os.lstat(state / name).st_ino == before[name].st_ino and str(state / name) in caplog.text
    assert target.read_bytes() == (STATE / commit / "sxid-state.json").read_bytes()


def test_check_reads_the_old_files_and_writes_nothing(tmp_path, capsys):
    commit = COMMITS[-1]
    state = copied(commit, tmp_path)
    def files() -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in state.iterdir() if p.name != "xid-state.json.lock"}

    before = files()
    main(["check", *sim_args(commit, state), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert sorted((s["sxid"], s["count"]) for s in out["nvswitch_sxids"]) == [(20001, 24), (20034, 1)]
    assert files() == before


def newer(commit: str, state: Path) -> Path:
    """The fixture's XID file as a newer exporter would write it (version + 1)."""
    path = state / "xid-state.json"
    doc = fixture(commit, "xid-state.json")
    path.write_text(json.dumps({**doc, "version": versions.XID.version + 1}))
    return path


def test_a_newer_version_is_set_aside_with_a_clear_message_not_read_as_zero(tmp_path, caplog):
    state = copied(COMMITS[-1], tmp_path)
    newer(COMMITS[-1], state)
    ctx, sim = build_context(build_parser().parse_args(sim_args(COMMITS[-1], state)))
    try:
        with caplog.at_level(logging.ERROR):
            ctx.xid.load_state()
        st = ctx.xid.state
        assert st.status.problem == "newer_version" and st.recoveries == 1
        aside = [p.name for p in state.glob("xid-state.json.*") if p.name != "xid-state.json.lock"]
        assert aside and aside[0].startswith(f"xid-state.json.newer-v{versions.XID.version + 1}-")
        assert not (state / "xid-state.json").exists()
        msg = caplog.text
        assert "written by a newer exporter" in msg and aside[0] in msg and "kernel log" in msg
        assert "corrupt" not in msg
    finally:
        sim.close()


def test_check_says_the_state_is_of_a_newer_version_and_leaves_it(tmp_path, capsys):
    state = copied(COMMITS[-1], tmp_path)
    path = newer(COMMITS[-1], state)
    before = path.read_bytes()
    main(["check", *sim_args(COMMITS[-1], state), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["sources"]["state_file"]["problem"] == "newer_version"
    assert any("newer_version" in p for p in out["problems"]), out["problems"]
    assert path.read_bytes() == before


def test_migrations_run_in_order_and_a_gap_or_a_bad_version_is_an_error():
    def v1_to_v2(doc: dict) -> dict:
        counts = doc["counts"]
        return {**doc, "counts": {p: {k: {"n": v[0]} for k, v in ks.items()} for p, ks in counts.items()}}

    schema = Schema("XID", 3, {1: v1_to_v2, 2: lambda d: {**d, "renamed": True}})
    up = schema.upgrade({"version": 1, "counts": {"p": {"94": [3, 1.0, 2.0]}}})
    assert up == {"version": 3, "counts": {"p": {"94": {"n": 3}}}, "renamed": True}
    with pytest.raises(StateError, match="version 1 has no migration to 3"):
        Schema("XID", 3, {2: lambda d: d}).upgrade({"version": 1})
    with pytest.raises(NewerVersion, match="version 4 was written by a newer exporter"):
        schema.upgrade({"version": 4})
    for bad in (None, True, 0, "1"):
        with pytest.raises(StateError, match="version is"):
            schema.upgrade({"version": bad})
