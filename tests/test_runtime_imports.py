"""The exporter's imports stay lean (issue 14, memory): the CLI and every collector module load
none of the heavy standard-library and third-party packages a default node does not use
(prometheus_client alone costs ~11 MiB RSS through its HTTP servers and ssl)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, free_port, wait_until_serving

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


@pytest.mark.slow
def test_a_served_exporter_without_tls_maps_no_ssl():
    """The HTTP server is asyncio, which imports ssl whether or not it serves TLS; without TLS the
    exporter imports asyncio without it (exporter.cli.import_asyncio_without_ssl). TLS still
    serves: tests/test_webconfig.py runs the exporter with a TLS web config."""
    show_maps = "import ssl, sys; sys.stdout.write(open('/proc/self/maps').read())"
    control = subprocess.run([sys.executable, "-c", show_maps], capture_output=True, text=True, timeout=60,
                             check=True).stdout
    assert "libssl" in control  # the check below can see ssl when it is there
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "--simulate", "p5.48xlarge", "--listen",
                             f"127.0.0.1:{port}"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/metrics", proc, 60, "exporter")
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "libssl" not in maps and "/_ssl." not in maps
    finally:
        proc.terminate()
        proc.wait(timeout=30)
