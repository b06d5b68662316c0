"""Suite-wide guards and settings.

- No test sends a packet beyond loopback. An exporter a test starts on this machine (not a
  simulated or replayed node) is given `instance.imds: false` in its config, as an operator
  would off EC2 (tests.helpers.start_exporter adds tests/fixtures/config/no-imds.yaml); a test
  of IMDS points it at a fake on 127.0.0.1 (tests/test_imds.py). In this process and in every
  exporter started by tests.helpers, every socket connect or sendto to an address that is not
  loopback, and every name lookup of a host that is not an IP literal or localhost, raises
  NonLoopbackError and fails the test, even where the code under test catches the error (the
  IMDS lookup retries quietly): 169.254.169.254 and fd00:ec2::254 in particular
  (tests/netguard). tests/test_loopback_guard.py proves it trips.
- Hypothesis runs derandomized: the "ci" profile (the default, and what .ci/run uses) draws the
  same examples on every run and machine (a seed derived from each test), so a run that passed
  passes again and a failure reproduces; deadline off (a loaded 2-core CI must not turn slowness
  into failures), 300 examples a test, no example database. The random search runs on demand:
  `HYPOTHESIS_PROFILE=search .venv/bin/python -m pytest -q tests/test_property_parsers.py
  tests/test_exposition.py` draws fresh examples, 5,000 a test (about 5 minutes on 2 cores), keeps
  failures in .hypothesis/ and prints the blob that replays one (`@reproduce_failure`).
- Tiers: `pytest -m unit` is the edit-test loop (under a minute on two cores): every test not
  marked `slow` in a module that starts no program (no subprocess, no exporter, no promtool, no
  simulated node or command: see STARTS_PROGRAMS) and runs no Hypothesis search. Nothing is
  listed by hand: a module is in the tier by what it does. The full suite (.ci/run) runs
  everything, the unit tier included.
- The suite is a composition root: it discovers the collectors once, at start, so their config
  sections are in the schema whatever a test imports (exporter.config imports no collector), and
  lifts the open-file limit as the exporter does at start (exporter.lifecycle.raise_fd_limit).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from exporter import collectors
from exporter.lifecycle import raise_fd_limit
from tests.netguard import sitecustomize as guard  # the loopback guard, in this process from here on


def pytest_configure(config: pytest.Config) -> None:
    collectors.discover()
    raise_fd_limit()  # process start-up, as the exporter's (EFA keeps its counter files open)
    config.addinivalue_line("markers", "unit: the fast in-process tier (set by tests/conftest.py)")
    config.addinivalue_line("markers", "spread: the module's tests are independent: xdist may run each "
                                       "on any worker (tests/conftest.py, pytest_xdist_make_scheduler)")


# Words in a test module's source that mean it starts a real program, a whole (simulated) node or
# a command (`main(...)`), or runs a property search: its tests are not in the unit tier.
STARTS_PROGRAMS = ("subprocess", "Popen", "start_exporter", "start_listening", "served_base", "promtool",
                   "sys.executable", "hypothesis", "exporter.tools.release", "wait_until_serving",
                   "--simulate", "main(")
_module_text: dict[str, str] = {}


def _source(path: Path) -> str:
    """A test module's source, read once (the tier and the scheduler judge a module by it)."""
    key = str(path)
    if key not in _module_text:
        try:
            _module_text[key] = path.read_text()
        except OSError:
            _module_text[key] = "subprocess"  # unreadable: not unit, not spread
    return _module_text[key]


def _unit_module(path: Path) -> bool:
    return not any(w in _source(path) for w in STARTS_PROGRAMS)


# The modules that take longest on the 2-core CI (seconds from `pytest --durations`, idle host),
# longest first: run first, so that under pytest-xdist (.ci/run: --dist loadfile
# --no-loadscope-reorder) the workers end together instead of one finishing a two-minute module
# alone while the others idle. xdist's own order (most tests first) put exactly these one-to-three
# test modules last, all at once. A stale list costs only balance, never a test: refresh it from a
# whole run's --durations when a module's figure moves by half a minute or more.
LONGEST_FIRST = (
    "test_alert_matrix.py",  # 140: one test, waiting on Prometheus and Alertmanager
    "test_rules_suites.py",  # 200 of promtool in all, spread: one suite a test, on any worker
    "test_job_health_live.py",  # 80
    "test_nccl_live.py",  # 40
    "test_kubernetes.py",  # 45
    "test_dashboards_live.py",  # 30
    "test_helm_install.py",  # 80: a kube-apiserver, helm install..uninstall, three exporters
    "test_helm.py",  # 60: helm lint and template of every values set, validation for six versions
    "test_slurm.py",  # 60
    "test_container.py",  # builds the image first
    "test_rules_regression_cases.py",  # 30
    "test_workload_attribution_slurm.py",
    "test_http_raw_clients.py",
    "test_check.py",
    "test_rules_live.py",
    "test_workload_slurm.py",
)


