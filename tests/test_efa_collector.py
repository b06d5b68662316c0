"""The EFA collector on generated sysfs trees: layouts, kernels, discovery, failures."""

from __future__ import annotations

import errno
import shutil

import pytest

from exporter.efa import reader as efa_reader
from exporter.efa.node_totals import NODE_TOTALS
from exporter.runner import Runner
from exporter.tools.simulate.efa import NETWORK, RDMA_WRITE, kernel_files
from tests.efa_trees import FaultyReader, collect, collector, efa, mellanox, run
from tests.helpers import (
    DEADLINE_MARGIN_S,
    HANG_GUARD_S,
    START_HANG_GUARD_S,
    names,
    promtool_check_metrics,
    samples,
    value,
)

PORT_METRICS = {
    "tx_bytes": "efa_tx_bytes_total", "tx_pkts": "efa_tx_packets_total", "rx_bytes": "efa_rx_bytes_total",
    "rx_pkts": "efa_rx_packets_total", "rx_drops": "efa_rx_drops_total", "send_bytes": "efa_send_bytes_total",
    "send_wrs": "efa_send_work_requests_total", "recv_bytes": "efa_recv_bytes_total",
    "recv_wrs": "efa_recv_work_requests_total", "rdma_read_wrs": "efa_rdma_read_work_requests_total",
    "rdma_read_bytes": "efa_rdma_read_bytes_total", "rdma_read_wr_err": "efa_rdma_read_errors_total",
    "rdma_read_resp_bytes": "efa_rdma_read_response_bytes_total",
    "rdma_write_wrs": "efa_rdma_write_work_requests_total", "rdma_write_bytes": "efa_rdma_write_bytes_total",
    "rdma_write_wr_err": "efa_rdma_write_errors_total",
    "rdma_write_recv_bytes": "efa_rdma_write_recv_bytes_total",
    "retrans_bytes": "efa_retrans_bytes_total", "retrans_pkts": "efa_retrans_packets_total",
    "retrans_timeout_events": "efa_retrans_timeout_events_total",
    "unresponsive_remote_events": "efa_unresponsive_remote_events_total",
    "impaired_remote_conn_events": "efa_impaired_remote_conn_events_total",
}
DEVICE_METRICS = {
    "submitted_cmds": "efa_admin_commands_submitted_total",
    "completed_cmds": "efa_admin_commands_completed_total",
    "cmds_err": "efa_admin_command_errors_total",
    "no_completion_cmds": "efa_admin_commands_no_completion_total",
    "keep_alive_rcvd": "efa_keep_alive_received_total",
}
VERBS = ["alloc_pd", "create_qp", "create_cq", "reg_mr", "alloc_ucontext", "create_ah", "mmap"]


def distinct_values(kernel):
    """Every counter file gets its own value, so a wrong mapping shows."""
    port, device, _ = kernel_files(kernel)
    return {f: 1000 + i for i, f in enumerate(port + device)}


def test_split_layout_exports_every_counter_once_with_its_own_value(tmp_path):
    vals = distinct_values((6, 17))
    efa(tmp_path, "rdmap79s0", 79, kernel=(6, 17), values=vals)
    text = run(collector(tmp_path))
    ss = samples(text)
    for f, metric in PORT_METRICS.items():
        assert value(ss, metric, device="rdmap79s0", port="1") == vals[f], f
    for f, metric in DEVICE_METRICS.items():
        assert value(ss, metric, device="rdmap79s0") == vals[f], f
        assert not any(n == metric and ("port", "1") in ls for n, ls in ss), f"{metric} carries a port label"
    for op in VERBS:
        assert value(ss, "efa_verbs_errors_total", device="rdmap79s0", op=op) == vals[op + "_err"]
    assert value(ss, "efa_stats_lifespan_seconds", device="rdmap79s0", port="1") == pytest.approx(0.012)
    assert value(ss, "efa_port_rate_bytes_per_second", device="rdmap79s0", port="1") == 100e9 / 8
    assert value(ss, "efa_device_up", device="rdmap79s0") == 1
    assert value(ss, "efa_info", device="rdmap79s0", pci_address="0000:4f:00.0", pci_device_id="0xefa2") == 1
    assert value(ss, "gpu_health_exporter_collector_success", collector="efa") == 1
    counters = [k for k in ss if k[0].startswith("efa_") and k[0].endswith("_total")
                and not k[0].startswith("efa_node_")]
    assert len(counters) == 22 + 5 + 7  # every file once: 22 port, 5 admin/keep-alive, 7 verbs errors
    assert promtool_check_metrics(text) == ""


