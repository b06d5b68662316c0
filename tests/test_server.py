"""The HTTP endpoint: /metrics in both formats, landing page, health and readiness."""

import requests

from exporter.runner import Runner
from exporter.server import Server
from tests.test_runner import Probe


def test_endpoints():
    runner = Runner([Probe("alpha")], deadline_s=1)
    srv = Server(runner, "127.0.0.1", 0)
    srv.start()
    base = f"http://127.0.0.1:{srv.port}"
    try:
        assert requests.get(base + "/healthz", timeout=5).status_code == 200
        assert requests.get(base + "/readyz", timeout=5).status_code == 503
        r = requests.get(base + "/metrics", timeout=5)
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
        assert 'gpu_health_exporter_collector_success{collector="alpha"} 1.0' in r.text
        om = requests.get(base + "/metrics", headers={"Accept": "application/openmetrics-text"}, timeout=5)
        assert om.headers["Content-Type"].startswith("application/openmetrics-text")
        assert om.text.rstrip().endswith("# EOF")
        assert requests.get(base + "/readyz", timeout=5).status_code == 200
        landing = requests.get(base + "/", timeout=5).text
        assert "alpha" in landing and "ok" in landing and 'href="/metrics"' in landing
        assert requests.get(base + "/nope", timeout=5).status_code == 404
    finally:
        srv.shutdown()
        runner.close()
