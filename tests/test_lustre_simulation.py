"""The simulated FSx mount on p5.48xlarge: metrics, advancing counters, each lustre-* scenario,
and the real exporter process passing promtool."""

import logging

import pytest
import requests

from exporter.collectors.lustre import LustreCollector
from exporter.config import load
from exporter.runner import Runner
from exporter.tools.simulate import Simulation, all_scenarios
from exporter.tools.simulate.lustre import CAPACITY_BYTES, EVICT_AT_S, SCENARIOS
from tests.helpers import promtool_check_metrics, running_exporter, samples, scrape, test_pool, value

FSX = {"fsname": "abcdefgh", "mount": "/fsx"}
OSC = {**FSX, "component": "osc", "target": ""}
MDC = {**FSX, "component": "mdc", "target": ""}


@pytest.fixture
def node(request):
    sims = []

    def start(*scenarios, **cfg):
        sim = Simulation("p5.48xlarge", list(scenarios))
        # Only the Lustre part of the node: the other sources' trees are not read here (the
        # exporter-process test below runs the whole simulated node).
        sim.sources = [src for src in sim.sources if src.name == "lustre"]
        sims.append(sim)
        overrides = {**sim.prepare().config(), **{f"lustre.{k}": v for k, v in cfg.items()}}
        c = LustreCollector(sim.context(load(None, overrides)))
        return sim, Runner([c], deadline_s=5, pool=test_pool())

    yield start
    for s in sims:
        s.close()


def test_scenarios_are_registered_with_the_prefix():
    assert set(SCENARIOS) <= set(all_scenarios())
    assert all(name.startswith("lustre-") for name in SCENARIOS)


def test_p5_exports_the_fsx_mount_and_counters_advance(node):
    sim, r = node()
    s0 = samples(scrape(r))
    assert value(s0, "lustre_client_info", llite="abcdefgh-ffff9c4b3a2f7800", version="2.15.6",
                 network="efa", **FSX) == 1
    assert value(s0, "lustre_client_targets", component="osc", **FSX) == 8
    assert value(s0, "lustre_client_import_state", state="FULL", **OSC) == 7
    assert value(s0, "lustre_client_import_state", state="IDLE", **OSC) == 1  # idle OSC: normal
    assert value(s0, "lustre_client_filesystem_size_bytes", **FSX) == CAPACITY_BYTES
    assert value(s0, "lustre_client_health_status", status="healthy") == 1
    assert value(s0, "lustre_client_import_evictions_total", **OSC) == 0
    assert value(s0, "lustre_client_source_up", source="debugfs") == 1
    sim.advance(10)
    s1 = samples(scrape(r))
    for name, labels in [("lustre_client_read_bytes_total", FSX), ("lustre_client_write_calls_total", FSX),
                         ("lustre_client_rpcs_total", MDC), ("lustre_client_rpc_wait_seconds_total", OSC),
                         ("lustre_client_operation_seconds_total", {**FSX, "operation": "getattr"})]:
        assert value(s1, name, **labels) > value(s0, name, **labels), name
    assert value(s1, "lustre_client_rpc_timeouts_total", **OSC) == 0


def test_eviction(node):
    sim, r = node("lustre-eviction", per_target=True)
    s = samples(scrape(r))
    assert value(s, "lustre_client_import_evictions_total", target="OST0002") == 0
    sim.advance(EVICT_AT_S + 1)
    s = samples(scrape(r))
    assert value(s, "lustre_client_import_evictions_total", target="OST0002") == 1
    assert value(s, "lustre_client_import_last_eviction_timestamp_seconds", target="OST0002") > 1.7e9
    assert value(s, "lustre_client_import_state", target="OST0002", state="FULL") == 1  # recovered
    sim.advance(EVICT_AT_S + 30)
    s = samples(scrape(r))
    assert value(s, "lustre_client_import_evictions_total", target="OST0002") == 1  # counted once
    assert value(s, "lustre_client_import_evictions_total", target="OST0001") == 0


def test_import_stuck_disconnected(node):
    sim, r = node("lustre-import-disconnected")
    s0 = samples(scrape(r))
    assert value(s0, "lustre_client_import_state", state="DISCONN", **OSC) == 1
    sim.advance(60)
    s1 = samples(scrape(r))
    assert value(s1, "lustre_client_import_state", state="DISCONN", **OSC) == 1
    timeouts = "lustre_client_rpc_timeouts_total"
    assert value(s1, timeouts, **OSC) > value(s0, timeouts, **OSC)


def _avg_mdc_wait(a, b):
    def delta(name):
        return value(b, name, **MDC) - value(a, name, **MDC)

    return delta("lustre_client_rpc_wait_seconds_total") / delta("lustre_client_rpcs_total")


def test_mdc_slow(node):
    sim, r = node("lustre-mdc-slow")
    node_sim, normal = node()
    snaps, base = [], []
    for t in (0, 10, 20, 30):
        sim.advance(t)
        snaps.append(samples(scrape(r)))
    for t in (0, 10):
        node_sim.advance(t)
        base.append(samples(scrape(normal)))
    early, late = _avg_mdc_wait(snaps[0], snaps[1]), _avg_mdc_wait(snaps[2], snaps[3])
    assert late > early > 0.05  # above the 50 ms alert threshold and rising
    assert _avg_mdc_wait(base[0], base[1]) < 0.001


def test_fs_full(node):
    _, r = node("lustre-fs-full")
    s = samples(scrape(r))
    assert value(s, "lustre_client_filesystem_available_bytes", **FSX) == 0
    assert value(s, "lustre_client_filesystem_size_bytes", **FSX) == CAPACITY_BYTES


def test_lbug(node):
    _, r = node("lustre-lbug")
    s = samples(scrape(r))
    assert value(s, "lustre_client_health_status", status="lbug") == 1


def test_debugfs_missing(node, caplog):
    caplog.set_level(logging.WARNING, logger="exporter.lustre")
    _, r = node("lustre-debugfs-missing")
    s = samples(scrape(r))
    scrape(r)
    assert value(s, "gpu_health_exporter_collector_success", collector="lustre") == 1
    assert value(s, "lustre_client_source_up", source="debugfs") == 0
    assert value(s, "lustre_client_import_state", state="FULL", **OSC) == 7
    assert value(s, "lustre_client_health_status", status="healthy") == 1
    assert value(s, "lustre_client_filesystem_size_bytes", **FSX) == CAPACITY_BYTES
    assert not [k for k in s if k[0] in ("lustre_client_read_bytes_total", "lustre_client_rpcs_total")]
    msgs = [rec.getMessage() for rec in caplog.records]
    assert len(msgs) == 1 and "debugfs is not mounted" in msgs[0]


def test_real_exporter_process_passes_promtool():
    with running_exporter("--simulate", "p5.48xlarge", "--collectors", "lustre",
                          "--scenario", "lustre-eviction") as url:
        text = requests.get(url + "/metrics", timeout=10).text
    assert promtool_check_metrics(text) == ""
    s = samples(text)
    assert value(s, "gpu_health_exporter_collector_success", collector="lustre") == 1
    assert value(s, "lustre_client_mounts") == 1
    assert value(s, "lustre_client_import_state", state="FULL", **OSC) == 7
