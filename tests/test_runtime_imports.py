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
