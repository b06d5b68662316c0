"""Node: one instance, each of its GPUs (the `gpu` variable narrows to one), its EFA devices and FSx
mounts, and the exporter's own health on it."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from dashboards.efa import devices_stat
from dashboards.lib import (
    JOB,
    NEUTRAL,
    OK_RED,
    UIDS,
    UP_DOWN,
    VERDICT_COLOURS,
    WORKLOAD,
    WORKLOAD_LEGEND,
    bargauge_panel,
    colour,
    dashboard,
    instant,
    override,
    query,
    sel,
    since,
    stat_panel,
    steps,
    table_panel,
    timeseries_panel,
    value_text,
    workload_join,
)


def gsel(*matchers: str) -> str:
    """A GPU metric's selector on this node, narrowed to the selected GPUs."""
    return sel('gpu=~"$gpu"', *matchers)


G = gsel()
GPU_LEGEND = "GPU {{gpu}}"
GPUS = "the node's GPUs (8 on P4d/P5/P6)"
# Clicking a GPU narrows this dashboard to it (the second click from the fleet).
GPU_URL = (f"/d/{UIDS['node']}/?var-datasource=${{datasource}}&var-cluster=${{cluster}}"
           "&var-instance=${instance}&var-gpu=${__data.fields.gpu}&${__url_time_range}")
VERDICT_TEXT = {v: (v.replace("_", " "), c) for v, c in VERDICT_COLOURS.items()}


def _gpu_link():
    return override("gpu", links=[{"title": "Show this GPU only", "url": GPU_URL}])


def verdict() -> list:
    node_verdict = stat_panel(
        "Node verdict",
        "The exporter's verdict for the node: the worst of its GPUs' and its own (healthy, degraded, "
        "unknown: a GPU NVML could not read, reset, reboot or replace "
        "required). What to do for each: docs/runbooks.md.",
        "none", "one value",
        query(f"gpu_node_health_verdict{sel()} == 1", "{{verdict}}"),
        thresholds=NEUTRAL, width=6, height=5, overrides=[colour(v, c) for v, c in VERDICT_COLOURS.items()])
    reasons = table_panel(
        "Node reasons",
        "Every active reason behind the node's verdict (node-level ones such as fewer GPUs than "
        "expected, and those of its GPUs). Reasons are explained in docs/xid.md.",
        "none", "one row per active reason",
        instant(f"gpu_node_health_reason{sel()} == 1", "active"),
        width=6, height=5, node_link=False, hide=("Value",))
    gpus = table_panel(
        "GPU verdicts and reasons",
        "Per GPU: its verdict, and one row per active reason behind it. Click a GPU to narrow the "
        "dashboard to it.",
        "none", "the node's GPUs and their active reasons",
        instant(f"gpu_health_verdict{G} == 1", "verdict"),
        instant(f"gpu_health_reason{G} == 1", "reason"),
        width=12, height=8, node_link=False, hide=("Value #A", "Value #B"),
        overrides=[_gpu_link(), override("verdict", mappings=value_text(VERDICT_TEXT))])
    return [node_verdict, reasons, gpus, active_checks()]


def active_checks() -> object:
    """The opt-in active checks' results (the Verdict row's last panel)."""
    return table_panel(
        "Active checks",
        "The last result of each opt-in active check (`gpu-health-exporter active`: nvml, efa, dcgm, "
        "nccl; docs/active-checks.md) while it is valid, how long it took, when it ran and when it last "
        "passed. A failure feeds the verdict as an active_* reason. Empty: no check has run on this node.",
        "none", "one row per check that has run",
        instant(f"gpu_health_active_check_result{sel()} == 1", "result"),
        instant(f"gpu_health_active_check_duration_seconds{sel()}", "duration"),
        instant(f"gpu_health_active_check_last_run_timestamp_seconds{sel()} * 1000", "last run"),
        instant(f"gpu_health_active_check_last_pass_timestamp_seconds{sel()} * 1000", "last pass"),
        width=24, height=6, node_link=False,
        overrides=[override("duration", unit="s"), override("last run", unit="dateTimeFromNow"),
                   override("last pass", unit="dateTimeFromNow")])


