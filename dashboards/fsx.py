"""FSx for Lustre clients: what the nodes see of their file systems, worst clients first."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from dashboards.lib import (
    NEUTRAL,
    OK_RED,
    colour,
    dashboard,
    instant,
    override,
    query,
    sel,
    stat_panel,
    steps,
    table_panel,
    timeseries_panel,
)

K = 10
MOUNT = "{{instance}} {{mount}}"
BY_MOUNT = "cluster, instance, fsname, mount"


def _mount_rate(metric: str, *matchers: str) -> str:
    return f"sum by ({BY_MOUNT}) (rate({metric}{sel(*matchers)}[$__rate_interval]))"


def _fs(metric: str) -> str:
    """Summed over the selection per file system."""
    return f"sum by (fsname) (rate({metric}{sel()}[$__rate_interval]))"


def throughput() -> list:
    fs = timeseries_panel(
        "Throughput per file system",
        "Bytes read and written per second through the Lustre mounts of the selection, per file system "
        "(written negative).",
        "Bps", "2 per file system",
        query(_fs("lustre_client_read_bytes_total"), "{{fsname}} read"),
        query("-" + _fs("lustre_client_write_bytes_total"), "{{fsname}} write"),
        width=12)
    clients = timeseries_panel(
        "Top clients by throughput",
        "The mounts reading and writing the most bytes per second.",
        "Bps", f"top {K} mounts per point, twice",
        query(f"topk({K}, {_mount_rate('lustre_client_read_bytes_total')})", MOUNT + " read"),
        query(f"topk({K}, {_mount_rate('lustre_client_write_bytes_total')})", MOUNT + " write"),
        width=12)
    ops = timeseries_panel(
        "Operations by type",
        "VFS operations per second over the selection by type (open, close, getattr, ...): metadata "
        "storms show here first.",
        "ops", f"top {K} operation types per point",
        query(f"topk({K}, sum by (operation) "
              f"(rate(lustre_client_operations_total{sel()}[$__rate_interval])))", "{{operation}}"),
        width=12)
    top_ops = timeseries_panel(
        "Top clients by operations",
        "The mounts issuing the most VFS operations per second.",
        "ops", f"top {K} mounts per point",
        query(f"topk({K}, {_mount_rate('lustre_client_operations_total')})", MOUNT),
        width=12)
    return [fs, clients, ops, top_ops]


def latency() -> list:
    mdc = timeseries_panel(
        "Metadata RPC latency, slowest clients",
        "Mean metadata (MDC) RPC round trip per mount (rules/fsx.yml). FSx normally answers in under a "
        "millisecond; above 50 ms under load raises LustreMetadataLatencyHigh.",
        "s", f"top {K} mounts per point",
        query(f"topk({K}, mount:lustre_client_mdc_rpc_wait_seconds:mean5m{sel()})", MOUNT),
        thresholds=steps((None, "green"), (0.05, "red")), width=12)
    osc = timeseries_panel(
        "Data RPC latency, slowest clients",
        "Mean object storage (OSC) RPC round trip per mount: time from send to reply over the RPCs "
        "completed in the interval.",
        "s", f"top {K} mounts per point",
        query(_osc_latency(), MOUNT),
        width=12)
    inflight = timeseries_panel(
        "RPCs in flight, busiest clients",
        "RPCs in flight per mount and component against the configured max_rpcs_in_flight: a client "
        "pinned at its maximum waits on the servers.",
        "short", f"top {K} mounts per point, twice",
        query(f"topk({K}, sum by ({BY_MOUNT}, component) (lustre_client_rpcs_in_flight{sel()}))",
              MOUNT + " {{component}}"),
        query(f"topk({K}, sum by ({BY_MOUNT}, component) (lustre_client_max_rpcs_in_flight{sel()}))",
              MOUNT + " {{component}} max"),
        width=12)
    timeouts = timeseries_panel(
        "RPC timeouts, worst clients",
        "RPCs that timed out per second per mount and component (LustreRpcTimeouts).",
        "short", f"top {K} mounts per point",
        query(f"topk({K}, sum by ({BY_MOUNT}, component) "
              f"(rate(lustre_client_rpc_timeouts_total{sel()}[$__rate_interval])))",
              MOUNT + " {{component}}"),
        thresholds=OK_RED, width=12)
    return [mdc, osc, inflight, timeouts]


def _osc_latency() -> str:
    wait = _mount_rate("lustre_client_rpc_wait_seconds_total", 'component="osc"')
    rpcs = _mount_rate("lustre_client_rpcs_total", 'component="osc"')
    return f"topk({K}, {wait} / ({rpcs} > 0))"


def imports() -> list:
    states = stat_panel(
        "Import states",
        "Targets (OSTs, MDTs) of the selection's mounts by import state. FULL and IDLE are normal; "
        "DISCONN, EVICTED, CONNECTING and the like mean clients cannot reach a server.",
        "none", "one value per state seen",
        query(f"sum by (state) (lustre_client_import_state{sel()})", "{{state}}"),
        thresholds=NEUTRAL, width=8, height=6,
        overrides=[colour("FULL", "green"), colour("IDLE", "green")]
        + [colour(s, "red") for s in ("DISCONN", "EVICTED", "CLOSED", "CONNECTING", "REPLAY", "RECOVER")])
    bad = table_panel(
        "Imports not connected",
        "Every mount and target whose import is neither FULL nor IDLE (LustreImportNotConnected).",
        "none", "one row per target not connected",
        instant("lustre_client_import_state" + sel('state!~"FULL|IDLE"') + " > 0", "targets"),
        width=8, height=6, thresholds=OK_RED)
    evictions = table_panel(
        "Evictions",
        "Targets that evicted the client within the dashboard's time range (LustreClientEvicted): "
        "evictions counted since the exporter started and when the newest happened. An evicted client "
        "lost its locks and dirty pages: the job that wrote them may have lost data.",
        "none", "one row per evicted target",
        instant("lustre_client_import_evictions_total" + sel() + " > 0", "evictions"),
        instant(f"(lustre_client_import_last_eviction_timestamp_seconds{sel()} > 0) * 1000", "last eviction"),
        width=8, height=6, overrides=[override("last eviction", unit="dateTimeFromNow")])
    health = table_panel(
        "Clients unhealthy or unreadable",
        "Clients whose health_check is not healthy (an LBUG needs a reboot: LustreClientUnhealthy), "
        "mounts not answering statfs, and statistics trees the exporter cannot read.",
        "none", "one row per problem",
        instant("lustre_client_health_status" + sel('status!="healthy"') + " == 1", "unhealthy"),
        instant("lustre_client_statfs_success" + sel() + " == 0", "statfs failing"),
        instant("lustre_client_source_up" + sel() + " == 0", "source unreadable"),
        width=24, height=6)
    return [states, bad, evictions, health]


def capacity() -> list:
    space = timeseries_panel(
        "Space free per file system",
        "Share of each file system's space available to users, as the least of what its clients see "
        "(rules/fsx.yml). Under 5% raises LustreFilesystemNearlyFull.",
        "percentunit", "one per file system",
        query(f"min by (fsname) (mount:lustre_client_filesystem_available:ratio{sel()})", "{{fsname}}"),
        thresholds=steps((None, "red"), (0.05, "orange"), (0.2, "green")), minimum=0, maximum=1, width=8)
    inodes = timeseries_panel(
        "Inodes free per file system",
        "Share of each file system's inodes free. Small-file workloads run out of inodes before space.",
        "percentunit", "one per file system",
        query(f"min by (fsname) (mount:lustre_client_filesystem_inodes_free:ratio{sel()})", "{{fsname}}"),
        thresholds=steps((None, "red"), (0.05, "orange"), (0.2, "green")), minimum=0, maximum=1, width=8)
    size = stat_panel(
        "Capacity",
        "Each file system's size and available bytes, as its clients report them.",
        "bytes", "two per file system",
        query(f"max by (fsname) (lustre_client_filesystem_size_bytes{sel()})", "{{fsname}} size"),
        query(f"min by (fsname) (lustre_client_filesystem_available_bytes{sel()})", "{{fsname}} available"),
        thresholds=NEUTRAL, width=8, height=8)
    return [space, inodes, size]


def build() -> db.Dashboard:
    d = dashboard("fsx", "FSx for Lustre clients: throughput, operations, latency, imports, evictions and "
                         "capacity as the nodes see them, worst clients first.")
    for title, panels in (("Throughput and operations", throughput()), ("Latency and RPCs", latency()),
                          ("Imports, evictions and client health", imports()), ("Capacity", capacity())):
        d = d.with_row(db.Row(title))
        for p in panels:
            d = d.with_panel(p)
    return d
