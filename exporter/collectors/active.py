"""Active check results (docs/active-checks.md): the daemon exports what the `active` command
wrote to <paths.state_dir>/active/, and hands the results to the verdict (the health collector
depends on this one). Reading never starts a test. A result past its validity is exported with
its timestamps but no result series, and gives the verdict nothing: absent, never healthy."""

from __future__ import annotations

import time
from typing import Any

from exporter.activecheck import findings, result
from exporter.activecheck.result import CheckResult
from exporter.activecheck.settings import ActiveSection
from exporter.catalog import Families, define
from exporter.collector import Collector, Context, ProblemLog
from exporter.state.file import identity_on_disk
from exporter.xid.verdict import ActiveReasons

RESULT = define(
    "gpu_health_active_check_result", "gauge",
    "1 for the active check's last result (pass, warn, fail, skip, timeout, error), 0 for the others; "
    "absent when the check never ran or its result is older than active.valid_for_seconds.",
    ("check", "result"), collector="active")
GPU_RESULT = define(
    "gpu_health_active_check_gpu_result", "gauge",
    "1 for the worst status (pass, warn, fail, skip) of a GPU's tests in the check's last valid result "
    "(nvml, dcgm: the checks that name GPUs).", ("check", "gpu", "result"), collector="active")
DURATION = define(
    "gpu_health_active_check_duration_seconds", "gauge",
    "How long the check's last run took.", ("check",), unit="seconds", collector="active")
AGE = define(
    "gpu_health_active_check_age_seconds", "gauge",
    "Seconds since the check's last run finished.", ("check",), unit="seconds", collector="active")
LAST_RUN = define(
    "gpu_health_active_check_last_run_timestamp_seconds", "gauge",
    "Unix time the check's last run finished.", ("check",), unit="seconds", collector="active")
LAST_PASS = define(
    "gpu_health_active_check_last_pass_timestamp_seconds", "gauge",
    "Unix time the check last passed; absent when it never has.", ("check",), unit="seconds",
    collector="active")
VALID = define(
    "gpu_health_active_check_valid", "gauge",
    "1 while the check's last result counts (younger than active.valid_for_seconds), 0 once expired.",
    ("check",), collector="active")
BUSBW = define(
    "gpu_health_active_nccl_bus_bandwidth_bytes_per_second", "gauge",
    "all_reduce_perf bus bandwidth at the judged size in the nccl check's last valid result (nodes: "
    "how many its rank lines name, 0 when it printed none).",
    ("size_bytes", "nodes"), unit="bytes_per_second", collector="active")
BUSBW_EXPECTED = define(
    "gpu_health_active_nccl_expected_bus_bandwidth_bytes_per_second", "gauge",
    "The expected bus bandwidth that result was judged by (published figure or active.nccl_expected).",
    ("size_bytes", "nodes"), unit="bytes_per_second", collector="active")
PASS_MAX_AGE = define(
    "gpu_health_active_check_pass_max_age_seconds", "gauge",
    "active.pass_max_age_seconds, per check of active.run, when set: the node opted in to the "
    "GpuActiveCheckPassStale alert.", ("check",), unit="seconds", collector="active")
READ_OK = define(
    "gpu_health_exporter_active_result_read_success", "gauge",
    "0 when the check's result file exists but cannot be read or is not a result (the log says why).",
    ("check",), collector="active")

RANK = {s: i for i, s in enumerate(("skip", "pass", "warn", "fail"))}


class ActiveCollector(Collector):
    name = "active"
    config_section = ActiveSection
    prefix = "gpu_health_active_"
    docs_group = "Active checks (opt-in)"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.problems = ProblemLog(self.log)
        # check -> (identity of the file parsed, its result): a file is parsed again only once it
        # was replaced (the writer renames a new file into place: a new inode)
        self._parsed: dict[str, tuple[tuple[int, ...], CheckResult]] = {}

    def _read(self, check: str) -> CheckResult | None:
        ident = identity_on_disk(result.path_of(self.ctx.paths.state_dir, check))
        if ident is None:
            self._parsed.pop(check, None)
            return None
        hit = self._parsed.get(check)
        if hit is not None and hit[0] == ident:
            return hit[1]
        r = result.read(self.ctx.paths.state_dir, check)  # raises OSError/ValueError naming the file
        if r is not None:
            self._parsed[check] = (ident, r)
        return r

    def collect(self, out: Families) -> ActiveReasons:
        """Returns the verdict's reasons from the valid results (the health collector's input)."""
        results: dict[str, CheckResult] = {}
        for check in result.CHECKS:
            problem = ""
            try:
                r = self._read(check)
            except (OSError, ValueError) as e:
                problem, r = str(e), None
                self._parsed.pop(check, None)
            self.problems.report(f"active check {check} result", problem)
            if problem:
                out.add(READ_OK, 0, check=check)
            elif r is not None:
                out.add(READ_OK, 1, check=check)
                results[check] = r
        now = time.time()
        cfg = self.ctx.config.section(ActiveSection)
        if cfg.pass_max_age_seconds is not None:
            for check in cfg.run:
                out.add(PASS_MAX_AGE, cfg.pass_max_age_seconds, check=check)
        for r in results.values():
            export(out, r, now)
        return findings.reasons(results.values(), now)


def export(out: Families, r: CheckResult, now: float) -> None:
    c = r.check
    out.add(DURATION, r.duration_s, check=c)
    out.add(AGE, r.age_s(now), check=c)
    out.add(LAST_RUN, r.finished_at, check=c)
    if r.last_pass_at is not None:
        out.add(LAST_PASS, r.last_pass_at, check=c)
    valid = r.valid(now)
    out.add(VALID, 1 if valid else 0, check=c)
    if not valid:
        return
    for res in result.RESULTS:
        out.add(RESULT, 1 if res == r.result else 0, check=c, result=res)
    worst: dict[str, str] = {}
    for f in r.findings:
        if f.gpu and RANK[f.status] >= RANK.get(worst.get(f.gpu, "skip"), 0):
            worst[f.gpu] = f.status
    for gpu, status in sorted(worst.items(), key=lambda kv: (len(kv[0]), kv[0])):
        out.add(GPU_RESULT, 1, check=c, gpu=gpu, result=status)
    m: dict[str, Any] = r.measurements
    if c == "nccl" and "bus_bandwidth_bytes_per_second" in m:
        labels = dict(size_bytes=str(int(m.get("size_bytes", 0))), nodes=str(int(m.get("nodes", 0))))
        out.add(BUSBW, m["bus_bandwidth_bytes_per_second"], **labels)
        if "expected_bus_bandwidth_bytes_per_second" in m:
            out.add(BUSBW_EXPECTED, m["expected_bus_bandwidth_bytes_per_second"], **labels)


COLLECTOR = ActiveCollector