def xids() -> list:
    table = table_panel(
        "XIDs since boot",
        "Every XID each GPU logged since the node booted, by code and tier (replace, reboot, reset, "
        "application, ignore, unknown), and when last seen. Counts survive exporter restarts.",
        "none", "one row per GPU and XID code seen",
        instant(f"gpu_xid_errors_total{G}", "events"),
        instant(f"gpu_xid_last_seen_timestamp_seconds{G} * 1000", "last seen"),
        width=12, height=8, node_link=False,
        overrides=[_gpu_link(), override("last seen", unit="dateTimeFromNow")])
    over_time = timeseries_panel(
        "XIDs over time",
        "New XID events per GPU and code per rate interval (a GPU's first event of a code creates the "
        "series and shows in the table, not here).",
        "none", "one series per GPU and XID code seen",
        query(f"sum by (gpu, xid) (increase(gpu_xid_errors_total{G}[$__rate_interval]))",
              "GPU {{gpu}} XID {{xid}}"),
        bars=True)
    return [table, over_time, *workloads()]


def workloads() -> list:
    """Who holds each GPU now, and who the faults hit (issue 26; docs/xid.md "Who the fault hit")."""
    now = table_panel(
        "Workloads on the GPUs now",
        "The Slurm job (hpc_job) or Kubernetes pod and container holding each GPU, as the workload "
        "source reads it (gpu_workload_info). An idle GPU has no row; two jobs sharing a GPU have two.",
        "none", "one row per GPU and workload (none for an idle GPU)",
        instant(f"gpu_workload_info{G}", "workload"),
        width=12, height=8, node_link=False, hide=("Value",), overrides=[_gpu_link()])
    hit = table_panel(
        "Workloads the faults hit",
        "The workloads on each GPU when an XID (or, for all GPUs, an NVSwitch SXid) was counted, and when "
        "the last such fault was: kept after the job died of it and across exporter restarts, until the "
        "GPU is acknowledged (gpu-health-exporter ack) or the node reboots. A fault on an idle GPU, or "
        "one from before the workload source observed the GPU, names none.",
        "dateTimeFromNow", "at most 8 rows per GPU, plus one per SXid and workload",
        instant(f"gpu_xid_workload_last_seen_timestamp_seconds{G} * 1000", "last XID"),
        instant(f"gpu_nvswitch_sxid_workload_last_seen_timestamp_seconds{sel()} * 1000", "last SXid"),
        width=12, height=8, node_link=False, overrides=[_gpu_link()])
    return [now, hit]


COMPLETED = gsel('state="completed"')


def fabric() -> list:
    """The node's NVSwitches, its GPUs' fabric registration and EC2 scheduled events (docs/fabric.md)."""
    sxids = table_panel(
        "NVSwitch SXids since boot",
        "Every SXid the node's NVSwitches logged since boot: switch (driver index and PCI address), code, "
        "severity on the line and policy tier (reboot or replace: the node needs it; ignore: counted). "
        "Counts survive exporter restarts.",
        "none", "one row per switch, code and severity seen",
        instant(f"gpu_nvswitch_sxid_errors_total{sel()}", "reports"),
        width=12, height=8, node_link=False)
    state = stat_panel(
        "Fabric registration",
        "Each GPU's NVLink fabric registration with the Fabric Manager: completed is healthy; not "
        "started or in progress past a few minutes after boot means every CUDA job fails (error 802). "
        "Empty where the GPUs have no fabric (A100, PCIe, a single passthrough GPU).",
        "none", GPUS,
        query(f"(gpu_fabric_state{COMPLETED} and on (gpu) (gpu_fabric_status{G} == 0))"
              f" or gpu_fabric_state{G} * 0", GPU_LEGEND),
        thresholds=UP_DOWN, width=6, height=8,
        mappings=value_text({"1": ("completed", "green"), "0": ("not registered", "red")}))
    events = table_panel(
        "EC2 scheduled events",
        "Active EC2 maintenance events for this instance (IMDSv2) and when each may start. A reboot, "
        "stop or retirement within a day pages: checkpoint and drain before it.",
        "dateTimeFromNow", "one row per active event (usually none)",
        instant(f"ec2_scheduled_event_start_timestamp_seconds{sel()} * 1000", "starts"),
        width=6, height=8, node_link=False)
    return [sxids, state, events]


