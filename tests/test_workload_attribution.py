"""Fault attribution: which workloads an XID or SXid hit, after the workload
ended, never invented for an idle GPU or an event from before the GPU was observed, cleared by an
ack, kept across a restart. The history is fed WorkloadReadings built here (the contract of
exporter.workload.model); events come from kernel-log files as the daemon reads them."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.attribution.history import STAND_S, WorkloadHistory
from exporter.attribution.ledger import MAX_PER_GPU, Attribution, AttributionLedger
from exporter.collectors.nvswitch import NvswitchCollector
from exporter.collectors.xid import XidCollector
from exporter.commands import ack as ack_cmd
from exporter.commands import check
from exporter.runner import Runner
from exporter.workload.model import Workload, WorkloadReading
from exporter.xid.attribution_state import STATE_NAME, validate_section, validate_state
from exporter.xid.parser import pci_key
from exporter.xid.service import one_shot
from tests.helpers import HANG_GUARD_S, ROOT, promtool_check_metrics, samples, scrape, test_pool
from tests.test_xid_service import fake_p5, make_ctx

JOB42, JOB43 = Workload(hpc_job="42"), Workload(hpc_job="43")
POD = Workload(namespace="train", pod="llama-0", container="trainer")
T0 = 1_800_000_000.0


# -- the history ---------------------------------------------------------------------------------
def history(*readings: tuple[float, dict]) -> WorkloadHistory:
    h = WorkloadHistory()
    for at, by_uuid in readings:
        h.observe(WorkloadReading(at, by_uuid))
    return h


def test_an_event_while_the_job_runs_names_it():
    h = history((T0, {"GPU-a": (JOB42,)}), (T0 + 15, {"GPU-a": (JOB42,)}))
    assert h.at("GPU-a", T0 + 7) == (JOB42,)
    assert h.at("GPU-a", T0 + 15) == (JOB42,)


def test_only_a_set_seen_on_both_sides_of_an_event_is_its_answer():
    # The XID at T0+20 may have killed the job, or the job may have ended before it: which side
    # the change was on is unknown, so the backlog's answer is unknown (a live event gets a
    # reading after it instead: FaultAttribution).
    h = history((T0, {"GPU-a": (JOB42,)}), (T0 + 15, {"GPU-a": (JOB42,)}), (T0 + 30, {"GPU-a": ()}),
                (T0 + 45, {"GPU-a": ()}))
    assert h.at("GPU-a", T0 + 20) is None
    # idle on both sides: a job could have started and died between the readings
    assert h.at("GPU-a", T0 + 40) is None


def test_an_event_before_the_gpu_was_observed_is_unknown_never_the_current_job():
    h = history((T0, {"GPU-a": (JOB42,)}))
    assert h.at("GPU-a", T0 - 1) is None  # backfill at start-up, or an XID older than the job
    assert h.at("GPU-b", T0) is None  # a GPU the source never observed
    h.observe(WorkloadReading(T0 + 10, {"GPU-b": (JOB43,)}))
    assert h.at("GPU-b", T0 + 5) is None  # GPU-b first observed at T0+10


def test_a_gpu_missing_from_a_reading_is_not_observed_by_it_and_a_long_gap_brackets_nothing():
    h = history((T0, {"GPU-a": (JOB42,), "GPU-b": ()}), (T0 + 15, {"GPU-b": ()}),
                (T0 + 60, {"GPU-a": (JOB42,)}), (T0 + 60 + STAND_S + 1, {"GPU-a": (JOB42,)}))
    assert h.at("GPU-a", T0 + 30) == (JOB42,)  # the reading at T0+15 did not observe GPU-a
    assert h.at("GPU-a", T0 + 60 + STAND_S) is None  # no reading of it for STAND_S: unknown


def test_two_jobs_sharing_a_gpu_are_both_named():
    h = history((T0, {"GPU-a": (JOB43, JOB42, JOB42)}))
    assert h.at("GPU-a", T0) == (JOB42, JOB43)


def test_a_workload_that_cannot_be_kept_makes_the_gpu_unknown_never_idle():
    """A 300-digit job id or a pod name with a newline made the GPU "idle" in
    attribution while gpu_workload_info showed the workload."""
    for bad in (Workload(hpc_job="9" * 300), Workload(namespace="ns", pod="p\nq", container="c"),
                Workload(hpc_job="4\u20282"), Workload(hpc_job="7", pod="p")):
        h = history((T0, {"GPU-a": (bad, JOB42)}), (T0 + 15, {"GPU-a": (bad, JOB42)}))
        assert h.at("GPU-a", T0 + 5) is None and h.rejected == 2, bad
    # and a reading holding one breaks the bracket of the readings around it
    h = history((T0, {"GPU-a": (JOB42,)}), (T0 + 5, {"GPU-a": (Workload(hpc_job="x\ny"),)}),
                (T0 + 15, {"GPU-a": (JOB42,)}))
    assert h.at("GPU-a", T0 + 3) is None and h.at("GPU-a", T0 + 10) is None


def test_a_late_reading_is_refused_but_a_wall_clock_step_drops_nothing():
    h = history((T0, {"GPU-a": (JOB42,)}))
    h.observe(WorkloadReading(T0 - 100, {"GPU-a": (JOB43,)}))  # older than what is known
    assert h.at("GPU-a", T0) == (JOB42,)
    # after a backward step of the wall clock, readings ordered by the wall clock would be dropped
    # as late for as long as the step; ordered by the monotonic clock they are kept
    h = WorkloadHistory()
    h.observe(WorkloadReading(T0, {"GPU-a": (JOB42,)}, mono=100.0))
    h.observe(WorkloadReading(T0 - 3600, {"GPU-a": (JOB43,)}, mono=115.0))  # the wall clock stepped back
    h.observe(WorkloadReading(T0 - 3585, {"GPU-a": (JOB43,)}, mono=130.0))
    assert h.at("GPU-a", 120.0) == (JOB43,)


SETS = [(), (JOB42,), (JOB43,), (JOB42, JOB43), (POD,)]


@given(st.lists(st.tuples(st.one_of(st.floats(0.01, 3.0), st.floats(0.01, STAND_S * 1.5)),
                          st.sampled_from(range(len(SETS)))), max_size=40),
       st.lists(st.floats(-100, STAND_S * 40), max_size=20))
def test_the_history_answers_what_the_readings_on_both_sides_of_the_event_saw(steps, events):
    """Property: for readings in time order (within the kept hour), at(t) is the set of the last
    reading at or before t when the first reading at or after t saw the same non-empty set, no
    more than STAND_S apart; None otherwise."""
    h, seen, at = WorkloadHistory(keep_s=1e9), [], T0
    for gap, i in steps:
        at += gap
        h.observe(WorkloadReading(at, {"GPU-a": SETS[i]}))
        seen.append((at, tuple(sorted(SETS[i]))))
    near = [a - T0 + d for a, _ in seen[:10] for d in (-1.0, -0.5, 0.0, 0.5)]
    for dt in events + near:
        t = T0 + dt
        before = [(a, ws) for a, ws in seen if a <= t][-1:]
        after = [(a, ws) for a, ws in seen if a >= t][:1]
        want = None
        if before and after and before[0][1] == after[0][1] and before[0][1]:
            # every reading between them saw it too, none further apart than STAND_S
            run = [(a, ws) for a, ws in seen if before[0][0] <= a <= after[0][0]]
            if all(ws == before[0][1] for _, ws in run) and \
                    all(b[0] - a[0] <= STAND_S for a, b in zip(run, run[1:], strict=False)):
                want = before[0][1]
        assert h.at("GPU-a", t) == want


def test_the_ledger_keeps_the_last_few_per_gpu_and_a_repeat_updates_the_time():
    led = AttributionLedger()
    for i in range(MAX_PER_GPU + 3):
        led.add(Attribution("00000000:53:00", "xid", 13, "", T0 + i, (Workload(hpc_job=str(i)),)))
    led.add(Attribution("00000000:53:00", "xid", 13, "", T0 + 99, (Workload(hpc_job="5"),)))
    recs = led.records()
    assert len(recs) == MAX_PER_GPU
    assert [r.workloads[0].hpc_job for r in recs][-1] == "5" and recs[-1].time == T0 + 99
    # events that name no workload (idle, unknown) give way before those that do
    for code in (31, 43, 48):
        led.add(Attribution("00000000:53:00", "xid", code, "", T0 + 100 + code, None))
    led.add(Attribution("00000000:53:00", "xid", 79, "", T0 + 200, (JOB42,)))
    recs = led.records()  # 31 took the oldest job's place, 43 and 48 each the one before it,
    assert len(recs) == MAX_PER_GPU  # and 79 (a job) the last unknown's
    assert [r.workloads for r in recs if r.code != 13] == [(JOB42,)]
    assert [r.workloads[0].hpc_job for r in recs if r.code == 13] == ["4", "6", "7", "8", "9", "10", "5"]


def test_a_gpu_ack_clears_its_records_up_to_its_time_and_an_xid_ack_only_that_xid():
    from exporter.xid.store import Ack

    led = AttributionLedger()
    gpu0, gpu1 = "00000000:53:00", "00000000:64:00"
    led.add(Attribution(gpu0, "xid", 94, "", T0, (JOB42,)))
    led.add(Attribution(gpu0, "xid", 13, "", T0, (JOB42,)))
    led.add(Attribution(gpu0, "sxid", 20034, "00000000:06:00", T0, (JOB42,)))
    led.add(Attribution(gpu1, "sxid", 20034, "00000000:06:00", T0, (JOB42,)))
    led.add(Attribution(gpu0, "xid", 94, "", T0 + 60, (JOB43,)))  # after the acks below
    only_94 = Ack(gpu0, 0, "GPU-0", 94, T0 + 10, {})
    assert {(r.code, r.pci) for r in led.visible([only_94])} == {
        (13, gpu0), (20034, gpu0), (20034, gpu1), (94, gpu0)}
    assert [r.workloads for r in led.visible([only_94]) if r.code == 94] == [(JOB43,)]
    whole = Ack(gpu0, 0, "GPU-0", None, T0 + 10, {})
    assert {(r.code, r.pci) for r in led.visible([whole])} == {(20034, gpu1), (94, gpu0)}
    led.prune([whole])
    assert len(led.records()) == 2


# -- through the XID service ---------------------------------------------------------------------
def kernel_usec(svc, wall: float) -> int:
    """The kernel-log timestamp the service's clock maps to unix time `wall`."""
    return int((wall - (time.time() - svc.clock.now())) * 1e6)


