"""The workload sources and attribution tried as an adversary would (every test here
failed on the code before it): the mapping directory's temporary files, other producers' ids,
UUID-named files, non-regular files, a directory that never appears, forged cgroup paths, ids
that cannot be labels, clock steps, acks, the fresh reading of a live fault, and the drain
reason. The kubelet's parts are tests/test_workload_kubelet.py's."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time

import pytest

from exporter.attribution.fault import FaultAttribution
from exporter.attribution.history import WorkloadHistory
from exporter.attribution.ledger import Attribution
from exporter.catalog import Families
from exporter.collectors.workload import WorkloadCollector
from exporter.deadline import Pool
from exporter.runner import Runner
from exporter.web.landing import summarise
from exporter.workload import slurm_cgroup, slurm_mapping
from exporter.workload.model import Workload, WorkloadReading
from exporter.workload.source import Kind, SlurmMappingKind, WorkloadSource
from exporter.xid.store import Ack
from tests.helpers import HANG_GUARD_S, ROOT, START_HANG_GUARD_S, samples, scrape, test_pool, value
from tests.test_shell_scripts import unguarded_array_expansions
from tests.test_workload_attribution import drain_reason
from tests.test_workload_sources import GPUS, U, collector_ctx, job

POD = Workload(namespace="train", pod="llama-0", container="trainer")


def read(d, mig=None):
    return slurm_mapping.by_uuid(slurm_mapping.read_dir(str(d)), GPUS, mig)


# -- the mapping directory -----------------------------------------------------------------------
def test_leftover_prolog_temporary_files_never_hide_the_gpu_files(tmp_path):
    """4,200 `.N.XXXXXX` files sort before the digits; the first 4,096 names were kept before the
    non-GPU names were dropped, so every GPU read as idle."""
    for i in range(4200):
        (tmp_path / f".{i % 8}.{i:06d}").write_text("")
    for i in range(8):
        (tmp_path / str(i)).write_text(f"{100 + i}\n")
    out, problems = read(tmp_path)
    assert problems == []
    assert out == {U[i]: (job(str(100 + i)),) for i in range(8)}


def test_a_directory_over_the_entry_cap_says_so_and_calls_no_gpu_idle(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm_mapping, "MAX_ENTRIES", 50)
    for i in range(60):
        (tmp_path / f".x{i}").write_text("")
    out, problems = read(tmp_path)
    assert any("more than 50 entries" in p for p in problems)
    assert all(w for w in out.values())  # no GPU without a file read is reported idle


def test_more_gpu_files_than_the_cap_is_reported_and_the_rest_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm_mapping, "MAX_GPU_FILES", 4)
    for i in range(8):
        (tmp_path / str(i)).write_text("7\n")
    out, problems = read(tmp_path)
    assert any("over the limit of 4" in p for p in problems)
    assert len(out) == 4 and all(w == (job("7"),) for w in out.values())


def test_other_producers_ids_are_job_ids_and_a_non_slurm_shape_is_logged_once(tmp_path, caplog):
    """dcgm-exporter's own fixtures (job1-0, job3.0-0), a host-prefixed id, a PBS id, and a file
    with a job id and a free-text line: dcgm-exporter takes each line as it is, and one line
    not of Slurm's shape dropped the whole file (the job on that GPU lost)."""
    files = {"0": "job1-0\n", "1": "job1-1\njob2-1\n", "3.0": "job3.0-0", "4": "host-job-0\n",
             "5": "1234.pbs01\n", "6": "4242\nreserved for the llama run\n", "7": "17\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    kind = SlurmMappingKind(str(tmp_path))
    with caplog.at_level(logging.WARNING, "exporter.workload"):
        out, problems = kind.read(GPUS)
        kind.read(GPUS)
    assert problems == []
    assert out[U[0]] == (job("job1-0"),) and out[U[1]] == (job("job1-1"), job("job2-1"))
    assert out[U[3]] == (job("job3.0-0"),) and out[U[4]] == (job("host-job-0"),)
    assert out[U[5]] == (job("1234.pbs01"),)
    assert out[U[6]] == (job("4242"), job("reserved for the llama run"))
    assert out[U[2]] == () and out[U[7]] == (job("17"),)
    assert caplog.text.count("not of a Slurm job id's shape") == 1


def test_a_uuid_named_file_is_read_beside_an_index_named_one(tmp_path):
    """Slurm 25.11 puts GPU UUIDs in CUDA_VISIBLE_DEVICES, and prologs name files by them."""
    (tmp_path / U[2]).write_text("77\n")
    (tmp_path / "2").write_text("78\n")
    (tmp_path / U[5]).write_text("79\n")
    mig = "MIG-0b8c5a1e-2f6c-5d1a-9c1e-7a1b2c3d4e5f"
    (tmp_path / mig).write_text("80\n")
    (tmp_path / "GPU-ffffffff-0000-0000-0000-000000000000").write_text("81\n")  # no such GPU
    out, problems = read(tmp_path, {mig: U[6]})
    assert out[U[2]] == (job("77"), job("78")) and out[U[5]] == (job("79"),) and out[U[6]] == (job("80"),)
    assert problems == ["mapping file for GPU-ffffffff-0000-0000-0000-000000000000, which NVML does not list"]
    _, problems = read(tmp_path)  # without NVML's MIG devices: a problem, never a guess
    assert any(mig in p for p in problems)


def test_a_symlink_fifo_or_dangling_link_is_reported_by_name_never_its_content(tmp_path, caplog):
    """A symlinked mapping file had the first 40 characters of its target quoted in the log
    (pointed at /etc/shadow, a password hash); a FIFO or dangling symlink read as an idle GPU."""
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$saltsalt$hashhashhash:19000:0:99999:7:::\n")
    d = tmp_path / "map"
    d.mkdir()
    (d / "0").symlink_to(secret)
    os.mkfifo(d / "1")
    (d / "2").symlink_to(tmp_path / "nowhere")
    (d / "3").mkdir()
    (d / "4").write_text("42\n")
    out, problems = read(d)
    assert set(out) == set(U) - {U[0], U[1], U[2], U[3]} and out[U[4]] == (job("42"),)
    assert any(f"{d / '0'} is a symbolic link" in p for p in problems)
    assert any(f"{d / '1'} is a FIFO" in p for p in problems)
    assert any(f"{d / '2'} is a symbolic link" in p for p in problems)
    assert any(f"{d / '3'} is a directory" in p for p in problems)
    _, _, ctx = collector_ctx(tmp_path, slurm_job_mapping_dir=str(d))
    runner = Runner([WorkloadCollector(ctx)], deadline_s=5, pool=test_pool())
    with caplog.at_level(logging.DEBUG):
        s = samples(scrape(runner))
    runner.close()
    assert value(s, "gpu_health_exporter_workload_source_up", source="slurm_mapping") == 0
    assert "root:" not in caplog.text and "hash" not in caplog.text and "a symbolic link" in caplog.text


def test_oversized_files_are_refused_before_they_are_read(tmp_path):
    """1,000 MIG-named files of 60 KB each gave 6 million job ids and 706 MB."""
    blob = "".join(f"{i}\n" for i in range(20_000)).encode()[:60_000]
    for i in range(1000):
        (tmp_path / f"{i % 8}.{i}").write_bytes(blob)
    found = slurm_mapping.read_dir(str(tmp_path))
    assert found.jobs == {} and found.bad == set(range(8))
    assert any("60000 bytes, over the 16384" in p for p in found.problems)


def test_a_configured_directory_missing_past_the_grace_is_a_source_problem(tmp_path):
    """A directory that never appears read as every GPU idle with the source up."""
    now = [0.0]
    kind = SlurmMappingKind(str(tmp_path / "never"), missing_grace_s=600, mono=lambda: now[0])
    assert kind.read(GPUS) == ({u: () for u in U}, [])  # no job has run since boot yet
    now[0] = 601
    out, problems = kind.read(GPUS)
    assert out == {} and "does not exist 601s after start" in problems[0]
    _, _, ctx = collector_ctx(tmp_path, slurm_job_mapping_dir=str(tmp_path / "never"),
                              slurm_job_mapping_missing_seconds=0)
    out_f = Families()
    reading = WorkloadCollector(ctx).collect(out_f)
    assert reading.by_uuid == {}
    s = samples(scrape(Runner([WorkloadCollector(ctx)], deadline_s=5, pool=test_pool())))
    assert value(s, "gpu_health_exporter_workload_source_up", source="slurm_mapping") == 0
    assert not [k for k in s if k[0] == "gpu_workload_info"]
    assert summarise(out_f, None).problems == {
        "workload": ["source slurm_mapping: could not tell which workload holds some GPUs (see the log)"]}


# -- the job mapping prolog ----------------------------------------------------------------------
def run_mapping(action, d, **env):
    full = {"PATH": os.environ["PATH"], "GPU_HEALTH_JOB_MAPPING_DIR": str(d), **env}
    return subprocess.run([str(ROOT / "deploy/slurm/job-mapping.sh"), action], env=full, capture_output=True,
                          text=True, timeout=HANG_GUARD_S)


def test_the_prolog_writes_uuid_named_files_the_exporter_reads(tmp_path):
    d = tmp_path / "map"
    visible = f"{U[1]},{U[4]},3"
    r = run_mapping("add", d, SLURM_JOB_ID="4242", SLURM_JOB_GPUS="1,4", CUDA_VISIBLE_DEVICES=visible,
                    GPU_HEALTH_JOB_MAPPING_NAMES="uuid")
    assert r.returncode == 0 and "entry '3' is not a GPU or MIG UUID" in r.stderr
    assert sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) == sorted([U[1], U[4]])
    out, problems = read(d)
    assert problems == [] and out[U[1]] == out[U[4]] == (job("4242"),) and out[U[0]] == ()
    assert run_mapping("remove", d, SLURM_JOB_ID="4242").returncode == 0
    assert [p.name for p in d.iterdir()] == [".lock"]


