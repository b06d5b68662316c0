"""Fault attribution with a real Slurm job: the single-node Slurm of
tests/test_workload_slurm.py (8 GPUs in gres, the shipped prolog and epilog writing the mapping
directory), the exporter (simulated p5.48xlarge, following a kernel-log file) reading it. An XID
on GPU 5 while a real job holds GPUs 0-5 names the job in the log line, the exported series, the
state file, `check --json` and the Slurm health check's drain reason; all of these still name it
after the job has ended and after an exporter restart. An XID on idle GPU 7 names no job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import requests

from exporter.tools.simulate.nvml_synth import P5_BUSES
from tests import test_workload_slurm as slurm_jobs
from tests.helpers import HANG_GUARD_S, ROOT, samples, start_exporter, stop_within, wait_for
from tests.test_slurm import NODE, SCRIPT, need
from tests.test_workload_slurm import job_state, sbatch, workloads

gpu_cluster = slurm_jobs.gpu_cluster  # its Slurm with 8 GPUs, the shipped prolog and epilog

pytestmark = pytest.mark.slow

METRIC = "gpu_xid_workload_last_seen_timestamp_seconds"


def hits(url: str) -> set[tuple[str, str, str]]:
    """{(gpu, xid, hpc_job)} of the attribution series in one scrape."""
    text = requests.get(url, timeout=10).text
    return {(dict(ls)["gpu"], dict(ls)["xid"], dict(ls)["hpc_job"]) for n, ls in samples(text) if n == METRIC}


def append_xid(path, seq: int, gpu: int, xid: int) -> None:
    usec = int(time.monotonic() * 1e6)  # the kernel's clock: now
    with open(path, "a") as f:
        f.write(f"3,{seq},{usec},-;NVRM: Xid (PCI:0000:{P5_BUSES[gpu]:02x}:00): {xid}, pid=4242, "
                "name=python3, Ch 00000008\n")


def test_an_xid_names_the_real_job_everywhere_after_it_ended_and_after_a_restart(gpu_cluster, tmp_path):
    c = gpu_cluster
    kmsg, state = tmp_path / "kmsg", tmp_path / "state"
    kmsg.write_text("")
    args = ["--simulate", "p5.48xlarge", "--kmsg-file", str(kmsg), "--path.state-dir", str(state),
            "--workload.slurm-job-mapping-dir", str(c.mapping)]
    proc, url, log = start_exporter(tmp_path, *args)
    job = None
    try:
        job = sbatch(c, 6, 600)  # Slurm hands out the lowest free GPUs: 0-5
        wait_for(lambda: job_state(c, job) == "RUNNING", 180, "the job running", log=c.logs / "slurmctld.log")
        wait_for(lambda: workloads(url).get("5") == [job], 180, "the job on GPU 5")
        append_xid(kmsg, 1, 5, 94)  # while the job runs
        append_xid(kmsg, 2, 7, 13)  # GPU 7 is idle
        wait_for(lambda: (("5", "94", job) in hits(url)), 180, "the attribution series", proc, log)
        wait_for(lambda: "XID 13 counted on GPU 7" in log.read_text(), 180, "GPU 7's XID", proc, log)
        assert hits(url) == {("5", "94", job)}
        text = log.read_text()
        assert "XID 94 counted on GPU 5" in text and f"workloads: slurm job {job}" in text
        assert "no workload (the GPU was idle)" in text  # GPU 7's line

        c.run([need("scancel"), job], check=True)  # the job ends; its epilog removes the mapping
        wait_for(lambda: job_state(c, job) in ("GONE", "CANCELLED"), 180, "the job ended")
        wait_for(lambda: "5" not in workloads(url), 180, "the job gone from gpu_workload_info")
        assert hits(url) == {("5", "94", job)}
    finally:
        if job is not None:
            c.run([need("scancel"), job])
        stop_within(proc)
    doc = json.loads((state / "xid-state.json").read_text())["workload"]
    named = [[r[0], r[2], r[5]] for r in doc["records"] if r[5]]
    assert named == [["00000000:a8:00", 94, [[job, "", "", ""]]]]

    proc, url, log = start_exporter(tmp_path, *args)  # a restart: nothing holds the GPUs now
    try:
        assert hits(url) == {("5", "94", job)}
    finally:
        stop_within(proc)

    # `check --json` and the health check's drain reason, run as Slurm runs it
    exporter = tmp_path / "gpu-health-exporter"
    exporter.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m exporter \"$@\"\n")
    exporter.chmod(0o755)
    r = subprocess.run([str(exporter), "check", "--json", *args], capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    gpus = {g["gpu"]: g for g in json.loads(r.stdout)["gpus"]}
    assert [(e["xid"], e["workloads"]) for e in gpus[5]["workloads_hit"]] == [
        (94, [{"kind": "slurm", "hpc_job": job}])]
    assert [(e["xid"], e["workloads"]) for e in gpus[7]["workloads_hit"]] == [(13, [])]
    env = {**c.env, "SLURMD_NODENAME": NODE, "GPU_HEALTH_EXPORTER": str(exporter),
           "GPU_HEALTH_PYTHON": sys.executable, "GPU_HEALTH_HYPERPOD": "no",
           "GPU_HEALTH_CHECK_ARGS": " ".join(args), "GPU_HEALTH_CHECK_CONFIG": "/nonexistent",
           "GPU_HEALTH_TIMEOUT": "240",  # the script's 45 s (Slurm's 60 s limit) is not this test's subject
           "PATH": os.environ["PATH"]}
    r = c.run([str(SCRIPT)], env, timeout=300)
    assert r.returncode == 0, r.stderr
    try:
        n = wait_for(lambda: (n := c.node()).get("State", "").endswith("DRAIN") and n, 180, "the drain")
        assert n["Reason"] == f"gpu-health: GPU 5 replace (xid_replace: XID 94; job {job})"
    finally:
        c.scontrol("update", f"NodeName={NODE}", "State=UNDRAIN")
