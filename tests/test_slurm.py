"""deploy/slurm/gpu-health-check.sh against a real single-node Slurm: Debian's munged, slurmctld and
slurmd started here with their own key, state and spool in a temporary directory, torn down at the
end. slurmctld and slurmd listen on Slurm's fixed ports in a network namespace of their own (a
port picked here and bound later by them could be handed to another test's server meanwhile); every
Slurm client the test runs enters it. The check runs on the simulated p5.48xlarge: a replace-now
XID drains the node with a reason naming the GPU and the cause, a healthy node stays idle, "could not
check" never drains, and HyperPod mode fails the node with the Action:Replace / Action:Reboot reason
its auto-resume acts on. slurmd also runs the script itself as its HealthCheckProgram, every 5 s."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import HANG_GUARD_S, ROOT, network_namespace, wait_for

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "deploy" / "slurm" / "gpu-health-check.sh"
NODE = "gpunode1"
EXPORTER = Path(sys.executable).parent / "gpu-health-exporter"
SIM = "--simulate p5.48xlarge"


def need(cmd: str) -> str:
    path = shutil.which(cmd) or shutil.which(cmd, path="/usr/sbin:/sbin")
    assert path, f"{cmd} is missing: install Debian's slurm-wlm and munge (.ci/run does)"
    return path

# Every wait here returns as soon as what it waits for holds; this bounds only a failing run. A
# health check (a whole exporter `check`) took 30 s on a 2-core host under stress-ng --cpu 2 beside
# the rest of the suite, where these waits were 30-40 s: generous, so load is never a failure.
WAIT_S = 180.0

@dataclass
class Cluster:
    env: dict[str, str]
    procs: list[subprocess.Popen]
    logs: Path
    netns: list[str]  # the command prefix that enters the cluster's network namespace

    def run(self, argv: list[str], env: dict[str, str] | None = None, timeout: float = WAIT_S,
            check: bool = False) -> subprocess.CompletedProcess:
        """argv in the cluster's network namespace, with its SLURM_CONF."""
        return subprocess.run([*self.netns, *argv], env=env or self.env, capture_output=True, text=True,
                              timeout=timeout, check=check)

    def scontrol(self, *args: str) -> str:
        r = self.run([need("scontrol"), *args])
        assert r.returncode == 0, f"scontrol {' '.join(args)}: {r.stderr}"
        return r.stdout

    def node(self) -> dict[str, str]:
        """State and Reason of the node, as `scontrol show node` prints them."""
        out = self.scontrol("show", "node", NODE)
        fields = {}
        for line in out.splitlines():
            line = line.strip()
            if line.startswith("Reason="):
                fields["Reason"] = line.split("=", 1)[1].rsplit(" [", 1)[0]
            else:
                for part in line.split():
                    if part.startswith("State="):
                        fields["State"] = part.split("=", 1)[1]
        return fields

    def wait_state(self, want: str, timeout: float = WAIT_S) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            n = self.node()
            if n.get("State") == want:
                return n
            for p in self.procs:
                assert p.poll() is None, f"{p.args[0]} exited {p.returncode}: {self.tail()}"
            if time.monotonic() > deadline:
                raise AssertionError(f"node state {n} is not {want} after {timeout:g} s: {self.tail()}")
            time.sleep(0.3)

    def reset(self) -> None:
        """Back to IDLE with no reason, whatever the previous test left."""
        if self.node().get("State") != "IDLE":
            self.scontrol("update", f"NodeName={NODE}", "State=UNDRAIN")
        self.wait_state("IDLE")

    def check(self, args: str, hyperpod: bool = False, *extra: str) -> subprocess.CompletedProcess:
        env = {**self.env, "SLURMD_NODENAME": NODE, "GPU_HEALTH_EXPORTER": str(EXPORTER),
               "GPU_HEALTH_HYPERPOD": "yes" if hyperpod else "no", "GPU_HEALTH_CHECK_ARGS": args,
               "GPU_HEALTH_CHECK_CONFIG": "/nonexistent",
               # the script's 45 s bound (Slurm kills a check at 60 s) is not these tests' subject:
               # a check on a loaded host may take longer, and would then not drain
               "GPU_HEALTH_TIMEOUT": str(int(WAIT_S))}
        return self.run([str(SCRIPT), *extra], env, timeout=2 * WAIT_S)

    def tail(self) -> str:
        return "\n".join(f"--- {f.name}\n{f.read_text()[-1500:]}" for f in sorted(self.logs.glob("*")))


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    with run_cluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


