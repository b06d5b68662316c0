"""The renderer's series-prefix cache is sized to the node: series that come and
go with workloads (gpu_workload_info's job labels, attribution series) must not grow it past a
few times the series the node serves. A fixed bound of 200,000 held about 100 MiB at its cap."""

from __future__ import annotations

import pytest

from exporter import exposition
from exporter.metric import Metric, Sample


@pytest.fixture(autouse=True)
def fresh_caches(monkeypatch):
    """The caches are the process's: start from empty ones, whatever rendered before in this worker."""
    monkeypatch.setattr(exposition, "_prefixes", {})
    monkeypatch.setattr(exposition, "_chunks", {})
    monkeypatch.setattr(exposition, "_prefix_limit", exposition.PREFIX_FLOOR)


def _family(name: str, labels: list[dict[str, str]], value: float = 1.0) -> Metric:
    m = Metric(name, "help", "gauge")
    m.samples = [Sample(name, lab, value) for lab in labels]
    return m


def test_prefixes_of_churning_series_stay_within_a_multiple_of_the_served_series():
    steady = _family("gpu_temperature_celsius", [{"gpu": str(g)} for g in range(8)])
    most = 0
    for job in range(3 * exposition.PREFIX_FLOOR // 8):  # every render: 8 workloads never seen before
        churn = _family("gpu_workload_info", [{"gpu": str(g), "workload": f"job-{job}"} for g in range(8)])
        body = exposition.render([steady, churn]).decode()
        assert f'gpu_workload_info{{gpu="7",workload="job-{job}"}} 1.0' in body
        assert 'gpu_temperature_celsius{gpu="0"} 1.0' in body
        most = max(most, len(exposition._prefixes))
    assert most <= exposition.PREFIX_FLOOR  # 16 series served: the floor bounds the cache


def test_a_node_with_many_series_keeps_them_all_cached():
    n = 2 * exposition.PREFIX_FLOOR  # more series than the floor: the first render clears once
    labels = [{"device": f"rdmap{i}s0", "port": "1"} for i in range(n)]
    exposition.render([_family("efa_tx_bytes_total", labels)])
    exposition.render([_family("efa_tx_bytes_total", labels, 2.0)])  # new values: every prefix looked up
    assert exposition._prefix_limit == exposition.PREFIX_SERIES_FACTOR * n
    assert len(exposition._prefixes) >= n  # not cleared below what one render needs