def xid_line(seq: int, usec: int, xid: int, pci: str = "0000:53:00") -> str:
    return f"3,{seq},{usec},-;NVRM: Xid (PCI:{pci}): {xid}, pid=77, name=python, Ch 00000008\n"


def sxid_line(seq: int, usec: int) -> str:
    return (f"3,{seq},{usec},-;nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, "
            "Link 48 LTSSM Fault Up\n")


class Node:
    """An XID service on a simulated p5 (fake NVML), its kernel log a file we append to."""

    def __init__(self, tmp_path, text: str | None = "") -> None:
        self.tmp_path = tmp_path
        self.fake, session = fake_p5()
        self.world: dict[int, tuple[Workload, ...]] | None = None  # what the GPUs hold now (hold())
        self.ctx = make_ctx(tmp_path, text, nvml=session, fresh=self._fresh)
        self.svc = self.ctx.xid
        # The tests date readings and events up to a minute back: the daemon ran by then (an event
        # before its start is backlog, exporter.attribution.fault).
        self.svc.attribution.started = time.monotonic() - 60
        self.uuid = {d.index: d.uuid for d in session.devices}
        self.pci = {d.index: pci_key(d.pci_bus_id) for d in session.devices}
        self.seq = 1000 if text == "" else 5000

    def now_usec(self, offset_s: float = 0.0) -> int:
        return kernel_usec(self.svc, time.time() + offset_s)

    def observe(self, at: float, by_index: dict[int, tuple[Workload, ...]]) -> None:
        """A reading taken at unix time `at` (its monotonic time as far back as `at` is)."""
        mono = time.monotonic() - (time.time() - at)
        self.ctx.workloads.observe(WorkloadReading(at, {self.uuid[i]: w for i, w in by_index.items()}, mono))

    def hold(self, by_index: dict[int, tuple[Workload, ...]]) -> None:
        """What the GPUs hold now (those not named are not observed): what a reading after a live
        event sees; the source's fresh reading of the composition root, faked."""
        self.world = dict(by_index)

    def _fresh(self, not_before: float) -> WorkloadReading | None:
        """The source's fresh reading of the composition root, faked: none before hold()."""
        if self.world is None:
            return None
        held = {self.uuid[i]: w for i, w in self.world.items()}
        r = WorkloadReading(time.time(), held, time.monotonic())
        self.ctx.workloads.observe(r)
        return r

    def log(self, line_of_seq) -> None:
        self.seq += 1
        with open(self.tmp_path / "kmsg", "a") as f:
            f.write(line_of_seq(self.seq))
        self.svc.read_kmsg()

    def scrape(self) -> dict:
        return samples(scrape(Runner([XidCollector(self.ctx), NvswitchCollector(self.ctx)], deadline_s=5,
                pool=test_pool())))


