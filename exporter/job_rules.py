# ruff: noqa: E501  (PromQL templates: a rule reads best on one line, as in rules/*.yml)
"""Render the job-health rules (rules/job.yml): per-job recording rules, TrainingJobStalled and
TrainingJobStraggler (docs/alerts.md, "Job health").

    python -m exporter.job_rules                       # rewrite rules/job.yml in a checkout
    python -m exporter.job_rules --out FILE --window 20s --stall-for 30s --interval 5s ...

rules/job.yml is this module's output with the defaults (tests/test_job_rules.py checks it); the
windows, `for:` durations and thresholds are parameters so that a test, or a cluster whose
checkpoints run longer than the default `for:`, renders its own copy (the live test renders one
with second-long windows). The thresholds live here, once: the PromQL below reads the numbers the
settings give it, never a second copy.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from exporter import share
from exporter.rules import DEFAULT_RUNBOOK_BASE

# The identity of a job: a Slurm job (hpc_job, the same id on every node) or a Kubernetes training
# job (namespace + the name kube-state-metrics' labels or owner give it, else the pod). training_job
# is set for both (the Slurm job id, or the Kubernetes job's name), so every rule groups by one set.
JOB = "cluster, training_job, namespace, hpc_job"
NODE_JOB = "cluster, instance, training_job, namespace, hpc_job"
GPU_JOB = "cluster, instance, gpu, training_job, namespace, hpc_job"

# kube-state-metrics' kube_pod_labels labels that name a pod's training job, first match wins
# (docs/alerts.md, "Which job a pod belongs to"). kube-state-metrics exports a pod label only when
# its --metric-labels-allowlist names it; a label here that it does not export is simply absent.
# To add one (your operator's label), append its sanitised name here and re-render.
K8S_JOB_LABELS = (
    "label_training_kubeflow_org_job_name",  # Kubeflow training operator (PyTorchJob, MPIJob, ...)
    "label_jobset_sigs_k8s_io_jobset_name",  # JobSet (its child Jobs carry job-name as well)
    "label_leaderworkerset_sigs_k8s_io_name",  # LeaderWorkerSet
    "label_batch_kubernetes_io_job_name",  # batch/v1 Job, Kubernetes 1.27+
    "label_job_name",  # batch/v1 Job, the older label
)
# The job dashboard (dashboards/job.py), as a path on your Grafana: the alerts link it.
JOB_DASHBOARD = ("/d/gpu-health-job/?var-cluster={{ $labels.cluster }}&var-job={{ $labels.training_job }}"
                 "&var-instance=All")
# Owners that are not a training job: a pod they own is named by its labels or falls back to itself.
NOT_A_JOB_OWNER = "ReplicaSet|StatefulSet|DaemonSet|Node|<none>|"


@dataclass(frozen=True)
class Settings:
    """Everything a rendering can change. Durations are Prometheus durations."""

    interval: str = "1m"  # evaluation interval of the job-health groups
    window: str = "2m"  # rate window of activity, EFA and Lustre throughput
    evidence_window: str = "5m"  # window of the Lustre RPC latency that is evidence
    stall_for: str = "4m"
    straggler_for: str = "5m"
    keep_firing_for: str = "5m"  # an exporter restart (every series gone a scrape or two) must not resolve
    carry: str = "5m"  # how long a recorded state is carried across a gap (>= 2 intervals)
    # A GPU makes progress when its tensor pipes or its SMs are busy; a job is stalled when no GPU of
    # it does. An NCCL wait spins one block per channel (up to 32 of an H100's 132 SMs: SM activity
    # up to ~0.25, tensor ~0) while NVML's utilisation reads ~100%: below both, a stall.
    progress_tensor: float = 0.05
    progress_sm: float = 0.5
    # The job was productive (and can stall): its GPUs' mean tensor or SM activity this high.
    productive_tensor: float = 0.2
    productive_sm: float = 0.6
    memory_held: float = 0.1  # share of a GPU's memory in use while the job's processes live
    checkpoint_write_bytes: float = 50e6  # Lustre write throughput of a node writing a checkpoint
    straggler_activity: float = 0.15  # |tensor activity - the job's median| of a straggler GPU
    straggler_clock: float = 0.85  # SM clock under this share of the job's median
    straggler_share: float = 0.5  # EFA or Lustre throughput of a node under this share of the job's median
    straggler_min_read_bytes: float = 10e6  # the job's median node Lustre read rate must be at least this
    straggler_min_efa_bytes: float = 100e6  # ... and its median node EFA rate
    lustre_rpc_wait_s: float = 0.1
    runbook_base: str = DEFAULT_RUNBOOK_BASE


# The alerts of the other rule files that are evidence of a cause (pending or firing).
HARDWARE_ALERTS = ("GpuLost", "GpuCountBelowExpected", "GpuXidReplaceNow", "GpuXidRebootRequired", "GpuXidResetRequired",
                   "GpuXidUnknown", "GpuNvlinkDown", "GpuEccUncorrectedErrors", "GpuRowRemapFailure",
                   "GpuRecoveryActionRebootRequired", "GpuRecoveryActionRequired", "GpuFabricNotCompleted",
                   "NvswitchSxidReplaceNow", "NvswitchSxidRebootRequired")
SLOWDOWN_ALERTS = ("GpuHwSlowdownActive", "GpuPowerBrakeActive", "GpuTemperatureNearSlowdown",
                   "GpuPcieLinkWidthDegraded", "GpuPcieLinkGenerationDegraded", "GpuPcieReplayRateHigh",
                   "GpuNvlinkErrorsRising")
NETWORK_ALERTS = ("EfaDevicesBelowExpected", "EfaDeviceUnreadable", "EfaAdminCommandsNoCompletion",
                  "EfaUnresponsiveRemoteEvents", "EfaImpairedRemoteConnections", "EfaRetransmitTimeouts",
                  "EfaRetransmitRatioHigh", "EfaReceiveDrops", "EfaWorkRequestErrors")
STORAGE_ALERTS = ("LustreClientEvicted", "LustreRpcTimeouts", "LustreImportNotConnected", "LustreMountUnresponsive",
                  "LustreMetadataLatencyHigh", "LustreClientUnhealthy")


def _alerts(by: str, names: tuple[str, ...]) -> str:
    """The alerts `names` active now (pending or firing), one series per `by` and alert, `reason`
    the alert's name."""
    return (f'label_replace(\n  max by ({by}, alertname) (ALERTS{{alertname=~"{"|".join(names)}"}}),\n'
            '  "reason", "$1", "alertname", "(.+)"\n)')


