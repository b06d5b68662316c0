"""EFA fabric: the fleet's EFA devices, outliers first (top-k per panel), never every device.

Fleet sums, per-node panels and the inventory read the node's totals (efa_node_*_total,
efa_devices_unreadable: one series per node, issue 36); only the top-k device panels, which
locate a device, read the per-device series."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from dashboards.lib import (
    NEUTRAL,
    OK_RED,
    colour,
    dashboard,
    instant,
    query,
    sel,
    stat_panel,
    steps,
    table_panel,
    timeseries_panel,
)

K = 10
TOP = f"top {K} devices per point"
DEVICE = "{{instance}} {{device}}"


def _device_rate(metric: str) -> str:
    """Per-device rate of an EFA port counter (ports summed: EFA devices have one)."""
    return f"sum by (cluster, instance, device) (rate({metric}{sel()}[$__rate_interval]))"


def _top(metric: str) -> str:
    return f"topk({K}, {_device_rate(metric)})"


def _node(metric: str) -> str:
    """The node's total of a per-device EFA counter (exporter.efa.node_totals)."""
    return "efa_node_" + metric.removeprefix("efa_")


def _fleet(metric: str) -> str:
    """The selection's rate of an EFA counter, from the nodes' totals (one series a node)."""
    return f"sum(rate({_node(metric)}{sel()}[$__rate_interval]))"


def devices_stat(title: str, where: str, width: int, name_devices: bool = False):
    """EFA devices found, expected and unreadable (the fleet's here, one node's on the node dashboard,
    which also names the unreadable devices: `name_devices`, a read of one node's devices)."""
    named = [query(f"efa_device_up{sel()} == 0", "{{device}} unreadable")] if name_devices else []
    return stat_panel(
        title,
        f"EFA devices found {where}, the number the instance type should have, and devices whose "
        "counters could not be read in the last scrape"
        + (" (each by name)" if name_devices else "")
        + ". Fewer than expected: a device failed to probe.",
        "none", "three values" + (", plus one per unreadable device" if name_devices else ""),
        query(f"sum(efa_devices{sel()})", "found"),
        query(f"sum(efa_devices_expected{sel()})", "expected"),
        query(f"sum(efa_devices_unreadable{sel()})", "unreadable"),
        *named,
        thresholds=NEUTRAL, width=width, height=6, overrides=[colour("unreadable", "red")])


def inventory() -> list:
    found = devices_stat("Devices found against expected", "across the selected nodes", width=8)
    short = table_panel(
        "Nodes short of devices or with unreadable devices",
        "Nodes enumerating fewer EFA devices than expected (a device failed to probe: "
        "EfaDevicesBelowExpected), and nodes with devices whose counters could not be read (an admin "
        "command failed or hung: EfaDeviceUnreadable). Click a node for its dashboard, which names the "
        "devices.",
        "none", "one row per short node and per node with unreadable devices",
        instant(f"efa_devices_expected{sel()} - efa_devices{sel()} > 0", "devices missing"),
        instant(f"efa_devices_unreadable{sel()} > 0", "devices unreadable"),
        width=16, height=6, thresholds=OK_RED)
    return [found, short]


def traffic() -> list:
    totals = timeseries_panel(
        "Fleet EFA throughput",
        "Bytes sent and received per second over all EFA devices of the selection (received negative).",
        "Bps", "2 series",
        query(_fleet("efa_tx_bytes_total"), "sent"),
        query("-" + _fleet("efa_rx_bytes_total"), "received"),
        width=8)
    top_bytes = timeseries_panel(
        "Top devices by bytes sent",
        "The EFA devices sending the most bytes per second. During collective communication all ranks "
        "send alike: a device far below its peers is a straggler or a failed path.",
        "Bps", TOP,
        query(_top("efa_tx_bytes_total"), DEVICE),
        width=8)
    low_bytes = timeseries_panel(
        "Least-sending devices",
        "The EFA devices sending the fewest bytes per second (idle nodes included): compare with the top.",
        "Bps", f"bottom {K} devices per point",
        query(f"bottomk({K}, {_device_rate('efa_tx_bytes_total')})", DEVICE),
        width=8)
    packets = timeseries_panel(
        "Top devices by packets sent",
        "Packets sent per second by the busiest EFA devices (received packets are opt-in: "
        "efa.counters).",
        "pps", f"top {K} devices per point",
        query(_top("efa_tx_packets_total"), DEVICE + " tx"),
        width=12)
    per_node = timeseries_panel(
        "Top nodes by EFA throughput",
        "Bytes per second sent and received per node (all its devices), from the node's totals the "
        "exporter sums (efa_node_tx_bytes_total, efa_node_rx_bytes_total).",
        "Bps", f"top {K} nodes per point, twice",
        query(f"topk({K}, rate(efa_node_tx_bytes_total{sel()}[$__rate_interval]))", "{{instance}} tx"),
        query(f"topk({K}, rate(efa_node_rx_bytes_total{sel()}[$__rate_interval]))", "{{instance}} rx"),
        width=12)
    return [totals, top_bytes, low_bytes, packets, per_node]


