"""The workload source's Slurm kinds and its reading rules: the mapping directory in
dcgm-exporter's format, NVML's processes mapped through generated /proc trees (cgroup v1 and
v2), what a reading says when a kind fails or hangs, the per-GPU limit, readings from another
thread, and the collector's series."""

import os
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.catalog import Families
from exporter.collectors.workload import WorkloadCollector, WorkloadSection, from_config
from exporter.config import load
from exporter.deadline import Pool
from exporter.nvml.fake import FakeBackend, load_capture
from exporter.nvml.session import DeviceIdentity, NvmlSession
from exporter.profiles import PROFILES
from exporter.runner import Runner
from exporter.tools.simulate.nvml_synth import node_capture
from exporter.web.landing import summarise
from exporter.workload import slurm_cgroup, slurm_mapping
from exporter.workload.model import Workload, WorkloadReading
from exporter.workload.source import Kind, SlurmCgroupKind, SlurmMappingKind, WorkloadSource
from tests.helpers import (
    DEADLINE_MARGIN_S,
    START_HANG_GUARD_S,
    promtool_check_metrics,
    samples,
    scrape,
    test_pool,
    value,
)
from tests.test_xid_service import make_ctx

P5 = PROFILES["p5.48xlarge"]
GPUS = [DeviceIdentity(i, f"GPU-{i:08d}-0000-0000-0000-000000000000", f"00000000:{i:02x}:00.0", "H100")
        for i in range(8)]
U = [g.uuid for g in GPUS]


def job(j):
    return Workload(hpc_job=j)


# --- the mapping directory --------------------------------------------------------------------

def test_names_are_gpu_indexes_or_mig_instances_and_other_files_are_ignored():
    assert slurm_mapping.parse_name("2") == 2
    assert slurm_mapping.parse_name("2.1") == 2
    for other in ("2.tmp.123", ".lock", "gpu2", "2.", "", "-1", "2.1.1", "\u0663"):  # an Arabic-Indic 3
        assert slurm_mapping.parse_name(other) is None


def test_a_mapping_directory_as_hyperpod_writes_it(tmp_path):
    d = tmp_path / "dcgm_job_mapping"
    d.mkdir()
    (d / "2").write_text("1001\n")
    (d / "5").write_text("1001\n1002\n")  # two jobs share GPU 5
    (d / "3.0").write_text("1003\n")  # a MIG instance of GPU 3
    (d / "3.1").write_text("1004\n\n")
    (d / ".2.lock").write_text("")
    out, problems = slurm_mapping.by_uuid(slurm_mapping.read_dir(str(d)), GPUS)
    assert problems == []
    assert out[U[2]] == (job("1001"),)
    assert out[U[5]] == (job("1001"), job("1002"))
    assert out[U[3]] == (job("1003"), job("1004"))
    assert out[U[0]] == () and len(out) == 8  # the others observed idle


def test_a_missing_directory_means_no_job(tmp_path):
    out, problems = slurm_mapping.by_uuid(slurm_mapping.read_dir(str(tmp_path / "none")), GPUS)
    assert problems == [] and out == {u: () for u in U}


def test_a_bad_line_is_dropped_and_named_by_its_number_the_file_kept(tmp_path):
    (tmp_path / "1").write_text("1001\n4\x002\n" + "7" * 300 + "\n1002\n")
    (tmp_path / "2").write_text("\x1b[2J\n")  # nothing usable: GPU 2 holds something unknown
    (tmp_path / "9").write_text("1005\n")  # no GPU 9 on this node
    out, problems = slurm_mapping.by_uuid(slurm_mapping.read_dir(str(tmp_path)), GPUS)
    assert out[U[1]] == (job("1001"), job("1002")) and U[2] not in out and out[U[0]] == ()
    assert any(str(tmp_path / "1") in p and "line(s) 2, 3" in p for p in problems)
    assert not any("777" in p or "\x1b" in p for p in problems)  # the line's number, never its text
    assert any("GPU 9" in p for p in problems)


def test_array_and_heterogeneous_job_ids_are_ids():
    assert slurm_mapping.parse_jobs(b"123_4\n77+1\n 9 \r\n").jobs == ["123_4", "77+1", "9"]


@settings(max_examples=200, derandomize=True)
@given(st.binary(max_size=400))
def test_no_bytes_make_the_parser_raise_or_keep_an_id_that_cannot_be_a_label(data):
    parsed = slurm_mapping.parse_jobs(data)
    assert len(parsed.jobs) <= slurm_mapping.MAX_JOBS_PER_FILE
    assert all(j and j.isprintable() and len(j) <= slurm_mapping.MAX_JOB_ID_CHARS and j == j.strip()
               for j in parsed.jobs)


# --- cgroups of NVML's processes --------------------------------------------------------------