def test_the_epilog_with_nothing_to_clear_runs_under_set_u_without_an_unbound_array(tmp_path):
    """`"${targets[@]}"` of an empty array is an unbound variable to bash 4.2 under set -u."""
    d = tmp_path / "map"
    d.mkdir()
    r = run_mapping("remove", d, SLURM_JOB_ID="4242")
    assert r.returncode == 0 and "unbound" not in r.stderr
    # Debian's bash 5 does not fail on the construct: the lint does (tests/test_shell_scripts.py)
    assert unguarded_array_expansions((ROOT / "deploy/slurm/job-mapping.sh").read_text()) == []


# -- cgroups ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("forged", [
    "0::/user.slice/user-1000.slice/user@1000.service/app.slice/x_slurmstepd.scope/job_4242/step_0\n",
    "0::/user.slice/user-1000.slice/session-3.scope/slurmstepd.scope/job_4242\n",
    "0::/system.slice/docker.service/x/slurmstepd.scope/job_4242\n",  # a delegated subtree
    "4:memory:/user.slice/user-1000.slice/uid_1000/job_4242/step_0\n",  # v1, not under /slurm
    "4:memory:/slurm/x/uid_1000/job_4242\n",
    "12:pids:/system.slice/slurmstepd.scope/job_4242\n",  # a v2 shape on a v1 controller's line
    "0::/slurm/uid_1000/job_4242\n",  # a v1 shape on the unified line
])
def test_a_job_id_a_user_can_forge_is_not_a_job(forged):
    assert slurm_cgroup.parse_cgroup(forged) is None


