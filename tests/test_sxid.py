"""NVSwitch SXids: every record form in tests/fixtures/sxid (public sources, see SOURCES.md), the
policy, and counting through the XID service: once per report, continuations never, across a
restart within a boot, again after a new boot, from a corrupt state file."""

import json
import tempfile
import time
from pathlib import Path

import pytest

from exporter.collectors.nvswitch import NvswitchCollector
from exporter.config import ConfigError, load
from exporter.runner import Runner
from exporter.xid.service import one_shot
from exporter.xid.sxid import SxidContinuation, SxidReport, parse_sxid
from exporter.xid.sxid_catalog import SxidPolicy, describe
from exporter.xid.sxid_state import STATE_NAME, by_report
from tests.helpers import (
    FIXTURES,
    START_HANG_GUARD_S,
    promtool_check_metrics,
    samples,
    scrape,
    test_pool,
    value,
)
from tests.test_xid_service import make_ctx

RECORDS = (FIXTURES / "sxid" / "records.txt").read_text().splitlines()

C = SxidContinuation
# one expected parse per fixture line, in order
EXPECTED = [
    SxidReport(3, "00000000:c1:00", 28006, "non_fatal", 46, "MC TS crumbstore MCTO"),
    C(3, "00000000:c1:00", 28006),
    C(3, "00000000:c1:00", 28006),
    SxidReport(1, "00000000:06:00", 20034, "fatal", 48, "LTSSM Fault Up"),
    C(2, "00000000:07:00", 20034),
    C(0, "00000000:05:00", 20034),
    SxidReport(3, "00000000:05:00", 12028, "non_fatal", 32, "egress non-posted PRIV error"),
    SxidReport(0, "00000000:00:00", 20034, "fatal", 30, "LTSSM Fault Up"),
    C(0, "00000000:a9:00", 20034),
    SxidReport(0, "00000000:06:00", 20009, "non_fatal", 4, "RX Short Error Rate"),
    SxidReport(0, "00000000:c3:00", 24007, "fatal", 28, "sourcetrack timeout error"),
    SxidReport(0, "00000004:00:00", 26008, "unknown", None, "SOE Watchdog error", "device"),
    SxidReport(0, "00000004:00:00", 26006, "unknown", None, "SOE HALTED", "device"),
    SxidReport(0, "00000004:00:00", 26007, "unknown", None, "SOE EXTERR", "device"),
    C(0, "00000004:00:00", 26006),
    SxidReport(1, "00000000:06:00", 20009, "non_fatal", None, "Li", "device"),  # truncated line
    C(0, "00000000:c3:00", 12033),
    SxidReport(1, "00000000:06:00", 20009, "non_fatal", None, "Link", "device"),
    SxidReport(0, "00000000:05:00", 10003, "fatal", None,
               "unhandled interrupt in nvswitch_service_minion_link_ls10(1234)", "device"),
    SxidReport(2, "00000000:07:00", 10004, "unknown", None,
               "NVSWITCH Temperature 95C | TSENSE WARN Threshold 90C", "device"),
    SxidReport(1, "00000000:06:00", 10007, "unknown", None, "IO failure", "device"),
    SxidReport(3, "00000000:08:00", 27005, "unknown", None, "Module 3 access error", "device"),
    SxidReport(0, "00000000:05:00", 26003, "fatal", None,
               "Failed to post command to SOE. Data {0x00000001, 0x00000002}", "device"),
    C(2, "00000000:07:00", 10002),  # Severity 5: undocumented, still a continuation
    SxidReport(1, "00000000:06:00", 12033, "non_fatal", None, "egress credit timeout", "pri"),
]


def kmsg(lines, prio=3, start_seq=0):
    return "".join(f"{prio},{start_seq + i},{1_000_000 * (i + 1)},-;{m}\n" for i, m in enumerate(lines))


def test_every_fixture_record_form():
    assert len(RECORDS) == len(EXPECTED)
    for line, want in zip(RECORDS, EXPECTED, strict=True):
        assert parse_sxid(line) == want, line
        assert parse_sxid("[6781753.400584] " + line) == want  # with dmesg's timestamp prefix


def test_not_sxid_lines():
    for line in ("NVRM: Xid (PCI:0000:53:00): 79, pid=1, GPU has fallen off the bus.",
                 "nvidia-nvswitch0: SXid (PCI:0000:00:00.0): xyz, Fatal error",
                 "nvidia-nvswitch0: SXid (invalid): some error",
                 "nvidia-nvswitch: Probing device 0000:05:00.0",
                 "Regular log content without SXid errors"):
        assert parse_sxid(line) is None, line