def test_combined_layout_before_5_15_is_not_double_counted(tmp_path):
    vals = distinct_values((5, 10))
    efa(tmp_path, "efa_0", 0x10, kernel=(5, 10), values=vals)
    c = collector(tmp_path)
    text = run(c)
    ss = samples(text)
    port, device, combined = kernel_files((5, 10))
    assert combined
    counters = [k for k in ss if k[0].startswith("efa_") and k[0].endswith("_total")
                and not k[0].startswith("efa_node_")]
    assert len(counters) == len(port) + len(device)  # one sample per counter, not two
    assert value(ss, "efa_tx_bytes_total", device="efa_0", port="1") == vals["tx_bytes"]
    assert value(ss, "efa_admin_commands_submitted_total", device="efa_0") == vals["submitted_cmds"]
    assert value(ss, "efa_verbs_errors_total", device="efa_0", op="mmap") == vals["mmap_err"]
    # 5.10 has no RDMA write or network counters: absent, not zero
    for f in RDMA_WRITE + NETWORK:
        assert PORT_METRICS[f] not in names(text)
    assert promtool_check_metrics(text) == ""


def test_each_counter_file_read_once_per_scrape(tmp_path):
    for kernel in ((5, 10), (6, 17)):
        root = tmp_path / f"k{kernel[0]}{kernel[1]}"
        efa(root, "rdmap16s0", 16, kernel=kernel)
        reader = FaultyReader()
        c = collector(root, reader=reader)
        collect(c)
        reader.reads.clear()
        collect(c)
        counter_reads = {p: n for p, n in reader.reads.items() if "/hw_counters/" in p}
        assert set(counter_reads.values()) == {1}
        files = {p.rsplit("/", 1)[1] for p in counter_reads}
        port, device, _ = kernel_files(kernel)
        assert files == set(port) | set(device) | {"lifespan"}
        assert len(counter_reads) == len(files)  # no file name read from two directories


@pytest.mark.parametrize(("setting", "want"), [
    ("default", None),
    (["tx_bytes", "rdma_read_bytes", "keep_alive_rcvd", "rate"],
     {"tx_bytes", "rdma_read_bytes", "keep_alive_rcvd"}),
])
def test_a_counter_set_reads_and_exports_only_its_files(tmp_path, setting, want):
    from exporter.efa.naming import DEFAULT_COUNTERS, lookup

    want = DEFAULT_COUNTERS if want is None else want
    efa(tmp_path, "rdmap16s0", 16, kernel=(6, 17))
    reader = FaultyReader()
    c = collector(tmp_path, reader=reader, **{"efa.counters": setting})
    collect(c)
    reader.reads.clear()
    text = run(c)
    read = {p.rsplit("/", 1)[1] for p in reader.reads if "/hw_counters/" in p}
    assert read == set(want)
    exported = {n for n in names(text) if n.startswith("efa_") and n.endswith("_total")}
    per_device = {lookup(f, "port").spec.name for f in want}
    # the node's totals of the summed families it read, and only those
    assert exported == per_device | {NODE_TOTALS[n].name for n in per_device if n in NODE_TOTALS}
    assert ("efa_port_rate_bytes_per_second" in names(text)) == (setting != "default")
    assert "efa_info" not in names(text) and value(text, "efa_device_up", device="rdmap16s0") == 1


def test_an_unknown_counter_name_in_the_list_is_a_config_error(tmp_path):
    from exporter.config import ConfigError

    with pytest.raises(ConfigError, match="efa.counters.*tx_byte"):
        collector(tmp_path, **{"efa.counters": ["tx_byte"]})


def test_kernel_without_network_or_write_counters_has_no_such_series(tmp_path):
    efa(tmp_path, "rdmap16s27", 16, kernel=(6, 1))
    text = run(collector(tmp_path))
    got = names(text)
    assert "efa_tx_bytes_total" in got and "efa_rdma_read_bytes_total" in got
    for f in NETWORK + RDMA_WRITE:
        assert PORT_METRICS[f] not in got, f


