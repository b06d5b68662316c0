"""What the exporter's imports load (each costs memory on every node):
prometheus_client is the metric model, so the CLI and every collector module load its model's
modules, but not its package's `__init__` (exporter/metric.py), which imports its HTTP servers and
push clients (http.server, wsgiref, urllib.request, email, ssl: 2.6 MiB of the served exporter's
RSS, docs/performance.md). What a default node does not use stays out: requests (the Kubernetes
condition writer's client, loaded only with the writer on), bcrypt (basic auth only), the NVML
bindings until NVML is first used, asyncio and multiprocessing; IMDS is asked over http.client
without ssl."""

import json
import subprocess
import sys

from tests.helpers import HANG_GUARD_S, ROOT

PRESENT = ["prometheus_client", "prometheus_client.metrics_core", "prometheus_client.samples"]
ABSENT = ["requests", "urllib3", "bcrypt", "pynvml", "asyncio", "multiprocessing",
          "grpc", "google.protobuf", "h2", "hpack", "hyperframe",  # h2: only with workload.kubelet_socket
          *(PROMETHEUS_CLIENT_SERVERS := ["prometheus_client.exposition", "prometheus_client.registry",
                                          "http.server", "wsgiref", "urllib.request", "email", "ssl"])]

CHILD = """
import json, sys
import exporter.cli
from exporter import collectors
from exporter.metric import Metric, Sample
loaded = sorted(collectors.collector_classes())
model = [f"{t.__module__}.{t.__name__}" for t in (Metric, Sample)]
present = [m for m in sys.argv[1:] if m in sys.modules]
print(json.dumps({"collectors": loaded, "present": present, "model": model}))
"""


def test_cli_and_every_collector_load_prometheus_client_and_nothing_a_node_does_not_use():
    r = subprocess.run([sys.executable, "-c", CHILD, *PRESENT, *ABSENT], cwd=ROOT, capture_output=True,
                       text=True, timeout=HANG_GUARD_S, check=True)
    out = json.loads(r.stdout)
    assert {"gpu", "efa", "xid", "lustre"} <= set(out["collectors"]), out["collectors"]
    assert out["present"] == PRESENT
    assert out["model"] == ["prometheus_client.metrics_core.Metric", "prometheus_client.samples.Sample"]


def test_prometheus_client_is_whole_for_whoever_imports_it_after_the_exporter():
    """The package's `__init__` runs when a name of it is first asked for (a test's registry, a
    tool's generate_latest), with the classes the exporter's families already have."""
    code = """
import exporter.metric
from prometheus_client import REGISTRY, Metric, generate_latest
import prometheus_client.samples
assert Metric is exporter.metric.Metric and prometheus_client.samples.Sample is exporter.metric.Sample
assert b"python_gc_objects_collected_total" in generate_latest(REGISTRY)
"""
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=HANG_GUARD_S)


# The served exporter: what the process imports over its life, start-up and
# scrapes, from Python's own import log (PYTHONPROFILEIMPORTTIME, written to the exporter's log).
# A subcommand's imports (`capture`'s recorder: statistics, decimal, the fake NVML) were made by
# every daemon, because the parser lists the subcommands. The tools (the simulation, the
# generators, the release builder) are exporter.tools: a node never imports them; `--simulate`
# does, the simulated node being that tool (its own sources), so the served runs below are
# checked for the rest, and a node's defaults for exporter.tools too.
# The kubelet kind's client decodes the answer itself: protobuf is the simulated kubelet's (a
# process of its own), never the exporter's. asyncio (the HTTP server's event loop) is imported
# without ssl unless TLS is on (exporter/web/aio.py).
NEVER_SERVED = ["exporter.capture", "statistics", "requests", "urllib3", "bcrypt", "grpc", "google.protobuf",
                "prometheus_client.exposition", "prometheus_client.registry", "http.server", "wsgiref",
                "urllib.request", "email"]
KUBELET_ONLY = ["h2", "hpack", "hyperframe"]
# ssl's C module: the import log also lists asyncio's `import ssl` that exporter/web/aio.py refuses (a
# failed import, a few microseconds), while ssl cannot load without _ssl.
TLS_ONLY = ["_ssl"]
TOOLS = "exporter.tools"


def _served_imports(tmp_path, monkeypatch, *args: str, until=None, **get_kw) -> set[str]:
    """What the served exporter imported over three scrapes (and until `until()` is true)."""
    import re

    import requests

    from tests.helpers import start_exporter, stop_within, wait_for

    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    proc, url, log = start_exporter(tmp_path, *args, **get_kw)
    try:
        for _ in range(3):
            assert requests.get(url, timeout=30, **get_kw).ok
        if until is not None:
            wait_for(until, what="the exporter's background work", proc=proc, log=log)
    finally:
        stop_within(proc)
    found = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+([\w.]+)$", log.read_text(), re.M))
    assert {"exporter.web.httpd", "asyncio", "psutil"} <= found, log.read_text()[-2000:]  # the import log
    return found


def _tools(found: set[str]) -> set[str]:
    return {m for m in found if m == TOOLS or m.startswith(f"{TOOLS}.")}


