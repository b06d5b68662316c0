"""Every `check` wrapper the project ships or prints drains a node on exit 2 and on nothing else.

The wrappers: deploy/slurm/gpu-health-check.sh (as the health check and as a prolog) and every
fenced block marked ```` ```sh wrapper ```` in README.md and docs/*.md (the convention:
tests/doc_blocks.py, docs/design.md). Each runs with a fake `scontrol` that records what it is
asked and the real `gpu-health-exporter check` (this checkout) given one of three faults: a
configuration error and a kernel log with an XID line it cannot read (tool errors: no drain), and XID 63 on
a simulated p5 (action required: a drain, so the test can see one). "Drained" is a `scontrol
update` to DRAIN, FAIL or DOWN, or a non-zero exit (a prolog's non-zero exit drains the node).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_blocks import ROOT, fenced_blocks
from tests.helpers import HANG_GUARD_S, NETGUARD

SCRIPT = ROOT / "deploy" / "slurm" / "gpu-health-check.sh"
# An XID line cut off inside its report: `check` cannot say what it was (exit 3, never 0)
DMESG_T = "[Fri Nov 27 10:14:09 2026] NVRM: Xid (PCI:0000:53:0\n" * 3


def wrappers() -> dict[str, list[str]]:
    """name -> argv (the script, or a documented block written to a file by `install`)."""
    out = {"gpu-health-check.sh": [str(SCRIPT)], "gpu-health-check.sh --prolog": [str(SCRIPT), "--prolog"]}
    for block in fenced_blocks():
        if "wrapper" in block.tags:
            out[f"{block.file}:{block.line}"] = ["sh", "-c", block.text, block.file]
    return out


def test_the_docs_have_wrappers():
    docs = [n for n in wrappers() if ".md:" in n]
    assert len(docs) >= 2, docs  # docs/xid.md: the health check and the prolog


def fakes(tmp: Path) -> tuple[Path, Path]:
    """A bin directory with `gpu-health-exporter` (this checkout's, given $GHE_FAULT_ARGS after
    the command's own) and a `scontrol` that logs its arguments; returns (bin, log)."""
    bin_ = tmp / "bin"
    bin_.mkdir()
    calls = tmp / "scontrol.log"
    (bin_ / "gpu-health-exporter").write_text(
        f'#!/bin/sh\ncmd=$1; shift\n'
        f'PYTHONPATH={NETGUARD}:{ROOT} exec {sys.executable} -m exporter "$cmd" "$@" $GHE_FAULT_ARGS\n')
    (bin_ / "scontrol").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n'
        'case "$1" in show) echo "NodeName=$3 Arch=x86_64"; echo "   State=IDLE ThreadsPerCore=2" ;; esac\n')
    (bin_ / "logger").write_text("#!/bin/sh\nexit 0\n")
    for f in bin_.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    return bin_, calls


def faults(tmp: Path) -> dict[str, str]:
    bad = tmp / "bad-config.yaml"
    bad.write_text("node:\n  expected_gpus: eight\n")  # one typo, shipped to every node
    dmesg = tmp / "dmesg-T.txt"
    dmesg.write_text(DMESG_T)
    sim = f"--simulate p5.48xlarge --path.state-dir {tmp / 'state'}"
    return {
        "config error": f"{sim} --config {bad}",
        "unparseable kernel log": f"{sim} --kmsg-file {dmesg}",
        "xid 63 (action required)": f"{sim} --scenario xid-63",
    }


def run(argv: list[str], tmp: Path, fault: str) -> tuple[bool, str]:
    bin_, calls = fakes(tmp)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "GHE_FAULT_ARGS": fault,
           "GPU_HEALTH_EXPORTER": str(bin_ / "gpu-health-exporter"), "GPU_HEALTH_PYTHON": sys.executable,
           "SCONTROL": str(bin_ / "scontrol"), "GPU_HEALTH_CHECK_CONFIG": str(tmp / "none"),
           "GPU_HEALTH_HYPERPOD": "no", "SLURMD_NODENAME": "node-1"}
    r = subprocess.run(argv, env=env, cwd=tmp, capture_output=True, text=True, timeout=HANG_GUARD_S)
    log = calls.read_text() if calls.exists() else ""
    drained = r.returncode != 0 or bool(re.search(r"update .*state=(drain|fail|down)", log, re.I))
    return drained, f"exit {r.returncode}; scontrol: {log!r}; stderr: {r.stderr[-600:]}"


@pytest.mark.parametrize("name", sorted(wrappers()))
def test_a_wrapper_drains_on_action_required_and_never_on_a_tool_error(tmp_path, name):
    argv = wrappers()[name]
    for i, (fault, args) in enumerate(faults(tmp_path).items()):
        work = tmp_path / f"run{i}"
        work.mkdir()
        drained, what = run(argv, work, args)
        assert drained == fault.startswith("xid 63"), (name, fault, what)


@pytest.mark.parametrize(("argv", "drains"), [([str(SCRIPT)], False), ([str(SCRIPT), "--prolog"], True)])
def test_a_gpu_that_does_not_answer_fails_the_prolog_and_is_logged_with_its_problem(tmp_path, argv, drains):
    """Check answers 3 (unknown) for a GPU whose NVML calls hang. The prolog fails (Slurm
    drains and requeues: no job starts on it); the health check logs check's problem, not the
    first 300 characters of the JSON (the node header)."""
    drained, what = run(argv, tmp_path, f"--simulate p5.48xlarge --scenario gpu-nvml-hang "
                                        f"--path.state-dir {tmp_path / 'state'}")
    assert drained == drains, what
    assert "GPU 3" in what and "did not answer" in what, what
    assert "update" not in what.split("stderr")[0].split("scontrol:")[1]  # never a drain by scontrol itself
