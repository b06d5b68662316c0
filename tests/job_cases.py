# ruff: noqa: E501  (a case reads best with its expectation on one line)
"""The promtool cases of rules/job.yml (tests/rules/job.test.yml), written as simulated jobs.

    .venv/bin/python -m tests.job_cases     # rewrite tests/rules/job.test.yml

A case is a small cluster (nodes of GPUs, the jobs holding them) and a function of the minute
that says what each GPU and node does then; this module turns it into the series the exporter
exports (cumulative GPM activity counters, memory, clocks, workload info, EFA and Lustre counters,
kube-state-metrics' pod series) and writes the expected alerts. tests/test_job_rules.py checks the
file is this module's output; tests/test_rules_suites.py runs it with the real promtool.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "tests" / "rules" / "job.test.yml"
# The day-long case in a suite of its own: tests/test_rules_suites.py runs the suites two at a time.
DAY_SUITE = ROOT / "tests" / "rules" / "job_day.test.yml"
DAY = ("a simulated day of a healthy job with hourly checkpoints, evaluations, generative evaluations and a "
       "restart: no alert")
RUNBOOK = "file:///usr/share/doc/gpu-health-exporter/runbooks.html"
MEM_TOTAL = 80e9
CLOCK = 1.98e9


@dataclass(frozen=True)
class Gpu:
    """One GPU in one minute. tensor and sm: activity ratios (None: no GPM series, e.g. lost)."""

    tensor: float | None = 0.85
    sm: float | None = 0.95
    dram: float | None = None  # DRAM bandwidth activity; None: 0.4 x tensor (training's matmuls)
    mem: float = 0.8  # share of its memory in use
    clock: float = CLOCK
    lost: bool = False
    thermal: bool = False
    xid: int | None = None  # an XID of the reboot tier seen this minute (its last-seen stays)
    job: str | None = "1001"  # Slurm job id, or "ns/pod" for a pod; None: not held


@dataclass(frozen=True)
class Node:
    lustre_write: float = 0.0  # bytes/s
    lustre_read: float = 50e6
    rpc_wait: float = 0.005  # mean Lustre RPC round trip (s), 200 RPCs/s
    evictions: int = 0  # evictions this minute
    efa_tx: float = 2e9
    efa_retrans_ratio: float = 0.0
    efa_timeouts: int = 0  # retransmit timeout events this minute
    down: bool = False  # the node's exporter does not answer this minute (a restart): its series go stale
    late: bool = False  # the node's exporter serves the last minute's values (its collection behind)


HEALTHY = Gpu()
IDLE = Gpu(tensor=0.0, sm=0.0)
NCCL_SPIN = Gpu(tensor=0.0, sm=0.2, dram=0.01)  # a few SMs spin in an NCCL wait; NVML utilisation would read ~100%
# Autoregressive generation (RLHF rollouts, generative evaluation): memory-bound, the job is working.
MEMORY_BOUND = Gpu(tensor=0.03, sm=0.4, dram=0.75)
STUCK = Gpu(tensor=0.0, sm=1.0, dram=0.0)  # a rank stuck in a compute kernel that never ends


@dataclass
class Case:
    name: str
    minutes: int
    nodes: int
    gpus: int
    state: Callable[[int, int, int], Gpu]  # (minute, node, gpu) -> Gpu
    node_state: Callable[[int, int], Node] = lambda t, n: Node()
    stalled: list[tuple[int, list[dict]]] = field(default_factory=list)  # (eval minute, expected alerts)
    straggler: list[tuple[int, list[dict]]] = field(default_factory=list)
    slowed: list[tuple[int, list[dict]]] = field(default_factory=list)
    ksm: dict[str, dict[str, str]] = field(default_factory=dict)  # "ns/pod" -> kube_pod_labels labels
    owners: dict[str, tuple[str, str]] = field(default_factory=dict)  # "ns/pod" -> (owner_kind, owner_name)
    extra: list[dict] = field(default_factory=list)  # more input series, as promtool reads them


def _num(v: float) -> str:
    return format(v, ".15g")


def compress(values: list[float | None]) -> str:
    """promtool's notation: runs with one step as 'a+bxn', gaps as '_', a series' end as 'stale'."""
    out: list[str] = []
    i = 0
    while i < len(values):
        v = values[i]
        if v is None:
            out.append("stale" if i > 0 and values[i - 1] is not None else "_")
            i += 1
            continue
        j = i
        step = values[i + 1] - v if i + 1 < len(values) and values[i + 1] is not None else 0.0
        while j + 1 < len(values) and values[j + 1] is not None and abs(values[j + 1] - values[j] - step) < 1e-6:
            j += 1
        n = j - i
        if n == 0:
            out.append(_num(v))
        else:
            sign = "+" if step >= 0 else "-"
            out.append(f"{_num(v)}{sign}{_num(abs(step))}x{n}")
        i = j + 1
    return " ".join(out)


def _labels(**kw: str) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in kw.items()) + "}"


def _cumulative(rates: list[float | None], per: float = 60.0) -> list[float | None]:
    out, total = [], 0.0
    for r in rates:
        if r is None:
            out.append(None)
        else:
            total += r * per
            out.append(round(total, 6))
    return out


def series(case: Case) -> list[dict]:
    T = case.minutes + 1
    out: list[dict] = []

    def keep(name: str, labels: dict[str, str], values: list[float | None]) -> None:
        if all(v is None for v in values):
            return
        out.append({"series": name + _labels(**labels), "values": compress(values)})

    for n in range(case.nodes):
        inst = f"node-{n + 1}"
        base = {"cluster": "c1", "instance": inst, "job": "gpu-health-exporter"}
        nodes = [case.node_state(t, n) for t in range(T)]
        down = [s.down for s in nodes]
        late = [s.late for s in nodes]

        def add(name: str, labels: dict[str, str], values: list[float | None], down: list[bool] = down,
                late: list[bool] = late) -> None:
            """A series of this node: no sample while its exporter is down, the previous minute's while
            it is late."""
            values = [values[t - 1] if late[t] and t > 0 else v for t, v in enumerate(values)]
            keep(name, labels, [None if d else v for v, d in zip(values, down, strict=True)])

        add("gpu_health_exporter_build_info", {**base, "version": "0.1.0"}, [1.0] * T)
        for g in range(case.gpus):
            states = [case.state(t, n, g) for t in range(T)]
            gl = {**base, "gpu": str(g), "uuid": f"GPU-{n + 1}-{g}", "pci_bus_id": f"00000000:{0x53 + g:02X}:00.0"}
            jobs = sorted({s.job for s in states if s.job})
            for job in jobs:
                vals = [1.0 if s.job == job else None for s in states]
                if "/" in job:
                    ns, pod = job.split("/")
                    wl = {**base, "gpu": str(g), "uuid": gl["uuid"], "namespace": ns, "pod": pod, "container": "main"}
                else:
                    wl = {**base, "gpu": str(g), "uuid": gl["uuid"], "hpc_job": job}
                add("gpu_workload_info", wl, vals)
            add("gpu_tensor_active_seconds_total", gl, _cumulative([s.tensor for s in states]))
            add("gpu_sm_active_seconds_total", gl, _cumulative([s.sm for s in states]))
            add("gpu_dram_active_seconds_total", gl, _cumulative([
                s.dram if s.dram is not None else None if s.tensor is None else 0.4 * s.tensor for s in states]))
            add("gpu_memory_used_bytes", gl, [None if s.lost else s.mem * MEM_TOTAL for s in states])
            add("gpu_memory_total_bytes", gl, [None if s.lost else MEM_TOTAL for s in states])
            add("gpu_clock_hertz", {**gl, "clock": "sm"}, [None if s.lost else s.clock for s in states])
            add("gpu_lost", gl, [1.0 if s.lost else 0.0 for s in states])
            if any(s.thermal for s in states):
                add("gpu_clock_event_active", {**gl, "reason": "hw_thermal"}, [1.0 if s.thermal else 0.0 for s in states])
            seen: float | None = None
            xids = []
            for t, s in enumerate(states):
                if s.xid:
                    seen = t * 60.0
                xids.append(seen)
            if seen is not None:
                xid = next(s.xid for s in states if s.xid)
                add("gpu_xid_last_seen_timestamp_seconds", {**gl, "xid": str(xid), "tier": "reboot"}, xids)
        mount = {**base, "fsname": "fsx", "mount": "/fsx"}
        add("lustre_client_write_bytes_total", mount, _cumulative([s.lustre_write for s in nodes]))
        add("lustre_client_read_bytes_total", mount, _cumulative([s.lustre_read for s in nodes]))
        target = {**mount, "component": "osc", "target": "fsx-OST0000"}
        add("lustre_client_rpcs_total", target, _cumulative([200.0 for _ in nodes]))
        add("lustre_client_rpc_wait_seconds_total", target, _cumulative([200.0 * s.rpc_wait for s in nodes]))
        ev = []
        total = 0.0
        for s in nodes:
            total += s.evictions
            ev.append(total)
        add("lustre_client_import_evictions_total", target, ev)
        # one EFA device: the node's totals (efa_node_*_total, which the EFA rules read) are its own
        dev = {**base, "device": "rdmap0s0", "port": "1"}

        def efa(name: str, values: list[float], dev: dict = dev, node: dict = base) -> None:
            add(f"efa_{name}_total", dev, values)
            add(f"efa_node_{name}_total", node, values)

        efa("tx_bytes", _cumulative([s.efa_tx for s in nodes]))
        pkts = [s.efa_tx / 8000 for s in nodes]
        efa("tx_packets", _cumulative(pkts))
        efa("retrans_packets", _cumulative([p * s.efa_retrans_ratio for p, s in zip(pkts, nodes, strict=True)]))
        to, total = [], 0.0
        for s in nodes:
            total += s.efa_timeouts
            to.append(total)
        efa("retrans_timeout_events", to)
        efa("rdma_read_errors", [0.0] * T)  # counters of the same labels: the rules must keep them apart
    ksm = {"cluster": "c1", "job": "kube-state-metrics", "instance": "ksm:8080"}
    for key, labels in case.ksm.items():
        ns, pod = key.split("/")
        keep("kube_pod_labels", {**ksm, "namespace": ns, "pod": pod, "uid": f"uid-{pod}", **labels}, [1.0] * T)
    for key, (kind, name) in case.owners.items():
        ns, pod = key.split("/")
        keep("kube_pod_owner", {**ksm, "namespace": ns, "pod": pod, "uid": f"uid-{pod}", "owner_kind": kind,
                               "owner_name": name, "owner_is_controller": "true"}, [1.0] * T)
    return out + case.extra


# --- expected alerts -------------------------------------------------------------------------------

def _job_labels(job: str) -> dict[str, str]:
    if "/" in job:
        ns, name = job.split("/")
        return {"training_job": name, "namespace": ns}
    return {"training_job": job, "hpc_job": job}


def _dash(job: str) -> str:
    return f"/d/gpu-health-job/?var-cluster=c1&var-job={_job_labels(job)['training_job']}&var-instance=All"


def _alert(job: str, inst: str, cause: str, gpu: str | None = None) -> tuple[dict, dict[str, str], str]:
    j = _job_labels(job)
    labels = {"severity": "warning", "notify": "job_owner", "cluster": "c1", "instance": inst, "cause": cause, **j}
    if gpu is not None:
        labels["gpu"] = gpu
    return labels, j, f" (namespace {j['namespace']})" if "namespace" in j else ""


def stalled(job: str, inst: str, cause: str, gpus: int, evidence: str = "", gpu: str | None = None) -> dict:
    labels, j, where = _alert(job, inst, cause, gpu)
    if cause == "application" and gpu is not None:
        tail = (f" on {inst} GPU {gpu}: its SMs stay busy (SM activity 0.5 or more) with no tensor or memory work "
                "while the job's other GPUs wait (a kernel that never ends: the rank the job waits for)")
    elif cause == "application":
        tail = (f" (no hardware, network or storage signal on any of its nodes; {inst} is one of them: a deadlock, "
                "a data-loader bug or an NCCL hang with healthy links, for the job's owner)")
    else:
        tail = f", on {inst}: {evidence}"
    return {
        "exp_labels": labels,
        "exp_annotations": {
            "summary": "A training job has stopped making progress on all its GPUs.",
            "description": (f"Job {j['training_job']}{where} holds {gpus} GPU(s) and none has done tensor or memory "
                            "work (tensor activity under 0.05, DRAM activity under 0.2) for 4m, while it is not "
                            f"writing a checkpoint. Cause: {cause}{tail} Job dashboard: {_dash(job)}"),
            "runbook_url": f"{RUNBOOK}#trainingjobstalled",
        },
    }


def straggler(job: str, inst: str, cause: str, evidence: str, gpu: str | None = None) -> dict:
    labels, j, where = _alert(job, inst, cause, gpu)
    on = f"{inst} GPU {gpu}" if gpu is not None else inst
    app = "none from the hardware, EFA or Lustre (a change in the work it gets, a data skew: the job's owner's)" \
        if cause == "application" else ""
    return {
        "exp_labels": labels,
        "exp_annotations": {
            "summary": "One GPU or node of a training job became slower than the rest.",
            "description": (f"Job {j['training_job']}{where} has a straggler on {on} for 5m: it departs from its own "
                            f"history in this job or carries hardware evidence. Likely cause: {cause}. Evidence: "
                            f"{evidence}{app} Job dashboard: {_dash(job)}"),
            "runbook_url": f"{RUNBOOK}#trainingjobstraggler",
        },
    }


def moved(v: float) -> str:
    """A GPU straggler's evidence of change (its share of the job's median tensor activity moved)."""
    return f"its tensor activity over the job's median moved {v:.2f} from its own baseline; "


def slow(job: str, inst: str, cause: str, share: str, evidence: str = "") -> dict:
    """TrainingJobSlow on `inst`; `share`: the best node's share of its baseline, as humanizePercentage
    writes it."""
    labels, j, where = _alert(job, inst, cause)
    if cause == "application":
        tail = (f" (no thermal, power, network or storage signal on any of its nodes; {inst} is one of them: the "
                "input pipeline, a change of code or data, for the job's owner)")
    elif cause == "hardware":
        tail = (f" on {inst}: its GPUs' clocks fell under 0.9 of their baseline or a slowdown alert holds, on every "
                "node of the job (a facility power cap, cooling)")
    else:
        tail = f", on {inst}: {evidence}"
    return {
        "exp_labels": labels,
        "exp_annotations": {
            "summary": "A training job runs well below its own throughput on every node.",
            "description": (f"Job {j['training_job']}{where} runs at {share} or less of its own baseline throughput "
                            "(tensor activity times SM clock, the median of its last 1h in the same phase) on every "
                            f"node, for 5m. Cause: {cause}{tail} Job dashboard: {_dash(job)}"),
            "runbook_url": f"{RUNBOOK}#trainingjobslow",
        },
    }


# --- the cases -------------------------------------------------------------------------------------

STALL_AT = 20  # the minute a stall starts in the cases below
# issue 43's cases that tests/test_job_rules.py runs without their guard
MEMORY = "a memory-bound phase (DRAM busy, tensor low) for 20 minutes: progress, no alert"
STUCK_RANK = "a rank stuck in a compute kernel while 31 GPUs spin in NCCL: a stall naming that GPU"
REQUEUE = "a requeue under the same id: its start-up is no stall, a hang once productive again is"
PIPELINE = "pipeline stages unbalanced by design through a checkpoint and an evaluation: no straggler"
SLOW_STORAGE = "a job that slows on every node as one node's Lustre RPCs take 50x longer: storage on that node"
FAILING_NODE = "a failing node: EFA throughput down, retransmits and timeouts under the alerts' thresholds: network"
STORAGE_LATENCY = "a data-loader stall with Lustre RPCs at 50x their usual 1 ms: storage on that node"
ENDS_APART = "a job whose nodes end ten minutes apart (one node's processes exit first): no straggler"
EXPORTER_GONE = "one node's exporter gone for 19 minutes while the job trains on: no straggler on the others"
LATE_SCRAPES = "a missed scrape and late ones on one node: no straggler"
FIRE_BY = 30  # within 10 minutes


def _after(t: int, before: Gpu, after: Gpu) -> Gpu:
    return after if t >= STALL_AT else before


def nodes_of(n: int) -> list[str]:
    return [f"node-{i + 1}" for i in range(n)]


def cases() -> list[Case]:
    out: list[Case] = []

    # NCCL hang: every rank waits in a collective that never completes. Tensor ~0, a few SMs spin,
    # EFA flat, no infrastructure signal: application, on every node of the job. The job ends at 40.
    def nccl(t, n, g):
        if t >= 40:
            return Gpu(tensor=0.0, sm=0.0, mem=0.0, job=None)
        return _after(t, HEALTHY, NCCL_SPIN)

    out.append(Case(
        "NCCL hang (4 nodes): application on every node within 10 minutes, resolved when the job ends",
        55, 4, 2, nccl,
        node_state=lambda t, n: Node(efa_tx=0.0 if t >= STALL_AT else 2e9),
        stalled=[(STALL_AT + 3, []),
                 (FIRE_BY, [stalled("1001", i, "application", 8) for i in nodes_of(4)]),
                 (52, [])],
        straggler=[(FIRE_BY, [])]))

    # XID 79 on one GPU: it falls off the bus (lost, no activity), the other ranks hang in NCCL.
    def xid79(t, n, g):
        if n == 2 and g == 1 and t >= STALL_AT:
            return Gpu(tensor=None, sm=None, lost=True, xid=79 if t == STALL_AT else None)
        return _after(t, HEALTHY, NCCL_SPIN)

    out.append(Case(
        "XID 79 on one GPU: hardware, the node of the lost GPU", 40, 4, 2, xid79,
        stalled=[(FIRE_BY, [stalled("1001", "node-3", "hardware", 8, "GpuLost on GPU 1; ")]),
                 (39, [stalled("1001", "node-3", "hardware", 8, "GpuLost on GPU 1; ")])]))

    # A storage stall: node-2's Lustre client is evicted and its RPCs crawl; the data loader waits,
    # every GPU idles; storage on node-2. Recovers at 35.
    def storage_gpu(t, n, g):
        return IDLE if STALL_AT <= t < 35 else HEALTHY

    def storage_node(t, n):
        if n == 1 and STALL_AT <= t < 35:
            return Node(lustre_read=1e5, rpc_wait=2.0, evictions=1 if t == STALL_AT else 0)
        return Node(lustre_read=1e5 if STALL_AT <= t < 35 else 50e6)

    out.append(Case(
        "data-loader stall on storage: storage on the evicted node, resolved when the job recovers", 50, 4, 2,
        storage_gpu, storage_node,
        stalled=[(FIRE_BY, [stalled("1001", "node-2", "storage", 8, "LustreClientEvicted; lustre_latency_peers; lustre_latency_up; ")]),
                 (47, [])],
        straggler=[(t, []) for t in (38, 41, 44)]))  # the stall's latency lingers: no straggler

    # A data-loader deadlock: the GPUs idle, nothing else moves: application.
    out.append(Case(
        "data-loader deadlock on a one-node job: application", 32, 1, 4,
        lambda t, n, g: _after(t, HEALTHY, IDLE),
        stalled=[(FIRE_BY, [stalled("1001", "node-1", "application", 4)])]))

    # A network hang: node-4's EFA times out retransmits as the job hangs.
    out.append(Case(
        "EFA retransmit timeouts as the job hangs: network on that node", 32, 4, 2,
        lambda t, n, g: _after(t, HEALTHY, NCCL_SPIN),
        lambda t, n: Node(efa_tx=0.0 if t >= STALL_AT else 2e9, efa_timeouts=50 if n == 3 and STALL_AT <= t < 23 else 0),
        stalled=[(FIRE_BY, [stalled("1001", "node-4", "network", 8, "EfaRetransmitTimeouts; efa_errors_up; ")])]))

    # A checkpoint: 8 minutes with the GPUs idle while node-1 writes to Lustre: never a stall.
    out.append(Case(
        "checkpoint: 8 quiet minutes while a node writes to Lustre, no alert", 40, 4, 2,
        lambda t, n, g: IDLE if STALL_AT <= t < 28 else HEALTHY,
        lambda t, n: Node(lustre_write=2e9 if n == 0 and STALL_AT <= t < 28 else 0.0),
        stalled=[(t, []) for t in (24, 26, 28, 30, 32)]))

    # Evaluation: tensor activity drops to 0.3, SMs stay busy; not a stall.
    out.append(Case(
        "evaluation phase: lower tensor activity for 15 minutes, no alert", 40, 2, 4,
        lambda t, n, g: Gpu(tensor=0.3, sm=0.6) if STALL_AT <= t < 35 else HEALTHY,
        stalled=[(t, []) for t in (25, 30, 35)], straggler=[(30, [])]))

    # Start-up: the job holds its GPUs (memory) for 15 minutes before its first step.
    out.append(Case(
        "start-up: 15 minutes holding the GPUs before the first step, no alert", 30, 2, 4,
        lambda t, n, g: Gpu(tensor=0.0, sm=0.01) if t < 15 else HEALTHY,
        stalled=[(t, []) for t in (8, 12, 15, 20)]))

    # The end: the processes exit at 20 (memory freed), the epilog holds the GPUs until 32 (longer
    # than the rate window and `for:` together: only the freed memory tells this from a stall).
    out.append(Case(
        "end of the job: processes gone, the epilog still holds the GPUs, no alert", 40, 2, 4,
        lambda t, n, g: HEALTHY if t < STALL_AT else (Gpu(tensor=0.0, sm=0.0, mem=0.0) if t < 32 else
                                                       Gpu(tensor=0.0, sm=0.0, mem=0.0, job=None)),
        stalled=[(t, []) for t in (24, 27, 30, 33, 36)]))

    # Pod removal: the pod's workload series ends with the job.
    out.append(Case(
        "end of a pod job: the pod is removed, no alert", 30, 2, 2,
        lambda t, n, g: Gpu(job=f"team-a/trainer-{n}") if t < STALL_AT else Gpu(tensor=0.0, sm=0.0, mem=0.0, job=None),
        stalled=[(t, []) for t in (24, 28)],
        ksm={f"team-a/trainer-{n}": {"label_training_kubeflow_org_job_name": "llama"} for n in range(2)}))

    # Half a node: the job holds GPUs 0-3 of 8; the others idle and unheld. Productive: no alert;
    # it then stalls and the alert counts its 4 GPUs.
    def half(t, n, g):
        if g >= 4:
            return Gpu(tensor=0.0, sm=0.0, mem=0.0, job=None)
        return _after(t, HEALTHY, IDLE)

    out.append(Case(
        "a job on half a node: the idle other half is not a stall; its own stall is", 32, 1, 8, half,
        stalled=[(STALL_AT, []), (FIRE_BY, [stalled("1001", "node-1", "application", 4)])],
        straggler=[(15, [])]))

    # Two jobs on one node: 1001 on GPUs 0-3 hangs, 1002 on 4-7 trains on.
    def two(t, n, g):
        if g < 4:
            return _after(t, Gpu(job="1001"), Gpu(tensor=0.0, sm=0.0, job="1001"))
        return Gpu(job="1002")

    out.append(Case(
        "two jobs on one node: only the stalled one alerts", 32, 2, 8, two,
        stalled=[(FIRE_BY, [stalled("1001", i, "application", 8) for i in nodes_of(2)])],
        straggler=[(FIRE_BY, [])]))

    # Pods: with kube-state-metrics the pods of one PyTorchJob are one job; without it each pod is.
    def pods(t, n, g):
        return _after(t, Gpu(job=f"team-a/llama-worker-{n}"), Gpu(tensor=0.0, sm=0.2, job=f"team-a/llama-worker-{n}"))

    out.append(Case(
        "a Kubeflow job's pods are one job through kube_pod_labels", 32, 2, 2, pods,
        stalled=[(FIRE_BY, [stalled("team-a/llama", i, "application", 4) for i in nodes_of(2)])],
        ksm={f"team-a/llama-worker-{n}": {"label_training_kubeflow_org_job_name": "llama"} for n in range(2)}))
    out.append(Case(
        "a batch Job's pods are one job through kube_pod_owner", 32, 2, 2, pods,
        stalled=[(FIRE_BY, [stalled("team-a/llama-job", i, "application", 4) for i in nodes_of(2)])],
        owners={f"team-a/llama-worker-{n}": ("Job", "llama-job") for n in range(2)}))
    out.append(Case(
        "a pod job without kube-state-metrics: each pod is its own job", 32, 2, 2, pods,
        stalled=[(FIRE_BY, [stalled(f"team-a/llama-worker-{n}", f"node-{n + 1}", "application", 2)
                            for n in range(2)])]))

    # A day of a healthy job: hourly 6-minute checkpoints on node-1, an evaluation every 4 hours, a
    # generative (memory-bound) evaluation every 6 hours, and a restart in its allocation at 12:20 (the
    # processes exit, then 11 minutes of start-up).
    def day(t, n, g):
        h, m = divmod(t, 60)
        if h == 12 and 20 <= m < 32:
            return Gpu(tensor=0.0, sm=0.0, mem=0.0) if m == 20 else Gpu(tensor=0.0, sm=0.01)
        if m < 6:
            return IDLE
        if h % 4 == 3 and m < 20:
            return Gpu(tensor=0.25, sm=0.55)
        if h % 6 == 5 and 30 <= m < 45:
            return MEMORY_BOUND
        return Gpu(tensor=0.8 + 0.02 * ((t + g + n) % 5), sm=0.93)

    out.append(Case(
        DAY, 1440, 2, 2, day,
        lambda t, n: Node(lustre_write=1.5e9 if n == 0 and 1 <= t % 60 < 6 else 0.0),
        stalled=[(t, []) for h in range(1, 24) for t in (60 * h + 4, 60 * h + 6, 60 * h + 9, 60 * h + 40)]
        + [(12 * 60 + m, []) for m in (22, 25, 28, 31, 34)],
        straggler=[(t, []) for h in range(1, 24) for t in (60 * h + 9, 60 * h + 30, 60 * h + 40)],
        slowed=[(t, []) for h in range(1, 24) for t in (60 * h + 9, 60 * h + 15, 60 * h + 30, 60 * h + 40)]))

    # --- stragglers ---
    def thermal(t, n, g):
        if t < 10:
            return HEALTHY
        if n == 1 and g == 0:
            return Gpu(tensor=0.93, sm=0.97, clock=1.4e9, thermal=True)
        return Gpu(tensor=0.6, sm=0.9)

    out.append(Case(
        "thermal straggler: the throttled GPU, hardware", 25, 4, 2, thermal,
        straggler=[(9, []), (22, [straggler("1001", "node-2", "hardware",
                                            "GpuHwSlowdownActive; SM clock 1.4GHz, under the job's median; " + moved(0.55), gpu="0")])],
        stalled=[(22, [])]))

    out.append(Case(
        "EFA-degraded straggler: retransmits on one node, network", 25, 4, 2,
        lambda t, n, g: HEALTHY if t < 10 else Gpu(tensor=0.6, sm=0.9),
        lambda t, n: Node(efa_retrans_ratio=0.05 if n == 2 and t >= 10 else 0.0),
        straggler=[(22, [straggler("1001", "node-3", "network", "EfaRetransmitRatioHigh; efa_errors; ")])],
        stalled=[(22, [])]))

    out.append(Case(
        "storage straggler: one node reads its data at a tenth of the others' rate", 25, 4, 2,
        lambda t, n, g: HEALTHY,
        lambda t, n: Node(lustre_read=5e6 if n == 0 and t >= 10 else 50e6),
        straggler=[(22, [straggler("1001", "node-1", "storage", "lustre_read_low; ")])]))

    out.append(Case(
        "uneven activity with no infrastructure signal: application", 25, 1, 4,
        lambda t, n, g: Gpu(tensor=0.4, sm=0.9) if g == 3 and t >= 10 else HEALTHY,
        straggler=[(22, [straggler("1001", "node-1", "application", moved(0.53), gpu="3")])]))

    out.append(Case(
        "healthy jitter and a two-GPU job: no straggler", 40, 2, 1,
        lambda t, n, g: Gpu(tensor=0.5 if n == 0 else 0.9),
        straggler=[(t, []) for t in (20, 30, 39)]))
    # The NCCL-RAS rules (rules/nccl.yml, issue 44) reach this job's ranks: they name the rank the
    # others wait for, and TrainingJobStalled stays quiet for it.
    out.append(Case(
        "an NCCL hang where NCCL RAS answers: its own alert names the rank, TrainingJobStalled is quiet", 32, 2, 2,
        lambda t, n, g: _after(t, HEALTHY, NCCL_SPIN),
        stalled=[(FIRE_BY, [])],
        extra=[{"series": 'training_job:nccl_ras_answering{cluster="c1", training_job="1001", hpc_job="1001"}',
                "values": "1x32"}]))
    out += issue43_cases()
    return out


def issue43_cases() -> list[Case]:
    """The phases of issue 43's Why: each is judged right."""
    out: list[Case] = []
    quiet = (25, 30, 35, 40)

    # A memory-bound phase (autoregressive generation): SM 0.4, tensor 0.03, DRAM 0.75 is working.
    out.append(Case(
        MEMORY, 50, 4, 2, lambda t, n, g: MEMORY_BOUND if STALL_AT <= t < 40 else HEALTHY,
        stalled=[(t, []) for t in quiet], straggler=[(t, []) for t in quiet], slowed=[(t, []) for t in quiet]))

    # One rank stuck in a compute kernel (SM 1.0, tensor 0) while the other 31 GPUs spin in NCCL.
    out.append(Case(
        STUCK_RANK, 32, 4, 8,
        lambda t, n, g: HEALTHY if t < STALL_AT else STUCK if (n, g) == (2, 5) else NCCL_SPIN,
        lambda t, n: Node(efa_tx=0.0 if t >= STALL_AT else 2e9),
        stalled=[(STALL_AT + 3, []), (FIRE_BY, [stalled("1001", "node-3", "application", 32, gpu="5")])],
        straggler=[(FIRE_BY, [])], slowed=[(FIRE_BY, [])]))

    # A requeue: the job releases its GPUs at 20 and comes back under the same id at 23; its start-up
    # (15 minutes) is no stall; once productive again, a hang at 50 is.
    def requeue(t, n, g):
        if 20 <= t < 23:
            return Gpu(tensor=0.0, sm=0.0, mem=0.0, job=None)
        if 23 <= t < 38:
            return Gpu(tensor=0.0, sm=0.01)
        return NCCL_SPIN if t >= 50 else HEALTHY

    out.append(Case(
        REQUEUE, 62, 2, 4, requeue,
        stalled=[(t, []) for t in (24, 27, 30, 34, 38, 45)]
        + [(60, [stalled("1001", i, "application", 8) for i in nodes_of(2)])],
        straggler=[(30, [])], slowed=[(30, []), (45, [])]))

    # An elastic restart onto fewer nodes: the workers exit at 20 and 21 (memory freed, a minute
    # apart), the job goes on on three of its four nodes after 14 minutes of start-up: a new start.
    def elastic(t, n, g):
        if t >= 20 and n == 3:
            return Gpu(tensor=0.0, sm=0.0, mem=0.0, job=None)
        if t == 20 + n % 2:
            return Gpu(tensor=0.0, sm=0.0, mem=0.0)
        return Gpu(tensor=0.0, sm=0.01) if 20 <= t < 35 else HEALTHY

    out.append(Case(
        "an elastic restart onto fewer nodes, its workers exiting a minute apart: a new start, its start-up "
        "is no stall", 45, 4, 2, elastic,
        stalled=[(t, []) for t in (22, 25, 28, 31, 34, 40)], slowed=[(t, []) for t in (25, 34, 40)]))

    # The exporter of a one-node job restarts during its stall (its series gone a minute): the alert
    # holds, and the job is not taken for a new start.
    out.append(Case(
        "an exporter restart during a stall: the alert holds", 40, 1, 4,
        lambda t, n, g: _after(t, HEALTHY, IDLE), lambda t, n: Node(down=t == 31),
        stalled=[(t, [stalled("1001", "node-1", "application", 4)]) for t in (30, 32, 35, 38)]))

    # Pipeline stages unbalanced by design (the last stage computes the loss), its node sending less
    # over EFA, through a checkpoint and an evaluation: the shape is the job's own, no straggler.
    stages = (0.85, 0.7, 0.6, 0.95)

    def pipeline(t, n, g):
        if 40 <= t < 46:
            return IDLE
        if 60 <= t < 75:
            return Gpu(tensor=0.35 * stages[n], sm=0.6)
        return Gpu(tensor=stages[n] + 0.02 * ((t + g) % 3), sm=0.95)

    checks = (15, 25, 35, 50, 65, 80, 95)
    out.append(Case(
        PIPELINE, 100, 4, 2, pipeline,
        lambda t, n: Node(efa_tx=0.9e9 if n == 3 else 2e9, lustre_write=2e9 if n == 0 and 40 <= t < 46 else 0.0),
        stalled=[(t, []) for t in checks], straggler=[(t, []) for t in checks], slowed=[(t, []) for t in checks]))

    # Uneven experts: each GPU's share of the work differs and jitters from minute to minute.
    out.append(Case(
        "uneven experts (mixture of experts): no straggler", 60, 1, 8,
        lambda t, n, g: Gpu(tensor=0.45 + 0.06 * g + 0.02 * ((7 * t + 3 * g) % 5 - 2), sm=0.9),
        straggler=[(t, []) for t in (20, 30, 40, 55)], slowed=[(t, []) for t in (30, 55)]))

    # A job that slows on every node (GPUs busy half as much, the same phase) because node-2's Lustre
    # RPCs take 50 times their usual 5 ms: storage, on node-2.
    slow_gpu = Gpu(tensor=0.45, sm=0.5)
    out.append(Case(
        SLOW_STORAGE, 32, 4, 2, lambda t, n, g: _after(t, HEALTHY, slow_gpu),
        lambda t, n: Node(rpc_wait=0.25 if n == 1 and t >= STALL_AT else 0.005),
        slowed=[(STALL_AT + 3, []),
                (FIRE_BY, [slow("1001", "node-2", "storage", "52.94%", "lustre_latency_peers; lustre_latency_up; ")])],
        straggler=[(FIRE_BY, [straggler("1001", "node-2", "storage", "lustre_errors; ")])], stalled=[(FIRE_BY, [])]))

    # The same slowdown with no signal anywhere: application, on every node.
    out.append(Case(
        "a job that slows on every node with no infrastructure signal: application", 32, 4, 2,
        lambda t, n, g: _after(t, HEALTHY, Gpu(tensor=0.5, sm=0.56)),
        slowed=[(FIRE_BY, [slow("1001", i, "application", "58.82%") for i in nodes_of(4)])],
        straggler=[(FIRE_BY, [])], stalled=[(FIRE_BY, [])]))

    # Every GPU throttles (a facility power cap or cooling): clocks at 1.2 GHz, thermal slowdown.
    out.append(Case(
        "a job that slows on every node as every GPU throttles: hardware on every node", 32, 4, 2,
        lambda t, n, g: _after(t, HEALTHY, Gpu(tensor=0.9, sm=0.97, clock=1.2e9, thermal=True)),
        slowed=[(FIRE_BY, [slow("1001", i, "hardware", "64.17%") for i in nodes_of(4)])],
        straggler=[(FIRE_BY, [])], stalled=[(FIRE_BY, [])]))

    # A failing node: its EFA throughput falls to 60% of its peers', it retransmits 0.5% of its packets
    # (under EfaRetransmitRatioHigh's 1%) and times out a few: the job slows, network on that node.
    out.append(Case(
        FAILING_NODE, 32, 4, 2, lambda t, n, g: _after(t, HEALTHY, Gpu(tensor=0.5, sm=0.56)),
        lambda t, n: Node(efa_tx=(1e9 if n == 2 else 1.6e9) if t >= STALL_AT else 2e9,
                          efa_retrans_ratio=0.005 if n == 2 and t >= STALL_AT else 0.0,
                          efa_timeouts=2 if n == 2 and t >= STALL_AT else 0),
        slowed=[(FIRE_BY, [slow("1001", "node-3", "network", "58.82%", "efa_errors_up; efa_retransmits_up; ")])],
        straggler=[(FIRE_BY, [straggler("1001", "node-3", "network", "efa_errors; efa_traffic_low; ")])],
        stalled=[(FIRE_BY, [])]))

    # A data-loader stall at a realistic latency: node-2's Lustre RPCs take 50 ms, 50 times their
    # usual 1 ms (under any absolute 100 ms rule): storage on node-2.
    out.append(Case(
        STORAGE_LATENCY, 40, 4, 2, lambda t, n, g: IDLE if STALL_AT <= t < 35 else HEALTHY,
        lambda t, n: Node(rpc_wait=0.05 if n == 1 and STALL_AT <= t < 35 else 0.001,
                          lustre_read=1e5 if STALL_AT <= t < 35 else 50e6),
        stalled=[(FIRE_BY, [stalled("1001", "node-2", "storage", 8, "lustre_latency_peers; lustre_latency_up; ")])]))

    # The share of the job's work moves without any GPU changing when the job's view changes: GPUs
    # that stop working, a node whose series go or lag. Two pipeline stages on two nodes (tensor 0.5
    # and 0.9, in the same phase: tensor/SM 0.9), so that the job's median depends on which it sees.
    def stage(n: int) -> Gpu:
        return Gpu(tensor=0.5, sm=0.5 / 0.9) if n == 0 else Gpu(tensor=0.9, sm=1.0)

    def ends_apart(t, n, g):
        if t >= (30 if n == 0 else 40):  # node-1's processes exit at 30, node-2's at 40; then the epilog
            return Gpu(tensor=0.0, sm=0.0, mem=0.0, job=None if t >= 44 else "1001")
        return stage(n)

    quiet = [(t, []) for t in (32, 34, 36, 38, 40, 42, 45)]
    out.append(Case(ENDS_APART, 48, 2, 4, ends_apart, straggler=quiet, stalled=quiet, slowed=quiet))
    quiet = [(t, []) for t in (30, 33, 36, 40, 44, 47)]
    out.append(Case(EXPORTER_GONE, 48, 2, 4, lambda t, n, g: stage(n),
                    lambda t, n: Node(down=n == 0 and 28 <= t < 47), straggler=quiet, slowed=quiet))
    out.append(Case(LATE_SCRAPES, 48, 2, 4, lambda t, n, g: stage(n),
                    lambda t, n: Node(down=n == 0 and t == 25, late=n == 0 and t in (30, 31, 35, 37, 38)),
                    straggler=[(t, []) for t in (26, 28, 32, 34, 37, 40, 44)], slowed=quiet))
    return out


