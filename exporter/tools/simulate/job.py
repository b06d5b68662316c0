"""Training-job scenarios of the simulated node (issue 34): what one node of a multi-node job shows
when the job stalls or straggles, for each cause, on the metrics the exporter exports.

Run several simulated nodes with `--scenario slurm-job` (they share Slurm job 4242) and one of these
each: the node at fault gets the cause's scenario, the others `job-wait` (their ranks wait in NCCL
for it). Every job scenario trains from the start (GPM SM ~0.9, tensor ~0.55, EFA and Lustre reads
moving, little written), then from STALL_AT_S to RECOVER_AT_S seconds after the node's start:

- `job-wait`: the ranks wait in a collective that does not complete: NCCL's spin (SM activity 0.2,
  tensor 0, NVML utilisation 100%), EFA flat. A node of a stalled job that is not to blame.
- `job-nccl-hang`: the same, on every node (an application hang: no infrastructure signal).
- `job-storage-stall`: the data loader waits on FSx for Lustre: GPUs idle, the client evicted by
  an OST at the onset and its RPCs taking 2 s, reads stalled.
- `job-xid79`: GPU 3 falls off the bus (XID 79) at the onset and stays lost; the other GPUs spin.
- `job-checkpoint`: a checkpoint: GPUs idle while the node writes 1.5 GB/s to Lustre (must not fire).
- `job-thermal-straggler`: GPU 3 throttles (HW thermal slowdown, SM clock 1.2 GHz) and stays
  busy (tensor 0.9) while the job's other GPUs would wait; no stall.
- `job-efa-degraded`: the node's first EFA device retransmits 5% of its packets (and times some
  out): a network straggler.
- `job-healthy`: trains all along (the healthy long run; checkpoints are `job-checkpoint`'s).

Issue 43's phases (run them on every node of their job, one node is enough):

- `job-memory-bound`: autoregressive generation (an RLHF rollout, a generative evaluation) in the
  window: SM 0.4, tensor 0.03, DRAM 0.75. Working: no alert.
- `job-stuck-rank`: GPU 3 stays in a kernel that never ends (SM 1.0, tensor 0, DRAM 0) from the
  onset while the other GPUs spin in NCCL: a stall naming that GPU.
- `job-requeue`: the job releases its GPUs at the onset (mapping removed, memory freed, EFA flat),
  comes back under the same id REQUEUE_GAP_S later and starts up (GPUs idle, memory held) until
  RECOVER_AT_S, then trains: no alert.
- `job-pipeline-stage`: the node's GPUs are pipeline stages unbalanced by design from the start
  (tensor activity 0.33 to 0.58 by GPU): no straggler.
- `job-slow`: every GPU busy half as much in the window, same phase (SM and tensor halved): a job
  that slows, application.
- `job-storage-latency`: the data loader waits on FSx for Lustre in the window: GPUs idle, reads
  stalled, every OST RPC taking 50 times its usual 0.8 ms (40 ms: under any absolute 100 ms rule);
  no eviction.

The NVML side is in nvml_scenarios (GPM levels, clocks, a lost GPU), the EFA side in efa.py, the
Lustre side in lustre.py; each reads the timeline from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exporter.profiles import Profile
from exporter.tools.simulate.source import SimSource

STALL_AT_S = 20.0
RECOVER_AT_S = 60.0
CULPRIT_GPU = 3
REQUEUE_GAP_S = 6.0  # job-requeue: how long the job holds no GPU
LATENCY_FACTOR = 50  # job-storage-latency: OST RPCs this many times their usual round trip

WINDOW = f"from {STALL_AT_S:g}s to {RECOVER_AT_S:g}s"
SCENARIOS = {
    "job-wait": f"a node of a stalled job: its ranks spin in NCCL (SM 0.2, tensor 0, utilisation 100%) and "
                f"EFA goes flat {WINDOW}",
    "job-nccl-hang": f"an NCCL hang with healthy links {WINDOW} (run it on every node of the job)",
    "job-storage-stall": f"the data loader waits on FSx for Lustre {WINDOW}: GPUs idle, an eviction, 2 s "
                         "RPCs, reads stalled",
    "job-xid79": f"GPU {CULPRIT_GPU} falls off the bus (XID 79) at {STALL_AT_S:g}s; the other GPUs spin "
                 "in NCCL",
    "job-checkpoint": f"a checkpoint {WINDOW}: GPUs idle, 1.5 GB/s written to Lustre (no alert)",
    "job-thermal-straggler": f"GPU {CULPRIT_GPU} throttles from {STALL_AT_S:g}s (HW thermal, SM clock "
                             "1.2 GHz) and stays busier than the job's other GPUs",
    "job-efa-degraded": f"the first EFA device retransmits 5% of its packets from {STALL_AT_S:g}s",
    "job-healthy": "a training job all along: steady GPM activity, EFA traffic, Lustre reads",
    "job-memory-bound": f"a memory-bound generation phase {WINDOW}: SM 0.4, tensor 0.03, DRAM 0.75 "
                        "(no alert)",
    "job-stuck-rank": f"GPU {CULPRIT_GPU} stuck in a never-ending kernel from {STALL_AT_S:g}s (SM 1.0, "
                      "tensor 0) while the other GPUs spin in NCCL",
    "job-requeue": f"the job releases its GPUs at {STALL_AT_S:g}s, comes back under the same id "
                   f"{REQUEUE_GAP_S:g}s later and starts up until {RECOVER_AT_S:g}s (no alert)",
    "job-pipeline-stage": "pipeline stages unbalanced by design: tensor activity 0.33 to 0.58 by GPU, "
                          "from the start (no straggler)",
    "job-slow": f"every GPU busy half as much {WINDOW}, in the same phase: a job that slows",
    "job-storage-latency": f"the data loader waits on FSx for Lustre {WINDOW}: GPUs idle, reads stalled, OST "
                           "RPCs 50x their usual 0.8 ms, no eviction",
}
# Scenarios under which the node trains (reads, a little writing) rather than the simulation's
# default I/O pattern.
ALL = frozenset(SCENARIOS)
# The GPUs of these stop computing during the window.
IDLE = frozenset({"job-storage-stall", "job-checkpoint", "job-storage-latency"})
SPIN = frozenset({"job-wait", "job-nccl-hang", "job-xid79", "job-stuck-rank"})
EFA_FLAT = SPIN | IDLE | {"job-requeue"}
LUSTRE_WAIT = frozenset({"job-storage-stall", "job-storage-latency"})  # the data loader's reads stop


def released(elapsed_s: float) -> bool:
    """job-requeue: the job holds no GPU now."""
    return STALL_AT_S <= elapsed_s < STALL_AT_S + REQUEUE_GAP_S


def stalled(elapsed_s: float) -> bool:
    return STALL_AT_S <= elapsed_s < RECOVER_AT_S


def frozen(counter_at: float, rate: float, elapsed_s: float, until: float = RECOVER_AT_S) -> float:
    """A counter growing at `rate` per second that stands still from STALL_AT_S to `until`: its
    value at `elapsed_s` (counter_at: its value at 0)."""
    moving = min(elapsed_s, STALL_AT_S) + max(0.0, elapsed_s - until)
    return counter_at + rate * moving


class JobSimSource(SimSource):
    """Registers the job scenarios (--list-scenarios, validation); the NVML, EFA and Lustre sources
    play them (each reads `job_scenarios` of the node's scenarios)."""

    name = "job"
    scenarios = SCENARIOS

    def __init__(self, root: Path, profile: Profile, scenarios: set[str]) -> None:
        super().__init__(root, profile, scenarios)

    def build(self) -> None:
        pass

    def settings(self) -> dict[str, Any]:
        return {}


def job_scenarios(scenarios: set[str] | frozenset[str]) -> frozenset[str]:
    """The job scenarios among a node's scenarios."""
    return frozenset(scenarios) & ALL


SOURCE = JobSimSource