def test_kernel_6_6_has_write_but_not_network_counters(tmp_path):
    efa(tmp_path, "rdmap16s27", 16, kernel=(6, 6))
    got = names(run(collector(tmp_path)))
    assert "efa_rdma_write_bytes_total" in got
    assert not any(PORT_METRICS[f] in got for f in NETWORK)


def test_non_efa_rdma_devices_are_ignored_and_names_do_not_matter(tmp_path):
    efa(tmp_path, "rdmap79s0", 79)
    mellanox(tmp_path, "mlx5_0", 0x30)
    mellanox(tmp_path, "efa_9", 0x31)  # a Mellanox device with an EFA-looking name
    efa(tmp_path, "mlx5_7", 0x40)  # an EFA device with a Mellanox-looking name
    # a future EFA device id, recognised by its driver link
    efa(tmp_path, "rdmap80s0", 0x50, device_id="0xefa4")
    # Amazon vendor id, unknown device, not bound to efa: not EFA
    efa(tmp_path, "rdmap81s0", 0x51, device_id="0x0ec2", driver="ena")
    text = run(collector(tmp_path))
    ss = samples(text)
    assert value(ss, "efa_devices") == 3
    ups = {dict(ls)["device"] for n, ls in ss if n == "efa_device_up"}
    assert ups == {"rdmap79s0", "mlx5_7", "rdmap80s0"}
    assert not any(dict(ls).get("device") in ("mlx5_0", "efa_9", "rdmap81s0") for _, ls in ss)
    assert value(ss, "efa_info", device="rdmap80s0", pci_device_id="0xefa4") == 1


def test_unreadable_counter_fails_only_that_device(tmp_path):
    for i in range(3):
        efa(tmp_path, f"rdmap{i}s0", i, values={"tx_bytes": 7})
    reader = FaultyReader()
    reader.fail("/rdmap1s0/ports/1/hw_counters/rx_drops", errno.EIO)  # admin command failed
    c = collector(tmp_path, reader=reader)
    ss = samples(run(c))
    assert value(ss, "gpu_health_exporter_collector_success", collector="efa") == 1
    assert value(ss, "efa_device_up", device="rdmap1s0") == 0
    assert value(ss, "efa_device_up", device="rdmap0s0") == 1
    assert value(ss, "efa_device_up", device="rdmap2s0") == 1
    assert value(ss, "efa_tx_bytes_total", device="rdmap2s0", port="1") == 7
    assert not any(dict(ls).get("device") == "rdmap1s0" and n.endswith("_total") for n, ls in ss)
    assert value(ss, "efa_info", device="rdmap1s0") == 1  # still listed, still counted
    assert value(ss, "efa_devices") == 3
    # the driver recovers: the next scrape reads it again
    reader.faults.clear()
    ss = samples(run(c))
    assert value(ss, "efa_device_up", device="rdmap1s0") == 1
    assert value(ss, "efa_tx_bytes_total", device="rdmap1s0", port="1") == 7


@pytest.mark.parametrize("err", [errno.EACCES, errno.EIO, errno.ENODEV])
def test_errors_from_the_reader_seam(tmp_path, err):
    efa(tmp_path, "rdmap0s0", 0)
    efa(tmp_path, "rdmap1s0", 1)
    reader = FaultyReader()
    reader.fail("rdmap0s0/hw_counters/keep_alive_rcvd", err)
    ss = samples(run(collector(tmp_path, reader=reader)))
    assert value(ss, "efa_device_up", device="rdmap0s0") == 0
    assert value(ss, "efa_device_up", device="rdmap1s0") == 1


def test_directory_where_a_counter_file_should_be(tmp_path):
    """Tests run as root, so chmod cannot make a file unreadable: a directory fails read() instead."""
    dev = efa(tmp_path, "rdmap0s0", 0)
    efa(tmp_path, "rdmap1s0", 1)
    bad = dev / "ports" / "1" / "hw_counters" / "tx_pkts"
    bad.unlink()
    bad.mkdir()
    c = collector(tmp_path)
    ss = samples(run(c))
    assert value(ss, "efa_device_up", device="rdmap0s0") == 0
    assert value(ss, "efa_device_up", device="rdmap1s0") == 1
    reading = c.devices.read(c.discovery.discover()[0])
    assert "tx_pkts" in reading.error and reading.samples == []