def hits(s: dict, name: str = "gpu_xid_workload_last_seen_timestamp_seconds") -> set[tuple]:
    out = set()
    for (n, ls), _ in s.items():
        if n == name:
            d = dict(ls)
            out.add((d.get("gpu", d.get("switch")), d.get("xid", d.get("sxid")), d["hpc_job"], d["pod"]))
    return out


def test_an_xid_names_the_job_in_the_log_line_the_series_and_the_state_file_after_it_ended(tmp_path, caplog):
    node = Node(tmp_path)
    one_shot(node.ctx)
    node.svc.counter.log_events = True
    now = time.time()
    node.observe(now - 30, {0: (JOB42,), 1: ()})
    node.hold({0: (JOB42,), 1: ()})
    with caplog.at_level(logging.WARNING, "exporter.xid"):
        node.log(lambda seq: xid_line(seq, node.now_usec(-1), 79))  # live: a reading after it sees job 42
        node.log(lambda seq: xid_line(seq, node.now_usec(-1), 13, "0000:64:00"))  # GPU 1 was idle
    node.observe(time.time(), {0: (), 1: ()})  # the epilog removed job 42's mapping
    assert "XID 79 counted on GPU 0" in caplog.text and "workloads: slurm job 42" in caplog.text
    assert "XID 13 counted on GPU 1" in caplog.text and "no workload (the GPU was idle)" in caplog.text
    s = node.scrape()
    assert hits(s) == {("0", "79", "42", "")}  # none for the idle GPU
    assert promtool_check_metrics(scrape(Runner([XidCollector(node.ctx)], deadline_s=5,
            pool=test_pool()))) == ""
    node.svc.flush_state(force=True)
    doc = json.loads((tmp_path / "state" / "xid-state.json").read_text())
    recs = validate_section(doc["workload"])
    assert {(r.code, r.workloads) for r in recs} == {(79, (JOB42,)), (13, ())}


