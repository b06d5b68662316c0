"""The Kubernetes deployment as one model: the kustomize base, components and active-check Job under
deploy/kubernetes, read and patched the way kustomize does, for the generator of the Helm chart
(exporter.tools.helmchart) to take every object, field and value from.

The kustomize files are the source (hand-written, commented): the base DaemonSet, its config, and
each component's JSON patch and RBAC. `daemonset(components)` is the base with the named components'
patches applied (RFC 6902 ops add/replace/remove/test, the subset the components use), so the chart
gets what an overlay gets without a second copy of any of it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from exporter import share

KUSTOMIZE = share.CHECKOUT / "deploy" / "kubernetes"
BASE = KUSTOMIZE / "base"
COMPONENTS = KUSTOMIZE / "components"
OVERLAYS = KUSTOMIZE / "overlays"
ACTIVE_CHECK = KUSTOMIZE / "active-check"  # the opt-in active checks' one-node Job and its config
NAME = "gpu-health-exporter"


def load_all(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def base_daemonset() -> dict[str, Any]:
    (ds,) = load_all(BASE / "daemonset.yaml")
    return ds


def namespace() -> dict[str, Any]:
    (ns,) = load_all(BASE / "namespace.yaml")
    return ns


def config_text() -> str:
    return (BASE / "config.yaml").read_text()


def active_job() -> dict[str, Any]:
    (job,) = load_all(ACTIVE_CHECK / "job.yaml")
    return job


def active_config_text() -> str:
    return (ACTIVE_CHECK / "config.yaml").read_text()


def component(name: str) -> dict[str, Any]:
    data = yaml.safe_load((COMPONENTS / name / "kustomization.yaml").read_text())
    if not isinstance(data, dict) or data.get("kind") != "Component":
        raise ValueError(f"{COMPONENTS / name}/kustomization.yaml: not a kustomize Component")
    return data


def component_resources(name: str) -> list[dict[str, Any]]:
    """The objects a component adds (its `resources`), in its order."""
    return [d for f in component(name).get("resources") or [] for d in load_all(COMPONENTS / name / f)]


def overlay_components(overlay: str) -> list[str]:
    """The component names an overlay lists, as shipped."""
    data = yaml.safe_load((OVERLAYS / overlay / "kustomization.yaml").read_text())
    return [Path(c).name for c in data.get("components") or []]


def _pointer(doc: Any, path: str) -> tuple[Any, str | int]:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]
    for p in parts[:-1]:
        doc = doc[int(p)] if isinstance(doc, list) else doc[p]
    last = parts[-1]
    if isinstance(doc, list):
        return doc, len(doc) if last == "-" else int(last)
    return doc, last


def apply_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """`doc` with the RFC 6902 `ops` applied (a copy); raises ValueError on a failed `test` or an
    op this model does not know."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parent, key = _pointer(doc, op["path"])
        kind = op["op"]
        if kind == "add" and isinstance(parent, list):
            parent.insert(int(key), copy.deepcopy(op["value"]))
        elif kind in ("add", "replace"):
            parent[key] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del parent[key]
        elif kind == "test":
            if parent[key] != op["value"]:
                raise ValueError(f"patch test failed at {op['path']}: {parent[key]!r} != {op['value']!r}")
        else:
            raise ValueError(f"JSON patch op {kind!r} is not supported by exporter.tools.deploymodel")
    return doc


def patched(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """`doc` with component `name`'s patches that target its kind and name applied."""
    for p in component(name).get("patches") or []:
        target = p.get("target") or {}
        if target.get("kind") not in (None, doc["kind"]) or target.get("name") not in (
                None, doc["metadata"]["name"]):
            continue
        if "group" in target and not doc["apiVersion"].startswith(target["group"] + "/"):
            continue
        doc = apply_patch(doc, yaml.safe_load(p["patch"]))
    return doc


def daemonset(*components: str) -> dict[str, Any]:
    """The base DaemonSet with `components` applied in order."""
    ds = base_daemonset()
    for c in components:
        ds = patched(ds, c)
    return ds


def container(ds: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = ds["spec"]["template"]["spec"]["containers"][0]
    return c


def added(before: list[Any], after: list[Any]) -> list[Any]:
    """What a component appended to a list (args, env)."""
    return [x for x in after if x not in before]
