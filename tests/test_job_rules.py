"""rules/job.yml (issue 34): the shipped file is exporter.tools.job_rules' default rendering, its promtool
suite is tests/job_cases.py's output, a rendering with other settings is valid, and the negative
cases depend on what they claim (the checkpoint case fires once the checkpoint guard is gone)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from exporter.tools import job_rules
from tests import job_cases
from tests.helpers import HANG_GUARD_S, ROOT, promtool


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=HANG_GUARD_S)


def test_rules_file_is_the_default_rendering():
    assert (ROOT / "rules" / "job.yml").read_text() == job_rules.render(), \
        "rules/job.yml is stale: run .venv/bin/python -m exporter.tools.generate"


def test_suite_is_generated_from_the_cases():
    for path, day in ((job_cases.SUITE, False), (job_cases.DAY_SUITE, True)):
        assert path.read_text() == job_cases.text(day), \
            f"{path.name} is stale: run .venv/bin/python -m exporter.tools.generate"


def test_every_group_has_its_own_interval():
    groups = yaml.safe_load(job_rules.render())["groups"]
    every_minute = ("map", "jobs", "evidence", "baselines", "stall", "phase", "straggler", "slow")
    assert {g["name"]: g["interval"] for g in groups} == {
        **{f"job-health-{g}": "1m" for g in every_minute}, "job-health-history": "5m"}


def test_short_rendering_passes_promtool(tmp_path):
    """The live test's rendering (second-long windows) is valid, and carries its durations."""
    out = tmp_path / "job.yml"
    assert job_rules.main(["--out", str(out), "--interval", "2s", "--window", "8s",
                           "--evidence-window", "20s", "--stall-for", "10s", "--straggler-for", "10s",
                           "--keep-firing-for", "4s", "--carry", "10s", "--baseline-window", "60s",
                           "--baseline-samples", "8", "--slow-for", "10s", "--baseline-interval", "6s"]) == 0
    r = _promtool("check", "rules", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    text = out.read_text()
    assert "rate(gpu_tensor_active_seconds_total[8s])" in text and "for: 10s" in text
    assert "interval: 2s" in text and "interval: 6s" in text
    assert "last_over_time(instance_training_job:throughput:baseline[12s])" in text
    assert "quantile_over_time(0.5, instance_training_job:throughput:rate[60s])" in text
    assert ">= 8)" in text


def test_bad_duration_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        job_rules.main(["--stall-for", "ten minutes", "--out", "/nonexistent/x.yml"])
    assert e.value.code == 2
    assert "--stall-for" in capsys.readouterr().err


def _suite_with(tmp_path: Path, settings: job_rules.Settings | str, names: list[str]
                ) -> subprocess.CompletedProcess:
    """promtool on the cases `names` with the job rules rendered with `settings` (or that text)."""
    shutil.copytree(ROOT / "rules", tmp_path / "rules")  # the job rules read the others' alerts
    (tmp_path / "tests" / "rules").mkdir(parents=True)
    text = settings if isinstance(settings, str) else job_rules.render(settings)
    (tmp_path / "rules" / "job.yml").write_text(text)
    suite = job_cases.suite()
    suite["tests"] = [g for g in suite["tests"] if g["name"] in names]
    assert len(suite["tests"]) == len(names)
    path = tmp_path / "tests" / "rules" / "job.test.yml"
    path.write_text(yaml.safe_dump(suite))
    return _promtool("test", "rules", str(path))


CHECKPOINT = "checkpoint: 8 quiet minutes while a node writes to Lustre, no alert"
NCCL = "NCCL hang (4 nodes): application on every node within 10 minutes, resolved when the job ends"
END = "end of the job: processes gone, the epilog still holds the GPUs, no alert"


def test_negative_cases_fail_without_their_guard(tmp_path):
    """The checkpoint case fires once no write rate counts as a checkpoint, the end-of-job case once
    freed memory still counts as held; the NCCL hang goes unseen once SM activity of 0.2 counts as
    busy (every GPU busy: a job computing). The guards are what keeps them silent."""
    s = job_rules.Settings(checkpoint_write_bytes=1e18, memory_held=-1, progress_sm=0.1)
    r = _suite_with(tmp_path, s, [CHECKPOINT, NCCL, END])
    out = r.stdout + r.stderr
    assert r.returncode != 0
    for name in (CHECKPOINT, NCCL, END):
        assert name in out, name


def test_issue43_cases_fail_without_their_guard(tmp_path):
    """Each phase of issue 43 is judged by the signal it claims: a memory-bound phase reads as a stall
    once DRAM activity is no progress; a stuck rank hides the hang once a busy GPU is progress; the
    pipeline stages become stragglers once any change counts; a 50 ms storage stall is named
    application once the latency departure is never large enough."""
    s = job_rules.Settings(progress_dram=2, productive_dram=2, busy_share=0, straggler_change=-1,
                           lustre_latency_factor=1e9)
    names = [job_cases.MEMORY, job_cases.STUCK_RANK, job_cases.PIPELINE, job_cases.STORAGE_LATENCY]
    r = _suite_with(tmp_path, s, names)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    for name in names:
        assert name in out, name


def test_share_cases_fail_without_the_whole_view_guard(tmp_path):
    """A job's median taken over other GPUs than its baselines were moves every share with no GPU
    changing: without the guard that the job holds and works on as many GPUs as through its baseline
    window, a node whose exporter is gone, or whose processes exited first as the job ends, gets its
    healthy peer named a straggler."""
    text = job_rules.render()
    guard = [ln for ln in text.splitlines() if "== quantile_over_time(0.5, training_job:" in ln]
    assert len(guard) == 2, guard  # the GPU count's and the working share's
    for ln in guard:
        text = text.replace(ln + "\n", "")
    r = _suite_with(tmp_path, text, [job_cases.EXPORTER_GONE, job_cases.ENDS_APART])
    out = r.stdout + r.stderr
    assert r.returncode != 0
    for name in (job_cases.EXPORTER_GONE, job_cases.ENDS_APART):
        assert name in out, name


def test_stall_is_quiet_where_nccl_ras_answers():
    """The contract with rules/nccl.yml (issue 44): TrainingJobStalled is suppressed per job by
    training_job:nccl_ras_answering, matched on the job's labels (an absent series: no effect)."""
    rule = next(r for g in yaml.safe_load(job_rules.render())["groups"] for r in g["rules"]
                if r.get("alert") == "TrainingJobStalled")
    assert ("unless on (cluster, training_job, namespace, hpc_job) training_job:nccl_ras_answering"
            in rule["expr"])