def test_malformed_counter_fails_the_device_with_a_clear_error(tmp_path):
    dev = efa(tmp_path, "rdmap0s0", 0)
    (dev / "hw_counters" / "cmds_err").write_text("garbage\n")
    c = collector(tmp_path)
    ss = samples(run(c))
    assert value(ss, "efa_device_up", device="rdmap0s0") == 0
    err = c.devices.read(c.discovery.discover()[0]).error
    assert "cmds_err" in err and "garbage" in err


def test_a_counter_of_absurd_length_is_a_bad_read_never_inf(tmp_path):
    dev = efa(tmp_path, "rdmap0s0", 0)
    efa(tmp_path, "rdmap1s0", 1)
    (dev / "ports/1/hw_counters" / "tx_bytes").write_text("9" * 320 + "\n")  # float() of it is +Inf
    c = collector(tmp_path)
    ss = samples(run(c))
    assert value(ss, "efa_device_up", device="rdmap0s0") == 0
    assert value(ss, "efa_device_up", device="rdmap1s0") == 1  # the other device is unaffected
    assert all(v != float("inf") for v in ss.values())
    assert "tx_bytes" in c.devices.read(c.discovery.discover()[0]).error


def test_device_removed_mid_scrape(tmp_path):
    efa(tmp_path, "rdmap0s0", 0)
    dev1 = efa(tmp_path, "rdmap1s0", 1)
    target = dev1.resolve()
    reader = FaultyReader()

    def unplug(path):
        if "rdmap1s0/ports/1/hw_counters/rx_bytes" in path:
            (tmp_path / "class" / "infiniband" / "rdmap1s0").unlink()
            shutil.rmtree(target)

    reader.on_read = unplug
    c = collector(tmp_path, reader=reader)
    ss = samples(run(c))
    assert value(ss, "gpu_health_exporter_collector_success", collector="efa") == 1
    assert value(ss, "efa_device_up", device="rdmap1s0") == 0
    assert value(ss, "efa_device_up", device="rdmap0s0") == 1
    assert not any(dict(ls).get("device") == "rdmap1s0" and n.endswith("_total") for n, ls in ss)
    # the next scrape no longer finds it
    ss = samples(run(c))
    assert value(ss, "efa_devices") == 1
    assert not any(dict(ls).get("device") == "rdmap1s0" for _, ls in ss)


def test_devices_appearing_and_vanishing_between_scrapes(tmp_path):
    efa(tmp_path, "rdmap0s0", 0)
    c = collector(tmp_path, **{"efa.expected_devices": 2})
    ss = samples(run(c))
    assert value(ss, "efa_devices") == 1 and value(ss, "efa_devices_expected") == 2
    efa(tmp_path, "rdmap1s0", 1, values={"rx_pkts": 5})  # late initialisation
    ss = samples(run(c))
    assert value(ss, "efa_devices") == 2
    assert value(ss, "efa_rx_packets_total", device="rdmap1s0", port="1") == 5
    (tmp_path / "class" / "infiniband" / "rdmap0s0").unlink()
    ss = samples(run(c))
    assert value(ss, "efa_devices") == 1
    assert {dict(ls)["device"] for n, ls in ss if n == "efa_device_up"} == {"rdmap1s0"}


def test_file_removed_between_scrapes_is_absent_not_zero(tmp_path, monkeypatch):
    from exporter.efa import reader as efa_reader

    monkeypatch.setattr(efa_reader, "RECHECK_S", 0.0)  # the directories' check is due at once
    dev = efa(tmp_path, "rdmap0s0", 0, kernel=(6, 17))
    c = collector(tmp_path)
    assert "efa_retrans_packets_total" in names(run(c))
    (dev / "ports" / "1" / "hw_counters" / "retrans_pkts").unlink()
    text = run(c)
    assert "efa_retrans_packets_total" not in names(text)
    assert value(text, "efa_device_up", device="rdmap0s0") == 1


def test_no_infiniband_class_at_all(tmp_path):
    ss = samples(run(collector(tmp_path, **{"node.instance_type": "p5en.48xlarge"})))
    assert value(ss, "efa_devices") == 0
    assert value(ss, "efa_devices_expected") == 16
    assert value(ss, "gpu_health_exporter_collector_success", collector="efa") == 1


@pytest.mark.parametrize("itype,expected", [("p4d.24xlarge", 4), ("p5.48xlarge", 32), ("p5e.48xlarge", 32),
                                            ("p5en.48xlarge", 16), ("p6-b200.48xlarge", 8)])
