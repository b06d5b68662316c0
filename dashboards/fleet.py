"""Fleet GPU health: what needs action now, across the nodes of the selected clusters."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

from dashboards.lib import (
    JOB,
    NEUTRAL,
    OK_RED,
    VERDICT_COLOURS,
    WORKLOAD,
    colour,
    coloured_cells,
    dashboard,
    instant,
    job_url,
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
from dashboards.runbooks import alert_regex, runbook_properties

RECOVERY_ACTIONS = {
    "1": ("GPU reset", "orange"),
    "2": ("node reboot", "red"),
    "3": ("drain peer-to-peer", "orange"),
    "4": ("drain and reset", "orange"),
    "5": ("recover the IMEX domain", "orange"),
}


def overview() -> list:
    verdicts = stat_panel(
        "Nodes by verdict",
        "Nodes of the selection per GPU health verdict (the worst of each node's GPUs and its own): "
        "anything but healthy needs someone. reset, reboot and replace page through the node alerts.",
        "none", "one value per verdict (6)",
        query(f"count by (verdict) (gpu_node_health_verdict{sel()} == 1)", "{{verdict}}"),
        thresholds=NEUTRAL, width=8, text_mode=cm.BigValueTextMode.VALUE_AND_NAME,
        overrides=[colour(v, c) for v, c in VERDICT_COLOURS.items()])
    coverage = stat_panel(
        "Exporter coverage",
        "Targets scraped successfully, targets Prometheus knows, and nodes that reported in the last "
        "day but are not scraped now (gone from service discovery or down). A node without a working "
        "exporter is a node whose GPUs nobody watches.",
        "none", "three values",
        query(f"count(up{sel(JOB)} == 1) or vector(0)", "exporters up"),
        query(f"count(up{sel(JOB)}) or vector(0)", "targets"),
        query(f"count(group by (cluster, instance) (max_over_time(up{sel(JOB)}[1d])) "
              f"unless on (cluster, instance) (up{sel(JOB)} == 1)) or vector(0)", "not reporting (1 d)"),
        thresholds=NEUTRAL, width=8,
        overrides=[colour("not reporting (1 d)", "red"), colour("exporters up", "green")])
    missing = table_panel(
        "Lost and missing GPUs",
        "GPUs that fell off the bus (gpu_lost, the GpuLost alert's condition: reboot the node) and "
        "nodes enumerating fewer GPUs than expected (instance:gpu_missing:count from rules/gpu.yml, "
        "the series GpuCountBelowExpected reads). Empty is healthy.",
        "none", "one row per lost GPU and per node short of GPUs",
        instant(f"gpu_lost{sel()} == 1", "lost"),
        instant(f"instance:gpu_missing:count{sel()} > 0", "missing"),
        width=8, height=6, thresholds=OK_RED)
    return [verdicts, coverage, missing]


def action() -> list:
    needing = table_panel(
        "Nodes needing action",
        "Every active reason behind a non-healthy verdict: node, GPU (empty for a node-level reason), "
        "reason and since when (first minute of the last day it was active). Click a node for its "
        "dashboard, scoped to that GPU. Reasons: docs/xid.md.",
        "dateTimeFromNow", "one row per active reason (a healthy fleet shows none)",
        instant(since(f"gpu_health_reason{sel()} == 1"), "since"),
        instant(since(f"gpu_node_health_reason{sel()} == 1"), "since (node)"),
        width=12, height=8, gpu_link=True)
    firing = sel('alertstate="firing"', f'alertname=~"{alert_regex()}"')
    alerts = table_panel(
        "Firing alerts",
        "Alerts of this project firing now (Prometheus' ALERTS series), with severity and the node; the "
        "runbook column opens the alert's runbook (links from rules/ at build time). Alerts without a "
        "node (GpuHealthExporterAbsent: no target at all) are in Alertmanager, not here.",
        "none", "one row per firing alert",
        instant(f'label_replace(ALERTS{firing}, "runbook", "$1", "alertname", "(.+)")', "firing"),
        width=12, height=8, hide=("alertstate", "Value"),
        overrides=[db.DashboardFieldConfigSourceOverrides()
                   .matcher(dm.MatcherConfig(id_val="byName", options="runbook"))
                   .properties(runbook_properties())])
    tiers = sel('tier=~"replace|reboot"')
    xids = table_panel(
        "Replace-now and reboot XIDs",
        "GPUs with XIDs of the replace and reboot tiers since the node booted (count and last seen). "
        "A replace-tier XID means drain and replace the node; reboot-tier means drain and reboot. "
        "Acknowledged XIDs (gpu-health-exporter ack) still count here; the verdict forgets them.",
        "none", "one row per GPU and XID of those tiers",
        instant(f"gpu_xid_errors_total{tiers} > 0", "XIDs since boot"),
        instant(f"gpu_xid_last_seen_timestamp_seconds{tiers} * 1000",
                "last seen"),
        width=12, height=8, gpu_link=True,
        overrides=[override("last seen", unit="dateTimeFromNow")])
    by_code = timeseries_panel(
        "XIDs by code",
        "New XID events per code across the selection, per rate interval. A code appearing on many "
        "nodes at once points at software (driver, job) rather than hardware. A GPU's first event of a "
        "code creates its series, which increase() cannot see: the replace/reboot table and the node "
        "dashboard show those.",
        "none", "top 20 XID codes",
        query(f"topk(20, sum by (xid, tier) (increase(gpu_xid_errors_total{sel()}[$__rate_interval])))",
              "XID {{xid}} ({{tier}})"),
        bars=True, width=12)
    return [needing, alerts, xids, by_code, faults_by_workload()]


def faults_by_workload() -> list:
    """Which jobs and pods faults hit within the dashboard's time range (issue 26)."""
    def last(metric: str, code: str) -> str:
        return (f"(max by (instance, {WORKLOAD}, {code}) (max_over_time({metric}{sel()}[$__range]))"
                f" > time() - $__range_s) * 1000")
    return table_panel(
        "Faults by job",
        "Every Slurm job (hpc_job) and pod whose GPUs logged an XID, or whose node's NVSwitch logged an "
        "SXid, within the selected time range: node, code and the time of the last such fault. Kept after "
        "the job ended, so the job an XID killed is here; a fault on an idle GPU is not. Sort by job to see "
        "a job hit on several nodes, by node for a node that keeps killing jobs. A job or pod links to the "
        "job dashboard (a pod opens as its own job: the dashboard's Job picker has its training job).",
        "dateTimeFromNow", "one row per job or pod, node and code hit in the range",
        instant(last("gpu_xid_workload_last_seen_timestamp_seconds", "xid"), "last XID"),
        instant(last("gpu_nvswitch_sxid_workload_last_seen_timestamp_seconds", "sxid"), "last SXid"),
        width=24, height=8,
        overrides=[override(field, links=[{"title": "Open the job dashboard", "url": job_url(field)}])
                   for field in ("hpc_job", "pod")])