# -- one rule for what a GPU holds ---------------------------------------------------------------
class Fixed(Kind):
    name = "fixed"

    def __init__(self, held):
        self.held = held

    def read(self, gpus):
        return dict(self.held), []


@pytest.mark.parametrize("bad", [Workload(hpc_job="9" * 300),
                                 Workload(namespace="train", pod="llama\n0", container="c"),
                                 Workload(hpc_job="42\u2028rm")])
def test_an_id_that_cannot_be_a_label_makes_the_gpu_unknown_in_the_series_and_attribution(bad):
    """A 300-digit id or a pod name with a newline: gpu_workload_info showed it while attribution
    made the GPU idle."""
    pool = Pool()
    try:
        history = WorkloadHistory()
        src = WorkloadSource([Fixed({U[0]: (bad, job("7")), U[1]: (job("8"),)})], 2.0, 8, pool,
                             listeners=[history.observe])
        obs = src.observe(GPUS[:2])
        assert U[0] not in obs.reading.by_uuid and obs.reading.by_uuid[U[1]] == (job("8"),)
        assert "GPU 0: a workload id that is not printable" in obs.problems["fixed"][0]
        t = obs.reading.mono
        assert history.at(U[0], t) is None and history.at(U[1], t) == (job("8"),)
    finally:
        pool.close()


