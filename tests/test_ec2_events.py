"""EC2 scheduled maintenance events from IMDSv2, against the fake metadata server on 127.0.0.1:
the documented JSON shapes (active, completed, canceled, several events, malformed), the
background poll (never on the scrape path) and the series it exports."""

from __future__ import annotations

import json
import time

import pytest

from exporter import imds
from exporter.collectors.instance import InstanceCollector
from exporter.runner import Runner
from tests.helpers import (
    DEADLINE_MARGIN_S,
    HANG_GUARD_S,
    START_HANG_GUARD_S,
    names,
    promtool_check_metrics,
    samples,
    scrape,
    test_pool,
    value,
    wait_for,
)
from tests.test_imds import ctx_for, fake  # noqa: F401 - fixtures

# The EC2 user guide's example (instance metadata, scheduled events), as IMDS serves it.
ACTIVE = {"NotBefore": "21 Jan 2019 09:00:43 GMT", "Code": "system-reboot",
          "Description": "scheduled reboot", "EventId": "instance-event-0d59937288b749b32",
          "NotAfter": "21 Jan 2019 09:17:23 GMT",
          "State": "active"}
# An instance-stop has no NotAfter; a day below 10 is not zero-padded (seen in a real dump); a
# reschedulable event carries NotBeforeDeadline.
STOP = {"NotBefore": "1 Jan 2021 02:00:00 GMT", "Code": "instance-stop",
        "Description": "The instance is running on degraded hardware",
        "EventId": "instance-event-1234567890abcdef0", "State": "active"}
RETIRE = {"NotBefore": "28 Dec 2023 13:56:07 GMT", "NotBeforeDeadline": "4 Jan 2024 13:56:07 GMT",
          "Code": "instance-retirement", "Description": "The instance is scheduled for retirement",
          "EventId": "instance-event-0a1b2c3d4e5f60718", "NotAfter": "28 Dec 2023 15:56:07 GMT",
          "State": "active"}
COMPLETED = {**ACTIVE, "State": "completed", "Description": "[Completed] scheduled reboot",
             "EventId": "instance-event-0000000000000000a"}
CANCELED = {**ACTIVE, "State": "canceled", "Description": "[Canceled] scheduled reboot",
            "EventId": "instance-event-0000000000000000b"}


def test_shapes():
    assert imds.parse_scheduled_events("[]") == []
    (ev,) = imds.parse_scheduled_events(json.dumps([ACTIVE]))
    assert ev == imds.ScheduledEvent("system-reboot", "instance-event-0d59937288b749b32", "active",
                                     1548061243.0, 1548062243.0, "scheduled reboot")
    assert imds.parse_scheduled_events(json.dumps([COMPLETED, CANCELED])) == []
    several = imds.parse_scheduled_events(json.dumps([ACTIVE, COMPLETED, STOP, RETIRE, CANCELED]))
    assert [(e.code, e.not_after) for e in several] == [
        ("system-reboot", 1548062243.0), ("instance-stop", None), ("instance-retirement", 1703778967.0)]
    assert several[1].not_before == 1609466400.0  # 1 Jan 2021 02:00:00 UTC


@pytest.mark.parametrize(("body", "error"), [
    ("<html>503</html>", "not JSON"),
    ('{"Code": "system-reboot"}', "expected a JSON array, got dict"),
    ('["system-reboot"]', r"scheduled\[0\] is not an object"),
    (json.dumps([ACTIVE, {**ACTIVE, "Code": None}]), r"scheduled\[1\]: Code is None"),
    (json.dumps([{**ACTIVE, "EventId": ""}]), r"scheduled\[0\]: EventId"),
    (json.dumps([{**ACTIVE, "NotBefore": "tomorrow"}]), r"scheduled\[0\]: NotBefore is 'tomorrow'"),
    (json.dumps([{**ACTIVE, "NotAfter": 1548062243}]), r"scheduled\[0\]: NotAfter is 1548062243"),
])
def test_malformed_answers_name_the_entry_and_key(body, error):
    with pytest.raises(ValueError, match=error):
        imds.parse_scheduled_events(body)


def event_series(text):
    return {(n, dict(ls)["code"], dict(ls)["event_id"]): v for (n, ls), v in samples(text).items()
            if n.startswith("ec2_scheduled_event")}



