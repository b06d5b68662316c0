"""The Helm chart with the real helm against the real kube-apiserver (tests/kube_apiserver.py): install,
upgrade, rollback and uninstall; the objects exist and go; the chart's own service account and RBAC
are the only authority under which the exporter keeps the GpuHealthy condition and the opt-in taint
and label; the verdict reaches the Node within 10 s with nothing scraping; `helm test`'s check
(exporter.kube.helmtest) against the same server.

There is no kubelet and no controller: the DaemonSet's pods never run. The exporter is the real daemon
on a simulated p5.48xlarge, authenticated with the token of the service account the chart creates
(release gpu-health-exporter in gpu-health: tests/kube_apiserver.py's SA_USER), through the fault
proxy in pass mode."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from exporter.kube.writer import LABEL_KEY, LABEL_VALUE, TAINT_KEY
from exporter.tools.simulate.kmsg import ONSET_S
from tests import helm
from tests.helpers import guarded_env, start_exporter, stop_within, value
from tests.kube_apiserver import ApiServer, FaultProxy, api_server, until

# The bound: a replace-now XID or an ack reaches the condition within 10 s, scraped or not.
VERDICT_BOUND_S = 10.0
ANY_OBJECT = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
CRDS = {"PodMonitor": "podmonitors", "ServiceMonitor": "servicemonitors", "PrometheusRule": "prometheusrules"}


@pytest.fixture(scope="module")
def api(tmp_path_factory) -> ApiServer:
    with api_server(tmp_path_factory.mktemp("kube")) as s:
        yield s


@pytest.fixture(scope="module")
def proxy(api, tmp_path_factory) -> FaultProxy:
    p = FaultProxy(api, tmp_path_factory.mktemp("proxy"))
    yield p
    p.close()


class Helm:
    """helm as the cluster admin, in the API server's network namespace, with a home of its own."""

    def __init__(self, api: ApiServer, home: Path) -> None:
        self.api, self.home = api, home

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return helm.run(*args, "--kubeconfig", str(self.api.d / "admin.kubeconfig"),
                        prefix=tuple(self.api.netns), home=self.home, check=check)

    def install(self, *sets: str) -> subprocess.CompletedProcess:
        return self("upgrade", "--install", helm.RELEASE, str(helm.CHART), "--namespace", helm.NAMESPACE,
                    "--create-namespace", *(a for s in sets for a in ("--set", s)))

    def uninstall(self) -> None:
        self("uninstall", helm.RELEASE, "--namespace", helm.NAMESPACE)

    def revisions(self) -> list[dict]:
        return json.loads(self("history", helm.RELEASE, "-n", helm.NAMESPACE, "-o", "json").stdout)


@pytest.fixture
def helm_(api, tmp_path):
    h = Helm(api, tmp_path / "helm-home")
    yield h
    h("uninstall", helm.RELEASE, "--namespace", helm.NAMESPACE, "--ignore-not-found", check=False)


def exists(api: ApiServer, kind: str, name: str, namespaced: bool = True) -> bool:
    ns = ("-n", helm.NAMESPACE) if namespaced else ()
    return api.kubectl("get", kind, name, *ns, "-o", "name", check=False).returncode == 0


def install_crds(api: ApiServer) -> None:
    """The Prometheus Operator's CRDs, reduced to their names and versions (their schemas are
    not what is tested: that the chart sees them served)."""
    docs = [{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
             "metadata": {"name": f"{plural}.monitoring.coreos.com"},
             "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                      "names": {"kind": kind, "plural": plural, "singular": kind.lower(),
                                "listKind": f"{kind}List"},
                      "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                          "openAPIV3Schema": ANY_OBJECT}}]}}
            for kind, plural in CRDS.items()]
    api.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
    until(lambda: all(api.kubectl("get", plural, "-A", check=False).returncode == 0
                      for plural in CRDS.values()), 60, "the CRDs served")


