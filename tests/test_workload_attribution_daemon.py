"""Fault attribution end to end in the daemon: the composition root (exporter.cli.build_context)
on a simulated p5 following a kernel-log file, every collector, the HTTP endpoint; a workload
reading handed to the hook the workload source uses (Context.workloads). XIDs appended to the log
while a job runs name it on /metrics and in the log line, still after the job ended and after a
restart, and in `check --json`; an XID written while the daemon was down (read as backlog at
start-up) names no one.

In-process, because the daemon as a process has no workload source on this branch to read a job
from (the other half of issue 26); everything else is the daemon's own code."""

from __future__ import annotations

import json
import logging
import time

import requests

from exporter import collectors
from exporter.cli import build_context, build_parser, main, shutdown
from exporter.runner import Runner
from exporter.server import Server
from exporter.workload.model import Workload, WorkloadReading
from tests.helpers import promtool_check_metrics, samples

JOB = Workload(hpc_job="4242")
METRIC = "gpu_xid_workload_last_seen_timestamp_seconds"


class Daemon:
    def __init__(self, tmp_path) -> None:
        args = build_parser().parse_args([
            "--simulate", "p5.48xlarge", "--kmsg-file", str(tmp_path / "kmsg"),
            "--path.state-dir", str(tmp_path / "state"), "--listen", "127.0.0.1:0"])
        self.ctx, self.sim = build_context(args)
        self.runner = Runner.from_config(collectors.build(self.ctx), self.ctx.config)
        self.server = Server(self.runner, "127.0.0.1", 0)
        self.sim.start()
        self.runner.start()
        self.server.start()
        self.url = f"http://127.0.0.1:{self.server.port}/metrics"

    @property
    def uuid(self) -> dict[int, str]:
        assert self.ctx.nvml.ensure()
        return {d.index: d.uuid for d in self.ctx.nvml.devices}

    def observe(self, by_index: dict[int, tuple[Workload, ...]]) -> None:
        """What the workload source's collector does with each of its readings."""
        uuid = self.uuid
        self.ctx.workloads.observe(WorkloadReading(time.time(), {uuid[i]: w for i, w in by_index.items()}))

    def metrics(self) -> str:
        return requests.get(self.url, timeout=10).text

    def wait_for(self, pred, what: str, timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.metrics()
            if pred(samples(text)):
                return text
            assert time.monotonic() < deadline, f"{what} did not show up:\n{text[-3000:]}"
            time.sleep(0.2)

    def stop(self) -> None:
        shutdown(self.ctx, self.server, self.runner, 10.0, simulation=self.sim)


def hits(s: dict) -> dict[tuple[str, str, str], float]:
    return {(dict(ls)["gpu"], dict(ls)["xid"], dict(ls)["hpc_job"]): v
            for (n, ls), v in s.items() if n == METRIC}


def append(path, seq: int, xid: int, pci: str) -> None:
    usec = int(time.monotonic() * 1e6)  # the kernel's clock: now
    with open(path, "a") as f:
        f.write(f"3,{seq},{usec},-;NVRM: Xid (PCI:{pci}): {xid}, pid=9, name=python, Ch 00000010\n")


def test_an_xid_names_the_job_on_metrics_after_it_ended_and_after_a_restart(tmp_path, caplog, capsys):
    log = tmp_path / "kmsg"
    log.write_text("")
    caplog.set_level(logging.WARNING, "exporter.xid")
    d = Daemon(tmp_path)
    try:
        d.wait_for(lambda s: ("gpu_health_exporter_kmsg_up", frozenset()) in s, "the kernel-log follower")
        d.observe({0: (), 5: (JOB,)})  # the prolog ran: job 4242 holds GPU 5
        time.sleep(0.05)
        append(log, 1, 79, "0000:a8:00")  # GPU 5 falls off the bus
        d.wait_for(lambda s: ("5", "79", "4242") in hits(s), "the attribution series")
        d.observe({0: (), 5: ()})  # the job died of it; the epilog removed its mapping
        text = d.metrics()
        assert ("5", "79", "4242") in hits(samples(text)) and len(hits(samples(text))) == 1
        assert promtool_check_metrics(text) == ""
        assert "XID 79 counted on GPU 5" in caplog.text and "workloads: slurm job 4242" in caplog.text
    finally:
        d.stop()
    # While the daemon is down, GPU 2 logs an XID; the new daemon reads it as backlog.
    append(log, 2, 31, "0000:75:00")
    again = Daemon(tmp_path)
    try:
        again.observe({2: (Workload(hpc_job="5555"),), 5: ()})  # a new job holds GPU 2 now
        text = again.wait_for(lambda s: ("gpu_xid_errors_total", frozenset({
            ("gpu", "2"), ("uuid", again.uuid[2]), ("pci_bus_id", "00000000:75:00.0"), ("xid", "31"),
            ("tier", "application")})) in s, "the backlog XID")
        assert set(hits(samples(text))) == {("5", "79", "4242")}  # kept; the backlog XID names no one
    finally:
        again.stop()
    # `check --json` afterwards, as an operator or the Slurm health check runs it
    capsys.readouterr()
    main(["check", "--simulate", "p5.48xlarge", "--kmsg-file", str(log), "--path.state-dir",
          str(tmp_path / "state"), "--json"])
    gpus = {g["gpu"]: g for g in json.loads(capsys.readouterr().out)["gpus"]}
    assert [(e["xid"], e["workloads"]) for e in gpus[5]["workloads_hit"]] == [
        (79, [{"kind": "slurm", "hpc_job": "4242"}])]
    assert [(e["xid"], e["workload_known"]) for e in gpus[2]["workloads_hit"]] == [(31, False)]
