"""A fake NCCL RAS server (docs/nccl.md): the client protocol of NCCL 2.24, 2.26, 2.28.7 and 2.29
byte for byte as NVIDIA/nccl's src/ras/client_support.cc writes it, serving one job that every
simulated node of the job shares, with the reference's fault modes.

    job = FakeJob.uniform(nodes=4, gpus=8)       # ranks g: host 10.1.2.(10 + g // 8), GPU g % 8
    server = RasServer(job, version="2.29.7").start()   # 127.0.0.1, port 0; server.port
    job.step(10)                                  # every live rank launches 10 AllReduce
    job.freeze(13)                                # rank 13's host thread stops (the laggard)
    job.kill(21, dead=True)                       # rank 21's process is gone, declared dead
    server.fault = "frozen"                       # accepts, never answers
    server.close()

Versions: 2.24 (text only; `UNKNOWN` status, `The missing rank(s):`, one aggregate operation
count), 2.26 (text, per-op counts and per-rank missing lines), 2.28.7 (+ `SET FORMAT json`),
2.29 (+ `MONITOR`). Fault modes (`fault`): "" (none), "frozen" (accepts, reads, never answers),
"delay" (STATUS answered after `delay_s`), "truncated" (half the report, then close), "huge"
(a 50 MB reply), "deep" (JSON nested 100,000 deep), "garbage" (the text walk of
NVIDIA/nccl#1762: ranks far above the size), "zeroed" (a zeroed communicator, #2346, added to
the JSON). A listener of another user is a matter of who owns the socket: the tests' procfs
tree says so (tests/nccl_tree.py).

Counters of what it served (`statuses`, `bytes_sent`) are what bench/bench_nccl.py measures."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exporter.nccl.model import OPS
from exporter.profiles import Profile
from exporter.tools.simulate.source import Shape, SimSource

HUGE_BYTES = 50 * 1000 * 1000
WORLD_HASH = "b10db1a1153c041c"
FAULTS = ("", "frozen", "delay", "truncated", "huge", "deep", "garbage", "zeroed")


@dataclass
class FakeRank:
    rank: int
    host: str
    pid: int
    gpu: int
    counts: list[int] = field(default_factory=lambda: [0] * len(OPS))
    frozen: bool = False  # the host thread stopped: counts stay, RAS still answers
    gone: str = ""  # "unresponsive" or "dead": its process does not answer


class FakeJob:
    """The job's ranks (one world communicator); thread-safe."""

    def __init__(self, ranks: list[FakeRank]) -> None:
        self.ranks = ranks
        self.lock = threading.Lock()

    @classmethod
    def uniform(cls, nodes: int, gpus: int, hosts: list[str] | None = None, first_pid: int = 4000) -> FakeJob:
        hosts = hosts or [
            f"10.1.2.{10 + n}" if n < 240 else f"10.1.{3 + n // 250}.{n % 250}" for n in range(nodes)
        ]
        return cls([FakeRank(g, hosts[g // gpus], first_pid + g, g % gpus) for g in range(nodes * gpus)])

    def step(self, n: int = 1, op: str = "AllReduce") -> None:
        """Every live rank that is not frozen launches `n` operations `op`."""
        i = OPS.index(op)
        with self.lock:
            for r in self.ranks:
                if not r.frozen and not r.gone:
                    r.counts[i] += n

    def freeze(self, rank: int, frozen: bool = True) -> None:
        with self.lock:
            self.ranks[rank].frozen = frozen

    def kill(self, rank: int, dead: bool = False) -> None:
        with self.lock:
            self.ranks[rank].gone = "dead" if dead else "unresponsive"

    def snapshot(self) -> list[FakeRank]:
        with self.lock:
            return [
                FakeRank(r.rank, r.host, r.pid, r.gpu, list(r.counts), r.frozen, r.gone) for r in self.ranks
            ]


def _v(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def render_json(ranks: list[FakeRank], version: str, timeouts: int = 0, zeroed: bool = False) -> bytes:
    """The JSON STATUS document (2.28.7+), pretty-printed as NCCL writes it."""
    live = [r for r in ranks if not r.gone]
    comm = {
        "hash": "0x" + WORLD_HASH,
        "secondary_hash": "0xe617f1be56c659a1:0x23ac287d1824726",
        "size": len(ranks),
        "ranks_count": len(live),
        "missing_ranks_count": len(ranks) - len(live),
        "ranks": [
            {
                "rank": r.rank,
                "host": r.host,
                "pid": r.pid,
                "cuda_dev": r.gpu,
                "nvml_dev": r.gpu,
                "status": {
                    "init_state": 0,
                    "async_error": 0,
                    "finalize_called": False,
                    "destroy_flag": False,
                    "abort_flag": False,
                },
                "collective_counts": dict(zip(OPS, r.counts, strict=True)),
            }
            for r in live
        ],
        "missing_ranks": [
            {
                "rank": r.rank,
                "host": r.host,
                "pid": r.pid,
                "cuda_dev": r.gpu,
                "nvml_dev": r.gpu,
                "status": {"unresponsive": True, "considered_dead": r.gone == "dead"},
            }
            for r in ranks
            if r.gone
        ],
    }
    comms = [comm]
    if zeroed:
        comms.insert(
            0,
            {
                "hash": "0x0",
                "secondary_hash": "0x0:0x0",
                "size": 0,
                "ranks_count": 0,
                "missing_ranks_count": 0,
                "ranks": [],
                "missing_ranks": [],
            },
        )
    doc = {
        "nccl_version": version,
        "cuda_runtime_version": 12080,
        "cuda_driver_version": 12090,
        "timestamp": time.strftime("%F %T"),
        "communicators_count": len(comms),
        "communicators": comms,
        "ras": {"collection_time_sec": "@TIME@", "timeouts_count": timeouts},
    }
    text = json.dumps(doc, indent=2).replace('"@TIME@"', "0.010")
    # NCCL prints an empty array as `[`, a blank line, `]`
    text = re.sub(r"( *)(\"\w+\": )\[\]", lambda m: f"{m.group(1)}{m.group(2)}[\n\n{m.group(1)}]", text)
    return text.encode() + b"\n"


def _who(r: FakeRank) -> str:
    return f"GPU {r.gpu} managed by process {r.pid} on node {r.host}"


def render_text(ranks: list[FakeRank], version: str, garbage: bool = False) -> bytes:
    """The text STATUS report of `version` (2.24: the pre-2.26 wording)."""
    old = _v(version) < (2, 26)
    live = [r for r in ranks if not r.gone]
    nodes = sorted({r.host for r in ranks})
    per_node = {h: sum(1 for r in ranks if r.host == h) for h in nodes}
    live_per_node = [sum(1 for r in live if r.host == h) for h in nodes]
    t = "0.01" if _v(version) < (2, 28, 7) else "0.010"
    out = [
        f"NCCL version {version} compiled with CUDA 12.9",
        "CUDA runtime version 12080, driver version 12090",
        "",
        "Job summary",
        "===========",
        "",
        "  Nodes  Processes         GPUs  Processes     GPUs",
        "(total)   per node  per process    (total)  (total)",
        f"{len(nodes):7d}  {max(per_node.values()):9d}  {1:11d}  {len(ranks):9d}  {len(ranks):7d}",
        "",
        f"Communicators... ({t}s)",
        "=============",
        "",
        "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors",
        "    #  in group  per comm  per node  per comm  in group",
    ]
    mismatch = len({tuple(r.counts) if not old else sum(r.counts) for r in live}) > 1
    missing = [r for r in ranks if r.gone]
    errors = ",".join(w for w, on in (("INCOMPLETE", missing), ("MISMATCH", mismatch)) if on) or "OK"
    lo, hi = min(x for x in live_per_node if x), max(live_per_node)
    rpn = str(hi) if lo == hi else f"{lo}-{hi}"
    out += [
        f"{0:5d}  {1:8d}  {len({r.host for r in live}):8d}  {rpn:>8s}  {len(ranks):8d}  {len(live):8d}  "
        f"{'UNKNOWN' if old and not live else 'RUNNING':>8s}  {errors:>6s}",
        "",
        "Errors",
        "======",
        "",
    ]
    unresponsive = [r for r in missing if r.gone == "unresponsive"]
    dead = [r for r in missing if r.gone == "dead"]
    for word, group, line in (
        ("INCOMPLETE", unresponsive, "Missing communicator data from {n} job process{es}"),
        ("DEAD", dead, "{n} job process{es} considered dead (unreachable via the RAS network)"),
    ):
        if group:
            n = len(group)
            es = "es are" if n > 1 and word == "DEAD" else "es" if n > 1 else " is" if word == "DEAD" else ""
            out += (
                [word, "  " + line.format(n=n, es=es)]
                + [f"  Process {r.pid} on node {r.host} managing GPU {r.gpu}" for r in group]
                + [""]
            )
    if missing:
        out += [
            f"#0-0 ({WORLD_HASH}) INCOMPLETE",
            f"  Missing communicator data from {len(missing)} rank" + ("s" if len(missing) > 1 else ""),
        ]
        if old:
            numbers = ",".join(str(r.rank) for r in missing)
            out.append(f"  The missing rank{'s' if len(missing) > 1 else ''}: {numbers}")
        else:
            out += [f"  Rank {r.rank + (1057455228 if garbage else 0)} -- {_who(r)}" for r in missing]
        out.append("")
    out += ["Warnings", "========", ""]
    if mismatch:
        out.append(f"#0-0 ({WORLD_HASH}) MISMATCH")
        columns = (
            [(None, [sum(r.counts) for r in live])]
            if old
            else [(op, [r.counts[i] for r in live]) for i, op in enumerate(OPS)]
        )
        for op, values in columns:
            if len(set(values)) < 2:
                continue
            out.append(
                "  Communicator ranks have different "
                + ("collective operation counts" if op is None else f"{op} operation counts")
            )
            groups: dict[int, list[FakeRank]] = {}
            for r, v in zip(live, values, strict=True):
                groups.setdefault(v, []).append(r)
            for v, members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), -kv[0])):
                outlier = len(members) == 1 or (len(members) <= 10 and len(members) <= len(live) // 4)
                what = f"launched up to operation {v}" if v else "not launched any operations"
                if len(members) == 1 and outlier:
                    r = members[0]
                    out.append(f"  Rank {r.rank} has {what} -- {_who(r)}")
                else:
                    out.append(f"  {len(members)} ranks have {what}")
                    if outlier:
                        out += [f"  Rank {r.rank} -- {_who(r)}" for r in members]
            out.append("")
    return ("\n".join(out) + "\n").encode()


def render_event(r: FakeRank, fmt: str) -> bytes:
    """A PEER_DEAD monitor event (2.29+)."""
    now = time.strftime("%F %T")
    if fmt == "json":
        return (
            json.dumps(
                {
                    "timestamp": now,
                    "group": "LIFECYCLE",
                    "event": "PEER_DEAD",
                    "peer": {"host": r.host, "pid": r.pid, "cuda_devs": "@D@", "nvml_devs": "@D@"},
                    "details": "",
                },
                indent=2,
            ).replace('"@D@"', f"[{r.gpu}]")
            + "\n"
        ).encode()
    return f"[{now}] PEER_DEAD: Process {r.pid} on node {r.host} managing GPU {r.gpu} \n".encode()


class RasServer:
    """Listens on `host` (127.0.0.1 or ::1), port 0 unless given; a thread per connection."""

    def __init__(
        self,
        job: FakeJob,
        version: str = "2.29.7",
        host: str = "127.0.0.1",
        port: int = 0,
        fault: str = "",
        delay_s: float = 12.0,
        reuse_port: bool = False,
    ) -> None:
        if fault not in FAULTS:
            raise ValueError(f"fault {fault!r}: one of {FAULTS}")
        self.job, self.version, self.fault, self.delay_s = job, version, fault, delay_s
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self.sock.bind((host, port))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.statuses = 0  # STATUS commands served (each one a job-wide collective in NCCL)
        self.bytes_sent = 0
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []

    @property
    def inode(self) -> int:
        import os

        return os.fstat(self.sock.fileno()).st_ino

    def start(self) -> RasServer:
        self.sock.listen(64)
        threading.Thread(target=self._accept, name="fake-ras", daemon=True).start()
        return self

    def close(self) -> None:
        self.stop.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        with self._lock:
            for c in self._conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), name="fake-ras-conn", daemon=True).start()

    def _send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        with self._lock:
            self.bytes_sent += len(data)

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._session(conn)
        except OSError:
            pass
        finally:
            with self._lock:
                if conn in self._conns:
                    self._conns.remove(conn)
            conn.close()

    def _session(self, conn: socket.socket) -> None:
        buf, fmt = b"", "text"
        v = _v(self.version)
        while not self.stop.is_set():
            if b"\n" not in buf:
                if len(buf) >= 1024:
                    return  # NCCL closes on a line longer than its buffer
                chunk = conn.recv(1024)
                if not chunk:
                    return
                buf += chunk
                continue
            raw, buf = buf.split(b"\n", 1)
            line = raw.rstrip(b"\r").decode("ascii", "replace")
            if self.fault == "frozen":
                continue  # a stopped process's listener: the kernel accepted, nobody answers
            words = line.split()
            cmd = [w.lower() for w in words]
            if cmd[:2] == ["client", "protocol"]:
                self._send(conn, b"SERVER PROTOCOL 2\n")
            elif cmd[:1] == ["timeout"] and len(cmd) == 2:
                ok = cmd[1].isdigit()
                self._send(conn, b"OK\n" if ok else f"ERROR: Invalid timeout value {words[1]}\n".encode())
            elif cmd[:2] == ["set", "format"] and len(cmd) == 3 and v >= (2, 28, 7):
                if cmd[2] in ("text", "json"):
                    fmt = cmd[2]
                    self._send(conn, b"OK\n")
                else:
                    self._send(conn, f"ERROR: Invalid format {words[2]}\n".encode())
            elif cmd in (["status"], ["verbose", "status"]):
                self._status(conn, fmt)
                return
            elif cmd[:1] == ["monitor"] and v >= (2, 29):
                self._send(conn, b"OK\n")
                for r in self.job.snapshot():
                    if r.gone == "dead":
                        self._send(conn, render_event(r, fmt))
                self.stop.wait()
                return
            else:
                self._send(conn, f"ERROR: Unknown command {line}\n".encode())

    def _status(self, conn: socket.socket, fmt: str) -> None:
        with self._lock:
            self.statuses += 1
        if self.fault == "delay" and self.stop.wait(self.delay_s):
            return
        if self.fault == "huge":
            block = b" " * (1 << 20)
            for _ in range(HUGE_BYTES // len(block)):
                if self.stop.is_set():
                    return
                self._send(conn, block)
            return
        if self.fault == "deep":
            self._send(conn, b"[" * 100_000)
            return
        ranks = self.job.snapshot()
        if fmt == "json":
            data = render_json(ranks, self.version, zeroed=self.fault == "zeroed")
        else:
            data = render_text(ranks, self.version, garbage=self.fault == "garbage")
        if self.fault == "truncated":
            data = data[: len(data) // 2]
        self._send(conn, data)


def _hex(ip: str, port: int) -> str:
    raw = ipaddress.ip_address(ip).packed
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return f"{words.hex().upper()}:{port:04X}"


@dataclass
class Proc:
    """A process of the job as procfs shows it."""

    pid: int
    nspid: int
    gpu: int
    env: dict[str, str] = field(default_factory=dict)
    sockets: list[int] = field(default_factory=list)  # inodes it holds
    maps: str = ""


def write_procfs(root: Path, procs: list[Proc], listeners: list[tuple[str, int, int]]) -> None:
    """A procfs tree of the job's processes on one node: environ, status (NSpid), fd links to the
    socket inodes each holds, net/tcp{,6} of their namespace with `listeners` ((ip, port, inode)
    LISTEN sockets) and ns/net, a link to this process's own namespace (the simulation and the
    tests talk to the fake server in it)."""
    v4 = ["  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"]
    v6 = list(v4)
    for i, (ip, port, inode) in enumerate(listeners):
        table = v6 if ":" in ip else v4
        zero = _hex("::" if ":" in ip else "0.0.0.0", 0)
        table.append(
            f"{i:4d}: {_hex(ip, port)} {zero} 0A 00000000:00000000 00:00000000 00000000  1000        0 "
            f"{inode} 1 0000000000000000 100 0 0 10 0"
        )
    for p in procs:
        d = root / str(p.pid)
        (d / "fd").mkdir(parents=True, exist_ok=True)
        (d / "net").mkdir(exist_ok=True)
        (d / "ns").mkdir(exist_ok=True)
        (d / "environ").write_bytes(
            b"".join(f"{k}={v}".encode() + b"\0" for k, v in {"PATH": "/usr/bin", **p.env}.items())
        )
        (d / "status").write_text(f"Name:\tpython\nPid:\t{p.pid}\nNSpid:\t{p.pid}\t{p.nspid}\n")
        (d / "maps").write_text(p.maps)
        for fd in os.listdir(d / "fd"):
            os.unlink(d / "fd" / fd)
        for n, inode in enumerate([*p.sockets, 0]):
            os.symlink(f"socket:[{inode}]" if inode else "/dev/null", d / "fd" / str(n + 3))
        (d / "net" / "tcp").write_text("\n".join(v4) + "\n")
        (d / "net" / "tcp6").write_text("\n".join(v6) + "\n")
        if not (d / "ns" / "net").is_symlink():
            os.symlink("/proc/self/ns/net", d / "ns" / "net")


# -- the simulated job: a timeline every node of the job shares, and the node's source ------------

ONSET_S = 20.0  # seconds after the server's start when a scenario's fault begins
DEAD_AFTER_S = 60.0  # NCCL declares an unreachable peer dead after 60 s
TICK_S = 1.0
CULPRIT_GPU = 3
JOB_SCENARIOS = {
    "nccl-job": "the node's GPUs run ranks of an NCCL 2.29 job whose RAS answers (a fake server: the "
    "shared one of --simulate.nccl-ras-port, else the node's own for a 2-node job); with slurm-job",
    "nccl-lagging-rank": f"from {ONSET_S:g}s the rank on GPU {CULPRIT_GPU} of the job's culprit node stops "
    "launching; the others launch one more collective and wait for it",
    "nccl-dead-peer": f"from {ONSET_S:g}s the culprit rank's process stops answering; NCCL declares it dead "
    f"{DEAD_AFTER_S:g}s later",
    "nccl-collective-hang": f"from {ONSET_S:g}s every rank has launched the same collective and none "
    "completes (all counts equal and frozen)",
}


class Timeline:
    """Plays a scenario on a fake job: every rank launches 10 AllReduce a second until the onset,
    then the fault. The culprit is the rank on GPU CULPRIT_GPU of node `culprit_node`."""

    def __init__(self, job: FakeJob, scenario: str, gpus: int, culprit_node: int = 0) -> None:
        self.job, self.scenario = job, scenario
        self.culprit = culprit_node * gpus + min(CULPRIT_GPU, gpus - 1)
        self.stop = threading.Event()
        self.t0 = time.monotonic()

    def advance(self, elapsed_s: float) -> None:
        fault = self.scenario != "nccl-job" and elapsed_s >= ONSET_S
        if not fault:
            self.job.step(10)
            return
        with self.job.lock:
            done = self.job.ranks[self.culprit].frozen or self.job.ranks[self.culprit].gone
        if self.scenario == "nccl-lagging-rank" and not done:
            self.job.freeze(self.culprit)
            self.job.step(1, "AllGather")  # the others launch the next collective, then wait in it
            for r in self.job.ranks:
                self.job.freeze(r.rank)
        elif self.scenario == "nccl-dead-peer":
            if not done:
                for r in self.job.ranks:
                    self.job.freeze(r.rank)
            self.job.kill(self.culprit, dead=elapsed_s >= ONSET_S + DEAD_AFTER_S)
        elif self.scenario == "nccl-collective-hang" and not done:
            for r in self.job.ranks:
                self.job.freeze(r.rank)

    def start(self) -> Timeline:
        def loop() -> None:
            while not self.stop.wait(TICK_S):
                self.advance(time.monotonic() - self.t0)

        threading.Thread(target=loop, name="fake-ras-timeline", daemon=True).start()
        return self


def listening_inode(port: int, host: str = "127.0.0.1") -> int | None:
    """The inode of the LISTEN socket on host:port in this network namespace (/proc/net/tcp): how
    a simulated node finds the shared fake server, which another process owns."""
    want = _hex(host, port)
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        f = line.split()
        if len(f) > 9 and f[1] == want and f[3] == "0A":
            return int(f[9])
    return None


HOST_PID_BASE = 100000  # the simulated node's host pids of the job's processes: base + GPU index


def nvml_processes(fake: Any, gpus: int) -> None:
    """Make the fake NVML list the job's process on each GPU (the nccl collector's processes)."""
    for g in range(gpus):
        fake.set_value(
            g, "nvmlDeviceGetComputeRunningProcesses", [{"pid": HOST_PID_BASE + g, "usedGpuMemory": 0}]
        )


class NcclSimSource(SimSource):
    """The node's share of an NCCL job: a procfs tree of its processes (environ with
    NCCL_RAS_ADDR, NSpid, fd links to the RAS sockets, net/tcp with the server's listener) and,
    without a shared server, a fake server of its own playing the scenario."""

    name = "nccl"
    scenarios = JOB_SCENARIOS

    def __init__(self, root: Path, profile: Profile, scenarios: set[str]) -> None:
        super().__init__(root, profile, scenarios)
        self.port: int | None = None
        self.node = 0
        self.server: RasServer | None = None
        self.timeline: Timeline | None = None

    def configure(self, shape: Shape) -> None:
        self.port = getattr(shape, "nccl_ras_port", None)
        self.node = getattr(shape, "nccl_node", None) or 0

    def build(self) -> None:
        if not self.active:
            return
        gpus = self.profile.gpus
        job = FakeJob.uniform(max(2, self.node + 1), gpus)
        if self.port:
            port, inode = self.port, listening_inode(self.port)
            if inode is None:
                raise ValueError(
                    f"--simulate.nccl-ras-port {self.port}: nothing listens on 127.0.0.1:{self.port}"
                )
        else:
            scenario = next((s for s in sorted(self.active) if s != "nccl-job"), "nccl-job")
            self.server = RasServer(job).start()
            self.timeline = Timeline(job, scenario, gpus, culprit_node=self.node).start()
            port, inode = self.server.port, self.server.inode
        host = job.ranks[self.node * gpus].host
        ranks = [r for r in job.ranks if r.host == host]
        ring = 900000 + self.node  # the RAS ring's listener on the bootstrap IP
        procs = [
            Proc(
                HOST_PID_BASE + r.gpu,
                r.pid,
                r.gpu,
                {"NCCL_RAS_ADDR": f"127.0.0.1:{port}"},
                [ring, inode] if r.gpu == 0 else [ring],
                "7f00 r-xp 0 0:0 1 /usr/lib/libnccl.so.2.29.7\n",
            )
            for r in ranks
        ]
        write_procfs(self.root / "proc", procs, [("127.0.0.1", port, inode), (host, 41000, ring)])

    def settings(self) -> dict[str, Any]:
        return {"nccl.enabled": True, "nccl.interval_seconds": 2.0} if self.active else {}

    def close(self) -> None:
        if self.timeline is not None:
            self.timeline.stop.set()
        if self.server is not None:
            self.server.close()


SOURCE = NcclSimSource


def main(argv: list[str] | None = None) -> None:
    """A shared fake RAS server for the simulated nodes of one job:
    `python -m exporter.tools.simulate.nccl_ras --nodes 2 --scenario nccl-lagging-rank --culprit-node 1`
    prints `listening on 127.0.0.1:PORT` and plays the scenario until killed; each node runs with
    `--scenario slurm-job --scenario nccl-job --simulate.nccl-ras-port PORT --simulate.nccl-node K`."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--scenario", choices=sorted(JOB_SCENARIOS), default="nccl-job")
    ap.add_argument("--culprit-node", type=int, default=0)
    ap.add_argument("--version", default="2.29.7")
    a = ap.parse_args(argv)
    job = FakeJob.uniform(a.nodes, a.gpus)
    server = RasServer(job, version=a.version).start()
    Timeline(job, a.scenario, a.gpus, a.culprit_node).start()
    print(f"listening on 127.0.0.1:{server.port}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
