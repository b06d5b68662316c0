"""The exporter's threads: a bounded number on the simulated p5.48xlarge, none created per scrape."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import requests

from exporter import collectors
from exporter.arguments import build_parser
from exporter.runner import Runner
from exporter.startup import build_context
from exporter.web.server import Server
from tests.helpers import START_HANG_GUARD_S, running_exporter


def test_no_thread_is_created_per_scrape(monkeypatch):
    ctx, sim = build_context(build_parser().parse_args(["--simulate", "p5.48xlarge", "--nvml-latencies"]))
    runner = Runner(collectors.build(ctx), 5.0, pool=ctx.pool)
    srv = Server(runner, "127.0.0.1", 0)
    started: list[str] = []
    real_start = threading.Thread.start

    def start(self):
        started.append(self.name)
        real_start(self)

    try:
        runner.start()
        srv.start()
        url = f"http://127.0.0.1:{srv.port}/metrics"
        # warm-up: the pools grow to what scrapes need. The HTTP workers (a ThreadPoolExecutor)
        # start one more whenever a request comes before a worker is idle again, which even one
        # client's back-to-back requests can do on a busy host: 4 clients at once fill it (4).
        with ThreadPoolExecutor(4) as clients:
            assert all(clients.map(lambda _: requests.get(url, timeout=30).ok, range(20)))
        with requests.Session() as s:
            for _ in range(10):
                assert s.get(url, timeout=30).status_code == 200
            monkeypatch.setattr(threading.Thread, "start", start)
            for _ in range(30):
                assert s.get(url, timeout=30).status_code == 200
    finally:
        monkeypatch.undo()
        srv.shutdown()
        runner.close()
        sim.close()
    assert started == []


def _child(port: int) -> psutil.Process:
    """The child process listening on `port` (the exporter)."""
    for p in psutil.Process().children(recursive=True):
        try:
            if any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in p.net_connections("tcp")):
                return p
        except psutil.NoSuchProcess:
            continue
    raise AssertionError("the exporter process was not found")


@pytest.mark.slow
def test_the_simulated_p5_runs_at_most_12_threads():
    with running_exporter("--simulate", "p5.48xlarge", "--nvml-latencies", "--log-level", "warning") as url:
        proc = _child(int(url.rsplit(":", 1)[-1]))
        with requests.Session() as s:
            for _ in range(40):
                assert s.get(url + "/metrics", timeout=30).status_code == 200
        # a transient start-up thread (the identity lookup) may still be ending
        deadline = time.monotonic() + START_HANG_GUARD_S
        task_dir = Path(f"/proc/{proc.pid}/task")
        while len(tasks := list(task_dir.iterdir())) > 12 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert len(tasks) <= 12, f"{len(tasks)} threads"
