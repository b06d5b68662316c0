"""Deployment files: every kustomize overlay renders with the real kubectl and validates against the
Kubernetes 1.29-1.33 API schemas, node selection admits HyperPod and EKS GPU nodes and no CPU node, the
generated PrometheusRules and dashboard ConfigMaps match their sources, and the pod runs with the
least privilege docs/deploy.md states."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from exporter.arguments import build_parser
from exporter.startup import build_context
from exporter.tools import deploygen
from tests.helpers import HANG_GUARD_S, ROOT, promtool
from tests.k8s import K8S_VERSIONS, KUSTOMIZE, OVERLAYS, by_kind, one, render, schedules_on, validate

DEPLOY = ROOT / "deploy"
OVERLAY_IDS = [p.name for p in OVERLAYS]

# Node labels as the nodes carry them (HyperPod: docs' instance-type with the ml. prefix and its
# sagemaker.amazonaws.com labels; EKS: a managed node group's labels).
HYPERPOD_P5 = {
    "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
    "kubernetes.io/hostname": "hyperpod-i-0a1b2c3d4e5f67890",
    "node.kubernetes.io/instance-type": "ml.p5.48xlarge",
    "beta.kubernetes.io/instance-type": "ml.p5.48xlarge",
    "sagemaker.amazonaws.com/compute-type": "hyperpod",
    "sagemaker.amazonaws.com/instance-group-name": "gpu-workers",
    "sagemaker.amazonaws.com/node-health-status": "Schedulable",
    "topology.kubernetes.io/region": "us-west-2", "topology.kubernetes.io/zone": "us-west-2b",
}
EKS_P5 = {
    "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
    "kubernetes.io/hostname": "ip-10-1-2-3.us-west-2.compute.internal",
    "node.kubernetes.io/instance-type": "p5.48xlarge", "beta.kubernetes.io/instance-type": "p5.48xlarge",
    "eks.amazonaws.com/nodegroup": "p5-workers", "eks.amazonaws.com/capacityType": "ON_DEMAND",
    "topology.kubernetes.io/region": "us-west-2", "topology.kubernetes.io/zone": "us-west-2b",
}
EKS_GPU_OPERATOR_G6 = {**EKS_P5, "node.kubernetes.io/instance-type": "g6.12xlarge",
                       "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "4"}
EKS_CPU = {**EKS_P5, "node.kubernetes.io/instance-type": "m7i.4xlarge",
           "beta.kubernetes.io/instance-type": "m7i.4xlarge", "eks.amazonaws.com/nodegroup": "system"}
HYPERPOD_CPU = {**HYPERPOD_P5, "node.kubernetes.io/instance-type": "ml.m5.12xlarge",
                "beta.kubernetes.io/instance-type": "ml.m5.12xlarge"}
# The taints a GPU node and a node fenced by HyperPod's health agent carry.
GPU_TAINTS = [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},
              {"key": "sagemaker.amazonaws.com/node-health-status", "value": "Unschedulable",
               "effect": "NoSchedule"}]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {p.name: render(p) for p in OVERLAYS}


def pod_spec(docs: list[dict]) -> dict:
    return one(docs, "DaemonSet")["spec"]["template"]["spec"]


def exporter_container(docs: list[dict]) -> dict:
    (c,) = [c for c in pod_spec(docs)["containers"] if c["name"] == "exporter"]
    return c


def test_the_overlays_are_the_documented_ones():
    assert set(OVERLAY_IDS) >= {"hyperpod-eks", "eks", "eks-gpu-operator"}


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_rendered_manifest_validates(rendered, version):
    for name, docs in rendered.items():
        assert {d["kind"] for d in docs} >= {"Namespace", "ConfigMap", "DaemonSet", "PodMonitor",
                                             "PrometheusRule"}, name
        for d in docs:
            try:
                validate(d, version)
            except Exception as e:  # the message says which object and field
                pytest.fail(f"overlay {name}: {d['kind']}/{d['metadata']['name']} is invalid for "
                            f"Kubernetes {version}: {getattr(e, 'message', e)}")


def test_validation_rejects_a_broken_manifest(rendered):
    """The validator catches what the API server would reject (so the test above can fail)."""
    ds = json.loads(json.dumps(one(rendered["eks"], "DaemonSet")))
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = "SYSLOG"
    with pytest.raises(Exception, match="not of type 'array'"):
        validate(ds, K8S_VERSIONS[0])
    pm = json.loads(json.dumps(one(rendered["eks"], "PodMonitor")))
    pm["spec"]["podMetricsEndpoints"][0]["interval"] = "30 seconds"
    with pytest.raises(Exception, match="does not match"):
        validate(pm, K8S_VERSIONS[-1])


@pytest.mark.parametrize("overlay", OVERLAY_IDS)
@pytest.mark.parametrize("node,expected", [
    (HYPERPOD_P5, True), (EKS_P5, True), (EKS_GPU_OPERATOR_G6, True), (EKS_CPU, False), (HYPERPOD_CPU, False),
], ids=["hyperpod-ml.p5.48xlarge", "eks-p5.48xlarge", "gpu-operator-labelled", "eks-cpu", "hyperpod-cpu"])
def test_node_selection(rendered, overlay, node, expected):
    assert schedules_on(pod_spec(rendered[overlay]), node) is expected


@pytest.mark.parametrize("overlay", OVERLAY_IDS)
def test_tolerates_gpu_and_hyperpod_health_taints(rendered, overlay):
    tolerations = pod_spec(rendered[overlay])["tolerations"]
    for taint in GPU_TAINTS:
        assert any(t["key"] == taint["key"] and t["operator"] == "Exists"
                   and t.get("effect") in (None, taint["effect"]) for t in tolerations), taint
    # Any NoSchedule taint of a GPU node (a pool's own key, a quarantine): tolerated, while the
    # affinity keeps the pod off CPU nodes (test_node_selection); a NoExecute taint of another key
    # is still honoured.
    assert {"operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert all(t.get("effect") == "NoSchedule" for t in tolerations if "key" not in t), tolerations


@pytest.mark.parametrize("overlay", OVERLAY_IDS)
def test_least_privilege(rendered, overlay):
    docs = rendered[overlay]
    spec = pod_spec(docs)
    c = exporter_container(docs)
    sc = c["securityContext"]
    # The token is mounted for the GpuHealthy condition alone (components/node-condition): the only
    # RBAC is patch on nodes/status, bound to the exporter's own service account.
    assert spec["automountServiceAccountToken"] is True
    assert spec["serviceAccountName"] == "gpu-health-exporter"
    rules = [(r, role["metadata"]["name"]) for role in by_kind(docs, "ClusterRole") for r in role["rules"]]
    assert rules == [({"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
                      "gpu-health-exporter-node-condition")]
    assert not by_kind(docs, "Role") and not by_kind(docs, "RoleBinding")
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-health-exporter",
                                    "namespace": "gpu-health"}]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not spec.get("hostPID") and not spec.get("hostIPC")
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert sc["readOnlyRootFilesystem"] is True
    # The overlays open /dev/kmsg with privileged (docs/deploy.md: the only pod-spec setting that adds
    # the device rule); everything else stays as narrow as an unprivileged pod's.
    assert sc["privileged"] is True
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    writable = {n for n, m in mounts.items() if not m.get("readOnly")}
    assert writable == {"state", "tmp"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["tmp"]["emptyDir"]["medium"] == "Memory"
    assert mounts["host-root"]["mountPropagation"] == "HostToContainer"
    ns = one(docs, "Namespace")["metadata"]["labels"]
    assert ns["pod-security.kubernetes.io/enforce"] == "privileged"
    assert ns["pod-security.kubernetes.io/warn"] == "baseline"


def test_base_alone_is_unprivileged():
    docs = render(KUSTOMIZE / "base")
    sc = exporter_container(docs)["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False


def test_nvidia_access(rendered):
    for name, docs in rendered.items():
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in exporter_container(docs)["env"]}
        assert env == {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility",
                       "NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}}}, name
        assert pod_spec(docs).get("runtimeClassName") == ("nvidia" if name == "eks-gpu-operator" else None)


@pytest.mark.parametrize("overlay", OVERLAY_IDS)
def test_config_is_valid_and_every_path_is_mounted(rendered, overlay, tmp_path):
    docs = rendered[overlay]
    ds = one(docs, "DaemonSet")
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d.get("data", {})]
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(cm["data"]["config.yaml"])
    cfg = build_context(build_parser().parse_args(["--config", str(cfg_file)]))[0].config
    c = exporter_container(docs)
    mounts = [m["mountPath"] for m in c["volumeMounts"]]
    for path in (cfg.paths.sysfs, cfg.paths.procfs, cfg.paths.debugfs, cfg.paths.kmsg, cfg.paths.state_dir):
        assert any(path == m or path.startswith(m + "/") for m in mounts), path
    assert yaml.safe_load(cm["data"]["config.yaml"])["lustre"]["rootfs"] in mounts
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == cm["metadata"]["name"]
    assert c["args"] == ["--config=/etc/gpu-health-exporter/config.yaml", "--collector.kubernetes"]
    port = int(cfg.listen.rsplit(":", 1)[1])
    assert c["ports"][0]["containerPort"] == port


@pytest.mark.parametrize("overlay", OVERLAY_IDS)
def test_the_pod_resources_directory_is_mounted_read_only_not_the_socket(rendered, overlay, tmp_path):
    """A kubelet restart replaces its socket: a mount of the old socket file would go stale."""
    docs = rendered[overlay]
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d.get("data", {})]
    sock = yaml.safe_load(cm["data"]["config.yaml"])["workload"]["kubelet_socket"]
    mounts = {m["mountPath"]: m for m in exporter_container(docs)["volumeMounts"]}
    mount = mounts[os.path.dirname(sock)]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod_spec(docs)["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert volume["hostPath"]["type"] in ("Directory", "DirectoryOrCreate")
    assert not any(v.get("hostPath", {}).get("path", "").endswith(".sock") for v in pod_spec(docs)["volumes"])


@pytest.mark.parametrize("overlay", OVERLAY_IDS)
def test_probes_and_resources(rendered, overlay):
    c = exporter_container(rendered[overlay])
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # /readyz turns ready after the first collection: the startup probe must make one (a scrape does).
    assert c["startupProbe"]["httpGet"]["path"] == "/metrics"
    # Measured RSS on real 8-GPU nodes is 61-65 MiB: the request must cover it, the limit leave room.
    mib = {"Mi": 1, "Gi": 1024}
    req, lim = (int(c["resources"][k]["memory"][:-2]) * mib[c["resources"][k]["memory"][-2:]]
                for k in ("requests", "limits"))
    assert 65 < req < lim


def test_release_and_cluster_are_settable(tmp_path):
    overlay = tmp_path / "mine"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(f"""
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [{os.path.relpath(KUSTOMIZE / 'overlays' / 'hyperpod-eks', overlay)}]
patches:
  - target: {{group: monitoring.coreos.com}}
    patch: |-
      - {{op: replace, path: /metadata/labels/release, value: monitoring}}
  - target: {{kind: PodMonitor}}
    patch: |-
      - {{op: replace, path: /spec/podMetricsEndpoints/0/relabelings/1/replacement, value: train-east}}