def _num(x: float) -> str:
    return f"{x:g}"


def _k8s_pod_map() -> str:
    arms = []
    for lab in K8S_JOB_LABELS:
        arms.append(f'max by (cluster, namespace, pod, training_job) (\n'
                    f'  label_replace(kube_pod_labels{{{lab}!=""}}, "training_job", "$1", "{lab}", "(.+)")\n)')
    arms.append('max by (cluster, namespace, pod, training_job) (\n'
                f'  label_replace(kube_pod_owner{{owner_kind!~"{NOT_A_JOB_OWNER}"}}, "training_job", "$1", '
                '"owner_name", "(.+)")\n)')
    return "\nor on (cluster, namespace, pod)\n".join(arms)


def _indent(text: str, n: int) -> str:
    pad = " " * n
    return "\n".join(pad + line if line else line for line in text.splitlines())


def _rule(kind: str, name: str, expr: str, comment: str = "", extra: str = "") -> str:
    out = ""
    if comment:
        out += "".join(f"      # {c}\n" if c else "      #\n" for c in comment.splitlines())
    out += f"      - {kind}: {name}\n"
    if "\n" in expr.strip():
        out += "        expr: |\n" + _indent(expr.strip(), 10) + "\n"
    else:
        out += f"        expr: {expr.strip()}\n"
    out += extra
    return out


