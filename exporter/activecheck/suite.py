"""Run the selected checks within a total budget, each under its own deadline, writing each
result as soon as it is known (a suite cut short leaves the results it has).

A check whose tool is missing is `skip`, never `fail`. A check is not started once less than
`min_start_seconds` of the budget is left, or once a check was cut by the budget (`skip`,
saying so, and not recorded: it says nothing of the node, and a cached pass must not count it);
one running is given min(its deadline, what is left of the budget less the kill's reserve: its
SIGTERM grace and reaping) and, past that, killed with its process group and reported
`timeout`. A check that raises is that check's `error`, never the others' end.
"""

from __future__ import annotations

import logging
import math
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from exporter.activecheck import dcgm, efa, expected, nccl, nvmlcheck, result, tool
from exporter.activecheck.result import CheckResult, Finding
from exporter.activecheck.settings import ActiveSection
from exporter.deadline import Pool
from exporter.nvml.session import NvmlSession

log = logging.getLogger("exporter.activecheck")


@dataclass
class Node:
    """What the checks need to know of the node."""

    instance_type: str | None
    expected_gpus: int | None
    expected_efa: int | None
    nvml: NvmlSession
    pool: Pool


class Suite:
    def __init__(self, cfg: ActiveSection, node: Node, state_dir: str, budget_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, spent_s: float = 0.0) -> None:
        """spent_s: of the budget, what was spent before (the command's start-up)."""
        self.cfg = cfg
        self.node = node
        self.state_dir = state_dir
        self.budget_s = cfg.budget_seconds if budget_s is None else budget_s
        self.clock = clock
        self.start = clock() - max(0.0, spent_s)
        self.spent = False  # a check was cut at the end of the budget (what is left is its kill's grace)

    def left(self) -> float:
        return self.budget_s - (self.clock() - self.start)

    def run(self, checks: list[str]) -> list[CheckResult]:
        out = []
        for check in checks:
            started = time.time()
            # not started, nor recorded, when nothing would be left for it past a kill's reserve
            if self.spent or self.left() < max(self.cfg.min_start_seconds, 1e-3) \
                    or self.limits(math.inf)[0] <= 0:
                out.append(CheckResult(check, "skip", f"not started: the budget of {self.budget_s:g}s was "
                                       "spent", started_at=started, finished_at=started))
                continue
            try:
                r = getattr(self, f"run_{check}")()
            except Exception as e:  # a parser's bug: this check's error, never the others' end
                log.exception("the %s check failed", check)
                r = CheckResult(check, "error", f"the check failed: {type(e).__name__}: {e}")
            r.started_at, r.finished_at = started, time.time()
            r.valid_for_s = self.cfg.valid_for_seconds
            try:
                if not result.write(self.state_dir, r):
                    log.info("%s: %s (%s); its last result, still valid, is kept", check, r.result, r.reason)
            except OSError as e:
                r.reason += f" (its result could not be written: {e})"
                log.error("cannot write the %s result to %s: %s", check, self.state_dir, e)
            out.append(r)
        return out

    def limits(self, deadline_s: float) -> tuple[float, float]:
        """(how long a tool may run, the grace between its SIGTERM and SIGKILL): the deadline,
        unless the budget ends first; then the kill and its grace come out of what is left, so
        a tool ignoring SIGTERM cannot take the suite past its budget."""
        left = self.left()
        grace = min(tool.KILL_GRACE_S, left / 10)
        reserve = grace + tool.REAP_WAIT_S + tool.EXIT_EOF_WAIT_S
        if deadline_s + reserve <= left:
            return deadline_s, grace
        return max(0.0, left - reserve), grace

    def _tool(self, check: str, argv: list[str], deadline_s: float) -> tool.ToolRun | CheckResult:
        """Run a tool for at most min(its deadline, the budget left); the CheckResult to record
        instead when it is missing, could not start, or timed out."""
        path = tool.find(argv[0])
        if path is None:
            return CheckResult(check, "skip", f"{argv[0]} not found: check not run")
        limit, grace = self.limits(deadline_s)
        run = tool.run([path, *argv[1:]], limit, grace_s=grace)
        if run.error:
            return CheckResult(check, "error", run.error, tool=argv[0])
        if run.timed_out:
            self.spent = limit < deadline_s
            why = "the rest of the budget" if self.spent else "its deadline"
            return CheckResult(check, "timeout", f"{argv[0]} killed after {limit:.0f}s ({why}): it hung or "
                               "ran too long", tool=argv[0], output_tail=run.tail())
        return run

    def run_nvml(self) -> CheckResult:
        c = self.cfg
        exp = nvmlcheck.Expect(self.node.expected_gpus, c.nvml_ecc, c.nvml_persistence,
                               c.nvml_power_limit_watts, c.nvml_max_sm_clock_mhz, c.nvml_call_timeout_seconds)
        r = nvmlcheck.run(self.node.nvml, self.node.pool, exp, time.monotonic() + max(self.left(), 0.1))
        self.spent = r.result == "timeout"
        return r

    def run_dcgm(self) -> CheckResult:
        host = ["--host", self.cfg.dcgm_host] if self.cfg.dcgm_host else []
        run = self._tool("dcgm", [self.cfg.dcgmi, "diag", *host, "-r", str(self.cfg.dcgm_level), "-j"],
                         self.cfg.dcgm_deadline_seconds)
        if isinstance(run, CheckResult):
            return run
        r = dcgm.result(run.output, run.exit_code)
        r.output_tail = run.tail()
        return r

    def nccl_size(self) -> int:
        if self.cfg.nccl_size_bytes:
            return self.cfg.nccl_size_bytes
        fig = expected.figure(self.node.instance_type, self.cfg.nccl_scope, self.cfg.nccl_expected)
        return fig.size_bytes if fig else expected.DEFAULT_SIZE

    def run_nccl(self) -> CheckResult:
        size = self.nccl_size()
        gpus = len(self.node.nvml.devices) if self.node.nvml.ensure() else (self.node.expected_gpus or 1)
        template = self.cfg.nccl_command or [self.cfg.all_reduce_perf, "-b", "{size}", "-e", "{size}",
                                              "-f", "2", "-g", "{gpus}"]
        argv = [a.replace("{size}", str(size)).replace("{gpus}", str(gpus)) for a in template]
        run = self._tool("nccl", argv, self.cfg.nccl_deadline_seconds)
        if isinstance(run, CheckResult):
            return run

        def figure(nodes: int | None) -> float | None:
            scope = self.cfg.nccl_scope if nodes is None else "multi_node" if nodes > 1 else "single_node"
            fig = expected.figure(self.node.instance_type, scope, self.cfg.nccl_expected)
            return fig.busbw_gbps if fig and fig.size_bytes == size else None

        r = nccl.judge(run.output, run.exit_code, size, figure, self.cfg.nccl_min_fraction)
        r.output_tail = run.tail()
        return r

    def run_efa(self) -> CheckResult:
        run = self._tool("efa", [self.cfg.fi_info, "-p", "efa"], self.cfg.efa_deadline_seconds)
        if isinstance(run, CheckResult):
            return run
        found = efa.devices(run.output)
        if found is None:
            return CheckResult("efa", "error", f"fi_info's output lists no provider (exit {run.exit_code})",
                               exit_code=run.exit_code, tool="fi_info", output_tail=run.tail())
        n, want = len(found), self.node.expected_efa
        meas = {"devices": float(n)}
        if want is not None and n < want:
            return CheckResult("efa", "fail", f"libfabric opens {n} EFA devices, expected {want}",
                               exit_code=run.exit_code, tool="fi_info", measurements=meas,
                               findings=[Finding("", "device_count", "fail")])
        if n == 0:
            return CheckResult("efa", "skip", "no EFA device on this node, none expected", tool="fi_info",
                               measurements=meas)
        loop = self._loopback()
        if loop is not None:
            loop.measurements = meas
            return loop
        note = "" if tool.find(self.cfg.fi_pingpong) else f"; no loopback ({self.cfg.fi_pingpong} not found)"
        of = f" of {want}" if want else ""
        return CheckResult("efa", "pass", f"libfabric opens {n} EFA devices{of}{note}",
                           exit_code=run.exit_code, tool="fi_info", measurements=meas)

    def _loopback(self) -> CheckResult | None:
        """fi_pingpong between a server and a client on this node over EFA; None when the tool is
        missing or it passed."""
        path = tool.find(self.cfg.fi_pingpong)
        if path is None:
            return None
        base = [path, "-p", "efa", "-e", "rdm"]
        server = subprocess.Popen(base, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = self.cfg.efa_deadline_seconds
        limit, grace = self.limits(deadline + tool.REAP_WAIT_S)  # and the server's reaping
        limit = min(limit, deadline)
        try:
            run = tool.run([*base, "localhost"], limit, grace_s=grace)
        finally:
            tool.kill_group(server, grace_s=0.0)  # a server has nothing to finish
        if run.exit_code == 0:
            return None
        self.spent = run.timed_out and limit < deadline
        if run.error or self.spent:  # the tool's fault or the budget's, not EFA's
            why = run.error or f"cut after {limit:.0f}s: the rest of the budget"
            return CheckResult("efa", "error" if run.error else "timeout",
                               f"EFA loopback (fi_pingpong): {why}", tool="fi_pingpong",
                               output_tail=run.tail())
        why = "timed out" if run.timed_out else f"exited {run.exit_code}"
        return CheckResult("efa", "fail", f"EFA loopback (fi_pingpong) {why}", exit_code=run.exit_code,
                           tool="fi_pingpong", findings=[Finding("", "loopback", "fail")],
                           output_tail=run.tail())
