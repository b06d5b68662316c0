"""A real Kubernetes API server for the node-condition tests (tests/test_kubernetes.py).

kube-apiserver is built once per machine from Debian's `kubernetes` source package by
tests/apiserver/build-kube-apiserver.sh (.ci/run calls it first) and cached outside the clone.
It runs with Debian's etcd in a network namespace of their own (their ports are fixed flags, so a
namespace is where they cannot collide), with token-file authentication: an admin, and the
DaemonSet's service account with two tokens (for rotation), so the shipped ClusterRoles and
bindings, applied with kubectl, are what authorize the exporter. Nothing else runs: no kubelet,
no controllers; the tests create the Node objects.

The exporter reaches it through tests/apiserver/faultproxy.py, which listens on this namespace's
127.0.0.1 (port 0) and forwards into the API server's, and misbehaves on demand (`FaultProxy`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.helpers import HANG_GUARD_S, ROOT, network_namespace, wait_for
from tests.k8s import kubectl, render

BUILD = ROOT / "tests" / "apiserver" / "build-kube-apiserver.sh"
PROXY = ROOT / "tests" / "apiserver" / "faultproxy.py"
NAMESPACE = "gpu-health"
SERVICE_ACCOUNT = "gpu-health-exporter"
SA_USER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
SA_GROUPS = f"system:serviceaccounts,system:serviceaccounts:{NAMESPACE},system:authenticated"
PORT = 6443  # inside the namespace only
ETCD_PORT, ETCD_PEER_PORT = 2379, 2380
RBAC_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def binary() -> str:
    """The cached kube-apiserver, built first if this machine has none (minutes, once)."""
    r = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, f"building kube-apiserver failed:\n{r.stderr[-3000:]}"
    return r.stdout.strip().splitlines()[-1]


@dataclass
class ApiServer:
    d: Path
    netns: list[str]
    bin: str
    admin_token: str = "admin-token"
    sa_tokens: tuple[str, str] = ("sa-token-one", "sa-token-two")
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def cert(self) -> Path:
        return self.d / "tls.crt"

    def prepare(self) -> None:
        key = self.d / "tls.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                        "-out", str(self.cert), "-days", "2", "-subj", "/CN=kube-apiserver-test",
                        "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                       check=True, capture_output=True)
        (self.d / "tokens.csv").write_text(
            f"{self.admin_token},admin,1,system:masters\n"
            + "".join(f'{t},{SA_USER},2,"{SA_GROUPS}"\n' for t in self.sa_tokens))
        for who, token in (("admin", self.admin_token), ("sa", self.sa_tokens[0])):
            (self.d / f"{who}.kubeconfig").write_text(yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "t",
                "clusters": [{"name": "t", "cluster": {"server": f"https://127.0.0.1:{PORT}",
                                                       "certificate-authority": str(self.cert)}}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}]}))

    def start_etcd(self) -> None:
        url, peer = f"http://127.0.0.1:{ETCD_PORT}", f"http://127.0.0.1:{ETCD_PEER_PORT}"
        self.procs["etcd"] = self._start("etcd", [
            "etcd", "--data-dir", str(self.d / "etcd"), "--listen-client-urls", url,
            "--advertise-client-urls", url, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}"])

    def start_apiserver(self) -> None:
        key = self.d / "tls.key"
        self.procs["apiserver"] = self._start("apiserver", [
            self.bin, f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}", "--bind-address=127.0.0.1",
            f"--secure-port={PORT}", f"--tls-cert-file={self.cert}", f"--tls-private-key-file={key}",
            "--service-account-issuer=https://kubernetes.default.svc", f"--service-account-key-file={key}",
            f"--service-account-signing-key-file={key}", "--authorization-mode=RBAC",
            f"--token-auth-file={self.d / 'tokens.csv'}", "--anonymous-auth=false",
            "--service-cluster-ip-range=10.96.0.0/16", "--advertise-address=10.0.0.1",
            f"--cert-dir={self.d / 'certs'}", "--enable-priority-and-fairness=false",
            # as on EKS: the kernel-log mode of the overlays and the chart runs the container privileged
            "--allow-privileged=true"])
        wait_for(lambda: self.kubectl("get", "--raw", "/readyz", check=False).returncode == 0, 180,
                 "kube-apiserver ready", self.procs["apiserver"], self.d / "apiserver.log", interval=0.5)

    def stop_apiserver(self) -> None:
        p = self.procs.pop("apiserver")
        p.terminate()
        p.wait(timeout=30)

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        with open(self.d / f"{name}.log", "a") as log:
            return subprocess.Popen([*self.netns, *argv], stdout=log, stderr=subprocess.STDOUT)

    def kubectl(self, *args: str, who: str = "admin", stdin: str | None = None,
                check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run([*self.netns, kubectl(), f"--kubeconfig={self.d / (who + '.kubeconfig')}", *args],
                           input=stdin, capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert not check or r.returncode == 0, f"kubectl {' '.join(args)}: {r.stderr}"
        return r

    def apply_rbac(self, overlay: Path) -> list[dict]:
        """The overlay's RBAC objects (and their namespace and service account), applied with kubectl."""
        objs = [o for o in render(overlay) if o["kind"] in RBAC_KINDS]
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objs))
        return objs

    def delete_rbac(self, objs: list[dict]) -> None:
        objs = [o for o in objs if o["kind"] not in ("Namespace", "ServiceAccount")]
        self.kubectl("delete", "--ignore-not-found", "-f", "-", stdin=yaml.safe_dump_all(objs))

    def create_node(self, name: str, taints: list[dict] | None = None, labels: dict | None = None) -> None:
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": labels or {}}, "spec": {"taints": taints or []}}
        self.kubectl("create", "-f", "-", stdin=json.dumps(node))

    def node(self, name: str) -> dict:
        return json.loads(self.kubectl("get", "node", name, "-o", "json").stdout)

    def condition(self, name: str, type_: str = "GpuHealthy") -> dict | None:
        for c in self.node(name).get("status", {}).get("conditions") or []:
            if c["type"] == type_:
                return c
        return None

    def can_i(self, verb: str, resource: str) -> bool:
        """`kubectl auth can-i` as the exporter's service account; `resource` may be `nodes/status`
        (a subresource: kubectl's own `TYPE/NAME` form would read it as a Node named status)."""
        kind, _, sub = resource.partition("/")
        r = self.kubectl("auth", "can-i", verb, kind, *([f"--subresource={sub}"] if sub else []), who="sa",
                         check=False)
        return r.stdout.strip() == "yes"