def job_health() -> list:
    """Training jobs (issue 34): stalls, goodput and the GPU-hours lost, per job and per cluster."""
    lost = f"sum_over_time(instance_training_job:gpus_stalled:count{sel()}[$__range])"
    by_job = table_panel(
        "GPU-hours lost to stalls by job",
        "GPU-hours each training job held while stalled (TrainingJobStalled's condition) in the range, "
        "and its goodput over the range (the share of its allocated GPU time that was active). The job "
        "links to the job dashboard.",
        "h", "top 20 jobs",
        instant(f"topk(20, sum by (cluster, training_job, namespace) ({lost}) / 60 > 0)", "GPU-hours lost"),
        instant("topk(20, sum by (cluster, training_job, namespace) "
                f"(sum_over_time(instance_training_job:gpus_active:count{sel()}[$__range])) "
                "/ sum by (cluster, training_job, namespace) "
                f"(sum_over_time(instance_training_job:gpus:count{sel()}[$__range])))", "goodput"),
        width=16, height=8, node_link=False,
        overrides=[override("training_job", links=[{"title": "Open the job dashboard",
                                                     "url": job_url("training_job")}]),
                   override("goodput", unit="percentunit")])
    per_cluster = stat_panel(
        "GPU-hours lost to stalls per cluster",
        "GPU-hours held by stalled training jobs in the range, per cluster.",
        "h", "one value per cluster",
        query(f"sum by (cluster) ({lost}) / 60 or vector(0)", "{{cluster}}"),
        thresholds=steps((None, "green"), (1, "orange")), width=8, height=8)
    return [by_job, per_cluster]


