"""Every shell command the docs mark runnable runs, against the simulated node.

The convention (tests/doc_blocks.py, docs/design.md): a fenced block whose info string is
`sh runnable` runs from the checkout's package; `sh runnable installed` runs from the wheel
installed in a fresh virtual environment (tests/release.py), in a directory outside the checkout.
Each block runs as one `sh -e` script in an empty directory, so every line must succeed (a command
expected to fail says so: `rc=0; cmd || rc=$?; test $rc -eq 2`). A command of the exporter in such
a block names a simulated node (`--simulate`), so nothing here reads a real GPU or kernel log.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.doc_blocks import fenced_blocks
from tests.helpers import HANG_GUARD_S, guarded_env
from tests.release import installed  # noqa: F401 - the session fixture

RUNNABLE = [b for b in fenced_blocks() if "runnable" in b.tags]


def block_id(b) -> str:
    return f"{b.file}:{b.line}" + (":installed" if "installed" in b.tags else "")


def test_the_docs_mark_commands_runnable():
    files = {b.file for b in RUNNABLE}
    assert "README.md" in files and len(files) >= 2, files
    assert any("installed" in b.tags for b in RUNNABLE)


@pytest.mark.parametrize("block", RUNNABLE, ids=block_id)
def test_every_exporter_command_of_a_runnable_block_names_a_simulated_node(block):
    for line in block.text.splitlines():
        if re.match(r"\s*gpu-health-exporter\s+(check|ack|capture)\b", line):
            assert "--simulate" in line, line


def checkout_env(tmp_path) -> dict[str, str]:
    """The checkout's package as `gpu-health-exporter` and `python`."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "gpu-health-exporter").write_text(f'#!/bin/sh\nexec {sys.executable} -m exporter "$@"\n')
    (bin_ / "gpu-health-exporter").chmod(0o755)
    (bin_ / "python").symlink_to(sys.executable)
    return guarded_env(PATH=f"{bin_}:{os.environ['PATH']}")


@pytest.mark.parametrize("block", RUNNABLE, ids=block_id)
def test_a_runnable_block_runs(block, tmp_path, request):
    if "installed" in block.tags:
        inst = request.getfixturevalue("installed")
        work = inst.work / f"{block.file.replace('/', '_')}_{block.line}"
        work.mkdir()
        env = inst.env()
    else:
        work = tmp_path / "work"
        work.mkdir()
        env = checkout_env(tmp_path)
    r = subprocess.run(["sh", "-e", "-c", block.text], cwd=work, env=env, capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    out = f"{r.stdout[-1500:]}\n{r.stderr[-1500:]}"
    assert r.returncode == 0, f"{block_id(block)}: exit {r.returncode}\n{out}"
