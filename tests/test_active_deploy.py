"""deploy/kubernetes/active-check: the active checks as a one-node Job, rendered with the real
`kubectl kustomize` and validated with kubernetes-validate for every supported Kubernetes version;
it requests every GPU, never retries, ends before its deadline, writes where the DaemonSet reads,
and its config is valid for the `active` command."""

from __future__ import annotations

import pytest
import yaml

from exporter.config import load
from tests.k8s import K8S_VERSIONS, KUSTOMIZE, OVERLAYS, render, validate

JOB_DIR = KUSTOMIZE / "active-check"


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return render(JOB_DIR)


def one(docs: list[dict], kind: str) -> dict:
    (d,) = [d for d in docs if d["kind"] == kind]
    return d


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_job_validates(docs, version):
    assert {d["kind"] for d in docs} == {"Job", "ConfigMap"}
    for d in docs:
        validate(d, version)


def test_the_job_requests_every_gpu_and_never_retries(docs):
    job = one(docs, "Job")
    spec = job["spec"]
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == c["resources"]["requests"]["nvidia.com/gpu"] == 8
    assert spec["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
    assert c["args"][0] == "active"
    cfg = yaml.safe_load(one(docs, "ConfigMap")["data"]["config.yaml"])
    assert cfg["active"]["budget_seconds"] < spec["activeDeadlineSeconds"]  # it ends on its own first
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "NODE_NAME"}
    assert job["metadata"]["name"].endswith("NODE_NAME")


def test_the_job_writes_where_the_daemonset_reads_and_tolerates_its_taints(docs):
    pod = one(docs, "Job")["spec"]["template"]["spec"]
    ds = one(render(OVERLAYS[0]), "DaemonSet")["spec"]["template"]["spec"]
    state = {v["name"]: v for v in pod["volumes"]}["state"]["hostPath"]["path"]
    assert state == {v["name"]: v for v in ds["volumes"]}["state"]["hostPath"]["path"]
    def keys(tolerations):  # a toleration without a key tolerates every taint of its effect
        return {(t.get("key"), t.get("effect")) for t in tolerations}

    assert keys(ds["tolerations"]) <= keys(pod["tolerations"])
    (c,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["state"] == load(None).paths.state_dir
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_the_job_config_is_valid(docs, tmp_path):
    p = tmp_path / "config.yaml"
    p.write_text(one(docs, "ConfigMap")["data"]["config.yaml"])
    cfg = load(p)
    assert cfg.active.run == ["nvml", "dcgm", "nccl"]