V2 = "0::/system.slice/slurmstepd.scope/job_{j}/step_0/user/task_0\n"
V2_MULTI = "0::/system.slice/node-7_slurmstepd.scope/job_{j}/step_batch/slurm\n"
V1 = ("12:pids:/slurm/uid_1000/job_{j}/step_0/task_0\n11:devices:/slurm/uid_1000/job_{j}/step_0\n"
      "1:name=systemd:/system.slice/slurmd.service\n")
V1_PREPEND = "4:memory:/cluster7/uid_0/job_{j}/step_extern\n"  # CgroupPrepend=/cluster7, configured
NOT_A_JOB = ["0::/system.slice/sshd.service\n", "0::/kubepods/pod1234/abc\n",
             "0::/system.slice/slurmstepd.scope/system\n", "0::/user.slice/job_12/x\n"]


@settings(max_examples=200, derandomize=True)
@given(st.text(max_size=300))
def test_no_cgroup_text_makes_the_parser_raise_or_invent_a_non_numeric_job(text):
    job = slurm_cgroup.parse_cgroup(text)
    assert job is None or (job.isascii() and job.isdigit())


@pytest.mark.parametrize("shape", [V2, V2_MULTI, V1])
def test_the_job_of_a_cgroup_in_each_shape(shape):
    assert slurm_cgroup.parse_cgroup(shape.format(j=4242)) == "4242"


def test_another_cgroup_root_counts_once_configured():
    assert slurm_cgroup.parse_cgroup(V1_PREPEND.format(j=4242)) is None
    assert slurm_cgroup.parse_cgroup(V1_PREPEND.format(j=4242), ["/cluster7"]) == "4242"


@pytest.mark.parametrize("text", NOT_A_JOB)
def test_processes_outside_slurm_have_no_job(text):
    assert slurm_cgroup.parse_cgroup(text) is None


def fake_p5():
    fake = FakeBackend(node_capture(P5, load_capture()))
    session = NvmlSession(fake, pool=test_pool())
    assert session.ensure()
    return fake, session


def proc_tree(root, cgroups):
    for pid, text in cgroups.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(text)
    return str(root)


@pytest.mark.parametrize("shape", [V1, V2])
def test_jobs_from_the_processes_on_each_gpu(tmp_path, shape):
    fake, session = fake_p5()
    procfs = proc_tree(tmp_path / "proc", {1: "0::/init.scope\n", 101: shape.format(j=7),
                                          102: shape.format(j=7), 201: shape.format(j=8), 301: NOT_A_JOB[0]})
    procs = {2: [101], 5: [102, 201], 6: [301], 7: [999]}  # 999: exited since NVML listed it
    for i, pids in procs.items():
        fake.set_value(i, "nvmlDeviceGetComputeRunningProcesses", [{"pid": p, "usedGpuMemory": 1 << 30}
                                                                   for p in pids])
    gpus = session.devices
    out, problems = SlurmCgroupKind(session, procfs).read(gpus)
    assert problems == []
    by_index = {g.index: out[g.uuid] for g in gpus}
    assert by_index[2] == (job("7"),)
    assert by_index[5] == (job("7"), job("8"))
    assert by_index[6] == () and by_index[7] == () and by_index[0] == ()  # no job: never invented


def test_a_procfs_that_hides_other_users_processes_is_a_failure_not_idle_gpus(tmp_path):
    fake, session = fake_p5()
    procfs = proc_tree(tmp_path / "proc", {os.getpid(): V2.format(j=7)})  # only our own process
    fake.set_value(2, "nvmlDeviceGetComputeRunningProcesses", [{"pid": 4321}])
    with pytest.raises(RuntimeError, match="ProtectProc=invisible"):
        SlurmCgroupKind(session, procfs).read(session.devices)


def test_a_gpu_whose_processes_cannot_be_listed_is_not_observed(tmp_path):
    fake, session = fake_p5()
    (tmp_path / "1").mkdir()
    fake.fail(3, "nvmlDeviceGetComputeRunningProcesses", 999)
    fake.fail(3, "nvmlDeviceGetGraphicsRunningProcesses", 999)
    out, problems = SlurmCgroupKind(session, str(tmp_path)).read(session.devices)
    assert session.devices[3].uuid not in out and len(out) == 7
    assert problems and "GPU 3" in problems[0]


# --- the reading ------------------------------------------------------------------------------

class Fixed(Kind):
    def __init__(self, name, found, problems=(), hang=None, fail=None):
        self.name, self.found, self.problems, self.hang, self.fail = name, found, list(problems), hang, fail
        self.calls = 0

    def read(self, gpus):
        self.calls += 1
        if self.hang is not None:
            self.hang.wait()
        if self.fail:
            raise OSError(self.fail)
        return dict(self.found), self.problems