def test_install_upgrade_rollback_uninstall(api, helm_):
    h = helm_
    out = h.install().stdout
    assert "GpuHealthy" in out  # NOTES.txt
    for kind, name in (("daemonset", helm.RELEASE), ("configmap", helm.RELEASE),
                       ("serviceaccount", helm.RELEASE), ("configmap", f"{helm.RELEASE}-runbooks"),
                       ("configmap", f"{helm.RELEASE}-dashboard-gpu-health-node")):
        assert exists(api, kind, name), (kind, name)
    assert exists(api, "clusterrole", f"{helm.RELEASE}-node-condition", namespaced=False)
    assert not exists(api, "clusterrole", f"{helm.RELEASE}-node-actions", namespaced=False)
    assert api.can_i("patch", "nodes/status") and not api.can_i("get", "nodes")
    # no Prometheus Operator: no PodMonitor, no PrometheusRule, and the install did not fail
    assert not any(exists(api, "crd", f"{p}.monitoring.coreos.com", namespaced=False) for p in CRDS.values())

    install_crds(api)
    h.install("nodeActions.taint=true", "nodeActions.hyperpodLabel=true")
    assert exists(api, "clusterrole", f"{helm.RELEASE}-node-actions", namespaced=False)
    until(lambda: api.can_i("get", "nodes") and api.can_i("patch", "nodes"), 20, "the actions' RBAC in force")
    assert not api.can_i("delete", "nodes") and not api.can_i("list", "secrets")
    assert exists(api, "podmonitor", helm.RELEASE)  # the CRD is served now: auto renders it
    assert exists(api, "prometheusrule", f"{helm.RELEASE}-xid")
    assert not api.kubectl("get", "servicemonitor", "-n", helm.NAMESPACE, "-o", "name").stdout.strip()
    ds = json.loads(api.kubectl("get", "daemonset", helm.RELEASE, "-n", helm.NAMESPACE, "-o", "json").stdout)
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--kubernetes.taint" in args and "--kubernetes.hyperpod-label" in args

    h("rollback", helm.RELEASE, "1", "--namespace", helm.NAMESPACE)
    assert [r["revision"] for r in h.revisions()] == [1, 2, 3]
    assert not exists(api, "clusterrole", f"{helm.RELEASE}-node-actions", namespaced=False)
    until(lambda: not api.can_i("get", "nodes"), 20, "the actions' RBAC gone with the rollback")
    assert api.can_i("patch", "nodes/status")
    assert not exists(api, "podmonitor", helm.RELEASE)  # revision 1 had none

    h.uninstall()
    for kind in ("daemonset", "serviceaccount", "configmap"):
        name = helm.RELEASE
        assert not exists(api, kind, name), (kind, name)
    assert not exists(api, "clusterrole", f"{helm.RELEASE}-node-condition", namespaced=False)
    until(lambda: not api.can_i("patch", "nodes/status"), 20, "no authority left after uninstall")


class Daemon:
    """The exporter on a simulated node writing Node `node` as the chart's service account; started
    by waiting on /healthz, which collects nothing, so nothing scrapes it."""

    def __init__(self, d: Path, api: ApiServer, proxy: FaultProxy, node: str,
                 flags: tuple[str, ...] = (), scenario: str = "xid-94") -> None:
        self.d, self.node = d, node
        self.token = d / "token"
        self.token.write_text(api.sa_tokens[0] + "\n")
        self.kube = {"api_url": proxy.url, "token_file": str(self.token), "ca_file": str(api.cert)}
        cfg = {"kubernetes": {"enabled": True, "node_name": node, "heartbeat_seconds": 3600,
                              "retry_min_seconds": 0.2, "retry_max_seconds": 1.0, **self.kube}}
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
        self.sim = ["--simulate", "p5.48xlarge", "--scenario", scenario, "--path.state-dir", str(d / "state")]
        args = (*self.sim, "--config", str(d / "config.yaml"), *flags)
        self.proc, healthz, self.log = start_exporter(d, *args, path="/healthz")
        self.started = time.monotonic()
        self.metrics = healthz.replace("/healthz", "/metrics")

    def ack(self, gpu: str) -> None:
        r = subprocess.run([sys.executable, "-m", "exporter", "ack", *self.sim, "--gpu", gpu],
                           env=guarded_env(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr

    def helm_test(self, node: str | None = None) -> subprocess.CompletedProcess:
        """exporter.kube.helmtest, as the chart's test pod runs it (there: in-cluster)."""
        return subprocess.run([sys.executable, "-m", "exporter.kube.helmtest", "--url", self.metrics,
                               "--node", node or self.node, "--timeout", "15",
                               *(a for k, v in self.kube.items() for a in (f"--{k.replace('_', '-')}", v))],
                              env=guarded_env(), capture_output=True, text=True, timeout=60)

    def stop(self) -> None:
        assert stop_within(self.proc) == 0


def node_has(api: ApiServer, node: str, taint: bool, label: str) -> bool:
    n = api.node(node)
    return (TAINT_KEY in {t["key"] for t in n["spec"].get("taints") or []}) is taint \
        and n["metadata"]["labels"].get(LABEL_KEY) == label


def condition(api: ApiServer, node: str) -> tuple[str, str] | None:
    c = api.condition(node)
    return (c["status"], c["reason"]) if c else None


def test_with_nothing_scraping_xid_94_and_its_ack_reach_the_node_within_seconds_under_the_charts_rbac(
        api, proxy, helm_, tmp_path):
    """Only the chart's RBAC (condition and both actions); no scrape at all: the XID (logged
    ONSET_S after start) turns GpuHealthy False and adds the taint and HyperPod's label within 10 s,
    the ack turns it True and removes them within 10 s; the heartbeat is an hour away."""
    helm_.install("nodeActions.taint=true", "nodeActions.hyperpodLabel=true")
    until(lambda: api.can_i("get", "nodes"), 20, "the chart's RBAC in force")
    node = "gpu-node-helm"
    api.create_node(node, labels={"node.kubernetes.io/instance-type": "ml.p5.48xlarge",
                                  LABEL_KEY: "Schedulable"})
    ex = Daemon(tmp_path, api, proxy, node, ("--kubernetes.taint", "--kubernetes.hyperpod-label"))
    try:
        until(lambda: condition(api, node) == ("False", "ReplaceRequired"), ONSET_S + VERDICT_BOUND_S,
              "GpuHealthy False within 10 s of the XID, nothing scraping", ex.log)
        until(lambda: node_has(api, node, taint=True, label=LABEL_VALUE), VERDICT_BOUND_S,
              "the taint and label")
        ex.ack("1")
        until(lambda: condition(api, node) == ("True", "Healthy"), VERDICT_BOUND_S,
              "GpuHealthy True within 10 s of the ack, nothing scraping", ex.log)
        until(lambda: node_has(api, node, taint=False, label="Schedulable"), VERDICT_BOUND_S,
              "the taint gone and HyperPod's value back")
        # nothing scraped until now: this scrape is the first
        assert value(requests.get(ex.metrics, timeout=30).text, "gpu_health_exporter_scrapes_total") == 1

        # the chart's `helm test` check: the verdict /metrics shows is the Node's condition
        r = ex.helm_test()
        assert r.returncode == 0 and "GpuHealthy=True (Healthy)" in r.stdout, r.stdout + r.stderr
        other = "gpu-node-without-exporter"
        api.create_node(other)
        r = ex.helm_test(other)
        assert r.returncode == 1 and "no GpuHealthy condition" in r.stderr, r.stdout + r.stderr
    finally:
        ex.stop()


def test_the_condition_rbac_alone_sets_the_condition_and_is_refused_the_node(api, proxy, helm_, tmp_path):
    """The chart's defaults (condition on, actions off): the writer keeps GpuHealthy with patch on
    nodes/status alone, and the exporter run with the action flags is refused (403) the Node itself,
    counting it, while the condition stays right."""
    helm_.install()
    until(lambda: api.can_i("patch", "nodes/status") and not api.can_i("get", "nodes"), 20,
          "the chart's RBAC")
    node = "gpu-node-helm-condition-only"
    api.create_node(node)
    ex = Daemon(tmp_path, api, proxy, node, ("--kubernetes.taint",))
    try:
        until(lambda: condition(api, node) == ("False", "ReplaceRequired"), ONSET_S + VERDICT_BOUND_S,
              "GpuHealthy False", ex.log)
        errors = "gpu_health_exporter_kubernetes_errors_total"
        until(lambda: value(requests.get(ex.metrics, timeout=30).text, errors, kind="forbidden") >= 1, 30,
              "the taint refused by RBAC")
        assert TAINT_KEY not in {t["key"] for t in api.node(node)["spec"].get("taints") or []}
    finally:
        ex.stop()


def test_with_nothing_scraping_a_lost_gpu_reaches_the_node_within_seconds(api, proxy, helm_, tmp_path):
    """GPU 1 falls off the bus (NVML's XID 79 event, then GPU_IS_LOST on every call; the driver's
    kernel line): the condition leaves True within 10 s of it, nothing scraping."""
    helm_.install()
    until(lambda: api.can_i("patch", "nodes/status"), 20, "the chart's RBAC")
    node = "gpu-node-helm-lost-gpu"
    api.create_node(node)
    ex = Daemon(tmp_path, api, proxy, node, scenario="gpu-lost")
    try:
        until(lambda: condition(api, node) == ("False", "RebootRequired"), ONSET_S + VERDICT_BOUND_S,
              "GpuHealthy False within 10 s of the lost GPU, nothing scraping", ex.log)
        assert value(requests.get(ex.metrics, timeout=30).text, "gpu_health_exporter_scrapes_total") == 1
    finally:
        ex.stop()


def active_jobs(api: ApiServer) -> dict[str, str]:
    """The release's active-check Jobs: node -> Job name."""
    out = api.kubectl("get", "jobs", "-n", helm.NAMESPACE, "-o", "json",
                      "-l", "app.kubernetes.io/name=gpu-health-active-check").stdout
    return {j["metadata"]["annotations"]["gpu-health-exporter/node"]: j["metadata"]["name"]
            for j in json.loads(out)["items"]}


def test_active_check_jobs_come_go_and_change_without_an_immutable_field_error(api, helm_):
    """A Job's pod template is immutable: the chart names each Job by its node and what it runs, so an
    upgrade that changes a setting or the run id replaces the Jobs instead of failing, a node added
    leaves the others' Jobs, and turning the checks off removes them (no controller runs here: the
    Jobs are objects only)."""
    h = helm_
    h.install("activeChecks.enabled=true", "activeChecks.nodes={gpu-a,gpu-b}")
    first = active_jobs(api)
    assert set(first) == {"gpu-a", "gpu-b"} and exists(api, "configmap", f"{helm.RELEASE}-active-check")
    h.install("activeChecks.enabled=true", "activeChecks.nodes={gpu-a,gpu-b,gpu-c}")
    added = active_jobs(api)
    assert set(added) == {"gpu-a", "gpu-b", "gpu-c"} and added.items() >= first.items()
    for change in ("activeChecks.runId=2", "activeChecks.dcgmLevel=3"):
        h.install("activeChecks.enabled=true", "activeChecks.nodes={gpu-a,gpu-c}", change)
        now = active_jobs(api)
        assert set(now) == {"gpu-a", "gpu-c"} and not set(now.values()) & set(added.values()), change
        added = now
    h.install("activeChecks.enabled=false")
    assert not active_jobs(api) and not exists(api, "configmap", f"{helm.RELEASE}-active-check")


def test_a_number_given_for_a_quantity_installs(api, helm_):
    """`--set resources.requests.cpu=1` is a number to helm; Helm 4's server-side apply refuses a number
    where a quantity goes, so the chart quotes every quantity it renders."""
    helm_.install("resources.requests.cpu=1", "resources.limits.cpu=2", "activeChecks.enabled=true",
                  "activeChecks.nodes={gpu-a}", "activeChecks.resources.requests.cpu=2")
    ds = json.loads(api.kubectl("get", "daemonset", helm.RELEASE, "-n", helm.NAMESPACE, "-o", "json").stdout)
    assert ds["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"
    (job,) = active_jobs(api).values()
    out = json.loads(api.kubectl("get", "job", job, "-n", helm.NAMESPACE, "-o", "json").stdout)
    assert out["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "2"
