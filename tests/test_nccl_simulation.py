"""The simulated NCCL job (exporter.tools.simulate.nccl_ras): its timeline plays each scenario, and a
simulated node's nccl collector trusts and reads the job's fake RAS (the procfs tree, NVML's
processes and the server the node's source wrote and started)."""

from __future__ import annotations

from exporter import collectors
from exporter.config import load
from exporter.nccl import findings, parse_json
from exporter.runner import Runner
from exporter.tools.simulate import Shape, Simulation
from exporter.tools.simulate.nccl_ras import DEAD_AFTER_S, ONSET_S, FakeJob, Timeline, render_json
from tests.helpers import samples, scrape, value, wait_for


def named(job: FakeJob) -> findings.Findings:
    return findings.summarise(parse_json.parse(render_json(job.snapshot(), "2.29.7")))


def test_the_timeline_plays_each_scenario():
    for scenario in ("nccl-lagging-rank", "nccl-dead-peer", "nccl-collective-hang", "nccl-job"):
        job = FakeJob.uniform(2, 4)
        t = Timeline(job, scenario, 4, culprit_node=1)
        for s in range(int(ONSET_S) + int(DEAD_AFTER_S) + 5):
            t.advance(float(s))
        f = named(job)
        culprit = ("10.1.2.11", 4007)  # node 1, GPU 3
        if scenario == "nccl-lagging-rank":
            assert f.behind == {culprit: 1} and not f.missing
        elif scenario == "nccl-dead-peer":
            assert f.missing == {culprit: "dead"} and not f.behind
        else:
            assert not f.behind and not f.missing
        t.advance(999.0)  # later: a fault's counts stay where they were, a healthy job's move on
        assert (named(job).ops_max == f.ops_max) == (scenario != "nccl-job")


def test_a_simulated_node_reads_its_jobs_ras(tmp_path):
    collectors.discover()
    sim = Simulation("p5.48xlarge", ["slurm-job", "nccl-job"], root=tmp_path, shape=Shape(gpus=4))
    try:
        cfg = load(None, sim.prepare().config())
        ctx = sim.context(cfg)
        runner = Runner(collectors.build(ctx, only=["workload", "nccl"]), 5.0, pool=ctx.pool)
        runner.start()
        try:
            ss = wait_for(
                lambda: (
                    (s := samples(scrape(runner)))
                    and value(s, "nccl_ras_queries_total", result="ok") >= 1
                    and samples(scrape(runner))
                ),
                what="a RAS reply",
            )
            assert value(ss, "nccl_ras_up", gpu="0") == 1
            assert value(ss, "nccl_ras_querier", gpu="0") == 1  # node 0 hosts world rank 0
            assert value(ss, "nccl_ras_job_ranks", gpu="0", state="total") == 8  # 2 nodes of 4 GPUs
            assert value(ss, "nccl_ras_endpoint_info", gpu="3", ip="10.1.2.10", pid="4003") == 1
        finally:
            runner.close()
            ctx.pool.close()
    finally:
        sim.close()
