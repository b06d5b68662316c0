"""The wheel carries the files a user deploys (exporter/share.py): the build copies them from the
checkout, their one source, into exporter/shipped/, and renders docs/runbooks.html there. The
project's metadata is in pyproject.toml; this file only adds that step to build_py."""

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _module(name: str):
    """A standard-library-only module of the package, loaded without importing the package (its
    dependencies are not in the build environment)."""
    spec = importlib.util.spec_from_file_location(f"_build_{name}", HERE / "exporter" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BuildPyWithShippedFiles(build_py):
    def run(self) -> None:
        super().run()
        share, runbooks = _module("share"), _module("runbooks")
        dest = Path(self.build_lib) / "exporter" / "shipped"
        if dest.exists():
            shutil.rmtree(dest)
        for rel in share.files(HERE):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(HERE / rel, dest / rel)
        (dest / share.RUNBOOKS_HTML).write_text(runbooks.render((HERE / "docs" / "runbooks.md").read_text()))
        self._write_build_info()

    def _write_build_info(self) -> None:
        """The wheel carries the revision and branch it was built from (exporter/_build.py, which
        exporter.buildinfo reads when no .git is there): the environment's
        GPU_HEALTH_EXPORTER_REVISION/_BRANCH, else the checkout's git state, else what `python -m
        exporter.buildinfo --write` left in the tree (copied by build_py as it is)."""
        import os

        buildinfo = _module("buildinfo")
        found = buildinfo.from_git(HERE)
        revision = os.environ.get(buildinfo.ENV_REVISION) or (found[0] if found else None)
        branch = os.environ.get(buildinfo.ENV_BRANCH) or (found[1] if found else None)
        if revision or branch:
            buildinfo.write(revision or buildinfo.UNKNOWN, branch or buildinfo.UNKNOWN,
                            Path(self.build_lib) / "exporter" / "_build.py")


setup(cmdclass={"build_py": BuildPyWithShippedFiles})