def memory() -> list:
    corrected = timeseries_panel(
        "Corrected ECC errors per second",
        "Single-bit ECC errors corrected per second per GPU (5 m rate, rules/gpu.yml) and the GPU's own "
        "6-hour baseline (ending an hour ago; none before 7 hours of history). A rate several times "
        "its baseline is an early sign of failing HBM.",
        "short", f"{GPUS}, twice",
        query(f"gpu:gpu_ecc_corrected_errors:rate5m{G}", GPU_LEGEND),
        query(f"last_over_time(gpu:gpu_ecc_corrected_errors:rate6h_offset1h{G}[10m])",
              "GPU {{gpu}} baseline"),
        width=8)
    uncorrected = timeseries_panel(
        "Uncorrected ECC errors",
        "New uncorrectable (double-bit) ECC errors per GPU per rate interval. Any is critical: the work "
        "on that GPU was killed and a row remap follows.",
        "none", GPUS,
        query("max without (counter) (increase(gpu_ecc_errors_total"
              + gsel('error_type="uncorrected"') + "[$__rate_interval]))", GPU_LEGEND),
        thresholds=OK_RED, bars=True, width=8)
    no_yes = {"0": ("no", "green"), "1": ("yes", "red")}
    remap = table_panel(
        "Row remapping",
        "Per GPU: a remap pending a reset (reset the GPU at the next opportunity), a remap failure (no "
        "spare row: NVIDIA's RMA criterion), the uncorrectable ECC errors of its life, and the rows "
        "remapped for correctable and uncorrectable errors (InfoROM entries).",
        "none", "the node's GPUs, five values each",
        instant(f"gpu_row_remap_pending{G}", "remap pending"),
        instant(f"gpu_row_remap_failure{G}", "remap failed"),
        instant("gpu_ecc_errors_total" + gsel('error_type="uncorrected"', 'counter="aggregate"'),
                "uncorrected ECC (life)"),
        instant("gpu_remapped_rows_total" + gsel('cause="correctable"'), "rows remapped (correctable)"),
        instant("gpu_remapped_rows_total" + gsel('cause="uncorrectable"'), "rows remapped (uncorrectable)"),
        width=8, node_link=False,
        overrides=[_gpu_link(), override("remap pending", mappings=value_text(no_yes)),
                   override("remap failed", mappings=value_text(no_yes))])
    spare = bargauge_panel(
        "Spare rows left (row-remapper histogram)",
        "Memory banks per GPU by how many spare rows they have left. Banks with none or one spare row "
        "left mean the next remaps there may fail.",
        "none", "the node's GPUs × the histogram's buckets (5)",
        query(f"sum by (gpu, spare_rows) (gpu_row_remapper_banks{G})", "GPU {{gpu}}: {{spare_rows}} spare"),
        width=24, height=8)
    return [corrected, uncorrected, remap, spare]


def thermal_power() -> list:
    temps = timeseries_panel(
        "Temperatures against thresholds",
        "GPU die and HBM temperature per GPU, with the slowdown and memory-max thresholds NVML reports "
        "(the lowest over the node's GPUs). Above slowdown the GPU halves its clocks.",
        "celsius", f"{GPUS} × 2 sensors, plus 2 thresholds",
        query(f"gpu_temperature_celsius{G}", "GPU {{gpu}} {{sensor}}"),
        query("min by (threshold) (gpu_temperature_threshold_celsius"
              + gsel('threshold=~"slowdown|memory_max"') + ")",
              "threshold {{threshold}}"),
        width=12)
    margin = timeseries_panel(
        "Margin to slowdown",
        "Degrees below each GPU's slowdown temperature. Under 5 °C for 10 minutes raises "
        "GpuTemperatureNearSlowdown.",
        "celsius", GPUS,
        query(f"gpu_temperature_slowdown_margin_celsius{G}", GPU_LEGEND),
        thresholds=steps((None, "red"), (5, "orange"), (10, "green")), width=12)
    throttle = timeseries_panel(
        "Throttle reasons active",
        "Clock event (throttle) reasons active now per GPU. Hardware slowdown, hardware thermal and "
        "power brake cut clocks hard; sw_power_cap and idle are normal.",
        "none", f"{GPUS} × active reasons (at most 8)",
        query(f"gpu_clock_event_active{G} == 1", "GPU {{gpu}} {{reason}}"),
        bars=True, width=12)
    throttle_time = timeseries_panel(
        "Time throttled",
        "Share of scrapes in which each GPU's clocks were held back, per reason (from "
        "gpu_clock_event_active; NVML's exact throttle time per reason is opt-in, gpu.detail: "
        "throttle_time).",
        "percentunit", f"{GPUS} × reasons active",
        query(f"avg_over_time(gpu_clock_event_active{G}[$__rate_interval]) > 0", "GPU {{gpu}} {{reason}}"),
        minimum=0, maximum=1, width=12)
    power = timeseries_panel(
        "Power against limit",
        "Power draw per GPU and the enforced power limit (the lowest over the node's GPUs).",
        "watt", f"{GPUS}, plus 1 limit",
        query(f"gpu_power_watts{G}", GPU_LEGEND),
        query(f"min(gpu_power_limit_watts{G})", "power limit"),
        width=12)
    util = timeseries_panel(
        "Utilisation",
        "Fraction of time each GPU ran kernels. A GPU idle while its peers are busy is often a "
        "stuck or failed rank.",
        "percentunit", GPUS,
        query("gpu_utilization_ratio" + gsel('resource="gpu"'), GPU_LEGEND),
        minimum=0, maximum=1, width=12)
    return [temps, margin, throttle, throttle_time, power, util]


