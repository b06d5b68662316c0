"""The kubelet kind (an h2 client, exporter.workload.grpc_h2) against a real gRPC server (grpcio, a
test dependency only) on a unix socket implementing PodResourcesLister v1 from the committed .proto:
whole GPUs, MIG devices, GKE's ids, DRA claims and a non-GPU resource; a kubelet that answers
Unimplemented, a missing socket, the socket removed and created again (a kubelet restart), a
kubelet that never answers. And the committed protobuf module is exactly what grpcio-tools makes of
the committed .proto."""

import filecmp
import socket
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.collectors.gpu import GpuCollector
from exporter.collectors.workload import WorkloadCollector, from_config
from exporter.config import load
from exporter.nvml.fake import MIG_DEVICE_UUIDS
from exporter.runner import Runner
from exporter.workload import kubelet
from exporter.workload.model import Workload
from exporter.workload.podresources import api_pb2
from exporter.workload.source import KubeletKind
from tests.helpers import (
    DEADLINE_MARGIN_S,
    HANG_GUARD_S,
    ROOT,
    START_HANG_GUARD_S,
    samples,
    scrape,
    test_pool,
    value,
)
from tests.test_workload_sources import fake_p5
from tests.test_xid_service import make_ctx

PROTO_DIR = ROOT / "exporter/workload/podresources"


class Lister:
    """Lists `pods`: [(namespace, pod, container, resource, [device ids])], and `claims`:
    [(namespace, pod, container, claim, [(driver, pool, device, [CDI names])])]; with `hang` set,
    List waits on it (a kubelet that never answers). `raw` (bytes) is answered as it is."""

    def __init__(self, pods, hang=None, claims=(), raw=None):
        self.pods, self.hang, self.claims, self.raw, self.calls = pods, hang, claims, raw, 0

    def response(self):
        resp = api_pb2.ListPodResourcesResponse()
        for ns, pod, container, resource, ids in self.pods:
            p = resp.pod_resources.add(name=pod, namespace=ns)
            p.containers.add(name=container).devices.add(resource_name=resource, device_ids=ids)
        for ns, pod, container, claim, devices in self.claims:
            c = resp.pod_resources.add(name=pod, namespace=ns).containers.add(name=container)
            d = c.dynamic_resources.add(claim_name=claim, claim_namespace=ns)
            for driver, pool, device, cdi in devices:
                r = d.claim_resources.add(driver_name=driver, pool_name=pool, device_name=device)
                for name in cdi:
                    r.cdi_devices.add(name=name)
        return resp.SerializeToString()

    def List(self, request, context):  # noqa: N802 - the RPC's name
        self.calls += 1
        if self.hang is not None:
            self.hang.wait(30)
        return self.raw if self.raw is not None else self.response()