""")
    docs = render(overlay)
    crs = [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")]
    assert len(crs) > 1 and all(d["metadata"]["labels"]["release"] == "monitoring" for d in crs)
    relabel = one(docs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert {"targetLabel": "cluster", "replacement": "train-east", "action": "replace"} in relabel
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance",
            "action": "replace"} in relabel


def test_generated_files_match_their_sources():
    stale = deploygen.stale()
    assert not stale, (f"generated deployment files are out of date with rules/ or dashboards/: "
                       f"{', '.join(str(p.relative_to(ROOT)) for p in stale)}; "
                       f"run `{deploygen.COMMAND}` and commit the result")


def test_prometheus_rules_carry_every_rule_file_unchanged(rendered, tmp_path):
    rules = {d["metadata"]["name"]: d["spec"] for d in by_kind(rendered["eks"], "PrometheusRule")}
    files = sorted((ROOT / "rules").glob("*.yml"))
    assert set(rules) == {f"gpu-health-exporter-{f.stem}" for f in files}
    for f in files:
        spec = rules[f"gpu-health-exporter-{f.stem}"]
        assert spec == {"groups": yaml.safe_load(f.read_text())["groups"]}
        out = tmp_path / f.name
        out.write_text(yaml.safe_dump(spec))
        r = subprocess.run([promtool(), "check", "rules", str(out)], capture_output=True, text=True,
                           timeout=HANG_GUARD_S)
        assert r.returncode == 0, r.stdout + r.stderr


def test_one_dashboard_configmap_per_dashboard(rendered):
    dashboards = sorted((ROOT / "dashboards").glob("*.json"))
    cms = [d for d in by_kind(rendered["hyperpod-eks"], "ConfigMap")
           if d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    assert len(cms) == len(dashboards) > 0
    got = {k: json.loads(v) for cm in cms for k, v in cm["data"].items()}
    assert got == {f.name: json.loads(f.read_text()) for f in dashboards}


def test_every_object_fits_client_side_apply(rendered):
    """`kubectl apply` (client side) stores each object in an annotation limited to 256 KiB: a dashboard
    ConfigMap growing past it would fail to apply (server-side apply would be needed)."""
    for docs in rendered.values():
        for d in docs:
            assert len(json.dumps(d)) < 256 * 1024, f"{d['kind']}/{d['metadata']['name']} is too large"


def test_generator_names_a_broken_rule_file(tmp_path):
    (tmp_path / "bad.yml").write_text("rules: []\n")
    with pytest.raises(ValueError, match="bad.yml"):
        deploygen.prometheus_rules(tmp_path)


def test_example_config_is_valid():
    args = build_parser().parse_args(["--config", str(DEPLOY / "config.example.yaml")])
    ctx, _ = build_context(args)
    assert ctx.config.listen == "0.0.0.0:9858"
