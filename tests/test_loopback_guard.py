"""The suite's network guard (tests/conftest.py) trips on IMDS and any other non-loopback address,
also when the code under test swallows the error, and lets loopback through."""

from __future__ import annotations

import os
import socket

import pytest

from exporter import imds
from exporter.config import load
from tests import conftest


@pytest.mark.parametrize("address", [("169.254.169.254", 80), ("fd00:ec2::254", 80, 0, 0), ("192.0.2.1", 9)])
def test_connecting_beyond_loopback_fails(address):
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s, pytest.raises(conftest.NonLoopbackError):
        s.connect(address)
    assert conftest.VIOLATIONS  # the autouse fixture would fail this test ...
    conftest.VIOLATIONS.clear()  # ... so it is cleared here, having been checked


def test_udp_and_name_lookups_are_guarded_too():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s, pytest.raises(conftest.NonLoopbackError):
        s.sendto(b"x", ("169.254.169.254", 53))
    with pytest.raises(conftest.NonLoopbackError):
        socket.getaddrinfo("instance-data.ec2.internal", 80)
    conftest.VIOLATIONS.clear()


def test_a_swallowed_imds_attempt_is_still_caught(monkeypatch):
    """The IMDS client catches connection errors and retries; the guard records the attempt."""
    monkeypatch.delenv(imds.ENV_SWITCH, raising=False)
    cfg = load(None, {"instance.imds_timeout_seconds": 0.2})  # the real endpoint, the default
    client = imds.ImdsClient(cfg.instance.imds_endpoint, cfg.instance.imds_timeout_seconds)
    with pytest.raises(imds.ImdsError):  # the client turns the refusal into its own error
        client.get("instance-id")
    assert any("169.254.169.254" in v for v in conftest.VIOLATIONS)
    conftest.VIOLATIONS.clear()


def test_loopback_and_the_suite_wide_imds_switch():
    assert os.environ[imds.ENV_SWITCH] == "off"  # inherited by every exporter a test starts
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        with socket.create_connection(srv.getsockname(), timeout=2):
            pass
    assert not conftest.VIOLATIONS
