"""One training job across its nodes (issue 34): progress, goodput, the straggler, faults, throttling,
EFA and Lustre, from rules/job.yml's per-job series. Pick the job (`job`: a Slurm job id or a
Kubernetes training job's name, as `training_job`); `instance` narrows it to some of its nodes."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm

from dashboards.lib import (
    DS,
    NEUTRAL,
    OK_RED,
    TAG,
    TITLES,
    UIDS,
    instant,
    query,
    sel,
    stat_panel,
    steps,
    table_panel,
    timeseries_panel,
)

JOB = 'training_job=~"$job"'
K = 10
NODE = "{{instance}}"
GPU = "{{instance}} GPU {{gpu}}"
# The job-health groups run every minute (rules/job.yml): a per-minute series summed over a range,
# divided by 60, is in hours.
PER_HOUR = 60


def js(*matchers: str) -> str:
    """The selector of a per-job series with `instance`: cluster, instance and the job."""
    return sel(JOB, *matchers)


def _job_nodes(expr: str) -> str:
    """`expr` (per node, `cluster` and `instance`) restricted to the job's nodes."""
    return f"({expr}) and on (cluster, instance) instance_training_job:info{js()}"


def _job_gpus(expr: str) -> str:
    """`expr` (per GPU) restricted to the job's GPUs."""
    return f"({expr}) and on (cluster, instance, gpu) gpu:training_job:info{js()}"


def overview() -> list[Any]:
    gpus = stat_panel(
        "GPUs and nodes",
        "GPUs the job holds now and the nodes they are on (gpu_workload_info, through kube-state-metrics "
        "for pods).",
        "none", "2 values",
        query(f"sum(instance_training_job:gpus:count{js()})", "GPUs"),
        query(f"count(instance_training_job:info{js()})", "nodes"),
        thresholds=NEUTRAL, width=6)
    goodput = stat_panel(
        "Goodput now and over the range",
        "The share of the job's GPUs making progress now (tensor activity >= 0.05, DRAM activity >= 0.2 or "
        "SM activity >= 0.5), "
        "and the share of its allocated GPU time in the range that was (checkpoints and evaluation with "
        "idle tensor pipes count as not).",
        "percentunit", "2 values",
        query(f"sum(instance_training_job:gpus_active:count{js()}) "
              f"/ sum(instance_training_job:gpus:count{js()})", "now"),
        query(f"sum(sum_over_time(instance_training_job:gpus_active:count{js()}[$__range])) "
              f"/ sum(sum_over_time(instance_training_job:gpus:count{js()}[$__range]))", "range"),
        thresholds=steps((None, "red"), (0.5, "yellow"), (0.8, "green")), width=6)
    lost = stat_panel(
        "GPU-hours lost to stalls",
        "GPU-hours the job held while stalled (TrainingJobStalled's condition, before its `for:`) in the "
        "range.",
        "h", "1 value",
        query(f"sum(sum_over_time(instance_training_job:gpus_stalled:count{js()}[$__range])) / {PER_HOUR} "
              "or vector(0)", "GPU-hours"),
        thresholds=steps((None, "green"), (1, "orange")), width=6)
    alerts = table_panel(
        "Job alerts firing",
        "TrainingJobStalled, TrainingJobStraggler and TrainingJobSlow for this job: the node, the GPU (a "
        "straggler, a stuck rank), the cause.",
        "none", "one row per firing job alert",
        instant("ALERTS" + js('alertstate="firing"', 'alertname=~"TrainingJob.*"'), "firing"),
        width=6, height=4, hide=("alertstate", "severity", "notify", "hpc_job"), thresholds=OK_RED)
    return [gpus, goodput, lost, alerts]


def activity() -> list[Any]:
    tensor = timeseries_panel(
        "Tensor activity per node",
        "Mean tensor pipe activity over the job's GPUs on each node (GPM, 2-minute rate). A stall is every "
        "line at 0 from the same minute; an NCCL hang too, though nvidia-smi's utilisation reads 100%.",
        "percentunit", "one series per node of the job",
        query(f"avg by (cluster, instance) (job_gpu:gpu_tensor_active:ratio{js()})", NODE),
        minimum=0, maximum=1)
    sm = timeseries_panel(
        "SM activity per node",
        "Mean SM activity over the job's GPUs on each node. An NCCL wait spins a few SMs (up to ~0.25) "
        "with no tensor activity.",
        "percentunit", "one series per node of the job",
        query(f"avg by (cluster, instance) (job_gpu:gpu_sm_active:ratio{js()})", NODE),
        minimum=0, maximum=1)
    spread = timeseries_panel(
        "GPUs furthest from the job's median",
        "Tensor activity of the GPUs most above and most below the job's median GPU: the straggler is the "
        "one that stays apart (it computes while the others wait).",
        "percentunit", f"top {K} and bottom {K} GPUs per point",
        query(f"topk({K}, job_gpu:gpu_tensor_active:ratio{js()})", GPU),
        query(f"bottomk({K}, job_gpu:gpu_tensor_active:ratio{js()})", GPU),
        minimum=0, maximum=1)
    clock = timeseries_panel(
        "Lowest SM clock per node",
        "The slowest SM clock among the job's GPUs on each node: a thermal or power straggler's clock drops "
        "below the others'.",
        "hertz", "one series per node of the job",
        query(f"min by (cluster, instance) (job_gpu:gpu_clock_sm:hertz{js()})", NODE))
    power = timeseries_panel(
        "Power per node",
        "Power drawn by the job's GPUs on each node.",
        "watt", "one series per node of the job",
        query(f"sum by (cluster, instance) ({_job_gpus(f'gpu_power_watts{sel()}')})", NODE))
    return [tensor, sm, spread, clock, power]


