"""deploy/slurm/prolog.sh and epilog.sh (through job-mapping.sh) run as real scripts: the mapping
directory they write is what the exporter reads; running one twice changes nothing; two jobs on
one GPU keep each other's line; many at once lose no line and leave no temporary file; bad input
never fails the job."""

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from exporter.workload import slurm_mapping
from tests.helpers import HANG_GUARD_S, ROOT

SLURM = ROOT / "deploy" / "slurm"


def run(script, d, job, gpus, **extra):
    env = {**os.environ, "GPU_HEALTH_JOB_MAPPING_DIR": str(d), "SLURM_JOB_ID": str(job),
           "SLURM_JOB_GPUS": gpus, **extra}
    return subprocess.run([str(SLURM / script)], env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)


def jobs(d):
    return {i: sorted(j) for i, j in slurm_mapping.read_dir(str(d)).jobs.items()}


def files(d):
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def test_prolog_and_epilog_write_and_clear_the_directory(tmp_path):
    d = tmp_path / "run/slurm/dcgm_job_mapping"  # created on the first job
    assert run("prolog.sh", d, 4242, "2,5").returncode == 0
    assert jobs(d) == {2: ["4242"], 5: ["4242"]}
    assert (d / "2").read_text() == "4242\n" and oct((d / "2").stat().st_mode & 0o777) == "0o644"
    assert run("epilog.sh", d, 4242, "2,5").returncode == 0
    assert jobs(d) == {} and files(d) == [".lock"]


def test_running_twice_changes_nothing(tmp_path):
    for _ in range(2):
        assert run("prolog.sh", tmp_path, 7, "0-2").returncode == 0
    assert jobs(tmp_path) == {0: ["7"], 1: ["7"], 2: ["7"]}
    assert (tmp_path / "1").read_text() == "7\n"
    for _ in range(2):
        assert run("epilog.sh", tmp_path, 7, "0-2").returncode == 0
    assert jobs(tmp_path) == {}


def test_two_jobs_sharing_a_gpu_keep_each_other(tmp_path):
    run("prolog.sh", tmp_path, 100, "5")
    run("prolog.sh", tmp_path, 101, "5,6")
    assert jobs(tmp_path) == {5: ["100", "101"], 6: ["101"]}
    run("epilog.sh", tmp_path, 100, "5")
    assert jobs(tmp_path) == {5: ["101"], 6: ["101"]}
    run("epilog.sh", tmp_path, 101, "5,6")
    assert jobs(tmp_path) == {}


def test_the_epilog_clears_the_job_even_without_its_gpu_list(tmp_path):
    run("prolog.sh", tmp_path, 300, "1,4")
    (tmp_path / "4.1").write_text("300\n301\n")  # a MIG instance's file, as AWS's scripts may write
    run("prolog.sh", tmp_path, 301, "4")
    run("epilog.sh", tmp_path, 300, "")
    assert jobs(tmp_path) == {4: ["301"]} and (tmp_path / "4.1").read_text() == "301\n"


def test_an_aws_lifecycle_file_is_kept_and_extended(tmp_path):
    (tmp_path / "3").write_text("900\n")  # written by HyperPod's own prolog
    run("prolog.sh", tmp_path, 901, "3")
    assert jobs(tmp_path) == {3: ["900", "901"]}


def test_many_jobs_at_once_lose_no_line_and_leave_no_temporary_file(tmp_path):
    n = 24
    with ThreadPoolExecutor(8) as pool:
        rcs = list(pool.map(lambda j: run("prolog.sh", tmp_path, 1000 + j, "0,1").returncode, range(n)))
    assert rcs == [0] * n
    want = sorted(str(1000 + j) for j in range(n))
    assert jobs(tmp_path) == {0: want, 1: want}
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda j: run("epilog.sh", tmp_path, 1000 + j, "0,1"), range(0, n, 2)))
    assert jobs(tmp_path) == {0: want[1::2], 1: want[1::2]}
    assert files(tmp_path) == [".lock", "0", "1"]


@pytest.mark.parametrize(("job", "gpus"), [("", "1"), ("12;rm", "1"), ("5", ""), ("5", "a,../x")])
def test_bad_input_never_fails_the_job_and_writes_nothing_wrong(tmp_path, job, gpus):
    r = run("prolog.sh", tmp_path / "m", job, gpus)
    assert r.returncode == 0
    assert jobs(tmp_path / "m") == {}
    assert not any(p.name.startswith("..") for p in tmp_path.rglob("*"))


def test_an_unwritable_directory_never_fails_the_job(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    r = run("prolog.sh", f / "m", 5, "1")
    assert r.returncode == 0 and "cannot" in r.stderr


@pytest.mark.parametrize("script", ["job-mapping.sh", "prolog.sh", "epilog.sh"])
def test_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(SLURM / script)], timeout=HANG_GUARD_S).returncode == 0
