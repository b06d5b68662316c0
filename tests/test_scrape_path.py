"""The scrape path, the telemetry path and the `collect[]` filter: the content coding negotiated
once, the landing page from the health collector's reading, refreshed when old; node_exporter's
per-request collector filter."""

import gzip
import threading
import time

import pytest
import requests

from exporter import collectors, exposition
from exporter.arguments import build_parser
from exporter.collection import Collection
from exporter.runner import Runner
from exporter.startup import build_context
from exporter.web import server
from exporter.web.httpd import Request
from exporter.web.server import App, Server
from exporter.xid.verdict import GpuVerdict, NodeVerdict
from tests.helpers import samples, test_pool, value
from tests.test_runner import Probe


class StubRunner:
    """What App reads of a Runner: collect(), readings, status, collectors, ready."""

    def __init__(self, verdict=None):
        self.readings = {"health": verdict}
        self.status = {}
        self.collectors = []
        self.ready = threading.Event()
        self.calls = 0

    def collect(self, scrape=True, arrived=None):
        self.calls += 1
        return Collection()


def _get(app, path, query="", **headers):
    return app(Request("GET", path, query, {k.replace("_", "-"): v for k, v in headers.items()}, "test"))


def test_the_content_coding_is_negotiated_once(monkeypatch):
    calls = []
    real = exposition.choose_encoding

    def counting(header):
        calls.append(header)
        return real(header)

    monkeypatch.setattr(server, "choose_encoding", counting)
    monkeypatch.setattr(exposition, "choose_encoding", counting)
    resp = _get(App(StubRunner()), "/metrics", accept_encoding="gzip")
    assert resp.status == 200 and calls == ["gzip"]
    headers = dict(resp.headers)
    assert headers["Content-Encoding"] == "gzip" and "Content-Length" not in headers  # httpd sets it
    assert gzip.decompress(resp.body).startswith(b"# HELP process_")


def test_scrapes_sharing_a_collection_share_its_rendered_body(monkeypatch):
    """Pipelined or concurrent scrapes that get the same collection cost one render, per format."""
    calls = []
    real = server.encode

    def counting(*a):
        calls.append(a[1:])
        return real(*a)

    monkeypatch.setattr(server, "encode", counting)
    runner = StubRunner()
    shared = Collection()
    runner.collect = lambda scrape=True, arrived=None: shared
    app = App(runner)
    bodies = {_get(app, "/metrics", accept_encoding="gzip").body for _ in range(5)}
    assert len(calls) == 1 and len(bodies) == 1
    _get(app, "/metrics", accept="application/openmetrics-text")  # another format: its own render
    assert len(calls) == 2
    shared = Collection()  # a new collection
    _get(app, "/metrics", accept_encoding="gzip")
    assert len(calls) == 3


def test_a_request_queued_before_a_collection_gets_that_collection():
    """A request that waited in the server's queue while a collection ran (it arrived before
    that collection started) is answered from it, not with a collection of its own: 600 queued
    requests cost a collection or two, not 150."""
    probe = Probe("alpha")
    runner = Runner([probe], deadline_s=5, pool=test_pool())
    try:
        arrived = time.monotonic()
        first = runner.collect()
        assert runner.collect(arrived=arrived) is first
        assert runner.collect(arrived=time.monotonic()) is not first  # arrived after: a new one
        assert probe.calls == 2
    finally:
        runner.close()


def test_the_landing_page_shows_the_health_collectors_reading():
    """The verdict comes from the reading the runner holds, not from metric samples (the stub's
    collection has none)."""
    nv = NodeVerdict("reboot_required", ["gpu_lost"],
                     [GpuVerdict("3", "GPU-x", "0000:53:00.0", "reboot_required", ["gpu_lost"]),
                      GpuVerdict("0", "GPU-y", "0000:18:00.0")], 8, 8)
    page = _get(App(StubRunner(nv)), "/").body.decode()
    assert 'Node verdict: <span class="bad">reboot_required</span>' in page
    assert "<code>gpu_lost</code>" in page
    row3 = next(r for r in page.split("<tr>") if r.startswith("<td>3</td>"))
    assert '<td class="bad">reboot_required</td>' in row3 and "<code>gpu_lost</code>" in row3
    row0 = next(r for r in page.split("<tr>") if r.startswith("<td>0</td>"))
    assert '<td class="good">healthy</td>' in row0  # every GPU is listed, healthy ones too