def test_the_served_exporter_imports_only_what_its_kinds_use(tmp_path, monkeypatch):
    node = _served_imports(tmp_path, monkeypatch)  # a node's defaults, no GPU here
    assert sorted(node & {*NEVER_SERVED, *KUBELET_ONLY, *TLS_ONLY}) == []
    assert sorted(_tools(node)) == []
    p5 = _served_imports(tmp_path, monkeypatch, "--simulate", "p5.48xlarge")
    assert sorted(p5 & {*NEVER_SERVED, *KUBELET_ONLY, *TLS_ONLY}) == []
    assert _tools(p5) and "google.protobuf" not in p5  # the simulation, lazily, and no kubelet
    kubelet = _served_imports(tmp_path, monkeypatch, "--simulate", "p5.48xlarge", "--scenario", "k8s-pods")
    assert sorted(kubelet & {*NEVER_SERVED, *TLS_ONLY}) == []
    assert set(KUBELET_ONLY) <= kubelet  # the kind's client, and only with the kind on


def test_an_ec2_node_asks_imds_without_ssl_or_an_http_library(tmp_path, monkeypatch):
    """Every EC2 node asks IMDS (its identity, the scheduled events), over plain HTTP: http.client,
    imported without ssl; requests, urllib3 and ssl stay out."""
    from exporter.tools.simulate.imds import FakeImdsServer

    dmi = tmp_path / "sys" / "devices" / "virtual" / "dmi" / "id"
    dmi.mkdir(parents=True)
    (dmi / "sys_vendor").write_text("Amazon EC2\n")  # an EC2 instance whose type DMI does not give
    fake = FakeImdsServer({"instance-type": "p5.48xlarge", "instance-id": "i-0123456789abcdef0",
                           "placement/availability-zone": "us-east-2b"})
    fake.start(poll_interval_s=0.05)
    cfg = tmp_path / "ec2.yaml"
    cfg.write_text(f"paths:\n  sysfs: {tmp_path / 'sys'}\ninstance:\n  imds_endpoint: {fake.url}\n")
    asked = {"/latest/meta-data/instance-id", "/latest/meta-data/events/maintenance/scheduled"}
    try:
        ec2 = _served_imports(tmp_path, monkeypatch, "--config", str(cfg),
                              until=lambda: asked <= {p for _, p in fake.requests})
    finally:
        fake.close()
    assert "http.client" in ec2
    assert sorted(ec2 & {"requests", "urllib3", *TLS_ONLY}) == []  # _ssl: ssl never loaded


def _self_signed(d) -> tuple[str, str]:
    """A certificate for 127.0.0.1 (its own CA) and its key, in d."""
    import shutil

    exe = shutil.which("openssl")
    assert exe, "openssl is missing: install Debian's 'openssl' package (.ci/run does)"
    subprocess.run([exe, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", "server.key", "-out", "server.crt", "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                   cwd=d, check=True, capture_output=True, timeout=HANG_GUARD_S)
    return str(d / "server.crt"), str(d / "server.key")


def test_the_served_exporter_imports_ssl_with_tls_on(tmp_path, monkeypatch):
    """The same node serving HTTPS (the scrapes are over it): ssl is loaded, bcrypt is not (no
    basic auth)."""
    crt, key = _self_signed(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n")
    tls = _served_imports(tmp_path, monkeypatch, "--simulate", "p5.48xlarge", "--web.config.file", str(web),
                          verify=crt)
    assert {"ssl", *TLS_ONLY} <= tls
    assert sorted(tls & {*NEVER_SERVED, *KUBELET_ONLY}) == []


HANDED_OVER = """
import socket, sys
import exporter.web.httpd as h
assert "_ssl" not in sys.modules and "asyncio" in sys.modules, "asyncio was imported with ssl"
import ssl
crt, key = sys.argv[1:]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(crt, key)
srv = h.HttpServer(lambda req: h.Response(200, b"over tls"), "127.0.0.1", 0, ssl_context=ctx)
srv.start()
try:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as raw, \
            ssl.create_default_context(cafile=crt).wrap_socket(raw, server_hostname="127.0.0.1") as c:
        c.sendall(b"GET / HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
        data = b""
        while chunk := c.recv(65536):
            data += chunk
finally:
    srv.shutdown()
print(data.decode())
"""


def test_a_tls_listener_made_after_asyncio_loaded_without_ssl_serves(tmp_path):
    """exporter/web/aio.py's hand-over: the HTTP server module imported first (asyncio without ssl),
    then a TLS listener; a client completes the handshake and gets its answer."""
    crt, key = _self_signed(tmp_path)
    r = subprocess.run([sys.executable, "-c", HANDED_OVER, crt, key], cwd=ROOT, capture_output=True,
                       text=True, timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("HTTP/1.1 200 ") and r.stdout.rstrip().endswith("over tls"), r.stdout


def _threads(*scenario: str) -> set[str]:
    """The threads of a simulated node's exporter after three collections, but the pool's workers
    (started on demand, as many as reads are under way at once: exporter.deadline)."""
    import threading

    from exporter import collectors
    from exporter.arguments import build_parser
    from exporter.runner import Runner
    from exporter.startup import build_context
    from tests.helpers import scrape

    ctx, sim = build_context(build_parser().parse_args(["--simulate", "p5.48xlarge", *scenario]))
    assert sim is not None
    sim.start()
    runner = Runner.from_config(collectors.build(ctx), ctx.config, pool=ctx.pool)
    try:
        runner.start()
        for _ in range(3):
            scrape(runner)
        if scenario:  # the kind read the simulated kubelet
            assert runner.readings["workload"].by_uuid, runner.status["workload"].error
        return {t.name for t in threading.enumerate() if not t.name.startswith(f"{ctx.pool.name}-")}
    finally:
        runner.close()
        sim.close()
        ctx.pool.close()


def test_the_kubelet_kind_adds_no_thread():
    """Its List call is made in the collection's own thread (exporter/workload/grpc_h2.py), and the
    simulated kubelet is a process of its own: the kind adds no thread."""
    assert _threads("--scenario", "k8s-pods") == _threads()
