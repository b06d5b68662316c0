"""The simulated EFA node: device counts and names per profile, advancing counters, efa-* scenarios,
and the real exporter process serving a simulated p5.48xlarge."""

from __future__ import annotations

import re

import pytest
import requests

from exporter.collectors.efa import EfaCollector
from exporter.config import load
from exporter.runner import Runner
from exporter.tools.simulate import Simulation
from tests.helpers import names, promtool_check_metrics, running_exporter, samples, scrape, test_pool, value


@pytest.fixture
def simulated():
    sims = []

    def make(profile, *scenarios):
        sim = Simulation(profile, list(scenarios))
        sims.append(sim)
        ctx = sim.context(load(None, {**sim.prepare().config(), "efa.counters": "all"}))
        return sim, Runner([EfaCollector(ctx)], deadline_s=10, pool=test_pool())

    yield make
    for s in sims:
        s.close()


def devices(ss, metric="efa_device_up"):
    return {dict(ls)["device"]: v for (n, ls), v in ss.items() if n == metric}


@pytest.mark.parametrize("profile,count,network", [("p5.48xlarge", 32, True), ("p5e.48xlarge", 32, True),
                                                   ("p5en.48xlarge", 16, True), ("p4d.24xlarge", 4, False)])
def test_profiles(simulated, profile, count, network):
    sim, runner = simulated(profile)
    text = scrape(runner)
    ss = samples(text)
    up = devices(ss)
    assert len(up) == count and set(up.values()) == {1}
    assert all(re.fullmatch(r"rdmap\d+s\d+", d) for d in up)
    assert value(ss, "efa_devices") == count == value(ss, "efa_devices_expected")
    assert len(devices(ss, "efa_tx_bytes_total")) == count
    assert ("efa_retrans_timeout_events_total" in names(text)) == network
    assert promtool_check_metrics(text) == ""


def test_p4d_has_no_rdma_write_files_on_its_kernel_and_p5en_reports_200g(simulated):
    _, runner = simulated("p4d.24xlarge")
    assert "efa_rdma_write_bytes_total" not in names(scrape(runner))
    _, runner = simulated("p5en.48xlarge")
    assert set(devices(samples(scrape(runner)), "efa_port_rate_bytes_per_second").values()) == {25e9}


def test_counters_advance(simulated):
    sim, runner = simulated("p5en.48xlarge")
    first = samples(scrape(runner))
    sim.advance(10.0)
    second = samples(scrape(runner))
    for metric in ("efa_tx_bytes_total", "efa_rx_packets_total", "efa_admin_commands_submitted_total"):
        a, b = devices(first, metric), devices(second, metric)
        assert all(b[d] > a[d] for d in a), metric


FAULTS = ["efa-device-missing", "efa-device-flapping", "efa-retrans-timeouts", "efa-unresponsive-remote",
          "efa-rx-drops", "efa-rdma-errors", "efa-counters-unreadable", "efa-read-hang"]


@pytest.fixture(scope="module")
def faulty():
    """One simulated p5.48xlarge with every fault scenario: each touches its own device or metrics
    (building a 32-device tree costs a second on a slow file system, so they share one)."""
    sim = Simulation("p5.48xlarge", FAULTS)
    ctx = sim.context(load(None, {**sim.prepare().config(), "efa.device_timeout_seconds": 0.5}))
    runner = Runner([EfaCollector(ctx)], deadline_s=10, pool=test_pool())
    sim.advance(1.0)
    yield sim, runner, samples(scrape(runner))
    efa_source(sim).release_hang()
    sim.close()


def efa_source(sim):
    return next(s for s in sim.sources if s.name == "efa")


def test_scenario_device_missing(faulty):
    _, _, ss = faulty
    assert value(ss, "efa_devices") == 31 and value(ss, "efa_devices_expected") == 32
    assert "rdmap201s0" not in devices(ss)  # the last of the 32


@pytest.mark.parametrize("metrics", [
    ["efa_retrans_timeout_events_total", "efa_retrans_packets_total"],
    ["efa_unresponsive_remote_events_total", "efa_impaired_remote_conn_events_total"],
    ["efa_rx_drops_total"],
    ["efa_rdma_read_errors_total", "efa_rdma_write_errors_total"],
])
def test_fault_scenarios_raise_the_first_device_only(faulty, metrics):
    sim, runner, before = faulty
    sim.advance(20.0)
    after = samples(scrape(runner))
    first = "rdmap79s0"
    for m in metrics:
        a, b = devices(before, m), devices(after, m)
        assert b[first] > a[first] > 0, m
        assert all(v == 0 for d, v in b.items() if d != first), m


def test_scenario_counters_unreadable(faulty):
    _, _, ss = faulty
    up = devices(ss)
    assert up["rdmap80s0"] == 0
    assert all(v == 1 for d, v in up.items() if d not in ("rdmap80s0", "rdmap82s0"))  # 82: efa-read-hang
    assert value(ss, "gpu_health_exporter_collector_success", collector="efa") == 1
    assert "rdmap80s0" not in devices(ss, "efa_tx_bytes_total")


def test_scenario_read_hang(faulty):
    sim, runner, ss = faulty
    assert devices(ss)["rdmap82s0"] == 0  # its read is blocked: down after the device deadline
    assert devices(ss)["rdmap96s0"] == 1
    reads = runner.collectors[0].reads
    abandoned = reads.abandoned
    ss = samples(scrape(runner))  # the blocked read is not retried while it hangs: no new wait
    assert reads.abandoned == abandoned == 1 and len(reads.stuck()) == 1
    assert devices(ss)["rdmap82s0"] == 0
    assert value(ss, "gpu_health_exporter_collector_success", collector="efa") == 1


def test_scenario_device_flapping(faulty):
    sim, runner, ss = faulty
    assert "rdmap81s0" in devices(ss)
    sim.advance(16.0)
    ss = samples(scrape(runner))
    assert value(ss, "efa_devices") == 30 and "rdmap81s0" not in devices(ss)
    sim.advance(31.0)
    ss = samples(scrape(runner))
    assert value(ss, "efa_devices") == 31 and devices(ss)["rdmap81s0"] == 1


def test_scenario_old_kernel_combined_layout(simulated):
    sim, runner = simulated("p5.48xlarge", "efa-old-kernel")
    sim.advance(3.0)
    text = scrape(runner)
    assert "efa_retrans_packets_total" not in names(text)
    assert "efa_rdma_write_bytes_total" not in names(text)
    assert len(devices(samples(text), "efa_admin_commands_submitted_total")) == 32
    assert promtool_check_metrics(text) == ""  # no duplicate series from the combined list


def test_exporter_serves_simulated_p5():
    with running_exporter("--simulate", "p5.48xlarge", "--collectors", "efa") as url:
        text = requests.get(url + "/metrics", timeout=10).text
    ss = samples(text)
    assert value(ss, "gpu_health_exporter_collector_success", collector="efa") == 1
    assert len(devices(ss, "efa_tx_bytes_total")) == 32
    assert len(devices(ss, "efa_retrans_timeout_events_total")) == 32
    assert value(ss, "efa_devices") == 32
    assert promtool_check_metrics(text) == ""
