"""Who owns the XID state and the trail an ack and a counted event leave: one kernel-log reader feeds
the XID and SXid counters, `xid.enabled` and `nvswitch.enabled` mean what they say, the verdict gets
the state file whatever else runs, the state file is written from a snapshot, and every counted
event and ack is logged once and the ack exported as `gpu_xid_acknowledged_timestamp_seconds`."""

from __future__ import annotations

import logging
import time

from exporter.cli import main
from exporter.collectors.health import HealthCollector
from exporter.collectors.nvswitch import NvswitchCollector
from exporter.collectors.xid import XidCollector
from exporter.runner import Runner
from exporter.xid.service import one_shot
from exporter.xid.sxid_state import by_report
from tests.helpers import samples, scrape, test_pool, value, wait_for
from tests.test_xid_service import counts, fake_p5, make_ctx

XID63 = "NVRM: Xid (PCI:0000:75:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row marked"
SXID = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up (First)"


def records(*msgs: str, start: int = 0) -> str:
    return "".join(f"3,{start + i},{1_000_000 * (start + i + 1)},-;{m}\n" for i, m in enumerate(msgs))


def sxid_counts(svc):
    return {k: c.count for k, c in by_report(svc.sxids).items()}



def test_one_reader_feeds_both_counters(tmp_path):
    svc = one_shot(make_ctx(tmp_path, records(XID63, SXID)))
    assert len(svc.follower.consumers) == 2 and svc.snapshot().kmsg.stats.records == 2
    assert counts(svc) == {("00000000:75:00", "63"): 1}
    assert sxid_counts(svc) == {("00000000:06:00", 20034, "fatal"): 1}


def test_xid_disabled_counts_no_xid_even_when_the_nvswitch_collector_follows_the_log(tmp_path):
    ctx = make_ctx(tmp_path, records(XID63, SXID), enabled=False, follow_poll_seconds=0.05)
    c = NvswitchCollector(ctx)
    c.start()  # the one follower, for SXids only
    try:
        wait_for(lambda: sxid_counts(ctx.xid) == {("00000000:06:00", 20034, "fatal"): 1})
        assert ctx.xid.counter is None and counts(ctx.xid) == {}
        assert ctx.xid.watcher is None  # no NVML XID events either
    finally:
        ctx.xid.stop()


def test_nvswitch_disabled_counts_no_sxid_and_the_verdict_ignores_them(tmp_path):
    from exporter.compose import compose
    from exporter.config import load

    base = make_ctx(tmp_path, records(XID63, SXID))
    ctx = compose(load(None, {**_overrides(tmp_path), "nvswitch.enabled": False}), nvml=base.nvml)
    svc = one_shot(ctx)
    assert sxid_counts(svc) == {} and counts(svc) == {("00000000:75:00", "63"): 1}
    s = samples(scrape(Runner([HealthCollector(ctx)], deadline_s=5, pool=test_pool())))
    assert value(s, "gpu_node_health_reason", reason="xid_replace") == 1
    assert not [1 for n, ls in s if n == "gpu_node_health_reason" and dict(ls)["reason"].startswith("sxid")]


def _overrides(tmp_path):
    return {"paths.procfs": str(tmp_path / "proc"), "paths.kmsg": str(tmp_path / "kmsg"),
            "paths.state_dir": str(tmp_path / "state"), "xid.nvml_events": False}


def test_the_verdict_loads_the_state_file_with_the_xid_and_nvswitch_collectors_off(tmp_path):
    svc = one_shot(make_ctx(tmp_path, records(XID63, SXID)))
    assert svc.flush_state(force=True)
    (tmp_path / "kmsg").write_text("")  # the ring wrapped: only the state file has them
    ctx = make_ctx(tmp_path, None)
    runner = Runner([HealthCollector(ctx)], deadline_s=5, pool=test_pool())  # no xid or nvswitch collector
    runner.start()
    try:
        s = samples(scrape(runner))
    finally:
        runner.close()
    assert value(s, "gpu_health_reason", pci_bus_id="00000000:75:00.0", reason="xid_replace") == 1
    assert value(s, "gpu_node_health_reason", reason="sxid_reboot") == 1