def test_max_per_gpu_cannot_exceed_what_attribution_keeps(tmp_path):
    with pytest.raises(Exception, match="max_per_gpu"):
        collector_ctx(tmp_path, slurm_job_mapping_dir=str(tmp_path), max_per_gpu=100)


# -- time ------------------------------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.mono, self.wall = 1000.0, 1_800_000_000.0

    def advance(self, s):
        self.mono += s
        self.wall += s

    def step(self, s):  # the wall clock alone
        self.wall += s


def test_a_backward_clock_step_neither_drops_readings_nor_blames_the_earlier_job():
    """After a step back of S seconds every reading was dropped as late for S seconds, and an XID
    was blamed on the job that held the GPU before the step."""
    c = Clock()
    h = WorkloadHistory()
    fa = FaultAttribution(h, Ids(), mono=lambda: c.mono, wall=lambda: c.wall)

    def reading(held):
        r = WorkloadReading(c.wall, {U[0]: held}, c.mono)
        h.observe(r)
        return r
    reading((job("42"),))
    c.advance(15)
    c.step(-3600)  # NTP steps the wall clock back an hour
    reading((job("43"),))  # job 43 took the GPU
    c.advance(15)
    reading((job("43"),))
    c.advance(1)
    rec = fa.xid("00000000:53:00", 79, c.wall - 8, kernel_s=c.mono - 8)  # backlog (over LIVE_S late)
    assert rec.workloads == (job("43"),) and rec.mono == c.mono - 8
    fa.fresh = lambda nb: reading((job("43"),))
    assert fa.xid("00000000:53:00", 94, c.wall, kernel_s=c.mono).workloads == (job("43"),)  # live


def test_an_ack_clears_what_came_before_it_whatever_the_wall_clock_did():
    before = Attribution("00000000:53:00", "xid", 94, "", 1_800_000_000.0, (job("42"),), mono=100.0)
    after = Attribution("00000000:53:00", "xid", 94, "", 1_799_996_500.0, (job("43"),), mono=200.0)
    ack = Ack("00000000:53:00", 0, U[0], None, 1_799_996_400.0, {}, mono=150.0)  # wall stepped back
    assert before.cleared_by([ack]) and not after.cleared_by([ack])
    assert Ack.from_json(json.loads(json.dumps(ack.to_json()))).mono == 150.0


class Ids:
    def labels(self, pci, ask_nvml=True):
        return ("0", U[0], pci)

    def to_state(self):
        return {"00000000:53:00": {"index": 0, "uuid": U[0]}}


class Gated(Kind):
    """Returns what the GPUs held when its read started; its first read waits for `gate`."""

    name = "gated"

    def __init__(self):
        self.world = {U[0]: ()}
        self.gate, self.started = threading.Event(), threading.Event()
        self.calls = 0

    def read(self, gpus):
        self.calls += 1
        seen = dict(self.world)
        if self.calls == 1:
            self.started.set()
            self.gate.wait(10)
        return seen, []