def memory() -> list:
    ecc = table_panel(
        "Top GPUs by corrected ECC rate",
        "The 10 GPUs correcting the most single-bit ECC errors per second (5 m), their own 6-hour "
        "baseline (the 6 hours that ended an hour ago) and the acceleration (rate / baseline). An "
        "accelerating GPU is an early sign of failing HBM; the GpuEccCorrectedRateAccelerating alert "
        "judges it. Empty baseline: the GPU has less than 7 hours of history.",
        "none", "top 10 GPUs",
        instant(f"topk(10, gpu:gpu_ecc_corrected_errors:rate5m{sel()})", "errors/s"),
        instant(f"topk(10, gpu:gpu_ecc_corrected_errors:rate5m{sel()}) "
                f"/ last_over_time(gpu:gpu_ecc_corrected_errors:rate6h_offset1h{sel()}[10m])",
                "acceleration ×"),
        instant(f"last_over_time(gpu:gpu_ecc_corrected_errors:rate6h_offset1h{sel()}[10m]) "
                f"and topk(10, gpu:gpu_ecc_corrected_errors:rate5m{sel()})", "baseline errors/s"),
        width=12, height=8, gpu_link=True,
        overrides=[coloured_cells("acceleration ×", steps((None, "green"), (3, "red")))])
    ecc_ts = timeseries_panel(
        "Corrected ECC rate, top GPUs",
        "Single-bit ECC errors corrected per second by the 10 worst GPUs at each point in time.",
        "short", "top 10 GPUs per point",
        query(f"topk(10, gpu:gpu_ecc_corrected_errors:rate5m{sel()})", "{{instance}} GPU {{gpu}}"),
        width=12)
    remaps = table_panel(
        "Row remaps pending and failed",
        "GPUs with a row remap pending (takes effect at the next GPU reset: reset at the next "
        "opportunity) or failed (no spare row left: NVIDIA's RMA criterion, replace the node).",
        "none", "one row per GPU with a pending or failed remap",
        instant(f'label_replace(gpu_row_remap_pending{sel()} == 1, "state", "pending", "", "")', "pending"),
        instant(f'label_replace(gpu_row_remap_failure{sel()} == 1, "state", "failed", "", "")', "failed"),
        width=12, height=6, gpu_link=True, thresholds=OK_RED)
    recovery = table_panel(
        "Recovery actions",
        "GPUs whose NVML recovery action is not none: what the driver asks for before the GPU accepts "
        "new work (1 GPU reset, 2 node reboot, 3 drain peer-to-peer, 4 drain and reset, 5 recover the "
        "IMEX domain).",
        "none", "one row per GPU with an action",
        instant(f"gpu_recovery_action{sel()} > 0", "action"),
        width=12, height=6, gpu_link=True, mappings=value_text(RECOVERY_ACTIONS))
    return [ecc, ecc_ts, remaps, recovery]


