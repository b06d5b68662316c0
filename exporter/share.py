"""Where the files a user deploys come from: the alert rules, the runbooks, the dashboards, the
example configs and everything under deploy/.

One source of truth: the checkout's rules/, dashboards/*.json, deploy/ and docs/. A wheel carries
a copy of them, made when the wheel is built (setup.py, from FILES below), at exporter/shipped/ with
the same layout plus docs/runbooks.html (the runbooks rendered, exporter.runbooks). `root()` is
the checkout when the package runs from one, else that copy, so `python -m exporter.rules` and
`python -m exporter.tools.deploygen` work the same from a clone and from an installed wheel.
tests/test_release.py installs the built wheel and compares its copy with the tree.
"""

from __future__ import annotations

from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
INSTALLED = Path(__file__).resolve().parent / "shipped"
# What the wheel and the release carry, as globs relative to the checkout. The dashboards' Python
# (dashboards-as-code) stays behind: the JSON is what Grafana imports.
FILES = ("README.md", "rules/*.yml", "dashboards/*.json", "deploy/**/*", "docs/*.md")
# Files of deploy/ that work only in a checkout (they build or install from the source tree: a
# pyproject.toml, setup.py and exporter/ next to them): left out of the wheel and the release
# tarball, where they would fail ("does not appear to be a Python project").
CHECKOUT_ONLY = ("deploy/quickstart.sh", "deploy/build-image.sh", "deploy/Dockerfile")
RUNBOOKS_HTML = "docs/runbooks.html"  # rendered from docs/runbooks.md when a wheel or release is built


def in_checkout() -> bool:
    """True when the package runs from a source checkout (an editable install counts), which
    generators may rewrite; False when installed from a wheel."""
    return all((CHECKOUT / name).is_file() for name in ("pyproject.toml", "setup.py")) \
        and (CHECKOUT / "rules").is_dir()


def root() -> Path:
    """The directory holding rules/, dashboards/, deploy/ and docs/."""
    return CHECKOUT if in_checkout() else INSTALLED


def files(base: Path = CHECKOUT) -> list[Path]:
    """Every shipped file under `base` (paths relative to it), sorted."""
    out: set[Path] = set()
    for pattern in FILES:
        out.update(p.relative_to(base) for p in base.glob(pattern)
                   if p.is_file() and "__pycache__" not in p.parts)
    return sorted(p for p in out if str(p) not in CHECKOUT_ONLY)


def not_in_checkout(command: str) -> str:
    """The refusal of a command that rewrites a checkout, run from an installed package."""
    return (f"{command}: this rewrites the files of a source checkout, and this package is installed "
            f"({CHECKOUT}), not a checkout; nothing written. The shipped files are under {INSTALLED}; "
            "`python -m exporter.tools.deploygen --out DIR` renders a copy to deploy from.")