def test_poll_exports_active_events_and_follows_changes(fake):  # noqa: F811
    fake.meta[imds.EVENTS_PATH] = json.dumps([ACTIVE, COMPLETED, RETIRE])
    ctx = ctx_for(fake.url, **{"instance.scheduled_events_interval_seconds": 0.1})
    inst = InstanceCollector(ctx)
    runner = Runner([inst], deadline_s=5, pool=test_pool())
    runner.start()
    try:
        assert wait_for(lambda: inst.events)
        text = scrape(runner)
        assert promtool_check_metrics(text) == ""
        start = "ec2_scheduled_event_start_timestamp_seconds"
        end = "ec2_scheduled_event_end_timestamp_seconds"
        assert event_series(text) == {
            (start, "system-reboot", ACTIVE["EventId"]): 1548061243.0,
            (end, "system-reboot", ACTIVE["EventId"]): 1548062243.0,
            (start, "instance-retirement", RETIRE["EventId"]): 1703771767.0,
            (end, "instance-retirement", RETIRE["EventId"]): 1703778967.0}
        assert value(text, "gpu_health_exporter_imds_events_lookup_success") == 1
        # a malformed answer: the last good events stay, the lookup reports failure
        fake.meta[imds.EVENTS_PATH] = "[{"
        assert wait_for(lambda: not inst.poller.ok)
        text = scrape(runner)
        assert value(text, "gpu_health_exporter_imds_events_lookup_success") == 0
        assert len(event_series(text)) == 4
        assert "not JSON" in inst.poller.last_error
        # the event completed: gone from scheduled (it moves to history)
        fake.meta[imds.EVENTS_PATH] = "[]"
        assert wait_for(lambda: inst.poller.ok and not inst.events)
        text = scrape(runner)
        assert event_series(text) == {} and start in text  # HELP and TYPE stay
        assert value(text, "gpu_health_exporter_imds_events_lookup_success") == 1
    finally:
        runner.close()
    assert all(p.startswith("/latest/") for _, p in fake.requests)


def test_events_poll_never_blocks_a_scrape_and_can_be_off(fake):  # noqa: F811
    # IMDS never answers and every timeout is a hang guard: a scrape that waited for the poll
    # would take START_HANG_GUARD_S or more; one that does not returns within DEADLINE_MARGIN_S.
    fake.delay_s = HANG_GUARD_S
    ctx = ctx_for(fake.url, **{"instance.imds_timeout_seconds": START_HANG_GUARD_S,
                               "node.instance_type": "p5.48xlarge",
                               "instance.instance_id": "i-1", "instance.availability_zone": "a"})
    inst = InstanceCollector(ctx)
    runner = Runner([inst], deadline_s=START_HANG_GUARD_S, pool=test_pool())
    t = time.monotonic()
    assert ctx.identity.start() is None  # the identity is all in the config ...
    runner.start()
    try:
        text = scrape(runner)
        assert time.monotonic() - t < DEADLINE_MARGIN_S
        assert inst.poller is not None  # ... the events are still polled
        assert value(text, "gpu_health_exporter_imds_events_lookup_success") == 0
    finally:
        fake.released.set()  # the poll's request returns: nothing left blocked
        runner.close()
    off = InstanceCollector(ctx_for(fake.url, **{"instance.scheduled_events": False}))
    off.start()
    try:
        assert off.poller is None
        text = scrape(Runner([off], deadline_s=5, pool=test_pool()))
        assert "gpu_health_exporter_imds_events_lookup_success" not in names(text)
    finally:
        off.close()


def test_simulated_node_scheduled_reboot_end_to_end():
    """`--scenario ec2-scheduled-reboot`: the simulation's own IMDSv2 on 127.0.0.1 (the suite keeps
    IMDS off otherwise) announces a reboot in 20 h and maintenance in 5 days; the exporter serves
    both active events and not the completed one."""
    import requests

    from exporter.tools.simulate.imds import MAINTENANCE_IN_S, REBOOT_IN_S
    from tests.helpers import running_exporter

    t0 = time.time()
    with running_exporter("--simulate", "p5.48xlarge", "--scenario", "ec2-scheduled-reboot",
                          "--collectors", "instance") as url:
        deadline = time.monotonic() + START_HANG_GUARD_S
        text = requests.get(url + "/metrics", timeout=10).text
        # Both lookups run in the background: the events' and the identity's (retried after a
        # timeout on a loaded machine), so wait for the series of each.
        wanted = ("ec2_scheduled_event_start_timestamp_seconds{", 'instance_id="i-0simulated0000000"')
        while not all(w in text for w in wanted) and time.monotonic() < deadline:
            time.sleep(0.3)
            text = requests.get(url + "/metrics", timeout=10).text
    assert promtool_check_metrics(text) == ""
    got = event_series(text)
    start = "ec2_scheduled_event_start_timestamp_seconds"
    reboot = ("system-reboot", "instance-event-0d59937288b749b32")
    maintenance = ("system-maintenance", "instance-event-0a1b2c3d4e5f60718")
    assert {(c, e) for n, c, e in got if n == start} == {reboot, maintenance}
    assert abs(got[(start, *reboot)] - (t0 + REBOOT_IN_S)) < 60
    assert abs(got[(start, *maintenance)] - (t0 + MAINTENANCE_IN_S)) < 60
    assert value(text, "gpu_health_exporter_imds_events_lookup_success") == 1
    assert value(text, "gpu_health_exporter_instance_info", instance_type="p5.48xlarge",
                 instance_id="i-0simulated0000000") == 1