def activity() -> list:
    """What the GPUs are doing (NVML GPM, Hopper and newer): the least busy nodes and workloads, and
    GPUs held but idle (rules/gpu.yml, gpu-activity)."""
    fleet = timeseries_panel(
        "Fleet SM and tensor activity",
        "Mean SM and tensor activity over the selection's measured GPUs (DCGM_FI_PROF_SM_ACTIVE and "
        "PIPE_TENSOR_ACTIVE from NVML GPM; A100 and MIG-mode GPUs are not measured).",
        "percentunit", "2 series",
        query(f"avg(instance:gpu_sm_active:ratio5m_avg{sel()})", "SM active"),
        query(f"avg(instance:gpu_tensor_active:ratio5m_avg{sel()})", "tensor active"),
        minimum=0, maximum=1, width=8)
    nodes = table_panel(
        "Least busy nodes",
        "The 20 nodes whose GPUs' mean SM activity (5 m) is lowest, with their tensor activity. A node of "
        "a running job far below its peers is often a straggler, a stuck rank or a node waiting on "
        "data. Click a node for its dashboard.",
        "percentunit", "bottom 20 nodes",
        instant(f"bottomk(20, instance:gpu_sm_active:ratio5m_avg{sel()})", "SM active"),
        instant(f"instance:gpu_tensor_active:ratio5m_avg{sel()} and bottomk(20, "
                f"instance:gpu_sm_active:ratio5m_avg{sel()})", "tensor active"),
        width=8, height=8)
    workloads = table_panel(
        "Least busy workloads",
        "The 20 workloads (Slurm job, or pod) whose GPUs' mean SM activity is lowest over the rate "
        "interval, and how many GPUs they hold: a job holding many GPUs it barely uses. From the "
        "workload source's gpu_workload_info; empty where it does not run.",
        "percentunit", "bottom 20 workloads",
        instant(f"bottomk(20, avg by ({WORKLOAD}) ("
                f"{workload_join(f'rate(gpu_sm_active_seconds_total{sel()}[$__rate_interval])')}))",
                "SM active"),
        width=8, height=8, node_link=False)
    longest = "bottomk(50, " + since(f"gpu:gpu_allocated_idle:ratio5m{sel()}") + ")"
    idle = table_panel(
        "Allocated GPUs near idle",
        "GPUs held by a workload (named by the workload source, or a process holding more than a tenth "
        "of the memory) with SM activity under 5 % (5 m), and since when (within the last day). Idle for "
        "an hour or more is counted beside; nothing pages.",
        "percentunit", "the 50 GPUs idle longest",
        instant(f"gpu:gpu_allocated_idle:ratio5m{sel()} and {longest}", "SM active"),
        instant(longest, "near idle since"),
        width=16, height=8, gpu_link=True, overrides=[override("near idle since", unit="dateTimeFromNow")])
    long_idle = stat_panel(
        "GPUs idle for an hour or more",
        "GPUs held by a workload and under 5 % SM activity for at least the last hour "
        "(gpu:gpu_allocated_idle:ratio1h), and the nodes they are on.",
        "none", "two values",
        query(f"count(gpu:gpu_allocated_idle:ratio1h{sel()}) or vector(0)", "GPUs"),
        query(f"count(count by (cluster, instance) (gpu:gpu_allocated_idle:ratio1h{sel()})) or vector(0)",
              "nodes"),
        thresholds=steps((None, "green"), (1, "orange")), width=8, height=8)
    return [fleet, nodes, workloads, idle, long_idle]


