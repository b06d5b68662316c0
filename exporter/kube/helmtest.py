"""`helm test` of the chart (deploy/helm/gpu-health-exporter/templates/tests/): run in a pod on a GPU
node, on the host network, with the exporter's own service account.

    python -m exporter.kube.helmtest [--url URL] [--node NAME] [--timeout SECONDS] [--no-condition]

Passes (exit 0) when, within the timeout,
1. the node's exporter answers URL (its /metrics) with the node verdict `gpu_node_health_verdict`;
2. unless --no-condition, the Node's GpuHealthy condition says what that verdict asks for
   (exporter.kube.condition.condition_of), read as the writer reads it (an empty patch of the
   Node's status: the only verb the chart's RBAC grants).
Otherwise exit 1, saying which part failed and what it saw. Every step is retried until the timeout
(a pod just started is not ready at once; the condition follows the verdict within seconds).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import requests
from prometheus_client.parser import text_string_to_metric_families

from exporter.kube import client as kube
from exporter.kube.condition import CONDITION_TYPE, condition_of

VERDICT = "gpu_node_health_verdict"
T = TypeVar("T")


class Failed(Exception):
    pass


def verdict_of(text: str) -> str | None:
    """The node verdict in an exposition: the `verdict` label of the node-level series at 1."""
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == VERDICT and s.value == 1 and "gpu" not in s.labels:
                return s.labels.get("verdict")
    return None


def scrape_verdict(url: str) -> str:
    r = requests.get(url, timeout=10)
    if r.status_code != 200:
        raise Failed(f"{url}: HTTP {r.status_code}")
    verdict = verdict_of(r.text)
    if verdict is None:
        raise Failed(f"{url}: no {VERDICT} series at 1")
    return verdict


def read_condition(c: kube.Client) -> tuple[str, str]:
    for cond in (c.read_status().get("status") or {}).get("conditions") or []:
        if cond.get("type") == CONDITION_TYPE:
            return str(cond.get("status")), str(cond.get("reason"))
    raise Failed(f"Node {c.node}: no {CONDITION_TYPE} condition")


def retry(step: Callable[[], T], until: float, wait_s: float = 1.0) -> T:
    """`step` until it returns; its last failure once `until` (monotonic) has passed."""
    while True:
        try:
            return step()
        except (Failed, kube.ApiError, requests.RequestException) as e:
            if time.monotonic() + wait_s > until:
                raise Failed(str(e)) from e
        time.sleep(wait_s)  # a poll on the exporter and the API server: nothing to wait on instead


def run(url: str, node: str, timeout_s: float, condition: bool, api_url: str = "",
        token_file: str = kube.TOKEN_FILE, ca_file: str = kube.CA_FILE) -> str:
    """The checks; returns what passed, raises Failed."""
    until = time.monotonic() + timeout_s
    verdict = retry(lambda: scrape_verdict(url), until)
    if not condition:
        return f"{url}: verdict {verdict}"
    if not node:
        raise Failed("no node name: pass --node or set NODE_NAME")
    c = kube.Client(kube.endpoint(api_url, token_file, ca_file), node, 5.0, 10.0)

    def agrees() -> str:
        v = scrape_verdict(url)
        want, got = condition_of(v), read_condition(c)
        if got != want:
            raise Failed(f"Node {node}: {CONDITION_TYPE}={got[0]} ({got[1]}), the verdict {v} asks for "
                         f"{want[0]} ({want[1]})")
        return f"{url}: verdict {v}; Node {node}: {CONDITION_TYPE}={got[0]} ({got[1]})"
    try:
        return retry(agrees, until)
    finally:
        c.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m exporter.kube.helmtest", description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:9858/metrics",
                   help="The node's exporter (%(default)s).")
    p.add_argument("--node", default=os.environ.get("NODE_NAME", ""), help="This node's name (NODE_NAME).")
    p.add_argument("--timeout", type=float, default=60.0, help="Seconds to wait in all (%(default)s).")
    p.add_argument("--no-condition", dest="condition", action="store_false",
                   help="Check /metrics only (the chart's nodeCondition.enabled false).")
    p.add_argument("--api-url", default="", help="API server URL (empty: in-cluster).")
    p.add_argument("--token-file", default=kube.TOKEN_FILE)
    p.add_argument("--ca-file", default=kube.CA_FILE)
    a = p.parse_args(argv)
    try:
        print("ok:", run(a.url, a.node, a.timeout, a.condition, a.api_url, a.token_file, a.ca_file))
    except Failed as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