def rate_of(counter: str) -> str:
    """An activity counter's ratio (0-1) per GPU over the rate interval."""
    return f"rate({counter}{G}[$__rate_interval])"


def activity() -> list:
    """What the GPUs are doing (NVML GPM, Hopper and newer; docs/metrics.md)."""
    gpm = ("From NVML GPU Performance Monitoring (Hopper and newer; DCGM's profiling field "
           "{field}), no DCGM needed.")
    sm = timeseries_panel(
        "SM activity",
        "Fraction of the time each GPU's SMs had work resident. A better measure of a training job's "
        "use of the GPU than utilisation, which counts any kernel running. "
        + gpm.format(field="DCGM_FI_PROF_SM_ACTIVE"),
        "percentunit", GPUS,
        query(rate_of("gpu_sm_active_seconds_total"), GPU_LEGEND),
        minimum=0, maximum=1, width=8)
    tensor = timeseries_panel(
        "Tensor activity",
        "Fraction of the time each GPU's tensor (matrix) pipes were busy: what mixed-precision "
        "training is bound by. " + gpm.format(field="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
        "percentunit", GPUS,
        query(rate_of("gpu_tensor_active_seconds_total"), GPU_LEGEND),
        minimum=0, maximum=1, width=8)
    node = timeseries_panel(
        "Node activity",
        "The node's mean over its measured GPUs: SM activity, SM occupancy, tensor activity and "
        "memory bandwidth use (HBM).",
        "percentunit", "4 series",
        *[query(f"avg({rate_of(c)})", label) for c, label in (
            ("gpu_sm_active_seconds_total", "SM active"), ("gpu_sm_occupancy_seconds_total", "SM occupancy"),
            ("gpu_tensor_active_seconds_total", "tensor active"),
            ("gpu_dram_active_seconds_total", "memory bandwidth"))],
        minimum=0, maximum=1, width=8)
    idle = table_panel(
        "Allocated GPUs near idle",
        "GPUs held by a workload (a Slurm job or pod the workload source names, or a process holding "
        "more than a tenth of the memory) whose SM activity is under 5 % (5 m; rules/gpu.yml "
        "gpu-activity), and since when (within the last day). Held and idle for an hour or more is "
        "waste worth a word with the owner; nothing pages.",
        "percentunit", "the node's GPUs held and near idle",
        instant(f"gpu:gpu_allocated_idle:ratio5m{G}", "SM active"),
        instant(since(f"gpu:gpu_allocated_idle:ratio5m{G}"), "near idle since"),
        width=8, node_link=False,
        overrides=[_gpu_link(), override("near idle since", unit="dateTimeFromNow")])
    workloads = timeseries_panel(
        "SM activity per workload",
        "Mean SM activity of each workload's GPUs on this node (Slurm job, or pod), from the workload "
        "source's gpu_workload_info; empty where it does not run.",
        "percentunit", "the workloads on the node (up to 8)",
        query(f"avg by ({WORKLOAD}) ({workload_join(rate_of('gpu_sm_active_seconds_total'))})",
              WORKLOAD_LEGEND),
        minimum=0, maximum=1, width=8)
    measured = table_panel(
        "GPUs without activity measurement",
        "GPUs whose activity is not measured, and why: gpu_not_supported (before Hopper: A100), "
        "driver_too_old, mig_mode, counters_in_use (DCGM's profiling module or Nsight holds the "
        "counters), no_permission, sample_failed. Empty when every GPU is measured.",
        "none", "the node's GPUs not measured",
        instant(f"gpu_activity_measured{G} == 0", "not measured"),
        width=8, node_link=False, hide=("Value",), overrides=[_gpu_link()])
    return [sm, tensor, node, idle, workloads, measured]


def interconnect() -> list:
    pcie = table_panel(
        "PCIe link",
        "Per GPU: the PCIe link's width and generation against their maxima. A width below maximum is "
        "a degraded link (GpuPcieLinkWidthDegraded); the generation drops at idle on purpose.",
        "none", "the node's GPUs, four values each",
        instant(f"gpu_pcie_link_width{G}", "width"),
        instant(f"gpu_pcie_link_width_max{G}", "max width"),
        instant(f"gpu_pcie_link_generation{G}", "generation"),
        instant(f"gpu_pcie_link_generation_max{G}", "max generation"),
        width=8, node_link=False, overrides=[_gpu_link()])
    replays = timeseries_panel(
        "PCIe replays per second",
        "PCIe replays (link-level retransmissions; DCGM's limit is 8 a minute) per GPU. The PCIe "
        "error counters by type are opt-in (gpu.detail: pcie_errors).",
        "short", GPUS,
        query(f"rate(gpu_pcie_replays_total{G}[$__rate_interval])", "GPU {{gpu}} replays"),
        width=8)
    nvlink_down = stat_panel(
        "NVLinks down",
        "NVLinks not active, per GPU. Any down link cuts GPU-to-GPU bandwidth and may fail NCCL "
        "(GpuNvlinkDown).",
        "none", "the node's GPUs with NVLink",
        query(f"count by (gpu) (gpu_nvlink_up{G} == 0) or sum by (gpu) (gpu_nvlink_up{G} * 0)", GPU_LEGEND),
        width=8, height=8)
    nvlink_errors = timeseries_panel(
        "NVLink errors per second",
        "NVLink data-link errors per GPU by type (CRC flit, CRC data, replay, recovery), summed over "
        "the GPU's links. Recovery errors on a healthy link are rare; rising CRC errors mark a "
        "marginal link.",
        "short", f"{GPUS} × 4 types",
        query(f"sum by (gpu, type) (rate(gpu_nvlink_errors_total{G}[$__rate_interval]))",
              "GPU {{gpu}} {{type}}"),
        width=24)
    return [pcie, replays, nvlink_down, nvlink_errors]


STATFS = value_text({"0": ("NO", "red"), "1": ("yes", "green")})


def efa_fsx() -> list:
    devices = devices_stat("EFA devices", "on the node", width=6, name_devices=True)
    efa_bytes = timeseries_panel(
        "EFA throughput per device",
        "Bytes sent (positive) and received (negative) per second per EFA device.",
        "Bps", "the node's EFA devices (up to 32) × 2",
        query(f"sum by (device) (rate(efa_tx_bytes_total{sel()}[$__rate_interval]))", "{{device}} tx"),
        query(f"-sum by (device) (rate(efa_rx_bytes_total{sel()}[$__rate_interval]))", "{{device}} rx"),
        width=9, height=6)
    efa_errors = timeseries_panel(
        "EFA problems per second",
        "Per EFA device: retransmit timeouts, unresponsive and impaired remotes, receive drops and RDMA "
        "work-request errors, where non-zero. The EFA fabric dashboard compares them across the fleet.",
        "short", "the node's EFA devices with problems × 6 counters",
        *[query(f"sum by (device) (rate({m}{sel()}[$__rate_interval])) > 0", f"{{{{device}}}} {label}")
          for m, label in (("efa_retrans_timeout_events_total", "retransmit timeouts"),
                           ("efa_unresponsive_remote_events_total", "unresponsive remotes"),
                           ("efa_impaired_remote_conn_events_total", "impaired remotes"),
                           ("efa_rx_drops_total", "rx drops"),
                           ("efa_rdma_read_errors_total", "RDMA read errors"),
                           ("efa_rdma_write_errors_total", "RDMA write errors"))],
        width=9, height=6)
    mounts = table_panel(
        "FSx mounts",
        "Each Lustre mount: whether statfs answers, the share of space and inodes free, and targets "
        "whose import is not FULL or IDLE (disconnected, evicted, recovering).",
        "percentunit", "the node's Lustre mounts",
        instant(f"lustre_client_statfs_success{sel()}", "statfs ok"),
        instant(f"mount:lustre_client_filesystem_available:ratio{sel()}", "space free"),
        instant(f"mount:lustre_client_filesystem_inodes_free:ratio{sel()}", "inodes free"),
        instant("sum by (cluster, instance, fsname, mount) (lustre_client_import_state"
                + sel('state!~"FULL|IDLE"') + ")",
                "imports not FULL"),
        width=12, height=6, node_link=False,
        overrides=[override("statfs ok", unit="none", mappings=STATFS),
                   override("imports not FULL", unit="none")])
    health = stat_panel(
        "Lustre client health",
        "The Lustre client's health_check (healthy, not healthy, LBUG; an LBUG needs a reboot) and the "
        "procfs, sysfs and debugfs trees the exporter reads its statistics from.",
        "none", "one value, plus one per source (3)",
        query(f"lustre_client_health_status{sel()} == 1", "{{status}}"),
        query(f"lustre_client_source_up{sel()}", "{{source}}"),
        thresholds=NEUTRAL, width=12, height=6,
        overrides=[colour("healthy", "green"), colour("not_healthy", "red"), colour("lbug", "dark-red")],
        mappings=value_text({"0": ("unreadable", "red"), "1": ("ok", "green")}))
    return [devices, efa_bytes, efa_errors, mounts, health]


def exporter() -> list:
    sources = stat_panel(
        "Exporter sources",
        "The exporter's own sources on this node: kernel log (XIDs since boot), NVML events, the XID "
        "state file (counts across restarts), and each collector's last run. Red means part of the "
        "node's health is not being read; the exporter's log says why.",
        "none", "3 sources + one per collector (6)",
        query(f"gpu_health_exporter_kmsg_up{sel()}", "kernel log"),
        query(f"gpu_health_exporter_nvml_event_watcher_up{sel()}", "NVML events"),
        query(f"gpu_health_exporter_state_file_ok{sel()}", "state file"),
        query(f"gpu_health_exporter_collector_success{sel()}", "{{collector}}"),
        thresholds=UP_DOWN, width=12, height=6,
        mappings=value_text({"0": ("failing", "red"), "1": ("ok", "green")}))
    kmsg = timeseries_panel(
        "Kernel log and NVML events",
        "Kernel-log records read and missed (overwritten before they were read: XIDs may have been lost) "
        "and NVML events received, per second.",
        "short", "4 series",
        query(f"rate(gpu_health_exporter_kmsg_records_total{sel()}[$__rate_interval])", "kmsg records read"),
        query(f"rate(gpu_health_exporter_kmsg_missed_records_total{sel()}[$__rate_interval])",
              "kmsg records missed"),
        query(f"sum(rate(gpu_nvml_events_total{sel()}[$__rate_interval]))", "NVML events"),
        query(f"rate(gpu_health_exporter_state_file_errors_total{sel()}[$__rate_interval])",
              "state file errors ({{operation}})"),
        width=12, height=6)
    timing = timeseries_panel(
        "Scrape and collector duration",
        "How long Prometheus' scrape of the node took and each collector's last run. Collectors have a "
        "5 s deadline; a slow GPU collector usually means NVML hangs on a failing GPU.",
        "s", "1 + one per collector (6)",
        query(f"scrape_duration_seconds{sel(JOB)}", "scrape"),
        query(f"gpu_health_exporter_collector_duration_seconds{sel()}", "{{collector}}"),
        thresholds=steps((None, "green"), (5, "red")), width=24, height=6)
    return [sources, kmsg, timing]


def build() -> db.Dashboard:
    d = dashboard("node", "One node: each GPU's verdict, errors and state, its EFA devices and FSx mounts, "
                          "and the exporter's health on it.", node=True)
    for title, panels in (("Verdict", verdict()), ("XIDs", xids()), ("GPU memory", memory()),
                          ("Thermal, power and utilisation", thermal_power()),
                          ("Activity (SM, tensor, memory)", activity()),
                          ("PCIe and NVLink", interconnect()),
                          ("NVSwitch, fabric and EC2 events", fabric()), ("EFA and FSx", efa_fsx()),
                          ("Exporter on this node", exporter())):
        d = d.with_row(db.Row(title))
        for p in panels:
            d = d.with_panel(p)
    return d