def test_expected_devices_from_instance_type(tmp_path, itype, expected):
    ss = samples(run(collector(tmp_path, **{"node.instance_type": itype})))
    assert value(ss, "efa_devices_expected") == expected


def test_expected_devices_config_wins_and_unknown_is_absent(tmp_path):
    ss = samples(run(collector(tmp_path, **{"node.instance_type": "p5.48xlarge", "efa.expected_devices": 8})))
    assert value(ss, "efa_devices_expected") == 8
    assert "efa_devices_expected" not in names(run(collector(tmp_path)))


def test_expected_devices_from_imds_identity(tmp_path):
    from exporter.imds import InstanceIdentity

    c = collector(tmp_path)
    c.ctx.identity.publish(InstanceIdentity("p4d.24xlarge", "i-0abc", "us-east-1a"))
    assert value(run(c), "efa_devices_expected") == 4


def test_link_speed_reported_by_newer_kernels(tmp_path):
    efa(tmp_path, "rdmap0s0", 0, rate="400 Gb/sec (8X HDR)")
    efa(tmp_path, "rdmap1s0", 1, rate="200 Gb/sec (4X HDR)")
    ss = samples(run(collector(tmp_path)))
    assert value(ss, "efa_port_rate_bytes_per_second", device="rdmap0s0") == 50e9
    assert value(ss, "efa_port_rate_bytes_per_second", device="rdmap1s0") == 25e9


def test_unknown_counter_files_are_exported_generically(tmp_path):
    dev = efa(tmp_path, "rdmap0s0", 0)
    (dev / "ports" / "1" / "hw_counters" / "future_pkts").write_text("42\n")
    (dev / "hw_counters" / "future_thing").write_text("9\n")
    (dev / "hw_counters" / "alloc_mr_err").write_text("3\n")  # out-of-tree driver (HAVE_EFA_KVERBS)
    text = run(collector(tmp_path))
    ss = samples(text)
    assert value(ss, "efa_port_driver_stat_total", device="rdmap0s0", port="1", stat="future_pkts") == 42
    assert value(ss, "efa_device_driver_stat_total", device="rdmap0s0", stat="future_thing") == 9
    assert value(ss, "efa_verbs_errors_total", device="rdmap0s0", op="alloc_mr") == 3
    assert promtool_check_metrics(text) == ""


def test_state_files_are_not_exported(tmp_path):
    efa(tmp_path, "rdmap0s0", 0)
    got = names(run(collector(tmp_path)))
    assert not any("state" in n for n in got if n.startswith("efa_"))


def test_driver_version_on_info(tmp_path):
    efa(tmp_path, "rdmap0s0", 0)
    (tmp_path / "module" / "efa").mkdir(parents=True)
    (tmp_path / "module" / "efa" / "version").write_text("2.17.1g\n")
    assert value(run(collector(tmp_path)), "efa_info", device="rdmap0s0", driver_version="2.17.1g") == 1


@pytest.mark.parametrize("workers", [1, 2])
def test_a_read_blocked_in_the_kernel_fails_only_that_device(tmp_path, workers):
    """An admin command that never completes blocks the sysfs read (until the driver's timeout):
    that device is down for the scrape, the others are served within the device deadline, and the
    blocked read is not piled up on by later scrapes."""
    import threading
    import time

    for i in range(4):
        efa(tmp_path, f"rdmap{i}s0", i)
    release = threading.Event()
    blocked = []

    def hang(path):
        if path.endswith("rdmap2s0/ports/1/hw_counters/tx_bytes"):
            blocked.append(path)
            release.wait(HANG_GUARD_S)  # until released: far beyond any deadline under test

    reader = FaultyReader()
    reader.on_read = hang
    c = collector(tmp_path, reader=reader, **{"efa.device_timeout_seconds": 0.3, "efa.read_workers": workers})
    try:
        t = time.monotonic()
        ss = samples(run(c))
        assert time.monotonic() - t < DEADLINE_MARGIN_S  # the 0.3 s device deadline, not the hang
        assert value(ss, "gpu_health_exporter_collector_success", collector="efa") == 1
        assert value(ss, "efa_device_up", device="rdmap2s0") == 0
        assert all(value(ss, "efa_device_up", device=f"rdmap{i}s0") == 1 for i in (0, 1, 3))
        ss = samples(run(c))  # still blocked: not read again, still down, others fine
        assert value(ss, "efa_device_up", device="rdmap2s0") == 0
        assert value(ss, "efa_device_up", device="rdmap3s0") == 1
        assert len(blocked) == 1
        # one thread left with the blocked read, no pile-up
        assert c.reads.stuck() == [c.discovery.discover()[2].path] and c.reads.abandoned == 1
    finally:
        release.set()
    deadline = time.monotonic() + START_HANG_GUARD_S
    while c.reads.stuck() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert value(run(c), "efa_device_up", device="rdmap2s0") == 1
    c.close()


