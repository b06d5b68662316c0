# ruff: noqa: E501  (PromQL templates: a rule reads best on one line, as in rules/*.yml)
"""Render the job-health rules (rules/job.yml): per-job recording rules, TrainingJobStalled,
TrainingJobStraggler and TrainingJobSlow (docs/alerts.md, "Job health").

    python -m exporter.tools.job_rules                       # rewrite rules/job.yml in a checkout
    python -m exporter.tools.job_rules --out FILE --window 20s --stall-for 30s --interval 5s ...

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
    """Everything a rendering can change. Durations are Prometheus durations. Each threshold's basis
    is in docs/alerts.md ("Job health", "Each rule's window and basis"); none was measured on a GPU."""

    interval: str = "1m"  # evaluation interval of the job-health groups
    # ... but of the group of the hour-long baselines per GPU and node (job-health-history): a median
    # of an hour moves slowly, and reading an hour of every GPU's series is the costliest query here.
    baseline_interval: str = "5m"
    window: str = "2m"  # rate window of activity, EFA and Lustre throughput
    evidence_window: str = "5m"  # window of the Lustre RPC latency and EFA retransmits that are evidence
    stall_for: str = "4m"
    straggler_for: str = "5m"
    slow_for: str = "5m"
    keep_firing_for: str = "5m"  # an exporter restart (every series gone a scrape or two) must not resolve
    carry: str = "5m"  # how long a recorded state is carried across a gap (>= 2 intervals)
    # A baseline is the median of the last `baseline_window` of a series recorded while the job runs,
    # once it has `baseline_samples` samples (a new job, or a new node of it, has none: only its
    # peers and the hardware's evidence judge it until then); it is frozen while the change it
    # measures lasts, so a long fault does not become the norm.
    baseline_window: str = "1h"
    baseline_samples: int = 10
    # Progress, per GPU, from each GPM activity signal (docs/alerts.md, "Which signals count"): the
    # tensor pipes (a step's matmuls), DRAM bandwidth (a memory-bound phase: autoregressive decode,
    # SM ~0.4, tensor ~0.03, DRAM ~0.75), SM activity (any kernel on most SMs). An NCCL wait spins one
    # block per channel (up to 32 of an H100's 132 SMs: SM activity up to ~0.25), tensor ~0, DRAM ~0
    # (it polls a flag), while NVML's utilisation reads ~100%: below all three.
    progress_tensor: float = 0.05
    progress_sm: float = 0.5
    progress_dram: float = 0.2
    # A stall despite busy GPUs: no GPU does tensor or DRAM work, and the GPUs busy on their SMs are
    # at most this share of the job's (a rank stuck in a kernel while the others spin in NCCL).
    busy_share: float = 0.5
    # The job was productive (and can stall): its GPUs' mean tensor, SM or DRAM activity this high.
    productive_tensor: float = 0.2
    productive_sm: float = 0.6
    productive_dram: float = 0.4
    memory_held: float = 0.1  # share of a GPU's memory in use while the job's processes live
    checkpoint_write_bytes: float = 50e6  # Lustre write throughput of a node writing a checkpoint
    # Storage and network evidence: departures from the node's own baseline or the job's median node.
    lustre_latency_factor: float = 5.0  # mean OST RPC round trip this many times its baseline / the median
    efa_retrans_factor: float = 5.0  # retransmitted share this many times its baseline / the median ...
    efa_retrans_floor: float = 0.001  # ... and at least this share of the packets sent
    straggler_activity: float = 0.15  # |tensor activity - the job's median| of a GPU with hardware evidence
    straggler_clock: float = 0.85  # SM clock under this share of the job's median
    straggler_share: float = 0.6  # EFA or Lustre throughput of a node under this share of the job's median
    straggler_min_read_bytes: float = 10e6  # the job's median node Lustre read rate must be at least this
    straggler_min_efa_bytes: float = 100e6  # ... and its median node EFA rate
    # A change: a GPU's tensor activity relative to the job's median (a node's EFA or Lustre share)
    # moved this far from its own baseline.
    straggler_change: float = 0.25
    # The job is in its usual phase when its tensor/SM activity ratio is within this of its baseline.
    phase_tolerance: float = 0.25
    slow_ratio: float = 0.8  # a job that slows: throughput under this share of its baseline on every node
    slow_clock: float = 0.9  # a node's mean SM clock under this share of its baseline: thermal or power
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
CAUSES = ("hardware", "network", "storage")  # in this order; else application
# The NCCL-RAS rules (rules/nccl.yml, issue 44) record this for a job whose ranks RAS reaches: its
# own alert names the rank the others wait for, so TrainingJobStalled stays quiet for that job.
NCCL_RAS_ANSWERING = "training_job:nccl_ras_answering"


def _alerts(by: str, names: tuple[str, ...]) -> str:
    """The alerts `names` active now (pending or firing), one series per `by` and alert, `reason`
    the alert's name."""
    return (f'label_replace(\n  max by ({by}, alertname) (ALERTS{{alertname=~"{"|".join(names)}"}}),\n'
            '  "reason", "$1", "alertname", "(.+)"\n)')


def _checkpointing(s: Settings) -> str:
    """The nodes of each job writing a checkpoint to Lustre now."""
    return ("(\n    instance_training_job:info\n      and on (cluster, instance) "
            f"(instance:lustre_client_write_bytes:rate > {_num(s.checkpoint_write_bytes)})\n  )")


def _num(x: float) -> str:
    return f"{x:g}"


def _reason(expr: str, reason: str, label: str = "reason") -> str:
    return f'label_replace(\n{_indent(expr.strip(), 2)},\n  "{label}", "{reason}", "", ""\n)'


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


def _group(name: str, s: Settings, comment: str, interval: str = "") -> str:
    lines = "".join(f"  # {c}\n" if c else "  #\n" for c in comment.splitlines())
    return f"\n{lines}  - name: {name}\n    interval: {interval or s.interval}\n    rules:\n"


def _baseline(name: str, value: str, by: str, frozen_while: str, s: Settings, comment: str = "",
              frozen_on: str = "", carry: str = "") -> str:
    """Record `name`: the median of `value` over the baseline window once it has enough samples,
    held at its last value while `frozen_while` (a recorded series, the previous evaluation's; matched
    on `frozen_on`, default `by`) lasts (`carry`: over how long its last value is looked for)."""
    return _rule("record", name, f"""
(last_over_time({name}[{carry or s.carry}]) and on ({frozen_on or by}) {frozen_while})
or on ({by})
(
  quantile_over_time(0.5, {value}[{s.baseline_window}])
    and on ({by}) (count_over_time({value}[{s.baseline_window}]) >= {s.baseline_samples})
)""", comment)