def test_the_same_xid_under_two_jobs_in_turn_is_attributed_to_each_exactly(tmp_path):
    node = Node(tmp_path)
    one_shot(node.ctx)
    now = time.time()
    # the backlog (counted over LIVE_S late): from the readings on both sides of each event
    node.observe(now - 100, {4: (JOB42,)})
    node.observe(now - 85, {4: (JOB42,)})
    node.observe(now - 80, {4: ()})  # job 42 ended
    node.observe(now - 60, {4: (JOB43,)})  # job 43 started
    node.observe(now - 45, {4: (JOB43,)})
    node.observe(now - 40, {4: ()})
    node.observe(now - 20, {4: ()})
    node.log(lambda seq: xid_line(seq, node.now_usec(-90), 13, "0000:97:00"))  # job 42's
    node.log(lambda seq: xid_line(seq, node.now_usec(-50), 13, "0000:97:00"))  # job 43's
    node.log(lambda seq: xid_line(seq, node.now_usec(-30), 13, "0000:97:00"))  # idle both sides: unknown
    node.hold({4: ()})
    node.log(lambda seq: xid_line(seq, node.now_usec(-0.5), 13, "0000:97:00"))  # live: nobody's
    recs = sorted(node.svc.attribution.ledger.records(), key=lambda r: r.time)
    assert [r.workloads for r in recs] == [(JOB42,), (JOB43,), None, ()]
    assert hits(node.scrape()) == {("4", "13", "42", ""), ("4", "13", "43", "")}