def test_unreadable_pci_identity_falls_back_to_the_driver_link(tmp_path):
    efa(tmp_path, "rdmap0s0", 0)
    mellanox(tmp_path, "mlx5_0", 0x30)
    reader = FaultyReader()
    reader.fail("/vendor", errno.EACCES)
    ss = samples(run(collector(tmp_path, reader=reader)))
    assert value(ss, "efa_devices") == 1
    assert value(ss, "efa_info", device="rdmap0s0", pci_address="0000:00:00.0", pci_device_id="") == 1
    assert value(ss, "efa_device_up", device="rdmap0s0") == 1


def test_slow_devices_stop_at_the_collection_budget_not_the_collector(tmp_path):
    """Each device is slow but within its own deadline: read one after another they would pass the
    collector's deadline, so reading stops at 80% of it and the rest are reported down."""
    import time

    for i in range(4):
        efa(tmp_path, f"rdmap{i}s0", i)
    reader = FaultyReader()
    reader.on_read = lambda path: time.sleep(0.6) if path.endswith("/ports/1/hw_counters/tx_bytes") else None
    c = collector(tmp_path, reader=reader, **{"efa.timeout_seconds": 2.0, "efa.device_timeout_seconds": 1.0})
    ss = samples(run(c))  # device 0 by 0.6 s, 1 by 1.2; 2 cannot end before 1.8 s, past the 1.6 s budget
    # it stopped at the budget: a success (within the collector's 2 s deadline) with the last down
    assert value(ss, "gpu_health_exporter_collector_success", collector="efa") == 1
    up = [value(ss, "efa_device_up", device=f"rdmap{i}s0") for i in range(4)]
    # device 1 may miss the budget on a loaded host; what must hold: those read first are up, the
    # rest down, and the devices that cannot end within the budget are down
    assert up[0] == 1 and up[2:] == [0, 0] and up == sorted(up, reverse=True), up
    assert value(ss, "efa_tx_bytes_total", device="rdmap0s0", port="1") == 0
    c.close()


def test_samples_carry_exactly_their_metrics_labels(tmp_path):
    from exporter.catalog import all_specs

    efa(tmp_path, "rdmap0s0", 0, kernel=(5, 10))
    dev = efa(tmp_path, "rdmap1s0", 1)
    (dev / "hw_counters" / "future_thing").write_text("9\n")
    specs = {s.name: s for s in all_specs()}
    out = collect(collector(tmp_path))
    n = 0
    for fam in out:
        for s in fam.samples:
            assert tuple(s.labels) == specs[s.name].labels, s
            assert isinstance(s.value, float), s
            n += 1
    assert n > 2 * 30


def test_directories_are_listed_again_only_when_they_change(tmp_path, monkeypatch):
    """Files stay open across scrapes: a device's directories are listed when its files are
    opened, then checked (stat) at most every RECHECK_S and listed again only when one changed."""
    import time

    from exporter.efa import reader as efa_reader

    dev = efa(tmp_path, "rdmap0s0", 0)
    reader = FaultyReader()
    c = collector(tmp_path, reader=reader)
    collect(c)
    assert reader.listings == 3  # ports/, ports/1/hw_counters, hw_counters
    collect(c)
    assert reader.listings == 6  # just written: racily clean, so listed again
    monkeypatch.setattr(efa_reader, "RACY_NS", 0)
    collect(c)
    before = reader.listings
    for _ in range(3):
        collect(c)
    assert reader.listings == before  # unchanged: no listing (and no stat before RECHECK_S)
    time.sleep(0.05)  # past the file system's timestamp tick
    (dev / "ports" / "1" / "hw_counters" / "future_pkts").write_text("42\n")
    monkeypatch.setattr(efa_reader, "RECHECK_S", 0.0)  # the check is due
    ss = samples(run(c))
    assert value(ss, "efa_port_driver_stat_total", device="rdmap0s0", port="1", stat="future_pkts") == 42
    assert reader.listings == before + 3
    collect(c)
    assert reader.listings == before + 3  # checked, unchanged: not listed