def fabric() -> list:
    """NVSwitch SXids, NVLink fabric registration and EC2 scheduled maintenance (docs/fabric.md)."""
    acted_on, ignored = sel('tier=~"replace|reboot|unknown"'), sel('tier="ignore"')
    not_completed = sel('state!="completed"')
    sxids = table_panel(
        "Fatal and unknown SXids",
        "NVSwitch SXids since the node booted that the policy puts in the replace or reboot tier (a "
        "Fatal SXid by default: drain and reboot, replace if it returns) or that carry no severity "
        "(SOE, thermal, IO failure). On a P5 one switch in trouble stops NVLink for all 8 GPUs.",
        "none", "one row per switch and SXid code of those tiers",
        instant(f"gpu_nvswitch_sxid_errors_total{acted_on} > 0", "SXids since boot"),
        width=12, height=8)
    non_fatal = timeseries_panel(
        "Non-fatal SXids, top nodes",
        "Non-fatal and correctable NVSwitch SXids per node per rate interval (corrected ECC, link "
        "replays, CRC). More than 10 an hour opens a ticket (NvswitchSxidNonFatalRateHigh).",
        "none", "top 10 nodes",
        query(f"topk(10, sum by (cluster, instance) (increase(gpu_nvswitch_sxid_errors_total{ignored}"
              "[$__rate_interval])))", "{{instance}}"),
        bars=True, width=12)
    registration = table_panel(
        "Fabric registration not completed",
        "GPUs whose NVLink fabric registration has not completed (Fabric Manager down, failed or not "
        "matching the driver: every CUDA job on the node fails with error 802) or completed with an "
        "error status. GPUs without a fabric (A100, PCIe, a single passthrough GPU) never show.",
        "none", "one row per GPU not registered or registered with an error",
        instant(f"gpu_fabric_state{not_completed} == 1", "state"),
        instant(f"gpu_fabric_status{sel()} != 0", "status"),
        width=12, height=8, gpu_link=True, hide=("Value #A",))
    events = table_panel(
        "EC2 scheduled events",
        "Active EC2 maintenance events of the nodes (IMDSv2): reboots, stops and retirements page a "
        "day ahead so the job can checkpoint and the node be drained; every event tickets a week ahead.",
        "dateTimeFromNow", "one row per active event (usually none)",
        instant(f"ec2_scheduled_event_start_timestamp_seconds{sel()} * 1000", "starts"),
        width=12, height=8)
    return [sxids, non_fatal, registration, events]


def exporter() -> list:
    failing = table_panel(
        "Collectors and sources failing",
        "Everything the exporter could not read on a node: a whole collector, or part of one (an EFA "
        "device, a Lustre tree, a Lustre mount's statfs, a GPU's NVML reads, the kernel log, NVML "
        "events, the XID state file). Metrics of the failing part are missing or stale.",
        "none", "one row per failing collector or source",
        instant(" or ".join([
            _problem(f"gpu_health_exporter_collector_success{sel()} == 0", "collector failing", "collector"),
            # the node's count (one series a node): the node dashboard names the devices
            _problem(f"efa_devices_unreadable{sel()} > 0", "EFA devices unreadable", ""),
            _problem(f"lustre_client_source_up{sel()} == 0", "Lustre source unreadable", "source"),
            _problem(f"lustre_client_statfs_success{sel()} == 0", "Lustre mount not answering", "mount"),
            _problem(f"gpu_read_success{sel()} == 0", "GPU unreadable", "gpu"),
            _problem(f"gpu_health_exporter_kmsg_up{sel()} == 0", "kernel log unread", ""),
            _problem(f"gpu_health_exporter_nvml_event_watcher_up{sel()} == 0", "NVML events unread", ""),
            _problem(f"gpu_health_exporter_state_file_ok{sel()} == 0", "XID state file failing", ""),
        ]), "failing"),
        width=24, height=8, hide=("Value", "collector", "device", "source", "mount", "gpu"))
    return [failing]


def _problem(expr: str, problem: str, item_label: str) -> str:
    """A failing source as a row with `problem` and `item` labels (item: which one)."""
    inner = f'label_replace({expr}, "problem", "{problem}", "", "")'
    if item_label:
        return f'label_replace({inner}, "item", "$1", "{item_label}", "(.*)")'
    return inner


def build() -> db.Dashboard:
    d = dashboard("fleet", "Fleet GPU health: what needs action now, and whether every node is watched.")
    for title, panels in (("Overview", overview()), ("Needs action", action()),
                          ("GPU memory and recovery", memory()),
                          ("Activity (SM, tensor)", activity()),
                          ("Training jobs", job_health()),
                          ("NVSwitch, fabric and EC2 events", fabric()), ("Exporter", exporter())):
        d = d.with_row(db.Row(title))
        for p in panels:
            d = d.with_panel(p)
    return d
