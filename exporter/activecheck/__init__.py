"""Opt-in active checks: prove a node good before a job lands on it (docs/active-checks.md).

The `active` command runs the checks it finds (NVML, DCGM diagnostics, nccl-tests, EFA) within a
total budget and a deadline per check (suite), each tool in its own process group (tool), and
writes one result file per check to the state directory (result). The daemon's `active`
collector only reads those files: a scrape never starts a test. The verdict takes its reasons
from valid results (findings); an expired result counts as absent, never as healthy.

Data flows one way: tool output -> pure parser (dcgm, nccl, efa) -> CheckResult -> file ->
collector and verdict.
"""
