"""A burst of 20 concurrent scrapes of the real HTTP endpoint makes one set of NVML calls, and all
20 get the same complete answer."""

import threading

import requests

from exporter import collectors
from exporter.arguments import build_parser
from exporter.runner import Runner
from exporter.startup import build_context
from exporter.web.server import Server
from tests.helpers import test_pool, value


def test_twenty_concurrent_scrapes_make_one_set_of_nvml_calls():
    ctx, sim = build_context(build_parser().parse_args(["--simulate", "p5.48xlarge", "--collectors", "gpu"]))
    runner = Runner(collectors.build(ctx, ["gpu"]), 5.0, pool=test_pool())
    srv = Server(runner, "127.0.0.1", 0)
    srv.start()
    url = f"http://127.0.0.1:{srv.port}/metrics"
    try:
        requests.get(url, timeout=10)  # first collection: static values read once
        fake = ctx.nvml.backend
        fake.slow_down(3, 0.03)  # every call on GPU 3 takes 30 ms longer: a collection takes ~0.4 s
        before = fake.calls_made
        requests.get(url, timeout=10)
        one_collection = fake.calls_made - before

        bodies, barrier = [], threading.Barrier(20)

        def scrape():
            barrier.wait()
            bodies.append(requests.get(url, timeout=30).text)

        threads = [threading.Thread(target=scrape) for _ in range(20)]
        before, collections = fake.calls_made, runner.collections
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        burst = fake.calls_made - before
    finally:
        srv.shutdown()
        runner.close()
        sim.close()

    # The same complete answer for all 20 (but the process_* metrics, read for each scrape).
    collected = {"".join(ln for ln in b.splitlines(True) if "process_" not in ln) for b in bodies}
    assert len(bodies) == 20 and len(collected) == 1
    assert value(bodies[0], "gpu_health_exporter_collections_total") == collections + 1
    assert value(bodies[0], "gpu_devices") == 8
    assert value(bodies[0], "gpu_health_exporter_collector_success", collector="gpu") == 1
    assert one_collection > 0 and burst <= one_collection + one_collection // 2  # not 20 sets
