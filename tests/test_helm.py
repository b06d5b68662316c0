"""The Helm chart (deploy/helm/gpu-health-exporter) with the real helm (tests/helm.py): every values set
lints strictly, renders and validates for Kubernetes 1.29 to 1.34; the schema rejects typos; the
monitoring objects follow the API server's CRDs; what it renders is what the kustomize overlays render
(one model: exporter/tools/deploymodel.py); its DaemonSet lands on the platforms' GPU nodes whatever their
NoSchedule taints and on no CPU node (Kubernetes' matching rules, tests/k8s.py). Against a real API
server: tests/test_helm_install.py."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pytest
import yaml

from exporter import __version__
from exporter.activecheck.settings import ActiveSection
from exporter.rules import DEFAULT_RUNBOOK_BASE
from exporter.tools import helmchart
from exporter.tools.deploygen import dashboard_sources
from exporter.tools.deploymodel import overlay_components
from tests import helm
from tests.helpers import ROOT
from tests.k8s import OVERLAYS, by_kind, one, render, schedules_on, untolerated, validate

K8S_VERSIONS = ["1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0"]
ALL_APIS = helm.MONITORING_APIS
# Every values set a user is expected to install with: the platforms, the kernel-log modes, the
# condition off, the actions on, monitoring forced, off, and every other documented knob.
VALUE_SETS: dict[str, tuple[str, ...]] = {
    "default": (),
    "hyperpod-eks": ("--set", "platform=hyperpod-eks"),
    "eks": ("--set", "platform=eks"),
    "eks-gpu-operator": ("--set", "platform=eks-gpu-operator"),
    "kernel-log-unprivileged": ("--set", "kernelLog=unprivileged"),
    "no-condition": ("--set", "nodeCondition.enabled=false"),
    "taint-and-label": ("--set", "nodeActions.taint=true", "--set", "nodeActions.hyperpodLabel=true"),
    "monitoring-forced": ("--set", "monitoring.podMonitor.enabled=true", "--set",
                          "monitoring.serviceMonitor.enabled=true", "--set",
                          "monitoring.prometheusRule.enabled=true", "--set", "monitoring.cluster=train-east",
                          "--set", "monitoring.release=monitoring"),
    "monitoring-off": ("--set", "monitoring.podMonitor.enabled=false", "--set",
                       "monitoring.prometheusRule.enabled=false", "--set", "dashboards.enabled=false",
                       "--set", "runbooks.enabled=false"),
    "pinned-and-tuned": ("--set", "image.repository=123456789012.dkr.ecr.us-west-2.amazonaws.com/ghe",
                         "--set", "image.digest=sha256:" + "a" * 64, "--set", "config.log_level=debug",
                         "--set", "extraArgs[0]=--log.format=json", "--set",
                         "nodeSelection.instanceTypes={ml.p5.48xlarge}", "--set",
                         "runbooks.enabled=false", "--set", "monitoring.runbookBase=https://wiki.example/rb.html"),
    "active-checks": ("--set", "activeChecks.enabled=true", "--set",
                      "activeChecks.nodes={ip-10-1-2-3.us-west-2.compute.internal,hyperpod-i-0123456789abcdef0}"),
    "active-checks-tuned": ("--set", "activeChecks.enabled=true", "--set", "activeChecks.nodes={gpu-1,gpu-2}",
                            "--set", "activeChecks.checks={nvml,efa,dcgm,nccl}",
                            "--set", "activeChecks.efa.devices=32",
                            "--set", "activeChecks.gpusPerNode=4", "--set", "activeChecks.budgetSeconds=5400",
                            "--set", "activeChecks.dcgmLevel=3", "--set", "activeChecks.runId=2026-12-07",
                            "--set", "activeChecks.image.repository=registry.example/ghe-active",
                            "--set", "activeChecks.image.tag=dcgm4", "--set",
                            "activeChecks.ttlSecondsAfterFinished=3600", "--set",
                            "activeChecks.extraTolerations[0].key=dedicated", "--set",
                            "activeChecks.extraTolerations[0].effect=NoExecute", "--set",
                            "activeChecks.config.active.dcgm_host=nvidia-dcgm.gpu-operator.svc:5555"),
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: helm.template(*args, apis=ALL_APIS) for name, args in VALUE_SETS.items()}


def daemonset(docs: list[dict]) -> dict:
    return one(docs, "DaemonSet")


def pod(docs: list[dict]) -> dict:
    return daemonset(docs)["spec"]["template"]["spec"]


def container(docs: list[dict]) -> dict:
    return pod(docs)["containers"][0]


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_values_set_lints_strictly(name):
    r = helm.run("lint", "--strict", str(helm.CHART), *VALUE_SETS[name])
    assert "0 chart(s) failed" in r.stdout, r.stdout


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_values_set_renders_valid_objects(rendered, name, version):
    docs = rendered[name]
    assert daemonset(docs)
    for d in docs:
        validate(d, version)


def test_validation_rejects_a_broken_render(rendered):
    bad = json.loads(json.dumps(daemonset(rendered["default"])))
    bad["spec"]["template"]["spec"]["tolerations"][0]["operatr"] = "Exists"
    with pytest.raises(Exception):  # noqa: B017 - kubernetes-validate's or jsonschema's error
        validate(bad, K8S_VERSIONS[-1])


@pytest.mark.parametrize("args, where", [
    (("--set", "nodeSelction.instanceTypes={p5.48xlarge}"), "nodeSelction"),
    (("--set", "nodeActions.tiant=true"), "tiant"),
    (("--set", "platform=gke"), "platform"),
    (("--set", "kernelLog=off"), "kernelLog"),
    (("--set", "monitoring.podMonitor.enabled=maybe"), "enabled"),
    (("--set", "image.digest=latest"), "digest"),
    (("--set", "resources.limits.memry=1Gi"), "memry"),
    (("--set", "tolerations[0].opertor=Exists"), "opertor"),
    (("--set", "activeChecks.gpus=8"), "gpus"),
    (("--set", "activeChecks.checks={nvml,dgcm}"), "checks"),
    (("--set", "activeChecks.dcgmLevel=5"), "dcgmLevel"),
    (("--set", "activeChecks.nodes={Node_1}"), "nodes"),
    (("--set", "activeChecks.efa.device=32"), "device"),
])
def test_the_schema_rejects_a_typo_at_install(args, where):
    r = helm.run("template", "x", str(helm.CHART), *args, check=False)
    assert r.returncode != 0 and where in r.stderr, r.stderr


def test_actions_without_the_condition_are_refused():
    r = helm.run("template", "x", str(helm.CHART), "--set", "nodeCondition.enabled=false",
                 "--set", "nodeActions.taint=true", check=False)
    assert r.returncode != 0 and "nodeCondition.enabled" in r.stderr, r.stderr


def test_no_node_selection_is_refused():
    r = helm.run("template", "x", str(helm.CHART), "--set", "nodeSelection.instanceTypes=null",
                 "--set", "nodeSelection.labels=null", check=False)
    assert r.returncode != 0 and "nodeSelection" in r.stderr, r.stderr


MONITORING_KINDS = ("PodMonitor", "ServiceMonitor", "PrometheusRule")


@pytest.mark.parametrize("apis, sets, expected", [
    ((), (), set()),  # no CRD served: nothing that would fail the install
    (ALL_APIS, (), {"PodMonitor", "PrometheusRule"}),  # the ServiceMonitor is opt-in
    (("monitoring.coreos.com/v1/PrometheusRule",), (), {"PrometheusRule"}),
    ((), ("monitoring.podMonitor.enabled=true", "monitoring.prometheusRule.enabled=true"),
     {"PodMonitor", "PrometheusRule"}),  # forced (helm template for GitOps)
    (ALL_APIS, ("monitoring.podMonitor.enabled=false", "monitoring.prometheusRule.enabled=false"), set()),
    (ALL_APIS, ("monitoring.serviceMonitor.enabled=auto",), set(MONITORING_KINDS)),
], ids=["no-crds", "crds", "rules-crd-only", "forced", "off", "servicemonitor-auto"])
def test_monitoring_objects_only_where_their_crds_are(apis, sets, expected):
    docs = helm.template(*(a for s in sets for a in ("--set", s)), apis=apis)
    assert {d["kind"] for d in docs if d["kind"] in MONITORING_KINDS} == expected
    if "ServiceMonitor" in expected:
        assert one(docs, "Service")["spec"]["clusterIP"] == "None"
    else:
        assert not by_kind(docs, "Service")


def test_condition_on_by_default_with_exactly_its_rbac(rendered):
    docs = rendered["default"]
    p, c = pod(docs), container(docs)
    assert p["serviceAccountName"] == helm.RELEASE and p["automountServiceAccountToken"] is True
    assert "--collector.kubernetes" in c["args"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in c["env"]
    (role,) = by_kind(docs, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": helm.RELEASE,
                                    "namespace": helm.NAMESPACE}]
    assert not {"--kubernetes.taint", "--kubernetes.hyperpod-label"} & set(c["args"])


@pytest.mark.parametrize("sets, flags", [
    (("nodeActions.taint=true",), {"--kubernetes.taint"}),
    (("nodeActions.hyperpodLabel=true",), {"--kubernetes.hyperpod-label"}),
    (("nodeActions.taint=true", "nodeActions.hyperpodLabel=true"),
     {"--kubernetes.taint", "--kubernetes.hyperpod-label"}),
])
def test_each_action_is_opt_in_with_its_own_rbac(sets, flags):
    docs = helm.template(*(a for s in sets for a in ("--set", s)))
    assert {a for a in container(docs)["args"] if a.startswith("--kubernetes.")} == flags
    roles = {r["metadata"]["name"]: r["rules"] for r in by_kind(docs, "ClusterRole")}
    assert roles[f"{helm.RELEASE}-node-actions"] == [{"apiGroups": [""], "resources": ["nodes"],
                                                      "verbs": ["get", "patch"]}]
    assert len(by_kind(docs, "ClusterRoleBinding")) == 2


def test_condition_off_has_no_identity_and_no_rbac(rendered):
    docs = rendered["no-condition"]
    assert pod(docs)["automountServiceAccountToken"] is False and "serviceAccountName" not in pod(docs)
    assert not {d["kind"] for d in docs} & {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    assert "--collector.kubernetes" not in container(docs)["args"]


def test_kernel_log_modes(rendered):
    priv = container(rendered["default"])["securityContext"]
    unpriv = container(rendered["kernel-log-unprivileged"])["securityContext"]
    assert priv["privileged"] is True and "allowPrivilegeEscalation" not in priv
    assert unpriv["privileged"] is False and unpriv["allowPrivilegeEscalation"] is False
    for sc in (priv, unpriv):
        assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]} and sc["readOnlyRootFilesystem"]


def test_platforms(rendered):
    assert pod(rendered["eks-gpu-operator"])["runtimeClassName"] == "nvidia"
    for name in ("default", "hyperpod-eks", "eks"):
        assert "runtimeClassName" not in pod(rendered[name])


def test_image_and_knobs(rendered):
    docs = rendered["pinned-and-tuned"]
    assert container(docs)["image"] == "123456789012.dkr.ecr.us-west-2.amazonaws.com/ghe@sha256:" + "a" * 64
    assert container(rendered["default"])["image"] == f"gpu-health-exporter:{__version__}"
    assert container(docs)["args"][-1] == "--log.format=json"
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d["data"]]
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert config["log_level"] == "debug" and config["paths"]["kmsg"] == "/dev/kmsg"
    terms = pod(docs)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == ["ml.p5.48xlarge"]
    for rule in by_kind(docs, "PrometheusRule"):
        text = json.dumps(rule)
        assert DEFAULT_RUNBOOK_BASE not in text
    assert any("https://wiki.example/rb.html#" in json.dumps(r) for r in by_kind(docs, "PrometheusRule"))
    # a config change rolls the pods (the overlays: the ConfigMap's hash suffix)
    def checksum(docs: list[dict]) -> str:
        return daemonset(docs)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert checksum(docs) != checksum(rendered["default"])


def test_resources_come_from_the_measured_rss(rendered):
    res = container(rendered["default"])["resources"]
    base = helmchart.m.container(helmchart.m.base_daemonset())["resources"]
    assert res == base
    # docs/performance.md: 57.6-69.6 MiB on real H100/H200 hosts; the request leaves headroom over
    # the highest, the limit room for a kernel-log flood's backfill (dcgm-exporter's 512Mi OOMs were
    # a limit below its use; ours is 3.7x).
    mib = {k: int(v.removesuffix("Mi")) for k, v in ((k, res[k]["memory"]) for k in ("requests", "limits"))}
    assert mib["requests"] >= 1.3 * 69.6 and mib["limits"] >= 3 * 69.6


def test_rules_dashboards_and_runbooks_are_this_releases(rendered):
    docs = rendered["default"]
    rules = {r["metadata"]["name"].removeprefix(f"{helm.RELEASE}-"): r["spec"]
             for r in by_kind(docs, "PrometheusRule")}
    assert rules == {f.stem: yaml.safe_load(f.read_text()) for f in sorted((ROOT / "rules").glob("*.yml"))}
    boards = {k: v for d in by_kind(docs, "ConfigMap")
              if d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
              for k, v in d["data"].items()}
    assert {k: json.loads(v) for k, v in boards.items()} == {
        f.name: json.loads(f.read_text()) for f in sorted((ROOT / "dashboards").glob("*.json"))}
    (page,) = [d for d in by_kind(docs, "ConfigMap") if "runbooks.html" in d["data"]]
    assert 'id="' in page["data"]["runbooks.html"]


def hooks(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]


def test_notes_and_helm_test(rendered):
    (t,) = hooks(rendered["default"])
    assert t["spec"]["hostNetwork"] and t["spec"]["serviceAccountName"] == helm.RELEASE
    assert t["spec"]["affinity"] == pod(rendered["default"])["affinity"]
    assert t["spec"]["tolerations"] == pod(rendered["default"])["tolerations"]
    assert t["spec"]["containers"][0]["command"][1:3] == ["-m", "exporter.kube.helmtest"]
    (t,) = hooks(rendered["no-condition"])
    assert "--no-condition" in t["spec"]["containers"][0]["command"]
    r = helm.run("install", "x", str(helm.CHART), "--dry-run=client", "--namespace", "gpu-health")
    assert "kubectl get nodes" in r.stdout and "helm test x" in r.stdout


# --- one model: the chart renders what the overlays render -------------------------------------------------
def _normal(d: dict) -> tuple[tuple[str, str], dict]:
    d = json.loads(json.dumps(d))
    meta = d.pop("metadata")
    name = meta["name"]
    if d["kind"] == "ConfigMap" and re.fullmatch(rf"{helm.RELEASE}-[a-z0-9]{{10}}", name):
        name = helm.RELEASE  # kustomize's hash suffix
        d["data"] = {k: yaml.safe_load(v) for k, v in d["data"].items()}
    elif d["kind"] == "ConfigMap" and meta["name"] == helm.RELEASE:
        d["data"] = {k: yaml.safe_load(v) for k, v in d["data"].items()}
    keep = {k: v for k, v in (meta.get("labels") or {}).items() if k in ("release", "grafana_dashboard")}
    d["meta"] = {"labels": keep, "annotations": {k: v for k, v in (meta.get("annotations") or {}).items()
                                                 if k == "grafana_folder"}}
    if d["kind"] == "DaemonSet":
        spec = d["spec"]
        spec.pop("selector")
        spec["template"].pop("metadata")
        for v in spec["template"]["spec"]["volumes"]:
            if "configMap" in v:
                v["configMap"]["name"] = helm.RELEASE
    if d["kind"] in ("PodMonitor", "ServiceMonitor"):
        d["spec"].pop("selector")
    return (d["kind"], name), d


@pytest.mark.parametrize("overlay", [p.name for p in OVERLAYS])
def test_the_chart_renders_what_the_overlay_renders(overlay):
    """One model: `helm template` with the overlay's platform renders the objects `kubectl kustomize`
    renders for it (all but the Namespace, which Helm leaves to --create-namespace), field for field
    but the names' hash suffix and the labels each tool adds."""
    kust = dict(_normal(d) for d in render(ROOT / "deploy" / "kubernetes" / "overlays" / overlay)
                if d["kind"] != "Namespace")
    runbooks = "runbooks" in overlay_components(overlay)  # the overlays leave the runbooks component out
    args = ("--set", f"platform={overlay}", "--set", f"runbooks.enabled={runbooks}", "--skip-tests")
    chart = dict(_normal(d) for d in helm.template(*args, apis=ALL_APIS[::2]))
    assert sorted(chart) == sorted(kust)
    for key in kust:
        assert chart[key] == kust[key], f"{key}: the chart and the overlay differ"