def test_a_gpu_is_observed_only_when_every_kind_observed_it():
    a = Fixed("a", {U[0]: (job("1"),), U[1]: (), U[2]: ()})
    b = Fixed("b", {U[0]: (), U[1]: (Workload(namespace="n", pod="p", container="c"),)})
    r = WorkloadSource([a, b], 1.0, 8, Pool()).read(GPUS)
    assert r.by_uuid == {U[0]: (job("1"),), U[1]: (Workload(namespace="n", pod="p", container="c"),)}


def test_a_failed_kind_observes_nothing_and_says_why():
    src = WorkloadSource([Fixed("a", {u: () for u in U}), Fixed("b", {}, fail="socket gone")], 1.0, 8, Pool())
    obs = src.observe(GPUS)
    assert obs.reading.by_uuid == {} and obs.failed == ["b"] and obs.problems == {"b": ["socket gone"]}


def test_a_hung_kind_misses_the_deadline_and_is_not_read_again_until_it_returns():
    release = threading.Event()
    hung = Fixed("hung", {u: () for u in U}, hang=release)
    src = WorkloadSource([Fixed("ok", {u: () for u in U}), hung], 0.3, 8, Pool())
    t = time.monotonic()
    obs = src.observe(GPUS)
    assert time.monotonic() - t < DEADLINE_MARGIN_S  # the 0.3 s deadline; the kind hangs until released
    assert obs.failed == ["hung"] and "0.3s" in obs.problems["hung"][0] and obs.reading.by_uuid == {}
    obs = src.observe(GPUS)
    assert "not read again" in obs.problems["hung"][0] and hung.calls == 1
    release.set()
    deadline = time.monotonic() + START_HANG_GUARD_S
    while src.observe(GPUS).failed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert src.observe(GPUS).reading.by_uuid == {u: () for u in U}


def test_the_per_gpu_limit_keeps_the_first_workloads_and_counts_the_rest():
    many = tuple(job(str(1000 + i)) for i in range(5))
    obs = WorkloadSource([Fixed("a", {U[0]: many, U[1]: ()})], 1.0, 3, Pool()).observe(GPUS)
    assert obs.reading.by_uuid[U[0]] == many[:3] and obs.overflow == {U[0]: 2}