def test_counter_files_stay_open_and_each_is_read_once_a_scrape(tmp_path, monkeypatch):
    from exporter.efa import reader as efa_reader

    monkeypatch.setattr(efa_reader, "RACY_NS", 0)
    efa(tmp_path, "rdmap0s0", 0)
    efa(tmp_path, "rdmap1s0", 1)
    reader = FaultyReader()
    c = collector(tmp_path, reader=reader, **{"efa.counters": "default"})
    collect(c)
    opened = reader.opens
    assert opened > 2 * 10
    for _ in range(4):
        collect(c)
    assert reader.opens == opened  # no open (nor close) on the hot path
    assert {n for p, n in reader.reads.items() if "/hw_counters/" in p} == {5}


def test_the_device_set_is_listed_again_only_when_it_may_have_changed(tmp_path, monkeypatch):
    """class/infiniband is listed when its stat changes, after a read error, and at least every
    RECHECK_S; otherwise a scrape reads the devices it knows."""
    import time

    from exporter.efa import discovery

    monkeypatch.setattr(discovery, "RACY_NS", 0)
    for i in range(3):
        efa(tmp_path, f"rdmap{i}s0", i)
    reader = FaultyReader()
    c = collector(tmp_path, reader=reader)
    run(c)
    n = reader.class_listings
    for _ in range(3):
        run(c)
    assert reader.class_listings == n
    time.sleep(0.05)  # past the file system's timestamp tick
    (tmp_path / "class" / "infiniband" / "rdmap2s0").unlink()
    assert value(run(c), "efa_devices") == 2
    assert reader.class_listings == n + 1
    reader.fail("rdmap0s0/hw_counters/cmds_err", errno.EIO)
    assert value(run(c), "efa_device_up", device="rdmap0s0") == 0
    reader.faults.clear()
    run(c)
    assert reader.class_listings == n + 2  # after the error: is the device still there?
    monkeypatch.setattr(discovery, "RECHECK_S", 0.0)
    run(c)
    assert reader.class_listings == n + 3


def test_a_listed_file_that_vanishes_fails_the_device_once_then_is_absent(tmp_path, monkeypatch):
    """If a file goes away without its directory's stat changing, the read fails that scrape
    (as when it goes between listing and reading) and the next scrape lists again."""
    from exporter.efa import reader as efa_reader

    monkeypatch.setattr(efa_reader, "RACY_NS", 0)
    efa(tmp_path, "rdmap0s0", 0)
    reader = FaultyReader()
    c = collector(tmp_path, reader=reader)
    collect(c)
    reader.fail("ports/1/hw_counters/rx_drops", errno.ENOENT)
    ss = samples(run(c))
    assert value(ss, "efa_device_up", device="rdmap0s0") == 0
    before = reader.listings
    reader.faults.clear()
    ss = samples(run(c))
    assert value(ss, "efa_device_up", device="rdmap0s0") == 1
    assert reader.listings == before + 3


def test_a_scrape_after_the_pool_closed_ends_within_its_budget(tmp_path):
    """Shutdown closes the pool while a scrape may still come: its devices must come back down
    within the collection budget, not wait on a batch no thread will ever run."""
    import threading

    from exporter.deadline import Pool
    from tests.helpers import scrape

    efa(tmp_path, "rdmap0s0", 0)
    pool = Pool(2)
    c = collector(tmp_path, pool=pool, **{"efa.timeout_seconds": 1.0})
    runner = Runner([c], deadline_s=1.0, pool=pool)
    scrape(runner)  # one thread started, then idle
    pool.close()
    box = {}

    def both():
        box["collected"] = collect(c)  # the collector alone: its reads go to the closed pool
        box["ss"] = samples(scrape(runner))  # the runner's chain cannot run either

    t = threading.Thread(target=both, daemon=True)
    t.start()
    t.join(START_HANG_GUARD_S)
    assert not t.is_alive(), "a read waited on a batch no thread will run"
    ups = [s.value for fam in box["collected"] for s in fam.samples if s.name == "efa_device_up"]
    assert ups == [0.0]
    assert value(box["ss"], "gpu_health_exporter_collector_success", collector="efa") == 0