def test_the_generated_chart_is_current():
    want = helmchart.expected(dashboard_sources())
    stale = [p for p, t in want.items() if not p.exists() or p.read_text() != t] + helmchart.strays(want)
    assert not stale, (f"stale chart files: {', '.join(str(p.relative_to(ROOT)) for p in stale)}; "
                       "run `python -m exporter.tools.deploygen`")


def test_the_packaged_chart_installs_the_same(tmp_path):
    """What the release carries (exporter.tools.release.package_chart): helm reads it like the directory."""
    from exporter.tools.release import package_chart

    tgz = package_chart(tmp_path)
    assert tgz.name == f"gpu-health-exporter-{__version__}.tgz"
    with tarfile.open(tgz) as t:
        names = t.getnames()
    assert "gpu-health-exporter/Chart.yaml" in names and "gpu-health-exporter/values.schema.json" in names
    assert helm.run("lint", "--strict", str(tgz)).returncode == 0
    assert helm.template(chart=tgz) == helm.template()


# --- scheduling on the platforms' nodes ---------------------------------------------------------------
NODES = yaml.safe_load((ROOT / "tests" / "fixtures" / "kubernetes" / "gpu-nodes.yaml").read_text())


@pytest.mark.parametrize("name", ["default", "hyperpod-eks", "eks", "eks-gpu-operator"])
@pytest.mark.parametrize("case", NODES, ids=[c["node"]["metadata"]["name"] for c in NODES])
def test_runs_on_every_gpu_node_whatever_its_noschedule_taints_and_on_no_cpu_node(rendered, name, case):
    p, node = pod(rendered[name]), case["node"]
    labels, taints = node["metadata"].get("labels") or {}, (node.get("spec") or {}).get("taints") or []
    lands = schedules_on(p, labels) and not untolerated(p, taints)
    assert lands is case["expect"], (node["metadata"]["name"], untolerated(p, taints))