@contextlib.contextmanager
def api_server(d: Path) -> Iterator[ApiServer]:
    exe = binary()
    with network_namespace() as netns:
        s = ApiServer(d, netns, exe)
        s.prepare()
        try:
            s.start_etcd()
            s.start_apiserver()
            yield s
        finally:
            for p in reversed(list(s.procs.values())):
                p.terminate()
            for p in s.procs.values():
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


class FaultProxy:
    """tests/apiserver/faultproxy.py in the API server's namespace, listening here on 127.0.0.1:0."""

    def __init__(self, server: ApiServer, d: Path) -> None:
        self.control = d / "proxy-control.json"
        self.log = d / "proxy-requests.log"
        self.set()
        self.log.write_text("")
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.url = f"https://127.0.0.1:{self._sock.getsockname()[1]}"
        fd = self._sock.fileno()
        self.proc = subprocess.Popen(
            [*server.netns, sys.executable, str(PROXY), str(fd), str(self.control), str(self.log), str(PORT),
             str(server.cert), str(server.d / "tls.key")], pass_fds=(fd,), stdout=subprocess.PIPE,
            stderr=(d / "proxy.err").open("a"), text=True)
        assert self.proc.stdout.readline().strip() == "up", "the fault proxy did not start"

    def set(self, mode: str = "pass", status: int = 0, delay_s: float = 0.0,
            revoked: tuple[str, ...] = ()) -> None:
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps({"mode": mode, "status": status, "delay_s": delay_s,
                                   "revoked": list(revoked)}))
        os.replace(tmp, self.control)

    def requests(self) -> list[list[str]]:
        return [line.split() for line in self.log.read_text().splitlines()]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self._sock.close()


def until(cond, timeout: float = 30.0, what: str = "condition", log: Path | None = None) -> object:
    """wait_for with a coarser poll (each look is a kubectl run); a failure quotes `log`."""
    return wait_for(cond, timeout, what, log=log, interval=0.3)


def now() -> float:
    return time.time()