def test_readings_from_another_thread_share_the_one_in_flight_and_set_latest():
    gate = threading.Event()
    kind = Fixed("a", {U[0]: (job("1"),)}, hang=gate)
    src = WorkloadSource([kind], 5.0, 8, Pool())
    got = []
    threads = [threading.Thread(target=lambda: got.append(src.read(GPUS))) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + START_HANG_GUARD_S
    while kind.calls == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    gate.set()
    for t in threads:
        t.join(START_HANG_GUARD_S)
    assert len(got) == 3 and all(isinstance(r, WorkloadReading) and r.by_uuid == {U[0]: (job("1"),)}
                                 for r in got)
    assert kind.calls <= 3 and src.latest is not None and src.latest.by_uuid == {U[0]: (job("1"),)}


# --- config and the collector -----------------------------------------------------------------

def test_off_unless_a_kind_is_configured():
    assert load(None).section(WorkloadSection).enabled is False
    assert from_config(load(None), NvmlSession(FakeBackend({}), pool=test_pool()), Pool()) is None
    cfg = load(None, {"workload.slurm_job_mapping_dir": "/run/slurm/dcgm_job_mapping"})
    src = from_config(cfg, NvmlSession(FakeBackend({}), pool=test_pool()), Pool())
    assert cfg.section(WorkloadSection).enabled and [type(k) for k in src.kinds] == [SlurmMappingKind]


def test_flags_set_the_kinds():
    from exporter import arguments

    args = arguments.build_parser().parse_args(["--workload.slurm-job-mapping-dir", "/m",
                                                "--workload.slurm-cgroup",
                                                "--workload.kubelet-socket", "/k.sock"])
    o = arguments.cli_overrides(args)
    assert o["workload.slurm_job_mapping_dir"] == "/m" and o["workload.slurm_cgroup"] is True
    assert o["workload.kubelet_socket"] == "/k.sock"


def collector_ctx(tmp_path, **overrides):
    fake, session = fake_p5()
    ctx = make_ctx(tmp_path, "", nvml=session)
    ctx.config = load(None, {**{"paths.procfs": str(tmp_path / "proc")},
                             **{f"workload.{k}": v for k, v in overrides.items()}})
    ctx.workload = from_config(ctx.config, session, ctx.pool)
    return fake, session, ctx


def test_one_info_series_per_gpu_per_job_none_for_idle_gpus(tmp_path):
    d = tmp_path / "map"
    d.mkdir()
    _, session, ctx = collector_ctx(tmp_path, slurm_job_mapping_dir=str(d))
    runner = Runner([WorkloadCollector(ctx)], deadline_s=5, pool=test_pool())
    text = scrape(runner)
    assert "gpu_workload_info{" not in text
    (d / "2").write_text("4242\n")
    (d / "5").write_text("4242\n4243\n")
    text = scrape(runner)
    assert promtool_check_metrics(text) == ""
    s = samples(text)
    info = sorted((dict(ls)["gpu"], dict(ls)["hpc_job"]) for (n, ls) in s if n == "gpu_workload_info")
    assert info == [("2", "4242"), ("5", "4242"), ("5", "4243")]
    assert value(s, "gpu_workload_info", gpu="2", hpc_job="4242", uuid=session.devices[2].uuid) == 1
    assert all(set(dict(ls)) == {"gpu", "uuid", "hpc_job"} for (n, ls) in s if n == "gpu_workload_info")
    assert runner.readings["workload"].by_uuid[session.devices[5].uuid] == (job("4242"), job("4243"))
    (d / "2").unlink()
    (d / "5").unlink()
    assert "gpu_workload_info{" not in scrape(runner)  # gone within one collection of the end
    runner.close()


def test_a_broken_kind_fails_the_collector_with_its_reason(tmp_path):
    f = tmp_path / "not-a-dir"
    f.write_text("")
    _, _, ctx = collector_ctx(tmp_path, slurm_job_mapping_dir=str(f))
    runner = Runner([WorkloadCollector(ctx)], deadline_s=5, pool=test_pool())
    s = samples(scrape(runner))
    assert value(s, "gpu_health_exporter_collector_success", collector="workload") == 0
    assert str(f) in runner.status["workload"].error
    assert runner.readings["workload"].by_uuid == {}  # handed over: nothing observed
    runner.close()


def test_a_partly_bad_directory_marks_the_source_and_keeps_the_rest(tmp_path):
    d = tmp_path / "map"
    d.mkdir()
    (d / "1").write_text("not\ta job\n")  # a control character: not an id
    (d / "2").write_text("7\n")
    _, _, ctx = collector_ctx(tmp_path, slurm_job_mapping_dir=str(d))
    runner = Runner([WorkloadCollector(ctx)], deadline_s=5, pool=test_pool())
    s = samples(scrape(runner))
    assert value(s, "gpu_health_exporter_workload_source_up", source="slurm_mapping") == 0
    assert value(s, "gpu_workload_info", gpu="2", hpc_job="7") == 1
    runner.close()
    out = Families()
    WorkloadCollector(ctx).collect(out)
    assert summarise(out, None).problems == {
        "workload": ["source slurm_mapping: could not tell which workload holds some GPUs (see the log)"]}


def test_overflow_is_exported_per_gpu(tmp_path):
    d = tmp_path / "map"
    d.mkdir()
    (d / "0").write_text("".join(f"{i}\n" for i in range(1, 6)))
    _, _, ctx = collector_ctx(tmp_path, slurm_job_mapping_dir=str(d), max_per_gpu=2)
    runner = Runner([WorkloadCollector(ctx)], deadline_s=5, pool=test_pool())
    s = samples(scrape(runner))
    assert value(s, "gpu_health_exporter_workload_overflow", gpu="0") == 3
    assert len([1 for (n, _) in s if n == "gpu_workload_info"]) == 2
    runner.close()


# --- the simulated node -----------------------------------------------------------------------

def test_the_simulated_node_shows_a_slurm_job_and_pods(tmp_path):
    """`--simulate p5.48xlarge --scenario slurm-job --scenario k8s-pods`, as the quick start runs it
    (the composition root: config overrides from the simulation, its fake NVML, its gRPC server)."""
    from exporter.arguments import build_parser
    from exporter.startup import build_context

    args = build_parser().parse_args(["--simulate", "p5.48xlarge", "--scenario", "slurm-job",
                                      "--scenario", "k8s-pods"])
    ctx, sim = build_context(args)
    try:
        runner = Runner([WorkloadCollector(ctx)], deadline_s=5, pool=test_pool())
        text = scrape(runner)
        assert promtool_check_metrics(text) == ""  # both label sets in one family
        s = samples(text)
        info = [dict(ls) for (n, ls) in s if n == "gpu_workload_info"]
        jobs = {x["gpu"] for x in info if "hpc_job" in x}
        pods = {x["gpu"]: x["pod"] for x in info if "pod" in x}
        assert jobs == {str(i) for i in range(8)}
        assert pods == {**{str(i): "llama-pretrain-0" for i in range(4)},
                        **{str(i): "llama-pretrain-1" for i in range(4, 8)}}
        assert value(s, "gpu_health_exporter_workload_source_up", source="kubelet") == 1  # efa0 is no GPU
        runner.close()
    finally:
        sim.close()
