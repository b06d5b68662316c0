"""A job's processes as procfs shows them (under the configurable procfs root): where their RAS
listens, whether a listener is theirs, their pid inside their namespace, their NCCL version.

Each read is bounded (a byte cap, a cap on the fds looked at) and a process that exits midway
reads as absent, never as an error of the source."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from dataclasses import dataclass

DEFAULT_PORT = 28028  # NCCL_RAS_CLIENT_PORT
MAX_ENVIRON = 1 << 20
MAX_TABLE = 8 << 20  # net/tcp of a busy namespace: ~150 bytes a socket
MAX_FDS = 65536
LISTEN = "0A"
_MAPS_VERSION = re.compile(rb"libnccl\.so\.(\d{1,3}\.\d{1,3}\.\d{1,3})\b")
_WHEEL_LIB = re.compile(rb" (/[^\s]{1,400})/nvidia/nccl/lib/libnccl\.so\.2$", re.MULTILINE)
_WHEEL_DIST = re.compile(r"nvidia_nccl_cu\d{1,3}-(\d{1,3}\.\d{1,3}\.\d{1,3})(?:\.post\d+)?\.dist-info")


@dataclass(frozen=True)
class Endpoint:
    family: int  # socket.AF_INET or AF_INET6
    ip: str
    port: int

    def __str__(self) -> str:
        return f"[{self.ip}]:{self.port}" if self.family == socket.AF_INET6 else f"{self.ip}:{self.port}"


LOCALHOST = (
    Endpoint(socket.AF_INET, "127.0.0.1", DEFAULT_PORT),
    Endpoint(socket.AF_INET6, "::1", DEFAULT_PORT),
)


@dataclass(frozen=True)
class Listener:
    ip: str
    port: int
    inode: int


def _read(path: str, cap: int) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(cap)
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None


def endpoints(value: str | None) -> tuple[Endpoint, ...]:
    """Where a process's RAS listens, from its NCCL_RAS_ADDR (None: unset): `host:port` or
    `[v6]:port`. localhost is both loopbacks (NCCL binds whichever getaddrinfo gives first); any
    other name is refused (no DNS from here), as is anything malformed: ()."""
    if value is None:
        return LOCALHOST
    m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d{1,5})|([^\[\]:]+):(\d{1,5})", value)
    if m is None:
        return ()
    host, port = (m.group(1), int(m.group(2))) if m.group(1) else (m.group(3), int(m.group(4)))
    if not 0 < port < 65536:
        return ()
    if host == "localhost":
        return tuple(Endpoint(e.family, e.ip, port) for e in LOCALHOST)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return ()
    return (Endpoint(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, str(ip), port),)


def ras_addr(procfs: str, pid: int) -> str | None:
    """NCCL_RAS_ADDR from the process's environment (None: unset or unreadable)."""
    data = _read(f"{procfs}/{pid}/environ", MAX_ENVIRON)
    for item in (data or b"").split(b"\0"):
        if item.startswith(b"NCCL_RAS_ADDR="):
            return item[len(b"NCCL_RAS_ADDR=") :].decode("ascii", "replace")[:300]
    return None


def _ip(hexaddr: str) -> str:
    raw = bytes.fromhex(hexaddr)
    # procfs prints each 32-bit word in host (little-endian) order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listeners(procfs: str, pid: int) -> list[Listener]:
    """The LISTEN sockets of the network namespace process `pid` is in (net/tcp and net/tcp6)."""
    out: list[Listener] = []
    for table in ("tcp", "tcp6"):
        data = _read(f"{procfs}/{pid}/net/{table}", MAX_TABLE)
        for line in (data or b"").decode("ascii", "replace").splitlines()[1:]:
            f = line.split()
            if len(f) < 10 or f[3] != LISTEN or ":" not in f[1]:
                continue
            addr, port = f[1].rsplit(":", 1)
            try:
                ip = _ip(addr)
                if ip.startswith("::ffff:"):  # a v4-mapped v6 socket answers on the v4 address
                    ip = ip.removeprefix("::ffff:")
                out.append(Listener(ip, int(port, 16), int(f[9])))
            except ValueError:
                continue
    return out


def socket_inodes(procfs: str, pids: list[int]) -> set[int]:
    """The socket inodes the processes hold open (their fd links `socket:[N]`)."""
    out: set[int] = set()
    for pid in pids:
        try:
            names = os.listdir(f"{procfs}/{pid}/fd")[:MAX_FDS]
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError, PermissionError):
            continue
        for n in names:
            try:
                target = os.readlink(f"{procfs}/{pid}/fd/{n}")
            except OSError:
                continue
            if target.startswith("socket:[") and target.endswith("]"):
                try:
                    out.add(int(target[8:-1]))
                except ValueError:
                    continue
    return out


def trusted(found: list[Listener], ep: Endpoint, owned: set[int]) -> bool | None:
    """Whether the job owns every socket that can accept a connection to `ep` (the address or a
    wildcard on its port): None when none listens, False when any is not the job's (a squatter,
    another job, another user: with SO_REUSEPORT the kernel could hand our connection to it)."""
    wild = "::" if ep.family == socket.AF_INET6 else "0.0.0.0"
    mine = [x for x in found if x.port == ep.port and x.ip in (ep.ip, wild, "::")]
    if not mine:
        return None
    return all(x.inode in owned for x in mine)


def own_ips(found: list[Listener], owned: set[int]) -> set[str]:
    """The addresses the job's own sockets listen on, loopback and wildcards left out: the
    bootstrap interface's IP (NCCL's RAS ring and bootstrap listen there), which is the `host` a
    RAS report gives the job's ranks on this node."""
    out = set()
    for x in found:
        if x.inode in owned:
            ip = ipaddress.ip_address(x.ip)
            if not (ip.is_loopback or ip.is_unspecified or ip.is_link_local):
                out.add(str(ip))
    return out


def nspid(procfs: str, pid: int) -> int | None:
    """The process's pid in its own (innermost) pid namespace: what RAS reports as `pid`."""
    data = _read(f"{procfs}/{pid}/status", 64 << 10)
    for line in (data or b"").splitlines():
        if line.startswith(b"NSpid:"):
            try:
                return int(line.split()[-1])
            except (ValueError, IndexError):
                return None
    return None


def nccl_version(procfs: str, pid: int) -> str | None:
    """The NCCL version mapped into the process: from its library file's name (libnccl.so.2.27.3,
    as the deb and rpm packages install it), else, for the pip wheel's bare libnccl.so.2 under
    `<site-packages>/nvidia/nccl/lib/`, from the wheel's `nvidia_nccl_cu12-2.27.5.dist-info`
    beside it in the process's own root (PID/root: a container's files). None when neither says."""
    data = _read(f"{procfs}/{pid}/maps", MAX_TABLE) or b""
    m = _MAPS_VERSION.search(data)
    if m:
        return m.group(1).decode()
    w = _WHEEL_LIB.search(data)
    if w is None:
        return None
    site = w.group(1).decode("utf-8", "replace")
    try:
        with os.scandir(f"{procfs}/{pid}/root{site}") as entries:
            for n, e in enumerate(entries):
                if n >= MAX_FDS:  # a site-packages of a few thousand entries; a bound all the same
                    break
                d = _WHEEL_DIST.fullmatch(e.name)
                if d:
                    return d.group(1)
    except OSError:
        return None
    return None