def _held(name: str, s: Settings) -> str:
    """A baseline of job-health-history as its readers see it: its last value within two of its
    intervals (an instant read would lose it whenever its interval reaches the 5-minute lookback)."""
    return f"last_over_time({name}[{_double(s.baseline_interval)}])"


def _history_group(s: Settings) -> str:
    """The hour-long baselines of each GPU and node of a job, at their own interval."""
    carry = _double(s.baseline_interval)
    r = [_group("job-health-history", s,
                "Each GPU's and node's own baseline in this job: the median of its last hour, once it has\n"
                f"enough samples, frozen while it departs (docs/alerts.md). Every {s.baseline_interval}: an hour's median moves\n"
                "slowly, and reading an hour of every GPU is the costliest query of the job rules; the readers\n"
                "take its last value.", s.baseline_interval)]
    r.append(_baseline("instance_training_job:lustre_client_rpc_wait_seconds:baseline",
                       "instance_training_job:lustre_client_rpc_wait_seconds:mean", NODE_JOB,
                       'instance_training_job:job_health_storage:evidence{reason="lustre_latency_up"}', s,
                       "Storage and network: the node's mean OST RPC round trip and EFA retransmitted share.",
                       carry=carry))
    r.append(_baseline("instance_training_job:efa_retrans_packets:baseline",
                       "instance_training_job:efa_retrans_packets:ratio", NODE_JOB,
                       'instance_training_job:job_health_network:evidence{reason="efa_retransmits_up"}', s, carry=carry))
    first = True
    for prefix, by in (("job_gpu:gpu_tensor_active", GPU_JOB), ("instance_training_job:efa_tx_bytes", NODE_JOB),
                       ("instance_training_job:lustre_client_read_bytes", NODE_JOB)):
        r.append(_baseline(f"{prefix}:share_baseline", f"{prefix}:share", by, f"{prefix}:share_changed", s,
                           "Shares of the job's median GPU or node (the straggler)." if first else "", carry=carry))
        first = False
    for name, value, comment in (
            ("throughput", "throughput:rate", "Throughput and SM clock per node (the slow job), frozen while the job slows."),
            ("gpu_clock_sm", "gpu_clock_sm:avg", "")):
        r.append(_baseline(f"instance_training_job:{name}:baseline", f"instance_training_job:{value}", NODE_JOB,
                           "training_job:slowing", s, comment, frozen_on=JOB, carry=carry))
    return "".join(r)


def _evidence_desc(scope: str) -> str:
    """Alert template: the reasons of the last hour on the alert's node (`scope`: its selector)."""
    out = []
    for series, by in (("gpu:job_health_hardware:evidence", "reason, gpu"),
                       ("instance:job_health_network:evidence", "reason"),
                       ("instance_training_job:job_health_network:evidence", "reason"),
                       ("instance:job_health_storage:evidence", "reason"),
                       ("instance_training_job:job_health_storage:evidence", "reason")):
        tail = " on GPU {{ .Labels.gpu }}" if "gpu" in by else ""
        out.append(f'{{{{ range printf "max by ({by}) (last_over_time({series}{{{scope}}}[1h]))" '
                   '$labels.cluster $labels.instance | query | sortByLabel "reason" }}'
                   f'{{{{ .Labels.reason }}}}{tail}; {{{{ end }}}}')
    return "".join(out)


NODE_SCOPE = "cluster='%s',instance='%s'"


def render(s: Settings = Settings()) -> str:
    out = [HEADER.rstrip() + "\n", "groups:"]
    out += [_map_group(s), _evidence_group(s), _stall_group(s), _straggler_group(s), _slow_group(s),
            _history_group(s)]
    return "".join(out)