def test_the_backlog_at_start_up_is_unknown_never_the_current_workload(tmp_path, caplog):
    # XIDs in the ring buffer from before the exporter (and the workload source) started.
    node = Node(tmp_path, None)
    backlog = xid_line(1, node.now_usec(-60), 94) + xid_line(2, node.now_usec(-10), 31)
    (tmp_path / "kmsg").write_text(backlog)
    node.observe(time.time() - 5, {0: (JOB43,)})  # job 43 runs now, observed after both XIDs
    node.svc.counter.log_events = True
    with caplog.at_level(logging.WARNING, "exporter.xid"):
        one_shot(node.ctx)
    assert caplog.text.count("workload unknown") == 2 and "43" not in caplog.text
    assert hits(node.scrape()) == set()
    assert {r.workloads for r in node.svc.attribution.ledger.records()} == {None}


def test_two_jobs_sharing_a_gpu_both_get_a_series(tmp_path):
    node = Node(tmp_path)
    one_shot(node.ctx)
    node.hold({2: (JOB42, POD)})
    node.log(lambda seq: xid_line(seq, node.now_usec(-1), 48, "0000:75:00"))
    assert hits(node.scrape()) == {("2", "48", "42", ""), ("2", "48", "", "llama-0")}


def test_an_sxid_is_attributed_to_the_workloads_on_every_gpu(tmp_path, caplog):
    node = Node(tmp_path)
    one_shot(node.ctx)
    node.svc.sxid_counter.log_events = True
    node.hold({0: (JOB42,), 1: (JOB42,), 5: (POD,), 6: ()})
    with caplog.at_level(logging.WARNING, "exporter.sxid"):
        node.log(lambda seq: sxid_line(seq, node.now_usec(-1)))
    assert "slurm job 42" in caplog.text and "pod train/llama-0" in caplog.text
    name = "gpu_nvswitch_sxid_workload_last_seen_timestamp_seconds"
    assert hits(node.scrape(), name) == {("1", "20034", "42", ""), ("1", "20034", "", "llama-0")}
    by_gpu = {r.pci: r.workloads for r in node.svc.attribution.ledger.records()}
    assert by_gpu[node.pci[0]] == (JOB42,) and by_gpu[node.pci[5]] == (POD,) and by_gpu[node.pci[6]] == ()
    assert by_gpu[node.pci[7]] is None
    assert len(by_gpu) == 8  # the GPUs never observed are unknown, not skipped


def test_an_ack_clears_the_gpu_and_a_later_event_is_attributed_again(tmp_path):
    node = Node(tmp_path)
    one_shot(node.ctx)
    node.svc.start()  # the daemon: the follower thread writes the state files
    try:
        node.hold({0: (JOB42,), 1: (JOB43,)})
        node.log(lambda seq: xid_line(seq, node.now_usec(-2), 94))
        node.log(lambda seq: xid_line(seq, node.now_usec(-2), 94, "0000:64:00"))
        assert len(hits(node.scrape())) == 2
        node.svc.flush_state(force=True)
        # `gpu-health-exporter ack --gpu 0` in its own process (a second context on the same files)
        other = Node(tmp_path, None)
        assert ack_cmd.run(argparse.Namespace(gpu="0", xid=None), other.ctx) == 0
        assert hits(node.scrape()) == {("1", "94", "43", "")}  # GPU 0's cleared; GPU 1's stay
        # the ack reached the daemon with its monotonic time: it clears by it, not by the wall clock
        assert [a.mono is not None and a.mono <= time.monotonic() for a in node.svc.snapshot().acks] == [True]
        node.hold({0: (JOB43,)})
        node.log(lambda seq: xid_line(seq, node.now_usec(), 95))
        assert hits(node.scrape()) == {("1", "94", "43", ""), ("0", "95", "43", "")}
    finally:
        node.svc.stop()
    recs = validate_section(json.loads((tmp_path / "state" / "xid-state.json").read_text())["workload"])
    assert {(r.pci, r.code) for r in recs} == {("00000000:64:00", 94), ("00000000:53:00", 95)}


