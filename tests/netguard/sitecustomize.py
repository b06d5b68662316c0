"""The suite's loopback guard, installed on import: a connect, sendto or name lookup beyond
loopback (169.254.169.254 and fd00:ec2::254 among them) raises NonLoopbackError before any
packet leaves, and is reported even where the code under test swallows the error (the IMDS
lookup retries quietly): to the hooks in REFUSED where the process set some, else as a line
appended to the file $GHE_TEST_NET_LOG names.

tests/conftest.py imports it into the pytest process (its hook fails the test) and names that
file for the processes the tests start; tests.helpers.guarded_env puts this directory first on
an exporter's PYTHONPATH, so Python's site module loads it there too, and the fixture fails the
test that was running on any new line. tests/test_loopback_guard.py proves both trip."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable

LOG_ENV = "GHE_TEST_NET_LOG"
REFUSED: list[Callable[[str], object]] = []


class NonLoopbackError(ConnectionRefusedError):
    """A test, or an exporter a test started, tried to reach beyond loopback."""


def allowed_host(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode()
    if not isinstance(host, str):
        return False
    if host in ("localhost", "") or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False  # a name: resolving it would ask DNS
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback) or ip.is_unspecified


def _refuse(what: str) -> None:
    msg = f"{what}: tests may only reach loopback"
    for report in REFUSED:
        report(msg)
    log = os.environ.get(LOG_ENV, "")
    if log and not REFUSED:
        with open(log, "a") as f:
            f.write(f"pid {os.getpid()}: {msg}\n")
    raise NonLoopbackError(msg)


def _check(what: str, family: int, address: object) -> None:
    if family in (socket.AF_INET, socket.AF_INET6):
        host = address[0] if isinstance(address, tuple) and address else address
        if not allowed_host(host):
            _refuse(f"{what} to {address!r}")


_connect, _connect_ex, _sendto, _getaddrinfo = (socket.socket.connect, socket.socket.connect_ex,
                                                socket.socket.sendto, socket.getaddrinfo)


def _guarded_connect(self, address):  # noqa: ANN001, ANN202
    _check("connect", self.family, address)
    return _connect(self, address)


def _guarded_connect_ex(self, address):  # noqa: ANN001, ANN202
    _check("connect", self.family, address)
    return _connect_ex(self, address)


def _guarded_sendto(self, data, *args):  # noqa: ANN001, ANN002, ANN202
    _check("sendto", self.family, args[-1])
    return _sendto(self, data, *args)


def _guarded_getaddrinfo(host, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    if host is not None and not allowed_host(host):
        _refuse(f"name lookup of {host!r}")
    return _getaddrinfo(host, *args, **kwargs)


socket.socket.connect = _guarded_connect
socket.socket.connect_ex = _guarded_connect_ex
socket.socket.sendto = _guarded_sendto
socket.getaddrinfo = _guarded_getaddrinfo