def test_policy_follows_severity_and_config():
    p = SxidPolicy()
    assert p.tier(20034, "fatal") == "reboot"
    assert p.tier(20001, "non_fatal") == "ignore" and p.tier(11012, "correctable") == "ignore"
    assert p.tier(26006, "unknown") == "unknown"
    assert p.tier(12028, "non_fatal") == "reboot"  # the guide: traffic stalls, restart the VM
    p = SxidPolicy({"replace": [20034], "ignore": [12028]}, fatal_tier="replace")
    assert p.tier(20034, "non_fatal") == "replace" and p.tier(12028, "non_fatal") == "ignore"
    assert p.tier(24007, "fatal") == "replace"
    assert describe(20034).startswith("LTSSM") and describe(28006).startswith("CCI") and describe(12099)
    assert describe(99999) == ""


def test_policy_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="nvswitch.*policy.*tiers among replace, reboot, ignore"):
        load(None, {"nvswitch.policy": {"reset": [20034]}})
    with pytest.raises(ConfigError, match="nvswitch.*fatal_tier"):
        load(None, {"nvswitch.fatal_tier": "ignore"})
    with pytest.raises(ConfigError, match="SXid 20034 is under"):
        load(None, {"nvswitch.policy": {"reboot": [20034], "ignore": [20034]}})


def sxid_counts(svc):
    return {k: c.count for k, c in by_report(svc.sxids).items()}


def test_fixture_counts_each_report_once_and_never_a_continuation(tmp_path):
    ctx = make_ctx(tmp_path, kmsg(RECORDS))
    svc = one_shot(ctx)
    c = sxid_counts(svc)
    assert sum(c.values()) == sum(isinstance(e, SxidReport) for e in EXPECTED) == 17
    assert c[("00000000:06:00", 20009, "non_fatal")] == 3
    assert c[("00000000:06:00", 20034, "fatal")] == 1
    assert ("00000000:07:00", 20034, "fatal") not in c  # only a Severity line from that switch
    text = scrape(Runner([NvswitchCollector(ctx)], deadline_s=5, pool=test_pool()))
    assert promtool_check_metrics(text) == ""
    assert value(text, "gpu_nvswitch_sxid_errors_total", switch="1", pci_bus_id="00000000:06:00.0",
                 sxid="20034", sxid_severity="fatal", tier="reboot") == 1
    # the fixture's lines come from several machines: 0000:05:00.0 was nvswitch3 on one and
    # nvswitch0 on another; the switch label is the index last seen at the address
    assert value(text, "gpu_nvswitch_sxid_errors_total", switch="0", pci_bus_id="00000000:05:00.0",
                 sxid="12028", sxid_severity="non_fatal", tier="reboot") == 1
    tiers = {dict(ls)["tier"] for (n, ls), _ in samples(text).items()
             if n == "gpu_nvswitch_sxid_errors_total"}
    assert tiers == {"reboot", "ignore", "unknown"}


def test_user_space_sxid_lines_are_not_counted(tmp_path):
    ctx = make_ctx(tmp_path, kmsg(RECORDS[3:4], prio=12))  # written with `logger`, facility 1
    assert sxid_counts(one_shot(ctx)) == {}


def daemon_pass(ctx):
    svc = one_shot(ctx)
    svc.flush_state(force=True)
    return svc


def test_counted_once_across_restarts_and_again_after_a_new_boot(tmp_path):
    first = RECORDS[:7]
    ctx = make_ctx(tmp_path, kmsg(first))
    assert sum(sxid_counts(daemon_pass(ctx)).values()) == 3
    # restart in the same boot: the ring buffer still has the first records plus new ones
    later = kmsg(RECORDS[:7]) + kmsg(RECORDS[9:10], start_seq=7)
    ctx = make_ctx(tmp_path, later)
    svc = daemon_pass(ctx)
    assert sum(sxid_counts(svc).values()) == 4
    assert sxid_counts(svc)[("00000000:06:00", 20034, "fatal")] == 1
    # the ring buffer wrapped: the early records are gone, the state file still has their counts
    ctx = make_ctx(tmp_path, kmsg(RECORDS[9:10], start_seq=7))
    assert sum(sxid_counts(daemon_pass(ctx)).values()) == 4
    # a new boot: the old counts are not this boot's
    ctx = make_ctx(tmp_path, kmsg(RECORDS[3:4]), boot_id="boot-2")
    assert sxid_counts(daemon_pass(ctx)) == {("00000000:06:00", 20034, "fatal"): 1}


@pytest.mark.parametrize("content", [
    "{not json", json.dumps({"version": 1, "counts": [["x", 5, "fatal", 1, 0]]}),
    json.dumps({"version": 1, "counts": [], "last_seq": -4}), b'{"version": 1, "boot_id": "\xff"}'])