def render(s: Settings = Settings()) -> str:
    w, ew = s.window, s.evidence_window
    P = _num(s.progress_tensor)
    out = [HEADER.rstrip() + "\n", "groups:\n"]

    # --- group 1: which job holds each GPU, and the per-job activity -------------------------------
    out.append(f"""  # Which job holds each GPU, and what its GPUs do. Cheap on purpose (docs/performance.md, "Job
  # health rules"): one rate per GPU for SM and tensor activity, every other rule reads those or one
  # series per job.
  - name: job-health-map
    interval: {s.interval}
    rules:
""")
    r = []
    r.append(_rule("record", "k8s_pod:training_job:info", _k8s_pod_map(),
                   "A Kubernetes pod's training job: the first of the pod labels in K8S_JOB_LABELS\n"
                   "(exporter/job_rules.py) that kube-state-metrics exports, else its owner unless that is a\n"
                   "ReplicaSet, StatefulSet, DaemonSet or Node. Absent without kube-state-metrics."))
    r.append(_rule("record", "gpu:training_job:info", """
label_replace(max by (cluster, instance, gpu, hpc_job) (gpu_workload_info{hpc_job!=""}), "training_job", "$1", "hpc_job", "(.+)")
or
max by (cluster, instance, gpu, namespace, pod, training_job) (
  max by (cluster, instance, gpu, namespace, pod) (gpu_workload_info{pod!=""})
  * on (cluster, namespace, pod) group_left (training_job) k8s_pod:training_job:info
)
or on (cluster, instance, gpu, namespace, pod)
label_replace(max by (cluster, instance, gpu, namespace, pod) (gpu_workload_info{pod!=""}), "training_job", "$1", "pod", "(.+)")
""", "The job holding each GPU (value 1): a Slurm job by its id, a pod by its training job, else by\n"
                   "the pod's own name (no kube-state-metrics, or a pod of no job). A GPU two jobs share has two."))
    r.append(_rule("record", "instance_training_job:info", f"max by ({NODE_JOB}) (gpu:training_job:info)",
                   "The nodes of each job."))
    r.append(_rule("record", "gpu:gpu_tensor_active:ratio",
                   f"max by (cluster, instance, gpu) (rate(gpu_tensor_active_seconds_total[{w}]))",
                   "Activity over a short window: a stall must be seen within minutes."))
    r.append(_rule("record", "gpu:gpu_sm_active:ratio",
                   f"max by (cluster, instance, gpu) (rate(gpu_sm_active_seconds_total[{w}]))"))
    r.append(_rule("record", "job_gpu:gpu_tensor_active:ratio",
                   "gpu:training_job:info * on (cluster, instance, gpu) group_left () gpu:gpu_tensor_active:ratio"))
    r.append(_rule("record", "job_gpu:gpu_sm_active:ratio",
                   "gpu:training_job:info * on (cluster, instance, gpu) group_left () gpu:gpu_sm_active:ratio"))
    r.append(_rule("record", "job_gpu:gpu_clock_sm:hertz",
                   'gpu:training_job:info * on (cluster, instance, gpu) group_left ()\n'
                   '  max by (cluster, instance, gpu) (gpu_clock_hertz{clock="sm"})'))
    r.append(_rule("record", "training_job:gpus:count", f"count by ({JOB}) (gpu:training_job:info)",
                   "Per job: GPUs and nodes held, activity over its GPUs, memory, power."))
    r.append(_rule("record", "training_job:nodes:count", f"count by ({JOB}) (instance_training_job:info)"))
    for stat in ("avg", "min", "max"):
        r.append(_rule("record", f"training_job:gpu_tensor_active:{stat}",
                       f"{stat} by ({JOB}) (job_gpu:gpu_tensor_active:ratio)"))
    for stat in ("avg", "max"):
        r.append(_rule("record", f"training_job:gpu_sm_active:{stat}",
                       f"{stat} by ({JOB}) (job_gpu:gpu_sm_active:ratio)"))
    r.append(_rule("record", "training_job:gpu_memory_used:ratio_max", f"""
max by ({JOB}) (
  gpu:training_job:info * on (cluster, instance, gpu) group_left ()
    max by (cluster, instance, gpu) (gpu_memory_used_bytes / (gpu_memory_total_bytes > 0))
)"""))
    r.append(_rule("record", "training_job:gpu_power_watts:sum", f"""
sum by ({JOB}) (
  gpu:training_job:info * on (cluster, instance, gpu) group_left () max by (cluster, instance, gpu) (gpu_power_watts)
)"""))
    r.append(_rule("record", "instance_training_job:gpus:count", f"count by ({NODE_JOB}) (gpu:training_job:info)",
                   "Per node of the job (the dashboards' series carry `instance`): its GPUs there, and those\n"
                   "making progress now (a GPU with no activity series, a lost one, counts as not)."))
    r.append(_rule("record", "instance_training_job:gpus_active:count", f"""
sum by ({NODE_JOB}) (
    (job_gpu:gpu_tensor_active:ratio >= bool {P})
  + on ({GPU_JOB}, pod) (job_gpu:gpu_sm_active:ratio >= bool {_num(s.progress_sm)})
  > bool 0
)"""))
    r.append(_rule("record", "training_job:goodput:ratio", f"""
sum by ({JOB}) (instance_training_job:gpus_active:count)
/ on ({JOB}) training_job:gpus:count""",
                   "Goodput: the share of the job's GPUs making progress now; avg_over_time of it is the share\n"
                   "of the job's allocated GPU time that was active."))
    out.extend(r)

    # --- group 2: per-node evidence ------------------------------------------------------------------
    out.append(f"""
  # Evidence, per node or per GPU, that names a cause: each series carries a `reason`. Read by both
  # alerts; an evidence series exists only while it holds (cheap: mostly nothing).
  - name: job-health-evidence
    interval: {s.interval}
    rules:
""")
    r = []
    r.append(_rule("record", "gpu:job_health_hardware:evidence", _alerts("cluster, instance, gpu", HARDWARE_ALERTS),
                   "Evidence is the other rule files' alerts, pending or firing (ALERTS: a handful of series,\n"
                   "where reading the counters again cost the fleet's Prometheus more than every other group:\n"
                   "docs/performance.md), reason = the alert. A GPU fault that stops a job (a node-level one,\n"
                   "GpuCountBelowExpected, has gpu=\"\").",))
    r.append(_rule("record", "gpu:job_health_slowdown:evidence", _alerts("cluster, instance, gpu", SLOWDOWN_ALERTS),
                   "What slows one GPU (a straggler's hardware reasons)."))
    r.append(_rule("record", "instance:job_health_network:evidence", _alerts("cluster, instance", NETWORK_ALERTS),
                   "EFA on the node."))
    r.append(_rule("record", "instance:job_health_storage:evidence", _alerts("cluster, instance", STORAGE_ALERTS) + f"""
or
label_replace(
  sum by (cluster, instance) (rate(lustre_client_rpc_wait_seconds_total{{component="osc"}}[{ew}]))
    / (sum by (cluster, instance) (rate(lustre_client_rpcs_total{{component="osc"}}[{ew}])) > 0)
  > {_num(s.lustre_rpc_wait_s)},
  "reason", "lustre_latency", "", ""
)""", "FSx for Lustre on the node: its alerts, or a mean OST RPC round trip above 100 ms (no alert\n"
                   "reads that: the data loader's reads wait on it)."))
    r.append(_rule("record", "instance:lustre_client_write_bytes:rate",
                   f"sum by (cluster, instance) (rate(lustre_client_write_bytes_total[{w}]))",
                   "Lustre and EFA throughput per node: checkpoints, and a straggler's lower rate."))
    r.append(_rule("record", "instance:lustre_client_read_bytes:rate",
                   f"sum by (cluster, instance) (rate(lustre_client_read_bytes_total[{w}]))"))
    out.extend(r)

    # --- group 3: the stall --------------------------------------------------------------------------
    T, S = f"{_num(s.progress_tensor)}", f"{_num(s.progress_sm)}"
    out.append(f"""
  # TrainingJobStalled (docs/alerts.md, "Job health"): a job that was productive makes no progress
  # on any GPU while it still holds them, and it is not writing a checkpoint.
  - name: job-health-stall
    interval: {s.interval}
    rules:
""")
    r = []
    r.append(_rule("record", "training_job:last_progress_timestamp_seconds", f"""
max by ({JOB}) (
    time() + 0 * (training_job:gpu_tensor_active:avg >= {_num(s.productive_tensor)})
  or
    time() + 0 * (training_job:gpu_sm_active:avg >= {_num(s.productive_sm)})
)
or on ({JOB})
(last_over_time(training_job:last_progress_timestamp_seconds[{s.carry}]) and on ({JOB}) training_job:gpus:count)""",
                   "When the job was last productive (its GPUs' mean activity at a training level), carried while\n"
                   "it holds GPUs; gone once the job has held none for a while, so a requeued job starts afresh.\n"
                   "A job that never was productive (start-up) has none and cannot stall."))
    r.append(_rule("record", "training_job:gpus_stalled:count", f"""
training_job:gpus:count
  and on ({JOB}) (training_job:gpu_tensor_active:max < {T})
  and on ({JOB}) (training_job:gpu_sm_active:max < {S})
  and on ({JOB}) (training_job:gpu_memory_used:ratio_max > {_num(s.memory_held)})
  and on ({JOB}) training_job:last_progress_timestamp_seconds
  unless on ({JOB}) (
    instance_training_job:info
      and on (cluster, instance) (instance:lustre_client_write_bytes:rate > {_num(s.checkpoint_write_bytes)})
  )""", "A stall now (before `for`; value: the GPUs it holds): no GPU of the job makes progress, its\n"
                   "processes still hold GPU memory (they exited at the job's end), it was productive since it\n"
                   "started, and none of its nodes is writing a checkpoint to Lustre. GPU-hours lost to stalls:\n"
                   "sum_over_time of this series times the interval."))
    r.append(_rule("record", "instance_training_job:gpus_stalled:count",
                   f"instance_training_job:gpus:count and on ({JOB}) training_job:gpus_stalled:count",
                   "The same per node (with `instance`, for the dashboards)."))
    ev = {
        "hardware": f"""max by ({NODE_JOB}) (gpu:training_job:info and on (cluster, instance, gpu) gpu:job_health_hardware:evidence)
or
(
  instance_training_job:info
    and on (cluster, instance) (gpu:job_health_hardware:evidence unless on (cluster, instance, gpu) gpu:training_job:info)
)""",
        "network": "instance_training_job:info and on (cluster, instance) instance:job_health_network:evidence",
        "storage": "instance_training_job:info and on (cluster, instance) instance:job_health_storage:evidence",
    }
    arms = [f'label_replace(\n{_indent(e, 2)},\n  "cause", "{c}", "", ""\n)' for c, e in ev.items()]
    r.append(_rule("record", "instance_training_job:job_health_evidence", "\nor\n".join(arms),
                   "Each node of each job with evidence of a cause (hardware: a fault on one of the job's GPUs,\n"
                   "or on a GPU of the node no job holds; network and storage: the node's own)."))
    fresh = [f'(instance_training_job:job_health_evidence{{cause="{c}"}} and on ({JOB}) training_job:gpus_stalled:count)'
             for c in ev]
    app = ('label_replace(instance_training_job:info and on (' + JOB + ') training_job:gpus_stalled:count, '
           '"cause", "application", "", "")')
    r.append(_rule("record", "instance_training_job:stall_cause", f"""
(
  last_over_time(instance_training_job:stall_cause{{cause!="application"}}[{s.carry}])
    and on ({JOB}) training_job:gpus_stalled:count
)
or on ({JOB})
""" + f"\nor on ({JOB})\n".join(fresh + [app]),
                   "The cause of a stalled job and the nodes it names: hardware before network before storage;\n"
                   "else application on every node of the job. An infrastructure cause, once named, is kept while\n"
                   "the stall lasts (its counters stop moving once the job has stopped)."))
    # The evidence of the last hour: an infrastructure cause is kept while the stall lasts, its
    # counters do not keep moving.
    alert_desc_evidence = (
        '{{ range printf "max by (reason, gpu) (last_over_time(gpu:job_health_hardware:evidence{cluster=\'%s\','
        'instance=\'%s\'}[1h]))" $labels.cluster $labels.instance | query | sortByLabel \"reason\" }}'
        '{{ .Labels.reason }} on GPU {{ .Labels.gpu }}; {{ end }}'
        '{{ range printf "max by (reason) (last_over_time(instance:job_health_network:evidence{cluster=\'%s\','
        'instance=\'%s\'}[1h]))" $labels.cluster $labels.instance | query | sortByLabel \"reason\" }}'
        '{{ .Labels.reason }}; {{ end }}'
        '{{ range printf "max by (reason) (last_over_time(instance:job_health_storage:evidence{cluster=\'%s\','
        'instance=\'%s\'}[1h]))" $labels.cluster $labels.instance | query | sortByLabel \"reason\" }}'
        '{{ .Labels.reason }}; {{ end }}')
    r.append(f"""      - alert: TrainingJobStalled
        expr: |
          max by ({NODE_JOB}, cause) (instance_training_job:stall_cause)
            * on ({JOB}) group_left () training_job:gpus_stalled:count
        for: {s.stall_for}
        keep_firing_for: {s.keep_firing_for}  # an exporter restart must not resolve and reopen it
        labels:
          severity: warning
          notify: job_owner
        annotations:
          summary: A training job has stopped making progress on all its GPUs.
          description: >-
            Job {{{{ $labels.training_job }}}}{{{{ if $labels.namespace }}}} (namespace {{{{ $labels.namespace }}}}){{{{ end }}}}
            holds {{{{ $value }}}} GPU(s) and none has made progress (tensor activity under {_num(s.progress_tensor)}, SM
            activity under {_num(s.progress_sm)}) for {s.stall_for}, while it is not writing a checkpoint. Cause:
            {{{{ $labels.cause }}}}{{{{ if eq $labels.cause "application" }}}} (no hardware, network or storage signal on
            any of its nodes; {{{{ $labels.instance }}}} is one of them: a deadlock, a data-loader bug or an NCCL hang with
            healthy links, for the job's owner){{{{ else }}}}, on {{{{ $labels.instance }}}}: {alert_desc_evidence}{{{{ end }}}}
            Job dashboard: {JOB_DASHBOARD}
          runbook_url: {s.runbook_base}#trainingjobstalled
""")
    out.extend(r)

    # --- group 4: the straggler ----------------------------------------------------------------------
    A, C, SH = _num(s.straggler_activity), _num(s.straggler_clock), _num(s.straggler_share)
    out.append(f"""
  # TrainingJobStraggler (docs/alerts.md, "Job health"): one GPU or node of a running job diverges
  # from the job's median. In synchronous data-parallel training the slow rank keeps computing while
  # the others wait in collectives: its activity diverges, whichever way.
  - name: job-health-straggler
    interval: {s.interval}
    rules:
""")
    r = []
    r.append(_rule("record", "training_job:running", f"""
training_job:gpus:count >= 3
  and on ({JOB}) (
      training_job:gpu_tensor_active:avg >= {T}
    or on ({JOB})
      training_job:gpu_sm_active:avg >= {S}
  )""", "A job of three GPUs or more making progress (a median of two is no majority)."))
    r.append(_rule("record", "training_job:gpu_tensor_active:median",
                   f"quantile by ({JOB}) (0.5, job_gpu:gpu_tensor_active:ratio)"))
    r.append(_rule("record", "training_job:gpu_clock_sm:median", f"quantile by ({JOB}) (0.5, job_gpu:gpu_clock_sm:hertz)"))
    r.append(_rule("record", "job_gpu:gpu_clock_sm:below_median",
                   f"job_gpu:gpu_clock_sm:hertz < on ({JOB}) group_left () ({C} * training_job:gpu_clock_sm:median)"))
    r.append(_rule("record", "job_gpu:straggler:diverged", f"""
max by ({GPU_JOB}) (
    abs(job_gpu:gpu_tensor_active:ratio - on ({JOB}) group_left () training_job:gpu_tensor_active:median) > {A}
  or
    job_gpu:gpu_clock_sm:below_median
)
and on ({JOB}) training_job:running""",
                   f"A GPU whose tensor activity is more than {A} from the job's median, or whose SM clock is under\n"
                   f"{C} of the job's median."))
    for what, metric, floor in (("efa_tx_bytes", "instance:efa_tx_bytes:rate5m", s.straggler_min_efa_bytes,
                                         ),
                                        ("lustre_client_read_bytes", "instance:lustre_client_read_bytes:rate",
                                         s.straggler_min_read_bytes)):
        r.append(_rule("record", f"instance_training_job:{what}:rate",
                       f"instance_training_job:info * on (cluster, instance) group_left () {metric}"))
        r.append(_rule("record", f"training_job:{what}:median",
                       f"quantile by ({JOB}) (0.5, instance_training_job:{what}:rate) >= {_num(floor)}"))
    node_arms = []
    for what, reason in (("efa_tx_bytes", "efa_traffic_low"), ("lustre_client_read_bytes", "lustre_read_low")):
        node_arms.append(f"""label_replace(
  instance_training_job:{what}:rate
    < on ({JOB}) group_left () ({SH} * training_job:{what}:median),
  "reason", "{reason}", "", ""
)""")
    node_arms.append('label_replace(instance_training_job:info and on (cluster, instance) '
                     'instance:job_health_network:evidence, "reason", "efa_errors", "", "")')
    node_arms.append('label_replace(instance_training_job:info and on (cluster, instance) '
                     'instance:job_health_storage:evidence, "reason", "lustre_errors", "", "")')
    r.append(_rule("record", "instance_training_job:straggler:diverged",
                   "(\n" + _indent("\nor\n".join(node_arms), 2) + f"\n)\nand on ({JOB}) training_job:running",
                   f"A node of a running job whose EFA or Lustre read throughput is under {SH} of the job's median\n"
                   "node, or that shows EFA or Lustre errors."))
    gpu_arms = [
        ("hardware", "job_gpu:straggler:diverged and on (cluster, instance, gpu) "
                     "(gpu:job_health_slowdown:evidence or gpu:job_health_hardware:evidence or job_gpu:gpu_clock_sm:below_median)"),
        ("network", 'job_gpu:straggler:diverged and on (cluster, instance) instance:job_health_network:evidence'),
        ("storage", 'job_gpu:straggler:diverged and on (cluster, instance) '
                    '(instance:job_health_storage:evidence or instance_training_job:straggler:diverged{reason="lustre_read_low"})'),
        ("application", "job_gpu:straggler:diverged"),
    ]
    gpu_expr = f"\nor on ({GPU_JOB})\n".join(
        f'label_replace(\n  max by ({GPU_JOB}) (\n    {e}\n  ),\n  "cause", "{c}", "", ""\n)' for c, e in gpu_arms)
    node_expr = f"\nor on ({NODE_JOB})\n".join([
        f'label_replace(max by ({NODE_JOB}) (instance_training_job:straggler:diverged{{reason=~"efa_.*"}}), '
        '"cause", "network", "", "")',
        f'label_replace(max by ({NODE_JOB}) (instance_training_job:straggler:diverged{{reason=~"lustre_.*"}}), '
        '"cause", "storage", "", "")',
    ])
    desc_hw = ('{{ range printf "gpu:job_health_slowdown:evidence{cluster=\'%s\',instance=\'%s\',gpu=\'%s\'}" $labels.cluster $labels.instance '
               '$labels.gpu | query | sortByLabel \"reason\" }}{{ .Labels.reason }}; {{ end }}'
               '{{ range printf "gpu:job_health_hardware:evidence{cluster=\'%s\',instance=\'%s\',gpu=\'%s\'}" $labels.cluster $labels.instance '
               '$labels.gpu | query | sortByLabel \"reason\" }}{{ .Labels.reason }}; {{ end }}'
               '{{ range printf "job_gpu:gpu_clock_sm:below_median{cluster=\'%s\',instance=\'%s\',gpu=\'%s\'}" $labels.cluster $labels.instance '
               '$labels.gpu | query | sortByLabel \"reason\" }}SM clock {{ .Value | humanize }}Hz, under the job\'s median; {{ end }}')
    desc_node = ('{{ range printf "instance:job_health_network:evidence{cluster=\'%s\',instance=\'%s\'}" $labels.cluster $labels.instance | query | sortByLabel \"reason\" }}'
                 '{{ .Labels.reason }}; {{ end }}'
                 '{{ range printf "instance:job_health_storage:evidence{cluster=\'%s\',instance=\'%s\'}" $labels.cluster $labels.instance | query | sortByLabel \"reason\" }}'
                 '{{ .Labels.reason }}; {{ end }}'
                 '{{ range printf "instance_training_job:straggler:diverged{cluster=\'%s\',instance=\'%s\',training_job=\'%s\'}" '
                 '$labels.cluster $labels.instance $labels.training_job | query | sortByLabel \"reason\" }}{{ .Labels.reason }}; {{ end }}')
    r.append(f"""      - alert: TrainingJobStraggler
        expr: |
{_indent("(" + chr(10) + _indent(gpu_expr, 2) + chr(10) + ")" + chr(10) + f"or on ({NODE_JOB})" + chr(10)
         + "(" + chr(10) + _indent(node_expr, 2) + chr(10) + ")", 10)}
        for: {s.straggler_for}
        keep_firing_for: {s.keep_firing_for}  # an exporter restart must not resolve and reopen it
        labels:
          severity: warning
          notify: job_owner
        annotations:
          summary: One GPU or node of a training job is persistently slower than the rest.
          description: >-
            Job {{{{ $labels.training_job }}}}{{{{ if $labels.namespace }}}} (namespace {{{{ $labels.namespace }}}}){{{{ end }}}}
            has a straggler on {{{{ $labels.instance }}}}{{{{ if $labels.gpu }}}} GPU {{{{ $labels.gpu }}}}{{{{ end }}}} for
            {s.straggler_for}: it diverges from the job's median GPU or node. Likely cause: {{{{ $labels.cause }}}}.
            Evidence: {desc_hw}{desc_node}{{{{ if eq $labels.cause "application" }}}}none from the hardware,
            EFA or Lustre (uneven work, a data skew: the job's owner's){{{{ end }}}}
            Job dashboard: {JOB_DASHBOARD}
          runbook_url: {s.runbook_base}#trainingjobstraggler
""")
    out.extend(r)
    return "".join(out)


