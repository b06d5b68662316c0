"""Scripts that run on every shell Slurm nodes have: every script in deploy/ (and .ci/run)
is shellcheck clean and never expands an array as "${a[@]}" (bash before 4.4, Amazon Linux 2's 4.2,
calls an empty one unbound under set -u; Debian has no such bash, so the construct is linted); the
prolog and epilog exit 0 with set -u and empty inputs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import HANG_GUARD_S, ROOT

SLURM = ROOT / "deploy" / "slurm"
# "${a[@]}" / "${a[*]}" not inside the guard ${a[@]+"${a[@]}"}
_EXPANSION = re.compile(r'"\$\{(\w+)\[([@*])\]\}"')


def scripts() -> list[Path]:
    out = [ROOT / ".ci" / "run"]
    for p in sorted((ROOT / "deploy").rglob("*")):
        if p.is_file() and (p.suffix == ".sh" or p.read_bytes()[:32].startswith(b"#!/bin/bash")
                            or p.read_bytes()[:32].startswith(b"#!/usr/bin/env bash")):
            out.append(p)
    return out


def unguarded_array_expansions(text: str) -> list[str]:
    """Every "${a[@]}" (or "${a[*]}") that is not the guarded ${a[@]+"${a[@]}"} form, as line: text."""
    bad = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        for m in _EXPANSION.finditer(line):
            name, sub = m.group(1), m.group(2)
            guard = f"${{{name}[{sub}]+"
            if not line[:m.start()].endswith(guard):
                bad.append(f"{n}: {line.strip()}")
    return bad


def test_the_lint_rejects_the_construct_and_accepts_the_guarded_form():
    assert unguarded_array_expansions('for f in "${targets[@]}"; do :; done')
    assert unguarded_array_expansions('echo "${keep[*]}"')
    assert not unguarded_array_expansions('for f in ${targets[@]+"${targets[@]}"}; do :; done')
    assert not unguarded_array_expansions('n=${#targets[@]}; x="${BASH_SOURCE[0]}"')


@pytest.mark.parametrize("path", scripts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_array_expansion_that_bash_4_2_calls_unbound(path):
    assert unguarded_array_expansions(path.read_text()) == [], path


def test_every_script_is_shellcheck_clean():
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is missing: .ci/run installs Debian's shellcheck package"
    paths = [str(p) for p in scripts()]
    r = subprocess.run([shellcheck, "--shell=bash", *paths], capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stdout + r.stderr


def _run(script: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    base.pop("GPU_HEALTH_JOB_MAPPING_DIR", None)
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "logger").write_text("#!/bin/sh\nexit 0\n")
    (bin_ / "logger").chmod(0o755)
    base["PATH"] = f"{bin_}:{base['PATH']}"
    return subprocess.run(["bash", "-u", str(SLURM / script)], env={**base, **env}, capture_output=True,
                          text=True, timeout=HANG_GUARD_S)


@pytest.mark.parametrize("script", ["prolog.sh", "epilog.sh"])
@pytest.mark.parametrize("case", ["no job id", "no GPUs", "empty directory", "no directory", "stray files"])
def test_prolog_and_epilog_exit_0_with_set_u_and_empty_inputs(tmp_path, script, case):
    d = tmp_path / "map"
    env = {"GPU_HEALTH_JOB_MAPPING_DIR": str(d), "SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": ""}
    if case == "no job id":
        del env["SLURM_JOB_ID"]
    if case in ("empty directory", "stray files"):
        d.mkdir()
    if case == "stray files":
        (d / "README").write_text("not a GPU\n")
    r = _run(script, tmp_path, **env)
    assert r.returncode == 0, r.stderr
    assert "unbound variable" not in r.stderr, r.stderr
    if case == "stray files":
        assert (d / "README").read_text() == "not a GPU\n"


def test_epilog_on_a_directory_without_gpu_files_after_a_prolog(tmp_path):
    """The issue's case: an epilog when the directory holds no GPU files (the glob matches nothing)."""
    d = tmp_path / "map"
    env = {"GPU_HEALTH_JOB_MAPPING_DIR": str(d), "SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0,2-3"}
    assert _run("prolog.sh", tmp_path, **env).returncode == 0
    assert sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) == ["0", "2", "3"]
    assert _run("epilog.sh", tmp_path, **env).returncode == 0
    assert [p.name for p in d.iterdir() if not p.name.startswith(".")] == []
    r = _run("epilog.sh", tmp_path, **env)  # again, on the directory with no GPU files
    assert r.returncode == 0 and "unbound" not in r.stderr