def retransmits() -> list:
    share = timeseries_panel(
        "Retransmitted share, worst nodes",
        "Share of the packets a node's EFA devices sent that they had to retransmit, from the node's "
        "totals, as EfaRetransmitRatioHigh reads them (over 10 minutes there). Above 1% for 10 minutes "
        "with real traffic raises the alert: congestion or a failing path; the panel beside it shows "
        "which device.",
        "percentunit", f"top {K} nodes per point",
        query(f"topk({K}, rate(efa_node_retrans_packets_total{sel()}[$__rate_interval]) "
              f"/ (rate(efa_node_tx_packets_total{sel()}[$__rate_interval]) > 0))", "{{instance}}"),
        thresholds=steps((None, "green"), (0.01, "red")), width=12)
    retrans = timeseries_panel(
        "Retransmitted packets, worst devices",
        "SRD packets retransmitted per second.",
        "pps", TOP,
        query(_top("efa_retrans_packets_total"), DEVICE),
        width=12)
    timeouts = timeseries_panel(
        "Retransmit timeouts, worst devices",
        "SRD timeouts that changed the network path, per second. Sustained (more than 100 in 10 minutes) "
        "raises EfaRetransmitTimeouts.",
        "short", TOP,
        query(_top("efa_retrans_timeout_events_total"), DEVICE),
        thresholds=steps((None, "green"), (100 / 600, "red")), width=12)
    remotes = timeseries_panel(
        "Unresponsive and impaired remotes, worst devices",
        "SRD remote connections found unresponsive, and connections entering the impaired (rate-limited) "
        "state, per second. Many devices at once points at the remote side or the fabric, one device at "
        "its own node.",
        "short", f"top {K} devices per point, twice",
        query(_top("efa_unresponsive_remote_events_total"), DEVICE + " unresponsive"),
        query(_top("efa_impaired_remote_conn_events_total"), DEVICE + " impaired"),
        width=12)
    return [share, retrans, timeouts, remotes]


def errors() -> list:
    drops = timeseries_panel(
        "Receive drops, worst devices",
        "Received packets dropped per second.",
        "pps", TOP,
        query(_top("efa_rx_drops_total"), DEVICE),
        width=8)
    rdma = timeseries_panel(
        "RDMA work-request errors, worst devices",
        "RDMA read and write work requests completed with an error, per second (EfaWorkRequestErrors).",
        "short", f"top {K} devices per point, twice",
        query(_top("efa_rdma_read_errors_total"), DEVICE + " read"),
        query(_top("efa_rdma_write_errors_total"), DEVICE + " write"),
        width=8)
    fleet = timeseries_panel(
        "Fleet EFA problems",
        "Each problem counter summed over the selection, per second: the fabric's overall health at a "
        "glance.",
        "short", "6 series",
        query(_fleet("efa_retrans_timeout_events_total"), "retransmit timeouts"),
        query(_fleet("efa_unresponsive_remote_events_total"), "unresponsive remotes"),
        query(_fleet("efa_impaired_remote_conn_events_total"), "impaired remotes"),
        query(_fleet("efa_rx_drops_total"), "rx drops"),
        query(_fleet("efa_rdma_read_errors_total"), "RDMA read errors"),
        query(_fleet("efa_rdma_write_errors_total"), "RDMA write errors"),
        width=8)
    return [drops, rdma, fleet]


def build() -> db.Dashboard:
    d = dashboard("efa", "EFA fabric: devices found against expected, throughput and problems, "
                         "outliers first.")
    for title, panels in (("Devices", inventory()), ("Traffic", traffic()),
                          ("Retransmits and remotes", retransmits()), ("Drops and errors", errors())):
        d = d.with_row(db.Row(title))
        for p in panels:
            d = d.with_panel(p)
    return d
