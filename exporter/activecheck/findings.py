"""The verdict's reasons from the active checks' results (exporter.xid.verdict.ActiveReasons).

Only a valid `fail` counts; pass, warn, skip, timeout and error add nothing, and a result past
its validity is absent (never healthy, never a fault):
- DCGM, by the failed test's category: Hardware (memory, diagnostic, memtest, pulse_test...) or
  any error of ISOLATE severity -> active_dcgm_hardware (replace); Integration (pcie) ->
  active_dcgm_integration (reboot); Deployment, Performance, Custom -> active_dcgm_other
  (degraded: a setting or a slow GPU, not broken hardware). DCGM 3.x names no GPU in its
  Deployment results: those reasons are the node's.
- NVML: active_nvml (degraded: a setting off, a lane or an NVLink down, a GPU missing).
- nccl-tests: bandwidth under the expected value -> active_nccl_bandwidth, wrong values or an
  NCCL/CUDA failure -> active_nccl_failed; both degraded, never replace: a collective's speed
  and errors do not say which part of the node is at fault.
- EFA: fewer devices than expected, or the loopback failed -> active_efa (degraded).
"""

from __future__ import annotations

from collections.abc import Iterable

from exporter.activecheck.nccl import BANDWIDTH
from exporter.activecheck.result import CheckResult, Finding
from exporter.xid.verdict import ALL_REASONS, LEVEL, ActiveReasons

DCGM_CATEGORY = {"hardware": "active_dcgm_hardware", "integration": "active_dcgm_integration"}


def _reason(r: CheckResult, f: Finding) -> str:
    if r.check == "dcgm":
        if f.isolate:
            return "active_dcgm_hardware"
        return DCGM_CATEGORY.get(f.category.lower(), "active_dcgm_other")
    if r.check == "nccl":
        return "active_nccl_bandwidth" if f.test == BANDWIDTH else "active_nccl_failed"
    return f"active_{r.check}"


def reasons(results: Iterable[CheckResult], now: float) -> ActiveReasons:
    gpus: dict[str, set[str]] = {}
    node: set[str] = set()
    for r in results:
        if r.result != "fail" or not r.valid(now):
            continue
        failed = [f for f in r.findings if f.status == "fail"] or [Finding("", "", "fail")]
        for f in failed:
            (gpus.setdefault(f.gpu, set()) if f.gpu else node).add(_reason(r, f))
    return ActiveReasons({g: frozenset(s) for g, s in gpus.items()}, frozenset(node))


def level(active: ActiveReasons) -> str:
    """The worst verdict level the reasons give (healthy when none)."""
    all_reasons = set(active.node).union(*active.gpus.values())
    return max((ALL_REASONS[r] for r in all_reasons), key=LEVEL.__getitem__, default="healthy")
