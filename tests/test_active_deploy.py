"""deploy/kubernetes/active-check: the active checks as a one-node Job, rendered with the real
`kubectl kustomize` and validated with kubernetes-validate for every supported Kubernetes version;
it requests every GPU, never retries, ends before its deadline, writes where the DaemonSet reads,
and its config is valid for the `active` command."""

from __future__ import annotations

import pytest
import yaml

from exporter.activecheck.settings import ActiveSection
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
    # a string: server-side apply refuses a bare number for a quantity
    assert c["resources"]["limits"]["nvidia.com/gpu"] == c["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert spec["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
    assert c["args"][0] == "active"
    cfg = yaml.safe_load(one(docs, "ConfigMap")["data"]["config.yaml"])
    assert cfg["active"]["budget_seconds"] < spec["activeDeadlineSeconds"]  # it ends on its own first
    # pinned by node name, as the DaemonSet controller pins (a hostname label may differ from it)
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["NODE_NAME"]}]}]
    assert "nodeName" not in pod  # the scheduler places it: it waits until every GPU is free
    assert job["metadata"]["name"].endswith("NODE_NAME")


def test_the_job_writes_where_the_daemonset_reads_and_tolerates_its_taints(docs):
    pod = one(docs, "Job")["spec"]["template"]["spec"]
    ds = one(render(OVERLAYS[0]), "DaemonSet")["spec"]["template"]["spec"]
    state = {v["name"]: v for v in pod["volumes"]}["state"]["hostPath"]["path"]
    assert state == {v["name"]: v for v in ds["volumes"]}["state"]["hostPath"]["path"]
    assert all(t in pod["tolerations"] for t in ds["tolerations"])  # pinned: any NoSchedule taint too
    assert {"key": "gpu-health-exporter/action-required", "operator": "Exists"} in pod["tolerations"]
    (c,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["state"] == load(None).paths.state_dir
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_the_job_config_is_valid(docs, tmp_path):
    p = tmp_path / "config.yaml"
    p.write_text(one(docs, "ConfigMap")["data"]["config.yaml"])
    cfg = load(p)
    assert cfg.section(ActiveSection).run == ["nvml", "dcgm", "nccl"]
