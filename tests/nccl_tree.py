"""A procfs tree of a job's processes for the NCCL collector's tests: environ, status (NSpid),
fd links to socket inodes, net/tcp{,6} of their namespace and ns/net (a link to the test's own
namespace: the tests talk to their fake RAS server in it)."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path


def _hex(ip: str, port: int) -> str:
    raw = ipaddress.ip_address(ip).packed
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return f"{words.hex().upper()}:{port:04X}"


@dataclass
class Proc:
    pid: int
    nspid: int
    gpu: int
    env: dict[str, str] = field(default_factory=dict)
    sockets: list[int] = field(default_factory=list)  # inodes it holds
    maps: str = ""


def write(root: Path, procs: list[Proc], listeners: list[tuple[str, int, int]]) -> None:
    """`listeners`: (ip, port, inode) LISTEN sockets of the namespace every process is in."""
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
