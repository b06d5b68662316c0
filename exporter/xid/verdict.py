"""The health verdict per GPU and per node, from XIDs since boot (less acknowledgements) and the
GPU collector's live NVML state. Pure: inputs in, verdicts out.

Levels, least to most severe: healthy, degraded, unknown, reset_required, reboot_required,
replace_required. Each reason has one level; a GPU's verdict is its most severe reason's, the
node's the most severe of its GPUs' and its own (GPU count below expected, NVML unusable).
XID reasons are sticky (they last until `ack`); NVML state reasons last while the state does.

`unknown` is "this GPU's health could not be read": NVML did not answer for it within
gpu.read_timeout_seconds (a hung call, one of the commonest signs of a GPU about to fall off the
bus) or its health-critical reads failed. It is never `healthy`: `check` exits 3 on it, the
daemon exports it. It ranks above `degraded` (a node we cannot judge must not take work a
degraded one would) and below the action levels (what could be read and says "reset" wins). A GPU
that has not answered for health.unresponsive_seconds is `reboot_required` (`gpu_unresponsive`):
a call stuck that long is a driver or GPU fault that only a reboot clears (docs/xid.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.health import GpuHealth, NodeGpuHealth
from exporter.xid.catalog import lookup
from exporter.xid.parser import pci_label
from exporter.xid.policy import Policy
from exporter.xid.store import OTHER, Count, EventStore, split_key
from exporter.xid.sxid_catalog import SxidPolicy, describe
from exporter.xid.sxid_state import by_report

VERDICTS = ("healthy", "degraded", "unknown", "reset_required", "reboot_required", "replace_required")
UNKNOWN = "unknown"
LEVEL = {v: i for i, v in enumerate(VERDICTS)}

# reason -> verdict level. The set is fixed: it is a label value.
GPU_REASONS: dict[str, str] = {
    "xid_replace": "replace_required",
    "row_remap_failure": "replace_required",
    "xid_reboot": "reboot_required",
    "gpu_lost": "reboot_required",
    "recovery_action_reboot": "reboot_required",
    "xid_reset": "reset_required",
    "row_remap_pending": "reset_required",
    "recovery_action_reset": "reset_required",
    "uncorrected_ecc": "reset_required",
    # NVML did not answer for the GPU (a hung call): unknown at once, reboot once it lasts
    "gpu_unresponsive": "reboot_required",
    "gpu_not_answering": "unknown",
    "gpu_not_read": "unknown",  # NVML answered with errors to health-critical reads, or was not asked
    "recovery_action_drain": "degraded",
    "recovery_action_other": "degraded",
    "xid_unknown": "degraded",
    # NVLink fabric registration (exporter.gpu.fabric): CUDA cannot start on the GPU
    "fabric_not_completed": "reboot_required",
    "fabric_status_error": "reboot_required",
    "fabric_health": "degraded",
    # Active checks (exporter.activecheck.findings), while their result is valid: a DCGM failure
    # counts as its category says; an NVML check off its expected value is a configuration to fix
    "active_dcgm_hardware": "replace_required",
    "active_dcgm_integration": "reboot_required",
    "active_dcgm_other": "degraded",
    "active_nvml": "degraded",
}
NODE_REASONS: dict[str, str] = {
    "gpu_count_below_expected": "reboot_required",
    "nvml_unavailable": "unknown",  # no GPU could be read: never healthy (check exits 3)
    # NVSwitch SXids: one switch in trouble fails NVLink for every GPU, so they are the node's
    "sxid_replace": "replace_required",
    "sxid_reboot": "reboot_required",
    "sxid_unknown": "degraded",
    # Active checks about the node, or about a GPU the tool did not name: bandwidth under the
    # instance type's expected value is degraded, never an action
    "active_dcgm_hardware": "replace_required",
    "active_dcgm_integration": "reboot_required",
    "active_dcgm_other": "degraded",
    "active_nvml": "degraded",
    "active_nccl_bandwidth": "degraded",
    "active_nccl_failed": "degraded",
    "active_efa": "degraded",
}
SXID_TIER_REASON = {"replace": "sxid_replace", "reboot": "sxid_reboot", "unknown": "sxid_unknown"}
UNRESPONSIVE_S = 60.0  # health.unresponsive_seconds: a GPU not answering this long needs a reboot
FABRIC_GRACE_S = 300.0  # registration normally completes within a minute of the Fabric Manager starting
ALL_REASONS = {**GPU_REASONS, **NODE_REASONS}
TIER_REASON = {"replace": "xid_replace", "reboot": "xid_reboot", "reset": "xid_reset",
               "unknown": "xid_unknown"}
# NVML field 230 -> reason. 6 (bus reset) and 7 (system reboot) exist only in cuda-python preview
# headers; they map as XID 154's action codes do (exporter.xid.policy.ACTION_TIERS).
RECOVERY_REASON = {1: "recovery_action_reset", 2: "recovery_action_reboot", 3: "recovery_action_drain",
                   4: "recovery_action_reset", 6: "recovery_action_reset", 7: "recovery_action_reboot"}


# reason -> the runbook section (docs/runbooks.md, the alert that pages on it) an operator opens for
# it: the landing page links each reason there (tests/test_landing_page.py holds every reason to a
# section that exists).
RUNBOOK: dict[str, str] = {
    "xid_replace": "GpuXidReplaceNow", "xid_reboot": "GpuXidRebootRequired",
    "xid_reset": "GpuXidResetRequired", "xid_unknown": "GpuXidUnknown",
    "row_remap_failure": "GpuRowRemapFailure",
    "row_remap_pending": "GpuRowRemapPending", "gpu_lost": "GpuLost", "gpu_unresponsive": "GpuUnresponsive",
    "gpu_not_answering": "GpuUnresponsive", "gpu_not_read": "GpuHealthUnreadable",
    "recovery_action_reboot": "GpuRecoveryActionRebootRequired",
    "recovery_action_reset": "GpuRecoveryActionRequired",
    "recovery_action_drain": "GpuRecoveryActionRequired",
    "recovery_action_other": "GpuRecoveryActionRequired",
    "uncorrected_ecc": "GpuEccUncorrectedErrors", "fabric_not_completed": "GpuFabricNotCompleted",
    "fabric_status_error": "GpuFabricRegistrationFailed", "fabric_health": "GpuFabricRegistrationFailed",
    "gpu_count_below_expected": "GpuCountBelowExpected", "nvml_unavailable": "GpuCountBelowExpected",
    "sxid_replace": "NvswitchSxidReplaceNow", "sxid_reboot": "NvswitchSxidRebootRequired",
    "sxid_unknown": "NvswitchSxidUnknown",
    **dict.fromkeys(("active_dcgm_hardware", "active_dcgm_integration", "active_dcgm_other", "active_nvml",
                     "active_nccl_bandwidth", "active_nccl_failed", "active_efa"), "GpuActiveCheckFailed"),
}
# Reasons an `ack` clears (the sticky XID ones); the others last as long as the NVML state does.
ACKABLE = frozenset(TIER_REASON.values())


def worst(verdicts: list[str]) -> str:
    return max(verdicts, key=LEVEL.__getitem__, default="healthy")


@dataclass
class XidLine:
    xid: int
    tier: str
    count: int
    last_seen: float  # wall time
    acknowledged: bool  # every occurrence so far is covered by an ack
    meaning: str
    undecoded: int = 0  # events of an NVLink XID (74, 144-150) NVIDIA's decode table could not read


@dataclass
class SxidLine:
    switch: str  # nvidia-nvswitch<N> index, "" when unknown
    pci_bus_id: str
    sxid: int
    severity: str
    tier: str
    count: int
    last_seen: float  # wall time
    meaning: str


def sxid_reasons(lines: list[SxidLine]) -> set[str]:
    return {SXID_TIER_REASON[x.tier] for x in lines if x.tier in SXID_TIER_REASON}


@dataclass
class GpuVerdict:
    gpu: str  # index, "" when NVML does not list it
    uuid: str
    pci_bus_id: str
    verdict: str = "healthy"
    reasons: list[str] = field(default_factory=list)
    xids: list[XidLine] = field(default_factory=list)
    fabric_state: str | None = None  # NVLink fabric registration; None when not supported or not read


@dataclass
class NodeVerdict:
    verdict: str
    reasons: list[str]
    gpus: list[GpuVerdict]
    gpu_count: int | None
    expected_gpus: int | None
    sxids: list[SxidLine] = field(default_factory=list)


def xid_lines(counts: dict[str, Count], unacked: dict[str, Count], policy: Policy) -> list[XidLine]:
    """Counts of one GPU grouped by (xid, tier), as exported."""
    grouped: dict[tuple[int, str], XidLine] = {}
    for key, c in counts.items():
        xid, action = split_key(key)
        tier = policy.tier(xid, action)
        info = lookup(xid)
        line = grouped.get((xid, tier))
        if line is None:
            line = grouped[(xid, tier)] = XidLine(xid, tier, 0, 0.0, True, info.meaning if info else "")
        line.count += c.count
        if policy.undecoded(xid, action):
            line.undecoded += c.count
        line.last_seen = max(line.last_seen, c.last_wall)
        if key in unacked:
            line.acknowledged = False
    return sorted(grouped.values(), key=lambda x: (x.xid, x.tier))


def fabric_reasons(h: GpuHealth, uptime_s: float | None, grace_s: float = FABRIC_GRACE_S) -> set[str]:
    """Fabric registration not completed once the boot grace has passed (uptime unknown: at
    once), completed with an error status, or a health-mask problem. Not supported: nothing."""
    out = set()
    if h.fabric_state in ("not_started", "in_progress") and (uptime_s is None or uptime_s >= grace_s):
        out.add("fabric_not_completed")
    if h.fabric_state == "completed" and h.fabric_status:
        out.add("fabric_status_error")
    if h.fabric_problems:
        out.add("fabric_health")
    return out


def answer_reasons(h: GpuHealth, unresponsive_s: float = UNRESPONSIVE_S) -> set[str]:
    """A GPU NVML did not answer for (`unanswered_s` set), or whose health reads failed."""
    if h.unanswered_s is not None:
        return {"gpu_unresponsive" if h.unanswered_s >= unresponsive_s else "gpu_not_answering"}
    return set() if h.read_ok else {"gpu_not_read"}


def gpu_reasons(h: GpuHealth | None, lines: list[XidLine], lost: bool, uptime_s: float | None = None,
                fabric_grace_s: float = FABRIC_GRACE_S, unresponsive_s: float = UNRESPONSIVE_S) -> list[str]:
    reasons: set[str] = set()
    for line in lines:
        if not line.acknowledged and line.tier in TIER_REASON:
            reasons.add(TIER_REASON[line.tier])
    if lost or (h is not None and h.lost):
        reasons.add("gpu_lost")
    if h is not None:
        if h.row_remap_failure:
            reasons.add("row_remap_failure")
        if h.row_remap_pending:
            reasons.add("row_remap_pending")
        if h.recovery_action:
            reasons.add(RECOVERY_REASON.get(h.recovery_action, "recovery_action_other"))
        if h.ecc_uncorrected_volatile:
            reasons.add("uncorrected_ecc")
        reasons |= fabric_reasons(h, uptime_s, fabric_grace_s)
        if not h.lost:
            reasons |= answer_reasons(h, unresponsive_s)
    return sorted(reasons, key=lambda r: (-LEVEL[GPU_REASONS[r]], r))


def node_verdict(gpus: list[GpuVerdict], health: NodeGpuHealth | None, expected: int | None,
                 sxids: list[SxidLine] | None = None, extra: frozenset[str] = frozenset()) -> NodeVerdict:
    """`extra`: node reasons of other sources (the active checks')."""
    reasons: set[str] = sxid_reasons(sxids or []) | extra
    for g in gpus:
        reasons.update(g.reasons)
    count = None
    if health is not None:
        if health.nvml_error:
            reasons.add("nvml_unavailable")
        else:
            count = health.count
            exp = health.expected if health.expected is not None else expected
            expected = exp
            if exp is not None and count < exp:
                reasons.add("gpu_count_below_expected")
    verdict = worst([ALL_REASONS[r] for r in reasons])
    ordered = sorted(reasons, key=lambda r: (-LEVEL[ALL_REASONS[r]], r))
    return NodeVerdict(verdict, ordered, gpus, count, expected, list(sxids or []))


@dataclass(frozen=True)
class ActiveReasons:
    """Reasons from the active checks' valid results (exporter.activecheck.findings): per GPU
    index, and the node's own. An expired result gives none: absent, never healthy."""

    gpus: dict[str, frozenset[str]] = field(default_factory=dict)
    node: frozenset[str] = frozenset()


@dataclass
class GpuInput:
    """What the verdict needs of one GPU (or PCI address with XIDs): its labels, the GPU
    collector's reading of it (None when not read), its XIDs (acks applied) and whether NVML
    marked it lost."""

    gpu: str
    uuid: str
    pci_bus_id: str
    health: GpuHealth | None
    xids: list[XidLine]
    lost: bool = False


def judge(gpus: list[GpuInput], health: NodeGpuHealth | None, expected: int | None,
          sxids: list[SxidLine] | None = None, uptime_s: float | None = None,
          fabric_grace_s: float = FABRIC_GRACE_S, unresponsive_s: float = UNRESPONSIVE_S,
          active: ActiveReasons | None = None) -> NodeVerdict:
    """The node and per-GPU verdicts from their inputs (fabric registration judged once
    `fabric_grace_s` of uptime have passed; a GPU not answering for `unresponsive_s` needs a
    reboot; `active`: the active checks' reasons, a GPU's that no input names the node's)."""
    out = []
    active = active or ActiveReasons()
    for g in gpus:
        reasons = gpu_reasons(g.health, g.xids, g.lost, uptime_s, fabric_grace_s, unresponsive_s)
        if active.gpus.get(g.gpu):
            reasons = sorted(set(reasons) | active.gpus[g.gpu], key=lambda r: (-LEVEL[GPU_REASONS[r]], r))
        out.append(GpuVerdict(g.gpu, g.uuid, g.pci_bus_id, worst([GPU_REASONS[r] for r in reasons]), reasons,
                              g.xids, g.health.fabric_state if g.health is not None else None))
    out.sort(key=lambda g: (not g.gpu.isdigit(), int(g.gpu) if g.gpu.isdigit() else 0, g.pci_bus_id))
    named = {g.gpu for g in gpus}
    extra = active.node.union(*(r for i, r in active.gpus.items() if i not in named))
    return node_verdict(out, health, expected, sxids, extra)


def sxid_lines(store: EventStore, policy: SxidPolicy) -> list[SxidLine]:
    """The SXid counts since boot with their policy tier, as exported and judged."""
    out = []
    with store.lock:
        switches = dict(store.indices)
    for (pci, sxid, severity), c in sorted(by_report(store).items()):
        switch = switches.get(pci)
        label = OTHER if pci == OTHER else pci_label(pci)
        out.append(SxidLine("" if switch is None else str(switch), label, sxid, severity,
                            policy.tier(sxid, severity), c.count, c.last_wall, describe(sxid)))
    return out