def test_an_unchanged_counter_is_the_same_sample_and_a_changed_one_shows_its_new_value(tmp_path, monkeypatch):
    """A file whose contents did not change since the last scrape gives the same Sample object
    (no parsing; the renderer reuses its text); one that changed gives its new value."""
    monkeypatch.setattr(efa_reader, "RACY_NS", 0)  # the tree was just written: trust its listing
    vals = distinct_values((6, 17))
    efa(tmp_path, "rdmap79s0", 79, kernel=(6, 17), values=vals)
    c = collector(tmp_path)
    first = [s for f in collect(c) for s in f.samples]
    again = [s for f in collect(c) for s in f.samples]
    assert [s.value for s in again] == [s.value for s in first]
    counters = [(a, b) for a, b in zip(first, again, strict=True) if a.name.endswith("_total")]
    assert counters and all(a is b for a, b in counters)
    [tx] = list(tmp_path.rglob("hw_counters/tx_bytes"))
    tx.write_text(f"{vals['tx_bytes'] + 7}\n")
    ss = samples(run(c))
    assert value(ss, "efa_tx_bytes_total", device="rdmap79s0", port="1") == vals["tx_bytes"] + 7
    assert value(ss, "efa_rx_bytes_total", device="rdmap79s0", port="1") == vals["rx_bytes"]


# --- the node's totals ------------------------------------------------------------------------------

def _set(dev, file: str, v: int) -> None:
    (dev / "ports" / "1" / "hw_counters" / file).write_text(f"{v}\n")


def test_node_totals_sum_every_device_and_stay_monotonic(tmp_path, monkeypatch):
    """efa_node_*_total: the devices' sum at the first reading, then only what each device rose, so
    a failed read, a device's reset or a device gone never makes the node's counter fall (rate()
    would read a fall as a reset and count the whole total again)."""
    monkeypatch.setattr(efa_reader, "RECHECK_S", 0.0)
    a = efa(tmp_path, "rdmap16s0", 16, values={"retrans_timeout_events": 100, "tx_bytes": 1000})
    b = efa(tmp_path, "rdmap17s0", 17, values={"retrans_timeout_events": 50, "tx_bytes": 2000})
    reader = FaultyReader()
    c = collector(tmp_path, reader=reader, **{"efa.counters": "default"})

    def node(text: str, name: str = "efa_node_retrans_timeout_events_total") -> float:
        return value(samples(text), name)

    text = run(c)
    assert node(text) == 150 and node(text, "efa_node_tx_bytes_total") == 3000
    assert value(samples(text), "efa_devices_unreadable") == 0
    assert promtool_check_metrics(text) == ""
    _set(a, "retrans_timeout_events", 110)
    assert node(run(c)) == 160
    # b fails its reads: the total holds (b adds nothing), and the node counts one unreadable device
    reader.fail("rdmap17s0/ports/1/hw_counters/retrans_timeout_events")
    _set(a, "retrans_timeout_events", 120)
    _set(b, "retrans_timeout_events", 70)
    text = run(c)
    assert node(text) == 170 and value(samples(text), "efa_devices_unreadable") == 1
    # b answers again: what it rose meanwhile is added
    reader.faults.clear()
    assert node(run(c)) == 190
    # a is reset (its counter starts over): its new value is added, as rate() counts a reset
    _set(a, "retrans_timeout_events", 5)
    assert node(run(c)) == 195
    # b goes away: the total keeps what it counted
    (tmp_path / "class" / "infiniband" / "rdmap17s0").unlink()
    text = run(c)
    assert value(samples(text), "efa_devices") == 1 and node(text) == 195
    _set(a, "retrans_timeout_events", 6)
    assert node(run(c)) == 196


def test_node_totals_follow_the_counter_set(tmp_path):
    """A summed family is totalled only when its file is read; efa_devices_unreadable always."""
    efa(tmp_path, "rdmap16s0", 16, values={"tx_bytes": 7})
    c = collector(tmp_path, **{"efa.counters": ["tx_bytes"]})
    text = run(c)
    got = {n for n in names(text) if n.startswith("efa_node_")}
    assert got == {"efa_node_tx_bytes_total"}
    assert value(samples(text), "efa_node_tx_bytes_total") == 7
    assert value(samples(text), "efa_devices_unreadable") == 0
