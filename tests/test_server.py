"""The HTTP endpoint: /metrics in both formats, landing page, health and readiness, methods,
content coding, connection limits and timeouts, process_* metrics."""

import gzip
import itertools
import os
import resource
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests

from exporter.exposition import choose_encoding
from exporter.runner import Runner
from exporter.web.httpd import Limits
from exporter.web.server import Server
from tests.helpers import (
    DEADLINE_MARGIN_S,
    ROOT,
    START_HANG_GUARD_S,
    port_of,
    promtool_check_metrics,
    samples,
    test_pool,
    value,
    wait_for,
    wait_until_serving,
)
from tests.test_runner import Probe


class serving:
    """A Server for a runner on 127.0.0.1, shut down (with its runner) on exit."""

    def __init__(self, runner, **kw):
        self.runner = runner
        self.srv = Server(runner, "127.0.0.1", 0, **kw)

    def __enter__(self):
        self.srv.start()
        return f"127.0.0.1:{self.srv.port}"

    def __exit__(self, *exc):
        self.srv.shutdown()
        self.runner.close()


def raw(addr: str, data: bytes, timeout: float = 5.0) -> bytes:
    """Send `data` on a fresh connection and read until the server closes it."""
    host, port = addr.split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def wait_ready(base: str) -> None:
    deadline = time.monotonic() + START_HANG_GUARD_S
    while requests.get(base + "/readyz", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "not ready (hang guard)"
        time.sleep(0.05)


def test_endpoints():
    with serving(Runner([Probe("alpha")], deadline_s=1, pool=test_pool())) as addr:
        base = f"http://{addr}"
        assert requests.get(base + "/healthz", timeout=5).status_code == 200
        wait_ready(base)
        r = requests.get(base + "/metrics", timeout=5)
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
        assert 'gpu_health_exporter_collector_success{collector="alpha"} 1.0' in r.text
        assert promtool_check_metrics(r.text) == ""
        om = requests.get(base + "/metrics?x=1", headers={"Accept": "application/openmetrics-text"},
                          timeout=5)
        assert om.headers["Content-Type"].startswith("application/openmetrics-text")
        assert om.text.rstrip().endswith("# EOF")
        landing = requests.get(base + "/", timeout=5).text
        assert "alpha" in landing and "ok" in landing and 'href="/metrics"' in landing
        assert requests.get(base + "/nope", timeout=5).status_code == 404


def test_ready_after_the_first_collection_without_a_scrape():
    """Defect 7: /readyz turns 200 from the start-up collection, before Prometheus comes."""
    runner = Runner([Probe("slow", delay=0.5)], deadline_s=5, pool=test_pool())
    with serving(runner) as addr:
        assert requests.get(f"http://{addr}/readyz", timeout=5).status_code == 503
        wait_ready(f"http://{addr}")
        assert runner.scrapes == 0 and runner.collections == 1
        # The start-up collection is not counted as a scrape; the landing page already has it.
        assert "slow" in requests.get(f"http://{addr}/", timeout=5).text
        text = requests.get(f"http://{addr}/metrics", timeout=5).text
        assert value(text, "gpu_health_exporter_scrapes_total") == 1


def test_only_get_and_head_and_head_has_no_body():
    """Defect 10: other methods get 405 with Allow and trigger no collection; HEAD sends no body."""
    runner = Runner([Probe("alpha")], deadline_s=1, pool=test_pool())
    with serving(runner) as addr:
        wait_ready(f"http://{addr}")
        before = runner.collections
        for method in ("PUT", "DELETE", "POST", "FOO", "OPTIONS"):
            r = requests.request(method, f"http://{addr}/metrics", timeout=5)
            assert r.status_code == 405, method
            assert r.headers["Allow"] == "GET, HEAD"
        assert runner.collections == before
        head = raw(addr, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status, _, rest = head.partition(b"\r\n")
        headers, _, body = rest.partition(b"\r\n\r\n")
        assert status == b"HTTP/1.1 200 OK" and body == b""
        assert int(dict(h.split(b": ", 1) for h in headers.split(b"\r\n"))[b"Content-Length"]) > 0
        assert raw(addr, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400")
        assert raw(addr, b"GET / HTTP/2.0\r\n\r\n").startswith(b"HTTP/1.1 505")
        assert raw(addr, b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 431")


@pytest.mark.parametrize("header, want", [
    ("gzip", "gzip"), ("gzip, deflate", "gzip"), ("gzip;q=0", "identity"), ("GZIP;Q=0.0", "identity"),
    ("", "identity"), ("identity", "identity"), ("deflate", "identity"), ("*", "gzip"),
    ("gzip;q=0.5, identity", "identity"), ("gzip;q=1, identity;q=0.5", "gzip"),
    ("identity;q=0", None), ("*;q=0", None), ("*;q=0, gzip", "gzip"), ("gzip;q=0, *;q=0", None),
    ("x-gzip", "gzip"), ("gzip;q=bogus", "identity"),
])
def test_content_coding_negotiation(header, want):
    assert choose_encoding(header) == want


def test_content_coding_on_the_wire():
    """Defect 10: `gzip;q=0` gets no gzip; no acceptable coding gets 406."""
    with serving(Runner([Probe("alpha")], deadline_s=1, pool=test_pool())) as addr:
        url = f"http://{addr}/metrics"
        r = requests.get(url, headers={"Accept-Encoding": "gzip;q=0"}, timeout=5)
        assert "Content-Encoding" not in r.headers and r.text.startswith("# HELP")
        r = requests.get(url, headers={"Accept-Encoding": "gzip"}, stream=True, timeout=5)
        assert r.headers["Content-Encoding"] == "gzip" and r.headers["Vary"] == "Accept-Encoding"
        assert gzip.decompress(r.raw.read()).startswith(b"# HELP")
        assert requests.get(url, headers={"Accept-Encoding": "identity;q=0"}, timeout=5).status_code == 406


def test_keep_alive_responses_leave_in_one_piece():
    """A response's head and body go out in one write with TCP_NODELAY: written apart, the body
    of every response after the first on a keep-alive connection waited for the client's
    delayed ACK (40 ms per scrape; Nagle holds data sent behind unacked data)."""
    with serving(Runner([Probe("alpha")], deadline_s=1, pool=test_pool())) as addr:
        wait_ready(f"http://{addr}")
        host, port = addr.split(":")
        with socket.create_connection((host, int(port)), timeout=5) as s:
            for _ in range(5):
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n")
                got = s.recv(1 << 20)  # one segment's worth: the whole response when sent in one
                head, _, body = got.partition(b"\r\n\r\n")
                length = int(dict(h.split(b": ", 1) for h in head.split(b"\r\n")[1:])[b"Content-Length"])
                assert len(body) == length, f"only {len(body)} of {length} body bytes in the first read"
                assert gzip.decompress(body).startswith(b"# HELP")


def _idle(addr: str, n: int) -> list[socket.socket]:
    host, port = addr.split(":")
    return [socket.create_connection((host, int(port)), timeout=5) for _ in range(n)]


def test_idle_connections_take_no_threads_and_do_not_block_scrapes():
    """Defect 3: a thread per connection before; 300 idle connections now cost no thread, and at
    the connection limit the longest-idle ones make room for scrapes."""
    limits = Limits(max_connections=100, read_header_timeout=30, workers=2)
    server = serving(Runner([Probe("alpha")], deadline_s=1, pool=test_pool()), limits=limits)
    with server as addr:
        wait_ready(f"http://{addr}")
        threads = threading.active_count()
        fds = len(os.listdir("/proc/self/fd"))
        socks = _idle(addr, 300)
        try:
            httpd = server.srv.httpd
            wait_for(lambda: httpd.evicted >= 200, what="the 200 longest-idle connections evicted")
            assert threading.active_count() <= threads + 2
            assert httpd.connections <= 100
            # This process holds both ends: 300 client sockets and at most ~100 server ones.
            assert len(os.listdir("/proc/self/fd")) <= fds + 300 + 100 + 10
            for _ in range(5):
                r = requests.get(f"http://{addr}/metrics", timeout=5)
                assert r.status_code == 200
        finally:
            for s in socks:
                s.close()


def test_slow_header_client_is_dropped_and_scrapes_go_on():
    """Defect 3: a client sending its head a byte at a time is closed after the header timeout."""
    limits = Limits(read_header_timeout=1.0, idle_timeout=1.0)
    with serving(Runner([Probe("alpha")], deadline_s=1, pool=test_pool()), limits=limits) as addr:
        host, port = addr.split(":")
        slow = socket.create_connection((host, int(port)), timeout=10)
        # a head that never ends, a byte per 0.2 s at most: only the header timeout closes it
        head = itertools.chain(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ", itertools.repeat(ord("a")))
        guard = time.monotonic() + DEADLINE_MARGIN_S
        for b in head:
            assert time.monotonic() < guard, "the slow-header client was not dropped (hang guard)"
            assert requests.get(f"http://{addr}/metrics", timeout=5).status_code == 200
            try:
                slow.send(bytes([b]))
            except OSError:
                break
            slow.settimeout(0.2)
            try:
                if slow.recv(1) == b"":
                    break
            except TimeoutError:
                pass
        slow.close()
        # A kept-alive connection idle past idle_timeout is closed too.
        s = socket.create_connection((host, int(port)), timeout=DEADLINE_MARGIN_S)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while not got.endswith(b"ok\n"):
            got += s.recv(4096)
        assert got.startswith(b"HTTP/1.1 200")
        assert s.recv(1) == b""  # closed by the server, not this socket's timeout (a hang guard)
        s.close()


@pytest.mark.slow
def test_1100_idle_connections_under_a_1024_fd_limit_do_not_block_scrapes():
    """Defect 3 as found: the daemon under the default open-file limit of 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1400:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    proc = subprocess.Popen([sys.executable, "-m", "exporter", "--simulate", "p5.48xlarge", "--collectors",
                             "efa", "--listen", "127.0.0.1:0"], cwd=ROOT, preexec_fn=limit,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port = port_of(proc)
    socks = []
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/readyz", proc, 60, "exporter")
        socks = _idle(f"127.0.0.1:{port}", 1100)
        for _ in range(3):
            r = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
            assert r.status_code == 200
            assert value(r.text, "process_max_fds") == 1024
            assert value(r.text, "process_open_fds") < 1024
    finally:
        for s in socks:
            s.close()
        proc.terminate()
        proc.wait(15)


def test_process_metrics_have_the_standard_names_and_sane_values():
    from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

    reg = CollectorRegistry()
    ProcessCollector(registry=reg)
    theirs = samples(generate_latest(reg).decode())
    with serving(Runner([Probe("alpha")], deadline_s=1, pool=test_pool())) as addr:
        ours = samples(requests.get(f"http://{addr}/metrics", timeout=5).text)
    ours_names = {n for n, _ in ours if n.startswith("process_")}
    assert ours_names == {n for n, _ in theirs} | {"process_threads"}
    assert abs(value(ours, "process_start_time_seconds") - value(theirs, "process_start_time_seconds")) < 2
    assert value(ours, "process_max_fds") == value(theirs, "process_max_fds")
    rss = value(ours, "process_resident_memory_bytes")
    assert 0.5 < rss / value(theirs, "process_resident_memory_bytes") < 2
    assert value(ours, "process_threads") >= threading.active_count()
    assert value(ours, "process_cpu_seconds_total") > 0


@pytest.mark.slow
def test_landing_page_shows_the_verdict_and_each_sources_problems():
    """What a new user sees first: a lost GPU, a down EFA device and a failed
    Lustre source show on `/` with the node verdict and its reasons, not 'ok' per collector."""
    from exporter import collectors
    from exporter.arguments import build_parser
    from exporter.startup import build_context

    ctx, sim = build_context(build_parser().parse_args(
        ["--simulate", "p5.48xlarge", "--scenario", "gpu-lost", "--scenario", "efa-counters-unreadable",
         "--scenario", "lustre-debugfs-missing", "--scenario", "lustre-lbug"]))
    runner = Runner.from_config(collectors.build(ctx, None), ctx.config, pool=test_pool())
    sim.start()
    runner.start()
    try:
        with serving(runner) as addr:
            base = f"http://{addr}"
            wait_ready(base)
            healthy_page = requests.get(base + "/", timeout=10).text  # before the GPU is lost (at 3 s)
            deadline = time.monotonic() + START_HANG_GUARD_S
            while value(requests.get(base + "/metrics", timeout=10).text, "gpu_lost", gpu="3") != 1:
                assert time.monotonic() < deadline, "GPU 3 was not lost (hang guard)"
                time.sleep(0.5)
            page = requests.get(base + "/", timeout=10).text
    finally:
        sim.close()
    assert "Node verdict: " in healthy_page
    assert 'Node verdict: <span class="bad">reboot_required</span>' in page
    assert "<code>gpu_lost</code>" in page  # the node's reason
    assert "gpu 3, pci_bus_id" in page and "lost (fell off the bus)" in page
    efa_row = next(r for r in page.split("<tr>") if r.startswith("<td>efa</td>"))
    assert "ok, with problems" in efa_row and "EFA device not readable" in efa_row
    assert "device rdmap" in efa_row
    lustre_row = next(r for r in page.split("<tr>") if r.startswith("<td>lustre</td>"))
    assert "source debugfs: Lustre source not readable" in lustre_row
    assert "lustre_client_health_status: status lbug" in lustre_row
    gpu_row = next(r for r in page.split("<tr>") if r.startswith("<td>gpu</td>"))
    assert "NVML reads failed" in gpu_row