def serve(path, servicer):
    """A grpcio server of PodResourcesLister/List on a unix socket (no handler with servicer None:
    grpc answers UNIMPLEMENTED, as a kubelet without v1 List does)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_send_message_length", -1)])
    if servicer is not None:
        handler = grpc.unary_unary_rpc_method_handler(
            servicer.List, request_deserializer=api_pb2.ListPodResourcesRequest.FromString,
            response_serializer=lambda b: b)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister", {"List": handler})])
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return server


def Unimplemented():  # noqa: N802 - reads as the servicer it stands for
    return None


@pytest.fixture
def node(tmp_path):
    fake, session = fake_p5()
    servers = []
    yield fake, session, tmp_path / "kubelet.sock", servers
    for s in servers:
        stopped(s)


def stopped(server: grpc.Server) -> None:
    """Stop a server and wait until it has: grpc removes its unix socket when the shutdown
    completes, after stop() returns, and would remove the next server's socket at that path
    (a stress-ng CI run caught it)."""
    assert server.stop(0).wait(30), "the gRPC server did not stop within 30 s"


def kind(session, sock, timeout_s=2.0, resources=kubelet.DEFAULT_RESOURCES):
    return KubeletKind(session, str(sock), resources, timeout_s)


def pod(name, container="main"):
    return Workload(namespace="ml", pod=name, container=container)


def test_whole_gpus_mig_devices_and_other_resources(node):
    fake, session, sock, servers = node
    gpus = session.devices
    mig_uuid = "MIG-5b2d4f1c-9a4e-5c1b-8e0d-000000000003"
    fake.set_value(3, MIG_DEVICE_UUIDS, [mig_uuid, "MIG-5b2d4f1c-9a4e-5c1b-8e0d-000000000004"])
    servers.append(serve(sock, Lister([
        ("ml", "a", "main", "nvidia.com/gpu", [gpus[0].uuid, gpus[1].uuid.lower()]),
        ("ml", "b", "main", "nvidia.com/gpu", ["nvidia2"]),  # device-name ids
        ("ml", "c", "main", "nvidia.com/mig-1g.10gb", [mig_uuid + "::7"]),  # EKS's form
        ("ml", "d", "main", "nvidia.com/mig-3g.40gb", [f"MIG-{gpus[4].uuid}/1/0"]),  # the old form
        ("ml", "e", "main", "nvidia.com/gpu", [f"{gpus[5].uuid}::2"]),  # a time-slicing replica
        ("ml", "f", "side", "nvidia.com/gpu", [f"{gpus[5].uuid}::3"]),
        ("ml", "a", "main", "vpc.amazonaws.com/efa", ["efa0"]),  # not a GPU
        ("ml", "g", "main", "example.com/fpga", [gpus[6].uuid]),  # a resource not configured
    ])))
    out, problems = kind(session, sock).read(gpus)
    assert problems == []
    assert {g.index: out[g.uuid] for g in gpus} == {
        0: (pod("a"),), 1: (pod("a"),), 2: (pod("b"),), 3: (pod("c"),), 4: (pod("d"),),
        5: (pod("e"), pod("f", "side")), 6: (), 7: ()}


def test_resource_names_are_configurable(node):
    _, session, sock, servers = node
    gpus = session.devices
    servers.append(serve(sock, Lister([("ml", "g", "main", "example.com/gpu", [gpus[6].uuid])])))
    out, _ = kind(session, sock, resources=["example.com/*"]).read(gpus)
    assert out[gpus[6].uuid] == (pod("g"),)


def test_a_device_matching_no_gpu_is_a_problem_and_no_gpu_is_called_idle(node):
    _, session, sock, servers = node
    gpus = session.devices
    servers.append(serve(sock, Lister([("ml", "a", "main", "nvidia.com/gpu", [gpus[0].uuid]),
                                       ("ml", "x", "main", "nvidia.com/mig-1g.10gb", ["MIG-unknown"])])))
    out, problems = kind(session, sock).read(gpus)
    assert out == {gpus[0].uuid: (pod("a"),)}
    assert "MIG-unknown" in problems[0] and "ml/x" in problems[0]


def test_unimplemented_missing_socket_and_restart(node):
    _, session, sock, servers = node
    gpus = session.devices
    k = kind(session, sock)
    with pytest.raises(kubelet.KubeletError, match="does not exist"):
        k.read(gpus)
    servers.append(serve(sock, Unimplemented()))
    with pytest.raises(kubelet.KubeletError, match="Unimplemented"):
        k.read(gpus)
    stopped(servers.pop())
    sock.unlink(missing_ok=True)
    servers.append(serve(sock, Lister([("ml", "a", "main", "nvidia.com/gpu", [gpus[0].uuid])])))
    assert k.read(gpus)[0][gpus[0].uuid] == (pod("a"),)
    # the kubelet restarts: its socket is removed and created again by a new server
    stopped(servers.pop())
    sock.unlink(missing_ok=True)
    servers.append(serve(sock, Lister([("ml", "b", "main", "nvidia.com/gpu", [gpus[1].uuid])])))
    out, _ = k.read(gpus)  # at once: no back-off on the dead connection
    assert out[gpus[1].uuid] == (pod("b"),) and out[gpus[0].uuid] == ()


def test_a_kubelet_that_never_answers_misses_the_deadline_and_the_next_reading_works(node):
    _, session, sock, servers = node
    gpus = session.devices
    gate = threading.Event()
    lister = Lister([("ml", "a", "main", "nvidia.com/gpu", [gpus[0].uuid])], hang=gate)
    servers.append(serve(sock, lister))
    k = kind(session, sock, timeout_s=0.5)
    t = time.monotonic()
    with pytest.raises(kubelet.KubeletError, match="did not answer List within 0.5s"):
        k.read(gpus)
    assert time.monotonic() - t < DEADLINE_MARGIN_S  # the 0.5 s deadline: the kubelet hangs until the gate
    gate.set()
    lister.hang = None
    assert k.read(gpus)[0][gpus[0].uuid] == (pod("a"),)


def test_the_collector_over_a_real_socket(node, tmp_path):
    _, session, sock, servers = node
    gpus = session.devices
    servers.append(serve(sock, Lister([("ml", "a", "main", "nvidia.com/gpu", [gpus[2].uuid, gpus[5].uuid])])))
    ctx = make_ctx(tmp_path, "", nvml=session)
    ctx.config = load(None, {"workload.kubelet_socket": str(sock), "workload.timeout_seconds": 1.0})
    ctx.workload = from_config(ctx.config, session, ctx.pool)
    runner = Runner([WorkloadCollector(ctx)], deadline_s=5, pool=test_pool())
    s = samples(scrape(runner))
    for g in (2, 5):
        assert value(s, "gpu_workload_info", gpu=str(g), namespace="ml", pod="a", container="main") == 1
    assert {frozenset(dict(ls)) for (n, ls) in s if n == "gpu_workload_info"} == {
        frozenset({"gpu", "uuid", "namespace", "pod", "container"})}
    stopped(servers.pop())
    sock.unlink(missing_ok=True)  # grpc removes it on stop; a killed kubelet leaves it
    s = samples(scrape(runner))
    assert value(s, "gpu_health_exporter_collector_success", collector="workload") == 0
    assert "does not exist" in runner.status["workload"].error
    assert not [n for (n, _) in s if n == "gpu_workload_info"]
    runner.close()


def test_the_committed_protobuf_modules_are_generated_from_the_committed_proto(tmp_path):
    """grpcio-tools (a test dependency only) regenerates it; any difference fails."""
    rel = "exporter/workload/podresources/api.proto"
    out = tmp_path / "gen"
    out.mkdir()
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(ROOT), f"--python_out={out}",
                    str(ROOT / rel)], check=True, timeout=HANG_GUARD_S)
    assert sorted(p.name for p in PROTO_DIR.glob("*_pb2*.py")) == ["api_pb2.py"]
    assert filecmp.cmp(out / "exporter/workload/podresources/api_pb2.py", PROTO_DIR / "api_pb2.py",
                       shallow=False), (
        "api_pb2.py differs from what grpc_tools.protoc makes of api.proto: regenerate it with "
        f"`python -m grpc_tools.protoc -I. --python_out=. {rel}`")


@settings(max_examples=200, derandomize=True)
@given(st.text(max_size=120))
def test_no_device_id_makes_matching_raise_or_find_a_gpu_that_is_not_there(device_id):
    gpus = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(8)]
    index = kubelet.GpuIndex({u.lower(): u for u in gpus}, dict(enumerate(gpus)), dict(enumerate(gpus)), {})
    assert index.find(device_id) in (None, *gpus)


def test_a_silent_kubelet_never_holds_up_the_gpu_reading(node, tmp_path):
    _, session, sock, servers = node
    gate = threading.Event()
    servers.append(serve(sock, Lister([], hang=gate)))
    ctx = make_ctx(tmp_path, "", nvml=session)
    ctx.config = load(None, {"workload.kubelet_socket": str(sock), "workload.timeout_seconds": 0.5})
    ctx.workload = from_config(ctx.config, session, ctx.pool)
    runner = Runner.from_config([GpuCollector(ctx), WorkloadCollector(ctx)], ctx.config, pool=test_pool())
    try:
        t = time.monotonic()
        s = samples(scrape(runner))
        assert time.monotonic() - t < DEADLINE_MARGIN_S  # the kubelet hangs until the gate
        assert value(s, "gpu_health_exporter_collector_success", collector="gpu") == 1
        assert value(s, "gpu_health_exporter_collector_success", collector="workload") == 0
        assert "did not answer List within 0.4s" in runner.status["workload"].error
        assert len([1 for (n, _) in s if n == "gpu_lost"]) == 8
    finally:
        gate.set()
        runner.close()


def test_gke_device_ids_match_their_gpu(node):
    """GKE's plugin names a GPU by its device node, nvidia<minor>, a MIG GPU instance
    nvidia<minor>/gi<G> and a time-sharing share .../vgpu<K> (container-engine-accelerators)."""
    _, session, sock, servers = node
    gpus = session.devices
    servers.append(serve(sock, Lister([
        ("ml", "a", "main", "nvidia.com/gpu", ["nvidia1/vgpu0"]),
        ("ml", "b", "main", "nvidia.com/gpu", ["nvidia3/gi1"]),
        ("ml", "c", "main", "nvidia.com/gpu", ["nvidia3/gi2/vgpu0"]),
        ("ml", "d", "main", "nvidia.com/gpu", ["nvidia6"]),
    ])))
    out, problems = kind(session, sock).read(gpus)
    assert problems == []
    assert {g.index: out[g.uuid] for g in gpus if out[g.uuid]} == {
        1: (pod("a"),), 3: (pod("b"), pod("c")), 6: (pod("d"),)}


def test_dra_claimed_gpus_are_their_pods_workloads(node):
    """pod-resources' dynamic_resources (Kubernetes 1.34+): NVIDIA's DRA driver (gpu.nvidia.com)
    names devices gpu-<minor> and gpu-<minor>-mig-<profile>-<start>-<size>, with CDI names
    k8s.gpu.nvidia.com/device=<name> and k8s.gpu.nvidia.com/claim=<claim UID>-<name>."""
    _, session, sock, servers = node
    gpus = session.devices
    uid = "0b5c7f2e-1d3a-4e5f-8a9b-0c1d2e3f4a5b"
    nv = "gpu.nvidia.com"
    servers.append(serve(sock, Lister([("ml", "a", "main", "nvidia.com/gpu", [gpus[0].uuid])], claims=[
        ("ml", "train", "main", "gpus", [(nv, "node-1", "gpu-2", ["k8s.gpu.nvidia.com/device=gpu-2"]),
                                        (nv, "node-1", "gpu-3", [])]),
        ("ml", "mig", "main", "mig", [(nv, "node-1", "gpu-4-mig-9-4-4", [])]),
        ("ml", "cdi", "main", "c", [(nv, "node-1", "", [f"k8s.gpu.nvidia.com/claim={uid}-gpu-5"])]),
        ("ml", "uuid", "main", "u", [(nv, "node-1", "", [f"nvidia.com/gpu={gpus[6].uuid}"])]),
        ("ml", "vm", "main", "v", [(nv, "node-1", "gpu-vfio-0", [])]),  # not an NVML GPU
        ("ml", "nic", "main", "n", [("dra.net", "node-1", "eth1", [])]),  # another driver: not a GPU
    ])))
    out, problems = kind(session, sock).read(gpus)
    assert problems == []
    assert {g.index: out[g.uuid] for g in gpus} == {
        0: (pod("a"),), 1: (), 2: (pod("train"),), 3: (pod("train"),), 4: (pod("mig"),), 5: (pod("cdi"),),
        6: (pod("uuid"),), 7: ()}


def test_a_dra_device_matching_no_gpu_is_a_problem_and_no_gpu_is_called_idle(node):
    _, session, sock, servers = node
    gpus = session.devices
    servers.append(serve(sock, Lister([("ml", "a", "main", "nvidia.com/gpu", [gpus[0].uuid])], claims=[
        ("ml", "x", "main", "gpus", [("gpu.nvidia.com", "node-1", "gpu-99", [])])])))
    out, problems = kind(session, sock).read(gpus)
    assert out == {gpus[0].uuid: (pod("a"),)}
    assert "gpu-99" in problems[0] and "claim ml/gpus" in problems[0] and "ml/x" in problems[0]


def test_dra_drivers_are_configurable(node):
    _, session, sock, servers = node
    gpus = session.devices
    servers.append(serve(sock, Lister([], claims=[
        ("ml", "x", "main", "gpus", [("gpu.example.com", "p", "gpu-1", [])])])))
    assert kind(session, sock).read(gpus)[0][gpus[1].uuid] == ()
    k = KubeletKind(session, str(sock), kubelet.DEFAULT_RESOURCES, 2.0, ["gpu.example.com"])
    assert k.read(gpus)[0][gpus[1].uuid] == (pod("x"),)


def test_the_connection_is_kept_and_made_again_when_the_kubelet_closes_it(node):
    """The client keeps its HTTP/2 connection between readings; a kubelet that closes an idle
    connection (here grpc's max_connection_idle: a GOAWAY) costs no reading: the call that finds
    it closed is made again on a new connection."""
    _, session, sock, servers = node
    gpus = session.devices
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2),
                         options=[("grpc.max_connection_idle_ms", 200)])
    lister = Lister([("ml", "a", "main", "nvidia.com/gpu", [gpus[0].uuid])])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
        "List": grpc.unary_unary_rpc_method_handler(lister.List, response_serializer=lambda b: b)})])
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    servers.append(server)
    client = kubelet.KubeletClient(str(sock), 2.0)
    assert [d.device_id for d in client.list().devices] == [gpus[0].uuid]
    first = client._channel._sock
    assert [d.device_id for d in client.list().devices] == [gpus[0].uuid]
    assert client._channel._sock is first  # kept
    # wait until the server's GOAWAY for the idle connection is in the socket, unread
    deadline = time.monotonic() + START_HANG_GUARD_S
    while not goaway_pending(first):
        assert time.monotonic() < deadline, "no GOAWAY (hang guard)"
        time.sleep(0.02)
    assert [d.device_id for d in client.list().devices] == [gpus[0].uuid]
    assert client._channel._sock is not first and lister.calls == 3
    client.close()


def goaway_pending(sock) -> bool:
    """Whether the frames waiting unread in `sock` hold an HTTP/2 GOAWAY (frame type 7)."""
    try:  # poll-free: a worker's descriptors can be past select()'s 1024
        data = sock.recv(1 << 16, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    i = 0
    while i + 9 <= len(data):
        if data[i + 3] == 7:
            return True
        i += 9 + int.from_bytes(data[i:i + 3], "big")
    return False


@settings(max_examples=200, derandomize=True)
@given(st.text(max_size=60), st.lists(st.text(max_size=80), max_size=3))
def test_no_dra_device_makes_matching_raise_or_find_a_gpu_that_is_not_there(device, cdi):
    gpus = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(8)]
    index = kubelet.GpuIndex({u.lower(): u for u in gpus}, dict(enumerate(gpus)), dict(enumerate(gpus)), {})
    found = index.find_claim(kubelet.ClaimDevice("ns", "p", "c", "ns/claim", "gpu.nvidia.com", "pool", device,
                                                 tuple(cdi)))
    assert found is None or found <= set(gpus)


def test_every_documented_device_id_shape_finds_its_gpu():
    gpus = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(8)]
    minors = {10 + i: u for i, u in enumerate(gpus)}  # minor numbers differ from NVML indexes here
    mig = "MIG-aaaaaaaa-0000-0000-0000-000000000000"
    index = kubelet.GpuIndex({u.lower(): u for u in gpus}, minors, dict(enumerate(gpus)),
                             {mig.lower(): gpus[4]})
    cases = {gpus[1]: 1, f"{gpus[2]}::3": 2, mig: 4, f"{mig}::7": 4, f"MIG-{gpus[5]}/1/0": 5, "6": 6,
             "7:1": 7, "nvidia10": 0, "nvidia11/vgpu0": 1, "nvidia13/gi1": 3, "nvidia13/gi2/vgpu0": 3}
    assert {d: gpus.index(index.find(d)) for d in cases} == cases

    def claim(device, *cdi):
        return kubelet.ClaimDevice("ns", "p", "c", "ns/x", "gpu.nvidia.com", "pool", device, cdi)

    uid = "0b5c7f2e-1d3a-4e5f-8a9b-0c1d2e3f4a5b"
    assert index.find_claim(claim("gpu-12")) == {gpus[2]}
    assert index.find_claim(claim("gpu-13-mig-19-0-1")) == {gpus[3]}
    assert index.find_claim(claim("", "k8s.gpu.nvidia.com/device=gpu-14")) == {gpus[4]}
    assert index.find_claim(claim("", f"k8s.gpu.nvidia.com/claim={uid}-gpu-15")) == {gpus[5]}
    assert index.find_claim(claim("", f"nvidia.com/gpu={gpus[6]}", "nvidia.com/gpu=7")) == {gpus[6], gpus[7]}
    assert index.find_claim(claim("", "nvidia.com/gpu=all")) == set(gpus)
    assert index.find_claim(claim("gpu-vfio-0")) == set()
    assert index.find_claim(claim("gpu-3")) is None  # minor 3 is no GPU here
    assert index.find_claim(claim("")) is None
