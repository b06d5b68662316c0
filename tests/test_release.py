"""The release a user takes whole: the wheel, installed in a fresh virtual environment
and used from a directory outside the checkout, renders the rules, the Kubernetes manifests and
the dashboards; carries exactly the checkout's shipped files (the one source: no drift); and its
checkout-only generators refuse to write into site-packages. The release tarball holds the same.
"""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

import pytest
import yaml

from exporter import __version__, runbooks, share
from exporter.rules import DEFAULT_RUNBOOK_BASE
from exporter.tools.release import build_tarball
from tests.helpers import HANG_GUARD_S
from tests.release import installed  # noqa: F401 - the session fixture

BASE = "https://wiki.example.com/gpu/runbooks.html"
PLACEHOLDERS = ("github.com/gpu-health-exporter/gpu-health-exporter", "github.com/your-org/")


def alert_links(rules_dir) -> list[str]:
    return [r["annotations"]["runbook_url"] for f in sorted(rules_dir.glob("*.yml"))
            for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"] if "alert" in r]


def test_the_wheel_carries_the_checkouts_files_unchanged(installed):  # noqa: F811
    shipped = installed.site_packages() / "exporter" / "shipped"
    want = share.files(share.CHECKOUT)
    got = {str(p.relative_to(shipped)) for p in shipped.rglob("*") if p.is_file()}
    assert got == {*map(str, want), share.RUNBOOKS_HTML}
    for rel in want:
        assert (shipped / rel).read_bytes() == (share.CHECKOUT / rel).read_bytes(), rel
    assert (shipped / share.RUNBOOKS_HTML).read_text() == runbooks.render(
        (share.CHECKOUT / "docs" / "runbooks.md").read_text())
    assert any(str(p).startswith("deploy/kubernetes/components/runbooks/") for p in want)


def test_installed_commands_render_rules_manifests_and_dashboards(installed):  # noqa: F811
    r = installed.run(installed.python, "-c", "import exporter; print(exporter.__file__)")
    assert str(installed.venv) in r.stdout, r  # the wheel's package, not the checkout's
    r = installed.run(installed.python, "-m", "exporter.rules", "--out", "rules")
    assert r.returncode == 0, r.stderr
    links = alert_links(installed.work / "rules")
    assert len(links) == len(alert_links(share.CHECKOUT / "rules")) > 50
    assert all(u.startswith(DEFAULT_RUNBOOK_BASE + "#") for u in links)
    r = installed.run(installed.python, "-m", "exporter.rules", "--runbook-base", BASE, "--out", "rules2")
    assert r.returncode == 0 and all(u.startswith(BASE + "#") for u in alert_links(installed.work / "rules2"))

    r = installed.run(installed.python, "-m", "exporter.tools.deploygen", "--runbook-base", BASE,
                      "--out", "site")
    assert r.returncode == 0, r.stderr
    site = installed.work / "site"
    for rel in ("deploy/kubernetes/components/prometheus-operator/prometheusrules.yaml",
                "deploy/kubernetes/components/grafana-dashboards/gpu-health-fleet.yaml",
                "deploy/kubernetes/overlays/eks/kustomization.yaml",
                "deploy/systemd/gpu-health-exporter.service",
                "dashboards/gpu-health-fleet.json", "rules/xid.yml", "docs/runbooks.html",
                "deploy/config.example.yaml", "deploy/slurm/gpu-health-check.sh"):
        assert (site / rel).is_file(), rel
    assert (site / "deploy/slurm/gpu-health-check.sh").stat().st_mode & 0o111  # still executable
    artifacts = [p for p in site.rglob("*")
                 if p.is_file() and p.relative_to(site).parts[0] not in ("docs", "README.md")]
    text = "\n".join(p.read_text() for p in artifacts)
    assert DEFAULT_RUNBOOK_BASE not in text and not any(ph in text for ph in PLACEHOLDERS)
    assert f"Documentation={BASE}" in (site / "deploy/systemd/gpu-health-exporter.service").read_text()
    fleet = (site / "dashboards/gpu-health-fleet.json").read_text()
    assert len(re.findall(re.escape(BASE) + "#", fleet)) == len(links)
    prom = (site / "deploy/kubernetes/components/prometheus-operator/prometheusrules.yaml").read_text()
    assert len(re.findall(re.escape(BASE) + "#", prom)) == len(links)
    anchors = set(re.findall(r'id="([^"]+)"', (site / "docs/runbooks.html").read_text()))
    assert {u.split("#", 1)[1] for u in links} <= anchors  # every link opens a section


def test_checkout_generators_refuse_to_write_into_site_packages(installed):  # noqa: F811
    site_packages = installed.site_packages()
    for module in ("exporter.tools.docs", "exporter.tools.release"):
        r = installed.run(installed.python, "-m", module)
        assert r.returncode == 2 and "not a checkout" in r.stderr, (module, r)
        assert "nothing written" in r.stderr
    assert not (site_packages / "docs").exists() and not (site_packages / "deploy").exists()
    # no tree to regenerate: a copy here
    r = installed.run(installed.python, "-m", "exporter.tools.deploygen")
    assert r.returncode == 0 and "gpu-health-exporter-deploy" in r.stdout, r
    copy = installed.work / "gpu-health-exporter-deploy"
    assert (copy / "deploy/kubernetes/overlays/eks/kustomization.yaml").is_file()
    r = installed.run(installed.python, "-m", "exporter.runbooks", "--out", "rb")
    assert r.returncode == 0 and 'id="gpuxidreplacenow"' in (installed.work / "rb/runbooks.html").read_text()


def test_the_installed_exporter_checks_a_simulated_node(installed):  # noqa: F811
    r = installed.run("gpu-health-exporter", "check", "--simulate", "p5.48xlarge", "--path.state-dir", "st")
    assert r.returncode == 0 and "HEALTHY" in r.stdout, r.stdout + r.stderr


def test_the_release_tarball_holds_the_wheel_and_the_rendered_files(installed, tmp_path):  # noqa: F811
    path = build_tarball(tmp_path, installed.wheel)
    top = f"gpu-health-exporter-{__version__}"
    with tarfile.open(path) as tar:
        names = set(tar.getnames())
        unit = tar.extractfile(f"{top}/deploy/systemd/gpu-health-exporter.service").read().decode()
    assert f"{top}/{installed.wheel.name}" in names and f"{top}/docs/runbooks.html" in names
    assert f"{top}/gpu-health-exporter-{__version__}.tgz" in names  # the packaged Helm chart
    assert {f"{top}/{p}" for p in map(str, share.files(share.CHECKOUT))} <= names
    assert f"Documentation={DEFAULT_RUNBOOK_BASE}" in unit


def test_no_shipped_file_links_to_a_placeholder():
    """Every shipped file, and the code that writes links (defaults, generators, the image)."""
    code = [*(share.CHECKOUT / "exporter").rglob("*.py"), share.CHECKOUT / "pyproject.toml",
            share.CHECKOUT / "setup.py"]
    for path in [share.CHECKOUT / p for p in share.files(share.CHECKOUT)] + code:
        text = path.read_text(errors="replace")
        for ph in PLACEHOLDERS:
            assert ph not in text, f"{path.relative_to(share.CHECKOUT)} links to the placeholder {ph}"


def test_ci_builds_the_release():
    ci = (share.CHECKOUT / ".ci" / "run").read_text()
    assert re.search(r"^\.venv/bin/python -m exporter\.tools\.release$", ci, re.M)


def test_the_runbooks_page_has_every_section_and_code_block():
    md = (share.CHECKOUT / "docs" / "runbooks.md").read_text()
    page = runbooks.render(md)
    fences = sum(1 for line in md.splitlines() if line.lstrip().startswith("```"))
    assert page.count("<pre><code>") == fences // 2 and "```" not in page
    headings = [line.lstrip("#").strip() for line in md.splitlines() if line.startswith("#")]
    ids = re.findall(r'<h\d id="([^"]+)"', page)
    assert ids == [runbooks.anchor(h) for h in headings]
    assert {r["alert"].lower() for r in yaml_alerts()} <= set(ids)


def yaml_alerts() -> list[dict]:
    return [r for f in sorted((share.CHECKOUT / "rules").glob("*.yml"))
            for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"] if "alert" in r]


# --- a release a user can build and take --------------------------------------------------------

def test_the_wheel_carries_its_revision(installed):  # noqa: F811
    from exporter.buildinfo import from_git

    want = from_git(share.CHECKOUT)
    assert want is not None and want[0] != "unknown"
    code = "from exporter.buildinfo import build_info; print(*build_info())"
    r = installed.run(installed.python, "-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [want[0], want[1]], r.stdout  # outside any checkout: from the wheel


def test_the_release_leaves_out_what_works_only_in_a_checkout(installed, tmp_path):  # noqa: F811
    path = build_tarball(tmp_path, installed.wheel)
    top = f"gpu-health-exporter-{__version__}"
    with tarfile.open(path) as tar:
        names = set(tar.getnames())
        tar.extractall(tmp_path / "x", filter="data")
    shipped = installed.site_packages() / "exporter" / "shipped"
    for rel in share.CHECKOUT_ONLY:
        assert f"{top}/{rel}" not in names and not (shipped / rel).exists(), rel
    # what is left works where it lands: no script needs the source tree (a pyproject.toml, setup.py)
    for script in (tmp_path / "x" / top / "deploy").rglob("*.sh"):
        text = script.read_text()
        assert not re.search(r"pyproject\.toml|setup\.py|pip install (-e )?\.", text), script


def test_the_sizes_in_the_docs_are_the_builds(installed, tmp_path):  # noqa: F811
    """docs/deploy.md's sizes are written by `python -m exporter.tools.release` (within 3%: the tree moved
    on a little since the last release run, as every generated file's source does)."""
    from exporter.tools.release import kib, sizes_in_doc

    doc = sizes_in_doc()
    built = {"wheel": kib(installed.wheel), "tarball": kib(build_tarball(tmp_path, installed.wheel))}
    assert doc.keys() == built.keys()
    for k in built:
        assert abs(doc[k] - built[k]) <= built[k] * 0.03, (k, doc[k], built[k])


def test_write_sizes_rewrites_the_docs_numbers(tmp_path):
    from exporter.tools.release import sizes_in_doc, write_sizes

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "deploy.md").write_text((share.CHECKOUT / "docs" / "deploy.md").read_text())
    assert write_sizes(1234, 5678, tmp_path)
    assert sizes_in_doc(tmp_path) == {"wheel": 1234, "tarball": 5678}
    assert not write_sizes(1234, 5678, tmp_path)


def test_the_build_backend_is_pinned_where_the_release_builds(monkeypatch, tmp_path):
    """The quick start's venv gets pyproject's pin; a venv without it builds in isolation (never
    setuptools 65 on the SPDX license string, which failed)."""
    from exporter.tools import release

    name, want = release.backend_requirement()
    assert (name, want) == ("setuptools", (77,))
    quick = (share.CHECKOUT / "deploy" / "quickstart.sh").read_text()
    assert "pip install -q 'setuptools>=77'" in quick
    ci = (share.CHECKOUT / ".ci" / "run").read_text()
    assert "'setuptools>=77'" in ci
    calls = []
    monkeypatch.setattr(release, "backend_ok", lambda root=None: (False, "setuptools 65.5.0"))
    monkeypatch.setattr(release.subprocess, "run", lambda argv, **kw: calls.append(argv) or
                        (Path(argv[argv.index("-w") + 1]) / "x-0-py3-none-any.whl").write_text(""))
    release.build_wheel(tmp_path)
    assert "--no-build-isolation" not in calls[0]
    calls.clear()
    monkeypatch.setattr(release, "backend_ok", lambda root=None: (True, "setuptools 80"))
    release.build_wheel(tmp_path)
    assert "--no-build-isolation" in calls[0]


def test_a_fresh_venv_s_own_setuptools_is_not_the_pin(tmp_path):
    """Why the pin is installed: a venv made with python3 -m venv has the interpreter's bundled
    setuptools (65 on Debian bookworm's 3.11), which `backend_ok` rejects there."""
    import subprocess
    import venv

    from exporter.tools.release import backend_requirement

    venv.EnvBuilder(with_pip=True).create(tmp_path / "v")
    code = ("import importlib.metadata as m\n"
            "try:\n print(m.version('setuptools'))\nexcept Exception:\n print('0')")
    r = subprocess.run([str(tmp_path / "v" / "bin" / "python"), "-c", code], capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert r.returncode == 0, r.stderr
    have = tuple(int(x) for x in re.findall(r"\d+", r.stdout)[:1])
    _, want = backend_requirement()
    if have >= want:
        pytest.skip(f"this interpreter bundles setuptools {r.stdout.strip()}")  # nothing to pin against
    assert have < want  # so the quick start installs the pin, and the release checks for it
