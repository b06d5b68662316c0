"""The kubelet kind under answers it must not believe (a 4 MiB answer of 1.3 million one-character
device ids, read whole, would take the daemon past the 256 MiB of the systemd unit and the
DaemonSet), and what it costs to run: no thread.

Each oversized answer is served by a real gRPC server (grpcio) and read by the exporter's client in
a fresh interpreter, whose peak RSS (VmHWM) and CPU time are measured around the one call.
The bounded decoder is checked against protobuf's own decoding of what protobuf encodes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.tools.simulate.podresources_server import PodResourcesServer
from exporter.workload import podresources_wire as wire
from exporter.workload.kubelet import KubeletClient, KubeletError
from exporter.workload.podresources import api_pb2
from tests.helpers import DEADLINE_MARGIN_S, HANG_GUARD_S, ROOT, START_HANG_GUARD_S, running_exporter
from tests.test_workload_kubelet import Lister, serve, stopped

# The unit's MemoryMax and the DaemonSet's limit (deploy/systemd/gpu-health-exporter.service,
# deploy/kubernetes/base/daemonset.yaml); the served exporter is 40-60 MiB before any answer.
LIMIT_MIB = 256
MAX_GROWTH_MIB = 64  # what one answer may add to the reading process at most
MAX_CPU_S = 2.0


def ld(field: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    n, out = len(payload), bytearray([field << 3 | 2])
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + payload


def one_container(ids_blob: bytes) -> bytes:
    """ListPodResourcesResponse: one pod, one container, one nvidia.com/gpu device list."""
    devices = ld(1, b"nvidia.com/gpu") + ids_blob
    container = ld(1, b"main") + ld(2, devices)
    return ld(1, ld(1, b"p") + ld(2, b"ml") + ld(3, container))


CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from exporter.workload.kubelet import KubeletClient, KubeletError
c = KubeletClient(sys.argv[2], 20.0)
def rss(field="VmRSS:"):  # VmHWM: the peak (ru_maxrss would carry the parent's across fork and exec)
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
from exporter.workload import grpc_h2  # noqa: F401 - imported before the baseline
before, t, w = rss(), time.process_time(), time.monotonic()
try:
    n = len(c.list().devices)
    err = ""
except KubeletError as e:
    n, err = -1, str(e)
print(json.dumps({"before": before, "peak": rss("VmHWM:"),
                  "cpu": time.process_time() - t, "wall": time.monotonic() - w, "devices": n, "error": err}))
"""


def read_in_child(sock: Path) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), str(sock)], capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.fixture
def server(tmp_path):
    servers = []
    sock = tmp_path / "kubelet.sock"

    def start(raw: bytes):
        servers.append(serve(sock, Lister([], raw=raw)))
        return sock

    yield start
    for s in servers:
        stopped(s)


@pytest.mark.parametrize("name,answer", [
    # 4 MiB: 1.3 million one-character device ids
    ("1.3 million device ids in 4 MiB", lambda: one_container(ld(2, b"a") * 1_300_000)),
    # 15 MB of device ids, under the 16 MiB limit
    ("15 MB of device ids", lambda: one_container(ld(2, b"GPU-0") * 2_140_000)),
    # 15 MB of empty pods: every one an allocation in protobuf's parser
    ("15 MB of empty pods", lambda: ld(1, b"") * 7_500_000),
    # 15 MB of small fields the exporter does not read (packed cpu ids would be one field)
    ("15 MB of unread fields", lambda: b"\x08\x01" * 7_500_000),
])
def test_an_answer_over_the_counts_is_refused_within_memory_and_cpu(server, name, answer):
    sock = server(answer())
    got = read_in_child(sock)
    assert got["devices"] == -1 and "refused" in got["error"] and "more than" in got["error"], got
    assert got["peak"] - got["before"] <= MAX_GROWTH_MIB, f"{name}: {got}"
    assert got["peak"] < LIMIT_MIB, f"{name}: {got}"
    assert got["cpu"] <= MAX_CPU_S, f"{name}: {got}"


def test_an_answer_over_the_size_limit_is_refused_from_its_length_prefix(server):
    """100 MiB: refused once the 5-byte prefix is read, before the body is (the server is still
    sending when the client hangs up)."""
    sock = server(b"\x00" * (100 << 20))
    got = read_in_child(sock)
    assert got["devices"] == -1 and "104,857,600 bytes" in got["error"], got
    assert got["peak"] - got["before"] <= 16, got
    assert got["cpu"] <= 0.5 and got["wall"] < 5, got


def test_a_long_name_is_refused_not_kept(server):
    sock = server(one_container(ld(2, b"x" * 5000)))
    with pytest.raises(KubeletError, match="a name of 5,000 bytes"):
        KubeletClient(str(sock), 5.0).list()


def test_malformed_answers_are_a_clear_error(server):
    sock = server(b"\x0a\xff\xff\xff\xff\x0f")  # a length running past the end
    with pytest.raises(KubeletError, match="not a ListPodResourcesResponse"):
        KubeletClient(str(sock), 5.0).list()


