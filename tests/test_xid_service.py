"""The XID service and collector end to end in-process: replaying kernel logs, restarts within a
boot (also after the ring buffer wrapped), a new boot, a corrupt state file, NVML events plus
the kernel log counted once, a lost GPU in the event set, and the policy from the config."""

import time

import pytest

import exporter.collectors.health  # noqa: F401 - declares the health config section
from exporter.collectors.xid import XidCollector
from exporter.compose import compose
from exporter.config import ConfigError, load
from exporter.nvml.fake import FakeBackend, load_capture
from exporter.nvml.session import NvmlSession
from exporter.profiles import PROFILES
from exporter.runner import Runner
from exporter.tools.simulate.nvml_synth import node_capture
from exporter.xid.nvlink import Decoded
from exporter.xid.service import one_shot
from exporter.xid.store import Ack
from tests.helpers import (
    FIXTURES,
    START_HANG_GUARD_S,
    promtool_check_metrics,
    samples,
    scrape,
    test_pool,
    value,
    wait_for,
)

KMSG = FIXTURES / "kmsg"
P5 = PROFILES["p5.48xlarge"]


def make_ctx(tmp_path, kmsg_text, boot_id="boot-1", nvml=None, fresh=None, read_only=False, **xid):
    proc = tmp_path / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (proc / "sys/kernel/random/boot_id").write_text(boot_id + "\n")
    log = tmp_path / "kmsg"
    if kmsg_text is not None:
        log.write_text(kmsg_text)
    overrides = {"paths.procfs": str(proc), "paths.kmsg": str(log),
                 "paths.state_dir": str(tmp_path / "state"), "xid.nvml_events": False}
    overrides.update({f"xid.{k}": v for k, v in xid.items()})
    if nvml is None:
        nvml = NvmlSession(FakeBackend({"system": {}, "devices": []}), pool=test_pool())
        nvml.backend.fail_init(12, "no NVML in this test")
    return compose(load(None, overrides), nvml=nvml, fresh=fresh, read_only=read_only)


def fake_p5():
    fake = FakeBackend(node_capture(P5, load_capture()))
    session = NvmlSession(fake, pool=test_pool())
    assert session.ensure()
    return fake, session


def counts(svc):
    return {(p, k): c.count for p, ks in svc.store.snapshot().items() for k, c in ks.items()}


def test_real_capture_replay_counts_the_one_xid_31(tmp_path):
    ctx = make_ctx(tmp_path, (KMSG / "kmsg_nvidia.txt").read_text())
    one_shot(ctx)
    c = XidCollector(ctx)  # the service one_shot loaded (ctx.xid)
    text = scrape(Runner([c], deadline_s=5, pool=test_pool()))
    assert promtool_check_metrics(text) == ""
    # NVML does not list 0000:00:06 here: counted with its address, uuid from the NVRM GPU at line
    assert value(text, "gpu_xid_errors_total", xid="31", tier="application", gpu="",
                 pci_bus_id="00000000:00:06.0", uuid="GPU-5d849bfd-1fd8-d42f-aa96-a7c78683d9fe") == 1
    assert value(text, "gpu_health_exporter_kmsg_records_total") == 8
    assert value(text, "gpu_health_exporter_kmsg_up") == 1


def test_every_variant_counts_once_with_its_tier(tmp_path):
    ctx = make_ctx(tmp_path, (KMSG / "variants.txt").read_text())
    svc = one_shot(ctx)
    assert counts(svc) == {
        ("00000000:53:00", "31"): 1, ("00000000:64:00", "43"): 1, ("00000000:64:00", "999"): 1,
        ("00000000:75:00", "63"): 1, ("00000000:03:00", "14"): 1, ("00000000:97:00", "94"): 1,
        ("00000018:01:00", f"149/{Decoded('reset', 'fatal').code}"): 1,
        ("00000000:b9:00", "154/2"): 1, ("00000000:ca:00", "154/1"): 1,
        ("00000000:a8:00", "79"): 1, ("00000000:86:00", "79"): 1, ("00000000:9b:00", "119"): 1,
    }  # the prio-12 "XID 79" written from user space is not counted
    text = scrape(Runner([XidCollector(ctx)], deadline_s=5, pool=test_pool()))
    tiers = {(dict(ls)["pci_bus_id"], dict(ls)["xid"]): dict(ls)["tier"]
             for (n, ls), _ in samples(text).items() if n == "gpu_xid_errors_total"}
    assert tiers[("00000000:B9:00.0", "154")] == "reboot" and tiers[("00000000:CA:00.0", "154")] == "reset"
    # 999 is in no catalog; 14 (a fake error injected from user space) is NVIDIA's IGNORE
    assert tiers[("00000000:64:00.0", "999")] == "unknown" and tiers[("00000000:03:00.0", "14")] == "ignore"
    assert tiers[("00000000:75:00.0", "63")] == "replace" and tiers[("00000000:86:00.0", "79")] == "reboot"
    assert tiers[("00000018:01:00.0", "149")] == "reset"  # NETIR_LINK_DOWN, Fatal: NVIDIA's RESET_GPU


