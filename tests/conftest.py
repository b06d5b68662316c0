"""Suite-wide guards and settings.

- No test sends a packet beyond loopback. IMDS is off for the whole suite (the environment
  switch, inherited by every exporter the tests start) unless a test turns it back on to point
  the exporter at a fake IMDS on 127.0.0.1 (tests/test_imds.py). In this process, every socket
  connect or sendto to an address that is not loopback, and every name lookup of a host that is
  not an IP literal or localhost, raises NonLoopbackError and fails the test, even where the code
  under test catches the error (the IMDS lookup retries quietly): 169.254.169.254 and
  fd00:ec2::254 in particular. tests/test_loopback_guard.py proves it trips.
- Hypothesis runs derandomized: the "ci" profile (the default, and what .ci/run uses) draws the
  same examples on every run and machine (a seed derived from each test), so a run that passed
  passes again and a failure reproduces; deadline off (a loaded 2-core CI must not turn slowness
  into failures), 300 examples a test, no example database. The random search runs on demand:
  `HYPOTHESIS_PROFILE=search .venv/bin/python -m pytest -q tests/test_property_parsers.py
  tests/test_exposition.py` draws fresh examples, 5,000 a test (about 5 minutes on 2 cores), keeps
  failures in .hypothesis/ and prints the blob that replays one (`@reproduce_failure`).
- The suite is a composition root: it discovers the collectors once, at start, so their config
  sections are in the schema whatever a test imports (exporter.config imports no collector).
"""

from __future__ import annotations

import ipaddress
import os
import socket

import pytest

from exporter import collectors
from exporter.imds import ENV_SWITCH

os.environ[ENV_SWITCH] = "off"  # before any exporter is built or started


def pytest_configure(config: pytest.Config) -> None:
    collectors.discover()


class NonLoopbackError(ConnectionRefusedError):
    """A test tried to reach beyond loopback."""


VIOLATIONS: list[str] = []


def _allowed_host(host: object) -> bool:
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


def _guard(what: str, family: int, address: object) -> None:
    if family not in (socket.AF_INET, socket.AF_INET6):
        return  # AF_UNIX, netlink: local by nature
    host = address[0] if isinstance(address, tuple) and address else address
    if not _allowed_host(host):
        msg = f"{what} to {address!r}: tests may only reach loopback"
        VIOLATIONS.append(msg)
        raise NonLoopbackError(msg)


_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex
_sendto = socket.socket.sendto
_getaddrinfo = socket.getaddrinfo


def _guarded_connect(self, address):  # noqa: ANN001, ANN202
    _guard("connect", self.family, address)
    return _connect(self, address)


def _guarded_connect_ex(self, address):  # noqa: ANN001, ANN202
    _guard("connect", self.family, address)
    return _connect_ex(self, address)


def _guarded_sendto(self, data, *args):  # noqa: ANN001, ANN002, ANN202
    _guard("sendto", self.family, args[-1])
    return _sendto(self, data, *args)


def _guarded_getaddrinfo(host, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    if host is not None and not _allowed_host(host.decode() if isinstance(host, bytes) else host):
        msg = f"name lookup of {host!r}: tests may only reach loopback"
        VIOLATIONS.append(msg)
        raise NonLoopbackError(msg)
    return _getaddrinfo(host, *args, **kwargs)


socket.socket.connect = _guarded_connect
socket.socket.connect_ex = _guarded_connect_ex
socket.socket.sendto = _guarded_sendto
socket.getaddrinfo = _guarded_getaddrinfo


@pytest.fixture(autouse=True)
def loopback_only():
    """Fail the test that tried to reach beyond loopback, even if the code swallowed the error."""
    VIOLATIONS.clear()
    yield
    if VIOLATIONS:
        found = list(VIOLATIONS)
        VIOLATIONS.clear()
        pytest.fail("network beyond loopback: " + "; ".join(found), pytrace=False)


try:
    from hypothesis import HealthCheck, settings

    _hypothesis = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow], "print_blob": True}
    settings.register_profile("ci", derandomize=True, database=None, max_examples=300, **_hypothesis)
    settings.register_profile("search", derandomize=False, max_examples=5000, **_hypothesis)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    pass