def test_the_kind_starts_no_thread(tmp_path):
    """No thread count rises when the kind is on. The simulated kubelet runs in its own
    process, as a kubelet does; this process's tasks (every thread, C ones included) are counted
    before and after List calls, and no Python thread is started."""
    sock = tmp_path / "kubelet.sock"
    srv = PodResourcesServer(str(sock), [("ml", "a", "main", "nvidia.com/gpu", ["GPU-1"])])
    started = []
    real = threading.Thread.start

    def start(self):
        started.append(self.name)
        real(self)

    tasks = Path("/proc/self/task")
    try:
        before = len(list(tasks.iterdir()))
        threading.Thread.start = start
        client = KubeletClient(str(sock), 5.0)
        for _ in range(20):
            assert [d.device_id for d in client.list().devices] == ["GPU-1"]
        after = len(list(tasks.iterdir()))
    finally:
        threading.Thread.start = real
        srv.stop()
    assert started == [] and after == before, (started, before, after)


@pytest.mark.slow
def test_the_simulated_p5_with_the_kubelet_kind_runs_at_most_12_threads():
    import requests

    from tests.test_threads import _child
    with running_exporter("--simulate", "p5.48xlarge", "--scenario", "k8s-pods", "--nvml-latencies",
                          "--log-level", "warning") as url:
        proc = _child(int(url.rsplit(":", 1)[-1]))
        with requests.Session() as s:
            for _ in range(40):
                body = s.get(url + "/metrics", timeout=30).text
        assert 'gpu_workload_info{' in body and 'pod="llama-pretrain-0"' in body
        assert not any("grpc" in m.path for m in proc.memory_maps())
        # a transient start-up thread (the identity lookup) may still be ending (as test_threads.py)
        task_dir = Path(f"/proc/{proc.pid}/task")
        deadline = time.monotonic() + START_HANG_GUARD_S
        while len(tasks := list(task_dir.iterdir())) > 12 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert len(tasks) <= 12, f"{len(tasks)} threads"


# -- the bounded decoder against protobuf -------------------------------------------------------

names = st.text(max_size=12)
topology = st.lists(st.integers(-5, 5), max_size=3)
device_lists = st.lists(st.tuples(names, st.lists(names, max_size=4), topology), max_size=3)
claim_resources = st.lists(st.tuples(st.lists(names, max_size=3), names, names, names), max_size=3)
dynamic = st.lists(st.tuples(names, names, claim_resources), max_size=2)
containers = st.lists(st.tuples(names, device_lists, st.lists(st.integers(0, 500), max_size=4), dynamic),
                      max_size=3)
pods = st.lists(st.tuples(names, names, containers), max_size=4)


@settings(max_examples=150, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(pods)
def test_the_decoder_reads_what_protobuf_writes_as_protobuf_reads_it(spec):
    resp = api_pb2.ListPodResourcesResponse()
    for pname, ns, cs in spec:
        p = resp.pod_resources.add(name=pname, namespace=ns)
        for cname, devs, cpus, dyn in cs:
            c = p.containers.add(name=cname, cpu_ids=cpus)
            c.memory.add(memory_type="hugepages-1Gi", size=1 << 30).topology.nodes.add(ID=1)
            for resource, ids, numa in devs:
                d = c.devices.add(resource_name=resource, device_ids=ids)
                for n in numa:
                    d.topology.nodes.add(ID=n)
            for claim, cns, crs in dyn:
                dr = c.dynamic_resources.add(claim_name=claim, claim_namespace=cns)
                for cdi, driver, pool, dev in crs:
                    r = dr.claim_resources.add(driver_name=driver, pool_name=pool, device_name=dev)
                    for x in cdi:
                        r.cdi_devices.add(name=x)
    parsed = api_pb2.ListPodResourcesResponse.FromString(resp.SerializeToString())
    want_devices = [wire.Device(p.namespace, p.name, c.name, d.resource_name, i)
                    for p in parsed.pod_resources for c in p.containers for d in c.devices
                    for i in d.device_ids]
    want_claims = [wire.ClaimDevice(p.namespace, p.name, c.name, f"{dr.claim_namespace}/{dr.claim_name}",
                                    r.driver_name, r.pool_name, r.device_name,
                                    tuple(x.name for x in r.cdi_devices))
                   for p in parsed.pod_resources for c in p.containers for dr in c.dynamic_resources
                   for r in dr.claim_resources]
    assert wire.decode_list(resp.SerializeToString()) == (want_devices, want_claims)


@settings(max_examples=300, derandomize=True)
@given(st.binary(max_size=200))
def test_no_bytes_make_the_decoder_raise_anything_but_its_own_errors(data):
    try:
        wire.decode_list(data)
    except (wire.Malformed, wire.AnswerTooLarge):
        pass


def test_a_socket_file_nobody_listens_on_is_unreachable_at_once(tmp_path):
    """A kubelet killed without removing its socket leaves the file: connect() is refused."""
    import socket

    path = tmp_path / "kubelet.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    t = time.monotonic()
    with pytest.raises(KubeletError, match="cannot be reached: connect: .*ECONNREFUSED"):
        KubeletClient(str(path), START_HANG_GUARD_S).list()
    assert time.monotonic() - t < DEADLINE_MARGIN_S  # refused, not waited for until the timeout


@pytest.mark.parametrize("reply,why", [
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", "answer is not HTTP/2"),  # not an HTTP/2 server
    (b"", "closed the connection"),  # accepts and hangs up
])
def test_a_socket_that_is_not_a_grpc_server_is_a_clear_error(tmp_path, reply, why):
    import socket

    path = tmp_path / "kubelet.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(1)

    def answer():
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(reply)
        conn.close()

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        with pytest.raises(KubeletError, match=why):
            KubeletClient(str(path), 5.0).list()
    finally:
        t.join(START_HANG_GUARD_S)
        listener.close()
