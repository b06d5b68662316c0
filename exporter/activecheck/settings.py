"""The `active` config section: what the active checks run, their budget and deadlines, and
what each is judged against (docs/active-checks.md). The daemon's `active` collector only reads
results; everything else here is for the `active` command."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from exporter.activecheck.result import CHECKS
from exporter.config import CollectorSection, non_negative, positive, setting


def _checks(v: Any) -> str | None:
    bad = [c for c in v if c not in CHECKS]
    return f"a list of checks from {', '.join(CHECKS)} ({', '.join(map(str, bad))} unknown)" if bad else None


def _level(v: Any) -> str | None:
    return None if v in (1, 2, 3, 4) else "a DCGM diag level from 1 to 4"


def _fraction(v: Any) -> str | None:
    return None if 0 < v <= 1 else "a fraction greater than 0 and at most 1"


def _scope(v: Any) -> str | None:
    return None if v in ("single_node", "multi_node") else "single_node or multi_node"


def _expected(v: Any) -> str | None:
    for fam, e in v.items():
        if not isinstance(e, dict) or not all(
                k in ("single_node", "multi_node", "single_node_size_bytes", "multi_node_size_bytes")
                and isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for k, x in e.items()):
            return (f"a mapping of instance families to {{single_node, multi_node: GB/s, "
                    f"<scope>_size_bytes: bytes}} (entry {fam!r})")
    return None


def _argv(v: Any) -> str | None:
    return None if all(isinstance(x, str) for x in v) else "a list of strings (a command and its arguments)"


@dataclass
class ActiveSection(CollectorSection):
    """Opt-in active checks (docs/active-checks.md): the `active` command runs them and writes one
    result file per check under <paths.state_dir>/active/; the daemon exports those results and
    the verdict uses the valid ones. Nothing runs a test unless the command is run."""

    name: ClassVar[str] = "active"
    enabled: bool = setting(True, "Export the active checks' results (the daemon only reads their files; "
                            "with none there it exports nothing).")
    run: list[str] = setting(list(CHECKS), "The checks the `active` command runs, in this order: "
                                + ", ".join(CHECKS) + ". A check whose tool is missing is skipped.",
                                check=_checks)
    budget_seconds: float = setting(900.0, "Total time the `active` command may take; a check is not "
                                    "started once it is spent, and one running is cut at its end.",
                                    check=positive)
    valid_for_seconds: float = setting(86400.0, "How long a result counts: past it, the verdict treats "
                                       "the check as not run (absent, never healthy).", check=positive)
    nvml_call_timeout_seconds: float = setting(5.0, "Deadline of each NVML call of the nvml check; a GPU "
                                               "past it did not answer.", check=positive)
    nvml_ecc: bool | None = setting(True, "ECC mode every GPU with ECC must have (null: not judged).")
    nvml_persistence: bool | None = setting(None, "Persistence mode every GPU must have (null: not "
                                            "judged; AWS's p5 AMI leaves it off).")
    nvml_power_limit_watts: float | None = setting(None, "Lowest enforced power limit accepted (null: not "
                                                   "judged).", check=positive)
    nvml_max_sm_clock_mhz: int | None = setting(None, "Lowest max SM clock accepted (null: not judged).",
                                                check=positive)
    efa_deadline_seconds: float = setting(60.0, "Deadline of fi_info and of the EFA loopback.",
                                          check=positive)
    fi_info: str = setting("fi_info", "libfabric's fi_info (a path, or a name looked up on PATH).")
    fi_pingpong: str = setting("fi_pingpong", "libfabric's fi_pingpong for the EFA loopback (skipped "
                               "when missing).")
    dcgm_level: int = setting(2, "dcgmi diag level: 1 (quick, ~30 s), 2 (medium, ~2 min), 3 (long, ~15 min), "
                              "4 (xlong, 1-2 h).", check=_level)
    dcgm_deadline_seconds: float = setting(1200.0, "Deadline of dcgmi diag.", check=positive)
    dcgmi: str = setting("dcgmi", "DCGM's dcgmi (a path, or a name looked up on PATH).")
    dcgm_host: str | None = setting(None, "The DCGM host engine dcgmi connects to (--host), e.g. the GPU "
                                    "Operator's nvidia-dcgm.gpu-operator.svc:5555; null: the local one. "
                                    "None answering: the check is skipped.")
    nccl_deadline_seconds: float = setting(600.0, "Deadline of all_reduce_perf.", check=positive)
    all_reduce_perf: str = setting("all_reduce_perf", "nccl-tests' all_reduce_perf (a path, or a name "
                                   "looked up on PATH).")
    nccl_command: list[str] = setting([], "The nccl check's command, to run it under a launcher (srun, "
                                      "mpirun); {size} and {gpus} are replaced. Empty: all_reduce_perf -b "
                                      "{size} -e {size} -f 2 -g {gpus} on this node.", check=_argv)
    nccl_scope: str = setting("single_node", "Which expected figure the size is taken from: single_node, "
                              "or multi_node for a nccl_command spanning nodes (a result's node count, "
                              "from its rank lines, picks the figure it is judged by).", check=_scope)
    nccl_size_bytes: int | None = setting(None, "The message size whose busbw is judged (null: the "
                                          "expected figure's size, else 16 GiB).", check=positive)
    nccl_min_fraction: float = setting(0.9, "busbw under this fraction of the expected value fails the "
                                       "check (degraded, never replace).", check=_fraction)
    nccl_expected: dict[str, Any] = setting({}, "Expected busbw (GB/s) per instance family, over the "
                                            "published figures: {p5: {single_node: 450, multi_node: 480}}.",
                                            check=_expected)
    pass_max_age_seconds: float | None = setting(
        None, "Opt in to the GpuActiveCheckPassStale alert: a selected check whose last pass is older "
        "than this (or that never passed) is stale. Null: no such alert for this node.", check=positive)
    min_start_seconds: float = setting(1.0, "A check is not started with less of the budget left.",
                                       check=non_negative)