def _rank(item: pytest.Item) -> int:
    name = Path(str(item.fspath)).name
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


# Scheduling under xdist (.ci/run: --dist loadfile): a module's tests run on one worker, in order,
# so its module fixtures (a Slurm cluster, a Prometheus) are built once; a module marked `spread`
# (`pytestmark = pytest.mark.spread`: its tests independent, no fixture wider than a test's) gives
# each test to whichever worker is free, so one long module does not hold one worker while the
# others idle (tests/test_rules_suites.py: a promtool suite a test). The scheduler runs in xdist's
# controller, which sees test ids only: it reads the module's source, as the unit tier does.
SPREAD = "pytestmark = pytest.mark.spread"


def _check_spread(item: pytest.Item) -> None:
    if SPREAD not in _source(Path(str(item.fspath))):  # what the scheduler reads
        raise pytest.UsageError(f"{item.nodeid} is marked spread otherwise than by `{SPREAD}`: "
                                "xdist would keep its tests on one worker")
    info = getattr(item, "_fixtureinfo", None)
    wide = sorted({d.argname for defs in (info.name2fixturedefs.values() if info else ())
                   for d in defs if d.scope not in ("function", "session")})
    if wide:
        raise pytest.UsageError(f"{item.nodeid} is marked spread but uses the shared fixtures {wide}: "
                                "every worker that runs one of its tests would build them")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:  # xdist's Scheduling
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    root = Path(str(config.rootpath))

    class SpreadOrFile(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return nodeid if SPREAD in _source(root / module) else module

    return SpreadOrFile(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") is None and _unit_module(Path(str(item.fspath))):
            item.add_marker(pytest.mark.unit)
        if item.get_closest_marker("spread") is not None:
            _check_spread(item)
    items.sort(key=_rank)  # stable: a module's tests, and the other modules, keep their order


VIOLATIONS: list[str] = []  # this process's
guard.REFUSED.append(VIOLATIONS.append)
NonLoopbackError = guard.NonLoopbackError
# The processes the tests start with the guard (tests.helpers.guarded_env) append theirs here.
NET_LOG = Path(tempfile.gettempdir()) / f"gpu-health-exporter-netguard-{os.getpid()}.log"
os.environ[guard.LOG_ENV] = str(NET_LOG)
_net_seen = 0


def child_violations() -> list[str]:
    """What the processes started with the guard refused since the last call."""
    global _net_seen
    try:
        text = NET_LOG.read_text()
    except FileNotFoundError:
        return []
    new, _net_seen = text[_net_seen:], len(text)
    return new.splitlines()


def pytest_unconfigure(config: pytest.Config) -> None:
    NET_LOG.unlink(missing_ok=True)


@pytest.fixture
def pool():
    """The deadline pool (exporter.deadline) of a Runner, NvmlSession or reader a test builds."""
    from tests.helpers import test_pool

    return test_pool()  # closed by close_pools


@pytest.fixture(autouse=True)
def close_pools():
    """Close the pools tests.helpers.test_pool() made in the test and its function-scoped
    fixtures (their idle threads leave), after those fixtures' own teardown."""
    from tests.helpers import close_test_pools, test_pools_made

    since = test_pools_made()
    yield
    close_test_pools(since)


@pytest.fixture(autouse=True)
def loopback_only():
    """Fail the test that tried to reach beyond loopback (or whose exporter did), even if the code
    swallowed the error."""
    VIOLATIONS.clear()
    yield
    found = VIOLATIONS + child_violations()
    if found:
        VIOLATIONS.clear()
        pytest.fail("network beyond loopback: " + "; ".join(found), pytrace=False)


try:
    from hypothesis import HealthCheck, settings

    _hypothesis = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow], "print_blob": True}
    settings.register_profile("ci", derandomize=True, database=None, max_examples=300, **_hypothesis)
    settings.register_profile("search", derandomize=False, max_examples=5000, **_hypothesis)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    pass
