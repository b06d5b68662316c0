"""Fault attribution end to end in the daemon: the composition root (exporter.startup.build_context)
on a simulated p5 following a kernel-log file, every collector, the HTTP endpoint, and the workload
source reading a Slurm mapping directory that the test writes as the prolog and epilog do.

- A job that started after the last reading (no scrape since) and is hit by an XID at once is
  named: the live event asks the source for a fresh reading before it is attributed.
- It stays named after its epilog removed the mapping, after a restart, and in `check --json`.
- An XID written while the daemon was down (read as backlog at start-up) names no one, although a
  job holds that GPU when the daemon reads it."""

from __future__ import annotations

import json
import logging
import time

import requests

from exporter import collectors
from exporter.arguments import build_parser
from exporter.cli import main
from exporter.lifecycle import shutdown
from exporter.runner import Runner
from exporter.startup import build_context
from exporter.web.server import Server
from tests.helpers import START_HANG_GUARD_S, promtool_check_metrics, samples, test_pool, wait_for

METRIC = "gpu_xid_workload_last_seen_timestamp_seconds"


class Daemon:
    def __init__(self, tmp_path) -> None:
        self.args = ["--simulate", "p5.48xlarge", "--kmsg-file", str(tmp_path / "kmsg"),
                     "--path.state-dir", str(tmp_path / "state"),
                     "--workload.slurm-job-mapping-dir", str(tmp_path / "mapping")]
        self.ctx, self.sim = build_context(build_parser().parse_args(self.args))
        self.runner = Runner.from_config(collectors.build(self.ctx), self.ctx.config, pool=test_pool())
        self.server = Server(self.runner, "127.0.0.1", 0)
        self.sim.start()
        self.runner.start()
        self.server.start()
        self.url = f"http://127.0.0.1:{self.server.port}/metrics"

    def metrics(self) -> dict:
        return samples(requests.get(self.url, timeout=10).text)

    def stop(self) -> None:
        shutdown(self.ctx, self.server, self.runner, 10.0, simulation=self.sim)


def hits(s: dict) -> set[tuple[str, str, str]]:
    return {(dict(ls)["gpu"], dict(ls)["xid"], dict(ls)["hpc_job"]) for (n, ls) in s if n == METRIC}


def jobs(s: dict) -> dict[str, str]:
    return {dict(ls)["gpu"]: dict(ls)["hpc_job"] for (n, ls) in s if n == "gpu_workload_info"}


def append(path, seq: int, xid: int, pci: str) -> None:
    usec = int(time.monotonic() * 1e6)  # the kernel's clock: now
    with open(path, "a") as f:
        f.write(f"3,{seq},{usec},-;NVRM: Xid (PCI:{pci}): {xid}, pid=9, name=python, Ch 00000010\n")


def test_an_xid_names_the_job_after_it_ended_after_a_restart_and_in_check(tmp_path, caplog, capsys):
    log, mapping = tmp_path / "kmsg", tmp_path / "mapping"
    log.write_text("")
    mapping.mkdir()
    caplog.set_level(logging.WARNING, "exporter.xid")
    d = Daemon(tmp_path)
    try:
        first = d.metrics()  # the source has read the idle node
        assert ("gpu_health_exporter_kmsg_up", frozenset()) in first and jobs(first) == {}
        (mapping / "5").write_text("4242\n")  # the prolog: job 4242 holds GPU 5; no scrape since
        append(log, 1, 79, "0000:a8:00")  # and GPU 5 falls off the bus at once
        wait_for(lambda: "XID 79 counted on GPU 5" in caplog.text, START_HANG_GUARD_S, "the XID's log line")
        assert "workloads: slurm job 4242" in caplog.text  # the fresh reading the event asked for
        (mapping / "5").unlink()  # the epilog
        s = d.metrics()
        assert jobs(s) == {} and hits(s) == {("5", "79", "4242")}
        assert promtool_check_metrics(requests.get(d.url, timeout=10).text) == ""
    finally:
        d.stop()
    # While the daemon is down GPU 2 logs an XID and a new job takes GPU 2.
    append(log, 2, 31, "0000:75:00")
    time.sleep(0.01)
    (mapping / "2").write_text("5555\n")
    again = Daemon(tmp_path)
    try:
        s = again.metrics()
        assert jobs(s) == {"2": "5555"}
        assert hits(s) == {("5", "79", "4242")}  # kept; the backlog XID names no one, not job 5555
        assert any(n == "gpu_xid_errors_total" and dict(ls)["xid"] == "31" for n, ls in s)
    finally:
        again.stop()
    capsys.readouterr()
    main(["check", *again.args, "--json"])  # as an operator or the Slurm health check runs it
    gpus = {g["gpu"]: g for g in json.loads(capsys.readouterr().out)["gpus"]}
    assert [(e["xid"], e["workloads"]) for e in gpus[5]["workloads_hit"]] == [
        (79, [{"kind": "slurm", "hpc_job": "4242"}])]
    assert [(e["xid"], e["workload_known"]) for e in gpus[2]["workloads_hit"]] == [(31, False)]
