"""The NVML checks: they need no tool, only the process's NVML session (exporter.nvml), so
they run the same on the real library and on a fake replaying a capture.

Per GPU, each read under a deadline (exporter.deadline): a GPU whose calls do not return in
time did not answer.
- answers: NVML lists every expected GPU (node.expected_gpus or the instance profile) and
  each answers;
- ecc: ECC mode on (where the GPU has ECC), and no mode change pending a reset;
- persistence, power limit, clocks: as configured (active.nvml_*; unset: not judged);
- pcie: the link at the generation and width the GPU and slot allow. A narrower link is a
  `fail` (a lane lost: bandwidth gone for good); a lower generation only `warn`, since an idle
  GPU may drop its link speed to save power;
- nvlink: every link the GPU has is up. A link NVML answers Not Supported or Invalid Argument
  for does not exist on this GPU (PCIe parts have none): nothing is assumed of the model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exporter.activecheck.result import CheckResult, Finding
from exporter.deadline import Deadlines, Pool
from exporter.nvml.backend import NvmlError
from exporter.nvml.session import NvmlSession

NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS
CLOCK_SM = 1  # NVML_CLOCK_SM


@dataclass(frozen=True)
class Expect:
    gpus: int | None = None
    ecc: bool | None = True  # None: not judged
    persistence: bool | None = None
    power_limit_watts: float | None = None  # the enforced limit must be at least this
    max_sm_clock_mhz: int | None = None  # the GPU's max SM clock must be at least this
    call_timeout_s: float = 5.0


class BudgetEnded(Exception):  # noqa: N818 - "raise BudgetEnded"
    """The check's deadline came before the call's own: no evidence against the GPU."""


class NoAnswer(Exception):  # noqa: N818 - "raise NoAnswer"
    pass


def _gpu_findings(call: Callable[[str, tuple[int, ...]], Any], gpu: str, e: Expect) -> list[Finding]:
    out: list[Finding] = []

    def add(test: str, status: str, message: str = "") -> None:
        out.append(Finding(gpu, test, status, message=message))

    def get(fn: str, *args: int) -> Any:
        """The call's value; None when NVML says the GPU does not support it."""
        try:
            return call(fn, args)
        except NvmlError as err:
            if err.not_supported or err.code == 2:  # 2: Invalid Argument (no such link)
                return None
            raise

    try:
        get("nvmlDeviceGetUUID")
        add("answers", "pass")
        ecc = get("nvmlDeviceGetEccMode")
        if e.ecc is not None and isinstance(ecc, list) and len(ecc) == 2:
            cur, pending = bool(ecc[0]), bool(ecc[1])
            if cur != e.ecc:
                on_off = {True: "on", False: "off"}
                add("ecc", "fail", f"ECC mode is {on_off[cur]}, expected {on_off[e.ecc]}")
            elif pending != cur:
                add("ecc", "warn", "an ECC mode change is pending a GPU reset")
            else:
                add("ecc", "pass")
        if e.persistence is not None:
            pm = get("nvmlDeviceGetPersistenceMode")
            if pm is not None:
                ok = bool(pm) == e.persistence
                add("persistence", "pass" if ok else "fail",
                    "" if ok else f"persistence mode is {'on' if pm else 'off'}")
        if e.power_limit_watts is not None:
            mw = get("nvmlDeviceGetEnforcedPowerLimit")
            if mw is not None:
                ok = mw / 1000 >= e.power_limit_watts
                add("power_limit", "pass" if ok else "fail",
                    "" if ok else f"enforced power limit {mw / 1000:g} W, under {e.power_limit_watts:g} W")
        if e.max_sm_clock_mhz is not None:
            mhz = get("nvmlDeviceGetMaxClockInfo", CLOCK_SM)
            if mhz is not None:
                ok = mhz >= e.max_sm_clock_mhz
                add("clocks", "pass" if ok else "fail",
                    "" if ok else f"max SM clock {mhz} MHz, under {e.max_sm_clock_mhz} MHz")
        out += _pcie(get, gpu)
        out += _nvlink(get, gpu)
    except NoAnswer as err:
        add("answers", "fail", str(err))
    except NvmlError as err:
        add("answers", "fail", f"NVML: {err}")
    return out


