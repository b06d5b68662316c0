"""The revision and branch gpu_health_exporter_build_info reports, found once at start-up.

In order, the first that gives a value:
1. the environment: GPU_HEALTH_EXPORTER_REVISION and GPU_HEALTH_EXPORTER_BRANCH (the container
   image sets them from its REVISION and BRANCH build arguments);
2. the git checkout the package runs from (read from .git directly: no git binary needed, a
   worktree's `.git` file and packed refs are followed);
3. exporter/_build.py, written at build time by `python -m exporter.buildinfo --write` (run it in
   a checkout, or with --revision/--branch, before `pip install .`: an installed package has no
   .git);
4. "unknown".
A detached HEAD has branch "HEAD", as `git rev-parse --abbrev-ref HEAD` says.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UNKNOWN = "unknown"
ENV_REVISION, ENV_BRANCH = "GPU_HEALTH_EXPORTER_REVISION", "GPU_HEALTH_EXPORTER_BRANCH"
GENERATED = Path(__file__).resolve().parent / "_build.py"
_SHA = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")


def _read(p: Path, limit: int = 1 << 16) -> str:
    with open(p, "rb") as f:  # small files of a git directory; never a FIFO in a sane checkout
        return f.read(limit).decode("utf-8", "replace")


def from_git(root: Path = ROOT) -> tuple[str, str] | None:
    """(revision, branch) of the checkout at `root`, or None when it is not one."""
    dot = root / ".git"
    try:
        if dot.is_file():  # a worktree or submodule: "gitdir: PATH"
            gitdir = Path(_read(dot).strip().removeprefix("gitdir:").strip())
            gitdir = gitdir if gitdir.is_absolute() else (root / gitdir).resolve()
        elif dot.is_dir():
            gitdir = dot
        else:
            return None
        common = gitdir
        if (gitdir / "commondir").is_file():
            common = (gitdir / _read(gitdir / "commondir").strip()).resolve()
        head = _read(gitdir / "HEAD").strip()
        if not head.startswith("ref:"):
            return (head, "HEAD") if _SHA.fullmatch(head) else None
        ref = head.removeprefix("ref:").strip()
        branch = ref.removeprefix("refs/heads/")
        for base in (gitdir, common):
            if (base / ref).is_file():
                sha = _read(base / ref).strip()
                return (sha if _SHA.fullmatch(sha) else UNKNOWN), branch
        packed = common / "packed-refs"
        if packed.is_file():
            for line in _read(packed, 1 << 24).splitlines():
                sha, _, name = line.partition(" ")
                if name == ref and _SHA.fullmatch(sha):
                    return sha, branch
        return UNKNOWN, branch  # a branch with no commit yet
    except OSError:
        return None


def from_generated() -> tuple[str, str] | None:
    try:
        from exporter import _build  # type: ignore[attr-defined]  # written at build time
    except ImportError:
        return None
    return getattr(_build, "REVISION", UNKNOWN), getattr(_build, "BRANCH", UNKNOWN)


def build_info() -> tuple[str, str]:
    """(revision, branch), see the module docstring."""
    env = os.environ.get(ENV_REVISION), os.environ.get(ENV_BRANCH)
    found = from_git() or from_generated() or (UNKNOWN, UNKNOWN)
    return env[0] or found[0] or UNKNOWN, env[1] or found[1] or UNKNOWN


def write(revision: str, branch: str, out: Path = GENERATED) -> None:
    out.write_text('"""Written by `python -m exporter.buildinfo --write`; do not edit."""\n\n'
                   f"REVISION = {revision!r}\nBRANCH = {branch!r}\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m exporter.buildinfo", description=__doc__.split("\n")[0])
    p.add_argument("--write", action="store_true", help=f"Write {GENERATED.name} for an installed package.")
    p.add_argument("--revision", help="Revision to record (default: from the checkout).")
    p.add_argument("--branch", help="Branch to record (default: from the checkout).")
    args = p.parse_args(argv)
    found = from_git() or (UNKNOWN, UNKNOWN)
    revision, branch = args.revision or found[0], args.branch or found[1]
    if args.write:
        write(revision, branch)
    print(f"revision={revision} branch={branch}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
