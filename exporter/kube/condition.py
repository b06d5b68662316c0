"""What the verdict asks of the Node: the `GpuHealthy` condition and the opt-in actions (pure).

The mapping from the verdict's states to the condition is `condition_of`, one table: a state it does
not know (a new one, or `unknown`) is `Unknown`, never `False`, so an added verdict state can
never taint a node by accident. The exporter's own trouble (check's exit-3 rule:
exporter.commands.check) is `Unknown` too, and leaves the actions as they are."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from exporter.attribution.ledger import XID, Attribution
from exporter.attribution.text import describe
from exporter.xid.parser import pci_key

CONDITION_TYPE = "GpuHealthy"
MESSAGE_LIMIT = 1024  # bytes; a Node's conditions are read by every `kubectl describe node`

# verdict -> (condition status, reason). One row per verdict state (exporter.xid.verdict.VERDICTS).
CONDITIONS: dict[str, tuple[str, str]] = {
    "healthy": ("True", "Healthy"),
    "degraded": ("False", "Degraded"),
    "reset_required": ("False", "ResetRequired"),
    "reboot_required": ("False", "RebootRequired"),
    "replace_required": ("False", "ReplaceRequired"),
    "unknown": ("Unknown", "VerdictUnknown"),  # a GPU that does not answer
}
UNKNOWN = ("Unknown", "VerdictUnknown")  # a state without a row
TAINTED = frozenset({"reset_required", "reboot_required", "replace_required"})  # action required
REPLACE = frozenset({"replace_required"})  # HyperPod's replacement label


def condition_of(verdict: str) -> tuple[str, str]:
    """(status, reason) of the condition for a node verdict; any state not in CONDITIONS (the
    `unknown` of a GPU that does not answer, or one added later) is Unknown."""
    return CONDITIONS.get(verdict, UNKNOWN)


@dataclass(frozen=True)
class Desired:
    """The condition to keep, and the actions the verdict asks for: `taint`/`replace` True (set),
    False (remove ours), None (leave as they are: the exporter cannot tell)."""

    status: str
    reason: str
    message: str
    taint: bool | None
    replace: bool | None


def cannot_tell(reason: str, message: str) -> Desired:
    return Desired("Unknown", reason, bound(message), None, None)


def desired(nv: object | None, problems: list[tuple[str, str]], hits: Iterable[Attribution] = ()) -> Desired:
    """From the node verdict (None: there is none this collection) and what kept the exporter from
    telling (check's exit-3 causes, as (reason, text)): an action-required verdict stands
    despite them (what was read already shows it), anything else is Unknown."""
    if nv is None:
        reason, text = problems[0] if problems else ("VerdictUnavailable", "the verdict could not be made")
        return cannot_tell(reason, text)
    verdict = getattr(nv, "verdict", "")
    status, reason = condition_of(verdict)
    if status == "Unknown":  # the exporter's own trouble names it better than the verdict's Unknown
        reason = problems[0][0] if problems else reason
        return cannot_tell(reason, f"verdict {verdict or 'missing'}: " + describe_gpus(nv, hits)
                           + "".join(f"; {t}" for _, t in problems))
    if problems and verdict not in TAINTED:
        r, _ = problems[0]
        return cannot_tell(r, "; ".join(t for _, t in problems))
    return Desired(status, reason, bound(describe_gpus(nv, hits)), verdict in TAINTED, verdict in REPLACE)


def describe_gpus(nv: object, hits: Iterable[Attribution] = ()) -> str:
    """`GPU 1 0000:53:00.0 replace_required (xid_replace): XID 94 x1; hit slurm job 4242` for each
    GPU that is not healthy, then the node's own reasons; bounded by `bound`."""
    by_gpu: dict[str, list[Attribution]] = {}
    for r in hits:
        if r.kind == XID:
            by_gpu.setdefault(r.pci, []).append(r)
    parts = []
    for g in getattr(nv, "gpus", []):
        if g.verdict == "healthy":
            continue
        xids = ", ".join(f"XID {x.xid} x{x.count}" for x in g.xids if not x.acknowledged)
        text = f"GPU {g.gpu or '?'} {g.pci_bus_id} {g.verdict} ({','.join(g.reasons)})"
        if xids:
            text += f": {xids}"
        hit = by_gpu.get(pci_key(g.pci_bus_id) or "", [])
        jobs = sorted({w.describe() for r in hit for w in r.workloads or ()})
        if jobs:
            text += "; hit " + ", ".join(jobs)
        elif hit:
            text += "; " + describe(hit[-1].workloads)
        parts.append(text)
    gpu_reasons = {r for g in getattr(nv, "gpus", []) for r in g.reasons}
    node_only = [r for r in getattr(nv, "reasons", []) if r not in gpu_reasons]
    if node_only:
        parts.append("node: " + ", ".join(node_only))
    if not parts:
        count = getattr(nv, "gpu_count", None)
        return f"all {count if count is not None else ''} GPUs healthy".replace("  ", " ")
    return "; ".join(parts)


def bound(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """`text` cut to `limit` UTF-8 bytes, saying it was cut."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    tail = " [... cut]"
    return raw[:limit - len(tail)].decode(errors="ignore") + tail