def test_multiline_xid_13_flood_and_bus_loss_reports_are_one_event_each(tmp_path):
    from exporter.tools.simulate.kmsg import bus_loss_lines, xid13_flood

    msgs = xid13_flood(0) + bus_loss_lines(3)
    text = "".join(f"4,{i},{5_000_000 + i},-;{m}\n" for i, m in enumerate(msgs))
    svc = one_shot(make_ctx(tmp_path, text))
    assert counts(svc) == {("00000000:53:00", "13"): 1, ("00000000:86:00", "79"): 1}
    assert svc.store.reports["kmsg"] == len(xid13_flood(0)) + 3  # Xid 79 line, single and multi-line notice


def _xid_record(seq, usec, pci="0000:53:00", xid=31):
    return f"4,{seq},{usec},-;NVRM: Xid (PCI:{pci}): {xid}, pid=1, name=p, text\n"


def test_restart_within_a_boot_keeps_counts_and_does_not_recount_the_ring(tmp_path):
    log = "".join(_xid_record(i, i * 60_000_000) for i in range(3))  # three XID 31, a minute apart
    svc = one_shot(make_ctx(tmp_path, log))
    assert counts(svc) == {("00000000:53:00", "31"): 3}
    assert svc.flush_state(force=True)
    # restart: the ring still holds the same records, plus one new one
    log += _xid_record(3, 240_000_000)
    svc2 = one_shot(make_ctx(tmp_path, log))
    assert counts(svc2) == {("00000000:53:00", "31"): 4}
    svc2.flush_state(force=True)
    # restart after the ring wrapped: the old records are gone, the counts are not
    wrapped = _xid_record(900, 900_000_000, xid=43) + "6,901,900000001,-;unrelated\n"
    svc3 = one_shot(make_ctx(tmp_path, wrapped))
    assert counts(svc3) == {("00000000:53:00", "31"): 4, ("00000000:53:00", "43"): 1}


def test_a_flood_spanning_a_restart_is_still_one_event(tmp_path):
    first = "".join(_xid_record(i, 10_000_000 + i, xid=13) for i in range(100))
    svc = one_shot(make_ctx(tmp_path, first))
    svc.flush_state(force=True)
    rest = first + "".join(_xid_record(100 + i, 10_000_100 + i, xid=13) for i in range(100))
    assert counts(one_shot(make_ctx(tmp_path, rest))) == {("00000000:53:00", "13"): 1}


def test_new_boot_starts_over_from_the_kernel_log(tmp_path):
    svc = one_shot(make_ctx(tmp_path, "".join(_xid_record(i, i * 60_000_000) for i in range(3))))
    svc.flush_state(force=True)
    svc2 = one_shot(make_ctx(tmp_path, _xid_record(0, 5_000_000, xid=79), boot_id="boot-2"))
    assert counts(svc2) == {("00000000:53:00", "79"): 1}
    assert svc2.state.status.problem == "other_boot"
    assert svc2.flush_state(force=True)
    assert svc2.state.read()["boot_id"] == "boot-2"


