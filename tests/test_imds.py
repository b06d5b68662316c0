"""Instance identity from IMDSv2, against a small metadata server on 127.0.0.1 (the real requests path)."""

from __future__ import annotations

import socket
import time

import pytest

from exporter import imds, node
from exporter.collector import Context
from exporter.collectors.efa import EfaCollector
from exporter.collectors.instance import InstanceCollector
from exporter.config import load
from exporter.runner import Runner
from exporter.simulate.imds import FakeImdsServer
from tests.helpers import names, promtool_check_metrics, samples, scrape, value

META = {"instance-type": "p5.48xlarge", "instance-id": "i-0123456789abcdef0",
        "placement/availability-zone": "us-east-2b"}


@pytest.fixture
def fake():
    f = FakeImdsServer(dict(META))
    f.start(poll_interval_s=0.05)
    yield f
    f.close()


@pytest.fixture(autouse=True)
def imds_allowed(monkeypatch):
    monkeypatch.delenv(imds.ENV_SWITCH, raising=False)


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def ctx_for(url: str, **overrides) -> Context:
    return Context(config=load(None, {"instance.imds_endpoint": url, "instance.imds_timeout_seconds": 0.3,
                                      **overrides}))


def test_client_token_then_gets(fake):
    ident = imds.ImdsClient(fake.url, timeout_s=1).fetch()
    assert ident == imds.InstanceIdentity("p5.48xlarge", "i-0123456789abcdef0", "us-east-2b")
    assert fake.requests[0] == ("PUT", "/latest/api/token")
    assert {p for m, p in fake.requests[1:]} == {f"/latest/meta-data/{k}" for k in META}


def test_client_errors(fake):
    fake.token_status = 403  # IMDS disabled or IMDSv2 refused
    with pytest.raises(imds.ImdsError, match="403"):
        imds.ImdsClient(fake.url, timeout_s=1).fetch()
    with pytest.raises(imds.ImdsError):
        imds.ImdsClient(closed_port_url(), timeout_s=0.5).fetch()


def test_client_times_out_quickly(fake):
    fake.delay_s = 2.0
    t = time.monotonic()
    with pytest.raises(imds.ImdsError, match="Timeout"):
        imds.ImdsClient(fake.url, timeout_s=0.2).fetch()
    assert time.monotonic() - t < 1.5


def test_lookup_publishes_identity_and_metrics(fake):
    ctx = ctx_for(fake.url)
    inst = InstanceCollector(ctx)
    efa = EfaCollector(ctx)
    runner = Runner([inst, efa], deadline_s=5)
    runner.start()
    try:
        assert inst.lookup is efa.lookup is not None  # one lookup per process
        assert inst.lookup.succeeded.wait(5)
        assert node.instance_type(ctx) == "p5.48xlarge"
        text = scrape(runner)
    finally:
        runner.close()
    ss = samples(text)
    assert value(ss, "gpu_health_exporter_instance_info", instance_type="p5.48xlarge",
                 instance_id="i-0123456789abcdef0", availability_zone="us-east-2b") == 1
    assert value(ss, "gpu_health_exporter_imds_lookup_success") == 1
    assert value(ss, "efa_devices_expected") == 32
    assert promtool_check_metrics(text) == ""
    identity_gets = [p for m, p in fake.requests if m == "GET" and "/events/" not in p]
    assert sorted(identity_gets) == sorted(f"/latest/meta-data/{k}" for k in META)  # looked up once


def test_config_wins_over_imds(fake):
    ctx = ctx_for(fake.url, **{"node.instance_type": "p4d.24xlarge",
                               "instance.availability_zone": "use2-az9"})
    inst = InstanceCollector(ctx)
    inst.start()
    try:
        assert inst.lookup.succeeded.wait(5)
        ss = samples(scrape(Runner([inst], deadline_s=5)))
    finally:
        inst.close()
    assert value(ss, "gpu_health_exporter_instance_info", instance_type="p4d.24xlarge",
                 instance_id="i-0123456789abcdef0", availability_zone="use2-az9") == 1


def test_imds_down_never_blocks_start_or_scrape(fake):
    fake.delay_s = 3.0  # a black hole as far as a 2 s timeout is concerned
    ctx = ctx_for(fake.url, **{"instance.imds_timeout_seconds": 2.0})
    inst = InstanceCollector(ctx)
    runner = Runner([inst], deadline_s=5)
    t = time.monotonic()
    runner.start()
    text = scrape(runner)
    # A start-up or scrape that waited for IMDS would take the 2 s timeout at least.
    assert time.monotonic() - t < 1.5
    try:
        assert "gpu_health_exporter_instance_info" not in names(text)
        assert value(text, "gpu_health_exporter_imds_lookup_success") == 0
        assert node.instance_type(ctx) is None
    finally:
        runner.close()


def test_lookup_retries_with_backoff_until_imds_answers(fake):
    fake.delay_s = 3.0
    found = []
    lookup = imds.IdentityLookup(imds.ImdsClient(fake.url, timeout_s=0.2), found.append, first_retry_s=0.05)
    lookup.start()
    try:
        deadline = time.monotonic() + 5
        while not lookup.last_error and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "Timeout" in lookup.last_error and not found
        fake.delay_s = 0.0
        assert lookup.succeeded.wait(10)
    finally:
        lookup.close()
    assert lookup.attempts >= 2
    assert found == [imds.InstanceIdentity("p5.48xlarge", "i-0123456789abcdef0", "us-east-2b")]
    assert lookup.last_error == ""


def test_imds_off_in_simulation_env_and_config(fake, monkeypatch):
    from exporter.simulate import Simulation

    sim = Simulation("p4d.24xlarge")
    try:
        ctx = Context(config=load(None, {"instance.imds_endpoint": fake.url}), simulation=sim)
        assert ctx.identity.start_lookup() is None
    finally:
        sim.close()
    assert Context(config=load(None, {"instance.imds_endpoint": fake.url}),
                   nvml_capture="x.json").identity.start_lookup() is None
    assert ctx_for(fake.url, **{"instance.imds": False}).identity.start_lookup() is None
    monkeypatch.setenv(imds.ENV_SWITCH, "off")
    assert ctx_for(fake.url).identity.start_lookup() is None
    monkeypatch.delenv(imds.ENV_SWITCH)
    full = ctx_for(fake.url, **{"node.instance_type": "p5.48xlarge", "instance.instance_id": "i-1",
                                "instance.availability_zone": "us-east-2a"})
    assert full.identity.start_lookup() is None  # config already says everything
    assert fake.requests == []
    # nothing known and IMDS off: no info metric at all
    ctx = ctx_for(fake.url, **{"instance.imds": False})
    inst = InstanceCollector(ctx)
    inst.start()
    text = scrape(Runner([inst], deadline_s=5))
    assert "gpu_health_exporter_instance_info" not in names(text)
    assert "gpu_health_exporter_imds_lookup_success" not in names(text)


def test_proxy_environment_is_ignored(fake, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", closed_port_url())
    monkeypatch.setenv("http_proxy", closed_port_url())
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert imds.ImdsClient(fake.url, timeout_s=1).fetch().instance_type == "p5.48xlarge"