HEADER = """\
# Job health: per-job recording rules, TrainingJobStalled and TrainingJobStraggler (docs/alerts.md,
# "Job health"). GENERATED by `python -m exporter.job_rules` from exporter/job_rules.py: edit that
# and re-render (the windows, `for:` durations and thresholds are its parameters). A job is a Slurm
# job (hpc_job) or a Kubernetes training job (namespace, training_job) across its nodes. Both alerts
# carry `cause` (hardware, network, storage, application) and `notify: job_owner`: Alertmanager
# sends them to the job's owner, not the hardware pager (deploy/alertmanager). Tests:
# tests/rules/job*.test.yml, tests/test_job_health_live.py.
"""

RULES_FILE = share.root() / "rules" / "job.yml"


def _duration(v: str) -> str:
    if not re.fullmatch(r"(\d+[smh])+", v):
        raise argparse.ArgumentTypeError(f"{v!r} is not a Prometheus duration such as 30s, 2m or 1h")
    return v


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m exporter.job_rules", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(RULES_FILE), metavar="FILE", help="where to write (default: %(default)s)")
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "str":
            conv: Callable[[str], str | float] = str if f.name == "runbook_base" else _duration
        else:
            conv = float if f.type == "float" else int
        p.add_argument(flag, type=conv, default=f.default, help=f"(default: {f.default})")
    args = p.parse_args(argv)
    settings = Settings(**{f.name: getattr(args, f.name) for f in fields(Settings)})
    Path(args.out).write_text(render(settings))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