def faults() -> list[Any]:
    stragglers = table_panel(
        "Stragglers now",
        "GPUs and nodes of the job diverging from its median now (before TrainingJobStraggler's `for:`), "
        "with the node-level reason.",
        "none", "one row per diverging GPU or node reason",
        instant(f"job_gpu:straggler:diverged{js()}", "GPU diverges"),
        instant(f"instance_training_job:straggler:diverged{js()}", "node diverges"),
        width=12, height=8, gpu_link=True, hide=("hpc_job",))
    evidence = table_panel(
        "Faults and evidence on the job's nodes",
        "Hardware, network and storage evidence on the job's nodes now (lost GPUs, XIDs, NVLink down, EFA "
        "errors and retransmits, Lustre evictions, timeouts and latency): what names a stall's cause.",
        "none", "one row per node, GPU and reason",
        instant(_job_nodes(f"gpu:job_health_hardware:evidence{sel()}"), "hardware"),
        instant(_job_nodes(f"instance:job_health_network:evidence{sel()}"), "network"),
        instant(_job_nodes(f"instance:job_health_storage:evidence{sel()}"), "storage"),
        width=12, height=8, gpu_link=True)
    throttle = timeseries_panel(
        "Throttling and slowdowns",
        "The job's GPUs with a thermal or power clock event, a PCIe link below its maximum or replaying, or "
        "NVLink errors: a straggler's hardware reasons.",
        "none", "one series per GPU and reason",
        query(_job_gpus(f"gpu:job_health_slowdown:evidence{sel()}"), "{{instance}} GPU {{gpu}} {{reason}}"),
        bars=True)
    return [stragglers, evidence, throttle]


def io() -> list[Any]:
    efa = timeseries_panel(
        "EFA transmit per node",
        "Bytes per second sent over EFA by each node of the job. A node far below the others is a network "
        "straggler; every node flat at once is a stall.",
        "Bps", "one series per node of the job",
        query(f"instance_training_job:efa_tx_bytes:rate{js()}", NODE))
    read = timeseries_panel(
        "Lustre read per node",
        "FSx for Lustre read throughput of each node of the job (the data loader).",
        "Bps", "one series per node of the job",
        query(f"instance_training_job:lustre_client_read_bytes:rate{js()}", NODE))
    write = timeseries_panel(
        "Lustre write per node",
        "FSx for Lustre write throughput of each node of the job: checkpoints. Above 50 MB/s the quiet GPUs "
        "are not a stall.",
        "Bps", "one series per node of the job",
        query(_job_nodes(f"instance:lustre_client_write_bytes:rate{sel()}"), NODE))
    return [efa, read, write]


def baselines() -> list[Any]:
    """Each node's current value beside its own baseline in this job (docs/alerts.md, "Each rule's
    window and basis"): what the straggler, the slow job and the causes compare."""
    throughput = timeseries_panel(
        "Throughput per node against its baseline",
        "Tensor activity times SM clock over the node's GPUs (tensor-active cycles a second), and its own "
        "baseline: the median of the last hour in the job's usual phase, frozen while the job slows. "
        "TrainingJobSlow: every node under 0.8 of its baseline for 5 minutes.",
        "hertz", "two series per node of the job",
        query(f"instance_training_job:throughput:rate{js()}", NODE + " now"),
        query(f"instance_training_job:throughput:baseline{js()}", NODE + " baseline"))
    latency = timeseries_panel(
        "Lustre RPC round trip per node against its baseline",
        "Mean OST RPC round trip of each node (5 minutes) and its own baseline in this job: 5 times the "
        "baseline, or 5 times the job's median node, is storage evidence.",
        "s", "two series per node of the job",
        query(f"instance_training_job:lustre_client_rpc_wait_seconds:mean{js()}", NODE + " now"),
        query(f"instance_training_job:lustre_client_rpc_wait_seconds:baseline{js()}", NODE + " baseline"))
    retrans = timeseries_panel(
        "EFA retransmitted share per node against its baseline",
        "The share of each node's EFA packets sent again (5 minutes) and its own baseline: above 0.1% and "
        "5 times the baseline or the job's median node is network evidence.",
        "percentunit", "two series per node of the job",
        query(f"instance_training_job:efa_retrans_packets:ratio{js()}", NODE + " now"),
        query(f"instance_training_job:efa_retrans_packets:baseline{js()}", NODE + " baseline"))
    share = timeseries_panel(
        "GPUs whose share of the work moved most from their baseline",
        "Each GPU's tensor activity over the job's median GPU, against its own baseline in this job: a "
        "pipeline stage's or an expert's shape stays level; a straggler moves away (more than 0.25).",
        "none", f"top {K} GPUs per point",
        query(f"topk({K}, abs(job_gpu:gpu_tensor_active:share{js()} - on (cluster, instance, gpu, "
              f"training_job) job_gpu:gpu_tensor_active:share_baseline{js()}))", GPU + " moved"))
    return [throughput, latency, retrans, share]


