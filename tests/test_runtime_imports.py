"""What the exporter's imports load (issue 14, memory; issue 19 item 5): prometheus_client is the
metric model, so the CLI and every collector module load it (and with it ssl, http.server,
wsgiref, urllib.request and email, which its package imports: ~1.6 MiB more RSS in the running
exporter, where ssl is loaded anyway; docs/performance.md). What a default node does not use stays
out: requests (the IMDS client, loaded when a lookup runs), bcrypt (basic auth only), the NVML
bindings until NVML is first used, asyncio and multiprocessing."""

import json
import subprocess
import sys

from tests.helpers import ROOT

PRESENT = ["prometheus_client", "prometheus_client.metrics_core", "prometheus_client.samples"]
ABSENT = ["requests", "urllib3", "bcrypt", "pynvml", "asyncio", "multiprocessing",
          "grpc", "google.protobuf", "h2", "hpack", "hyperframe"]  # h2: only with workload.kubelet_socket

CHILD = """
import json, sys
import exporter.cli
from exporter import collectors
from exporter.metric import Metric, Sample
loaded = sorted(collectors.collector_classes())
model = [f"{t.__module__}.{t.__name__}" for t in (Metric, Sample)]
present = [m for m in sys.argv[1:] if m in sys.modules]
print(json.dumps({"collectors": loaded, "present": present, "model": model}))
"""


def test_cli_and_every_collector_load_prometheus_client_and_nothing_a_node_does_not_use():
    r = subprocess.run([sys.executable, "-c", CHILD, *PRESENT, *ABSENT], cwd=ROOT, capture_output=True,
                       text=True, timeout=60, check=True)
    out = json.loads(r.stdout)
    assert {"gpu", "efa", "xid", "lustre"} <= set(out["collectors"]), out["collectors"]
    assert out["present"] == PRESENT
    assert out["model"] == ["prometheus_client.metrics_core.Metric", "prometheus_client.samples.Sample"]


# The served exporter (issue 36 item 3): what the process imports over its life, start-up and
# scrapes, from Python's own import log (PYTHONPROFILEIMPORTTIME, written to the exporter's log).
# A subcommand's imports (`capture`'s recorder: statistics, decimal, the fake NVML) were made by
# every daemon, because the parser lists the subcommands.
NEVER_SERVED = ["exporter.capture", "statistics", "requests", "urllib3", "bcrypt", "grpc"]
KUBELET_ONLY = ["h2", "hpack", "hyperframe", "google.protobuf"]


def _served_imports(tmp_path, monkeypatch, *args: str) -> set[str]:
    import re

    import requests

    from tests.helpers import start_exporter, stop_within

    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    proc, url, log = start_exporter(tmp_path, *args)
    try:
        for _ in range(3):
            assert requests.get(url, timeout=30).ok
    finally:
        stop_within(proc)
    found = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+([\w.]+)$", log.read_text(), re.M))
    assert {"exporter.httpd", "psutil"} <= found, log.read_text()[-2000:]  # the log is the import log
    return found


def test_the_served_exporter_imports_only_what_its_kinds_use(tmp_path, monkeypatch):
    node = _served_imports(tmp_path, monkeypatch)  # a node's defaults, no GPU here
    assert not node & {*NEVER_SERVED, *KUBELET_ONLY}
    p5 = _served_imports(tmp_path, monkeypatch, "--simulate", "p5.48xlarge")
    assert not p5 & {*NEVER_SERVED, *KUBELET_ONLY}
    kubelet = _served_imports(tmp_path, monkeypatch, "--simulate", "p5.48xlarge", "--scenario", "k8s-pods")
    assert not kubelet & set(NEVER_SERVED)
    assert {"h2", "hpack", "hyperframe"} <= kubelet  # the kind's client, and only with the kind on
