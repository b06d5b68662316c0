"""The nccl collector against a fake RAS server written here from the
protocol reference alone (NVIDIA/nccl `src/ras/client_support.cc` as summarised in the project's
reference notes, sections 1-2), independently of exporter/tools/simulate/nccl_ras.py:

- the session: `CLIENT PROTOCOL n` -> `SERVER PROTOCOL 2`; `TIMEOUT n` -> `OK`; `SET FORMAT json`
  -> `OK` from 2.28.7, else `ERROR: Unknown command SET FORMAT json`; `MONITOR` from 2.29; any
  other line -> `ERROR: Unknown command <line>`; case-insensitive words, `\\r\\n` accepted, a
  1024-byte line without newline closes; `STATUS` sends the report and closes;
- the text report of 2.24 (aggregate counts, `The missing ranks:`) and 2.26+ (per-op counts,
  per-rank missing lines, 3 decimals from 2.28.7) and the pretty-printed JSON document;
- fault modes: a listener that never answers, a slow one, truncated, huge, deep, garbage and
  duplicate-key replies, a squatter's socket.

The job: N nodes of G GPUs, one process per GPU, a world communicator and one intra-node
communicator per node. Each node's procfs tree (its processes, their sockets, the listeners of
their network namespace) is written here too."""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from exporter import collectors
from exporter.catalog import Families
from exporter.compose import compose
from exporter.config import load
from exporter.exposition import render
from exporter.nccl import parse_json, parse_text
from exporter.nccl.findings import summarise
from exporter.nvml.session import NvmlSession
from exporter.profiles import PROFILES
from exporter.tools.simulate.nvml import fake_backend
from exporter.workload.model import Workload, WorkloadReading
from tests.helpers import promtool_check_metrics, samples, test_pool, value, wait_for

OPS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
WORK = Workload(hpc_job="9001")


# --------------------------------------------------------------------------- the job's state


@dataclass
class Proc:
    rank: int  # world rank
    host: str
    pid: int  # as RAS reports it (the pid in the process's namespace)
    dev: int
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OPS, 0))
    state: str = "ok"  # ok | unresponsive | dead


class Job:
    def __init__(self, nodes: int, gpus: int, hosts: list[str] | None = None, pids: list[int] | None = None):
        self.hosts = hosts or [f"192.168.7.{20 + n}" for n in range(nodes)]
        self.gpus = gpus
        base = pids or [50000 + 1000 * n for n in range(nodes)]
        self.procs = [
            Proc(n * gpus + g, self.hosts[n], base[n] + g, g) for n in range(nodes) for g in range(gpus)
        ]
        self.frozen: set[int] = set()

    def step(self, n: int = 1, op: str = "AllReduce") -> None:
        for p in self.procs:
            if p.rank not in self.frozen and p.state == "ok":
                p.counts[op] += n

    def comms(self) -> list[tuple[int, int, list[Proc]]]:
        """(hash, size, members in rank order): the world, then one per node."""
        out = [(0xA11CE5EED0000001, len(self.procs), self.procs)]
        for n, h in enumerate(self.hosts):
            members = [p for p in self.procs if p.host == h]
            out.append((0x5EED0000 + n, len(members), members))
        return out


# --------------------------------------------------------------------------- the two formats


def _ident(p: Proc) -> dict:
    return {"rank": 0, "host": p.host, "pid": p.pid, "cuda_dev": p.dev, "nvml_dev": p.dev}


def render_json(job: Job, version: str, extra_key: bool = False) -> bytes:
    comms = []
    for h, size, members in sorted(job.comms()):
        ranks, missing = [], []
        for i, p in enumerate(members):
            ident = {**_ident(p), "rank": i}
            if p.state == "ok":
                ranks.append(
                    {
                        **ident,
                        "status": {
                            "init_state": 0,
                            "async_error": 0,
                            "finalize_called": False,
                            "destroy_flag": False,
                            "abort_flag": False,
                        },
                        "collective_counts": dict(p.counts),
                    }
                )
            else:
                missing.append(
                    {**ident, "status": {"unresponsive": True, "considered_dead": p.state == "dead"}}
                )
        c = {
            "hash": f"0x{h:x}",
            "secondary_hash": "0xabc:0xdef",
            "size": size,
            "ranks_count": len(ranks),
            "missing_ranks_count": len(missing),
            "ranks": ranks,
            "missing_ranks": missing,
        }
        if extra_key:  # a later NCCL adding a key
            c["comm_name"] = "dp"
        comms.append(c)
    doc = {
        "nccl_version": version,
        "cuda_runtime_version": 12080,
        "cuda_driver_version": 12090,
        "timestamp": "2026-12-07 01:02:03",
        "communicators_count": len(comms),
        "communicators": comms,
        "ras": {"collection_time_sec": 0.012, "timeouts_count": 0},
    }
    text = json.dumps(doc, indent=2)
    return (text.replace("[]", "[\n\n]") + "\n").encode()