@contextlib.contextmanager
def run_cluster(d: Path, extra_conf: str = "", node_conf: str = "", cpus: int = 1,
                health_check: bool = True) -> Iterator[Cluster]:
    """A single-node Slurm under `d`; `extra_conf` is added to slurm.conf, `node_conf` to its
    NodeName line, which has `cpus` CPUs (tests/test_workload_slurm.py: GPUs in gres, a Prolog and
    an Epilog, jobs side by side)."""
    for sub in ("state", "spool", "logs"):
        (d / sub).mkdir()
    logs = d / "logs"
    key, sock = d / "munge.key", d / "munge.sock"
    subprocess.run([need("mungekey"), "--create", f"--keyfile={key}"], check=True, timeout=HANG_GUARD_S)
    key.chmod(0o600)
    host = socket.gethostname().split(".")[0]
    # slurmctld has slurmd run the check every 5 s (HealthCheckProgram), here on the healthy simulated node.
    hc = d / "healthcheck.sh"
    hc.write_text(f"#!/bin/sh\nexport GPU_HEALTH_EXPORTER={EXPORTER} GPU_HEALTH_HYPERPOD=no "
                  f"GPU_HEALTH_CHECK_CONFIG=/nonexistent GPU_HEALTH_CHECK_ARGS='{SIM}'\n"
                  f"echo started >> {logs}/healthcheck.log\nexec {SCRIPT}\n")
    hc.chmod(0o755)
    conf = d / "slurm.conf"
    conf.write_text(f"""ClusterName=test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={logs}/slurmctld.log
SlurmdLogFile={logs}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/linear
MpiDefault=none
ReturnToService=2
{f"HealthCheckProgram={hc}" if health_check else ""}
HealthCheckInterval=5
{extra_conf}
NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname={host} CPUs={cpus} {node_conf} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES State=UP
""")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs: list[subprocess.Popen] = []
    with contextlib.ExitStack() as stack:
        netns = stack.enter_context(network_namespace())
        c = Cluster(env, procs, logs, netns)
        stack.callback(_stop, procs)

        procs.append(_start([need("munged"), "-F", "-f", f"--socket={sock}", f"--key-file={key}",
                             f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed",
                             f"--log-file={logs}/munged.log"], env, logs / "munged.out"))
        wait_for(sock.exists, WAIT_S, "munged's socket", procs[0], logs / "munged.out")
        procs.append(_start([*netns, need("slurmctld"), "-D", "-i"], env, logs / "slurmctld.out"))
        procs.append(_start([*netns, need("slurmd"), "-D", "-N", NODE], env, logs / "slurmd.out"))
        deadline = time.monotonic() + WAIT_S
        while True:
            r = c.run([need("scontrol"), "show", "node", NODE])
            if r.returncode == 0 and "State=IDLE " in r.stdout:
                break
            for p in procs:
                assert p.poll() is None, f"{p.args[0]} exited {p.returncode}: {c.tail()}"
            assert time.monotonic() < deadline, f"Slurm did not come up: {r.stdout}{r.stderr}{c.tail()}"
            time.sleep(0.3)
        yield c


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):
        p.terminate()
    for p in reversed(procs):
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def test_slurmd_runs_the_health_check_and_the_healthy_node_stays_idle(cluster):
    ran = cluster.logs / "healthcheck.log"
    deadline = time.monotonic() + WAIT_S
    while not ran.exists():
        assert time.monotonic() < deadline, f"slurmd never ran HealthCheckProgram: {cluster.tail()}"
        time.sleep(0.5)
    n = cluster.node()
    assert n["State"] == "IDLE" and "Reason" not in n


