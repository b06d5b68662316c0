"""The built wheel installed in a fresh virtual environment, for tests that use the package as a
user who installed rather than cloned it does (tests/test_release.py, tests/test_doc_commands.py).

The venv gets the wheel with `--no-deps` (no index is asked) and a .pth line naming the running
interpreter's site-packages for the dependencies; that directory's own .pth files (an editable
install of a checkout among them) are not processed, so `exporter` comes from the wheel alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporter.tools.release import build_wheel
from tests.helpers import NETGUARD


@dataclass(frozen=True)
class Installed:
    venv: Path
    wheel: Path
    work: Path  # an empty directory outside the checkout, the commands' working directory

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = f"{self.bin}:{env.get('PATH', '/usr/bin:/bin')}"
        env["PYTHONPATH"] = str(NETGUARD)  # the suite's loopback guard, and nothing of the checkout
        return env

    def run(self, *argv: str | Path, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(a) for a in argv], cwd=self.work, env=self.env(), capture_output=True,
                              text=True, timeout=timeout)

    def site_packages(self) -> Path:
        code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        out = subprocess.run([str(self.python), "-c", code], capture_output=True, text=True, check=True)
        return Path(out.stdout.strip())


def install(tmp: Path) -> Installed:
    wheel = build_wheel(tmp / "dist")
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True, text=True)
    inst = Installed(env_dir, wheel, tmp / "work")
    (inst.site_packages() / "_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    inst.work.mkdir()
    return inst


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel built from this checkout, installed once per session (import it into a module)."""
    return install(tmp_path_factory.mktemp("installed"))
