"""deploy/Dockerfile: multi-stage, base pinned by digest, non-root, OCI labels; the exporter runs on a
read-only root filesystem with only a tmpfs at /tmp writable; and the image itself, built by
deploy/build-image.sh (a Debian base from mmdebstrap, the Dockerfile under buildah), serves the simulated
node as its own non-root user on a read-only root. No container engine can start containers here, so the
image's root filesystem is run under bubblewrap, with the image's user, entrypoint and environment."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import requests

from tests.helpers import HANG_GUARD_S, ROOT, samples, served_base, wait_until_serving

DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_multi_stage_from_a_base_pinned_by_digest():
    ins = instructions()
    args = dict(a.split("=", 1) for w, a in ins if w == "ARG" and "=" in a)
    froms = [a for w, a in ins if w == "FROM"]
    assert len(froms) == 2 and froms[0].endswith(" AS build")
    for f in froms:
        image = f.split()[0]
        image = args.get(image.strip("${}"), image)
        assert re.fullmatch(r"[\w./:-]+@sha256:[0-9a-f]{64}", image), f"{image} is not pinned by digest"
    assert any(w == "COPY" and a.startswith("--from=build ") for w, a in ins)


def test_runs_as_non_root_with_oci_labels():
    ins = instructions()
    (user,) = [a for w, a in ins if w == "USER"]
    assert user.split(":")[0] not in ("0", "root")
    labels = " ".join(a for w, a in ins if w == "LABEL")
    for key in ("title", "description", "version", "revision", "source", "licenses", "base.name"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    assert ("ENTRYPOINT", '["gpu-health-exporter"]') in ins


def test_build_context_paths_exist():
    for w, a in instructions():
        if w == "COPY" and not a.startswith("--from"):
            for src in a.split()[:-1]:
                assert (ROOT / src).exists(), src


def test_smoke_script_parses():
    r = subprocess.run(["bash", "-n", str(ROOT / "deploy" / "container-smoke.sh")], capture_output=True,
                       text=True, timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_simulated_node_on_a_read_only_root(tmp_path):
    """What the image's read-only root gives the process: / read-only, /tmp a tmpfs. Every collector
    still succeeds and the XID state file is written (under the simulation root in /tmp)."""
    bwrap = shutil.which("bwrap")
    assert bwrap, "bwrap is missing: install Debian's bubblewrap (.ci/run does)"
    exe = Path(sys.executable).parent / "gpu-health-exporter"
    # The checkout and its venv may live under /tmp (a CI clone): bind them back over the tmpfs.
    keep = [a for d in {str(ROOT), sys.prefix} for a in ("--ro-bind", d, d)]
    log = tmp_path / "exporter.log"
    with open(log, "a") as out:
        proc = subprocess.Popen(
            [bwrap, "--ro-bind", "/", "/", "--tmpfs", "/tmp", *keep, "--proc", "/proc", "--dev", "/dev",
             "--die-with-parent", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
             str(exe), "--simulate", "p5.48xlarge", "--listen", "127.0.0.1:0"],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        url = served_base(log, proc) + "/metrics"
        wait_until_serving(url, proc, 60, "exporter under bwrap")
        ss = samples(requests.get(url, timeout=30).text)
        written = subprocess.run([bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "touch", "/probe"],
                                 capture_output=True, text=True, timeout=HANG_GUARD_S)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert written.returncode != 0 and "Read-only" in written.stderr  # the root really is read-only
    success = {dict(k)["collector"]: v for (n, k), v in ss.items()
               if n == "gpu_health_exporter_collector_success"}
    assert success and all(v == 1 for v in success.values()), success
    assert ss[("gpu_health_exporter_state_file_ok", frozenset())] == 1


IMAGE = os.environ.get("GHE_TEST_IMAGE", "localhost/gpu-health-exporter:ci")


def _buildah(*args: str, timeout: float = 60) -> str:
    env = {**os.environ, "STORAGE_DRIVER": "vfs"}
    r = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"buildah {' '.join(args)}: {r.stderr}"
    return r.stdout.strip()


@pytest.fixture(scope="module")
def image_root():
    """The image of this checkout (deploy/build-image.sh: its Debian base cached by its package
    list, a few minutes the first time on a machine, about 20 s after), its root filesystem mounted
    read-only by the test, and its config. Built here, not by .ci/run, so that the build runs on one
    xdist worker beside the others' tests; always built, so an image of another checkout is never
    the one tested."""
    assert shutil.which("buildah") and shutil.which("mmdebstrap"), \
        "buildah and mmdebstrap are missing: install Debian's buildah and mmdebstrap (.ci/run does)"
    subprocess.run(["bash", str(ROOT / "deploy" / "build-image.sh"), IMAGE], check=True, timeout=1200,
                   stdout=subprocess.DEVNULL)
    config = json.loads(_buildah("inspect", "--type", "image", IMAGE))["OCIv1"]["config"]
    ctr = _buildah("from", "--pull-never", IMAGE)
    try:
        yield Path(_buildah("mount", ctr)), config
    finally:
        _buildah("rm", ctr)


def _in_image(root: Path, config: dict, argv: list[str]) -> list[str]:
    """argv run in the image's root (read-only, a tmpfs at /tmp) as the image's user, with its env."""
    uid, _, gid = config["User"].partition(":")
    env = [a for kv in config.get("Env", []) for a in ("--setenv", *kv.split("=", 1))]
    return ["bwrap", "--ro-bind", str(root), "/", "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--tmpfs", "/tmp", "--unshare-pid", "--die-with-parent", "--clearenv", *env,
            "--", "/usr/bin/setpriv", f"--reuid={uid}", f"--regid={gid or uid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", *argv]


@pytest.mark.slow
def test_image_serves_the_simulated_node_as_non_root_on_a_read_only_root(image_root, tmp_path):
    root, config = image_root
    uid = int(config["User"].split(":")[0])
    assert uid != 0
    argv = [*config["Entrypoint"], "--simulate", "p5.48xlarge", "--listen", "127.0.0.1:0"]
    log = tmp_path / "exporter.log"
    with open(log, "a") as out:
        proc = subprocess.Popen(_in_image(root, config, argv), stdout=out, stderr=subprocess.STDOUT)
    try:
        base = served_base(log, proc, 120)
        wait_until_serving(f"{base}/readyz", proc, 120, "the image's exporter")
        text = requests.get(f"{base}/metrics", timeout=30).text
        owners = {p.uids().real for p in psutil.Process(proc.pid).children(recursive=True)
                  if p.name() != "bwrap"}
        written = subprocess.run(_in_image(root, config, ["touch", "/probe"]), capture_output=True,
                                 text=True, timeout=HANG_GUARD_S)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        out = log.read_text()
    ss = samples(text)
    success = {dict(k)["collector"]: v for (n, k), v in ss.items()
               if n == "gpu_health_exporter_collector_success"}
    assert success and all(v == 1 for v in success.values()), (success, out[-2000:])
    assert ss[("gpu_devices", frozenset())] == 8
    assert owners == {uid}, owners  # the exporter ran as the image's user, not root
    assert written.returncode != 0 and "Read-only" in written.stderr


@pytest.mark.slow
def test_image_carries_the_release_files(image_root):
    """The runbooks page every alert links to by default, and the wheel's package data,
    from which `python -m exporter.tools.deploygen --out DIR` renders the manifests inside the image."""
    from exporter import share
    from exporter.rules import DEFAULT_RUNBOOK_BASE

    root, config = image_root
    page = root / DEFAULT_RUNBOOK_BASE.removeprefix("file:///")
    assert page.is_file() and 'id="gpuxidreplacenow"' in page.read_text()
    venv_lib = root / "opt" / "gpu-health-exporter" / "lib"
    shipped = next(venv_lib.glob("python3*/site-packages/exporter/shipped"))
    site = shipped.parent.parent
    # the kubelet kind's client is h2; grpcio (a test dependency) is not in the image
    assert (site / "h2").is_dir() and not list(site.glob("grpc*")), sorted(p.name for p in site.iterdir())
    for rel in share.files(share.CHECKOUT):
        assert (shipped / rel).read_bytes() == (share.CHECKOUT / rel).read_bytes(), rel
    render = ("cd /tmp && python3 -m exporter.tools.deploygen --out r "
              "&& test -s r/deploy/systemd/gpu-health-exporter.service")
    r = subprocess.run(_in_image(root, config, ["sh", "-c", render]), capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr
