"""The NCCL RAS collector against the fake RAS server (exporter.tools.simulate.nccl_ras) and a procfs
tree of the job's processes (tests/nccl_tree.py): which rank it names, and that hostile or
squatting servers never name a wrong node, hang a scrape or hold unbounded memory."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from exporter import collectors
from exporter.catalog import Families
from exporter.compose import compose
from exporter.config import load
from exporter.exposition import render
from exporter.nccl import netns
from exporter.nvml.session import NvmlSession
from exporter.profiles import PROFILES
from exporter.tools.simulate.nccl_ras import FakeJob, RasServer
from exporter.tools.simulate.nvml import fake_backend
from exporter.workload.model import Workload, WorkloadReading
from tests import nccl_tree
from tests.helpers import promtool_check_metrics, samples, test_pool, value, wait_for

JOB = Workload(hpc_job="4711")
NODE = 1  # this node is the job's second host: 10.1.2.11, ranks 8..15
GPUS = 8


@pytest.fixture
def pool():
    p = test_pool()
    yield p
    p.close()


class Node:
    """One simulated node of the 4-node job: the fake server, a procfs tree, the collector."""

    def __init__(
        self,
        tmp: Path,
        pool,
        server: RasServer,
        *,
        node: int = NODE,
        env: dict[str, str] | None = None,
        squatter: bool = False,
        own: bool = True,
        maps: str = "",
        **cfg: object,
    ) -> None:
        self.server, self.job = server, server.job
        self.root = tmp / f"proc{node}"
        ranks = [r for r in self.job.ranks if r.host == f"10.1.2.{10 + node}"]
        self.pids = {100 + r.gpu: r for r in ranks}  # host pids 100.., NSpid = the rank's pid
        ring = 900000 + node  # the RAS ring listener on the bootstrap IP, owned by the job
        env = {"NCCL_RAS_ADDR": f"localhost:{server.port}"} if env is None else env
        procs = [
            nccl_tree.Proc(
                hp, r.pid, r.gpu, env, [ring] + ([server.inode] if own and hp == 100 else []), maps
            )
            for hp, r in self.pids.items()
        ]
        nccl_tree.write(
            self.root,
            procs,
            [
                (server.host, server.port, server.inode),
                (f"10.1.2.{10 + node}", 41000, ring),
                *([("0.0.0.0", server.port, 424242)] if squatter else []),
            ],
        )
        overrides = {
            "paths.procfs": str(self.root),
            "nccl.enabled": True,
            "nccl.interval_seconds": 30,
            **{f"nccl.{k}": v for k, v in cfg.items()},
        }
        config = load(None, overrides)
        nvml = NvmlSession(fake_backend(PROFILES["p5.48xlarge"]), pool=pool)
        ctx = compose(config, nvml=nvml, pool=pool)
        nvml.ensure()
        self.uuids = [d.uuid for d in nvml.devices]
        self.c = collectors.collector_classes()["nccl"](
            ctx,
            processes=lambda gpus: {hp: r.gpu for hp, r in self.pids.items() if r.gpu in gpus},
            opener=netns.open_socket,
            mono=lambda: self.now,
        )
        self.now = 1000.0  # the collector's clock: each query() is one interval later
        self.c.start()

    def reading(self) -> WorkloadReading:
        return WorkloadReading(0.0, {u: (JOB,) for u in self.uuids})

    def scrape(self) -> str:
        out = Families()
        self.c.derive(out, {"workload": self.reading()})
        return render(out).decode()

    def query(self, timeout: float = 30.0) -> dict:
        """One interval later: scrape (which queues a query when one is due), wait for it to end,
        scrape again."""
        self.now += 30
        self.scrape()
        assert self.c.settled(timeout)
        return samples(self.scrape())

    def close(self) -> None:
        self.c.close()


@pytest.fixture
def job():
    j = FakeJob.uniform(4, GPUS, first_pid=4000)
    j.step(100)
    return j


@pytest.fixture
def make(tmp_path, pool, job):
    made: list[Node | RasServer] = []

    def build(version: str = "2.29.7", fault: str = "", host: str = "127.0.0.1", **kw: object) -> Node:
        server = RasServer(
            job, version=version, fault=fault, host=host, delay_s=kw.pop("delay_s", 12.0)
        ).start()
        made.append(server)
        n = Node(tmp_path, pool, server, **kw)
        made.append(n)
        return n

    yield build
    for m in made:
        m.close()


def culprits(ss: dict) -> set[tuple[str, ...]]:
    """Every rank a scrape names: behind, missing, with errors."""
    out = set()
    for (name, labels), _v in ss.items():
        if name in ("nccl_ras_rank_behind", "nccl_ras_peer_missing", "nccl_ras_rank_error"):
            d = dict(labels)
            out.add((name, d["peer_ip"], d["peer_rank"], d["peer_gpu"]))
    return out


def test_a_lagging_rank_is_named_with_its_node_and_gpu(make, job):
    job.freeze(13)
    job.step(1, "AllGather")
    n = make(node=0)  # the querier: world rank 0 runs here
    ss = n.query()
    assert value(ss, "nccl_ras_up", gpu="0") == 1
    assert value(ss, "nccl_ras_querier", gpu="0") == 1
    assert culprits(ss) == {("nccl_ras_rank_behind", "10.1.2.11", "13", "5")}
    assert (
        value(
            ss,
            "nccl_ras_rank_behind",
            gpu="0",
            peer_ip="10.1.2.11",
            peer_pid="4013",
            peer_rank="13",
            peer_gpu="5",
        )
        == 1
    )
    assert value(ss, "nccl_ras_job_ops_launched", gpu="0", which="max") == 101
    assert value(ss, "nccl_ras_job_ops_launched", gpu="0", which="min") == 100
    assert value(ss, "nccl_ras_collectives_launched_total", gpu="3", op="AllReduce") == 100
    assert value(ss, "nccl_ras_endpoint_info", gpu="3", ip="10.1.2.10", pid="4003") == 1
    promtool_check_metrics(n.scrape())


def test_the_laggards_own_node_resolves_it_by_its_endpoint(make, job):
    job.freeze(13)
    job.step(1, "AllGather")
    n = make(node=1)
    ss = n.query()
    # not the querier: no job-wide series, but its own GPU's lag and its endpoint
    assert value(ss, "nccl_ras_querier", gpu="0") == 0
    assert not culprits(ss)
    assert value(ss, "nccl_ras_ops_behind", gpu="5", rank="13") == 1
    assert value(ss, "nccl_ras_endpoint_info", gpu="5", ip="10.1.2.11", pid="4013") == 1


@pytest.mark.parametrize("version", ["2.24.3", "2.28.7", "2.29.7"])
def test_missing_and_dead_peers_in_every_version(make, job, version):
    job.kill(21, dead=True)
    n = make(version=version, node=0, maps=f"7f00 r-xp 0 0:0 1 /usr/lib/libnccl.so.{version}\n", elect=False)
    ss = n.query()
    assert value(ss, "nccl_ras_up", gpu="0") == 1
    assert (
        value(
            ss,
            "nccl_ras_info",
            gpu="0",
            nccl_version=version,
            format="text" if version < "2.28.7" else "json",
        )
        == 1
    )
    assert culprits(ss) == {("nccl_ras_peer_missing", "10.1.2.12", "21", "5")}
    assert value(ss, "nccl_ras_job_ranks", gpu="0", state="dead") == 1


def test_a_version_a_query_can_crash_is_never_queried(make, job):
    n = make(version="2.26.2", maps="7f00 r-xp 0 0:0 1 /usr/lib/libnccl.so.2.26.2\n")
    ss = n.query()
    assert n.server.statuses == 0
    assert value(ss, "nccl_ras_queries_total", result="unsupported") == 1
    unknown = make(version="2.26.2", node=2)  # libnccl.so.2: the version is unknown and text only
    ss = unknown.query()
    assert unknown.server.statuses == 0 and not culprits(ss)


@pytest.mark.parametrize(
    "fault,result",
    [
        ("frozen", "timeout"),
        ("delay", "timeout"),
        ("truncated", "protocol_error"),
        ("huge", "too_large"),
        ("deep", "protocol_error"),
        ("zeroed", "ok"),
    ],
)
def test_hostile_servers_never_name_a_wrong_rank_nor_hang(make, job, fault, result):
    job.freeze(13)
    job.step(1, "AllGather")
    n = make(fault=fault, node=0, query_timeout_seconds=1.0, max_reply_bytes=1 << 20)
    ss = n.query(timeout=20.0)
    assert value(ss, "nccl_ras_queries_total", result=result) == 1
    assert culprits(ss) <= {("nccl_ras_rank_behind", "10.1.2.11", "13", "5")}
    assert (value(ss, "nccl_ras_up", gpu="0") == 1) == (result == "ok")


def test_garbage_text_ranks_discard_the_report(make, job):  # NVIDIA/nccl#1762
    job.kill(21)
    n = make(version="2.26.2", fault="garbage", maps="x /lib/libnccl.so.2.27.5\n")
    n.server.version = "2.27.5"
    ss = n.query()
    assert value(ss, "nccl_ras_queries_total", result="protocol_error") == 1
    assert not culprits(ss)


def test_a_listener_of_another_user_is_not_trusted(make, job):
    job.freeze(13)
    job.step(1, "AllGather")
    n = make(own=False, node=0)  # the socket on the port is not one of the job's processes'
    ss = n.query()
    assert n.server.statuses == 0
    assert value(ss, "nccl_ras_queries_total", result="untrusted") == 1
    assert not culprits(ss)


def test_a_squatter_sharing_the_port_is_not_trusted(make, job):
    n = make(node=0, squatter=True)  # the job's listener, and someone else's wildcard socket on its port
    ss = n.query()
    assert n.server.statuses == 0 and value(ss, "nccl_ras_queries_total", result="untrusted") == 1


def test_a_reply_that_does_not_know_the_job_is_not_trusted(make, job):
    n = make(node=0)
    for r in job.ranks:
        r.pid += 50000  # another job's RAS behind the same port
    ss = n.query()
    assert value(ss, "nccl_ras_queries_total", result="untrusted") == 1 and not culprits(ss)


def test_nccl_ras_addr_and_ipv6(make, job):
    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        pytest.fail("this host has no IPv6 loopback; the ::1 case needs one")
    n = make(host="::1", node=0)
    assert value(n.query(), "nccl_ras_up", gpu="0") == 1  # localhost: both loopbacks are tried
    m = make(node=0, env={"NCCL_RAS_ADDR": "127.0.0.1:1"})  # the job says where: not here
    assert value(m.query(), "nccl_ras_queries_total", result="no_listener") == 1


def test_one_status_per_job_per_interval_cluster_wide(tmp_path, pool, job):
    server = RasServer(job).start()
    nodes = [
        Node(tmp_path, pool, server, node=i, standby_intervals=1000, backup_intervals=1000) for i in range(4)
    ]
    try:
        for n in nodes:
            n.query()
        assert server.statuses == 4  # each node once: none knew the querier yet
        roles = [value(n.query(), "nccl_ras_querier", gpu="0") for n in nodes]
        assert roles == [1, 0, 0, 0]
        assert server.statuses == 5  # then only the querier
    finally:
        for n in nodes:
            n.close()
        server.close()


def test_a_scrape_never_waits_for_a_query(make, job):
    """A server that never answers holds the collector's own thread, not the scrape: the scrape
    returns while the query is still running, and the query ends at its deadline."""
    n = make(fault="frozen", node=0, query_timeout_seconds=60.0)
    n.now += 30
    ss = samples(n.scrape())  # queues the query
    assert not n.c.settled(0.0)  # still in flight after the scrape returned
    assert value(samples(n.scrape()), "nccl_ras_queries_total", result="timeout") == 0
    assert value(ss, "nccl_ras_queries_total", result="ok") == 0
    n.server.close()  # the server goes away: the query ends (an error), the thread is free again
    assert n.c.settled(30.0)


def test_a_hung_process_listing_is_written_off_and_not_read_again_until_it_returns(make, job):
    """NVML's process list (or procfs) that blocks: the read is written off at the collector's
    deadline (exporter.deadline), the job reads as timeout, and is not read again meanwhile."""
    import threading

    release = threading.Event()
    n = make(node=0, query_timeout_seconds=0.2)
    listed = n.c.processes
    n.c.processes = lambda gpus: (release.wait(60), listed(gpus))[1]
    try:
        assert value(n.query(), "nccl_ras_queries_total", result="timeout") == 1
        assert value(n.query(), "nccl_ras_queries_total", result="timeout") == 2  # blocked: not read again
        assert n.server.statuses == 0
    finally:
        release.set()
    wait_for(lambda: value(n.query(), "nccl_ras_up", gpu="0") == 1, what="a reply once the listing returned")