def test_a_corrupt_old_state_file_counts_from_the_kernel_log(tmp_path, content, caplog):
    state = tmp_path / "state"
    state.mkdir()
    (state / STATE_NAME).write_bytes(content if isinstance(content, bytes) else content.encode())
    ctx = make_ctx(tmp_path, kmsg(RECORDS[3:4]))
    svc = one_shot(ctx)
    assert sxid_counts(svc) == {("00000000:06:00", 20034, "fatal"): 1}
    assert svc.persistence.old["sxid"].status.problem == "corrupt"
    assert str(state / STATE_NAME) in caplog.text


def test_garbage_codes_do_not_become_series(tmp_path):
    lines = [f"nvidia-nvswitch0: SXid (PCI:0000:05:00.0): {c:05d}, Fatal, Link 01 x"
             for c in range(40000, 40400)]
    lines.append("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 00042, Fatal, Link 01 x")
    svc = one_shot(make_ctx(tmp_path, kmsg(lines)))
    assert len(sxid_counts(svc)) == 256 and svc.sxids.dropped == 145


def test_the_state_file_write_never_follows_a_planted_symlink(tmp_path):
    import os

    state = tmp_path / "state"
    state.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    name = "xid-state.json"  # the SXid counts' section is in it
    (state / f".{name}.{os.getpid()}.tmp").symlink_to(victim)
    (state / f".{name}.1.tmp").write_text("{half")  # a writer killed mid-write
    svc = one_shot(make_ctx(tmp_path, kmsg(RECORDS[3:4])))
    assert svc.flush_state(force=True) and json.loads((state / name).read_text())["sxid"]["counts"]
    assert victim.read_text() == "precious" and not list(state.glob(".*.tmp"))


def records_written(instance_type: str, *scenarios: str) -> int:
    """How many kernel-log records a simulated node holds once its scenarios' lines are written."""
    from exporter.profiles import PROFILES
    from exporter.tools.simulate.kmsg import ONSET_S, KmsgSimSource

    with tempfile.TemporaryDirectory() as d:
        src = KmsgSimSource(Path(d), PROFILES[instance_type], set(scenarios))
        src.build()
        src.advance(ONSET_S)
        return src.seq


def test_simulated_p5_sxid_scenarios_end_to_end():
    """The simulated p5 with both NVSwitch scenarios: the burst counts 24 (its Severity and Data
    lines never), the fatal SXid once, and the node verdict turns reboot_required with sxid_reboot."""
    import requests

    from tests.helpers import running_exporter

    scenarios = ("sxid-nonfatal-burst", "sxid-fatal")
    records = records_written("p5.48xlarge", *scenarios)
    args = ("--simulate", "p5.48xlarge", *(a for s in scenarios for a in ("--scenario", s)))
    with running_exporter(*args) as url:
        # Wait until the last record is processed (the fatal SXid's lines are written before the
        # burst's, so its series alone may show while the burst is still being read); the scrape
        # after that one sees everything it counted.
        last = "gpu_health_exporter_kmsg_last_sequence"
        deadline = time.monotonic() + START_HANG_GUARD_S
        while max((v for (n, _), v in samples(requests.get(url + "/metrics", timeout=10).text).items()
                   if n == last), default=-1) < records - 1:
            assert time.monotonic() < deadline, f"the follower did not read the {records} records"
            time.sleep(0.3)
        text = requests.get(url + "/metrics", timeout=10).text
    assert value(text, last) == records - 1  # sequence numbers from 0: none missed, none more
    assert promtool_check_metrics(text) == ""
    sxids = "gpu_nvswitch_sxid_errors_total"
    assert value(text, sxids, switch="2", pci_bus_id="00000000:09:00.0", sxid="20001",
                 sxid_severity="non_fatal",
                 tier="ignore") == 24
    assert value(text, sxids, switch="1", pci_bus_id="00000000:08:00.0", sxid="20034", sxid_severity="fatal",
                 tier="reboot") == 1
    assert value(text, "gpu_node_health_verdict", verdict="reboot_required") == 1
    assert value(text, "gpu_node_health_reason", reason="sxid_reboot") == 1
    # the propagated NVLink XID: register 2 bit 16, which NVIDIA's WORKFLOW_NVLINK_ERR asks to report
    # if it repeats: counted, no action of its own; the SXid carries the node's reboot
    assert value(text, "gpu_xid_errors_total", xid="74", tier="nonfatal") == 1
    assert value(text, "gpu_fabric_state", gpu="0", state="completed") == 1