def _devs(p: Proc) -> str:
    return f"GPU {p.dev} managed by process {p.pid} on node {p.host}"


def render_text(job: Job, version: str) -> bytes:
    v = tuple(int(x) for x in version.split("."))
    per_op = v >= (2, 26, 0)
    out = [
        f"NCCL version {version} compiled with CUDA 12.9",
        "CUDA runtime version 12080, driver version 12090",
        "",
        "Job summary",
        "===========",
        "",
        "  Nodes  Processes         GPUs  Processes     GPUs",
        "(total)   per node  per process    (total)  (total)",
        f"{len(job.hosts):7d}  {job.gpus:9d}  {1:11d}  {len(job.procs):9d}  {len(job.procs):7d}",
        "",
        f"Communicators... ({0.012:.3f}s)" if v >= (2, 28, 7) else f"Communicators... ({0.01:.2f}s)",
        "=============",
        "",
        "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors",
        "    #  in group  per comm  per node  per comm  in group",
    ]
    comms = job.comms()
    errors: list[str] = []
    warnings: list[str] = []
    dead = [p for p in job.procs if p.state == "dead"]
    gone = [p for p in job.procs if p.state == "unresponsive"]
    if gone:
        errors += ["INCOMPLETE", f"  Missing communicator data from {len(gone)} job process"]
        errors += [f"  Process {p.pid} on node {p.host} managing GPU {p.dev}" for p in gone] + [""]
    if dead:
        errors += ["DEAD", f"  {len(dead)} job process is considered dead (unreachable via the RAS network)"]
        errors += [f"  Process {p.pid} on node {p.host} managing GPU {p.dev}" for p in dead] + [""]
    for g, (h, size, members) in enumerate(comms):
        reporting = [p for p in members if p.state == "ok"]
        lost = [(i, p) for i, p in enumerate(members) if p.state != "ok"]
        word = "OK"
        block: list[str] = []
        ops = OPS if per_op else ("collective",)
        for op in ops:

            def count(p: Proc, op: str = op) -> int:
                return p.counts[op] if per_op else sum(p.counts.values())

            values = sorted({count(p) for p in reporting})
            if len(values) <= 1:
                continue
            word = "MISMATCH"
            top = max(values)
            block.append(f"  Communicator ranks have different {op} operation counts")
            majority = [p for p in reporting if count(p) == top]
            block.append(f"  {len(majority)} ranks have launched up to operation {top}")
            for i, p in enumerate(members):
                if p in reporting and count(p) != top:
                    block.append(f"  Rank {i} has launched up to operation {count(p)} -- {_devs(p)}")
            block.append("")
        if lost:
            word = "INCOMPLETE" if word == "OK" else "INCOMPLETE,MISMATCH"
            errors.append(f"#{g}-0 ({h:016x}) INCOMPLETE")
            errors.append(f"  Missing communicator data from {len(lost)} rank{'s' if len(lost) > 1 else ''}")
            if per_op:
                errors += [f"  Rank {i} -- {_devs(p)}" for i, p in lost]
            else:
                errors.append(
                    f"  The missing rank{'s' if len(lost) > 1 else ''}: {','.join(str(i) for i, _ in lost)}"
                )
            errors.append("")
        if block:
            warnings += [f"#{g}-0 ({h:016x}) MISMATCH", *block]
        nodes = len({p.host for p in reporting})
        per_node = len(reporting) // max(1, nodes)
        out.append(
            f"{g:5d}  {1:8d}  {nodes:8d}  {per_node!s:>8}  {size:8d}  {len(reporting):8d}"
            f"  {'RUNNING':>8}  {word:>6}"
        )
    out += ["", "Errors", "======", "", *errors, "Warnings", "========", "", *warnings]
    return ("\n".join(out) + "\n").encode()


# --------------------------------------------------------------------------- the server


