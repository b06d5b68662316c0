"""The suite's network guard (tests/netguard, tests/conftest.py) trips on IMDS and any other
non-loopback address, also when the code under test swallows the error, and lets loopback
through; in the pytest process and in the exporters the tests start. An exporter a test starts
on this machine has IMDS off through its configuration (tests.helpers.no_imds) and reaches
nothing beyond loopback."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import requests

from exporter import imds
from exporter.config import load
from tests import conftest
from tests.helpers import NO_IMDS, guarded_env, no_imds, running_exporter, value, wait_for


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


def test_a_swallowed_imds_attempt_is_still_caught():
    """The IMDS client catches connection errors and retries; the guard records the attempt."""
    cfg = load(None, {"instance.imds_timeout_seconds": 0.2})  # the real endpoint, the default
    sec = cfg.section(imds.InstanceSection)
    client = imds.ImdsClient(sec.imds_endpoint, sec.imds_timeout_seconds)
    with pytest.raises(imds.ImdsError):  # the client turns the refusal into its own error
        client.get("instance-id")
    assert any("169.254.169.254" in v for v in conftest.VIOLATIONS)
    conftest.VIOLATIONS.clear()


def test_loopback_is_allowed():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        with socket.create_connection(srv.getsockname(), timeout=2):
            pass
    assert not conftest.VIOLATIONS


def test_an_exporter_a_test_starts_is_guarded_and_caught_asking_imds(tmp_path):
    """The guard in a started exporter: with IMDS on (the default config) the daemon's start-up
    lookup is refused and reported to the suite, so a test whose exporter did so fails."""
    conftest.child_violations()
    cfg = tmp_path / "imds-on.yaml"
    cfg.write_text("instance:\n  imds_timeout_seconds: 0.2\n")
    cmd = [sys.executable, "-m", "exporter", "--config", str(cfg), "--collectors", "instance",
           "--listen", "127.0.0.1:0"]
    proc = subprocess.Popen(cmd, env=guarded_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        found: list[str] = []
        wait_for(lambda: found.extend(conftest.child_violations()) or found, 60,
                 "the exporter's IMDS lookup refused", proc)
    finally:
        proc.kill()
        proc.wait()
    assert any("169.254.169.254" in v for v in found), found
    conftest.child_violations()  # checked here: not this test's failure


def test_an_exporter_on_this_machine_gets_imds_off_through_its_config(tmp_path):
    """tests.helpers gives an exporter on this machine `instance.imds: false` (or insists its own
    config says so); a simulated or replayed node turns IMDS off itself. With every collector
    (the instance collector's identity lookup and scheduled events among them) nothing was asked:
    no lookup series, and the guard saw nothing (the autouse fixture fails the test otherwise)."""
    assert no_imds(["--collectors", "gpu"]) == ["--collectors", "gpu", "--config", str(NO_IMDS)]
    assert no_imds(["--simulate", "p5.48xlarge"]) == ["--simulate", "p5.48xlarge"]
    assert load(NO_IMDS).section(imds.InstanceSection).imds is False
    on = tmp_path / "on.yaml"
    on.write_text("log_level: info\n")
    with pytest.raises(AssertionError, match="imds: false"):
        no_imds(["--config", str(on)])
    (tmp_path / "kmsg").write_text("")
    t = str(tmp_path)
    roots = ["--path.sysfs", t, "--path.procfs", t, "--path.kmsg", f"{t}/kmsg"]
    with running_exporter(*roots, "--path.state-dir", str(tmp_path / "st")) as url:
        text = requests.get(url + "/metrics", timeout=10).text
    assert value(text, "gpu_health_exporter_collector_success", collector="instance") == 1
    assert "gpu_health_exporter_imds_lookup_success" not in text
    assert "gpu_health_exporter_imds_events_lookup_success" not in text
    assert not conftest.child_violations()