def test_a_restart_keeps_the_attribution_through_the_state_file(tmp_path):
    node = Node(tmp_path)
    one_shot(node.ctx)
    node.hold({3: (POD,)})
    node.log(lambda seq: xid_line(seq, node.now_usec(-1), 63, "0000:86:00"))
    node.svc.flush_state(force=True)
    # A new process: the history is empty, the kernel log holds the XID already counted.
    again = Node(tmp_path, None)
    one_shot(again.ctx)
    assert hits(again.scrape()) == {("3", "63", "", "llama-0")}
    assert again.svc.attribution.ledger.records()[0].workloads == (POD,)


def doc(*row) -> dict:
    return {"version": 1, "boot_id": "boot-1", "kmsg": "k", "records": [list(row)]}


@pytest.mark.parametrize("bad", [
    doc("00000000:53:00", "xid", 1000, "", 1.0, None),  # not an XID
    doc("00000000:53:00", "xid", 79, "", float("nan"), None),
    doc("00000000:53:00", "xid", 79, "", 1.0, [["4\u00002", "", "", ""]]),  # a control character
    doc("00000000:53:00", "xid", 79, "", 1.0, [["\ud800", "", "", ""]]),  # not encodable
    doc("00000000:53:00", "xid", 79, "", 1.0, [["x" * 300, "", "", ""]]),
    doc("00000000:53:00", "xid", 79, "", 1.0, [["42", "ns", "pod", ""]]),  # a job and a pod at once
    doc("00000000:53:00", "sxid", 20034, "", 1.0, None),  # an SXid without its switch
    doc("junk", "xid", 79, "", 1.0, None),
])
def test_a_bad_state_file_is_refused_with_the_field_named_and_ignored(tmp_path, bad, caplog):
    with pytest.raises(ValueError, match=r"records\[0\]"):
        validate_state(bad)
    node = Node(tmp_path)
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "state" / STATE_NAME).write_text(json.dumps({**bad, "kmsg": str(tmp_path / "kmsg")}))
    with caplog.at_level(logging.WARNING):
        one_shot(node.ctx)
    # refused naming the field, and set aside as every state file is (exporter.state.file)
    assert "workload state file" in caplog.text and "records[0]" in caplog.text
    assert node.svc.attribution.ledger.records() == []
    assert [a.read_text() for a in (tmp_path / "state").glob(f"{STATE_NAME}.corrupt-*")] == [
        json.dumps({**bad, "kmsg": str(tmp_path / "kmsg")})]


# -- check and the Slurm health check ------------------------------------------------------------
def drain_reason(tmp_path, report: dict) -> str:
    """The `scontrol update` deploy/slurm/gpu-health-check.sh runs for `report`, check's JSON with
    exit status 2 (action required), against a fake exporter and scontrol."""
    rep = tmp_path / "report.json"
    rep.write_text(json.dumps(report))
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "exporter").write_text(f"#!/bin/sh\ncat {rep}\nexit 2\n")
    (fake / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'scontrol.log'}\n"
                                   "[ \"$1\" = show ] && echo '   State=IDLE ThreadsPerCore=2'\nexit 0\n")
    for f in fake.iterdir():
        f.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "GPU_HEALTH_EXPORTER": str(fake / "exporter"),
           "GPU_HEALTH_PYTHON": sys.executable, "SCONTROL": str(fake / "scontrol"),
           "GPU_HEALTH_HYPERPOD": "no", "GPU_HEALTH_CHECK_CONFIG": "/nonexistent", "SLURMD_NODENAME": "n1"}
    subprocess.run([str(ROOT / "deploy/slurm/gpu-health-check.sh")], env=env, check=True,
                   timeout=HANG_GUARD_S,
                   capture_output=True)
    return (tmp_path / "scontrol.log").read_text().splitlines()[-1]