def _map_group(s: Settings) -> str:
    w = s.window
    T, S, D = _num(s.progress_tensor), _num(s.progress_sm), _num(s.progress_dram)
    out = [_group("job-health-map", s,
                  "Which job holds each GPU, and what its GPUs do. Cheap on purpose (docs/performance.md, \"The\n"
                  "whole rule set at 2,000 nodes\"): one rate per GPU of a job for SM, tensor and DRAM activity,\n"
                  "every other rule reads those or one series per job.")]
    r = out
    r.append(_rule("record", "k8s_pod:training_job:info", _k8s_pod_map(),
                   "A Kubernetes pod's training job: the first of the pod labels in K8S_JOB_LABELS\n"
                   "(exporter/tools/job_rules.py) that kube-state-metrics exports, else its owner unless that is a\n"
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
    first = True
    for what in ("tensor", "sm", "dram"):
        r.append(_rule("record", f"job_gpu:gpu_{what}_active:ratio",
                       "gpu:training_job:info * on (cluster, instance, gpu) group_left ()\n"
                       f"  max by (cluster, instance, gpu) (rate(gpu_{what}_active_seconds_total[{w}]))",
                       "Activity of each GPU of a job over a short window (a stall must be seen within minutes),\n"
                       "read from the counters in the join: nothing reads a GPU's activity without its job." if first else ""))
        first = False
    r.append(_rule("record", "job_gpu:gpu_clock_sm:hertz",
                   'gpu:training_job:info * on (cluster, instance, gpu) group_left ()\n'
                   '  max by (cluster, instance, gpu) (gpu_clock_hertz{clock="sm"})'))
    r.append(_group("job-health-jobs", s,
                    "Per job: GPUs and nodes held, activity over its GPUs, memory (the map group's per-GPU\n"
                    "series, one evaluation behind at most)."))
    r.append(_rule("record", "training_job:gpus:count", f"count by ({JOB}) (gpu:training_job:info)"))
    r.append(_rule("record", "training_job:nodes:count", f"count by ({JOB}) (instance_training_job:info)"))
    for what, stats in (("tensor", ("avg", "max")), ("sm", ("avg",)), ("dram", ("avg", "max"))):
        for stat in stats:
            r.append(_rule("record", f"training_job:gpu_{what}_active:{stat}",
                           f"{stat} by ({JOB}) (job_gpu:gpu_{what}_active:ratio)"))
    r.append(_rule("record", "training_job:gpu_memory_used:ratio_max_of_min", f"""
max by ({JOB}) (
  gpu:training_job:info * on (cluster, instance, gpu) group_left ()
    max by (cluster, instance, gpu) (min_over_time(gpu_memory_used_bytes[{w}]) / (gpu_memory_total_bytes > 0))
)""", "The least memory each GPU of the job held in the rate window, its largest over the job's GPUs:\n"
                   "low when every process of the job let go of its GPU within the window, however briefly and\n"
                   "not all at once (the job ended, or restarted: a requeue, TorchElastic restarting its workers);\n"
                   "high while they hold it (a stall holds its memory)."))
    r.append(_rule("record", "instance_training_job:gpus:count", f"count by ({NODE_JOB}) (gpu:training_job:info)",
                   "Per node of the job (the dashboards' series carry `instance`): its GPUs there, and those\n"
                   "making progress now (a GPU with no activity series, a lost one, counts as not)."))
    r.append(_rule("record", "instance_training_job:gpus_active:count", f"""
sum by ({NODE_JOB}) (
    (job_gpu:gpu_tensor_active:ratio >= bool {T})
  + on ({GPU_JOB}, pod) (job_gpu:gpu_sm_active:ratio >= bool {S})
  + on ({GPU_JOB}, pod) (job_gpu:gpu_dram_active:ratio >= bool {D})
  > bool 0
)"""))
    r.append(_rule("record", "training_job:goodput:ratio", f"""
sum by ({JOB}) (instance_training_job:gpus_active:count)
/ on ({JOB}) training_job:gpus:count""",
                   "Goodput: the share of the job's GPUs making progress now; avg_over_time of it is the share\n"
                   "of the job's allocated GPU time that was active."))
    return "".join(out)


def _evidence_group(s: Settings) -> str:
    w, ew = s.window, s.evidence_window
    out = [_group("job-health-evidence", s,
                  "Evidence, per node or per GPU, that names a cause: each series carries a `reason`. Read by\n"
                  "every alert; an evidence series exists only while it holds (cheap: mostly nothing).")]
    r = out
    r.append(_rule("record", "gpu:job_health_hardware:evidence", _alerts("cluster, instance, gpu", HARDWARE_ALERTS),
                   "Evidence is the other rule files' alerts, pending or firing (ALERTS: a handful of series,\n"
                   "where reading the counters again cost the fleet's Prometheus more than every other group:\n"
                   "docs/performance.md), reason = the alert. A GPU fault that stops a job (a node-level one,\n"
                   "GpuCountBelowExpected, has gpu=\"\")."))
    r.append(_rule("record", "gpu:job_health_slowdown:evidence", _alerts("cluster, instance, gpu", SLOWDOWN_ALERTS),
                   "What slows one GPU (a straggler's hardware reasons)."))
    r.append(_rule("record", "instance:job_health_network:evidence", _alerts("cluster, instance", NETWORK_ALERTS),
                   "EFA on the node."))
    r.append(_rule("record", "instance:job_health_storage:evidence", _alerts("cluster, instance", STORAGE_ALERTS),
                   "FSx for Lustre on the node. The RPC latency, which no alert judges, is judged against its\n"
                   "own baseline and the job's other nodes below (instance_training_job:job_health_storage:evidence)."))
    r.append(_rule("record", "instance:lustre_client_write_bytes:rate",
                   f"sum by (cluster, instance) (rate(lustre_client_write_bytes_total[{w}]))",
                   "Lustre and EFA throughput per node: checkpoints, and a node's share of the job's traffic."))
    r.append(_rule("record", "instance:lustre_client_read_bytes:rate",
                   f"sum by (cluster, instance) (rate(lustre_client_read_bytes_total[{w}]))"))
    r.append(_rule("record", "instance:lustre_client_rpc_wait_seconds:mean", f"""
sum by (cluster, instance) (rate(lustre_client_rpc_wait_seconds_total{{component="osc"}}[{ew}]))
  / (sum by (cluster, instance) (rate(lustre_client_rpcs_total{{component="osc"}}[{ew}])) > 0)""",
                   "The node's mean OST RPC round trip (the data loader's reads wait on it); absent without RPCs."))
    r.append(_rule("record", "instance:efa_retrans_packets:ratio", f"""
sum by (cluster, instance) (rate(efa_node_retrans_packets_total[{ew}]))
  / (sum by (cluster, instance) (rate(efa_node_tx_packets_total[{ew}])) > 0)""",
                   "The share of the node's EFA packets sent again, and its EFA errors (retransmit timeouts,\n"
                   "failed RDMA work requests), over the evidence window."))
    # One arm per counter, told apart by a label: increase() drops the name, and counters of one node
    # would collide (a node without RDMA counters, an older kernel, has the arms it has).
    arms = "\nor\n".join(f'label_replace(increase(efa_node_{c}_total[{ew}]), "counter", "{c}", "", "")'
                          for c in ("retrans_timeout_events", "rdma_read_errors", "rdma_write_errors"))
    r.append(_rule("record", "instance:efa_errors:increase", f"sum by (cluster, instance) (\n{_indent(arms, 2)}\n)"))
    r.append(_group("job-health-baselines", s,
                    "Each node of each job against its own baseline in this job and against the job's median node:\n"
                    "the storage and network evidence of change."))
    per_node = (("lustre_client_rpc_wait_seconds:mean", "instance:lustre_client_rpc_wait_seconds:mean"),
                ("efa_retrans_packets:ratio", "instance:efa_retrans_packets:ratio"),
                ("efa_errors:increase", "instance:efa_errors:increase"),
                ("efa_tx_bytes:rate", "instance:efa_tx_bytes:rate5m"),
                ("lustre_client_read_bytes:rate", "instance:lustre_client_read_bytes:rate"))
    first = True
    for name, src in per_node:
        r.append(_rule("record", f"instance_training_job:{name}",
                       f"instance_training_job:info * on (cluster, instance) group_left () {src}",
                       "The same per node of each job (a baseline is the node's own in this job; EFA traffic from\n"
                       "efa.yml's instance:efa_tx_bytes:rate5m)." if first else ""))
        first = False
    r.append(_rule("record", "training_job:lustre_client_rpc_wait_seconds:median",
                   f"quantile by ({JOB}) (0.5, instance_training_job:lustre_client_rpc_wait_seconds:mean)",
                   "The job's median node: what its other nodes do now."))
    r.append(_rule("record", "training_job:efa_retrans_packets:median",
                   f"quantile by ({JOB}) (0.5, instance_training_job:efa_retrans_packets:ratio)"))
    r.append(_rule("record", "training_job:efa_errors:median",
                   f"quantile by ({JOB}) (0.5, instance_training_job:efa_errors:increase)"))
    for what, floor in (("efa_tx_bytes", s.straggler_min_efa_bytes),
                        ("lustre_client_read_bytes", s.straggler_min_read_bytes)):
        r.append(_rule("record", f"training_job:{what}:median",
                       f"quantile by ({JOB}) (0.5, instance_training_job:{what}:rate) >= {_num(floor)}"))
    LF, RF = _num(s.lustre_latency_factor), _num(s.efa_retrans_factor)
    lat = "instance_training_job:lustre_client_rpc_wait_seconds:mean"
    r.append(_rule("record", "instance_training_job:job_health_storage:evidence", "\nor\n".join([
        _reason(f"{lat}\n  > on ({NODE_JOB}) ({LF} * {_held('instance_training_job:lustre_client_rpc_wait_seconds:baseline', s)})",
                "lustre_latency_up"),
        _reason(f"{lat}\n  > on ({JOB}) group_left () ({LF} * training_job:lustre_client_rpc_wait_seconds:median)",
                "lustre_latency_peers"),
        _reason(f"instance_training_job:lustre_client_read_bytes:rate\n"
                f"  < on ({JOB}) group_left () ({_num(s.straggler_share)} * training_job:lustre_client_read_bytes:median)\n"
                f"unless on ({NODE_JOB}) ({_held('instance_training_job:lustre_client_read_bytes:share_baseline', s)} < {_num(s.straggler_share)})",
                "lustre_read_low"),
    ]), f"Storage evidence from change: the node's mean OST RPC round trip is {LF}x its own baseline\n"
        f"(lustre_latency_up) or {LF}x the job's median node (lustre_latency_peers); its read rate is under\n"
        f"{_num(s.straggler_share)} of the job's median node (lustre_read_low), unless that is its usual share in\n"
        "this job (a shape, not a cause)."))
    rt = "instance_training_job:efa_retrans_packets:ratio"
    r.append(_rule("record", "instance_training_job:job_health_network:evidence", "\nor\n".join([
        _reason(f"instance_training_job:efa_tx_bytes:rate\n"
                f"  < on ({JOB}) group_left () ({_num(s.straggler_share)} * training_job:efa_tx_bytes:median)\n"
                f"unless on ({NODE_JOB}) ({_held('instance_training_job:efa_tx_bytes:share_baseline', s)} < {_num(s.straggler_share)})",
                "efa_throughput_low"),
        _reason(f"""(
  ({rt} > {_num(s.efa_retrans_floor)})
    > on ({NODE_JOB}) ({RF} * {_held('instance_training_job:efa_retrans_packets:baseline', s)})
  or
  ({rt} > {_num(s.efa_retrans_floor)})
    > on ({JOB}) group_left () ({RF} * training_job:efa_retrans_packets:median)
)""", "efa_retransmits_up"),
        _reason("(instance_training_job:efa_errors:increase > 0)\n"
                f"  > on ({JOB}) group_left () ({RF} * training_job:efa_errors:median)", "efa_errors_up"),
    ]), f"Network evidence from change: the node's EFA transmit rate is under {_num(s.straggler_share)} of the job's\n"
        f"median node (efa_throughput_low; in data parallelism every node sends the same bytes a step), its\n"
        f"retransmitted share is above {_num(s.efa_retrans_floor)} and {RF}x its own baseline or the job's median\n"
        f"node (efa_retransmits_up), or it counts retransmit timeouts or RDMA errors, {RF}x the median node's\n"
        "(efa_errors_up)."))
    return "".join(out)


def _stall_group(s: Settings) -> str:
    T, S, D = _num(s.progress_tensor), _num(s.progress_sm), _num(s.progress_dram)
    out = [_group("job-health-stall", s,
                  "TrainingJobStalled (docs/alerts.md, \"Job health\"): a job that was productive since it\n"
                  "(re)started makes no progress while it still holds its GPUs, and it is not writing a checkpoint.")]
    r = out
    r.append(_rule("record", "training_job:started", f"""
(
  training_job:gpus:count unless on ({JOB}) (training_job:gpus:count offset {s.interval})
)
and on ({JOB})
count by ({JOB}) (
  instance_training_job:info
    and on (cluster, instance) (gpu_memory_total_bytes offset {s.interval})
    and on (cluster, instance) (gpu_memory_total_bytes offset {_double(s.interval)})
)
or on ({JOB})
(training_job:gpus:count and on ({JOB}) (training_job:gpu_memory_used:ratio_max_of_min <= {_num(s.memory_held)}))""",
                   "The job (re)starts now: it holds GPUs and held none at the last evaluation, while the exporter\n"
                   "of one of its nodes answered then and the evaluation before (its GPUs' memory total: the\n"
                   "node's build info instead named a recovered storage node a straggler in the live run; the\n"
                   "job's series reach this group an evaluation late at most): a requeue under the same id, not\n"
                   "an exporter's restart; or every process of it let go of its GPU memory within the rate\n"
                   "window (a restart in its allocation; an elastic restart onto fewer nodes, where TorchElastic\n"
                   "restarts every worker)."))
    r.append(_rule("record", "training_job:start_timestamp_seconds", f"""
time() + 0 * training_job:started
or on ({JOB})
(last_over_time(training_job:start_timestamp_seconds[{s.carry}]) and on ({JOB}) training_job:gpus:count)""",
                   "When the job last (re)started; none for a job already running when the rules began."))
    r.append(_rule("record", "training_job:last_progress_timestamp_seconds", f"""
max by ({JOB}) (
    time() + 0 * (training_job:gpu_tensor_active:avg >= {_num(s.productive_tensor)})
  or
    time() + 0 * (training_job:gpu_sm_active:avg >= {_num(s.productive_sm)})
  or
    time() + 0 * (training_job:gpu_dram_active:avg >= {_num(s.productive_dram)})
)
or on ({JOB})
(last_over_time(training_job:last_progress_timestamp_seconds[{s.carry}]) and on ({JOB}) training_job:gpus:count)""",
                   "When the job was last productive (its GPUs' mean tensor, SM or DRAM activity at a training or\n"
                   "generation level), carried while it holds GPUs."))
    settle = _seconds(s.window) + 2 * _seconds(s.interval)
    r.append(_rule("record", "training_job:productive", f"""
training_job:last_progress_timestamp_seconds > on ({JOB}) (training_job:start_timestamp_seconds + {settle:g})
or on ({JOB})
(training_job:last_progress_timestamp_seconds unless on ({JOB}) training_job:start_timestamp_seconds)""",
                   "The job was productive since it last (re)started: only such a job can stall (start-up,\n"
                   "loading weights, compiling, NCCL initialisation, after a requeue too, is never a stall).\n"
                   f"Productive {settle:g} s after the start at least: the rate window and the groups between the\n"
                   "counters and this rule (an evaluation each) still show the activity from before the restart."))
    r.append(_rule("record", "job_gpu:gpu_busy_without_work:ratio", f"""
job_gpu:gpu_sm_active:ratio >= {S}
unless on (cluster, instance, gpu) (job_gpu:gpu_tensor_active:ratio >= {T} or job_gpu:gpu_dram_active:ratio >= {D})""",
                   "A GPU whose SMs are busy while neither its tensor pipes nor its memory do the job's work (a\n"
                   "kernel that never ends, a GPU hung in one); value: its SM activity."))
    r.append(_rule("record", "training_job:gpus_busy:count", f"""
count by ({JOB}) (job_gpu:gpu_busy_without_work:ratio)
or on ({JOB}) (0 * training_job:gpus:count)"""))
    r.append(_rule("record", "training_job:gpus_stalled:count", f"""
training_job:gpus:count
  and on ({JOB}) (training_job:gpu_tensor_active:max < {T})
  unless on ({JOB}) (training_job:gpu_dram_active:max >= {D})
  and on ({JOB}) (training_job:gpus_busy:count <= on ({JOB}) ({_num(s.busy_share)} * training_job:gpus:count))
  and on ({JOB}) (training_job:gpu_memory_used:ratio_max_of_min > {_num(s.memory_held)})
  and on ({JOB}) training_job:productive
  unless on ({JOB}) {_checkpointing(s)}""", "A stall now (before `for`; value: the GPUs it holds): no GPU of the job does tensor or DRAM work,\n"
                   f"at most {_num(s.busy_share)} of them keep their SMs busy (a rank stuck in a kernel while the others spin in\n"
                   "NCCL), its processes still hold GPU memory (they exited at the job's end), it was productive\n"
                   "since it (re)started, and none of its nodes is writing a checkpoint to Lustre. GPU-hours lost\n"
                   "to stalls: sum_over_time of this series times the interval."))
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
        "network": ("instance_training_job:info and on (cluster, instance) instance:job_health_network:evidence\n"
                    f"or\ninstance_training_job:info and on ({NODE_JOB}) instance_training_job:job_health_network:evidence"),
        "storage": ("instance_training_job:info and on (cluster, instance) instance:job_health_storage:evidence\n"
                    f"or\ninstance_training_job:info and on ({NODE_JOB}) instance_training_job:job_health_storage:evidence"),
    }
    r.append(_rule("record", "instance_training_job:job_health_evidence",
                   "\nor\n".join(_reason(e, c, "cause") for c, e in ev.items()),
                   "Each node of each job with evidence of a cause (hardware: a fault on one of the job's GPUs,\n"
                   "or on a GPU of the node no job holds; network and storage: the node's alerts, or its change\n"
                   "against its own baseline or the job's other nodes)."))
    fresh = [f'(instance_training_job:job_health_evidence{{cause="{c}"}} and on ({JOB}) training_job:gpus_stalled:count)'
             for c in CAUSES]
    busy = _reason(f"max by ({GPU_JOB}) (job_gpu:gpu_busy_without_work:ratio) and on ({JOB}) training_job:gpus_stalled:count",
                   "application", "cause")
    app = _reason(f"instance_training_job:info and on ({JOB}) training_job:gpus_stalled:count", "application", "cause")
    r.append(_rule("record", "instance_training_job:stall_cause", f"""
(
  last_over_time(instance_training_job:stall_cause{{cause!="application"}}[{s.carry}])
    and on ({JOB}) training_job:gpus_stalled:count
)
or on ({JOB})
""" + f"\nor on ({JOB})\n".join([*fresh, busy, app]),
                   "The cause of a stalled job and the nodes it names: hardware before network before storage;\n"
                   "else application: on the GPUs kept busy while the others wait (with `gpu`), or on every node of\n"
                   "the job. An infrastructure cause, once named, is kept while the stall lasts (its counters stop\n"
                   "moving once the job has stopped)."))
    r.append(f"""      # The NCCL-RAS rules (rules/nccl.yml) name the rank a job waits for where RAS answers: this
      # alert stays quiet for such a job (no series there: no effect).
      - alert: TrainingJobStalled
        expr: |
          max by ({NODE_JOB}, gpu, cause) (instance_training_job:stall_cause)
            * on ({JOB}) group_left () training_job:gpus_stalled:count
          unless on ({JOB}) {NCCL_RAS_ANSWERING}
        for: {s.stall_for}
        keep_firing_for: {s.keep_firing_for}  # an exporter restart must not resolve and reopen it
        labels:
          severity: warning
          notify: job_owner
        annotations:
          summary: A training job has stopped making progress on all its GPUs.
          description: >-
            Job {{{{ $labels.training_job }}}}{{{{ if $labels.namespace }}}} (namespace {{{{ $labels.namespace }}}}){{{{ end }}}}
            holds {{{{ $value }}}} GPU(s) and none has done tensor or memory work (tensor activity under {T}, DRAM
            activity under {D}) for {s.stall_for}, while it is not writing a checkpoint. Cause:
            {{{{ $labels.cause }}}}{{{{ if eq $labels.cause "application" }}}}{{{{ if $labels.gpu }}}} on {{{{ $labels.instance }}}} GPU
            {{{{ $labels.gpu }}}}: its SMs stay busy (SM activity {S} or more) with no tensor or memory work while
            the job's other GPUs wait (a kernel that never ends: the rank the job waits for){{{{ else }}}} (no
            hardware, network or storage signal on any of its nodes; {{{{ $labels.instance }}}} is one of them: a
            deadlock, a data-loader bug or an NCCL hang with healthy links, for the job's owner){{{{ end }}}}{{{{ else }}}},
            on {{{{ $labels.instance }}}}: {_evidence_desc(NODE_SCOPE)}{{{{ end }}}} Job dashboard: {JOB_DASHBOARD}
          runbook_url: {s.runbook_base}#trainingjobstalled
""")
    return "".join(out)


def _phase_rules(s: Settings) -> list[str]:
    T, S, D = _num(s.progress_tensor), _num(s.progress_sm), _num(s.progress_dram)
    r = []
    r.append(_rule("record", "training_job:running", f"""
training_job:gpus:count >= 3
  and on ({JOB}) (
      training_job:gpu_tensor_active:avg >= {T}
    or on ({JOB})
      training_job:gpu_sm_active:avg >= {S}
    or on ({JOB})
      training_job:gpu_dram_active:avg >= {D}
  )""", "A job of three GPUs or more making progress (a median of two is no majority)."))
    r.append(_rule("record", "training_job:phase:ratio",
                   "training_job:gpu_tensor_active:avg / (training_job:gpu_sm_active:avg > 0.1) and on (" + JOB
                   + ") training_job:running",
                   "The job's phase: the share of its SMs' busy time that its tensor pipes are busy. Waiting (for\n"
                   "data, a slow peer) idles both alike and a slower clock stretches both alike, so the ratio keeps\n"
                   "its value through a slowdown; evaluation, a memory-bound generation phase, change it."))
    r.append(_baseline("training_job:phase:baseline", "training_job:phase:ratio", JOB, "training_job:slowing", s))
    r.append(_rule("record", "training_job:in_phase", f"""
training_job:running
  and on ({JOB}) (abs(training_job:phase:ratio / on ({JOB}) training_job:phase:baseline - 1) <= {_num(s.phase_tolerance)})
  and on ({JOB}) (training_job:gpus:count == quantile_over_time(0.5, training_job:gpus:count[{s.baseline_window}]))
  and on ({JOB}) (training_job:gpus:count == max_over_time(training_job:gpus:count[{s.window}]))
  and on ({JOB}) (training_job:gpus:count == min_over_time(training_job:gpus:count[{s.window}]))
  and on ({JOB}) (training_job:goodput:ratio == quantile_over_time(0.5, training_job:goodput:ratio[{s.baseline_window}]))
  and on ({JOB}) (training_job:goodput:ratio >= max_over_time(training_job:goodput:ratio[{s.window}]))
  unless on ({JOB}) {_checkpointing(s)}""", f"The job runs in its usual phase (the ratio within {_num(s.phase_tolerance)} of its baseline), writes no checkpoint\n"
                   "(its ranks enter and leave one a little apart), and its view is whole and steady: only then are\n"
                   "its GPUs and nodes compared with their own history. A share of the job's median moves, with no\n"
                   "GPU changing, when the median is taken over other GPUs than the baselines were: so the job\n"
                   "holds, and works on, as many GPUs as through most of the baseline window (a node whose exporter\n"
                   "is gone, a node whose processes exited first as the job ends, a job that shrank: judged again\n"
                   "once the baselines are of its new size), none joined or left within the rate window (a missed\n"
                   "scrape drops a node's GPUs for an evaluation; a new or returning node's rates ramp up over a\n"
                   "window), and none stopped working within it (the fading rates of a node whose exporter stopped)."))
    return r


def _straggler_group(s: Settings) -> str:
    A, C, CH, T = _num(s.straggler_activity), _num(s.straggler_clock), _num(s.straggler_change), _num(s.progress_tensor)
    out = [_group("job-health-phase", s,
                  "Whether a job runs, in which phase, and its median GPU: what the straggler and the slow job\n"
                  "compare with.")]
    r = out
    r += _phase_rules(s)
    r.append(_rule("record", "training_job:gpu_tensor_active:median",
                   f"quantile by ({JOB}) (0.5, job_gpu:gpu_tensor_active:ratio >= {T})",
                   f"The job's median working GPU (tensor activity {T} or more): GPUs that stopped (a node whose\n"
                   "processes exited first as the job ends) do not pull it down and move every other GPU's share."))
    r.append(_rule("record", "training_job:gpu_clock_sm:median", f"quantile by ({JOB}) (0.5, job_gpu:gpu_clock_sm:hertz)"))
    r.append(_rule("record", "job_gpu:gpu_clock_sm:below_median",
                   f"job_gpu:gpu_clock_sm:hertz < on ({JOB}) group_left () ({C} * training_job:gpu_clock_sm:median)"))
    r.append(_group("job-health-straggler", s,
                    "TrainingJobStraggler (docs/alerts.md, \"Job health\"): a GPU or node of a running job that\n"
                    "became slower than its own history in this job, or that carries hardware evidence. A shape\n"
                    "the job has had since it became productive (pipeline stages, the last stage's loss, uneven\n"
                    "experts) is its history, not a straggler."))
    r.append(_rule("record", "job_gpu:straggler:diverged", f"""
max by ({GPU_JOB}) (
    abs(job_gpu:gpu_tensor_active:ratio - on ({JOB}) group_left () training_job:gpu_tensor_active:median) > {A}
  or
    job_gpu:gpu_clock_sm:below_median
)
and on ({JOB}) training_job:running""",
                   f"A GPU whose tensor activity is more than {A} from the job's median, or whose SM clock is under\n"
                   f"{C} of the job's median: a straggler where the hardware says why."))
    # A GPU's share of the job's median tensor activity, a node's of its EFA and Lustre throughput:
    # its shape in the job, compared with its own baseline while the job is in its usual phase.
    shares = (
        ("job_gpu:gpu_tensor_active", GPU_JOB, f"max by ({GPU_JOB}) (job_gpu:gpu_tensor_active:ratio >= {_num(s.progress_tensor)})",
         f"(training_job:gpu_tensor_active:median >= {_num(s.productive_tensor)})", "abs({x} - on ({by}) {b}) > " + CH),
        ("instance_training_job:efa_tx_bytes", NODE_JOB, "instance_training_job:efa_tx_bytes:rate",
         "training_job:efa_tx_bytes:median", "{b} - on ({by}) {x} > " + CH),
        ("instance_training_job:lustre_client_read_bytes", NODE_JOB, "instance_training_job:lustre_client_read_bytes:rate",
         "training_job:lustre_client_read_bytes:median", "{b} - on ({by}) {x} > " + CH),
    )
    for prefix, by, value, median, changed in shares:
        x, b, ch = f"{prefix}:share", f"{prefix}:share_baseline", f"{prefix}:share_changed"  # b: job-health-history
        r.append(_rule("record", x, f"{value}\n  / on ({JOB}) group_left () {median}\n  and on ({JOB}) training_job:running",
                       "A GPU's tensor activity over the job's median GPU's, a node's EFA transmit and Lustre read\n"
                       "rates over the job's median node's: its shape in the job; its baseline; changed when, in\n"
                       "the job's usual phase, it moved away from that (a GPU either way, a node's throughput down)\n"
                       f"by more than {CH}." if prefix.startswith("job_gpu") else ""))
        r.append(_rule("record", ch, changed.format(x=x, b=_held(b, s), by=by) + f" and on ({JOB}) training_job:in_phase"))
    node_arms = [
        _reason("instance_training_job:efa_tx_bytes:share_changed", "efa_traffic_low"),
        _reason("instance_training_job:lustre_client_read_bytes:share_changed", "lustre_read_low"),
        _reason('instance_training_job:info and on (cluster, instance) instance:job_health_network:evidence\n'
                f'or\nmax by ({NODE_JOB}) (instance_training_job:job_health_network:evidence{{reason!="efa_throughput_low"}})',
                "efa_errors"),
        _reason('instance_training_job:info and on (cluster, instance) instance:job_health_storage:evidence\n'
                f'or\nmax by ({NODE_JOB}) (instance_training_job:job_health_storage:evidence{{reason!="lustre_read_low"}})',
                "lustre_errors"),
    ]
    r.append(_rule("record", "instance_training_job:straggler:diverged",
                   "(\n" + _indent("\nor\n".join(node_arms), 2) + f"\n)\nand on ({JOB}) training_job:running",
                   f"A node of a running job whose EFA or Lustre read share of the job's median node fell by more\n"
                   f"than {CH} from its own baseline, or that shows EFA or Lustre errors or latency (evidence)."))
    hw = "(gpu:job_health_slowdown:evidence or gpu:job_health_hardware:evidence or job_gpu:gpu_clock_sm:below_median)"
    r.append(_rule("record", "job_gpu:straggler:candidate", f"""
max by ({GPU_JOB}) (job_gpu:straggler:diverged and on (cluster, instance, gpu) {hw})
or on ({GPU_JOB})
max by ({GPU_JOB}) (job_gpu:gpu_tensor_active:share_changed)""",
                   "A GPU straggler: it diverges with hardware evidence, or its share of the job's work changed."))
    gpu_arms = [
        ("hardware", f"job_gpu:straggler:candidate and on (cluster, instance, gpu) {hw}"),
        ("network", 'job_gpu:straggler:candidate and on (cluster, instance) instance:job_health_network:evidence'),
        ("storage", 'job_gpu:straggler:candidate and on (cluster, instance) '
                    '(instance:job_health_storage:evidence or instance_training_job:straggler:diverged{reason=~"lustre_.*"})'),
        ("application", "job_gpu:straggler:candidate"),
    ]
    gpu_expr = f"\nor on ({GPU_JOB})\n".join(
        _reason(f"max by ({GPU_JOB}) (\n  {e}\n)", c, "cause") for c, e in gpu_arms)
    node_expr = f"\nor on ({NODE_JOB})\n".join([
        _reason(f'max by ({NODE_JOB}) (instance_training_job:straggler:diverged{{reason=~"efa_.*"}})', "network", "cause"),
        _reason(f'max by ({NODE_JOB}) (instance_training_job:straggler:diverged{{reason=~"lustre_.*"}})', "storage", "cause"),
    ])
    desc_hw = ('{{ range printf "gpu:job_health_slowdown:evidence{cluster=\'%s\',instance=\'%s\',gpu=\'%s\'}" $labels.cluster $labels.instance '
               '$labels.gpu | query | sortByLabel \"reason\" }}{{ .Labels.reason }}; {{ end }}'
               '{{ range printf "gpu:job_health_hardware:evidence{cluster=\'%s\',instance=\'%s\',gpu=\'%s\'}" $labels.cluster $labels.instance '
               '$labels.gpu | query | sortByLabel \"reason\" }}{{ .Labels.reason }}; {{ end }}'
               '{{ range printf "job_gpu:gpu_clock_sm:below_median{cluster=\'%s\',instance=\'%s\',gpu=\'%s\'}" $labels.cluster $labels.instance '
               '$labels.gpu | query | sortByLabel \"reason\" }}SM clock {{ .Value | humanize }}Hz, under the job\'s median; {{ end }}'
               '{{ range printf "job_gpu:gpu_tensor_active:share_changed{cluster=\'%s\',instance=\'%s\',gpu=\'%s\',training_job=\'%s\'}" '
               '$labels.cluster $labels.instance $labels.gpu $labels.training_job | query }}its tensor activity over the '
               'job\'s median moved {{ .Value | printf "%.2f" }} from its own baseline; {{ end }}')
    desc_node = ('{{ range printf "instance:job_health_network:evidence{cluster=\'%s\',instance=\'%s\'}" $labels.cluster $labels.instance | query | sortByLabel \"reason\" }}'
                 '{{ .Labels.reason }}; {{ end }}'
                 '{{ range printf "instance:job_health_storage:evidence{cluster=\'%s\',instance=\'%s\'}" $labels.cluster $labels.instance | query | sortByLabel \"reason\" }}'
                 '{{ .Labels.reason }}; {{ end }}'
                 '{{ range printf "instance_training_job:straggler:diverged{cluster=\'%s\',instance=\'%s\',training_job=\'%s\'}" '
                 '$labels.cluster $labels.instance $labels.training_job | query | sortByLabel \"reason\" }}{{ .Labels.reason }}; {{ end }}')
    # Not while a stall's evidence is still in its window (the job resumes, its latency or errors
    # of the stall linger a few minutes): a stall names its own cause.
    recovering = f"unless on ({JOB}) max_over_time(training_job:gpus_stalled:count[{s.evidence_window}])"
    straggler_expr = (f"(\n  (\n{_indent(gpu_expr, 4)}\n  )\n  or on ({NODE_JOB})\n  (\n{_indent(node_expr, 4)}\n"
                      f"  )\n)\n{recovering}")
    r.append(f"""      - alert: TrainingJobStraggler
        expr: |
{_indent(straggler_expr, 10)}
        for: {s.straggler_for}
        keep_firing_for: {s.keep_firing_for}  # an exporter restart must not resolve and reopen it
        labels:
          severity: warning
          notify: job_owner
        annotations:
          summary: One GPU or node of a training job became slower than the rest.
          description: >-
            Job {{{{ $labels.training_job }}}}{{{{ if $labels.namespace }}}} (namespace {{{{ $labels.namespace }}}}){{{{ end }}}}
            has a straggler on {{{{ $labels.instance }}}}{{{{ if $labels.gpu }}}} GPU {{{{ $labels.gpu }}}}{{{{ end }}}} for
            {s.straggler_for}: it departs from its own history in this job or carries hardware evidence. Likely cause:
            {{{{ $labels.cause }}}}. Evidence: {desc_hw}{desc_node}{{{{ if eq $labels.cause "application" }}}}none from the
            hardware, EFA or Lustre (a change in the work it gets, a data skew: the job's owner's){{{{ end }}}}
            Job dashboard: {JOB_DASHBOARD}
          runbook_url: {s.runbook_base}#trainingjobstraggler
""")
    return "".join(out)


def _slow_group(s: Settings) -> str:
    R, K = _num(s.slow_ratio), _num(s.slow_clock)
    out = [_group("job-health-slow", s,
                  "TrainingJobSlow (docs/alerts.md, \"Job health\"): a productive job whose throughput fell well\n"
                  "below its own baseline on every node, in its usual phase, for a sustained time.")]
    r = out
    r.append(_rule("record", "instance_training_job:throughput:rate", f"""
avg by ({NODE_JOB}) (job_gpu:gpu_tensor_active:ratio * job_gpu:gpu_clock_sm:hertz)
  and on ({JOB}) training_job:running""",
                   "Throughput per node of the job: tensor-active SM clock cycles a second, averaged over its GPUs\n"
                   "(the share of time the tensor pipes work, times the rate they work at: a wait lowers the first,\n"
                   "a thermal or power slowdown the second), while it runs; its baseline (the median ignores a\n"
                   "phase shorter than half the window); the ratio."))
    r.append(_rule("record", "instance_training_job:throughput:ratio",
                   f"instance_training_job:throughput:rate / on ({NODE_JOB}) {_held('instance_training_job:throughput:baseline', s)}"))
    r.append(_rule("record", "training_job:slowing", f"""
max by ({JOB}) (instance_training_job:throughput:ratio) < {R}
and on ({JOB}) training_job:in_phase
unless on ({JOB}) training_job:gpus_stalled:count""",
                   f"Every node of the job runs under {R} of its own baseline throughput (value: the best node's share),\n"
                   "in its usual phase (no checkpoint), not stalled (its own alert)."))
    r.append(_rule("record", "instance_training_job:gpu_clock_sm:avg",
                   f"avg by ({NODE_JOB}) (job_gpu:gpu_clock_sm:hertz) and on ({JOB}) training_job:running"))
    r.append(_rule("record", "instance_training_job:slowdown:evidence", f"""
instance_training_job:gpu_clock_sm:avg < on ({NODE_JOB}) ({K} * {_held('instance_training_job:gpu_clock_sm:baseline', s)})
or on ({NODE_JOB})
max by ({NODE_JOB}) (gpu:training_job:info and on (cluster, instance, gpu) gpu:job_health_slowdown:evidence)""",
                   f"A node of the job whose GPUs' mean SM clock fell under {K} of its own baseline, or with a thermal,\n"
                   "power or link slowdown alert on one of its GPUs."))
    thermal = _reason(f"""
instance_training_job:info
  and on ({JOB}) (count by ({JOB}) (instance_training_job:slowdown:evidence) >= on ({JOB}) training_job:nodes:count)
  and on ({JOB}) training_job:slowing""", "hardware", "cause")
    arms = [thermal] + [
        f'(instance_training_job:job_health_evidence{{cause="{c}"}} and on ({JOB}) training_job:slowing)'
        for c in CAUSES]
    arms.append(_reason(f"instance_training_job:info and on ({JOB}) training_job:slowing", "application", "cause"))
    r.append(_rule("record", "instance_training_job:slow_cause", f"\nor on ({JOB})\n".join(arms),
                   "Why: thermal or power on every node (or a GPU fault), then the nodes with network, then\n"
                   "storage evidence; else application, on every node of the job."))
    r.append(f"""      - alert: TrainingJobSlow
        expr: |
          max by ({NODE_JOB}, cause) (instance_training_job:slow_cause)
            * on ({JOB}) group_left () training_job:slowing
        for: {s.slow_for}
        keep_firing_for: {s.keep_firing_for}  # an exporter restart must not resolve and reopen it
        labels:
          severity: warning
          notify: job_owner
        annotations:
          summary: A training job runs well below its own throughput on every node.
          description: >-
            Job {{{{ $labels.training_job }}}}{{{{ if $labels.namespace }}}} (namespace {{{{ $labels.namespace }}}}){{{{ end }}}}
            runs at {{{{ $value | humanizePercentage }}}} or less of its own baseline throughput (tensor activity times SM
            clock, the median of its last {s.baseline_window} in the same phase) on every node, for {s.slow_for}. Cause:
            {{{{ $labels.cause }}}}{{{{ if eq $labels.cause "application" }}}} (no thermal, power, network or storage signal
            on any of its nodes; {{{{ $labels.instance }}}} is one of them: the input pipeline, a change of code or data,
            for the job's owner){{{{ else if eq $labels.cause "hardware" }}}} on {{{{ $labels.instance }}}}: its GPUs' clocks
            fell under {K} of their baseline or a slowdown alert holds, on every node of the job (a facility power
            cap, cooling){{{{ else }}}}, on {{{{ $labels.instance }}}}: {_evidence_desc(NODE_SCOPE)}{{{{ end }}}}
            Job dashboard: {JOB_DASHBOARD}
          runbook_url: {s.runbook_base}#trainingjobslow
""")
    return "".join(out)


HEADER = """\
# Job health: per-job recording rules, TrainingJobStalled, TrainingJobStraggler and TrainingJobSlow
# (docs/alerts.md, "Job health"). GENERATED by `python -m exporter.tools.job_rules` from exporter/tools/job_rules.py: edit that
# and re-render (the windows, `for:` durations and thresholds are its parameters). A job is a Slurm
# job (hpc_job) or a Kubernetes training job (namespace, training_job) across its nodes. The alerts
# carry `cause` (hardware, network, storage, application) and `notify: job_owner`: Alertmanager
# sends them to the job's owner, not the hardware pager (deploy/alertmanager). Tests:
# tests/rules/job*.test.yml, tests/test_job_health_live.py.
"""

RULES_FILE = share.root() / "rules" / "job.yml"


def _seconds(d: str) -> float:
    """A Prometheus duration (as _duration accepts) in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d)", d))


def _double(d: str) -> str:
    """Twice a Prometheus duration, as one (in its largest whole unit: 10m, 12s)."""
    n = int(2 * _seconds(d))
    for unit, size in (("h", 3600), ("m", 60)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}s"


def _duration(v: str) -> str:
    if not re.fullmatch(r"(\d+[smh])+", v):
        raise argparse.ArgumentTypeError(f"{v!r} is not a Prometheus duration such as 30s, 2m or 1h")
    return v


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m exporter.tools.job_rules", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(RULES_FILE), metavar="FILE", help="where to write (default: %(default)s)")
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-")
        conv: Callable[[str], object]
        if f.type == "str":
            conv = str if f.name == "runbook_base" else _duration
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