def test_the_fresh_reading_of_a_live_fault_starts_after_it_never_joins_one_in_flight():
    """A pod that took the GPU just before the fault was reported as "no workload": the fresh
    reading joined a reading already in flight, which saw the GPU idle."""
    pool = Pool()
    try:
        kind = Gated()
        src = WorkloadSource([kind], 5.0, 8, pool)
        scrape_ = threading.Thread(target=src.observe, args=(GPUS[:1],))
        scrape_.start()
        assert kind.started.wait(START_HANG_GUARD_S)
        kind.world = {U[0]: (POD,)}  # the pod takes the GPU; the fault follows
        fault = time.monotonic()
        got = []
        t = threading.Thread(target=lambda: got.append(src.observe(GPUS[:1], not_before=fault)))
        t.start()
        kind.gate.set()
        t.join(START_HANG_GUARD_S)
        scrape_.join(START_HANG_GUARD_S)
        assert got[0].reading.by_uuid == {U[0]: (POD,)} and got[0].reading.mono >= fault
        assert kind.calls == 2
    finally:
        pool.close()


def test_a_live_fault_without_a_reading_after_it_is_unknown_never_the_last_scrape():
    c = Clock()
    h = WorkloadHistory()
    fa = FaultAttribution(h, Ids(), mono=lambda: c.mono, wall=lambda: c.wall)
    h.observe(WorkloadReading(c.wall, {U[0]: ()}, c.mono))  # the last scrape: idle
    c.advance(10)
    stale = WorkloadReading(c.wall - 5, {U[0]: ()}, c.mono - 5)  # started before the fault
    fa.fresh = lambda nb: stale
    assert fa.xid("00000000:53:00", 94, c.wall, kernel_s=c.mono).workloads is None
    fa.fresh = None
    assert fa.xid("00000000:53:00", 95, c.wall, kernel_s=c.mono).workloads is None



def test_an_xid_logged_just_before_the_daemon_started_is_backlog_not_the_next_jobs():
    """A record logged a second before start-up was read as live (under LIVE_S old): the first
    reading, taken after a new job took the GPU, named that job (a loaded host's start-up order)."""
    c = Clock()
    h = WorkloadHistory()
    fa = FaultAttribution(h, Ids(), mono=lambda: c.mono, wall=lambda: c.wall)  # the daemon starts
    c.advance(0.5)
    h.observe(WorkloadReading(c.wall, {U[0]: (job("5555"),)}, c.mono))  # its first reading
    fa.fresh = lambda nb: WorkloadReading(c.wall, {U[0]: (job("5555"),)}, c.mono)
    assert fa.xid("00000000:53:00", 31, c.wall - 1.5, kernel_s=c.mono - 1.5).workloads is None
    c.advance(0.5)
    assert fa.xid("00000000:53:00", 79, c.wall, kernel_s=c.mono).workloads == (job("5555"),)  # live

# -- text ------------------------------------------------------------------------------------------
def report(reasons, xids, hits, node_reasons=None):
    return {"node": {"verdict": "replace_required", "reasons": node_reasons or [], "gpu_count": 8,
                     "expected_gpus": 8},
            "gpus": [{"gpu": 1, "verdict": "replace_required", "reasons": reasons, "xids": xids,
                      "workloads_hit": hits}], "nvswitch_sxids": []}


def hit(xid, jid):
    return {"event": "xid", "xid": xid, "workload_known": True,
            "workloads": [{"kind": "slurm", "hpc_job": jid}]}


def test_the_drain_reason_names_only_the_workloads_of_the_events_behind_it(tmp_path):
    """The wrapper named the workloads of any XID (an application's XID 13) when the verdict's
    reason was something else."""
    r = drain_reason(tmp_path, report(["row_remap_failure"],
                                      [{"xid": 13, "tier": "application", "acknowledged": False}],
                                      [hit(13, "777")]))
    assert r == "update NodeName=n1 State=DRAIN Reason=gpu-health: GPU 1 replace (row_remap_failure)"


def test_the_drain_reason_is_printable_single_line_text(tmp_path):
    """The drain reason could carry U+2028."""
    xids = [{"xid": 94, "tier": "replace", "acknowledged": False}]
    r = drain_reason(tmp_path, report(["xid_replace"], xids,
                                      [hit(94, "42\u2028State=RESUME"), hit(94, "43\x1b[2J")]))
    assert r == ("update NodeName=n1 State=DRAIN Reason=gpu-health: GPU 1 replace (xid_replace: XID 94; "
                 "job 42 State=RESUME,job 43 [2J)")
