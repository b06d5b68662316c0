"""Issue 43's training-job scenarios of the simulated node (exporter/tools/simulate/job.py), source by
source: the requeue's Slurm mapping goes and comes back as the epilog and prolog write it, and the
storage-latency stall's OST RPCs take LATENCY_FACTOR times their usual round trip with no eviction.
The end-to-end judgement of every scenario is tests/test_job_health_live.py's."""

from __future__ import annotations

from exporter.collectors.lustre import LustreCollector
from exporter.config import load
from exporter.runner import Runner
from exporter.tools.simulate import Simulation, job
from tests.helpers import samples, scrape, test_pool


def _sim(source: str, *scenarios: str) -> tuple[Simulation, dict]:
    """The simulated node with only `source` (the others' trees are not read here); its config."""
    sim = Simulation("p5.48xlarge", list(scenarios))
    sim.sources = [s for s in sim.sources if s.name == source]
    return sim, sim.prepare().config()


def test_requeue_removes_the_mapping_then_writes_it_again():
    sim, _ = _sim("workload", "slurm-job", "job-requeue")
    try:
        src = sim.sources[0]
        gpus = [str(i) for i in range(8)]

        def mapped() -> list[str]:
            return sorted(p.name for p in src.mapping_dir.iterdir())

        assert mapped() == gpus
        sim.advance(job.STALL_AT_S + 1)
        assert mapped() == []  # released: the epilog removed every GPU's line
        sim.advance(job.STALL_AT_S + job.REQUEUE_GAP_S + 1)
        assert mapped() == gpus
        assert (src.mapping_dir / "0").read_text() == "4242\n"  # the same id
    finally:
        sim.close()


def _osc_totals(r: Runner) -> tuple[float, float, float]:
    """(RPC wait seconds, RPCs, evictions) over the OSTs, from one collection."""
    s = samples(scrape(r))

    def total(name: str) -> float:
        return sum(v for (n, ls), v in s.items() if n == name and ("component", "osc") in ls)
    return (total("lustre_client_rpc_wait_seconds_total"), total("lustre_client_rpcs_total"),
            total("lustre_client_import_evictions_total"))


def test_storage_latency_slows_every_rpc_without_an_eviction():
    sim, config = _sim("lustre", "job-storage-latency")
    try:
        r = Runner([LustreCollector(sim.context(load(None, config)))], deadline_s=5, pool=test_pool())
        w0, n0, _ = _osc_totals(r)
        sim.advance(job.STALL_AT_S)
        w1, n1, _ = _osc_totals(r)
        sim.advance(job.STALL_AT_S + 10)
        w2, n2, evictions = _osc_totals(r)
        usual, during = (w1 - w0) / (n1 - n0), (w2 - w1) / (n2 - n1)  # mean round trips
        assert during > 0.8 * job.LATENCY_FACTOR * usual
        assert 0.01 < during < 0.1  # tens of milliseconds: under any absolute 100 ms rule
        assert evictions == 0
    finally:
        sim.close()