def test_the_landing_page_collects_when_its_reading_is_old():
    """A user who injects a fault and opens / sees it without waiting for a scrape."""
    runner = StubRunner()
    app = App(runner)
    _get(app, "/")
    assert runner.calls == 1  # nothing collected yet
    _get(app, "/")
    assert runner.calls == 1  # fresh: the last reading is shown
    app.last_at = time.time() - server.LANDING_MAX_AGE_S - 1
    _get(app, "/")
    assert runner.calls == 2


@pytest.fixture(scope="module")
def gpu_and_efa():
    """The simulated p5 with the gpu, efa and health collectors, served on 127.0.0.1 at /probe."""
    names = ["gpu", "efa", "health"]
    args = ["--simulate", "p5.48xlarge", "--collectors", ",".join(names)]
    ctx, sim = build_context(build_parser().parse_args(args))
    runner = Runner(collectors.build(ctx, names), 10.0, pool=test_pool())
    runner.start()
    srv = Server(runner, "127.0.0.1", 0, telemetry_path="/probe")
    srv.start()
    yield f"http://127.0.0.1:{srv.port}"
    srv.shutdown()
    runner.close()
    sim.close()


def test_the_telemetry_path_is_configurable(gpu_and_efa):
    assert requests.get(gpu_and_efa + "/probe", timeout=30).status_code == 200
    r = requests.get(gpu_and_efa + "/metrics", timeout=30)
    assert r.status_code == 404 and "/probe" in r.text
    assert requests.get(gpu_and_efa + "/healthz", timeout=10).status_code == 200
    with pytest.raises(ValueError):
        Server(Runner([], 1.0, pool=test_pool()), "127.0.0.1", 0, telemetry_path="/healthz")


def test_collect_filters_collectors_and_keeps_the_exporters_own(gpu_and_efa):
    every = samples(requests.get(gpu_and_efa + "/probe", timeout=30).text)
    assert any(n.startswith("efa_") for n, _ in every) and any(n.startswith("gpu_") for n, _ in every)
    text = requests.get(gpu_and_efa + "/probe?collect[]=gpu", timeout=30).text
    s = samples(text)
    assert value(s, "gpu_devices") == 8
    assert not any(n.startswith("efa_") for n, _ in s)
    assert not any(n.startswith("gpu_health_verdict") or n.startswith("gpu_node_health") for n, _ in s)
    # The exporter's own series stay; success and duration only for the collector asked for.
    assert value(s, "gpu_health_exporter_build_info") == 1
    assert value(s, "gpu_health_exporter_scrapes_total") >= 1
    assert value(s, "process_resident_memory_bytes") > 0
    assert value(s, "gpu_health_exporter_collector_success", collector="gpu") == 1
    assert {dict(ls)["collector"] for n, ls in s if n == "gpu_health_exporter_collector_success"} == {"gpu"}
    # Two collectors, repeated and URL-encoded parameters, as Prometheus' params send them.
    both = samples(requests.get(gpu_and_efa + "/probe", params={"collect[]": ["efa", "health"]},
                                timeout=30).text)
    assert any(n.startswith("efa_") for n, _ in both)
    assert value(both, "gpu_node_health_verdict", verdict="healthy") == 1
    assert not any(n == "gpu_devices" for n, _ in both)
    # exclude[] keeps all but those.
    ex = samples(requests.get(gpu_and_efa + "/probe?exclude[]=efa", timeout=30).text)
    assert not any(n.startswith("efa_") for n, _ in ex) and value(ex, "gpu_devices") == 8


@pytest.mark.parametrize("query, words", [
    ("collect[]=gpu&collect[]=nvme", ["'nvme'", "enabled: efa, gpu, health"]),
    ("collect[]=lustre", ["'lustre'"]),  # a collector that exists but is not enabled
    ("collect[]=gpu&exclude[]=efa", ["together"]),
])
def test_collect_with_an_unknown_collector_is_a_400_naming_it(gpu_and_efa, query, words):
    r = requests.get(gpu_and_efa + "/probe?" + query, timeout=30)
    assert r.status_code == 400
    for w in words:
        assert w in r.text
