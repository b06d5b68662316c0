"""A small Kubernetes API client for the one object the exporter writes: its own Node.

`requests` rather than a Kubernetes client library: the writer needs three
calls (read its Node, patch its status, patch its labels, taints and annotations), and the official
`kubernetes` package costs far more memory than the whole exporter's 50 MiB goal allows for it
(docs/deploy.md, "The GpuHealthy node condition", has the measurement).

Where it talks (docs/configuration.md, section `kubernetes`):
- `kubernetes.api_url`, else the in-cluster convention `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`;
- the bearer token from `kubernetes.token_file` (the service account's projected token by default),
  read again whenever the file changes: the kubelet rotates projected tokens about hourly;
- the server's CA from `kubernetes.ca_file` (the service account's `ca.crt` by default).

Every call has a connect and a read timeout and is made once: the writer (exporter.kube.writer)
retries with backoff on its own thread, never on a scrape's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    import requests

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_FILE = f"{SA_DIR}/token"
CA_FILE = f"{SA_DIR}/ca.crt"

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


class ApiError(Exception):
    """A call failed. `kind` is a bounded name for the failure (the errors counter's label):
    config, connection, timeout, unauthorized, forbidden, not_found, conflict, server, other."""

    def __init__(self, kind: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


ERROR_KINDS = ("config", "connection", "timeout", "unauthorized", "forbidden", "not_found", "conflict",
               "server", "other")
_BY_STATUS = {401: "unauthorized", 403: "forbidden", 404: "not_found", 409: "conflict"}


@dataclass(frozen=True)
class Endpoint:
    url: str  # https://host:port, no trailing slash
    token_file: str
    ca_file: str  # "" : the system's CAs


def endpoint(api_url: str, token_file: str, ca_file: str, env: Mapping[str, str] | None = None) -> Endpoint:
    """Where to talk: the configured URL, else the in-cluster service variables. Raises
    ApiError("config") naming what is missing."""
    environ = os.environ if env is None else env
    url = api_url.rstrip("/")
    if not url:
        host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
        if not host or not port:
            raise ApiError("config", "no API server: kubernetes.api_url is not set and "
                           "KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not in the environment")
        url = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return Endpoint(url, token_file or TOKEN_FILE, ca_file)


class Token:
    """The bearer token, read again when the file is replaced or rewritten (the kubelet swaps a
    projected token's file through a symlink; a stat per request notices)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int, int, int] | None = None
        self._value = ""

    def get(self) -> str:
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                with open(self.path, encoding="utf-8") as f:
                    self._value = f.read().strip()
                self._stamp = stamp
        except (OSError, UnicodeDecodeError) as e:
            raise ApiError("config", f"kubernetes.token_file {self.path}: {e}") from e
        if not self._value:
            raise ApiError("config", f"kubernetes.token_file {self.path} is empty")
        return self._value


class Client:
    """Calls on one Node. One `requests.Session` (kept-alive connection), no proxies from the
    environment, no automatic retries."""

    def __init__(self, ep: Endpoint, node: str, connect_timeout_s: float, read_timeout_s: float) -> None:
        import requests  # here: a node without the writer never loads it (tests/test_runtime_imports.py)

        self.ep = ep
        self.node = node
        self.timeout = (connect_timeout_s, read_timeout_s)
        self.token = Token(ep.token_file)
        self.session = requests.Session()
        self.session.trust_env = False  # never an HTTP(S)_PROXY meant for the workloads
        if ep.url.startswith("https:") and ep.ca_file:
            if not os.path.exists(ep.ca_file):
                raise ApiError("config", f"kubernetes.ca_file {ep.ca_file} does not exist")
            self.session.verify = ep.ca_file
        self._path = f"/api/v1/nodes/{quote(node, safe='')}"

    def close(self) -> None:
        self.session.close()

    def get_node(self) -> dict[str, Any]:
        return self._call("GET", self._path)

    def read_status(self) -> dict[str, Any]:
        """The Node as its status subresource returns it, through the one verb the condition alone
        needs (`patch nodes/status`): an empty merge patch changes nothing and answers the Node."""
        return self._call("PATCH", self._path + "/status", {}, MERGE)

    def patch_status(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("PATCH", self._path + "/status", body, STRATEGIC)

    def patch_node(self, body: dict[str, Any]) -> dict[str, Any]:
        """A merge patch of the Node; with metadata.resourceVersion in `body` the server refuses it
        (409) when the Node changed since it was read."""
        return self._call("PATCH", self._path, body, MERGE)

    def _call(self, method: str, path: str, body: Any = None, ctype: str = "") -> dict[str, Any]:
        import requests

        headers = {"Authorization": f"Bearer {self.token.get()}", "Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = ctype
            data = json.dumps(body, separators=(",", ":"))
        try:
            r = self.session.request(method, self.ep.url + path, data=data, headers=headers,
                                     timeout=self.timeout, allow_redirects=False)
        except requests.Timeout as e:
            raise ApiError("timeout", f"{method} {path}: timed out ({e})") from e
        except requests.RequestException as e:  # refused, reset, TLS
            raise ApiError("connection", f"{method} {path}: {type(e).__name__}: {e}") from e
        if r.status_code >= 300:
            kind = _BY_STATUS.get(r.status_code, "server" if r.status_code >= 500 else "other")
            raise ApiError(kind, f"{method} {path}: HTTP {r.status_code}: {_reason(r)}", r.status_code)
        try:
            answer = r.json()
        except ValueError as e:
            raise ApiError("other", f"{method} {path}: the answer is not JSON") from e
        if not isinstance(answer, dict):
            raise ApiError("other", f"{method} {path}: the answer is a JSON {type(answer).__name__}, "
                           "not an object")
        return answer


def _reason(r: requests.Response) -> str:
    """The Status object's message when the server sent one, else the start of the body."""
    try:
        return str(r.json().get("message", ""))[:300]
    except ValueError:
        return r.text[:300]
