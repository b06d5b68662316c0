"""One job's RAS, read from this node: find the endpoint, trust it, query, parse (the steps of
docs/nccl.md, "How a job's RAS is read"). Everything here is given its inputs; the collector
(exporter.collectors.nccl) schedules it."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter.nccl import client, parse_json, parse_text, procfs
from exporter.nccl.findings import Findings, summarise
from exporter.nccl.model import ReplyError, version_tuple
from exporter.nccl.netns import Opener

# NCCL versions a query is known to crash: STATUS during communicator init (NVIDIA/nccl#1669,
# #1718), fixed in 2.27.3.
CRASHES = (((2, 26, 0), (2, 27, 3), "a STATUS during communicator init crashes it (NVIDIA/nccl#1669)"),)


def known_crash(version: str | None) -> str:
    """Why a query of `version` is refused ("" when none is known)."""
    if version is None:
        return ""
    v = version_tuple(version)
    return next((why for lo, hi, why in CRASHES if lo <= v < hi), "")


@dataclass
class Settings:
    timeout_s: float = 15.0
    max_bytes: int = 16 << 20
    leg_timeout_s: int = 5


@dataclass
class JobReading:
    """What one attempt found. `result` is one of client.RESULTS."""

    result: str
    why: str = ""
    findings: Findings | None = None
    took_s: float = 0.0
    bytes: int = 0
    version: str | None = None
    # this node's processes of the job: nspid -> host GPU index, and the IPs they listen on
    local: dict[int, int] = field(default_factory=dict)
    local_ips: set[str] = field(default_factory=set)
    at: float = 0.0  # wall clock of the reply


def local_view(
    root: str, pids: dict[int, int]
) -> tuple[dict[int, int], set[str], set[int], list[procfs.Listener]]:
    """(nspid -> GPU, the job's own listening IPs, its socket inodes, the listeners of its network
    namespace) from procfs; `pids`: host pid -> GPU index."""
    local = {ns: gpu for pid, gpu in pids.items() if (ns := procfs.nspid(root, pid)) is not None}
    owned = procfs.socket_inodes(root, sorted(pids))
    found = procfs.listeners(root, min(pids)) if pids else []
    return local, procfs.own_ips(found, owned), owned, found


def read_job(
    root: str,
    pids: dict[int, int],
    opener: Opener,
    settings: Settings,
    version: str | None = None,
    allow_unknown_text: bool = False,
    clock: Callable[[], float] = time.time,
) -> JobReading:
    """Query the RAS of the job whose processes on this node are `pids` (host pid -> GPU index).
    `version`: what an earlier reply said (else the library file mapped tells, if it can)."""
    if not pids:
        return JobReading(client.NO_LISTENER, "no process of the job on its GPUs")
    local, ips, owned, found = local_view(root, pids)
    ref = min(pids)
    version = version or procfs.nccl_version(root, ref)
    base = JobReading(client.NO_LISTENER, "", version=version, local=local, local_ips=ips)
    if why := known_crash(version):
        base.result, base.why = client.UNSUPPORTED, f"NCCL {version}: {why}; not queried"
        return base
    addr = next((a for p in sorted(pids) if (a := procfs.ras_addr(root, p)) is not None), None)
    eps = procfs.endpoints(addr)
    if not eps:
        base.why = f"NCCL_RAS_ADDR {addr!r:.80} is not host:port with an IP or localhost"
        return base
    untrusted = ""
    for ep in eps:
        t = procfs.trusted(found, ep, owned)
        if t is None:
            continue
        if not t:
            untrusted = f"a socket listening on {ep} is not one of the job's processes"
            continue
        return _query(root, ref, ep, opener, settings, base, allow_unknown_text, clock)
    if untrusted:
        base.result, base.why = client.UNTRUSTED, untrusted
    else:
        base.why = f"nothing of the job listens on {' or '.join(str(e) for e in eps)}"
    return base


def _query(
    root: str,
    ref: int,
    ep: procfs.Endpoint,
    opener: Opener,
    settings: Settings,
    base: JobReading,
    allow_unknown_text: bool,
    clock: Callable[[], float],
) -> JobReading:
    def connect(timeout: float) -> socket.socket:
        sock = opener(root, ref, ep.family)
        try:
            sock.settimeout(timeout)
            sock.connect((ep.ip, ep.port))
        except BaseException:
            sock.close()
            raise
        return sock

    def allow(fmt: str) -> bool:  # text: only from a version known to be safe
        return fmt == "json" or base.version is not None or allow_unknown_text

    start = time.monotonic()
    try:
        reply = client.status(
            connect,
            timeout_s=settings.timeout_s,
            max_bytes=settings.max_bytes,
            leg_timeout_s=settings.leg_timeout_s,
            allow=allow,
        )
    except client.QueryFailed as e:
        base.result, base.why, base.took_s = e.result, str(e), time.monotonic() - start
        return base
    base.took_s, base.bytes = time.monotonic() - start, len(reply.data)
    try:
        report = (parse_json if reply.format == "json" else parse_text).parse(reply.data)
    except ReplyError as e:
        base.result, base.why = client.PROTOCOL_ERROR, f"{reply.format} reply: {e}"
        return base
    base.version = report.version
    if why := known_crash(report.version):
        base.result, base.why = client.UNSUPPORTED, f"NCCL {report.version}: {why}; not queried again"
        return base
    f = summarise(report)
    # The reply must know this node's processes of the job: else it is another job's RAS (two
    # jobs of one user share the port) or a squatter's.
    if (
        not any(
            w.pid in base.local and (not base.local_ips or w.host in base.local_ips) for w in f.ranks.values()
        )
        and f.format == "json"
    ):
        base.result, base.why = client.UNTRUSTED, "the reply lists none of the job's processes on this node"
        return base
    base.result, base.findings, base.at = client.OK, f, clock()
    return base