class Ras:
    """One job's RAS client listener: a thread per connection, the protocol of `version`."""

    def __init__(self, job: Job, version: str, host: str = "127.0.0.1", fault: str = "") -> None:
        self.job, self.version, self.fault = job, version, fault
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(fam, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(64)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.connections = 0
        self.statuses = 0
        self.sent: list[str] = []  # every command line received
        self.release = threading.Event()  # fault "hold": the reply waits for it
        self.extra_key = False
        self._stop = False
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def v(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.version.split("."))

    def close(self) -> None:
        self._stop = True
        self.release.set()
        self.sock.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _reply(self) -> bytes:
        f = self.fault
        if f == "truncated":
            return render_json(self.job, self.version)[:-200]
        if f == "huge":
            return b'{"nccl_version": "2.29.2", "pad": "' + b"x" * (50 << 20) + b'"}\n'
        if f == "deep":
            return b"[" * 200000 + b"]" * 200000 + b"\n"
        if f == "garbage":
            return bytes(range(256)) * 64
        if f == "dupkeys":  # a rank entry whose second "host" points elsewhere
            doc, h = render_json(self.job, self.version).decode(), self.job.hosts[1]
            return doc.replace(f'"host": "{h}"', f'"host": "{h}", "host": "10.66.66.66"').encode()
        return (
            render_json(self.job, self.version, self.extra_key)
            if self._json
            else render_text(self.job, self.version)
        )

    def _serve(self, conn: socket.socket) -> None:
        self._json = False
        first = self.connections == 1  # SO_REUSEPORT: the first connection hashed to a frozen process
        buf = b""
        with conn:
            while not self._stop:
                try:
                    chunk = conn.recv(4096)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while b"\n" in buf:
                    raw, buf = buf.split(b"\n", 1)
                    line = raw.rstrip(b"\r").decode("ascii", "replace")
                    self.sent.append(line)
                    if self.fault == "silent" or (self.fault == "first-silent" and first):
                        continue  # a frozen listener: the kernel accepted, nobody answers
                    if not self._command(conn, line):
                        return
                if len(buf) >= 1024:
                    return

    def _command(self, conn: socket.socket, line: str) -> bool:
        words = line.split()
        up = [w.upper() for w in words]
        if up[:2] == ["CLIENT", "PROTOCOL"]:
            conn.sendall(b"SERVER PROTOCOL 2\n")
        elif up[:1] == ["TIMEOUT"] and len(words) == 2:
            ok = words[1].isdigit()
            conn.sendall(b"OK\n" if ok else f"ERROR: Invalid timeout value {words[1]}\n".encode())
        elif up[:2] == ["SET", "FORMAT"] and self.v >= (2, 28, 7):
            fmt = words[2].lower() if len(words) > 2 else ""
            if fmt in ("json", "text"):
                self._json = fmt == "json"
                conn.sendall(b"OK\n")
            else:
                conn.sendall(f"ERROR: Invalid format {fmt}\n".encode())
        elif up[:1] == ["MONITOR"] and self.v >= (2, 29, 0):
            conn.sendall(b"OK\n")
        elif up in (["STATUS"], ["VERBOSE", "STATUS"]):
            with self._lock:
                self.statuses += 1
            if self.fault in ("slow", "hold"):
                self.release.wait(60)
            try:
                conn.sendall(self._reply())
            except OSError:
                pass
            return False  # the report ends when the server closes
        else:
            conn.sendall(f"ERROR: Unknown command {line}\n".encode())
        return True


# --------------------------------------------------------------------------- a node's procfs


def _hex(ip: str) -> str:
    import ipaddress

    raw = ipaddress.ip_address(ip).packed
    return "".join(raw[i : i + 4][::-1].hex().upper() for i in range(0, len(raw), 4))


def write_procfs(
    root: Path,
    procs: dict[int, tuple[int, int]],
    listeners: list[tuple[str, int, int]],
    owned: dict[int, list[int]],
    env: dict[str, str],
    maps: str,
    wheel: tuple[str, ...] = (),
) -> None:
    """procs: host pid -> (nspid, gpu); listeners: (ip, port, inode) of the namespace; owned: host
    pid -> the socket inodes it holds."""
    v4 = ["  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"]
    v6 = list(v4)
    for i, (ip, port, ino) in enumerate(listeners):
        table = v6 if ":" in ip else v4
        table.append(
            f"{i:4d}: {_hex(ip)}:{port:04X} {'0' * len(_hex(ip))}:0000 0A 00000000:00000000 00:00000000 "
            f"00000000  1000        0 {ino} 1 0000000000000000 100 0 0 10 0"
        )
    for hp, (ns, _gpu) in procs.items():
        d = root / str(hp)
        (d / "fd").mkdir(parents=True)
        (d / "net").mkdir()
        (d / "net" / "tcp").write_text("\n".join(v4) + "\n")
        (d / "net" / "tcp6").write_text("\n".join(v6) + "\n")
        (d / "status").write_text(
            f"Name:\tpython\nPid:\t{hp}\nNSpid:\t{hp}\t{ns}\n"
            if ns != hp
            else f"Name:\tpython\nNSpid:\t{hp}\n"
        )
        (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")
        (d / "maps").write_text(maps)
        for entry in wheel:  # the process's own root: a pip wheel's dist-info beside nvidia/
            (d / "root" / SITE.lstrip("/") / entry).mkdir(parents=True)
        for n, ino in enumerate(owned.get(hp, [])):
            (d / "fd" / str(10 + n)).symlink_to(f"socket:[{ino}]")


SITE = "/usr/local/lib/python3.12/dist-packages"


def plain_opener(procfs: str, pid: int, family: int) -> socket.socket:
    return socket.socket(family, socket.SOCK_STREAM)  # the test shares the server's namespace


class Node:
    """Node `n` of the job: its procfs, its collector (the workload source says the job holds its GPUs)."""

    def __init__(
        self,
        tmp: Path,
        pool,
        job: Job,
        ras: Ras,
        n: int,
        *,
        env: dict[str, str] | None = None,
        squatter: bool = False,
        own: bool = True,
        ring: bool = True,
        maps: str | None = None,
        wheel: tuple[str, ...] = (),
        **cfg: object,
    ) -> None:
        self.ras, self.job = ras, job
        self.root = tmp / f"node{n}-{id(self)}"
        mine = [p for p in job.procs if p.host == job.hosts[n]]
        procs = {7000 + p.dev: (p.pid, p.dev) for p in mine}
        client_ino, ring_ino = 880000 + n, 770000 + n
        listeners = [(ras.host, ras.port, client_ino)]
        if ring:  # the RAS ring / bootstrap listener on the node's IP, the job's own
            listeners.append((job.hosts[n], 40123, ring_ino))
        if squatter:
            listeners.append(("0.0.0.0", ras.port, 999999))
        owned = {hp: [ring_ino] + ([client_ino] if own else []) for hp in procs}
        if env is None:
            env = {
                "NCCL_RAS_ADDR": f"[{ras.host}]:{ras.port}" if ":" in ras.host else f"localhost:{ras.port}"
            }
        env = {k: v.replace("PORT", str(ras.port)) for k, v in env.items()}
        maps = (
            f"7f0000000000-7f0000100000 r-xp 00000000 08:01 42 /usr/lib/libnccl.so.{ras.version}\n"
            if maps is None
            else maps
        )
        write_procfs(self.root, procs, listeners, owned, {"PATH": "/usr/bin", **env}, maps, wheel)
        config = load(
            None,
            {
                "paths.procfs": str(self.root),
                "nccl.enabled": True,
                **{f"nccl.{k}": v for k, v in cfg.items()},
            },
        )
        nvml = NvmlSession(fake_backend(PROFILES["p5.48xlarge"]), pool=pool)
        ctx = compose(config, nvml=nvml, pool=pool)
        nvml.ensure()
        self.uuids = [d.uuid for d in nvml.devices]
        self.held = True
        self.now = 10_000.0
        self.c = collectors.collector_classes()["nccl"](
            ctx,
            processes=lambda gpus: {hp: g for hp, (_ns, g) in procs.items() if g in gpus},
            opener=plain_opener,
            mono=lambda: self.now,
        )
        self.c.start()

    def scrape(self) -> str:
        out = Families()
        held = {u: (WORK,) for u in self.uuids[: self.job.gpus]} if self.held else {}
        self.c.derive(out, {"workload": WorkloadReading(0.0, held)})
        return render(out).decode()

    def interval(self, timeout: float = 60.0) -> dict:
        self.now += self.c.cfg.interval_seconds
        self.scrape()
        assert self.c.settled(timeout)
        return samples(self.scrape())

    def close(self) -> None:
        self.c.close()


def named(ss: dict) -> set[tuple[str, str, str, str]]:
    """Every rank a scrape names, as (series, peer_ip, peer_rank, peer_gpu)."""
    return {
        (name, d["peer_ip"], d["peer_rank"], d["peer_gpu"])
        for (name, labels), _v in ss.items()
        if name in ("nccl_ras_rank_behind", "nccl_ras_peer_missing", "nccl_ras_rank_error")
        for d in [dict(labels)]
    }


def endpoints(ss: dict) -> set[tuple[str, str, str]]:
    return {
        (d["ip"], d["pid"], d["gpu"])
        for (name, labels), _v in ss.items()
        if name == "nccl_ras_endpoint_info"
        for d in [dict(labels)]
    }


@pytest.fixture
def pool():
    p = test_pool()
    yield p
    p.close()


@pytest.fixture
def cluster(tmp_path, pool):
    made: list = []

    def build(
        job: Job,
        version: str = "2.29.2",
        nodes: tuple[int, ...] = (0,),
        host: str = "127.0.0.1",
        fault: str = "",
        **kw: object,
    ):
        ras = Ras(job, version, host=host, fault=fault)
        made.append(ras)
        out = [Node(tmp_path, pool, job, ras, n, **kw) for n in nodes]
        made.extend(out)
        return ras, out

    yield build
    for m in made:
        m.close()


VERSIONS = ["2.24.3", "2.28.7", "2.29.2"]


# --------------------------------------------------------------------------- parsers agree


@pytest.mark.parametrize("state", ["lag", "unresponsive", "dead", "healthy"])
def test_text_and_json_agree_on_the_culprit(state):
    job = Job(3, 4)
    job.step(40)
    if state == "lag":
        job.frozen.add(6)
        job.step(3, "AllGather")
    elif state in ("unresponsive", "dead"):
        job.procs[9].state = state
    fj = summarise(parse_json.parse(render_json(job, "2.29.2")))
    for version in ("2.26.2", "2.28.7", "2.29.2"):
        ft = summarise(parse_text.parse(render_text(job, version)))
        assert ft.missing == fj.missing, version
        assert ft.behind == fj.behind, version
    # 2.24's text has only aggregate counts and missing rank numbers: it agrees on who is behind
    old = summarise(parse_text.parse(render_text(job, "2.24.3")))
    assert old.behind == fj.behind


def test_json_variations_the_schema_allows():
    job = Job(2, 2)
    job.step(5)
    base = summarise(parse_json.parse(render_json(job, "2.29.2")))
    compact = json.dumps(json.loads(render_json(job, "2.29.2"))).encode()  # no whitespace
    assert summarise(parse_json.parse(compact)).counts == base.counts
    extra = summarise(parse_json.parse(render_json(job, "2.30.7", extra_key=True)))  # a key NCCL may add
    assert extra.counts == base.counts
    doc = json.loads(render_json(job, "2.29.2"))
    doc["communicators"][0]["ranks"][0] = dict(reversed(list(doc["communicators"][0]["ranks"][0].items())))
    assert summarise(parse_json.parse(json.dumps(doc).encode())).counts == base.counts  # key order
    v6 = Job(2, 2, hosts=["fd00::a", "fd00::b"])
    assert {h for h, _ in summarise(parse_json.parse(render_json(v6, "2.29.2"))).ranks} == {
        "fd00::a",
        "fd00::b",
    }


# --------------------------------------------------------------------------- the collector


@pytest.mark.parametrize("version", VERSIONS)
def test_the_lagging_rank_is_named_with_its_node_gpu_and_rank(cluster, version):
    job = Job(3, 4)
    job.step(100)
    job.frozen.add(6)  # node 1, GPU 2
    job.step(2, "AllGather")
    ras, (n0, n1) = cluster(job, version, nodes=(0, 1), elect=False)
    s0, s1 = n0.interval(), n1.interval()
    assert ras.statuses == 2
    assert value(s0, "nccl_ras_up", gpu="0") == 1
    want = {("nccl_ras_rank_behind", "192.168.7.21", "6", "2")}
    assert named(s0) == want and named(s1) == want
    # its own node places it: the endpoint the rules join the reply's ip and pid on
    assert ("192.168.7.21", "51002", "2") in endpoints(s1)
    assert all(ip == "192.168.7.20" for ip, _pid, _gpu in endpoints(s0))
    assert value(s1, "nccl_ras_ops_behind", gpu="2", rank="6") == 2
    promtool_check_metrics(n0.scrape())


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("state", ["unresponsive", "dead"])
def test_missing_and_dead_peers(cluster, version, state):
    job = Job(3, 4)
    job.step(10)
    job.procs[11].state = state  # node 2, GPU 3
    ras, (n0,) = cluster(job, version, elect=False)
    ss = n0.interval()
    assert named(ss) == {("nccl_ras_peer_missing", "192.168.7.22", "11", "3")}
    assert value(ss, "nccl_ras_peer_missing", peer_ip="192.168.7.22", state=state) == 1


def test_a_hang_inside_a_collective_every_rank_launched(cluster):
    job = Job(2, 4)
    job.step(77)
    ras, (n0,) = cluster(job)
    ss = n0.interval()
    assert not named(ss)
    assert (
        value(ss, "nccl_ras_job_ops_launched", which="max")
        == value(ss, "nccl_ras_job_ops_launched", which="min")
        == 77
    )


def test_ipv6_loopback_and_a_port_of_the_jobs_choice(cluster):
    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        pytest.fail("no IPv6 loopback on this host")
    job = Job(2, 2)
    job.step(3)
    job.frozen.add(3)
    job.step(1)
    # NCCL_RAS_ADDR=[::1]:port
    ras, (n0,) = cluster(job, host="::1")
    assert named(n0.interval()) == {("nccl_ras_rank_behind", "192.168.7.21", "3", "1")}
    # NCCL_RAS_ADDR unset? then 28028 (not ours) is tried and nothing answers: no culprit
    ras2, (m,) = cluster(job, host="::1", env={})
    ss = m.interval()
    assert ras2.connections == 0 and not named(ss)


def test_localhost_with_a_port_resolves_to_both_loopbacks(cluster):
    job = Job(2, 2)
    job.step(3)
    ras, (n0,) = cluster(job, host="::1", env={"NCCL_RAS_ADDR": "localhost:PORT"})
    assert value(n0.interval(), "nccl_ras_up", gpu="0") == 1


def test_the_collector_queries_only_while_a_job_holds_gpus(cluster):
    job = Job(2, 2)
    ras, (n0,) = cluster(job)
    n0.held = False
    for _ in range(3):
        n0.interval()
    assert ras.connections == 0
    n0.held = True
    n0.interval()
    assert ras.statuses == 1


def test_the_session_follows_the_protocol(cluster):
    job = Job(2, 2)
    ras, (n0,) = cluster(job, "2.28.7")
    n0.interval()
    assert ras.sent[0].upper().startswith("CLIENT PROTOCOL")
    assert ras.sent[-1] == "STATUS" and ras.sent.count("STATUS") == 1
    assert "TIMEOUT 0" not in ras.sent and not any(s.upper().startswith("VERBOSE") for s in ras.sent)


@pytest.mark.parametrize(
    "fault,result",
    [
        ("silent", "timeout"),
        ("truncated", "protocol_error"),
        ("huge", "too_large"),
        ("deep", "protocol_error"),
        ("garbage", "protocol_error"),
        ("dupkeys", "protocol_error"),
    ],
)
def test_hostile_replies_never_name_a_wrong_node(cluster, fault, result):
    job = Job(2, 4)
    job.step(5)
    job.frozen.add(1)
    job.step(1)
    ras, (n0,) = cluster(job, fault=fault, query_timeout_seconds=3.0, max_reply_bytes=4 << 20)
    ss = n0.interval()
    assert value(ss, "nccl_ras_queries_total", result=result) == 1
    assert not named(ss)
    assert value(ss, "nccl_ras_up", gpu="0") == 0


def test_a_slow_server_never_holds_a_scrape(cluster):
    job = Job(2, 2)
    job.step(1)
    ras, (n0,) = cluster(job, fault="hold", query_timeout_seconds=30.0)
    n0.now += 30
    n0.scrape()
    wait_for(lambda: ras.statuses == 1, what="the STATUS reached the server")
    # the server holds its reply: scrapes still return, with nothing named
    for _ in range(3):
        assert not named(samples(n0.scrape()))
    assert not n0.c.settled(0.0)
    ras.release.set()
    assert n0.c.settled(30.0)
    assert value(samples(n0.scrape()), "nccl_ras_up", gpu="0") == 1


def test_a_squatter_is_never_talked_to(cluster):
    job = Job(2, 2)
    job.step(1)
    ras, (n0,) = cluster(job, own=False)  # the only listener is someone else's
    ss = n0.interval()
    assert ras.connections == 0 and not named(ss)
    assert value(ss, "nccl_ras_queries_total", result="untrusted") == 1
    ras2, (n1,) = cluster(job, squatter=True)  # the job's listener, plus someone else's wildcard
    ss = n1.interval()
    assert ras2.connections == 0 and value(ss, "nccl_ras_queries_total", result="untrusted") == 1


def test_a_reply_about_another_job_is_not_trusted(cluster, tmp_path, pool):
    mine, other = Job(2, 2), Job(2, 2, hosts=["10.9.9.1", "10.9.9.2"], pids=[123, 456])
    other.step(3)
    other.frozen.add(1)
    other.step(1)
    ras, (n0,) = cluster(mine)
    ras.job = other  # the listener is ours, the report another job's
    ss = n0.interval()
    assert not named(ss) and value(ss, "nccl_ras_queries_total", result="untrusted") == 1


# --------------------------------------------------------------------------- wrong-node traps


def test_pids_repeated_on_other_nodes_never_place_their_ranks_here(cluster):
    """Containers: every node's processes have the same small pids in their own pid namespace.
    Only the ranks on this node's IP are this node's."""
    job = Job(3, 2, pids=[40, 40, 40])
    job.step(9)
    job.frozen.add(4)  # node 2, GPU 0, pid 40 like GPU 0 everywhere
    job.step(1)
    ras, (n0, n2) = cluster(job, nodes=(0, 2), elect=False)
    s0, s2 = n0.interval(), n2.interval()
    assert {ip for ip, _, _ in endpoints(s0)} == {"192.168.7.20"}
    assert {ip for ip, _, _ in endpoints(s2)} == {"192.168.7.22"}
    assert not [
        k
        for k in s0
        if k[0] == "nccl_ras_ops_behind" and dict(k[1])["rank"] != "0" and dict(k[1])["rank"] != "1"
    ]
    assert value(s2, "nccl_ras_ops_behind", gpu="0", rank="4") == 1


def test_without_a_visible_bootstrap_listener_repeated_pids_place_nothing(cluster):
    """No listener on the node's IP is visible (so its IP is learnt from the reply): with pids
    that every node repeats, the reply cannot say which node is this one; nothing is placed."""
    job = Job(3, 2, pids=[40, 40, 40])
    job.step(9)
    ras, (n1,) = cluster(job, nodes=(1,), ring=False, elect=False)
    ss = n1.interval()
    assert {ip for ip, _, _ in endpoints(ss)} <= {"192.168.7.21"}


# --------------------------------------------------------------------------- the election


def test_one_status_per_job_per_interval_and_the_same_querier_everywhere(cluster):
    job = Job(4, 2)
    job.step(1)
    ras, nodes = cluster(job, nodes=(0, 1, 2, 3), backup_intervals=1000, standby_intervals=1000)
    for n in nodes:
        n.interval()
    first = ras.statuses
    roles = [value(n.interval(), "nccl_ras_querier", gpu="0") for n in nodes]
    assert roles == [1, 0, 0, 0]
    for _ in range(3):
        for n in nodes:
            n.interval()
    assert ras.statuses - first == 4  # one per interval, the querier's


def test_when_the_queriers_node_is_gone_another_node_names_it(cluster):
    """World rank 0's node dies (its exporter with it): its ranks go missing, then dead. The next
    node must take over the job-wide view and name them; else no one does."""
    job = Job(3, 2)
    job.step(4)
    ras, (n0, n1, n2) = cluster(job, nodes=(0, 1, 2), backup_intervals=2, standby_intervals=30)
    for n in (n0, n1, n2):
        n.interval()
    n0.close()  # the node is gone
    for p in job.procs[:2]:
        p.state = "dead"
    seen: set = set()
    for _ in range(4):
        for n in (n1, n2):
            seen |= named(n.interval())
    assert seen == {
        ("nccl_ras_peer_missing", "192.168.7.20", "0", "0"),
        ("nccl_ras_peer_missing", "192.168.7.20", "1", "1"),
    }


def test_the_cardinality_budget_of_docs_nccl_md(cluster):
    """A p5 node of one 4-node job: 71 series; its querier, with more ranks behind and missing
    than it names, at most 157 (docs/nccl.md, "Series and their budget")."""
    job = Job(4, 8)
    job.step(10)
    job.frozen |= set(range(8, 30))
    job.step(1)
    for p in job.procs[24:32]:
        p.state = "dead"
    ras, (n0, n1) = cluster(job, nodes=(0, 1))
    for _ in range(2):
        s0, s1 = n0.interval(), n1.interval()
    assert value(s0, "nccl_ras_querier", gpu="0") == 1
    assert len(s1) == 71
    assert len(s0) <= 157
    assert len([k for k in s0 if k[0] == "nccl_ras_rank_behind"]) == 16


WHEEL_MAPS = f"7f0000000000-7f0000100000 r-xp 00000000 08:01 42 {SITE}/nvidia/nccl/lib/libnccl.so.2\n"


@pytest.mark.parametrize(
    "version,wheel,queried",
    [
        ("2.27.5", ("torch-2.9.0.dist-info", "nvidia_nccl_cu12-2.27.5.dist-info"), True),
        ("2.26.2", ("nvidia_nccl_cu12-2.26.2.dist-info",), False),  # a query can crash it
        ("2.27.5", ("torch-2.9.0.dist-info",), False),  # nothing says which version
    ],
)
def test_a_pip_wheels_version_is_read_beside_its_library(cluster, version, wheel, queried):
    """PyTorch's pip wheels map a bare libnccl.so.2: the text-only server's version is the
    wheel's dist-info beside it, in the process's own root."""
    job = Job(2, 2)
    job.step(3)
    job.frozen.add(2)
    job.step(1)
    ras, (n0,) = cluster(job, version, maps=WHEEL_MAPS, wheel=wheel)
    ss = n0.interval()
    assert ras.statuses == (1 if queried else 0)
    assert named(ss) == ({("nccl_ras_rank_behind", "192.168.7.21", "2", "0")} if queried else set())
    if not queried:
        assert value(ss, "nccl_ras_queries_total", result="unsupported") == 1


@pytest.mark.parametrize("version", ["2.24.3", "2.27.5"])
def test_text_only_jobs_cost_about_one_status_per_interval(cluster, version):
    """A text report names no querier: the job's nodes take turns (each every `nodes`
    intervals), so the job sees about one STATUS per interval, not one per node, and the rank
    behind is still named."""
    job = Job(4, 2)
    job.step(5)
    job.frozen.add(5)
    job.step(1)
    ras, nodes = cluster(job, version, nodes=(0, 1, 2, 3))
    for n in nodes:
        n.interval()
    assert ras.statuses == 4  # each node once: a new job
    seen: set = set()
    for _ in range(8):
        for n in nodes:
            seen |= named(n.interval())
    assert ras.statuses - 4 <= 8 + 4  # 8 intervals: ~1 each, whatever the phases
    assert seen == {("nccl_ras_rank_behind", "192.168.7.22", "5", "1")}


def test_a_frozen_listener_is_stepped_over_by_a_new_connection(cluster):
    """SO_REUSEPORT: the first connection lands on a stopped process's socket, which the kernel
    accepts and nobody answers; as ncclras does, the client reconnects and another answers."""
    job = Job(2, 2)
    job.step(2)
    job.frozen.add(3)
    job.step(1)
    ras, (n0,) = cluster(job, fault="first-silent")
    ss = n0.interval()
    assert ras.connections == 2 and ras.statuses == 1
    assert named(ss) == {("nccl_ras_rank_behind", "192.168.7.21", "3", "1")}


def test_several_ranks_in_one_process(cluster):
    """One process managing two GPUs holds two ranks of a communicator: it is named once, on
    its node, and the scrape stays valid."""
    job = Job(2, 4)
    for a, b in ((4, 5), (6, 7)):
        job.procs[b].pid = job.procs[a].pid
    job.step(7)
    job.frozen |= {6, 7}
    job.step(2)
    ras, (n0, n1) = cluster(job, nodes=(0, 1), elect=False)
    s0, s1 = n0.interval(), n1.interval()
    assert value(s1, "nccl_ras_ops_behind", rank="6") == 2  # on its own node, once
    assert {(ip, rank) for _n, ip, rank, _g in named(s0)} == {("192.168.7.21", "6")}
    assert value(s0, "nccl_ras_rank_behind", peer_ip="192.168.7.21", peer_rank="6") == 2
    promtool_check_metrics(n0.scrape())
    promtool_check_metrics(n1.scrape())
