"""The exporter's imports stay lean (issue 14, memory): the CLI and every collector module load
none of the heavy standard-library and third-party packages a default node does not use
(prometheus_client alone costs ~11 MiB RSS through its HTTP servers and ssl)."""

import json
import subprocess
import sys

from tests.helpers import ROOT

# ssl: only with TLS configured; urllib.request and email: only when an IMDS lookup runs;
# prometheus_client: a test dependency (its parser checks our exposition), never a runtime one.
ABSENT = ["prometheus_client", "ssl", "http.server", "http.client", "wsgiref", "urllib.request", "email"]

CHILD = """
import json, sys
import exporter.cli
from exporter import collectors
loaded = sorted(collectors.collector_classes())
print(json.dumps({"collectors": loaded, "present": [m for m in sys.argv[1:] if m in sys.modules]}))
"""


def test_cli_and_every_collector_load_no_heavy_module():
    r = subprocess.run([sys.executable, "-c", CHILD, *ABSENT], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, check=True)
    out = json.loads(r.stdout)
    assert {"gpu", "efa", "xid", "lustre"} <= set(out["collectors"]), out["collectors"]
    assert out["present"] == []
