"""Instance identity from IMDSv2, against a small metadata server on 127.0.0.1 (the real HTTP client)."""

from __future__ import annotations

import time

import pytest

from exporter import collectors, imds, node
from exporter.collector import Context
from exporter.collectors.efa import EfaCollector
from exporter.collectors.instance import InstanceCollector
from exporter.compose import compose
from exporter.config import load
from exporter.nvml.fake import FakeBackend
from exporter.nvml.session import NvmlSession
from exporter.runner import Runner
from exporter.tools.simulate.imds import FakeImdsServer
from tests.helpers import (
    DEADLINE_MARGIN_S,
    FIXTURES,
    HANG_GUARD_S,
    START_HANG_GUARD_S,
    names,
    promtool_check_metrics,
    refused_address,
    samples,
    scrape,
    test_pool,
    value,
)

META = {"instance-type": "p5.48xlarge", "instance-id": "i-0123456789abcdef0",
        "placement/availability-zone": "us-east-2b"}


@pytest.fixture
def fake():
    f = FakeImdsServer(dict(META))
    f.start(poll_interval_s=0.05)
    yield f
    f.close()


def ctx_for(url: str, **overrides) -> Context:
    return compose(load(None, {"instance.imds_endpoint": url, "instance.imds_timeout_seconds": 0.3,
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
    with refused_address() as addr, pytest.raises(imds.ImdsError):
        imds.ImdsClient(f"http://{addr}", timeout_s=0.5).fetch()


def test_client_times_out_quickly(fake):
    fake.delay_s = HANG_GUARD_S  # IMDS never answers: only the 0.2 s timeout ends the wait
    t = time.monotonic()
    with pytest.raises(imds.ImdsError, match="Timeout"):
        imds.ImdsClient(fake.url, timeout_s=0.2).fetch()
    assert time.monotonic() - t < DEADLINE_MARGIN_S


def test_lookup_publishes_identity_and_metrics(fake):
    ctx = ctx_for(fake.url)
    inst = InstanceCollector(ctx)
    efa = EfaCollector(ctx)
    runner = Runner([inst, efa], deadline_s=5, pool=test_pool())
    lookup = ctx.identity.start()  # the composition root's call at start-up, once per process
    runner.start()
    try:
        assert lookup is not None and ctx.identity.start() is lookup
        assert lookup.succeeded.wait(START_HANG_GUARD_S)
        assert node.instance_type(ctx) == "p5.48xlarge"
        text = scrape(runner)
    finally:
        runner.close()
        ctx.identity.close()
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
    lookup = ctx.identity.start()
    inst.start()
    try:
        assert lookup.succeeded.wait(START_HANG_GUARD_S)
        ss = samples(scrape(Runner([inst], deadline_s=5, pool=test_pool())))
    finally:
        inst.close()
        ctx.identity.close()
    assert value(ss, "gpu_health_exporter_instance_info", instance_type="p4d.24xlarge",
                 instance_id="i-0123456789abcdef0", availability_zone="use2-az9") == 1


def test_imds_down_never_blocks_start_or_scrape(fake):
    # A black hole, and timeouts that are hang guards: a start-up or scrape that waited for IMDS
    # would take START_HANG_GUARD_S at least.
    fake.delay_s = HANG_GUARD_S
    ctx = ctx_for(fake.url, **{"instance.imds_timeout_seconds": START_HANG_GUARD_S})
    inst = InstanceCollector(ctx)
    runner = Runner([inst], deadline_s=START_HANG_GUARD_S, pool=test_pool())
    t = time.monotonic()
    ctx.identity.start()
    runner.start()
    text = scrape(runner)
    assert time.monotonic() - t < DEADLINE_MARGIN_S
    try:
        assert "gpu_health_exporter_instance_info" not in names(text)
        assert value(text, "gpu_health_exporter_imds_lookup_success") == 0
        assert node.instance_type(ctx) is None
    finally:
        fake.released.set()  # the background lookup's request returns: nothing left blocked
        runner.close()
        ctx.identity.close()


def test_the_scrape_path_never_starts_the_lookup(fake):
    """Nothing known and IMDS allowed: collecting (the verdict's expected count, the instance and
    EFA collectors) reads only what is known; the lookup is the composition root's to start."""
    from exporter.collectors.health import HealthCollector

    ctx = ctx_for(fake.url, **{"instance.scheduled_events": False})
    runner = Runner([InstanceCollector(ctx), EfaCollector(ctx), HealthCollector(ctx)], deadline_s=5,
            pool=test_pool())
    try:
        scrape(runner)
        assert node.instance_type(ctx) is None and node.expected_gpus(ctx) is None
    finally:
        runner.close()
    assert ctx.identity.lookup is None and fake.requests == []


def test_lookup_retries_with_backoff_until_imds_answers(fake):
    fake.delay_s = 3.0
    found = []
    lookup = imds.IdentityLookup(imds.ImdsClient(fake.url, timeout_s=0.2), found.append, first_retry_s=0.05)
    lookup.start()
    try:
        deadline = time.monotonic() + START_HANG_GUARD_S
        while not lookup.last_error and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "Timeout" in lookup.last_error and not found
        fake.delay_s = 0.0
        assert lookup.succeeded.wait(START_HANG_GUARD_S)
    finally:
        lookup.close()
    assert lookup.attempts >= 2
    assert found == [imds.InstanceIdentity("p5.48xlarge", "i-0123456789abcdef0", "us-east-2b")]
    assert lookup.last_error == ""


def test_imds_off_in_simulation_capture_and_config(fake, tmp_path):
    from exporter.arguments import build_parser
    from exporter.startup import build_context

    cfg = tmp_path / "config.yaml"  # a file that asks for IMDS: a simulated or replayed node still does not
    cfg.write_text(f"instance:\n  imds: true\n  imds_endpoint: {fake.url}\n")
    for flags in (["--simulate", "p4d.24xlarge"], ["--nvml-capture", "x.json"]):
        ctx, sim = build_context(build_parser().parse_args([*flags, "--config", str(cfg)]))
        try:
            assert ctx.identity.start() is None, flags
        finally:
            if sim is not None:
                sim.close()
    assert ctx_for(fake.url, **{"instance.imds": False}).identity.start() is None
    full = ctx_for(fake.url, **{"node.instance_type": "p5.48xlarge", "instance.instance_id": "i-1",
                                "instance.availability_zone": "us-east-2a"})
    assert full.identity.start() is None  # config already says everything
    assert fake.requests == []
    # nothing known and IMDS off: no info metric at all
    ctx = ctx_for(fake.url, **{"instance.imds": False})
    inst = InstanceCollector(ctx)
    inst.start()
    text = scrape(Runner([inst], deadline_s=5, pool=test_pool()))
    assert "gpu_health_exporter_instance_info" not in names(text)
    assert "gpu_health_exporter_imds_lookup_success" not in names(text)


def test_proxy_environment_is_ignored(fake, monkeypatch):
    with refused_address() as proxy:  # a proxy that refused would fail the lookup
        monkeypatch.setenv("HTTP_PROXY", f"http://{proxy}")
        monkeypatch.setenv("http_proxy", f"http://{proxy}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        assert imds.ImdsClient(fake.url, timeout_s=1).fetch().instance_type == "p5.48xlarge"


CAPTURE = FIXTURES / "nvml" / "h200" / "nvml_capture.json"  # a real one-GPU H200 node


def dmi_sysfs(root, product_name: str | None, **files: str) -> str:
    """A generated sysfs tree with (or without) a DMI product name, and other DMI files."""
    dmi = root / "sys" / "devices" / "virtual" / "dmi" / "id"
    dmi.mkdir(parents=True)
    if product_name is not None:
        (dmi / "product_name").write_text(product_name + "\n")
    for name, text in files.items():
        (dmi / name).write_text(text + "\n")
    return str(root / "sys")


def one_gpu_ctx(tmp_path, product_name: str | None, dmi: dict | None = None, nvml=None,
                **overrides) -> Context:
    """The real H200 capture (one GPU) on a node whose sysfs has this DMI product name."""
    collectors.collector_classes()  # every section declared (the XID service's among them)
    kmsg = tmp_path / "kmsg"
    tmp_path.mkdir(parents=True, exist_ok=True)
    kmsg.write_text("")  # an empty kernel log: no XIDs
    sysfs = dmi_sysfs(tmp_path, product_name, **(dmi or {}))
    cfg = load(None, {"paths.sysfs": sysfs, "paths.kmsg": str(kmsg),
                      "paths.state_dir": str(tmp_path / "st"), "instance.imds_timeout_seconds": 0.5,
                      **overrides})
    return compose(cfg, nvml=nvml or NvmlSession(FakeBackend.from_file(CAPTURE), pool=test_pool()))


def test_instance_type_from_dmi_first_then_imds_and_config_wins(tmp_path, fake):
    fake.meta["instance-type"] = "p4d.24xlarge"
    ctx = one_gpu_ctx(tmp_path / "a", "p5.48xlarge", **{"instance.imds_endpoint": fake.url})
    assert node.instance_type(ctx) == "p5.48xlarge" and ctx.identity.instance_type_source() == "dmi"
    assert node.expected_gpus(ctx) == 8
    ctx = one_gpu_ctx(tmp_path / "b", None, **{"instance.imds_endpoint": fake.url})
    assert ctx.identity.lookup_now() == "p4d.24xlarge" and ctx.identity.instance_type_source() == "imds"
    assert ctx.identity.start() is None  # a one-shot lookup starts no background thread
    ctx = one_gpu_ctx(tmp_path / "c", "p5.48xlarge", **{"instance.imds_endpoint": fake.url,
                                                       "node.instance_type": "p5en.48xlarge"})
    assert node.instance_type(ctx) == "p5en.48xlarge" and ctx.identity.instance_type_source() == "config"
    assert ctx.identity.lookup_now() == "p5en.48xlarge"
    assert [p for _, p in fake.requests if "instance-type" in p] == ["/latest/meta-data/instance-type"]


def test_daemon_verdict_knows_a_p5_by_dmi(tmp_path):
    """The GPU and health collectors with no IMDS lookup started: the DMI product name gives the
    expected count, the verdict misses 7 GPUs."""
    from exporter.collectors.gpu import GpuCollector
    from exporter.collectors.health import HealthCollector

    ctx = one_gpu_ctx(tmp_path, "p5.48xlarge")
    runner = Runner([GpuCollector(ctx), HealthCollector(ctx)], deadline_s=10, pool=test_pool())
    try:
        ss = samples(scrape(runner))
    finally:
        runner.close()
    assert value(ss, "gpu_devices_expected") == 8 and value(ss, "gpu_devices") == 1
    assert value(ss, "gpu_node_health_reason", reason="gpu_count_below_expected") == 1
    assert value(ss, "gpu_node_health_verdict", verdict="reboot_required") == 1


def test_check_asks_imds_once_when_dmi_says_nothing(tmp_path, fake, capsys):
    import argparse
    import json

    from exporter.commands import check

    # a Xen-based EC2 instance: no instance type in the product name, an EC2 product UUID
    ctx = one_gpu_ctx(tmp_path, "HVM domU", dmi={"product_uuid": "EC2E1916-9099-7CAF-FD21-012345678901"},
                      **{"instance.imds_endpoint": fake.url})
    code = check.run(argparse.Namespace(json=True), ctx)
    doc = json.loads(capsys.readouterr().out)
    assert code == 2 and doc["node"]["instance_type_source"] == "imds"
    assert "1 GPU(s), 8 expected" in doc["node"]["details"]["gpu_count_below_expected"]
    assert ctx.identity.lookup is None  # no background lookup left behind
    fake.delay_s = HANG_GUARD_S  # IMDS does not answer: the check waits one short timeout, then
    # expects nothing
    ctx = one_gpu_ctx(tmp_path / "slow", None, **{"instance.imds_endpoint": fake.url})
    t = time.monotonic()
    code = check.run(argparse.Namespace(json=True), ctx)
    assert time.monotonic() - t < DEADLINE_MARGIN_S
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["node"]["instance_type"] is None and doc["node"]["expected_gpus"] is None


def test_client_retries_throttling_and_errors_a_bounded_number_of_times(fake):
    fake.fail_next = [429, 503]  # IMDS throttles, then fails once: the same request is tried again
    assert imds.ImdsClient(fake.url, timeout_s=1).fetch().instance_type == "p5.48xlarge"
    assert [m for m, _ in fake.requests[:3]] == ["PUT"] * 3
    fake.requests.clear()
    fake.fail_next = [503] * 10
    with pytest.raises(imds.ImdsError, match="503"):
        imds.ImdsClient(fake.url, timeout_s=1).fetch()
    assert len(fake.requests) == 1 + imds.STATUS_RETRIES  # bounded
    fake.requests.clear()
    fake.fail_next = [403, 404]  # refusals are answers: never retried
    with pytest.raises(imds.ImdsError, match="403"):
        imds.ImdsClient(fake.url, timeout_s=1).fetch()
    assert len(fake.requests) == 1


def test_client_reuses_its_token_and_renews_an_expired_one(fake):
    client = imds.ImdsClient(fake.url, timeout_s=1)
    try:
        client.fetch()
        client.get("instance-id")
        assert [m for m, _ in fake.requests].count("PUT") == 1
        fake.token = "AQAEArotated=="  # IMDS restarted: the old token is refused with 401
        assert client.get("instance-id") == ["i-0123456789abcdef0"]
        assert [m for m, _ in fake.requests].count("PUT") == 2
    finally:
        client.close()


def test_a_read_timeout_is_retried_once_then_reported(fake):
    fake.delay_s = HANG_GUARD_S
    t = time.monotonic()
    with pytest.raises(imds.ImdsError, match="^Timeout"):
        imds.ImdsClient(fake.url, timeout_s=0.2).fetch()
    assert len(fake.requests) == 1 + imds.READ_RETRIES
    assert time.monotonic() - t < DEADLINE_MARGIN_S  # each try its 0.2 s, never the answer's hang


# --- IMDS only where it can answer ---------------------------------------------------------------

@pytest.mark.parametrize(("files", "want"), [
    ({"sys_vendor": "Amazon EC2", "product_name": "p5.48xlarge"}, True),
    ({"sys_vendor": "Xen", "bios_vendor": "Amazon EC2", "product_name": "HVM domU"}, True),
    ({"sys_vendor": "Xen", "product_name": "HVM domU", "product_uuid": "ec2e1916-9099-7caf"}, True),
    ({"product_name": "p5.48xlarge"}, True),  # only the product name, an instance type
    ({"sys_vendor": "QEMU", "product_name": "Standard PC (Q35 + ICH9, 2009)"}, False),
    ({"sys_vendor": "Dell Inc.", "product_name": "PowerEdge R750xa"}, False),
    ({}, None),  # nothing to read (a container without /sys): not known
])
def test_dmi_says_whether_the_host_is_on_ec2(tmp_path, files, want):
    from exporter import dmi

    files = dict(files)
    assert dmi.on_ec2(dmi_sysfs(tmp_path, files.pop("product_name", None), **files)) is want


def test_off_ec2_by_dmi_neither_the_daemon_nor_check_asks_imds(tmp_path, fake, capsys, caplog):
    import argparse
    import logging

    from exporter.commands import check

    caplog.set_level(logging.INFO, logger="exporter.imds")
    ctx = one_gpu_ctx(tmp_path / "d", "PowerEdge R750xa", dmi={"sys_vendor": "Dell Inc."},
                      **{"instance.imds_endpoint": fake.url})
    assert ctx.identity.start() is None  # the daemon starts no lookup
    assert imds.events_poller(ctx.identity, lambda _: None) is None
    assert any("not an EC2 instance" in r.getMessage() for r in caplog.records)
    ctx = one_gpu_ctx(tmp_path / "c", "PowerEdge R750xa", dmi={"sys_vendor": "Dell Inc."},
                      **{"instance.imds_endpoint": fake.url})
    assert check.run(argparse.Namespace(json=True), ctx) == 0
    capsys.readouterr()
    assert fake.requests == []


def test_check_asks_imds_nothing_when_nvml_is_unusable(tmp_path, fake, capsys):
    """The answer can only be 3: the instance type would be read by nothing."""
    import argparse
    import json

    from exporter.commands import check

    broken = FakeBackend({"system": {}, "devices": []})
    broken.fail_init(12, "NVML Shared Library Not Found")
    ctx = one_gpu_ctx(tmp_path, None, nvml=NvmlSession(broken,
            pool=test_pool()), **{"instance.imds_endpoint": fake.url})
    code = check.run(argparse.Namespace(json=True), ctx)
    doc = json.loads(capsys.readouterr().out)
    assert code == 3 and doc["node"]["verdict"] == "unknown"
    assert fake.requests == []


def test_check_asks_imds_nothing_when_the_config_gives_the_gpu_count(tmp_path, fake, capsys):
    import argparse

    from exporter.commands import check

    ctx = one_gpu_ctx(tmp_path, None, **{"instance.imds_endpoint": fake.url, "node.expected_gpus": 1})
    assert check.run(argparse.Namespace(json=True), ctx) == 0
    capsys.readouterr()
    assert fake.requests == []


def test_a_failing_lookup_backs_off_exponentially_and_logs_once_per_state_change(fake, caplog):
    import logging

    caplog.set_level(logging.DEBUG)
    found = []
    with refused_address() as addr:
        lookup = imds.IdentityLookup(imds.ImdsClient(f"http://{addr}", timeout_s=0.2), found.append,
                                     first_retry_s=0.02, max_retry_s=0.16)
        lookup.start()
        deadline = time.monotonic() + START_HANG_GUARD_S
        while lookup.attempts < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        lookup.close()
    assert lookup.attempts >= 6 and not found
    assert lookup.waits[:6] == [0.02, 0.04, 0.08, 0.16, 0.16, 0.16]  # doubling, capped
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in warnings] == ["exporter.imds"], [r.getMessage() for r in warnings]
    assert "failed" in warnings[0].getMessage()
    # failing -> answering -> failing: one line per change
    caplog.clear()
    fake.delay_s = 0.0
    poller = imds.ImdsPoller(imds.ImdsClient(fake.url, timeout_s=0.2).fetch, found.append, "identity",
                             first_retry_s=0.02, max_retry_s=0.04, refresh_s=0.05)
    fake.fail_next = [403] * 3
    poller.start()
    try:
        deadline = time.monotonic() + START_HANG_GUARD_S
        while not poller.succeeded.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        while poller.attempts < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        poller.close()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "exporter.imds"
             and r.levelno >= logging.INFO]
    assert [lv for lv, _ in lines] == ["WARNING", "INFO"], lines


@pytest.mark.parametrize("endpoint", ["https://169.254.169.254", "169.254.169.254", "http://", "http://[::1"])
def test_an_imds_endpoint_that_is_not_an_http_url_is_refused_naming_the_key(endpoint):
    from exporter.config import ConfigError

    with pytest.raises(ConfigError, match=r"instance\.imds_endpoint.*http://"):
        load(None, {"instance.imds_endpoint": endpoint})


def test_an_ipv6_imds_endpoint_is_valid_and_parsed_to_its_address():
    assert imds.http_url("http://[fd00:ec2::254]") is None
    client = imds.ImdsClient("http://[fd00:ec2::254]")
    assert (client.host, client.port, client.base) == ("fd00:ec2::254", 80, "")
