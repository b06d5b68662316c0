"""The workload source with a real single-node Slurm (tests/test_slurm.run_cluster): a gres.conf of
8 GPUs on device nodes made here (mknod, major 195), the shipped deploy/slurm/prolog.sh and
epilog.sh installed as Slurm's Prolog and Epilog, and the exporter (simulated p5.48xlarge) reading
the mapping directory they write. Jobs running side by side fill the GPUs (Slurm hands out the
lowest free ones), two are cancelled to free GPUs 2 and 5, and a real job then holding GPUs 2 and 5
is in gpu_workload_info in the first collection after it starts running, and gone in the first
collection after it ended, while the other jobs stay."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import requests

from tests.helpers import ROOT, samples, start_exporter, stop_within, wait_for
from tests.test_slurm import NODE, need, run_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("slurm-gpus")
    dev = d / "dev"
    dev.mkdir()
    for i in range(8):
        os.mknod(dev / f"nvidia{i}", 0o666 | stat.S_IFCHR, os.makedev(195, i))
    mapping = d / "dcgm_job_mapping"
    # Slurm runs its Prolog and Epilog with a bare environment: these wrappers only say where
    # the mapping directory is (the shipped default is /run/slurm/dcgm_job_mapping), then run
    # the shipped scripts.
    for name in ("prolog", "epilog"):
        w = d / f"{name}.sh"
        w.write_text(f"#!/bin/sh\nexport GPU_HEALTH_JOB_MAPPING_DIR={mapping}\n"
                     f"exec {ROOT}/deploy/slurm/{name}.sh\n")
        w.chmod(0o755)
    (d / "gres.conf").write_text(f"NodeName={NODE} Name=gpu File={dev}/nvidia[0-7]\n")
    # GPUs and cores as consumable resources, so jobs run side by side (8 CPUs declared on a
    # smaller host: config_overrides); PrologFlags=Alloc: the Prolog has run before the job runs.
    conf = (f"GresTypes=gpu\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
            f"SlurmdParameters=config_overrides\nPrologFlags=Alloc\nProlog={d}/prolog.sh\n"
            f"Epilog={d}/epilog.sh\n")
    with run_cluster(d, conf, "Gres=gpu:8", cpus=8, health_check=False) as c:
        c.mapping = mapping
        yield c


def workloads(url):
    """{gpu: [hpc_job, ...]} from one scrape (one collection)."""
    out = {}
    for (n, ls) in samples(requests.get(url, timeout=10).text):
        if n == "gpu_workload_info":
            out.setdefault(dict(ls)["gpu"], []).append(dict(ls)["hpc_job"])
    return {g: sorted(j) for g, j in out.items()}


def sbatch(cluster, gpus, seconds, until: Path | None = None):
    """A job of `seconds`, or one that ends on its own as soon as the file `until` exists (at most
    `seconds`): the test decides when it ends, whatever the host's load."""
    wrap = f"sleep {seconds}"
    if until is not None:
        wrap = f"for i in $(seq {seconds * 5}); do [ -e {until} ] && exit 0; sleep 0.2; done"
    r = cluster.run([need("sbatch"), "--parsable", f"--gres=gpu:{gpus}", "-o", "/dev/null",
                     "--wrap", wrap])
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def job_state(cluster, job):
    """squeue's state; RUNNING only once its Prolog is done (Slurm shows a job whose Prolog still
    runs as RUNNING with the reason Prolog; its batch script starts after the Prolog)."""
    r = cluster.run([need("squeue"), "-h", "-j", job, "-o", "%T %r"])
    state, _, reason = r.stdout.strip().partition(" ")
    return "PROLOG" if state == "RUNNING" and reason == "Prolog" else (state or "GONE")


def test_a_job_on_gpus_2_and_5_is_in_the_info_series_while_it_runs(gpu_cluster, tmp_path):
    c = gpu_cluster
    ctl = c.logs / "slurmctld.log"
    proc, url, _ = start_exporter(tmp_path, "--simulate", "p5.48xlarge", "--collectors", "workload",
                                  "--workload.slurm-job-mapping-dir", str(c.mapping))
    fillers: list[str] = []
    try:
        assert workloads(url) == {}
        # Slurm hands out the lowest free GPUs: fill 0-1, 2, 3-4, 5, 6-7, then free 2 and 5.
        fillers = [sbatch(c, n, 600) for n in (2, 1, 2, 1, 2)]
        wait_for(lambda: all(job_state(c, j) == "RUNNING" for j in fillers), 180, "fillers running", log=ctl)
        a, b, cc, d, e = fillers
        assert workloads(url) == {"0": [a], "1": [a], "2": [b], "3": [cc], "4": [cc], "5": [d], "6": [e],
                                  "7": [e]}
        c.run([need("scancel"), b, d], check=True)
        wait_for(lambda: job_state(c, b) in ("GONE", "CANCELLED")
                 and job_state(c, d) in ("GONE", "CANCELLED"), 180, "2 and 5 freed", log=ctl)
        assert "2" not in workloads(url) and "5" not in workloads(url)

        release = tmp_path / "release"  # the job runs until this exists, then ends by itself
        job = sbatch(c, 2, 600, until=release)
        wait_for(lambda: job_state(c, job) not in ("PENDING", "CONFIGURING", "PROLOG"), 180,
                 "the job running", log=ctl)
        assert job_state(c, job) == "RUNNING"
        seen = workloads(url)  # the first collection after its start
        assert seen["2"] == [job] and seen["5"] == [job]
        assert seen["0"] == [a] and seen["3"] == [cc] and seen["7"] == [e]

        release.touch()
        wait_for(lambda: job_state(c, job) in ("GONE", "COMPLETED"), 180, "the job ended", log=ctl)
        seen = workloads(url)  # the first collection after its end (the Epilog has run)
        assert "2" not in seen and "5" not in seen and seen["4"] == [cc]
    finally:
        if fillers:
            c.run([need("scancel"), *fillers])
        stop_within(proc)