def _sorted(alerts: list[dict]) -> list[dict]:
    return alerts


def suite(day: bool = False) -> dict:
    """The cases (day: the day-long one alone, else every other)."""
    tests = []
    for c in cases():
        if (c.name == DAY) != day:
            continue
        group = {"name": c.name, "interval": "1m", "input_series": series(c), "alert_rule_test": []}
        for t, exp in c.stalled:
            group["alert_rule_test"].append({"eval_time": f"{t}m", "alertname": "TrainingJobStalled", "exp_alerts": exp})
        for t, exp in c.straggler:
            group["alert_rule_test"].append({"eval_time": f"{t}m", "alertname": "TrainingJobStraggler",
                                             "exp_alerts": exp})
        for t, exp in c.slowed:
            group["alert_rule_test"].append({"eval_time": f"{t}m", "alertname": "TrainingJobSlow", "exp_alerts": exp})
        tests.append(group)
    # Every rule file: the job rules read the others' alerts as evidence.
    files = ["efa.yml", "fsx.yml", "gpu.yml", "job.yml", "xid.yml"]
    return {"rule_files": [f"../../rules/{f}" for f in files], "evaluation_interval": "1m", "tests": tests}


HEADER = """\
# GENERATED by `python -m tests.job_cases` from tests/job_cases.py: edit that and re-run.
# promtool cases of rules/job.yml (TrainingJobStalled, TrainingJobStraggler): every cause, and the
# quiet phases that must not fire (checkpoint, evaluation, start-up, the job's end, half a node,
# two jobs on a node, pods without kube-state-metrics, a healthy day with hourly checkpoints).
"""


def text(day: bool = False) -> str:
    return HEADER + yaml.safe_dump(suite(day), sort_keys=False, width=200)


def main() -> int:
    for path, day in ((SUITE, False), (DAY_SUITE, True)):
        path.write_text(text(day))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