def test_healthy_node_stays_idle(cluster):
    cluster.reset()
    r = cluster.check(SIM)
    assert r.returncode == 0, r.stderr
    n = cluster.node()
    assert n["State"] == "IDLE" and "Reason" not in n


def test_replace_now_xid_drains_with_gpu_and_cause(cluster):
    cluster.reset()
    r = cluster.check(f"{SIM} --scenario xid-94")
    assert r.returncode == 0, r.stderr
    n = cluster.wait_state("IDLE+DRAIN")
    assert n["Reason"] == "gpu-health: GPU 1 replace (xid_replace: XID 94)"


def test_could_not_check_never_drains(cluster, tmp_path):
    cluster.reset()
    r = cluster.check(f"{SIM} --path.kmsg {tmp_path}/no-kmsg --path.state-dir {tmp_path}")
    assert r.returncode == 0 and "could not check" in r.stderr, r.stderr
    assert cluster.node()["State"] == "IDLE"


def test_a_config_error_never_drains(cluster, tmp_path):
    """`check` exits 3 (could not check) for a bad config, with the reason; the script logs it and
    does not drain."""
    cluster.reset()
    bad = tmp_path / "config.yaml"
    bad.write_text("log_level: loud\n")
    bad.chmod(0o644)
    tmp_path.chmod(0o755)
    r = cluster.check(f"{SIM} --config {bad}")
    assert r.returncode == 0 and "could not check" in r.stderr and "log_level" in r.stderr, r.stderr
    assert cluster.node()["State"] == "IDLE"


def test_a_broken_check_never_drains(cluster):
    cluster.reset()
    r = cluster.check("--no-such-flag")
    assert r.returncode == 0 and "exit status 2" not in r.stderr, r.stderr
    assert cluster.node()["State"] == "IDLE"


@pytest.mark.parametrize("scenario,reason",
                         [("xid-94", "Action:Replace"), ("xid-79-bus-loss", "Action:Reboot")])
def test_hyperpod_fails_the_node_with_the_action_reason(cluster, scenario, reason):
    cluster.reset()
    r = cluster.check(f"{SIM} --scenario {scenario}", True)
    assert r.returncode == 0, r.stderr
    n = cluster.wait_state("IDLE+FAIL")
    assert n["Reason"] == reason
    assert "GPU" in r.stderr and "XID" in r.stderr  # the details still reach the log


def test_prolog_requeues_and_an_existing_reason_is_kept(cluster):
    cluster.reset()
    cluster.scontrol("update", f"NodeName={NODE}", "State=DRAIN", "Reason=maintenance by admin")
    r = cluster.check(f"{SIM} --scenario xid-63", False, "--prolog")
    assert r.returncode == 1, r.stderr  # a failing prolog requeues the job
    assert cluster.node()["Reason"] == "maintenance by admin"
    cluster.reset()
    assert cluster.check(SIM, False, "--prolog").returncode == 0


def test_prometheus_targets_from_sinfo(cluster, tmp_path):
    """deploy/prometheus/slurm-targets.sh: one file_sd target per node, `instance` the Slurm name."""
    out = tmp_path / "slurm.json"
    r = cluster.run([str(ROOT / "deploy" / "prometheus" / "slurm-targets.sh"), str(out)], timeout=WAIT_S)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text()) == [{"targets": ["127.0.0.1:9858"], "labels": {"instance": NODE}}]
    assert [p.name for p in tmp_path.iterdir()] == ["slurm.json"]  # no temporary file left


@pytest.mark.parametrize("script", ["gpu-health-check.sh", "hyperpod-lifecycle.sh"])
def test_shipped_scripts_parse(script):
    r = subprocess.run(["bash", "-n", str(ROOT / "deploy" / "slurm" / script)], capture_output=True,
                       text=True, timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr
