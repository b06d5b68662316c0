"""The verdict on a real Kubernetes API server (tests/kube_apiserver.py): the GpuHealthy condition,
the opt-in taint and HyperPod label, the shipped RBAC as the only authority, and faults.

One kube-apiserver (with etcd) for the module; each test has Nodes of its own. The exporter is the
real daemon on a simulated p5.48xlarge, authenticated as the DaemonSet's service account, so what
the overlays' ClusterRoles allow (applied with kubectl) is all it may do."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from exporter.kube.writer import LABEL_KEY, LABEL_VALUE, OWNER_ANNOTATION, TAINT_KEY
from tests.helpers import (
    DEADLINE_MARGIN_S,
    HANG_GUARD_S,
    ROOT,
    START_HANG_GUARD_S,
    guarded_env,
    start_exporter,
    stop_within,
    value,
)
from tests.kube_apiserver import ApiServer, FaultProxy, api_server
from tests.kube_apiserver import until as _until

CURRENT: list = []  # the running Exporter, whose log a failed wait quotes


def until(cond, timeout: float = 30.0, what: str = "condition") -> object:
    return _until(cond, timeout, what, CURRENT[-1].log if CURRENT else None)

OVERLAY = ROOT / "deploy" / "kubernetes" / "overlays" / "hyperpod-eks"
ACTIONS = ROOT / "deploy" / "kubernetes" / "components" / "node-actions"
BOTH = ("--kubernetes.taint", "--kubernetes.hyperpod-label")
SCRAPE_BOUND_S = 2.0  # what a scrape may take while the API server misbehaves (it waits for none of it)
UP, ERRORS = "gpu_health_exporter_kubernetes_up", "gpu_health_exporter_kubernetes_errors_total"
LAST_SUCCESS = "gpu_health_exporter_kubernetes_last_success_timestamp_seconds"


@pytest.fixture(scope="module")
def api(tmp_path_factory) -> ApiServer:
    with api_server(tmp_path_factory.mktemp("kube")) as s:
        s.apply_rbac(OVERLAY)  # the overlay as shipped: the condition's RBAC, no actions
        yield s


@pytest.fixture(scope="module")
def proxy(api, tmp_path_factory) -> FaultProxy:
    p = FaultProxy(api, tmp_path_factory.mktemp("proxy"))
    yield p
    p.close()


def with_actions(d: Path) -> Path:
    """A kustomization of the overlay with components/node-actions added, as a user opts in."""
    k = d / "with-actions"
    k.mkdir()
    (k / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(OVERLAY, k)], "components": [os.path.relpath(ACTIONS, k)]}))
    return k


@pytest.fixture
def actions(api, tmp_path):
    """The overlay with components/node-actions added, as a user opts in: its RBAC applied."""
    objs = api.apply_rbac(with_actions(tmp_path))
    yield
    api.delete_rbac([o for o in objs if "node-actions" in o["metadata"]["name"]])


class Exporter:
    """The daemon on a simulated node, writing Node `node` through the fault proxy."""

    def __init__(self, d: Path, api: ApiServer, proxy: FaultProxy, node: str, scenarios: tuple[str, ...],
                 flags: tuple[str, ...] = (), **kube: object) -> None:
        self.d, self.node = d, node
        self.token = d / "token"
        if not self.token.exists():
            self.token.write_text(api.sa_tokens[0] + "\n")
        cfg = {"kubernetes": {"enabled": True, "api_url": proxy.url, "token_file": str(self.token),
                              "ca_file": str(api.cert), "node_name": node, "retry_min_seconds": 0.2,
                              "retry_max_seconds": 1.0, "request_timeout_seconds": 2.0, **kube}}
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
        self.sim = ["--simulate", "p5.48xlarge", *[a for s in scenarios for a in ("--scenario", s)],
                    "--path.state-dir", str(d / "state")]
        self.args = [*self.sim, "--config", str(d / "config.yaml"), *flags]
        self.proc, self.url, self.log = start_exporter(d, *self.args)
        CURRENT.append(self)

    def scrape(self) -> str:
        t = time.monotonic()
        r = requests.get(self.url, timeout=30)
        took = time.monotonic() - t
        assert r.ok and took < SCRAPE_BOUND_S, f"scrape took {took:.2f} s"
        return r.text

    def verdict_is(self, verdict: str) -> bool:
        return value(self.scrape(), "gpu_node_health_verdict", verdict=verdict) == 1

    def metric(self, name: str, **labels: str) -> float:
        return value(self.scrape(), name, **labels)

    def ack(self, gpu: str) -> None:
        r = subprocess.run([sys.executable, "-m", "exporter", "ack", *self.sim, "--gpu", gpu],
                           env=guarded_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert r.returncode == 0, r.stdout + r.stderr

    def stop(self) -> None:
        assert stop_within(self.proc) == 0


def keys(node: dict) -> set[str]:
    """The Node's taint keys (the API server's admission adds node.kubernetes.io/not-ready to a
    Node without a kubelet: a taint of another agent's, kept like any other)."""
    return {t["key"] for t in node["spec"].get("taints") or []}


def status_of(api: ApiServer, node: str) -> tuple[str, str] | None:
    c = api.condition(node)
    return (c["status"], c["reason"]) if c else None


def test_shipped_rbac_allows_exactly_what_the_writer_does(api, tmp_path):
    assert api.can_i("patch", "nodes/status")
    for verb, resource in (("get", "nodes"), ("patch", "nodes"), ("delete", "nodes"), ("list", "nodes"),
                           ("update", "nodes/status"), ("get", "secrets"), ("list", "pods"),
                           ("create", "nodes")):
        assert not api.can_i(verb, resource), f"the condition's RBAC allows {verb} {resource}"
    objs = api.apply_rbac(with_actions(tmp_path))
    try:
        until(lambda: api.can_i("get", "nodes"), 20, "the actions' RBAC in force")
        assert api.can_i("patch", "nodes") and api.can_i("patch", "nodes/status")
        for verb, resource in (("delete", "nodes"), ("list", "nodes"), ("create", "nodes"),
                               ("update", "nodes"), ("get", "secrets"), ("list", "secrets")):
            assert not api.can_i(verb, resource), f"the actions' RBAC allows {verb} {resource}"
    finally:
        api.delete_rbac([o for o in objs if "node-actions" in o["metadata"]["name"]])
    until(lambda: not api.can_i("get", "nodes"), 20, "the actions' RBAC gone")


def test_replace_verdict_sets_the_condition_ack_clears_it_restart_keeps_transition_time(api, proxy, tmp_path):
    node = "gpu-node-condition"
    api.create_node(node)
    before = len(proxy.requests())
    ex = Exporter(tmp_path, api, proxy, node, ("xid-94", "slurm-job"))
    try:
        until(lambda: ex.verdict_is("replace_required"), 60, "the XID 94 verdict")
        # within that collection, no scrape more: False, the replace reason, GPU, XID and job named
        cond = until(lambda: (c := api.condition(node)) and c["status"] == "False" and c, 30,
                     "GpuHealthy False")
        assert cond["reason"] == "ReplaceRequired", cond
        assert all(w in cond["message"] for w in ("GPU 1", "XID 94", "slurm job 4242")), cond
        assert ex.metric(UP) == 1
        assert ex.metric(LAST_SUCCESS) > time.time() - 60
        transition = cond["lastTransitionTime"]
        # the condition alone never reads or patches the Node itself (RBAC would refuse it)
        assert not [r for r in proxy.requests()[before:] if r[1] == f"/api/v1/nodes/{node}"]
        assert not [r for r in proxy.requests()[before:] if r[2] not in ("200",)]
        ex.stop()
        n = len(proxy.requests())
        ex = Exporter(tmp_path, api, proxy, node, ("xid-94", "slurm-job"))
        until(lambda: [r for r in proxy.requests()[n:] if r[0] == "PATCH" and r[2] == "200"
                       and r[1].endswith("/status")][1:], 30, "the restarted exporter's read and write")
        again = api.condition(node)
        assert (again["status"], again["reason"], again["lastTransitionTime"]) == ("False", "ReplaceRequired",
                                                                                   transition)
        ex.ack("1")
        ex.scrape()  # the collection that takes the ack
        cond = until(lambda: (c := api.condition(node)) and c["status"] == "True" and c, 30,
                     "GpuHealthy True")
        assert cond["reason"] == "Healthy" and cond["lastTransitionTime"] >= transition
    finally:
        ex.stop()


def test_taint_and_label_appear_and_go_and_another_agents_stay(api, proxy, tmp_path, actions):
    node = "gpu-node-actions"
    other = {"key": "example.com/other-agent", "value": "x", "effect": "NoSchedule"}
    api.create_node(node, taints=[other])
    ex = Exporter(tmp_path, api, proxy, node, ("xid-94",), BOTH)
    try:
        until(lambda: ex.verdict_is("replace_required"), 60, "the XID 94 verdict")

        def acted():
            n = api.node(node)
            return ({other["key"], TAINT_KEY} <= keys(n)
                    and n["metadata"].get("labels", {}).get(LABEL_KEY) == LABEL_VALUE and n)
        n = until(acted, 30, "the taint and label")
        assert n["metadata"]["annotations"][OWNER_ANNOTATION] == "label,taint"
        ours = [t for t in n["spec"]["taints"] if t["key"] == TAINT_KEY][0]
        assert ours["effect"] == "NoSchedule" and ours["value"] == "ReplaceRequired"
        ex.ack("1")
        ex.scrape()

        def cleared():
            n = api.node(node)
            return (other in n["spec"]["taints"] and TAINT_KEY not in keys(n)
                    and LABEL_KEY not in n["metadata"].get("labels", {})
                    and OWNER_ANNOTATION not in n["metadata"].get("annotations", {}) and n)
        until(cleared, 30, "our taint and label removed, the other agent's taint kept")
        assert status_of(api, node) == ("True", "Healthy")
    finally:
        ex.stop()


def test_a_label_another_agent_set_is_never_removed(api, proxy, tmp_path, actions):
    node = "gpu-node-theirs"
    theirs = {"key": TAINT_KEY, "value": "set-by-someone-else", "effect": "NoSchedule"}
    api.create_node(node, taints=[theirs], labels={LABEL_KEY: LABEL_VALUE})
    ex = Exporter(tmp_path, api, proxy, node, ("xid-94",), BOTH)
    try:
        until(lambda: ex.verdict_is("replace_required"), 60, "the XID 94 verdict")
        until(lambda: status_of(api, node) == ("False", "ReplaceRequired"), 30, "GpuHealthy False")
        ex.ack("1")
        ex.scrape()
        until(lambda: status_of(api, node) == ("True", "Healthy"), 30, "GpuHealthy True")
        ex.scrape()
        n = api.node(node)
        assert [t for t in n["spec"]["taints"] if t["key"] == TAINT_KEY] == [theirs]
        assert n["metadata"]["labels"][LABEL_KEY] == LABEL_VALUE
        assert OWNER_ANNOTATION not in n["metadata"].get("annotations", {})
    finally:
        ex.stop()


def test_faults_never_delay_a_scrape_and_the_condition_converges(api, proxy, tmp_path):
    node = "gpu-node-faults"
    api.create_node(node)
    proxy.set("status", 403)  # the RBAC not in force yet, say
    ex = Exporter(tmp_path, api, proxy, node, ("xid-94",), heartbeat_seconds=1.0)
    try:
        until(lambda: ex.verdict_is("replace_required"), 60, "the XID 94 verdict")
        until(lambda: ex.metric(ERRORS, kind="forbidden") > 0, 30,
              "forbidden counted")
        assert ex.metric(UP) == 0 and api.condition(node) is None
        proxy.set()
        until(lambda: status_of(api, node) == ("False", "ReplaceRequired"), 30, "converged after 403")

        # the API server stopped: the verdict changes (ack) meanwhile, then it comes back
        api.stop_apiserver()
        try:
            ex.ack("1")
            until(lambda: ex.verdict_is("healthy"), 30, "the ack in the verdict")
            until(lambda: ex.metric(UP) == 0, 30, "up 0 while stopped")
            for _ in range(5):
                ex.scrape()  # within the bound each time
        finally:
            api.start_apiserver()
        until(lambda: status_of(api, node) == ("True", "Healthy"), 60, "converged after the restart")

        for kind, fault in (("conflict", {"mode": "status", "status": 409}),
                            ("server", {"mode": "status", "status": 500}),
                            ("timeout", {"delay_s": 5.0}),
                            ("connection", {"mode": "drop"})):
            n0 = ex.metric(ERRORS, kind=kind)
            proxy.set(**fault)
            until(lambda k=kind, n=n0: ex.metric(ERRORS, kind=k) > n, 30, f"{kind} counted")
            assert ex.metric(UP) == 0
            proxy.set()
            t = time.time()
            until(lambda t=t: ex.metric(LAST_SUCCESS) >= int(t) and ex.metric(UP) == 1, 30,
                  f"recovered from {kind}")
        assert status_of(api, node) == ("True", "Healthy")

        # the token rotated: the old one is refused (401), the new one in the file is read and used
        n0 = ex.metric(ERRORS, kind="unauthorized")
        proxy.set(revoked=(api.sa_tokens[0],))
        until(lambda: ex.metric(ERRORS, kind="unauthorized") > n0, 30, "the old token refused")
        new = ex.token.with_suffix(".new")
        new.write_text(api.sa_tokens[1])
        os.replace(new, ex.token)
        until(lambda: ex.metric(UP) == 1, 30, "writing again with the rotated token")
        reqs = proxy.requests()
        first = next(i for i, r in enumerate(reqs) if r[3] == api.sa_tokens[1])
        assert reqs[first][2] == "200" and all(r[3] == api.sa_tokens[1] for r in reqs[first:])
    finally:
        proxy.set()
        ex.stop()


def test_the_exporters_own_trouble_is_unknown_never_false(api, proxy, tmp_path):
    """A kernel log with an XID line no parser reads (cut off inside the report) is check's exit 3:
    Unknown."""
    node = "gpu-node-unparsable"
    api.create_node(node)
    log = tmp_path / "dmesg.txt"
    log.write_text("[Mon Jan  5 10:00:00 2026] NVRM: Xid (PCI:0000:53:0\n" * 3)
    ex = Exporter(tmp_path, api, proxy, node, (), ("--kmsg-file", str(log)), taint=True)
    try:
        ex.scrape()
        cond = until(lambda: api.condition(node), 30, "the condition")
        assert (cond["status"], cond["reason"]) == ("Unknown", "KernelLogUnparsable"), cond
        assert TAINT_KEY not in keys(api.node(node))
        assert not [r for r in proxy.requests() if r[1] == f"/api/v1/nodes/{node}"]  # nothing to read
    finally:
        ex.stop()


def test_check_never_waits_for_the_api_server(api, proxy, tmp_path):
    """`check` is one-shot and writes nothing, with the writer configured and the server hung."""
    node = "gpu-node-check"
    api.create_node(node)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"kubernetes": {
        "enabled": True, "api_url": proxy.url, "token_file": str(tmp_path / "token"),
        "ca_file": str(api.cert), "node_name": node, "request_timeout_seconds": START_HANG_GUARD_S}}))
    (tmp_path / "token").write_text(api.sa_tokens[0])
    proxy.set(delay_s=HANG_GUARD_S)  # a check that waited on the server would take minutes
    n = len(proxy.requests())
    try:
        t = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "exporter", "check", "--simulate", "p5.48xlarge",
                            "--scenario", "xid-94", "--path.state-dir", str(tmp_path / "state"),
                            "--config", str(cfg)],
                           env=guarded_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
        took = time.monotonic() - t
    finally:
        proxy.set()
    assert r.returncode == 2, r.stdout + r.stderr
    assert took < DEADLINE_MARGIN_S, f"check took {took:.1f} s"
    assert api.condition(node) is None and not proxy.requests()[n:]