def test_corrupt_state_file_does_not_crash_and_is_a_metric(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state/xid-state.json").write_text("{not json")
    ctx = make_ctx(tmp_path, _xid_record(0, 1_000_000))
    one_shot(ctx)
    c = XidCollector(ctx)  # the service one_shot loaded (ctx.xid)
    text = scrape(Runner([c], deadline_s=5, pool=test_pool()))
    assert value(text, "gpu_health_exporter_state_file_ok") == 0
    assert value(text, "gpu_health_exporter_state_file_errors_total", operation="read") == 1
    assert value(text, "gpu_xid_errors_total", xid="31") == 1
    assert c.service.flush_state(force=True)  # a good file replaces it
    assert value(scrape(Runner([c], deadline_s=5,
            pool=test_pool())), "gpu_health_exporter_state_file_ok") == 1


def test_non_utf8_state_file_at_start_is_recovered_and_the_recovery_lasts(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state/xid-state.json").write_bytes(b'{"version": 1, "boot_id": "\xff\xfe\x00"}')
    ctx = make_ctx(tmp_path, _xid_record(0, 1_000_000))
    c = XidCollector(ctx)
    c.service.load_state()  # the daemon's start-up: used to raise UnicodeDecodeError
    c.service.read_kmsg()
    assert c.service.flush_state(force=True)
    text = scrape(Runner([c], deadline_s=5, pool=test_pool()))
    assert value(text, "gpu_health_exporter_state_file_ok") == 1
    assert value(text, "gpu_health_exporter_state_file_recoveries_total") == 1
    assert value(text, "gpu_xid_errors_total", xid="31") == 1
    restarted = make_ctx(tmp_path, _xid_record(0, 1_000_000))
    one_shot(restarted)
    text = scrape(Runner([XidCollector(restarted)], deadline_s=5, pool=test_pool()))
    assert value(text, "gpu_health_exporter_state_file_recoveries_total") == 1  # after a restart too


def test_unknown_pci_addresses_never_crowd_out_an_nvml_gpu_also_after_a_restart(tmp_path):
    garbage = "".join(f"4,{i},{1_000_000 + i},-;NVRM: Xid (PCI:0000:{i + 16:02x}:1f): 31, pid=1, name=p, x\n"
                      for i in range(70))
    log = garbage + "4,70,2000000,-;NVRM: Xid (PCI:0000:53:00): 94, pid=1, name=p, Contained ECC error\n"
    for restart in (False, True):
        _, session = fake_p5()
        ctx = make_ctx(tmp_path, log, nvml=session)
        svc = one_shot(ctx)
        text = scrape(Runner([XidCollector(ctx)], deadline_s=5, pool=test_pool()))
        assert value(text, "gpu_xid_errors_total", gpu="0", xid="94", tier="replace") == 1, restart
        assert value(text, "gpu_xid_errors_total", gpu="", uuid="", pci_bus_id="other", xid="31",
                     tier="application") == 70 - 16
        assert value(text, "gpu_health_exporter_xid_events_dropped_total") == 0
        svc.flush_state(force=True)


def test_policy_from_config_moves_xids_between_tiers(tmp_path):
    log = _xid_record(0, 1_000_000, xid=63) + _xid_record(1, 2_000_000, xid=94)
    ctx = make_ctx(tmp_path, log, policy={"reset": [63], "application": [94]})
    one_shot(ctx)
    c = XidCollector(ctx)  # the service one_shot loaded (ctx.xid)
    text = scrape(Runner([c], deadline_s=5, pool=test_pool()))
    assert value(text, "gpu_xid_errors_total", xid="63", tier="reset") == 1
    assert value(text, "gpu_xid_errors_total", xid="94", tier="application") == 1
    for bad in ({"page": [1]}, {"reset": ["63"]}, {"reset": [63], "replace": [63]}, [63]):
        with pytest.raises(ConfigError):
            load(None, {"xid.policy": bad})


def test_nvml_event_and_kernel_line_for_one_xid_count_once_live(tmp_path):
    fake, session = fake_p5()
    ctx = make_ctx(tmp_path, "", nvml=session, nvml_events=True, follow_poll_seconds=0.05)
    c = XidCollector(ctx)
    c.start()
    try:
        deadline = time.monotonic() + START_HANG_GUARD_S
        while not (c.service.watcher and c.service.watcher.status.state == "watching"):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        fake.queue_event(2, 63)  # NVML first ...
        now_us = int(time.monotonic() * 1e6)
        with open(tmp_path / "kmsg", "a") as f:  # ... then the driver's kernel line
            f.write(f"4,0,{now_us},-;NVRM: Xid (PCI:0000:75:00): 63, pid='<unknown>', name=<unknown>, "
                    "Row Remapper: New row (0x00000000001f0a40) marked for remapping, reset gpu to "
                    "activate.\n")
        deadline = time.monotonic() + START_HANG_GUARD_S
        while c.service.store.reports.get("kmsg", 0) < 1 or c.service.store.reports.get("nvml", 0) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        text = scrape(Runner([c], deadline_s=5, pool=test_pool()))
        assert value(text, "gpu_xid_errors_total", gpu="2", xid="63", tier="replace") == 1
        assert value(text, "gpu_nvml_events_total", gpu="2", event_type="xid") == 1
        assert value(text, "gpu_health_exporter_xid_reports_merged_total", source="kmsg") + \
            value(text, "gpu_health_exporter_xid_reports_merged_total", source="nvml") == 1
    finally:
        c.close()


def test_a_lost_gpu_is_dropped_from_the_event_set_and_the_others_still_report(tmp_path):
    fake, session = fake_p5()
    ctx = make_ctx(tmp_path, "", nvml=session, nvml_events=True, kmsg=False)
    c = XidCollector(ctx)
    c.start()
    try:
        w = c.service.watcher
        deadline = time.monotonic() + START_HANG_GUARD_S
        while w.status.state != "watching":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        fake.lose(5)
        while w.status.rebuilds < 1 or w.status.excluded != 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        fake.queue_event(1, 48)
        while c.service.store.reports.get("nvml", 0) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        text = scrape(Runner([c], deadline_s=5, pool=test_pool()))
        assert value(text, "gpu_xid_errors_total", gpu="1", xid="48", tier="reset") == 1
        assert value(text, "gpu_health_exporter_nvml_event_gpus", state="excluded") == 1
        assert value(text, "gpu_health_exporter_nvml_event_gpus", state="registered") == 7
        assert value(text, "gpu_health_exporter_nvml_event_watcher_up") == 1
        assert value(text, "gpu_health_exporter_kmsg_up") == 0  # disabled
        assert 5 in session.lost and w.alive
    finally:
        c.close()


def test_nvml_xid_154_waits_for_the_kernel_line_that_names_the_action(tmp_path):
    fake, session = fake_p5()
    ctx = make_ctx(tmp_path, "", nvml=session, nvml_events=True, follow_poll_seconds=0.05)
    c = XidCollector(ctx)
    c.start()
    try:
        deadline = time.monotonic() + START_HANG_GUARD_S
        while not (c.service.watcher and c.service.watcher.status.state == "watching"):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        fake.queue_event(6, 154)  # NVML: no action code
        wait_for(lambda: c.service.watcher.status.events >= 1, START_HANG_GUARD_S,
                 "the NVML event taken")  # then the line
        with open(tmp_path / "kmsg", "a") as f:
            f.write(f"4,0,{int(time.monotonic() * 1e6)},-;NVRM: Xid (PCI:0000:b9:00): 154, GPU recovery "
                    "action changed from 0x0 (None) to 0x2 (Node Reboot Required)\n")
        while c.service.store.reports.get("nvml", 0) < 1:  # submitted after the 3 s grace
            assert time.monotonic() < deadline
            time.sleep(0.05)
        text = scrape(Runner([c], deadline_s=5, pool=test_pool()))
        assert value(text, "gpu_xid_errors_total", gpu="6", xid="154", tier="reboot") == 1
        assert not [1 for n, ls in samples(text) if n == "gpu_xid_errors_total" and ("tier", "reset") in ls]
    finally:
        c.close()


def test_unreadable_kernel_log_is_a_metric_and_nvml_state_goes_on(tmp_path):
    ctx = make_ctx(tmp_path, None)  # no such file
    c = XidCollector(ctx)
    c.service.load_state()
    assert c.service.read_kmsg() == 0
    assert "cannot read" in c.service.snapshot().kmsg.error
    text = scrape(Runner([c], deadline_s=5, pool=test_pool()))
    assert value(text, "gpu_health_exporter_kmsg_up") == 0
    assert value(text, "gpu_health_exporter_collector_success", collector="xid") == 1


def test_a_snapshot_is_the_state_as_of_one_moment_and_an_ack_shows_in_the_next(tmp_path):
    ctx = make_ctx(tmp_path, _xid_record(0, 1_000_000, xid=94))
    svc = one_shot(ctx)
    first = svc.snapshot()
    assert [(x.xid, x.count, x.acknowledged) for x in first.xids["00000000:53:00"]] == [(94, 1, False)]
    assert first.counts == {"00000000:53:00": {"94": 1}} and first.acks == ()
    assert first.state.problem == "missing"  # no state file yet
    assert first.kmsg.ok and first.kmsg.stats.records == 1 and first.kmsg.last_seq == 0
    with open(tmp_path / "kmsg", "a") as f:
        f.write(_xid_record(1, 60_000_000, xid=94))  # a second event, a minute later
    svc.read_kmsg()
    ack = one_shot(make_ctx(tmp_path, None))  # `ack`, another process
    assert ack.write_ack(Ack("00000000:53:00", 0, "", None, time.time(), {"94": 2})) == ""
    svc.refresh_acks()
    now = svc.snapshot()
    assert [(x.count, x.acknowledged) for x in now.xids["00000000:53:00"]] == [(2, True)]
    assert len(now.acks) == 1 and now.kmsg.last_seq == 1
    assert [(x.count, x.acknowledged) for x in first.xids["00000000:53:00"]] == [(1, False)]  # unchanged
    assert first.kmsg.stats.records == 1 and first.acks == ()


def test_on_change_tells_of_an_xid_an_ack_and_a_lost_gpu_as_they_happen(tmp_path):
    """What the Kubernetes writer listens to (scraped or not): the follower's read that counted an
    XID, the follower taking an ack another process wrote, the NVML watcher finding a GPU lost. An
    idle follower tells nothing."""
    import threading

    fake, session = fake_p5()
    ctx = make_ctx(tmp_path, "", nvml=session, nvml_events=True, follow_poll_seconds=0.05)
    c = XidCollector(ctx)
    told = threading.Semaphore(0)
    c.service.on_change(told.release)
    c.start()
    try:
        w = c.service.watcher
        wait_for(lambda: w and w.status.state == "watching", START_HANG_GUARD_S, "the NVML watcher")
        while told.acquire(timeout=0.5):  # the start-up backlog read, if it told: drained
            pass
        with open(tmp_path / "kmsg", "a") as f:
            f.write(_xid_record(0, int(time.monotonic() * 1e6), xid=94))
        assert told.acquire(timeout=10), "no notification for a counted XID"
        ack = one_shot(make_ctx(tmp_path, None))  # `ack`, another process, on the same state
        assert ack.write_ack(Ack("00000000:53:00", 0, "", None, time.time(), {"94": 1})) == ""
        assert told.acquire(timeout=10), "no notification for the ack"
        wait_for(lambda: c.service.snapshot().acks, START_HANG_GUARD_S, "the ack taken")
        fake.lose(5)
        assert told.acquire(timeout=10), "no notification for the lost GPU"
    finally:
        c.close()


def test_an_ack_is_told_while_the_kernel_log_cannot_be_read(tmp_path):
    """An unprivileged pod cannot open /dev/kmsg (the follower retries it every KMSG_RETRY_S): an
    ack is still taken, and told, at the follower's cadence."""
    import threading

    from exporter.xid.service import KMSG_RETRY_S

    ctx = make_ctx(tmp_path, None, follow_poll_seconds=0.05)  # no kernel log file at all
    c = XidCollector(ctx)
    told = threading.Semaphore(0)
    c.service.on_change(told.release)
    c.start()
    try:
        wait_for(lambda: c.service.follower.status.error, START_HANG_GUARD_S, "the kernel log failing")
        ack = one_shot(make_ctx(tmp_path, None))
        assert ack.write_ack(Ack("00000000:53:00", 0, "", None, time.time(), {})) == ""
        assert told.acquire(timeout=KMSG_RETRY_S / 2), "the ack waited for the kernel log's retry"
    finally:
        c.close()
