"""deploy/slurm/active-check-prolog.sh as the Prolog of a real single-node Slurm
(tests/test_slurm.run_cluster), the exporter's `active` command on the simulated p5.48xlarge with
a fake dcgmi: a job runs after a pass, the next job reuses the pass (dcgmi not run again), and a
DCGM failure of ISOLATE severity fails the prolog, so Slurm drains the node and requeues the job.
HealthCheckProgram is not involved (it stays the passive check)."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import FIXTURES, ROOT, wait_for
from tests.test_slurm import need, run_cluster
from tests.test_workload_slurm import job_state

pytestmark = pytest.mark.slow

DIAG = FIXTURES / "diag"


@pytest.fixture(scope="module")
def prolog_cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("slurm-active")
    d.chmod(0o755)
    state = d / "state"
    ran = d / "dcgmi-ran"
    mode = d / "dcgmi-output"  # the fixture the fake dcgmi prints, and its exit status
    mode.write_text(f"{DIAG / 'dcgm4-diag-r3-pass-h100x8-assembled.json'} 0\n")
    dcgmi = d / "dcgmi"
    dcgmi.write_text(f"#!/bin/sh\necho \"$@\" >> {ran}\nread f code < {mode}\ncat \"$f\"\nexit $code\n")
    exporter = d / "gpu-health-exporter"  # this checkout's exporter, whatever Slurm's environment
    exporter.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m exporter \"$@\"\n")
    config = d / "config.yaml"
    config.write_text(f"active:\n  dcgmi: {dcgmi}\n  dcgm_level: 1\n")
    prolog = d / "prolog.sh"  # Slurm runs the Prolog with a bare environment: say where things are
    prolog.write_text(
        f"#!/bin/sh\nexport GPU_HEALTH_CHECK_CONFIG=/nonexistent GPU_HEALTH_EXPORTER={exporter} "
        f"GPU_HEALTH_ACTIVE_CHECKS=nvml,dcgm GPU_HEALTH_ACTIVE_BUDGET=120 "
        f"GPU_HEALTH_ACTIVE_ARGS='--simulate p5.48xlarge --config {config} --path.state-dir {state}'\n"
        f"exec {ROOT}/deploy/slurm/active-check-prolog.sh\n")
    for f in (dcgmi, exporter, prolog):
        f.chmod(0o755)
    with run_cluster(d, f"PrologFlags=Alloc\nProlog={prolog}\n", health_check=False) as c:
        c.ran, c.mode, c.state = ran, mode, state
        yield c


def job(cluster) -> str:
    r = cluster.run([need("sbatch"), "--parsable", "-o", "/dev/null", "--wrap", "true"])
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def ended(cluster, j: str) -> bool:
    return job_state(cluster, j) in ("GONE", "COMPLETED")


def test_pass_then_cached_pass_then_a_failure_drains_and_requeues(prolog_cluster):
    c = prolog_cluster
    ctl = c.logs / "slurmctld.log"
    first = job(c)
    wait_for(lambda: ended(c, first), 180, "the first job to complete", log=ctl)
    assert c.ran.read_text().split() == ["diag", "-r", "1", "-j"]  # the checks ran once
    assert (c.state / "active" / "dcgm.json").exists()

    second = job(c)
    wait_for(lambda: ended(c, second), 180, "the second job to complete", log=ctl)
    assert c.ran.read_text().count("diag") == 1  # a recent pass: nothing run
    assert c.node()["State"] == "IDLE"

    # a GPU to isolate: the next prolog that runs the checks fails
    c.mode.write_text(f"{DIAG / 'dcgm4-diag-r2-fail-isolate-constructed.json'} 205\n")
    (c.state / "active" / "dcgm.json").unlink()  # the cached pass is gone
    third = job(c)
    try:
        wait_for(lambda: "DRAIN" in c.node().get("State", ""), 180, "the node drained", log=ctl)
        n = c.node()
        assert "Prolog" in n.get("Reason", ""), n
        state = job_state(c, third)
        assert state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING"), state
        assert c.ran.read_text().count("diag") == 2
    finally:
        c.run([need("scancel"), third])
        c.reset()