def test_the_state_file_is_written_from_a_snapshot_and_leaves_the_store_alone(tmp_path):
    ctx = make_ctx(tmp_path, records(XID63))
    svc = one_shot(ctx)
    assert main(["ack", "--path.kmsg", str(tmp_path / "kmsg"), "--path.procfs", str(tmp_path / "proc"),
                 "--path.state-dir", str(tmp_path / "state"), "--gpu", "0000:75:00"]) == 0
    version, acks = svc.store.version, list(svc.store.acks)
    svc.store.report("kmsg", "00000000:53:00", 31, 500.0, 0.0)
    version += 1
    assert svc.flush_state(force=True)  # keeps the ack on disk ...
    assert svc.store.version == version and svc.store.acks == acks == []  # ... without taking it here
    assert [a.pci for a in svc.refresh_acks()] == ["00000000:75:00"]  # the intake takes it, once
    assert svc.refresh_acks() == []


def test_an_ack_is_exported_from_the_next_scrape_and_logged_once(tmp_path, caplog):
    _, session = fake_p5()
    ctx = make_ctx(tmp_path, records(XID63), nvml=session)
    one_shot(ctx)
    runner = Runner([XidCollector(ctx)], deadline_s=5, pool=test_pool())
    s = samples(scrape(runner))
    assert not [1 for n, _ in s if n == "gpu_xid_acknowledged_timestamp_seconds"]
    paths = ["--path.kmsg", str(tmp_path / "kmsg"), "--path.procfs", str(tmp_path / "proc"),
             "--path.state-dir", str(tmp_path / "state")]
    t0 = time.time()
    assert main(["ack", *paths, "--gpu", "0000:75:00", "--xid", "63"]) == 0
    assert main(["ack", *paths, "--gpu", "0000:75:00"]) == 0
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="exporter.xid"):
        s = samples(scrape(runner))
        scrape(runner)
    ts = {dict(ls)["xid"]: v for (n, ls), v in s.items() if n == "gpu_xid_acknowledged_timestamp_seconds"}
    assert set(ts) == {"63", "all"} and all(t0 - 1 <= t <= time.time() + 1 for t in ts.values())
    assert value(s, "gpu_xid_acknowledged_timestamp_seconds", gpu="2", pci_bus_id="00000000:75:00.0",
                 xid="63") == ts["63"]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("acknowledged")]
    assert len(lines) == 2, lines
    assert "acknowledged XID 63 on GPU 2 (PCI 00000000:75:00.0): tier replace" in lines[0]
    assert "acknowledged all XIDs on GPU 2 (PCI 00000000:75:00.0): tier replace" in lines[1]
    runner.close()


def test_every_counted_xid_and_sxid_event_is_logged_once_by_the_daemon(tmp_path, caplog):
    _, session = fake_p5()
    flood = [XID63] * 5  # one event
    ctx = make_ctx(tmp_path, records(*flood, SXID, SXID.replace("(First)", "")), nvml=session,
                   follow_poll_seconds=0.05)
    with caplog.at_level(logging.WARNING):
        ctx.xid.start()
        try:
            wait_for(lambda: sum(sxid_counts(ctx.xid).values()) == 2 and counts(ctx.xid))
        finally:
            ctx.xid.stop()
    xid_lines = [r for r in caplog.records if r.name == "exporter.xid" and "counted" in r.getMessage()]
    sxid_lines = [r for r in caplog.records if r.name == "exporter.sxid"]
    assert len(xid_lines) == 1 and len(sxid_lines) == 2
    assert xid_lines[0].levelno == logging.WARNING
    assert xid_lines[0].getMessage().startswith(
        "XID 63 counted on GPU 2 (PCI 00000000:75:00.0): tier replace")
    assert sxid_lines[0].getMessage().startswith(
        "SXid 20034 counted on NVSwitch 1 (PCI 00000000:06:00.0): severity fatal, tier reboot")
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # a restart: nothing is counted, nor logged, again
        ctx2 = make_ctx(tmp_path, None, nvml=session)
        ctx2.xid.start()
        try:
            wait_for(lambda: ctx2.xid.follower.status.backlog_done)
        finally:
            ctx2.xid.stop()
    assert not [r for r in caplog.records if "counted" in r.getMessage()]
    assert counts(ctx2.xid) == {("00000000:75:00", "63"): 1}
