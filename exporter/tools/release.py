"""Build the release a user takes whole, from a checkout: one command, also run by .ci/run.

    python -m exporter.tools.release [--out dist]

writes
- dist/gpu_health_exporter-VERSION-py3-none-any.whl: the package, carrying the rules, runbooks
  (markdown and rendered HTML), dashboards, example configs and deploy/ as package data
  (exporter/share.py; `python -m exporter.tools.deploygen --out DIR` writes them out);
- dist/gpu-health-exporter-VERSION.tgz: the Helm chart (deploy/helm/gpu-health-exporter) packaged as
  `helm package` does (the chart directory in a gzipped tar), carrying this release's rules,
  dashboards and runbooks: `helm install gpu-health-exporter gpu-health-exporter-VERSION.tgz`;
- dist/gpu-health-exporter-VERSION.tar.gz: gpu-health-exporter-VERSION/ with that wheel, that chart
  and the same files ready to copy (rules/, dashboards/, deploy/, docs/ with runbooks.html,
  README.md), as `python -m exporter.tools.deploygen --out` renders them with the default runbook base.
and prints each file's size, and writes those sizes into docs/deploy.md ("The release"), so the
docs give the sizes of the last build, never a figure typed by hand.

The wheel is built with the running interpreter's pip and setuptools, without build isolation (no
index is asked), when that setuptools meets pyproject.toml's [build-system] requirement (the one
pin of the build backend; the README's quick start installs it into .venv). Where it does not (a
venv made by hand, Debian's setuptools 65, which rejects the SPDX `license` string), pip builds it
in an isolated environment with the pinned backend from the configured index, and says so. The
wheel carries the revision and branch it was built from (setup.py writes exporter/_build.py).
Scripts of deploy/ that only work in a checkout (exporter.share.CHECKOUT_ONLY: the quick start, the
image build) are left out of both.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from exporter import __version__, share
from exporter.rules import DEFAULT_RUNBOOK_BASE
from exporter.tools.deploygen import render_copy

NAME = "gpu-health-exporter"
CHART = f"deploy/helm/{NAME}"


DOC = "docs/deploy.md"
_SIZE = {"wheel": re.compile(r"(\*\*The wheel\*\* \()\d+( KiB\))"),
         "tarball": re.compile(r"(\*\*The tarball\*\* \()\d+( KiB)")}


def backend_requirement(root: Path | None = None) -> tuple[str, tuple[int, ...]]:
    """pyproject.toml's build backend requirement, e.g. ("setuptools", (77,)) for setuptools>=77."""
    text = ((root or share.CHECKOUT) / "pyproject.toml").read_text()
    block = text.split("[build-system]", 1)[1].split("\n[", 1)[0]
    m = re.search(r'"([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)"', block)
    if m is None:
        return "setuptools", ()
    return m.group(1), tuple(int(x) for x in m.group(2).split(".") if x.isdigit())


def backend_ok(root: Path | None = None) -> tuple[bool, str]:
    """Whether the running interpreter has the pinned build backend; (ok, what it has)."""
    from importlib import metadata

    name, want = backend_requirement(root)
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        return False, f"no {name}"
    nums = tuple(int(x) for x in re.findall(r"\d+", have)[:len(want) or 1])
    return nums >= want, f"{name} {have}"


def build_wheel(out: Path) -> Path:
    # setuptools builds in the checkout's build/ and keeps what an earlier build left there (a
    # module since removed would ship): start from nothing.
    shutil.rmtree(share.CHECKOUT / "build", ignore_errors=True)
    ok, have = backend_ok()
    isolation = [] if not ok else ["--no-build-isolation"]
    if not ok:
        name, want = backend_requirement()
        pin = f"{name}>={'.'.join(map(str, want))}"
        print(f"this interpreter has {have}; the build needs {pin} (pyproject.toml [build-system]): "
              "building in an isolated environment with it (pip asks the configured index); "
              f"`{sys.executable} -m pip install '{pin}'` builds without one", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation,
                        "-w", tmp, str(share.CHECKOUT)], check=True, cwd=share.CHECKOUT)
        built = next(Path(tmp).glob("*.whl"))
        out.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(built, out / built.name))


def package_chart(out: Path) -> Path:
    """The chart as `helm package` writes it (NAME-VERSION.tgz holding NAME/...), without helm; its
    version is the exporter's (Chart.yaml is generated from it)."""
    chart = share.CHECKOUT / CHART
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{NAME}-{__version__}.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for f in sorted(p for p in chart.rglob("*") if p.is_file()):
            tar.add(f, arcname=f"{NAME}/{f.relative_to(chart)}", filter=_reset_owner)
    return path


def build_tarball(out: Path, wheel: Path, chart: Path | None = None) -> Path:
    top = f"{NAME}-{__version__}"
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / top
        render_copy(stage, DEFAULT_RUNBOOK_BASE, share.CHECKOUT)
        shutil.copy2(wheel, stage / wheel.name)
        chart = chart or package_chart(Path(tmp) / "chart")
        shutil.copy2(chart, stage / chart.name)
        path = out / f"{top}.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            tar.add(stage, arcname=top, filter=_reset_owner)
    return path


def _reset_owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def kib(path: Path) -> int:
    return round(path.stat().st_size / 1024)


def write_sizes(wheel_kib: int, tarball_kib: int, root: Path | None = None) -> bool:
    """Put the built sizes into docs/deploy.md ("The release"); True when the text changed."""
    path = (root or share.CHECKOUT) / DOC
    text = path.read_text()
    new = _SIZE["wheel"].sub(rf"\g<1>{wheel_kib}\g<2>", text)
    new = _SIZE["tarball"].sub(rf"\g<1>{tarball_kib}\g<2>", new)
    if new != text:
        path.write_text(new)
    return new != text


def sizes_in_doc(root: Path | None = None) -> dict[str, int]:
    """The sizes docs/deploy.md gives, in KiB (what tests compare with a build)."""
    text = ((root or share.CHECKOUT) / DOC).read_text()
    # the number between the pattern's two groups
    return {k: int(m.group(0).removeprefix(m.group(1)).removesuffix(m.group(2)))
            for k, r in _SIZE.items() if (m := r.search(text))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m exporter.tools.release", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(share.CHECKOUT / "dist"), metavar="DIR",
                   help="Directory for the wheel and the tarball (default: %(default)s).")
    args = p.parse_args(argv)
    if not share.in_checkout():
        print(share.not_in_checkout("python -m exporter.tools.release"), file=sys.stderr)
        return 2
    out = Path(args.out)
    wheel = build_wheel(out)
    chart = package_chart(out)
    tarball = build_tarball(out, wheel, chart)
    for f in (wheel, chart, tarball):
        print(f"{f} {kib(f)} KiB")
    if write_sizes(kib(wheel), kib(tarball)):
        print(f"{DOC}: sizes updated to this build's", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