def nccl() -> list[Any]:
    """NCCL's own view (rules/nccl.yml; the nccl collector, off by default): a separate row."""
    progress = timeseries_panel(
        "NCCL collective progress",
        "Collectives launched by the job's most and least advanced rank (NCCL's RAS, the querier's last "
        "reply). Flat lines: no rank launches (a stall); a gap between most and least that does not close: "
        "a rank behind. Empty where the nccl collector is off or RAS answers only in text (NCCL before "
        "2.28.7).",
        "none", "2 series per job",
        query(f"max by (which) (nccl_ras_job_ops_launched{sel()} * on (cluster, instance, gpu) group_left () "
              f"gpu:nccl_ras_job:info{js()})", "{{which}} advanced rank"),
    )
    rate = timeseries_panel(
        "Collectives launched per GPU",
        "Collectives per second each GPU's rank launches (NCCL's RAS; the GPUs of the nodes that query it). "
        "All at 0: the job launches nothing.",
        "ops", "one series per GPU of the job's querying node",
        query(_job_gpus(f"sum by (cluster, instance, gpu) (rate(nccl_ras_collectives_launched_total{sel()}"
                        f"[$__rate_interval]))"), GPU))
    behind = timeseries_panel(
        "Ranks behind (NCCL RAS)",
        "Operations each rank is behind the most advanced one in the same reply (at most 16 ranks, the most "
        "behind first), by the node IP, rank and GPU NCCL gives.",
        "none", "at most 16 series per job",
        query(f"max by (peer_ip, peer_rank, peer_gpu) (nccl_ras_rank_behind{sel()} "
              f"* on (cluster, instance, gpu) group_left () gpu:nccl_ras_job:info{js()})",
              "rank {{peer_rank}} on {{peer_ip}} GPU {{peer_gpu}}"),
        bars=True)
    culprit = table_panel(
        "The rank the job waits for",
        "The rank NCCL's RAS names now, which TrainingJobNcclStalled names once the job stops launching: "
        "the dead, unresponsive, failing or lagging rank with its node and GPU and the cause from that "
        "node's evidence; or a collective every rank launched (all counts equal). A rank one or two "
        "operations behind in a running job is normal.",
        "none", "one row per named rank",
        instant(f"instance_gpu_training_job:nccl_ras_culprit_cause:info{js()}", "rank"),
        instant(f"instance_training_job:nccl_ras_in_flight{js()}", "in flight"),
        width=24, height=6, gpu_link=True, hide=("hpc_job",))
    return [culprit, progress, behind, rate]


def _variables() -> list[Any]:
    cluster = (db.QueryVariable("cluster").label("Cluster").datasource(DS)
               .query("label_values(gpu_health_exporter_build_info, cluster)")
               .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
               .include_all(True).all_value(".*")
               .description("The cluster label Prometheus attaches at scrape time (docs/deploy.md)."))
    job = (db.QueryVariable("job").label("Job").datasource(DS)
           .query('label_values(instance_training_job:info{cluster=~"$cluster"}, training_job)')
           .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
           .description("The training job: a Slurm job id, a Kubernetes training job's name, or a pod's "
                        "name where no job names it (docs/alerts.md, Job health)."))
    instance = (db.QueryVariable("instance").label("Node").datasource(DS)
                .query('label_values(instance_training_job:info{cluster=~"$cluster", training_job=~"$job"}, '
                       'instance)')
                .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
                .multi(True).include_all(True).all_value(".+")
                .description("The job's nodes; All for the whole job."))
    datasource = db.DatasourceVariable("datasource").label("Data source").type("prometheus")
    return [datasource, cluster, job, instance]


def build() -> db.Dashboard:
    d = (db.Dashboard(TITLES["job"]).uid(UIDS["job"])
         .description("One training job across its nodes: progress, goodput, the straggler, faults, "
                      "throttling, EFA and Lustre (rules/job.yml).")
         .tags([TAG]).readonly().refresh("1m").time("now-6h", "now").timezone("utc")
         .tooltip(dm.DashboardCursorSync.CROSSHAIR)
         .link(db.DashboardLink("GPU health dashboards").type(dm.DashboardLinkType.DASHBOARDS)
               .tags([TAG]).as_dropdown(True).include_vars(True).keep_time(True)))
    for v in _variables():
        d = d.with_variable(v)
    rows = (("Job", overview()), ("Activity", activity()), ("Stragglers and faults", faults()),
            ("EFA and Lustre", io()), ("Against the job's own baseline", baselines()),
            ("NCCL collective progress", nccl()))
    for title, panels in rows:
        d = d.with_row(db.Row(title))
        for p in panels:
            d = d.with_panel(p)
    return d
