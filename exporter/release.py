"""Build the release a user takes whole, from a checkout: one command, also run by .ci/run.

    python -m exporter.release [--out dist]

writes
- dist/gpu_health_exporter-VERSION-py3-none-any.whl: the package, carrying the rules, runbooks
  (markdown and rendered HTML), dashboards, example configs and deploy/ as package data
  (exporter/share.py; `python -m exporter.deploygen --out DIR` writes them out);
- dist/gpu-health-exporter-VERSION.tar.gz: gpu-health-exporter-VERSION/ with that wheel and the
  same files ready to copy (rules/, dashboards/, deploy/, docs/ with runbooks.html, README.md), as
  `python -m exporter.deploygen --out` renders them with the default runbook base.
and prints each file's size. The wheel is built with the running interpreter's pip and
setuptools, without build isolation (no index is asked).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from exporter import __version__, share
from exporter.deploygen import render_copy
from exporter.rules import DEFAULT_RUNBOOK_BASE

NAME = "gpu-health-exporter"


def build_wheel(out: Path) -> Path:
    # setuptools builds in the checkout's build/ and keeps what an earlier build left there (a
    # module since removed would ship): start from nothing.
    shutil.rmtree(share.CHECKOUT / "build", ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", tmp, str(share.CHECKOUT)], check=True, cwd=share.CHECKOUT)
        built = next(Path(tmp).glob("*.whl"))
        out.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(built, out / built.name))


def build_tarball(out: Path, wheel: Path) -> Path:
    top = f"{NAME}-{__version__}"
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / top
        render_copy(stage, DEFAULT_RUNBOOK_BASE, share.CHECKOUT)
        shutil.copy2(wheel, stage / wheel.name)
        path = out / f"{top}.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            tar.add(stage, arcname=top, filter=_reset_owner)
    return path


def _reset_owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m exporter.release", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(share.CHECKOUT / "dist"), metavar="DIR",
                   help="Directory for the wheel and the tarball (default: %(default)s).")
    args = p.parse_args(argv)
    if not share.in_checkout():
        print(share.not_in_checkout("python -m exporter.release"), file=sys.stderr)
        return 2
    out = Path(args.out)
    wheel = build_wheel(out)
    tarball = build_tarball(out, wheel)
    for f in (wheel, tarball):
        print(f"{f} {f.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