def _pcie(get: Callable[..., Any], gpu: str) -> list[Finding]:
    gen, max_gen = get("nvmlDeviceGetCurrPcieLinkGeneration"), get("nvmlDeviceGetMaxPcieLinkGeneration")
    width, max_width = get("nvmlDeviceGetCurrPcieLinkWidth"), get("nvmlDeviceGetMaxPcieLinkWidth")
    if None in (gen, max_gen, width, max_width):
        return []
    if width < max_width:
        return [Finding(gpu, "pcie", "fail",
                        message=f"PCIe link x{width}, the GPU and slot allow x{max_width}")]
    if gen < max_gen:
        return [Finding(gpu, "pcie", "warn", message=f"PCIe link gen {gen}, the GPU and slot allow gen "
                        f"{max_gen} (an idle GPU may lower it to save power)")]
    return [Finding(gpu, "pcie", "pass")]


def _nvlink(get: Callable[..., Any], gpu: str) -> list[Finding]:
    states = {}
    for link in range(NVLINK_MAX_LINKS):
        s = get("nvmlDeviceGetNvLinkState", link)
        if s is not None:
            states[link] = s
    if not states:
        return []  # the GPU has no NVLink
    down = sorted(k for k, s in states.items() if not s)
    if down:
        return [Finding(gpu, "nvlink", "fail",
                        message=f"NVLink {', '.join(map(str, down))} down of {len(states)} links")]
    return [Finding(gpu, "nvlink", "pass")]


def run(session: NvmlSession, pool: Pool, expect: Expect, deadline: float | None = None) -> CheckResult:
    """Every GPU's findings, and the node's (GPUs missing against the expected count). With a
    `deadline` (time.monotonic()), the check ends by it: a call it cuts short is no evidence
    against the GPU, so the GPUs not judged by then leave the check `timeout` (or `fail`, when a
    GPU judged before failed)."""
    if not session.ensure():
        return CheckResult("nvml", "error", f"NVML cannot be used: {session.error}")
    backend = session.backend
    reads = Deadlines(pool)
    findings: list[Finding] = []
    cut_at = ""  # the GPU the deadline cut short
    for dev in session.devices:
        gpu = str(dev.index)

        def call(fn: str, args: tuple[int, ...], index: int = dev.index) -> Any:
            limit, cut = expect.call_timeout_s, False
            if deadline is not None and deadline - time.monotonic() < limit:
                limit, cut = deadline - time.monotonic(), True
                if limit <= 0:
                    raise BudgetEnded
            o = reads.call(("active", index, fn, args), lambda: backend.call(index, fn, *args), limit)
            if o.ok:
                return o.value
            if isinstance(o.value, NvmlError):
                raise o.value
            if o.value is not None:
                raise NoAnswer(f"{fn}: {o.value}")
            if cut:
                raise BudgetEnded
            raise NoAnswer(f"{fn} did not answer within {expect.call_timeout_s:g}s ({o.reason or o.status})")

        try:
            findings += _gpu_findings(call, gpu, expect)
        except BudgetEnded:
            cut_at = gpu
            break
    count = len(session.devices)
    if expect.gpus is not None and count < expect.gpus:
        findings.append(Finding("", "gpu_count", "fail",
                                message=f"NVML lists {count} GPUs, expected {expect.gpus}"))
    failed = [f for f in findings if f.status == "fail"]
    warned = [f for f in findings if f.status == "warn"]
    if cut_at:
        ended = f"the budget ended while checking GPU {cut_at}"
        if not failed:
            return CheckResult("nvml", "timeout", f"{ended}: not every GPU was checked", findings=findings,
                               tool=f"NVML {session.nvml_version}".strip())
        findings.append(Finding(cut_at, "answers", "skip", message=ended))
    res = "fail" if failed else "warn" if warned else "pass"
    worst = failed or warned
    reason = "; ".join(f"GPU {f.gpu}: {f.message}" if f.gpu else f.message for f in worst[:8]) or \
        f"{count} GPUs answer, every check as expected"
    return CheckResult("nvml", res, reason, findings=findings, tool=f"NVML {session.nvml_version}".strip())