def test_check_and_the_slurm_drain_reason_name_the_job_after_it_ended(tmp_path, capsys):
    node = Node(tmp_path)
    one_shot(node.ctx)
    node.observe(time.time() - 30, {1: ()})
    node.hold({1: (JOB42,)})  # job 42 started since the last scrape
    node.log(lambda seq: xid_line(seq, node.now_usec(-0.5), 94, "0000:64:00"))
    node.hold({1: ()})  # the job died of it; its epilog removed the mapping
    node.log(lambda seq: xid_line(seq, node.now_usec(), 13, "0000:64:00"))  # idle by then
    node.svc.flush_state(force=True)
    # `check` in its own process: the state files, the kernel log, NVML (no workload source)
    ctx = Node(tmp_path, None).ctx
    nv, svc, problems = check.gather(ctx)
    doc = check.to_json(nv, svc, problems, 2, ctx)
    g1 = next(g for g in doc["gpus"] if g["gpu"] == 1)
    assert [(e["event"], e["xid"], e["workload_known"], e["workloads"]) for e in g1["workloads_hit"]] == [
        ("xid", 94, True, [{"kind": "slurm", "hpc_job": "42"}]), ("xid", 13, True, [])]
    assert all(not g["workloads_hit"] for g in doc["gpus"] if g["gpu"] != 1)
    text = check.table(nv, problems, 2, ctx, svc)
    assert "GPU 1 (00000000:64:00.0) XID 94 at " in text and ": workloads: slurm job 42" in text
    assert "XID 13 at" in text and "no workload (the GPU was idle)" in text

    # deploy/slurm/gpu-health-check.sh drains with that report (check's exit 2: action required)
    update = drain_reason(tmp_path, doc)
    assert update == ("update NodeName=n1 State=DRAIN "
                      "Reason=gpu-health: GPU 1 replace (xid_replace: XID 94; job 42)")


# -- the fleet dashboard's table, through Prometheus' engine (promtool) --------------------------
def test_the_fleet_table_lists_the_jobs_hit_within_the_range_after_they_ended(tmp_path):
    from dashboards.build import dashboards
    from tests.helpers import promtool

    panel = next(p for p in dashboards()["gpu-health-fleet"]["panels"] if p["title"] == "Faults by job")
    exprs = [t["expr"].replace("$__range_s", "3600").replace("$__range", "1h").replace("$cluster", ".*")
             .replace("$instance", ".+") for t in panel["targets"]]
    node = 'cluster="c1", instance="gpu-node-1", job="gpu-health-exporter"'
    xid = f'gpu_xid_workload_last_seen_timestamp_seconds{{{node}, gpu="1", uuid="GPU-1", ' \
          'pci_bus_id="00000000:64:00.0", xid="94", namespace="", pod="", container=""'
    sxid = f'gpu_nvswitch_sxid_workload_last_seen_timestamp_seconds{{{node}, switch="1", ' \
           'pci_bus_id="00000000:06:00.0", sxid="20034", hpc_job="", container="c"'
    suite = {"evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            # job 42 hit at 15m, acknowledged at 40m (its series gone): in the range ending at 70m
            {"series": xid + ', hpc_job="42"}', "values": "_x15 900x25"},
            # job 7 hit at 1m, before the range: not listed although its series still stands
            {"series": xid.replace('xid="94"', 'xid="79"') + ', hpc_job="7"}', "values": "60x70"},
            {"series": sxid + ', namespace="train", pod="llama-0"}', "values": "_x30 1800x40"},
        ],
        "promql_expr_test": [
            {"expr": exprs[0], "eval_time": "70m", "exp_samples": [
                {"labels": '{cluster="c1", instance="gpu-node-1", hpc_job="42", xid="94"}', "value": 9e5}]},
            {"expr": exprs[1], "eval_time": "70m", "exp_samples": [
                {"labels": '{cluster="c1", instance="gpu-node-1", namespace="train", pod="llama-0", '
                           'sxid="20034"}', "value": 1.8e6}]},
        ]}]}
    path = tmp_path / "fleet.test.yml"
    path.write_text(json.dumps(suite))
    r = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stdout + r.stderr