def test_the_matching_rule_itself():
    """tests/k8s.py's rule on the cases upstream's ToleratesTaint documents."""
    from tests.k8s import tolerates
    taint = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
    assert tolerates({"key": "nvidia.com/gpu", "operator": "Exists"}, taint)
    assert tolerates({"key": "nvidia.com/gpu", "value": "true"}, taint)  # "" is Equal
    assert not tolerates({"key": "nvidia.com/gpu", "value": "false", "operator": "Equal"}, taint)
    assert not tolerates({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, taint)
    assert tolerates({"operator": "Exists"}, taint)
    assert not tolerates({"operator": "Exists", "effect": "NoExecute"}, taint)
    assert not tolerates({"key": "nvidia.com/gpu", "operator": "Gt", "value": "0"}, taint)  # gate off
    p = {"tolerations": [{"operator": "Exists", "effect": "NoSchedule"}], "hostNetwork": True}
    assert untolerated(p, [{"key": "x", "effect": "NoExecute"}]) == [{"key": "x", "effect": "NoExecute"}]
    assert untolerated(p, [{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]) == []
    assert untolerated({}, [{"key": "x", "effect": "PreferNoSchedule"}]) == []


def test_dcgm_exporters_default_would_not_schedule():
    """The failure this guards against (dcgm-exporter #731): tolerating only the control plane, a
    tainted GPU pool gets no pod."""
    p = {"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                          "effect": "NoSchedule"}]}
    gpu = [c["node"] for c in NODES if c["expect"]]
    assert all(untolerated(p, (n.get("spec") or {}).get("taints") or []) for n in gpu)


def test_chart_files_path_is_in_the_release():
    """deploy/ ships whole: the chart directory is in the wheel's and the tarball's file list."""
    from exporter import share
    files = {str(p) for p in share.files()}
    assert "deploy/helm/gpu-health-exporter/Chart.yaml" in files
    assert Path("deploy/helm/gpu-health-exporter/templates/NOTES.txt").as_posix() in files


def test_the_documented_helm_installs_render():
    """docs/deploy.md's `helm install` for each platform, as written (the packaged chart's name
    standing for the chart directory), renders with `helm template`."""
    import shlex

    text = (ROOT / "docs" / "deploy.md").read_text().replace("\\\n", " ")
    rendered = {}
    for line in text.splitlines():
        if line.strip().startswith("helm install "):
            argv = shlex.split(line.strip())
            assert argv[2:4] == ["gpu-health-exporter", f"gpu-health-exporter-{__version__}.tgz"], argv
            sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
            (platform,) = [v.removeprefix("platform=") for v in sets if v.startswith("platform=")]
            rendered[platform] = helm.template(*(a for v in sets for a in ("--set", v)))
    assert set(rendered) == set(helmchart.PLATFORMS)
    assert pod(rendered["eks-gpu-operator"])["runtimeClassName"] == "nvidia"


# --- the opt-in active checks: the kustomize Job, one per node --------------------------------------------
ACTIVE_APP = "gpu-health-active-check"


def jobs(docs: list[dict]) -> list[dict]:
    return by_kind(docs, "Job")


def active_config(docs: list[dict]) -> dict:
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-active-check")]
    return yaml.safe_load(cm["data"]["config.yaml"])


def pinned_to(job: dict) -> str:
    terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    ((expr,),) = [t["matchFields"] for t in terms]
    assert expr["key"] == "metadata.name" and expr["operator"] == "In"
    (node,) = expr["values"]
    return node


def test_active_checks_are_off_by_default(rendered):
    for name in VALUE_SETS:
        if not name.startswith("active-checks"):
            assert not jobs(rendered[name])
            assert not [d for d in by_kind(rendered[name], "ConfigMap")
                        if d["metadata"]["name"].endswith("-active-check")]
    # on with no node: the config, no Job (nothing runs until a node is named)
    docs = helm.template("--set", "activeChecks.enabled=true")
    assert not jobs(docs) and active_config(docs)["active"]["run"]


def test_the_charts_active_check_is_the_kustomize_job():
    """One model: with the kustomize Job's TTL and its node, the chart renders
    deploy/kubernetes/active-check's Job and config, field for field but the names and the labels each
    tool adds."""
    kust = render(ROOT / "deploy" / "kubernetes" / "active-check")
    (kjob,) = jobs(json.loads(json.dumps(kust).replace("NODE_NAME", "node-1")))  # the sed docs say
    (kcm,) = by_kind(kust, "ConfigMap")
    ttl = kjob["spec"]["ttlSecondsAfterFinished"]
    docs = helm.template("--set", "activeChecks.enabled=true", "--set", "activeChecks.nodes={node-1}",
                         "--set", f"activeChecks.ttlSecondsAfterFinished={ttl}")
    (job,) = jobs(docs)
    assert active_config(docs) == yaml.safe_load(kcm["data"]["config.yaml"])

    def normal(j: dict) -> dict:
        spec = json.loads(json.dumps(j["spec"]))
        labels = spec["template"].pop("metadata")["labels"]
        assert labels["app.kubernetes.io/name"] == ACTIVE_APP
        for v in spec["template"]["spec"]["volumes"]:
            if "configMap" in v:
                v["configMap"]["name"] = "config"
        return spec

    assert normal(job) == normal(kjob)
    assert job["metadata"]["labels"]["app.kubernetes.io/name"] == ACTIVE_APP
    assert kjob["metadata"]["labels"]["app.kubernetes.io/name"] == ACTIVE_APP


def test_one_job_per_named_node_pinned_by_name(rendered):
    nodes = ["ip-10-1-2-3.us-west-2.compute.internal", "hyperpod-i-0123456789abcdef0"]
    js = jobs(rendered["active-checks"])
    assert [pinned_to(j) for j in js] == nodes
    assert [j["metadata"]["annotations"]["gpu-health-exporter/node"] for j in js] == nodes
    assert len({j["metadata"]["name"] for j in js}) == 2 and all(len(j["metadata"]["name"]) <= 63 for j in js)
    ds_state = {v["name"]: v for v in pod(rendered["active-checks"])["volumes"]}["state"]
    for j in js:
        spec, p = j["spec"], j["spec"]["template"]["spec"]
        assert "nodeName" not in p and "nodeSelector" not in p  # the scheduler waits for free GPUs
        assert spec["backoffLimit"] == 0 and p["restartPolicy"] == "Never"
        assert "ttlSecondsAfterFinished" not in spec  # helm owns them: no TTL to re-create them on upgrade
        assert {v["name"]: v for v in p["volumes"]}["state"] == ds_state
        (c,) = p["containers"]
        assert c["image"] == container(rendered["default"])["image"]  # the exporter's: nvml only
        res = c["resources"]
        assert res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"] == "8"  # quoted: SSA
        assert "vpc.amazonaws.com/efa" not in c["resources"]["limits"]
        # its pods are not the DaemonSet's (its PodMonitor and selector never take them)
        assert j["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == ACTIVE_APP
    cfg = active_config(rendered["active-checks"])["active"]
    assert cfg["budget_seconds"] < js[0]["spec"]["activeDeadlineSeconds"]


def test_active_check_values(rendered, tmp_path):
    from exporter.config import load

    docs = rendered["active-checks-tuned"]
    js = jobs(docs)
    assert [pinned_to(j) for j in js] == ["gpu-1", "gpu-2"]
    for j in js:
        p = j["spec"]["template"]["spec"]
        (c,) = p["containers"]
        for kind in ("limits", "requests"):
            assert c["resources"][kind]["nvidia.com/gpu"] == "4"
            assert c["resources"][kind]["vpc.amazonaws.com/efa"] == "32"
        assert c["image"] == "registry.example/ghe-active:dcgm4"
        assert j["spec"]["ttlSecondsAfterFinished"] == 3600
        assert j["spec"]["activeDeadlineSeconds"] == 5400 + 60
        assert {"key": "dedicated", "effect": "NoExecute"} in p["tolerations"]
        assert j["metadata"]["labels"]["gpu-health-exporter/active-run"] == "2026-12-07"
    f = tmp_path / "config.yaml"
    f.write_text(yaml.safe_dump(active_config(docs)))
    cfg = load(f).section(ActiveSection)
    assert (cfg.run, cfg.budget_seconds, cfg.dcgm_level) == (["nvml", "efa", "dcgm", "nccl"], 5400, 3)
    assert cfg.dcgm_host == "nvidia-dcgm.gpu-operator.svc:5555"


def test_a_jobs_name_follows_its_node_and_what_it_runs():
    """A Job's pod template is immutable: a changed setting or run must make a new Job, not fail the
    upgrade; a node added to the list leaves the others' Jobs as they are."""
    def names(*sets: str) -> dict[str, str]:
        docs = helm.template("--set", "activeChecks.enabled=true", *(a for s in sets for a in ("--set", s)))
        return {pinned_to(j): j["metadata"]["name"] for j in jobs(docs)}

    base = names("activeChecks.nodes={a,b}")
    assert names("activeChecks.nodes={a,b,c}").items() >= base.items()
    for change in ("activeChecks.runId=2", "activeChecks.dcgmLevel=4", "image.tag=0.2.0",
                   "activeChecks.gpusPerNode=4"):
        assert not set(names("activeChecks.nodes={a,b}", change).values()) & set(base.values()), change


@pytest.mark.parametrize("sets, why", [
    (("activeChecks.checks={nvml,efa}",), "efa.devices"),
    (("activeChecks.config.active.budget_seconds=60",), "budgetSeconds"),
])
def test_active_check_settings_that_cannot_work_are_refused(sets, why):
    args = ("--set", "activeChecks.enabled=true", *(a for s in sets for a in ("--set", s)))
    r = helm.run("template", "x", str(helm.CHART), *args, check=False)
    assert r.returncode != 0 and why in r.stderr, r.stderr


@pytest.mark.parametrize("case", [c for c in NODES if c["expect"]],
                         ids=lambda c: c["node"]["metadata"]["name"])
def test_an_active_check_job_lands_on_every_gpu_node_the_daemonset_does(rendered, case):
    """Named, a GPU node gets its Job whatever its NoSchedule taints, fenced by HyperPod or by our taint
    (a Job is no DaemonSet pod: none of the DaemonSet controller's own tolerations)."""
    taints = (case["node"].get("spec") or {}).get("taints") or []
    for j in jobs(rendered["active-checks"]):
        assert not untolerated(j["spec"]["template"]["spec"], taints, daemonset=False)
